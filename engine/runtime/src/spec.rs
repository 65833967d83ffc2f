//! `RunSpec`: everything the synchronous executor needs, as plain serde data.
//!
//! The compiler maps a recipe onto this struct; `examples/run_spec.rs` in miles-tch reads it from
//! JSON. Field list (units: steps are RL steps; `lr` is per optimizer step; counts are samples):
//!
//! ```text
//! RunSpec
//!   seed: u64                      master seed: init, data order, sampling (all derived from it)
//!   steps: u64                     RL steps (one step = generate, reward, train, sync)
//!   model: ModelConfig
//!     vocab_size, d_model, n_layers, n_heads, n_kv_heads, d_ff, max_len: usize
//!     rope_theta: f64 = 10000, norm_eps: f64 = 1e-5, init_std: f64 = 0.02,
//!     head_dim: Option<usize> (None = d_model/n_heads), qkv_bias, o_bias, qk_norm, tie_embeddings: bool = false,
//!     rope_scaling: Option<{type: linear, factor} | {type: llama3, factor, low_freq_factor,
//!                          high_freq_factor, original_max_position_embeddings}>
//!   task: TaskSpec
//!     kind: {type: addition|multiplication, digits}            operands of 1..=digits digits
//!         | {type: reverse|sort, min_len, max_len, alphabet = "abcdefghij"}
//!         | {type: data, path (.jsonl|.parquet), prompt_field, label_field, test_path?,
//!            on_error: skip|stop}                               (`jsonl` is accepted too)
//!     split: {test_size = 200, seed = 1234}                     held-out prompts, disjoint
//!     partial_credit: bool = false                              per-position credit in [0,1]
//!   hf: Option<{path}>             start from this Hugging Face directory: its weights, tokenizer
//!                                  and chat template (`model` must match its config.json)
//!   reward: Option<RewardSpec>     verifier | command | http (reward::spec); None = the task's
//!                                  exact match
//!   env: Option<EnvRunSpec>       episodes against an environment (env::spec): {env: {type:
//!                                  calculator|jsonl|openenv, ...}, max_turns = 4, turn_timeout_s,
//!                                  episode_timeout_s, concurrency, tool_format, reward, on_env_error}
//!   sft: Option<SftSpec>           warm-up before RL: {steps, lr, batch, warmup_steps = 0}
//!   rollout: RolloutSpec
//!     rollout_batch (prompts/step), samples_per_prompt, max_new_tokens,
//!     temperature = 1.0, top_p = 1.0, top_k = 0 (0 = off)
//!   train: TrainSpec (GRPO/PPO)
//!     lr, weight_decay = 0.0, beta1 = 0.9, beta2 = 0.999, eps = 1e-8,
//!     warmup_steps = 0, decay: none|linear|cosine = none, min_lr_ratio = 0.0,
//!     clip_low = 0.2, clip_high = 0.28, kl_coef = 0.0 (0 = no reference model),
//!     tis_cap: Option<f64> (None = no TIS), entropy_coef = 0.0, std_norm = true,
//!     aggregation: token|sequence = token, grad_clip = 1.0 (0 = off),
//!     micro_batch, global_batch  (rollout_batch*samples_per_prompt must be a multiple of
//!                                 global_batch, and global_batch of micro_batch)
//!   eval: {every = 10 (0 = only at start and end), prompts = 200,
//!          mode: shared|snapshot|external = shared, command?}    (mode matters only when async)
//!   checkpoint: {every = 0 (0 = only at the end), keep = 2}
//!   schedule: {type: sync} (default) | {type: one_step_off}
//!           | {type: fully_async, max_staleness = 2, max_concurrent = 64,
//!              refill: per_sample|per_group, buffer_capacity = 256, update_interval = 1,
//!              pause: in_place|retract|abort, on_stale/on_abort: retry|discard,
//!              starvation_retries = 2, filter: keep_all|drop_flat, staleness_gate = true,
//!              stall_timeout_s = 600}
//! ```
//!
//! Entry point: `miles_runtime::run_with(&spec, &RunOptions, &dyn Backend)`; the embedded
//! backend wraps it as `miles_tch::run(&spec, &RunOptions)`.

pub use crate::schedule::{AsyncSpec, DropAction, EvalMode, GroupFilter, PauseMode, Refill, ScheduleSpec};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// The whole run. Stable: the compiler targets it; add fields only with `#[serde(default)]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunSpec {
    /// Master seed. Model init, data order, sampling and dropout-free training all derive from
    /// it, so one seed gives one bit-exact run on one machine and thread count.
    pub seed: u64,
    /// Number of RL steps (generate a batch, reward it, train on it, sync weights).
    pub steps: u64,
    pub model: ModelConfig,
    pub task: TaskSpec,
    /// Start from a Hugging Face model directory instead of a seeded init.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hf: Option<HfModelSpec>,
    /// The reward stage; None: the task's exact-match verifier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reward: Option<crate::reward::RewardSpec>,
    /// Multi-turn episodes against an environment instead of single responses; the
    /// environment's reward replaces `reward` (docs/agents.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<crate::env::spec::EnvRunSpec>,
    /// Optional supervised warm-up on the train split before RL (random policies rarely earn a
    /// reward, and GRPO learns nothing from groups whose rewards are all equal).
    #[serde(default)]
    pub sft: Option<SftSpec>,
    pub rollout: RolloutSpec,
    pub train: TrainSpec,
    #[serde(default)]
    pub eval: EvalSpec,
    #[serde(default)]
    pub checkpoint: CheckpointSpec,
    /// Stages as separate processes (engine/workers); None = in-process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub distributed: Option<crate::distributed::DistributedSpec>,
    /// sync (the default), one_step_off or fully_async (docs/async.md).
    #[serde(default, skip_serializing_if = "ScheduleSpec::is_sync")]
    pub schedule: ScheduleSpec,
    /// The recipe's names of the stages, for messages.
    #[serde(default, skip_serializing_if = "StageNames::is_default")]
    pub stages: StageNames,
    /// Where the embedded backend computes (the `local` cluster's `device`); a spec without one
    /// runs on the CPU.
    #[serde(default, skip_serializing_if = "DeviceSpec::is_cpu")]
    pub device: DeviceSpec,
}

/// The `local` cluster's `device`: what the run asks of the machine. The backend resolves it once
/// per process (`miles_tch::device`), before any tensor is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceSpec {
    #[default]
    Cpu,
    /// The machine's first visible GPU; a machine without one stops the run (E0518).
    Cuda,
    /// The GPU where the machine has one and libtorch's CUDA library loads, else the CPU.
    Auto,
}

impl DeviceSpec {
    pub fn is_cpu(&self) -> bool {
        *self == DeviceSpec::Cpu
    }

    pub fn parse(s: &str) -> Option<DeviceSpec> {
        match s {
            "cpu" => Some(DeviceSpec::Cpu),
            "cuda" => Some(DeviceSpec::Cuda),
            "auto" => Some(DeviceSpec::Auto),
            _ => None,
        }
    }
}

/// A Hugging Face model directory: config.json, model.safetensors (or shards with
/// model.safetensors.index.json), tokenizer.json, tokenizer_config.json, generation_config.json.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HfModelSpec {
    pub path: PathBuf,
}

/// What the recipe calls the rollout, train and eval stages: a stall (E0509) names the stage that
/// stopped answering as the user wrote it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StageNames {
    pub rollout: String,
    pub train: String,
    pub eval: String,
}

impl Default for StageNames {
    fn default() -> Self {
        StageNames { rollout: "rollout".into(), train: "train".into(), eval: "eval".into() }
    }
}

impl StageNames {
    fn is_default(&self) -> bool {
        let d = StageNames::default();
        (&self.rollout, &self.train, &self.eval) == (&d.rollout, &d.train, &d.eval)
    }
}

/// Names are labels: they change no result, so a run resumes after its stages are renamed (resume
/// compares specs).
impl PartialEq for StageNames {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

/// Decoder-only transformer (Llama-style: RMSNorm, rotary positions, grouped KV heads, SwiGLU).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// Output/embedding rows. Must be >= the task tokenizer's vocabulary (checked before training).
    pub vocab_size: usize,
    pub d_model: usize,
    pub n_layers: usize,
    /// Query heads; d_model must be a multiple of n_heads and head_dim even (rotary pairs).
    pub n_heads: usize,
    /// Key/value heads; n_heads must be a multiple of n_kv_heads.
    pub n_kv_heads: usize,
    /// Hidden width of the SwiGLU MLP.
    pub d_ff: usize,
    /// Longest sequence (prompt + response) the model accepts.
    pub max_len: usize,
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
    #[serde(default = "default_norm_eps")]
    pub norm_eps: f64,
    /// Std of the normal init of every matrix (residual output projections are further scaled by
    /// 1/sqrt(2 * n_layers) to keep the residual stream's variance flat with depth).
    #[serde(default = "default_init_std")]
    pub init_std: f64,
    /// Width of one attention head; None = d_model / n_heads (Qwen3 sets it explicitly).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<usize>,
    /// Biases on the query/key/value projections (Qwen2; Llama/Qwen3 `attention_bias`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub qkv_bias: bool,
    /// Bias on the attention output projection (Llama/Qwen3 `attention_bias`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub o_bias: bool,
    /// RMSNorm over each query and key head before rotary (Qwen3).
    #[serde(default, skip_serializing_if = "is_false")]
    pub qk_norm: bool,
    /// The output projection is the embedding matrix (no separate lm_head).
    #[serde(default, skip_serializing_if = "is_false")]
    pub tie_embeddings: bool,
    /// Rescaled rotary frequencies for long contexts; None = plain rotary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_scaling: Option<RopeScaling>,
    /// Mixture-of-experts MLPs (after `dense_layers` dense ones); None: every MLP dense.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe: Option<MoeConfig>,
}

/// How a router turns its logits into the weights of the chosen experts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Gating {
    /// softmax over all experts, top-k of it (Mixtral, Qwen3-MoE).
    #[default]
    Softmax,
    /// an independent sigmoid per expert, top-k of it (DeepSeek-V3).
    Sigmoid,
}

/// std/prelude `transformer`'s MoE fields: every layer from `dense_layers` on has `experts`
/// SwiGLU experts of width `expert_d_ff` and a router choosing `top_k` per token, plus an
/// optional always-on shared expert.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MoeConfig {
    pub experts: usize,
    pub top_k: usize,
    pub expert_d_ff: usize,
    /// Width of the shared expert; 0: none.
    #[serde(default)]
    pub shared_expert_d_ff: usize,
    /// Leading layers with a dense MLP of width `d_ff`.
    #[serde(default)]
    pub dense_layers: usize,
    #[serde(default)]
    pub gating: Gating,
    /// Renormalise the top-k weights to sum to 1 (Qwen3-MoE's `norm_topk_prob`).
    #[serde(default = "yes")]
    pub norm_topk: bool,
    /// Coefficient of the load-balancing loss (Switch/Qwen3-MoE's `router_aux_loss_coef`).
    #[serde(default)]
    pub aux_loss_coef: f64,
}

impl MoeConfig {
    /// Layers with routed experts.
    pub fn moe_layers(&self, n_layers: usize) -> usize {
        n_layers.saturating_sub(self.dense_layers)
    }
}

/// The sizes of a Llama-style decoder, as a recipe's `transformer` gives them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecoderSizes {
    pub vocab_size: usize,
    pub d_model: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub d_ff: usize,
    pub max_len: usize,
}

impl ModelConfig {
    /// A plain decoder of these sizes: rotary theta 10000, no biases, no q/k norm, untied,
    /// every later field at its default.
    pub fn decoder(s: DecoderSizes) -> ModelConfig {
        ModelConfig {
            vocab_size: s.vocab_size,
            d_model: s.d_model,
            n_layers: s.n_layers,
            n_heads: s.n_heads,
            n_kv_heads: s.n_kv_heads,
            d_ff: s.d_ff,
            max_len: s.max_len,
            rope_theta: default_rope_theta(),
            norm_eps: default_norm_eps(),
            init_std: default_init_std(),
            head_dim: None,
            qkv_bias: false,
            o_bias: false,
            qk_norm: false,
            tie_embeddings: false,
            rope_scaling: None,
            moe: None,
        }
    }

    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.head_dim.unwrap_or(self.d_model / self.n_heads.max(1))
    }
}

/// Rotary frequency scaling, as in Hugging Face `rope_scaling` (`rope_parameters` since v5).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum RopeScaling {
    /// Every frequency divided by `factor`.
    Linear { factor: f64 },
    /// Llama 3.1: low frequencies divided by `factor`, high ones kept, a smooth blend between.
    Llama3 { factor: f64, low_freq_factor: f64, high_freq_factor: f64, original_max_position_embeddings: usize },
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn default_rope_theta() -> f64 {
    10000.0
}
fn default_norm_eps() -> f64 {
    1e-5
}
fn default_init_std() -> f64 {
    0.02
}

/// Which task, its held-out split and how it is rewarded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskSpec {
    pub kind: TaskKind,
    #[serde(default)]
    pub split: SplitSpec,
    /// Exact match gives 1/0. With partial credit the reward is the fraction of answer positions
    /// that match (still 1 only for an exact match).
    #[serde(default)]
    pub partial_credit: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum TaskKind {
    /// "a+b=" -> "c", operands with 1..=digits digits.
    Addition { digits: u32 },
    /// "a*b=" -> "c", operands with 1..=digits digits.
    Multiplication { digits: u32 },
    /// "abc>" -> "cba", strings over `alphabet` of length min_len..=max_len. With `working` > 0
    /// the answer is verbose: "abc>" -> "cba>ab" (the answer, `>`, the string's first `working`
    /// letters), and only a response's text before its first `>` is scored.
    Reverse {
        min_len: usize,
        max_len: usize,
        #[serde(default = "default_alphabet")]
        alphabet: String,
        #[serde(default, skip_serializing_if = "is_zero")]
        working: usize,
    },
    /// "cab>" -> "abc" (characters sorted), same parameters as reverse.
    Sort {
        min_len: usize,
        max_len: usize,
        #[serde(default = "default_alphabet")]
        alphabet: String,
    },
    /// Prompts from a JSONL or Parquet file (by extension; docs/data.md): the `prompt_field` of a
    /// row is a string or a list of chat messages, the `label_field` and the other fields go to the
    /// reward untouched. Without `test_path`, `split.test_size` rows (chosen by `split.seed`) are
    /// held out.
    #[serde(alias = "jsonl")]
    Data {
        path: PathBuf,
        prompt_field: String,
        label_field: String,
        #[serde(default)]
        test_path: Option<PathBuf>,
        #[serde(default)]
        on_error: OnError,
    },
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

fn default_alphabet() -> String {
    "abcdefghij".to_string()
}

/// What a malformed JSONL line does: reported with file:line either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnError {
    /// Warn and skip the line.
    #[default]
    Skip,
    /// Stop the run with an error.
    Stop,
}

/// The held-out split. Train prompts never equal a test prompt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SplitSpec {
    /// Number of held-out prompts (capped at half of a small task's whole problem space).
    #[serde(default = "default_test_size")]
    pub test_size: usize,
    /// Seed of the split alone, so runs with different master seeds share one test set.
    #[serde(default = "default_split_seed")]
    pub seed: u64,
}

fn default_test_size() -> usize {
    200
}
fn default_split_seed() -> u64 {
    1234
}

impl Default for SplitSpec {
    fn default() -> Self {
        SplitSpec { test_size: default_test_size(), seed: default_split_seed() }
    }
}

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

/// Generation settings for the training rollouts (evaluation is always greedy).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RolloutSpec {
    /// Prompts per RL step.
    pub rollout_batch: usize,
    /// Samples per prompt (one GRPO group).
    pub samples_per_prompt: usize,
    pub max_new_tokens: usize,
    #[serde(default = "one")]
    pub temperature: f64,
    #[serde(default = "one")]
    pub top_p: f64,
    /// 0 = no top-k filter.
    #[serde(default)]
    pub top_k: usize,
    /// The recipe's `max_prompt_tokens`: a prompt set whose longest prompt (with BOS) is longer
    /// stops the run before training (E0510). None: no bound but the model's `max_len`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_prompt_tokens: Option<usize>,
    /// The rollout engine's compute precision (the embedded engine: fp32, or bf16 weights and
    /// activations, as production engines sample, the trainer staying fp32).
    #[serde(default, skip_serializing_if = "Precision::is_fp32")]
    pub precision: Precision,
    /// R3: the engine records every token's routed experts (an MoE policy); None: it does not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub r3: Option<R3Spec>,
    /// The engine and the trainer run batch-invariant kernels: the trainer's log-probs of the
    /// sampled tokens equal the sampler's bit for bit (true on-policy; docs/moe.md).
    #[serde(default, skip_serializing_if = "is_false")]
    pub batch_invariant: bool,
}

/// What the embedded backend computes in: the engine's `precision` (bf16: weights and
/// activations in bf16) and the trainer's (bf16: matmuls in bf16 against fp32 master weights).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Precision {
    #[default]
    Fp32,
    Bf16,
}

impl Precision {
    fn is_fp32(&self) -> bool {
        *self == Precision::Fp32
    }
}

/// std/stages `generate`'s `record_routing`, `routing_replay` and `routing_dtype`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct R3Spec {
    /// The trainer's forward uses the recorded experts (else it re-routes and only measures the
    /// mismatch, `r3/route_mismatch`).
    pub replay: bool,
    /// The id type on the wire.
    pub id: crate::routing::RouteId,
}

fn one() -> f64 {
    1.0
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
    /// Mean over each sequence's unmasked tokens, then mean over sequences.
    Sequence,
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
fn yes() -> bool {
    true
}

/// Greedy exact-match accuracy on the held-out split.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvalSpec {
    /// Evaluate at step 0, every `every` steps and after the last step; 0 = start and end only.
    #[serde(default = "default_eval_every")]
    pub every: u64,
    /// Number of held-out prompts (at most the split's test_size).
    #[serde(default = "default_eval_prompts")]
    pub prompts: usize,
    /// Under an asynchronous schedule: on the shared engine, on a weight snapshot, or external.
    #[serde(default, skip_serializing_if = "is_default")]
    pub mode: EvalMode,
    /// For `mode = external`: a shell command; the model directory is appended as its argument.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
}

fn is_default<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

fn default_eval_every() -> u64 {
    10
}
fn default_eval_prompts() -> usize {
    200
}

impl Default for EvalSpec {
    fn default() -> Self {
        EvalSpec { every: default_eval_every(), prompts: default_eval_prompts(), mode: EvalMode::Shared, command: None }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointSpec {
    /// Save every `every` steps and after the last; 0 = only after the last step.
    #[serde(default)]
    pub every: u64,
    /// Keep the newest `keep` checkpoints (>= 1).
    #[serde(default = "default_keep")]
    pub keep: usize,
}

fn default_keep() -> usize {
    2
}

impl Default for CheckpointSpec {
    fn default() -> Self {
        CheckpointSpec { every: 0, keep: default_keep() }
    }
}

/// How progress is shown on stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProgressMode {
    /// A bar when stderr is a terminal, plain lines otherwise.
    #[default]
    Auto,
    Plain,
    Off,
}

/// Per-invocation options (not part of the recipe).
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Receives metrics.jsonl, spec.json, checkpoints/ and the final model.
    pub out_dir: PathBuf,
    /// Continue from the newest checkpoint in out_dir (same data order and RNG state).
    pub resume: bool,
    pub progress: ProgressMode,
    /// Stop cleanly after this many RL steps in this invocation (tests of resume).
    pub stop_after: Option<u64>,
    /// Intra-op threads of the backend; None = backend default. Results are bit-exact only for
    /// the same thread count.
    pub threads: Option<usize>,
    /// Upper bound on the whole run's wall time; exceeded -> E0509 after the current step.
    pub max_wall: Option<std::time::Duration>,
}

impl RunOptions {
    pub fn new(out_dir: impl Into<PathBuf>) -> Self {
        RunOptions {
            out_dir: out_dir.into(),
            resume: false,
            progress: ProgressMode::Auto,
            stop_after: None,
            threads: None,
            max_wall: None,
        }
    }
}

/// What a finished (or cleanly stopped) run reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// RL steps completed in total (including those before a resume).
    pub steps_done: u64,
    /// Held-out accuracy after SFT, before the first RL step.
    pub eval_start: Option<f64>,
    /// Last held-out accuracy measured.
    pub eval_end: Option<f64>,
    /// Mean reward of the last step's rollouts.
    pub last_reward: Option<f64>,
    /// Newest checkpoint directory, if any was written.
    pub checkpoint: Option<PathBuf>,
    pub metrics_path: PathBuf,
    pub wall_seconds: f64,
    /// True when `stop_after` ended the run before `steps`.
    pub stopped_early: bool,
}

impl RunSpec {
    /// The schedule as the asynchronous executor runs it; `None` for `sync`.
    pub fn async_schedule(&self) -> Option<crate::schedule::AsyncSpec> {
        crate::schedule::resolve(&self.schedule, self.rollout.rollout_batch, self.rollout.samples_per_prompt)
    }

    pub fn from_json(text: &str) -> Result<RunSpec, crate::RunError> {
        serde_json::from_str(text)
            .map_err(|e| crate::RunError::new(crate::E_SPEC, format!("run spec is not valid: {e}")))
    }

    /// Optimizer steps per RL step.
    pub fn optimizer_steps_per_rl_step(&self) -> usize {
        (self.rollout.rollout_batch * self.rollout.samples_per_prompt) / self.train.global_batch
    }

    /// Checks the constraints serde cannot express. Errors are E0504 with the field path.
    pub fn validate(&self) -> Result<(), crate::RunError> {
        let bad = |field: &str, why: &str| {
            Err(crate::RunError::new(crate::E_SPEC, format!("run spec field `{field}`: {why}")))
        };
        let m = &self.model;
        for (name, v) in [
            ("model.vocab_size", m.vocab_size),
            ("model.d_model", m.d_model),
            ("model.n_layers", m.n_layers),
            ("model.n_heads", m.n_heads),
            ("model.n_kv_heads", m.n_kv_heads),
            ("model.d_ff", m.d_ff),
            ("model.max_len", m.max_len),
        ] {
            if v == 0 {
                return bad(name, "must be at least 1");
            }
        }
        if m.head_dim.is_none() && m.d_model % m.n_heads != 0 {
            return bad("model.n_heads", "d_model must be a multiple of n_heads");
        }
        if m.head_dim() == 0 || m.head_dim() % 2 != 0 {
            return bad("model.n_heads", "head size must be even (rotary positions rotate pairs)");
        }
        if m.n_heads % m.n_kv_heads != 0 {
            return bad("model.n_kv_heads", "n_heads must be a multiple of n_kv_heads");
        }
        if (m.qk_norm || m.o_bias) && m.qkv_bias != m.o_bias {
            // The layouts of Llama (biases on all four or none), Qwen2 (q/k/v only) and Qwen3.
            return bad("model.o_bias", "o_bias needs qkv_bias, and with qk_norm the two go together");
        }
        if !(m.init_std > 0.0 && m.init_std.is_finite()) {
            return bad("model.init_std", "must be a positive number");
        }
        let r = &self.rollout;
        if r.rollout_batch == 0 {
            return bad("rollout.rollout_batch", "must be at least 1");
        }
        if r.samples_per_prompt == 0 {
            return bad("rollout.samples_per_prompt", "must be at least 1");
        }
        if r.max_new_tokens == 0 {
            return bad("rollout.max_new_tokens", "must be at least 1");
        }
        if !(r.temperature > 0.0 && r.temperature.is_finite()) {
            return bad("rollout.temperature", "must be > 0 (evaluation is greedy already)");
        }
        if !(r.top_p > 0.0 && r.top_p <= 1.0) {
            return bad("rollout.top_p", "must be in (0, 1]");
        }
        let t = &self.train;
        if !(t.lr >= 0.0 && t.lr.is_finite()) {
            return bad("train.lr", "must be a finite number >= 0");
        }
        if t.micro_batch == 0 || t.global_batch == 0 {
            return bad("train.micro_batch", "micro_batch and global_batch must be >= 1");
        }
        if t.global_batch % t.micro_batch != 0 {
            return bad("train.global_batch", "must be a multiple of train.micro_batch");
        }
        if let Some(o) = &t.opd {
            for (field, v) in [("coef", o.coef), ("task_coef", o.task_coef)] {
                if !(v >= 0.0 && v.is_finite()) {
                    return bad(&format!("train.opd.{field}"), "must be a finite number >= 0");
                }
            }
            if t.lora.is_some() {
                return bad("train.lora", "distillation with LoRA is not run yet");
            }
        }
        if let Some(p) = &t.ppo {
            for (field, v) in [("critic_lr", p.critic_lr), ("value_clip", p.value_clip)] {
                if !(v >= 0.0 && v.is_finite()) {
                    return bad(&format!("train.ppo.{field}"), "must be a finite number >= 0");
                }
            }
            for (field, v) in [("gamma", p.gamma), ("lambda", p.lambda)] {
                if !(0.0..=1.0).contains(&v) {
                    return bad(&format!("train.ppo.{field}"), "must be in [0, 1]");
                }
            }
            if t.lora.is_some() {
                return bad("train.lora", "PPO's critic with LoRA is not run yet");
            }
        }
        if let Some(l) = &t.lora {
            if l.rank == 0 || l.rank > m.d_model {
                return bad("train.lora.rank", "must be between 1 and the model's d_model");
            }
            if !(l.alpha >= 0.0 && l.alpha.is_finite()) {
                return bad("train.lora.alpha", "must be a finite number >= 0");
            }
            if !(0.0..1.0).contains(&l.dropout) {
                return bad("train.lora.dropout", "must be in [0, 1)");
            }
            if l.target_modules.is_empty() {
                return bad("train.lora.target_modules", "needs at least one module");
            }
            if let Some(x) = l.target_modules.iter().find(|x| !LORA_TARGETS.contains(&x.as_str())) {
                return bad("train.lora.target_modules", &format!("`{x}` is not one of {}", LORA_TARGETS.join(", ")));
            }
            if !l.adapters.is_empty() && (!self.schedule.is_sync() || self.env.is_some()) {
                return bad(
                    "train.lora.adapters",
                    "named adapters run under the sync schedule, on single-turn prompts",
                );
            }
            for (i, a) in l.adapters.iter().enumerate() {
                let valid =
                    !a.name.is_empty() && a.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
                if !valid {
                    return bad(
                        "train.lora.adapters",
                        &format!("adapter name `{}` must be letters, digits, _ or -", a.name),
                    );
                }
                if l.adapters[..i].iter().any(|b| b.name == a.name) {
                    return bad("train.lora.adapters", &format!("two adapters are named `{}`", a.name));
                }
                if a.lr.is_some_and(|lr| !(lr >= 0.0 && lr.is_finite())) {
                    return bad(
                        "train.lora.adapters",
                        &format!("adapter `{}`: lr must be a finite number >= 0", a.name),
                    );
                }
            }
        }
        let total = r.rollout_batch * r.samples_per_prompt;
        if total % t.global_batch != 0 {
            return bad(
                "train.global_batch",
                &format!(
                    "rollout_batch * samples_per_prompt = {total} must be a multiple of \
                     global_batch = {}",
                    t.global_batch
                ),
            );
        }
        if !(0.0..1.0).contains(&t.clip_low) {
            return bad("train.clip_low", "must be in [0, 1)");
        }
        if t.clip_high < 0.0 {
            return bad("train.clip_high", "must be >= 0");
        }
        if let Some(cap) = t.tis_cap {
            if cap.is_nan() || cap <= 0.0 {
                return bad("train.tis_cap", "must be > 0");
            }
        }
        if t.kl_coef < 0.0 {
            return bad("train.kl_coef", "must be >= 0");
        }
        if !(0.0..1.0).contains(&t.beta1) || !(0.0..1.0).contains(&t.beta2) {
            return bad("train.beta1", "beta1 and beta2 must be in [0, 1)");
        }
        if t.grad_clip < 0.0 {
            return bad("train.grad_clip", "must be >= 0 (0 = off)");
        }
        if let Some(s) = &self.sft {
            if s.batch == 0 {
                return bad("sft.batch", "must be at least 1");
            }
        }
        if self.checkpoint.keep == 0 {
            return bad("checkpoint.keep", "must be at least 1");
        }
        match &self.task.kind {
            TaskKind::Addition { digits } | TaskKind::Multiplication { digits } => {
                if *digits == 0 || *digits > 9 {
                    return bad("task.kind.digits", "must be in 1..=9");
                }
            }
            TaskKind::Reverse { min_len, max_len, alphabet, .. } | TaskKind::Sort { min_len, max_len, alphabet } => {
                if *min_len == 0 || min_len > max_len {
                    return bad("task.kind.min_len", "need 1 <= min_len <= max_len");
                }
                if let TaskKind::Reverse { working, .. } = &self.task.kind {
                    if working > min_len {
                        return bad(
                            "task.kind.working",
                            "must not exceed min_len (the working is the string's first letters)",
                        );
                    }
                }
                if alphabet.is_empty() {
                    return bad("task.kind.alphabet", "must not be empty");
                }
            }
            TaskKind::Data { .. } => {}
        }
        if let Some(a) = self.async_schedule() {
            if a.max_concurrent == 0 {
                return bad("schedule.max_concurrent", "must be at least 1");
            }
            if a.buffer_capacity < r.rollout_batch {
                return bad(
                    "schedule.buffer_capacity",
                    &format!(
                        "must hold at least one step's rollout_batch = {} groups (the trainer would wait forever)",
                        r.rollout_batch
                    ),
                );
            }
            if a.update_interval == 0 {
                return bad("schedule.update_interval", "must be at least 1");
            }
            if !(a.stall_timeout_s > 0.0 && a.stall_timeout_s.is_finite()) {
                return bad("schedule.stall_timeout_s", "must be a positive number of seconds");
            }
            if a.refill == Refill::PerGroup && a.max_concurrent < r.samples_per_prompt {
                return bad(
                    "schedule.max_concurrent",
                    "per-group refill needs room for a whole group (samples_per_prompt samples)",
                );
            }
        }
        if let Some(e) = &self.env {
            e.limits(self.model.max_len)?;
        }
        if self.env.is_some() && self.reward.is_some() {
            return bad("reward", "an episode's reward comes from its environment: give one or the other");
        }
        if self.eval.mode == EvalMode::External && self.eval.command.as_deref().is_none_or(|c| c.trim().is_empty()) {
            return bad("eval.command", "external evaluation needs a command");
        }
        if self.task.split.test_size == 0 {
            return bad("task.split.test_size", "must be at least 1");
        }
        Ok(())
    }
}
