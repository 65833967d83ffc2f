//! A diffusion RL run as plain data (docs/recipes/diffusion.md): what `miles run` maps a diffusion
//! recipe onto and `miles-engine diffuse` executes on the embedded backend (engine/tch/src/diffusion).
//! Here, not in the backend, so the CLI builds it without libtorch.

use crate::{RunError, E_SPEC};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// The sizes of a denoiser. `conditions` is the number of real classes K; the condition
/// embedding has K + 1 rows, the last one the null condition of classifier-free guidance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DenoiserConfig {
    /// Image side S: images are [B, 1, S, S].
    pub side: usize,
    pub conditions: usize,
    /// Width of every hidden layer (even: half of the timestep sinusoid is sines, half cosines).
    pub hidden: usize,
    /// Residual hidden blocks.
    pub layers: usize,
}

impl Default for DenoiserConfig {
    fn default() -> Self {
        DenoiserConfig { side: 16, conditions: 10, hidden: 256, layers: 2 }
    }
}

impl DenoiserConfig {
    pub fn pixels(&self) -> usize {
        self.side * self.side
    }

    /// The id of the null (unconditional) condition.
    pub fn null_condition(&self) -> i64 {
        self.conditions as i64
    }

    /// Sizes a denoiser can be built with: checked before any tensor is made, so a bad recipe is
    /// an error and never a libtorch panic.
    pub fn validate(&self) -> Result<(), RunError> {
        let bad = |what: &str| Err(RunError::new(E_SPEC, format!("diffusion model: {what}")));
        if self.side == 0 || self.side > 256 {
            return bad(&format!("side {} must be in 1..=256", self.side));
        }
        if self.hidden == 0 || self.hidden % 2 != 0 || self.hidden > 16384 {
            return bad(&format!("hidden {} must be even and in 2..=16384", self.hidden));
        }
        if self.layers > 64 {
            return bad(&format!("layers {} must be at most 64", self.layers));
        }
        Ok(())
    }

    /// Every parameter's name and shape, in the order they are created, saved and synced.
    pub fn param_shapes(&self) -> Vec<(String, Vec<i64>)> {
        let (p, h, k) = (self.pixels() as i64, self.hidden as i64, self.conditions as i64 + 1);
        let mut v = vec![
            ("in.weight".to_string(), vec![h, p]),
            ("in.bias".to_string(), vec![h]),
            ("time.weight".to_string(), vec![h, h]),
            ("time.bias".to_string(), vec![h]),
            ("cond.weight".to_string(), vec![k, h]),
        ];
        for i in 0..self.layers {
            for (s, shape) in [
                ("norm.weight", vec![h]),
                ("norm.bias", vec![h]),
                ("fc1.weight", vec![h, h]),
                ("fc1.bias", vec![h]),
                ("fc2.weight", vec![h, h]),
                ("fc2.bias", vec![h]),
            ] {
                v.push((format!("blocks.{i}.{s}"), shape));
            }
        }
        v.push(("out_norm.weight".into(), vec![h]));
        v.push(("out_norm.bias".into(), vec![h]));
        v.push(("out.weight".into(), vec![p, h]));
        v.push(("out.bias".into(), vec![p]));
        v
    }
}

/// How betas grow over the T steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ScheduleKind {
    /// DDPM's linear betas rescaled to T steps: from 1e-4 * 1000/T to 0.02 * 1000/T (the 1000-step
    /// schedule's endpoints stretched, as diffusers' `linear` does), each clipped to 0.999.
    Linear,
    /// Nichol & Dhariwal (2021): alpha_bar(t) = f(t)/f(0), f(t) = cos((t/T + s)/(1 + s) * pi/2)^2
    /// with s = 0.008, betas clipped to 0.999. Keeps some signal at every step of a short
    /// schedule, where the stretched linear one destroys the image in the last few.
    #[default]
    Cosine,
}

/// Everything a diffusion run needs, as plain serde data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiffusionRunSpec {
    pub seed: u64,
    pub model: DenoiserConfig,
    #[serde(default)]
    pub schedule: ScheduleKind,
    /// Denoising steps T.
    pub steps: usize,
    /// Sampler noise level (sigma_t = eta sqrt(beta_tilde_t)); > 0 so every step has a log-prob.
    pub eta: f64,
    /// Classifier-free guidance weight (1: the conditional model alone).
    pub guidance: f64,
    pub pretrain: PretrainSpec,
    pub reward: DiffusionRewardSpec,
    pub rl: DiffusionRlSpec,
    pub eval: DiffusionEvalSpec,
    /// Score each micro-group while the next one denoises (else after the whole batch).
    pub streaming: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PretrainSpec {
    pub steps: u64,
    pub lr: f64,
    pub batch: usize,
    /// Probability of training on the null condition (classifier-free guidance).
    pub p_uncond: f64,
    /// Seeds the pretrained denoiser, the reward classifier, the judge and the held-out samples;
    /// None: the run's seed. Fixed, runs of several seeds differ in their RL draws alone.
    #[serde(default)]
    pub seed: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiffusionRewardSpec {
    /// Classifier training steps on the domain (batch 32) before RL, unless one is loaded.
    pub classifier_steps: u64,
    /// A classifier directory to load (`config.json` + `model.safetensors`, as a run writes to
    /// OUT/classifier) instead of training one.
    #[serde(default)]
    pub classifier_path: Option<PathBuf>,
    /// Weight of the classifier's p(condition | image) in the reward.
    pub classifier_weight: f64,
    /// Softmax temperature of that probability (above 1: graded rather than 0/1 rewards).
    #[serde(default = "one")]
    pub classifier_temperature: f64,
    /// An analytic property added with `analytic_weight`.
    #[serde(default)]
    pub analytic: Option<AnalyticReward>,
    #[serde(default)]
    pub analytic_weight: f64,
    /// Stand-in for a large reward model: sleep this long per scored micro-group after the
    /// classifier's real forward (so overlap can be measured on a small machine).
    #[serde(default)]
    pub extra_cost_ms: u64,
    /// Score in a worker process of its own (`miles-engine image-reward`) instead of a thread.
    #[serde(default)]
    pub process: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AnalyticReward {
    Brightness,
    Contrast,
    CenterMass,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiffusionRlSpec {
    pub steps: u64,
    pub conditions_per_step: usize,
    /// The group: images sampled per condition, compared with each other.
    pub samples_per_condition: usize,
    /// Images denoised together (divides the group).
    pub micro_group: usize,
    pub lr: f64,
    pub clip: f64,
    pub kl_coef: f64,
    /// Train on this many of the T denoising steps per trajectory (chosen at random); None: all.
    #[serde(default)]
    pub train_steps: Option<usize>,
    /// Divide advantages by the group's reward standard deviation.
    #[serde(default = "yes")]
    pub std_norm: bool,
    /// Gradient-norm clip of each update.
    #[serde(default = "one")]
    pub grad_clip: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiffusionEvalSpec {
    pub every: u64,
    /// Held-out (condition, seed) pairs.
    pub samples: usize,
    /// Training steps of the judge: a second classifier, trained from another seed and never
    /// rewarded against, whose accuracy on the held-out samples (`eval/judge_accuracy`) tells
    /// real fidelity from an exploited reward model; 0: no judge.
    #[serde(default = "judge_steps")]
    pub judge_steps: u64,
}

/// What a finished run reports.
#[derive(Debug, Clone, Serialize)]
pub struct DiffusionSummary {
    pub steps_done: u64,
    pub eval_start: f64,
    pub eval_end: f64,
    pub classifier_accuracy: f32,
    /// The judge's held-out accuracy at the first and last evaluation (NaN without a judge).
    pub judge_start: f64,
    pub judge_end: f64,
    pub wall_seconds: f64,
}

impl DiffusionRunSpec {
    /// The rules `miles check` will state in the stdlib; here so a spec from anywhere is refused
    /// before any work.
    pub fn validate(&self) -> Result<(), RunError> {
        self.model.validate()?;
        let r = &self.rl;
        let bad = |m: String| Err(RunError::new(E_SPEC, m));
        if r.micro_group == 0 || r.samples_per_condition % r.micro_group != 0 {
            return bad(format!(
                "micro_group = {} must divide samples_per_condition = {}: a micro-group holds one condition's images",
                r.micro_group, r.samples_per_condition
            ));
        }
        if self.eta <= 0.0 {
            return bad("eta must be > 0: RL needs every denoising step's log-probability".into());
        }
        if r.train_steps.is_some_and(|k| k == 0 || k > self.steps) {
            return bad(format!("train_steps must be in 1..={}", self.steps));
        }
        if r.conditions_per_step == 0 || self.eval.samples == 0 {
            return bad("conditions_per_step and eval samples must be positive".into());
        }
        Ok(())
    }
}

fn one() -> f64 {
    1.0
}

fn yes() -> bool {
    true
}

fn judge_steps() -> u64 {
    600
}
