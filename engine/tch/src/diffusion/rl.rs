//! The RL side of diffusion: group-relative advantages (each condition's samples form a group,
//! as GRPO groups a prompt's answers), the PPO clipped objective per denoising step (DDPO's
//! importance-ratio update; one advantage per image, shared by all its steps), an exact KL to a
//! frozen reference per step, the choice of which steps to train on, and the denoiser's
//! optimizer (the trainer's AdamW, `crate::train::adam_step`).
//!
//! Metrics carry the names the language-model path uses where they mean the same thing.

use super::ddpm::{step_logprob, step_mean, Schedule, Trajectory};
use super::model::{scalar, Denoiser};
use crate::train::{adam_step, pg_terms, AdamState};
use miles_runtime::rng::Rng;
use miles_runtime::{RunError, TrainSpec};
use tch::{Kind, Tensor};

/// The mean clipped objective (per step and sample).
pub const LOSS: &str = "train/loss";
/// Fraction of (sample, step) terms where the clipped branch was taken.
pub const CLIP_FRAC: &str = "train/clip_frac";
/// Mean per-step KL to the reference (nats per image and step).
pub const KL: &str = "train/kl";
/// Global gradient norm before clipping.
pub const GRAD_NORM: &str = "train/grad_norm";

/// Reward minus its group's mean, divided by the group's sample std + 1e-6 when `std_norm`; a
/// group of one gets 0. The same function as a language run's GRPO advantages
/// (`miles_runtime::advantage`), so a diffusion run and a language run normalise alike.
pub fn group_advantages(rewards: &[f32], group_of: &[usize], std_norm: bool) -> Vec<f32> {
    miles_runtime::advantage::grpo_advantages(rewards, group_of, std_norm)
}

/// The PPO clipped objective, mean over every element: max(-A r, -A clip(r, 1-clip, 1+clip)),
/// r = exp(logp_new - logp_old). `adv` broadcasts against the log-probs (a [B] advantage against
/// [B] log-probs of one step, or [B, 1] against [B, k] of k steps). Returns the loss (with
/// gradient through `logp_new`) and the fraction of terms clipped. The one definition of the
/// clipped term is the language path's `pg_terms`.
pub fn clipped_loss(logp_new: &Tensor, logp_old: &Tensor, adv: &Tensor, clip: f64) -> (Tensor, f64) {
    let terms = pg_terms(logp_new, &logp_old.detach(), &logp_old.detach(), &adv.detach(), clip, clip, None);
    let frac = terms.clipped.mean(Kind::Double).double_value(&[]);
    (terms.pg.mean(Kind::Float), frac)
}

/// KL(N(mean_new, sigma^2 I) || N(mean_ref, sigma^2 I)) per row, [B]: with equal variances it is
/// ||mean_new - mean_ref||^2 / (2 sigma^2), summed over pixels (exact; no estimator needed).
pub fn gaussian_kl(mean_new: &Tensor, mean_ref: &Tensor, sigma: f64) -> Tensor {
    (mean_new - mean_ref).square().sum_dim_intlist([1i64, 2, 3].as_slice(), false, Kind::Float) / (2.0 * sigma * sigma)
}

/// The steps (indices into a trajectory's T steps, ascending) one RL update trains on: `k` of
/// them drawn without replacement from the stream (seed, "diffusion-steps", call), or all of them
/// when `k` is None or at least T. Training on a subset trades gradient variance for time, as
/// DDPO's timestep fraction does; drawing it afresh each call covers every step over many calls.
pub fn choose_steps(steps: usize, k: Option<usize>, seed: u64, call: u64) -> Vec<usize> {
    let mut all: Vec<usize> = (0..steps).collect();
    let Some(k) = k.filter(|&k| k < steps) else { return all };
    let mut rng = Rng::derived(seed, "diffusion-steps", call);
    rng.shuffle(&mut all);
    all.truncate(k);
    all.sort_unstable();
    all
}

/// What one RL update measured; `metrics` names them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RlStats {
    pub loss: f64,
    pub clip_frac: f64,
    pub kl: f64,
    pub grad_norm: f64,
}

impl RlStats {
    pub fn metrics(&self) -> [(&'static str, f64); 4] {
        [(LOSS, self.loss), (CLIP_FRAC, self.clip_frac), (KL, self.kl), (GRAD_NORM, self.grad_norm)]
    }
}

/// How the RL loss is formed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RlLossSpec {
    /// Ratio clip: r in [1 - clip, 1 + clip].
    pub clip: f64,
    /// Weight of the KL to the reference (0: none, and no reference forward).
    pub kl_coef: f64,
}

/// Accumulates, step by step, the gradient of the clipped objective (plus `kl_coef` x KL to
/// `reference`) over the chosen `steps` of `traj`, each image's advantage `adv` [B] shared by
/// all its steps. Each step's loss is backpropagated on its own (scaled by 1 / steps), so memory
/// holds one step's graph at a time, as DDPO does. The gradient is left on `model`'s parameters
/// for the caller's optimizer step; `grad_norm` is not filled here.
pub fn accumulate_rl_gradients(
    model: &Denoiser,
    reference: Option<&Denoiser>,
    traj: &Trajectory,
    adv: &Tensor,
    steps: &[usize],
    schedule: &Schedule,
    spec: RlLossSpec,
) -> Result<RlStats, RunError> {
    if traj.log_probs.len() != traj.steps() {
        return Err(RunError::new(
            miles_runtime::E_SPEC,
            "diffusion RL needs eta > 0: these trajectories have no log-probabilities",
        ));
    }
    if adv.size() != [traj.batch() as i64] {
        return Err(RunError::internal(format!("advantages {:?} for {} images", adv.size(), traj.batch())));
    }
    let mut st = RlStats::default();
    if steps.is_empty() {
        return Ok(st);
    }
    let n = steps.len() as f64;
    for &k in steps {
        if k >= traj.steps() {
            return Err(RunError::internal(format!("RL step {k} of a {}-step trajectory", traj.steps())));
        }
        let (x_t, x_prev, t) = traj.transition(k);
        let sigma = traj.sigmas[k];
        let mean = step_mean(model, x_t, t, &traj.cond, schedule, traj.guidance)?;
        let logp = super::ddpm::gaussian_logprob(x_prev, &mean, sigma);
        let (pg, frac) = clipped_loss(&logp, &traj.log_probs[k], adv, spec.clip);
        // A new tensor, never `pg += ...` (tch's AddAssign is in place: it would change pg).
        let loss = match reference.filter(|_| spec.kl_coef > 0.0) {
            Some(r) => {
                let ref_mean = tch::no_grad(|| step_mean(r, x_t, t, &traj.cond, schedule, traj.guidance))?;
                let kl = gaussian_kl(&mean, &ref_mean, sigma).mean(Kind::Float);
                st.kl += scalar(&kl)? / n;
                &pg + kl * spec.kl_coef
            }
            None => pg.shallow_clone(),
        };
        let v = scalar(&loss)?;
        if !v.is_finite() {
            return Err(RunError::new(miles_runtime::E_NONFINITE, format!("diffusion RL loss is {v} at step {t}")));
        }
        if !loss.requires_grad() {
            // tch's backward would panic: the caller forgot `set_requires_grad(true)`.
            return Err(RunError::internal(
                "diffusion RL loss has no gradient: the denoiser's parameters do not require it",
            ));
        }
        (loss / n).backward();
        st.loss += scalar(&pg)? / n;
        st.clip_frac += frac / n;
    }
    Ok(st)
}

/// The denoiser's optimizer: the trainer's AdamW (global-norm clip, decoupled weight decay on
/// matrices) with its own moments, so pretraining and RL step a denoiser as the language path
/// steps a policy.
pub struct DenoiserAdam {
    state: AdamState,
    pub spec: TrainSpec,
}

impl DenoiserAdam {
    /// `spec`'s beta1, beta2, eps, weight_decay and grad_clip apply; its lr is the default of
    /// `step`'s.
    pub fn new(model: &Denoiser, spec: TrainSpec) -> DenoiserAdam {
        DenoiserAdam { state: AdamState::zeros(model.params()), spec }
    }

    /// One step on the gradients now on `model`'s parameters, then clears them. Returns the
    /// pre-clip gradient norm (a non-finite one is an error and leaves the weights as they were).
    pub fn step(&mut self, model: &Denoiser, lr: f64) -> Result<f64, RunError> {
        if self.state.m.len() != model.params().len() {
            return Err(RunError::internal("optimizer built for another denoiser"));
        }
        let norm = adam_step(model.params(), &mut self.state, &self.spec, lr);
        model.zero_grad();
        norm
    }

    /// Optimizer steps taken.
    pub fn steps(&self) -> u64 {
        self.state.t
    }
}

/// The recorded log-probabilities of `traj`'s chosen steps recomputed under `model`, [B, k] f64,
/// without gradient: the staleness check of an off-policy update (and the test of exactness).
pub fn recompute_logprobs(
    model: &Denoiser,
    traj: &Trajectory,
    steps: &[usize],
    schedule: &Schedule,
) -> Result<Tensor, RunError> {
    let _g = tch::no_grad_guard();
    let cols = steps
        .iter()
        .map(|&k| {
            let (x_t, x_prev, t) = traj.transition(k);
            step_logprob(model, x_t, x_prev, t, &traj.cond, schedule, traj.guidance, traj.eta)
        })
        .collect::<Result<Vec<_>, _>>()?;
    if cols.is_empty() {
        return Ok(Tensor::zeros([traj.batch() as i64, 0], (Kind::Double, tch::Device::Cpu)));
    }
    Ok(Tensor::stack(&cols, 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choose_steps_is_seeded_sorted_and_distinct() {
        assert_eq!(choose_steps(5, None, 0, 0), vec![0, 1, 2, 3, 4]);
        assert_eq!(choose_steps(5, Some(9), 0, 0), vec![0, 1, 2, 3, 4]);
        let a = choose_steps(20, Some(6), 7, 3);
        assert_eq!(a, choose_steps(20, Some(6), 7, 3));
        assert_eq!(a.len(), 6);
        assert!(a.windows(2).all(|w| w[0] < w[1]) && a.iter().all(|&s| s < 20));
        assert!((0..10).any(|c| choose_steps(20, Some(6), 7, c) != a));
        assert!(choose_steps(20, Some(0), 7, 3).is_empty());
    }

    #[test]
    fn metric_names_are_the_language_paths() {
        let names: Vec<&str> = RlStats::default().metrics().iter().map(|(n, _)| *n).collect();
        assert_eq!(names, ["train/loss", "train/clip_frac", "train/kl", "train/grad_norm"]);
    }
}
