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
//!   reward: Option<RewardSpec>     verifier | command | http (spec::reward); None = the task's
//!                                  exact match
//!   env: Option<EnvRunSpec>       episodes against an environment (spec::env): {env: {type:
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
//!   samples: {every = 10 (0 = none), count = 4}   samples.jsonl: at step 1, every `every`, the last
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
//!
//! One concept per file: the run as a whole and its small sections here; `model`, `task`,
//! `rollout`, `train` (with SFT), `options` (per invocation, and the summary), the reward and
//! environment settings (`reward`, `env`), `validate` (what serde cannot check) and `resume` (what
//! a resumed run may change). The schedule's
//! settings live in `crate::schedule`, the distributed ones in `crate::distributed`. Everything
//! here is plain data: this module imports nothing above it.

pub(crate) mod env;
mod model;
mod options;
mod resume;
pub(crate) mod reward;
mod rollout;
pub mod serving;
mod task;
mod train;
mod validate;

pub use crate::schedule::{
    AsyncSpec, DropAction, DynamicSampling, EvalMode, GroupFilter, PauseMode, Refill, ScheduleSpec,
};
pub use model::*;
pub use options::*;
pub use resume::{ResumeDiff, SpecChange, RESUME_FREE};
pub use rollout::*;
pub use task::*;
pub use train::*;

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
    pub reward: Option<reward::RewardSpec>,
    /// Multi-turn episodes against an environment instead of single responses; the
    /// environment's reward replaces `reward` (docs/agents.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<env::EnvRunSpec>,
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
    /// Samples written for reading, to OUT/samples.jsonl (docs/runs.md, "Samples"). Left out of
    /// the JSON at its default, so a spec from before it reads (and resumes) the same.
    #[serde(default, skip_serializing_if = "SamplesSpec::is_default")]
    pub samples: SamplesSpec,
    /// Stages as separate processes (engine/workers); None = in-process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub distributed: Option<crate::distributed::DistributedSpec>,
    /// sync (the default), one_step_off or fully_async (docs/async.md).
    #[serde(default, skip_serializing_if = "ScheduleSpec::is_sync")]
    pub schedule: ScheduleSpec,
    /// `sync { filter = drop_flat }`: over-sample until the step holds whole-signal groups.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dynamic_sampling: Option<DynamicSampling>,
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
    /// Keep the newest `keep` checkpoints; at least 2 stay whatever it says, so a resume always
    /// has an older good checkpoint to fall back on.
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

/// samples.jsonl: `count` samples of a step, written at step 1, every `every` steps and the
/// last step, so a newcomer reads what the policy says without asking; `every = 0` writes none.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SamplesSpec {
    #[serde(default = "default_samples_every")]
    pub every: u64,
    #[serde(default = "default_samples_count")]
    pub count: usize,
}

fn default_samples_every() -> u64 {
    10
}

fn default_samples_count() -> usize {
    4
}

impl Default for SamplesSpec {
    fn default() -> Self {
        SamplesSpec { every: default_samples_every(), count: default_samples_count() }
    }
}

impl SamplesSpec {
    pub fn is_default(&self) -> bool {
        *self == SamplesSpec::default()
    }

    /// Whether step `step` of a run of `steps` writes samples.
    pub fn due(&self, step: u64, steps: u64) -> bool {
        self.every > 0 && self.count > 0 && step >= 1 && (step == 1 || step % self.every == 0 || step == steps)
    }
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
}

// Serde defaults and skips shared by the sections (children of this module use them).

fn is_false(b: &bool) -> bool {
    !*b
}

fn one() -> f64 {
    1.0
}

fn yes() -> bool {
    true
}
