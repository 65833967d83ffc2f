//! DDPM (Ho et al. 2020) over a short schedule, with the sampler written as a policy: each
//! denoising step draws x_{t-1} ~ N(mean_theta(x_t, t, c), sigma_t^2 I), so every step has an
//! exact log-probability that the RL loss can recompute under new weights (DDPO).
//!
//! Indexing: timestep indices are 0-based, t in 0..T, and index t is the DDPM paper's t + 1
//! (betas[0] is the paper's beta_1). A trajectory runs the steps t = T-1, ..., 0; step t maps
//! x_t (noise level alpha_bar[t]) to the previous latent (alpha_bar[t-1], or the clean image
//! after t = 0). `Trajectory::latents[0]` is the initial noise x_T, `latents[T]` the image x_0.
//!
//! The noise of a step is sigma_t = eta * sqrt(beta_tilde_t), beta_tilde_t the posterior
//! variance (1 - alpha_bar[t-1]) / (1 - alpha_bar[t]) * beta[t]: eta = 1 is DDPM's posterior,
//! eta = 0 the deterministic posterior mean (no log-probabilities then). beta_tilde is 0 at the
//! last step (t = 0), which would make that step deterministic and its log-probability
//! undefined; it is floored there at beta[0] (DDPM's other variance choice, sigma^2 = beta), so
//! with eta > 0 every step, the last included, is a Gaussian with an exact log-probability. The
//! final latent is therefore not clipped to [-1, 1]: `Trajectory::images` clamps it for rewards.
//!
//! All noise, the initial x_T included, comes from `miles_runtime::rng::Rng` streams, one per row
//! (seed, "diffusion-sample", row): a row's trajectory depends on its seed, condition and weights
//! only, never on libtorch's generator, its thread count, or the other rows of the batch.

use super::model::{ids, normals, Denoiser};
pub use miles_runtime::diffusion::ScheduleKind;
use miles_runtime::rng::Rng;
use miles_runtime::{RunError, E_SPEC};
use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

/// Betas, alphas and their running products over T steps (f64: the coefficients are exact to
/// well below f32's resolution, and the tensors take them as scalars).
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    pub kind: ScheduleKind,
    pub betas: Vec<f64>,
    /// 1 - beta.
    pub alphas: Vec<f64>,
    /// prod_{s <= t} alpha_s.
    pub alpha_bar: Vec<f64>,
}

const MAX_BETA: f64 = 0.999;
/// A sampler of more steps than this is not what a CPU RL loop runs; the bound keeps a typo from
/// allocating a million latents.
pub const MAX_STEPS: usize = 1000;

impl Schedule {
    pub fn new(kind: ScheduleKind, steps: usize) -> Result<Schedule, RunError> {
        if steps == 0 || steps > MAX_STEPS {
            return Err(RunError::new(E_SPEC, format!("diffusion steps {steps} must be in 1..={MAX_STEPS}")));
        }
        let t = steps as f64;
        let betas: Vec<f64> = match kind {
            ScheduleKind::Linear => {
                let (lo, hi) = (1e-4 * 1000.0 / t, 0.02 * 1000.0 / t);
                (0..steps)
                    .map(|i| {
                        let f = if steps == 1 { 0.0 } else { i as f64 / (t - 1.0) };
                        (lo + f * (hi - lo)).min(MAX_BETA)
                    })
                    .collect()
            }
            ScheduleKind::Cosine => {
                let s = 0.008;
                let f = |i: f64| ((i / t + s) / (1.0 + s) * std::f64::consts::FRAC_PI_2).cos().powi(2);
                (0..steps).map(|i| (1.0 - f(i as f64 + 1.0) / f(i as f64)).min(MAX_BETA)).collect()
            }
        };
        let alphas: Vec<f64> = betas.iter().map(|b| 1.0 - b).collect();
        let alpha_bar = alphas
            .iter()
            .scan(1.0, |acc, a| {
                *acc *= a;
                Some(*acc)
            })
            .collect();
        Ok(Schedule { kind, betas, alphas, alpha_bar })
    }

    pub fn linear(steps: usize) -> Result<Schedule, RunError> {
        Schedule::new(ScheduleKind::Linear, steps)
    }

    pub fn cosine(steps: usize) -> Result<Schedule, RunError> {
        Schedule::new(ScheduleKind::Cosine, steps)
    }

    /// T.
    pub fn steps(&self) -> usize {
        self.betas.len()
    }

    /// alpha_bar of the latent step `t` produces (1 after the last step: the clean image).
    pub fn alpha_bar_prev(&self, t: usize) -> f64 {
        if t == 0 {
            1.0
        } else {
            self.alpha_bar[t - 1]
        }
    }

    /// The posterior variance beta_tilde_t of q(x_{t-1} | x_t, x_0) (0 at t = 0).
    pub fn posterior_variance(&self, t: usize) -> f64 {
        (1.0 - self.alpha_bar_prev(t)) / (1.0 - self.alpha_bar[t]) * self.betas[t]
    }

    /// The std of step `t` at noise level `eta`: eta * sqrt(beta_tilde_t), floored at the last
    /// step to eta * sqrt(beta[0]) (module doc).
    pub fn sigma(&self, t: usize, eta: f64) -> f64 {
        let var = if t == 0 { self.betas[0] } else { self.posterior_variance(t) };
        eta * var.sqrt()
    }

    /// The posterior mean's coefficients: mean = c0 * x0 + ct * x_t.
    pub fn posterior_coefs(&self, t: usize) -> (f64, f64) {
        let (ab, abp) = (self.alpha_bar[t], self.alpha_bar_prev(t));
        (abp.sqrt() * self.betas[t] / (1.0 - ab), self.alphas[t].sqrt() * (1.0 - abp) / (1.0 - ab))
    }

    fn check_step(&self, t: i64) -> Result<usize, RunError> {
        if t < 0 || t as usize >= self.steps() {
            return Err(RunError::internal(format!("diffusion step {t} outside 0..{}", self.steps())));
        }
        Ok(t as usize)
    }
}

/// How `sample` denoises.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SampleParams {
    /// Classifier-free guidance weight w: eps = eps_uncond + w (eps_cond - eps_uncond). 1: the
    /// conditional model alone (one forward per step); 0: the unconditional model alone.
    pub guidance: f64,
    /// Noise level: sigma_t = eta * sqrt(beta_tilde_t). 0: deterministic, no log-probabilities.
    pub eta: f64,
    pub seed: u64,
}

fn check_params(guidance: f64, eta: f64) -> Result<(), RunError> {
    if !guidance.is_finite() {
        return Err(RunError::new(E_SPEC, format!("diffusion guidance {guidance} is not finite")));
    }
    if !eta.is_finite() || eta < 0.0 {
        return Err(RunError::new(E_SPEC, format!("diffusion eta {eta} must be finite and >= 0")));
    }
    Ok(())
}

/// One sampled batch: every latent, and each step as a Gaussian policy's action.
#[derive(Debug)]
pub struct Trajectory {
    pub cond: Vec<i64>,
    /// T + 1 latents [B, 1, S, S]: x_T (the initial noise), ..., x_0 (the image, unclipped).
    pub latents: Vec<Tensor>,
    /// The timestep index of each step: T-1, ..., 0 (step k maps latents[k] to latents[k+1]).
    pub timesteps: Vec<i64>,
    /// Per step, the mean [B, 1, S, S] x_{t-1} was drawn around.
    pub means: Vec<Tensor>,
    /// Per step, sigma_t (the same for every row).
    pub sigmas: Vec<f64>,
    /// Per step, log N(x_{t-1}; mean, sigma_t^2 I) summed over pixels, [B] f64. Empty when eta = 0.
    pub log_probs: Vec<Tensor>,
    pub guidance: f64,
    pub eta: f64,
}

impl Trajectory {
    pub fn steps(&self) -> usize {
        self.timesteps.len()
    }

    pub fn batch(&self) -> usize {
        self.cond.len()
    }

    /// The final images clamped to [-1, 1], what rewards score.
    pub fn images(&self) -> Tensor {
        self.latents.last().map(|x| x.clamp(-1.0, 1.0)).unwrap_or_else(|| Tensor::zeros([0], tch::kind::FLOAT_CPU))
    }

    /// Step k's transition: (x_t, x_{t-1}, t).
    pub fn transition(&self, k: usize) -> (&Tensor, &Tensor, i64) {
        (&self.latents[k], &self.latents[k + 1], self.timesteps[k])
    }
}

/// The guided noise prediction at step `t` for a batch: one forward of 2B rows (conditional then
/// null) when both terms are needed, one of B rows at guidance 1 or 0.
pub fn guided_eps(model: &Denoiser, x_t: &Tensor, t: i64, cond: &Tensor, guidance: f64) -> Tensor {
    let b = x_t.size()[0];
    let tt = Tensor::full([b], t, (Kind::Int64, tch::Device::Cpu));
    if guidance == 1.0 {
        return model.forward(x_t, &tt, cond);
    }
    let null = Tensor::full([b], model.cfg.null_condition(), (Kind::Int64, tch::Device::Cpu));
    if guidance == 0.0 {
        return model.forward(x_t, &tt, &null);
    }
    let out =
        model.forward(&Tensor::cat(&[x_t, x_t], 0), &Tensor::cat(&[&tt, &tt], 0), &Tensor::cat(&[cond, &null], 0));
    let (e_c, e_u) = (out.narrow(0, 0, b), out.narrow(0, b, b));
    &e_u + (e_c - &e_u) * guidance
}

/// DDPM's posterior mean given the predicted noise: x0 = (x_t - sqrt(1 - ab) eps) / sqrt(ab),
/// clipped to [-1, 1] (the data's range), then c0 * x0 + ct * x_t.
pub fn posterior_mean(schedule: &Schedule, x_t: &Tensor, eps: &Tensor, t: usize) -> Tensor {
    let ab = schedule.alpha_bar[t];
    let x0 = ((x_t - eps * (1.0 - ab).sqrt()) / ab.sqrt()).clamp(-1.0, 1.0);
    let (c0, ct) = schedule.posterior_coefs(t);
    x0 * c0 + x_t * ct
}

/// log N(x; mean, sigma^2 I) summed over each row's pixels, [B] f64 (sigma > 0). The squares are
/// summed in f64: the constant term of a 256-pixel image is a few hundred nats, where f32 would
/// leave 1e-4 of noise on ratios of nearly equal log-probabilities.
pub fn gaussian_logprob(x: &Tensor, mean: &Tensor, sigma: f64) -> Tensor {
    let n = x.size().iter().skip(1).product::<i64>() as f64;
    let sq = (x - mean).square().sum_dim_intlist([1i64, 2, 3].as_slice(), false, Kind::Double);
    sq / (-2.0 * sigma * sigma) - n * (sigma.ln() + 0.5 * (2.0 * std::f64::consts::PI).ln())
}

/// The mean step `t` draws x_{t-1} around under `model` (with gradient when the caller records).
pub fn step_mean(
    model: &Denoiser,
    x_t: &Tensor,
    t: i64,
    cond: &[i64],
    schedule: &Schedule,
    guidance: f64,
) -> Result<Tensor, RunError> {
    let ti = schedule.check_step(t)?;
    model.check_images(x_t, "x_t")?;
    model.check_conditions(cond)?;
    if x_t.size()[0] != cond.len() as i64 {
        return Err(RunError::internal(format!("{} conditions for a batch of {}", cond.len(), x_t.size()[0])));
    }
    check_params(guidance, 0.0)?;
    let eps = guided_eps(model, x_t, t, &ids(cond), guidance);
    Ok(posterior_mean(schedule, x_t, &eps, ti))
}

/// The log-probability [B] f64 of a recorded transition x_t -> x_prev at step `t` under the
/// model's current weights, with gradient: the new policy of the RL ratio. With unchanged
/// weights it equals the log-probability `sample` recorded.
#[allow(clippy::too_many_arguments)]
pub fn step_logprob(
    model: &Denoiser,
    x_t: &Tensor,
    x_prev: &Tensor,
    t: i64,
    cond: &[i64],
    schedule: &Schedule,
    guidance: f64,
    eta: f64,
) -> Result<Tensor, RunError> {
    check_params(guidance, eta)?;
    model.check_images(x_prev, "x_prev")?;
    let sigma = schedule.sigma(schedule.check_step(t)?, eta);
    if sigma <= 0.0 {
        return Err(RunError::new(E_SPEC, "diffusion eta is 0: a deterministic step has no log-probability")
            .with_help("set eta > 0 (1 is DDPM's posterior noise) to train with RL"));
    }
    let mean = step_mean(model, x_t, t, cond, schedule, guidance)?;
    Ok(gaussian_logprob(x_prev, &mean, sigma))
}

/// Samples images for `cond` (ids in 0..=K) by T denoising steps, recording the trajectory.
pub fn sample(
    model: &Denoiser,
    cond: &[i64],
    schedule: &Schedule,
    params: SampleParams,
) -> Result<Trajectory, RunError> {
    check_params(params.guidance, params.eta)?;
    model.check_conditions(cond)?;
    let _g = tch::no_grad_guard();
    let s = model.cfg.side as i64;
    let b = cond.len();
    let mut rngs: Vec<Rng> = (0..b).map(|i| Rng::derived(params.seed, "diffusion-sample", i as u64)).collect();
    // Row by row, so each row's stream is its own (module doc).
    let mut noise = || -> Tensor {
        let rows: Vec<Tensor> = rngs.iter_mut().map(|r| normals(r, &[1, 1, s, s])).collect();
        if rows.is_empty() {
            Tensor::zeros([0, 1, s, s], tch::kind::FLOAT_CPU)
        } else {
            Tensor::cat(&rows, 0)
        }
    };
    let c = ids(cond);
    let steps = schedule.steps();
    let mut x = noise();
    let mut traj = Trajectory {
        cond: cond.to_vec(),
        latents: Vec::with_capacity(steps + 1),
        timesteps: Vec::with_capacity(steps),
        means: Vec::with_capacity(steps),
        sigmas: Vec::with_capacity(steps),
        log_probs: Vec::with_capacity(steps),
        guidance: params.guidance,
        eta: params.eta,
    };
    for t in (0..steps).rev() {
        let eps = guided_eps(model, &x, t as i64, &c, params.guidance);
        let mean = posterior_mean(schedule, &x, &eps, t);
        let sigma = schedule.sigma(t, params.eta);
        let next = if sigma > 0.0 {
            let next = &mean + noise() * sigma;
            traj.log_probs.push(gaussian_logprob(&next, &mean, sigma));
            next
        } else {
            mean.copy()
        };
        traj.latents.push(std::mem::replace(&mut x, next));
        traj.timesteps.push(t as i64);
        traj.means.push(mean);
        traj.sigmas.push(sigma);
    }
    traj.latents.push(x);
    Ok(traj)
}

/// x_t = sqrt(alpha_bar[t]) x0 + sqrt(1 - alpha_bar[t]) noise, with one timestep per row.
pub fn q_sample(schedule: &Schedule, x0: &Tensor, t: &[usize], noise: &Tensor) -> Tensor {
    let col = |f: &dyn Fn(f64) -> f64| -> Tensor {
        let v: Vec<f32> = t.iter().map(|&i| f(schedule.alpha_bar[i]) as f32).collect();
        Tensor::from_slice(&v).view([t.len() as i64, 1, 1, 1])
    };
    x0 * col(&|ab| ab.sqrt()) + noise * col(&|ab| (1.0 - ab).sqrt())
}

/// The denoising pretraining loss: mean squared error between the noise and the model's
/// prediction of it, at a timestep drawn uniformly per row, with each row's condition replaced
/// by the null one with probability `p_uncond` (so one model learns both terms of
/// classifier-free guidance). All randomness comes from `rng`.
pub fn pretrain_loss(
    model: &Denoiser,
    schedule: &Schedule,
    x0: &Tensor,
    cond: &[i64],
    rng: &mut Rng,
    p_uncond: f64,
) -> Result<Tensor, RunError> {
    model.check_images(x0, "x0")?;
    model.check_conditions(cond)?;
    let b = x0.size()[0];
    if b != cond.len() as i64 {
        return Err(RunError::internal(format!("{} conditions for a batch of {b}", cond.len())));
    }
    if !(0.0..=1.0).contains(&p_uncond) {
        return Err(RunError::new(E_SPEC, format!("diffusion p_uncond {p_uncond} must be in [0, 1]")));
    }
    let s = model.cfg.side as i64;
    let t: Vec<usize> = (0..b).map(|_| rng.below(schedule.steps() as u64) as usize).collect();
    let c: Vec<i64> =
        cond.iter().map(|&c| if rng.next_f64() < p_uncond { model.cfg.null_condition() } else { c }).collect();
    let noise = normals(rng, &[b, 1, s, s]);
    let x_t = q_sample(schedule, x0, &t, &noise);
    let tt: Vec<i64> = t.iter().map(|&i| i as i64).collect();
    let pred = model.forward(&x_t, &ids(&tt), &ids(&c));
    Ok((pred - noise).square().mean(Kind::Float))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules_are_monotone_and_bounded() {
        for kind in [ScheduleKind::Linear, ScheduleKind::Cosine] {
            for steps in [1, 2, 20, 1000] {
                let s = Schedule::new(kind, steps).unwrap();
                assert!(s.betas.iter().all(|&b| b > 0.0 && b <= MAX_BETA), "{kind:?} {steps}: {:?}", s.betas);
                assert!(s.alpha_bar.windows(2).all(|w| w[1] < w[0]));
                for t in 0..steps {
                    assert!(s.sigma(t, 1.0) > 0.0, "{kind:?} {steps} step {t}");
                }
            }
        }
        assert!(Schedule::linear(0).is_err());
        assert!(Schedule::cosine(MAX_STEPS + 1).is_err());
    }

    #[test]
    fn the_posterior_mean_of_the_true_noise_recovers_the_forward_process() {
        // With eps the true noise (and x0 inside [-1, 1]), the posterior mean at the last step is
        // exactly x0: c0 = 1, ct = 0 when alpha_bar_prev = 1.
        let s = Schedule::cosine(10).unwrap();
        let x0 = Tensor::from_slice(&[0.5f32, -0.25, 0.0, 0.75]).view([1, 1, 2, 2]);
        let noise = Tensor::from_slice(&[0.1f32, -0.3, 0.2, 0.0]).view([1, 1, 2, 2]);
        let x_t = q_sample(&s, &x0, &[0], &noise);
        let mean = posterior_mean(&s, &x_t, &noise, 0);
        assert!(f64::try_from((mean - &x0).abs().max()).unwrap() < 1e-6);
    }

    #[test]
    fn bad_sampler_settings_are_errors() {
        let cfg = super::super::model::DenoiserConfig { side: 2, conditions: 2, hidden: 4, layers: 1 };
        let m = Denoiser::init(&cfg, 0).unwrap();
        let s = Schedule::cosine(3).unwrap();
        let p = |guidance, eta| SampleParams { guidance, eta, seed: 0 };
        assert!(sample(&m, &[0], &s, p(f64::NAN, 1.0)).is_err());
        assert!(sample(&m, &[0], &s, p(1.0, -1.0)).is_err());
        assert!(sample(&m, &[3], &s, p(1.0, 1.0)).is_err());
        let det = sample(&m, &[0, 2], &s, p(2.0, 0.0)).unwrap();
        assert!(det.log_probs.is_empty() && det.latents.len() == 4);
        let (x, y, t) = det.transition(0);
        assert!(step_logprob(&m, x, y, t, &[0, 2], &s, 2.0, 0.0).is_err());
        assert!(step_logprob(&m, x, y, 3, &[0, 2], &s, 2.0, 1.0).is_err());
        assert!(step_logprob(&m, x, y, t, &[0], &s, 2.0, 1.0).is_err());
    }
}
