//! The embedded backend's integration tests, one test binary (`cargo test -p miles-tch --test
//! integration`; link time dominates a test build, issue #34): the loss and sampler by hand, runs
//! of the executor on a tiny model (determinism, resume, SIGKILL), continuous batching, Hugging
//! Face and PEFT fixtures, LoRA, MoE, PPO, on-policy distillation, multi-turn episodes,
//! diffusion RL and data-parallel training over c10d (`dp`, ranks as threads). Each module was a
//! test binary of its own; `cargo test -p miles-tch --test integration MODULE::` runs one.
//! `common` is the tiny model and run helpers they share. The one timing,
//! `diffusion_math::sample_timing_b32_t20`, is ignored and runs only when asked (alone).

#[path = "../common/mod.rs"]
mod common;

mod diffusion_math;
mod diffusion_reward;
mod diffusion_run;
mod dp;
mod episodes;
mod hf;
mod hf_config_out;
mod hf_moe;
mod hf_run;
mod lora;
mod loss_mask;
mod moe;
mod opd;
mod ppo;
mod run;
mod stream;
mod trl_parity;
mod unit;
mod variants;
