//! Placement, and what the embedded process and a diffusion recipe hold besides the trainer.

use super::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum PlacementMode {
    /// Rollout and training alternate on the same GPUs.
    Colocated,
    /// Separate GPU pools.
    #[default]
    Disaggregated,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Default)]
pub struct Placement {
    pub mode: Spanned<PlacementMode>,
    /// On a CPU-only host every stage shares the one embedded process: what it holds there
    /// besides the trainer, from the recipe (docs/plan.md, "The embedded process"). Absent in
    /// JSON: nothing extra; not written when so.
    #[serde(default, skip_serializing_if = "EmbeddedExtras::is_none")]
    pub embedded: EmbeddedExtras,
    /// A diffusion RL recipe (std/stages `denoise` on a `denoiser`): the embedded backend runs
    /// its every stage in one process, which the planner itemises instead of a language model's
    /// trainer and engine (docs/plan.md, "Diffusion RL"). Absent in JSON: not a diffusion recipe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diffusion: Option<Diffusion>,
}

/// A diffusion RL recipe as the planner needs it: the denoiser's sizes and the figures of its
/// stages (std/stages `denoise_pretrain`, `denoise`, `image_reward`, `diffusion_grpo`,
/// `image_eval`); each stage but the rollout is optional.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Diffusion {
    pub model: DenoiserSpec,
    #[serde(default)]
    pub pretrain: Option<DenoisePretrain>,
    pub rollout: DenoiseRollout,
    #[serde(default)]
    pub reward: Option<ImageReward>,
    #[serde(default)]
    pub train: Option<DiffusionTrainer>,
    #[serde(default)]
    pub eval: Option<ImageEval>,
}

/// std/prelude's `schema denoiser`: an MLP over the flattened side x side image.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DenoiserSpec {
    pub side: u64,
    /// Condition classes K (the embedding has K + 1 rows: the last is the null condition).
    pub conditions: u64,
    pub hidden: u64,
    /// Residual hidden blocks.
    pub layers: u64,
    /// The record's `params` (the stdlib counts them from the sizes).
    pub params: u64,
}

impl DenoiserSpec {
    /// The name stage lines print: `denoiser 16x16 h256 x2`.
    pub fn name(&self) -> String {
        format!("denoiser {}x{} h{} x{}", self.side, self.side, self.hidden, self.layers)
    }
}

/// `denoise_pretrain`: `steps` batches of `batch` domain images before RL.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DenoisePretrain {
    pub stage: String,
    pub steps: u64,
    pub batch: u64,
}

/// `denoise`: the DDPM sampler.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DenoiseRollout {
    pub stage: String,
    /// Denoising steps T.
    pub steps: u64,
    /// Classifier-free guidance weight: other than 0 and 1, two denoiser rows per image and step.
    pub guidance: f64,
    pub samples_per_condition: u64,
    pub micro_group: u64,
}

/// `image_reward`: the classifier (trained before RL unless loaded), an analytic term, the
/// stand-in latency per micro-group, and whether micro-groups are scored while the next denoises.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ImageReward {
    pub stage: String,
    pub streaming: bool,
    /// `extra_cost`, seconds per scored micro-group.
    #[serde(default)]
    pub extra_cost_s: f64,
    /// Training steps of the classifier the run trains; `None`: loaded (`classifier = "..."`).
    #[serde(default)]
    pub classifier_steps: Option<u64>,
    /// An analytic property is scored too.
    #[serde(default)]
    pub analytic: bool,
    /// Scored in a worker process of its own (`process = true`) rather than a thread; the time
    /// model is the same (a pipe's copy of a micro-group's pixels is not counted).
    #[serde(default)]
    pub process: bool,
}

/// `diffusion_grpo`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DiffusionTrainer {
    pub stage: String,
    pub conditions_per_step: u64,
    /// Denoising steps trained per image; `None`: all T.
    #[serde(default)]
    pub train_steps: Option<u64>,
    #[serde(default)]
    pub kl_coef: f64,
}

/// `image_eval`: every `every` RL steps (step 0 included), `samples` held-out images and the
/// judge (a second classifier trained for `judge_steps`, 0: none).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ImageEval {
    pub stage: String,
    pub every: u64,
    pub samples: u64,
    pub judge_steps: u64,
}

/// What the embedded backend holds in its one process besides the trainer's own state, read from
/// the recipe: each is a further copy of the weights, or tensors kept for the backward pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(default)]
pub struct EmbeddedExtras {
    /// `kl_coef > 0` on the trainer: a frozen reference copy of the policy (`freeze_reference`).
    pub kl_reference: bool,
    /// `evaluate { mode = snapshot }`: under an async schedule, a batch engine of its own.
    pub eval_snapshot: bool,
    /// `entropy_coef > 0`: the entropy's exp(log p) [tokens, vocab] is kept for the backward pass.
    pub entropy_in_loss: bool,
}

impl EmbeddedExtras {
    pub fn is_none(&self) -> bool {
        *self == EmbeddedExtras::default()
    }
}
