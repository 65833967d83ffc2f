//! Diffusion RL on the embedded backend (docs/recipes/diffusion.md): a small conditional denoiser
//! over 16x16 grayscale images, a DDPM sampler whose every denoising step is a Gaussian policy
//! with an exact log-probability (DDPO: Black et al. 2023, "Training Diffusion Models with
//! Reinforcement Learning"; the group-relative advantages of Flow-GRPO / DanceGRPO), rewards from
//! a classifier trained on the same domain and from analytic properties of the image, scored per
//! micro-group while the next micro-group denoises.
//!
//! Images are [B, 1, side, side] f32 tensors in [-1, 1]; conditions are i64 class ids in
//! 0..conditions (the id `conditions` is the null condition of classifier-free guidance).

pub mod ddpm;
pub mod domain;
pub mod grid;
pub mod model;
pub mod reward;
pub mod reward_stage;
pub mod rl;
pub mod run;
