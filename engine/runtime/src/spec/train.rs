//! How the trainer learns: the RL objective (GRPO, PPO's critic, on-policy distillation), AdamW
//! and its learning-rate schedule, LoRA adapters, and the SFT warm-up before RL.

use super::{one, yes, Precision, TaskSpec};
use serde::{Deserialize, Serialize};

/// Supervised warm-up: masked cross-entropy on (prompt, gold answer + EOS) of the train split.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SftSpec {
    /// Optimizer steps.
    pub steps: u64,
    pub lr: f64,
    /// Examples per optimizer step.
    pub batch: usize,
    #[serde(default)]
    pub warmup_steps: u64,
}

/// LR schedule after warm-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decay {
    #[default]
    None,
    Linear,
    Cosine,
}

/// How per-token losses become one number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Aggregation {
    /// Mean over all unmasked tokens of the global batch (long answers weigh more).
    #[default]
    Token,
    /// Mean over each sequence's unmasked tokens, then mean over sequences (the GRPO paper's).
    Sequence,
    /// Mean over each micro-batch's unmasked tokens, then mean over the step's micro-batches (BNPO
    /// as TRL's `loss_type = "bnpo"` computes it: per device batch).
    MicroToken,
    /// Sum over the step's unmasked tokens divided by sequences x `tokens` (Dr. GRPO: a constant
    /// normaliser, the generation budget `max_new_tokens`, so no length bias).
    Constant { tokens: usize },
}

/// Where the importance ratio is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RatioLevel {
    /// Per token: r_t = pi(y_t) / pi_old(y_t) (PPO, GRPO).
    #[default]
    Token,
    /// Per sequence: s = exp(mean_t log(pi(y_t) / pi_old(y_t))), clipped per sequence (GSPO).
    Sequence,
}

/// How a sample's advantage is formed from the rewards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AdvantageEstimator {
    /// Reward minus its group's mean, divided by the group's std when `std_norm` (GRPO).
    #[default]
    Grpo,
    /// Reward minus the mean of the group's other rewards, n/(n-1) (r - mean) (RLOO); divided by
    /// the group's std when `std_norm`.
    Rloo,
    /// REINFORCE++: per token, the reward at the last token minus `kl_coef` x the k1 KL to the
    /// reference at every token, summed to the end (the return); then, when `std_norm`,
    /// normalised over all the batch's trained tokens (mean 0, std 1). No group baseline.
    ReinforcePp,
}

/// Masked importance sampling (MIS / IcePop): a token whose trainer/sampler ratio
/// exp(logp_old_train - logp_rollout) leaves [low, high] gets no gradient.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MisSpec {
    pub low: f64,
    pub high: f64,
}

/// DAPO's soft overlong punishment, added to the reward before advantages: 0 up to `max - cache`
/// tokens, then falling linearly to -`penalty` at `max`, -`penalty` beyond.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OverlongSpec {
    pub max: usize,
    pub cache: usize,
    pub penalty: f64,
}

impl OverlongSpec {
    /// The shaping term for a response of `len` tokens (DAPO eq. 13, scaled by `penalty`).
    pub fn shaping(&self, len: usize) -> f64 {
        let expected = self.max.saturating_sub(self.cache);
        if len <= expected {
            0.0
        } else if len <= self.max {
            -self.penalty * (len - expected) as f64 / self.cache.max(1) as f64
        } else {
            -self.penalty
        }
    }
}

/// GRPO with the PPO clipped objective, AdamW and the LR schedule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainSpec {
    pub lr: f64,
    #[serde(default)]
    pub weight_decay: f64,
    #[serde(default = "default_beta1")]
    pub beta1: f64,
    #[serde(default = "default_beta2")]
    pub beta2: f64,
    #[serde(default = "default_adam_eps")]
    pub eps: f64,
    /// Linear warm-up, in optimizer steps.
    #[serde(default)]
    pub warmup_steps: u64,
    #[serde(default)]
    pub decay: Decay,
    /// Floor of the decayed LR as a fraction of `lr`.
    #[serde(default)]
    pub min_lr_ratio: f64,
    /// Ratio clip below 1: r >= 1 - clip_low.
    #[serde(default = "default_clip_low")]
    pub clip_low: f64,
    /// Ratio clip above 1: r <= 1 + clip_high (asymmetric "clip-higher").
    #[serde(default = "default_clip_high")]
    pub clip_high: f64,
    /// KL penalty to the frozen initial (post-SFT) policy, k3 estimator. 0 = no reference model.
    #[serde(default)]
    pub kl_coef: f64,
    /// Truncated importance sampling: weight min(exp(logp_old_train - logp_rollout), cap).
    #[serde(default)]
    pub tis_cap: Option<f64>,
    #[serde(default)]
    pub entropy_coef: f64,
    /// Divide group-centred rewards by the group's std (+1e-6).
    #[serde(default = "yes")]
    pub std_norm: bool,
    #[serde(default)]
    pub aggregation: Aggregation,
    /// Passes over each rollout batch (TRL's `num_iterations`, verl's `ppo_epochs`): every pass
    /// reshuffles the batch (seeded by the run's seed and the step) into its optimizer steps'
    /// mini-batches; the behaviour log-probs stay those of the weights that generated it.
    #[serde(default = "one_pass", skip_serializing_if = "is_one_pass")]
    pub epochs: usize,
    #[serde(default, skip_serializing_if = "RatioLevel::is_token")]
    pub ratio: RatioLevel,
    #[serde(default, skip_serializing_if = "AdvantageEstimator::is_grpo")]
    pub advantage: AdvantageEstimator,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mis: Option<MisSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlong: Option<OverlongSpec>,
    /// Max global grad norm; 0 = no clipping.
    #[serde(default = "one")]
    pub grad_clip: f64,
    /// Samples per forward/backward pass (memory bound).
    pub micro_batch: usize,
    /// Samples per optimizer step; rollout_batch * samples_per_prompt / global_batch optimizer
    /// steps are taken per RL step.
    pub global_batch: usize,
    /// Low-rank adapters for the RL phase: the base (after any SFT warm-up) is frozen and only
    /// the adapters train and sync. None: full fine-tuning.
    #[serde(default)]
    pub lora: Option<LoraSpec>,
    /// PPO with a learned critic (std/stages `ppo`): per-token GAE advantages from the critic's
    /// values replace the group-relative ones. None: GRPO.
    #[serde(default)]
    pub ppo: Option<PpoSpec>,
    /// On-policy distillation: a teacher's per-token log-probs join the advantage.
    #[serde(default)]
    pub opd: Option<OpdSpec>,
    /// The embedded trainer's `precision`: bf16 runs the policy's matmuls in bf16 (as autocast
    /// does) against fp32 weights, gradients and optimizer state; fp32 runs everything in fp32.
    #[serde(default, skip_serializing_if = "Precision::is_fp32")]
    pub precision: Precision,
    /// Data-parallel trainer ranks (`embedded_trainer { dp }`), each a worker process; None: one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dp: Option<DataParallelSpec>,
}

/// std/prelude's `embedded_trainer { dp, zero, dp_bucket, collective_timeout }`: the trainer as
/// `ranks` worker processes over PyTorch's c10d (Gloo on CPU), each taking its share of every
/// optimizer step's micro-batches, gradients summed across ranks before identical optimizer steps
/// (docs/distributed.md "Data-parallel trainers").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataParallelSpec {
    pub ranks: usize,
    /// How far the optimizer is sharded over the ranks.
    #[serde(default)]
    pub zero: ZeroStage,
    /// Gradient bytes per all-reduce bucket.
    pub bucket_bytes: u64,
    /// A collective (or the rendezvous) that takes longer than this fails, naming the rank.
    pub timeout_s: f64,
}

/// ZeRO's stages as the embedded trainer runs them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ZeroStage {
    /// Every rank holds the whole optimizer state (plain data parallelism).
    #[default]
    None,
    /// ZeRO-1: each rank holds the Adam moments of its share of the parameters, updates that
    /// share and sends it to the others.
    Optimizer,
}

/// One trainer process's place in its data-parallel group: given to it by the controller at Init
/// (not in the run spec, which every rank shares).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DpRank {
    pub rank: usize,
    pub world: usize,
    /// The c10d TCPStore the ranks meet at, `host:port` (the controller hosts it).
    pub store: String,
}

/// std/prelude's `opd`: advantage_t = task_coef x the task's advantage + coef x
/// (log pi_teacher(x_t) - log pi_student(x_t)), over the sampled tokens.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpdSpec {
    /// The recipe's `teacher_logprobs` stage, named by its errors.
    #[serde(default = "teacher_stage")]
    pub stage: String,
    /// The teacher's Hugging Face directory (its config.json was read by `miles check`).
    pub teacher: std::path::PathBuf,
    pub coef: f64,
    pub task_coef: f64,
    /// Host the teacher in a worker process of its own (`miles-engine teacher`).
    #[serde(default)]
    pub process: bool,
}

fn teacher_stage() -> String {
    "teacher".into()
}

/// std/stages `ppo`'s critic and advantage settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PpoSpec {
    /// The critic's own AdamW learning rate (on the run's LR schedule).
    pub critic_lr: f64,
    /// GAE discount and trace decay.
    pub gamma: f64,
    pub lambda: f64,
    /// A value moves at most this far from the value it had when the batch was sampled (PPO's
    /// clipped value loss); 0: no clipping.
    #[serde(default)]
    pub value_clip: f64,
    /// The behaviour policy's log-probs are the rollout engine's (else the trainer's own, before
    /// the update).
    #[serde(default)]
    pub rollout_logprobs: bool,
}

/// The linear layers of a Llama-family layer that LoRA can wrap, by their Hugging Face names.
pub const LORA_TARGETS: [&str; 7] = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"];

/// std/prelude's `schema lora` as the embedded backend runs it (PEFT's LoRA: W x + (alpha/r) B A x).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoraSpec {
    pub rank: usize,
    pub alpha: f64,
    /// Dropout on each wrapped layer's input to the adapter, in training passes only.
    #[serde(default)]
    pub dropout: f64,
    /// Names from [`LORA_TARGETS`].
    pub target_modules: Vec<String>,
    /// Seeds the adapters' A matrices (the run's seed); B starts at zero, so the adapted policy
    /// starts equal to the base.
    #[serde(default)]
    pub init_seed: u64,
    /// Named adapters trained at once on the one base (multi-LoRA), each on its own prompts;
    /// empty: one unnamed adapter on the rollout's prompts.
    #[serde(default)]
    pub adapters: Vec<AdapterSpec>,
    /// A PEFT adapter directory (adapter_config.json, adapter_model.safetensors) the one adapter
    /// starts from, instead of A seeded and B zero: the policy starts as base + that adapter.
    /// Its rank, alpha and targets are the ones above (`miles check` compared them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init: Option<std::path::PathBuf>,
}

/// One adapter of a multi-LoRA run: its prompts (scored by the run's reward) and learning rate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdapterSpec {
    pub name: String,
    pub task: TaskSpec,
    /// None: the trainer's `lr`.
    #[serde(default)]
    pub lr: Option<f64>,
}

impl LoraSpec {
    /// alpha / rank, the scale of the low-rank update.
    pub fn scale(&self) -> f64 {
        self.alpha / self.rank.max(1) as f64
    }

    /// The adapters' names: None for the one unnamed adapter.
    pub fn names(&self) -> Vec<Option<&str>> {
        if self.adapters.is_empty() {
            vec![None]
        } else {
            self.adapters.iter().map(|a| Some(a.name.as_str())).collect()
        }
    }
}

fn one_pass() -> usize {
    1
}
fn is_one_pass(n: &usize) -> bool {
    *n == 1
}

impl RatioLevel {
    fn is_token(&self) -> bool {
        *self == RatioLevel::Token
    }
}

impl AdvantageEstimator {
    fn is_grpo(&self) -> bool {
        *self == AdvantageEstimator::Grpo
    }
}
fn default_beta1() -> f64 {
    0.9
}
fn default_beta2() -> f64 {
    0.999
}
fn default_adam_eps() -> f64 {
    1e-8
}
fn default_clip_low() -> f64 {
    0.2
}
fn default_clip_high() -> f64 {
    0.28
}
