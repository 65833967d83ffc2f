//! The plan: plain data, serialised as the JSON form of `miles plan --json`.

use crate::evidence::Evidence;
use crate::input::{Graph, PlacementMode, Role, ScheduleMode, Transport, WeightChannel};
use miles_grammar::diag::Diagnostic;
use serde::{Deserialize, Serialize};

/// Bumped whenever a field of [`Plan`] changes meaning or disappears (adding fields does not).
pub const FORMAT_VERSION: u32 = 2;

/// A Hugging Face model planned from its config.json (docs/plan.md, "Planning from
/// config.json"): what `miles check` read of it and what it did not.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelSource {
    /// The model as the stage lines name it.
    pub name: String,
    /// The directory.
    pub path: String,
    /// config.json's model_type as read (`deepseek_v3`, `qwen3_moe`, ...).
    pub architecture: String,
    /// The embedded backend loads it; false: `miles plan` sizes it, `miles run` refuses it.
    pub loadable: bool,
    pub params: u64,
    pub active_params: u64,
    /// Multi-token-prediction layers' parameters, not in `params`.
    pub mtp_params: u64,
    /// config.json's keys read, in order.
    pub read: Vec<String>,
    /// Keys present and not read (bookkeeping such as `transformers_version` left out).
    pub ignored: Vec<String>,
}

/// A `local` cluster's device in the plan (docs/gpu.md).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DeviceReport {
    /// cpu, cuda or auto.
    pub asked: String,
    /// "cpu" or "cuda:0"; `None` where the machine was not looked at (`miles plan` looks; a
    /// plan made from a plan input alone does not).
    pub resolved: Option<String>,
    /// Why that device, in words.
    pub why: String,
    /// The machine's GPUs, one line each ("0: NVIDIA H200, 139.8 GiB, sm_90").
    pub gpus: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Plan {
    pub format_version: u32,
    pub recipe: String,
    pub cluster: ClusterSummary,
    pub placement: PlacementMode,
    pub stages: Vec<StagePlan>,
    /// Contiguous GPU id ranges with the same occupants, in id order; idle GPUs included.
    pub gpu_map: Vec<GpuSlice>,
    pub memory: Vec<MemoryReport>,
    pub rollouts: Vec<RolloutReport>,
    pub syncs: Vec<SyncReport>,
    pub step: Option<StepReport>,
    pub batch: Option<BatchReport>,
    pub episodes: Option<EpisodeReport>,
    /// The lengths time estimates price a sample at, beside the bounds memory is sized for
    /// (docs/plan.md, "Expected lengths"); `miles report` sets them against a run's. Absent
    /// without a rollout.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lengths: Option<LengthReport>,
    pub buffer: Option<BufferReport>,
    /// Colocated placement: whether both actors fit at once, else the priced eviction.
    pub colocation: Option<ColocationReport>,
    /// A diffusion RL recipe's batch arithmetic and time per phase (docs/plan.md, "Diffusion
    /// RL"); its memory is a `memory` row and its step a `step` like any recipe's. Absent
    /// otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub diffusion: Option<DiffusionReport>,
    /// A `local` cluster's device: what the recipe asked, what the machine has, what a run uses.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<DeviceReport>,
    /// The `hf` models planned from their config.json, with the keys read and not read.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<ModelSource>,
    pub graph: Graph,
    pub diagnostics: Vec<Diagnostic>,
    pub summary: Summary,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ClusterSummary {
    pub name: String,
    pub gpus: u64,
    pub nodes: u64,
    pub pools: Vec<PoolSummary>,
    /// The host's name on a CPU-only cluster.
    pub host: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PoolSummary {
    pub gpu: String,
    pub nodes: u64,
    pub gpus_per_node: u64,
    pub first_gpu: u64,
    pub first_node: u64,
    /// Bytes.
    pub hbm: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct GpuRange {
    pub first: u64,
    pub last: u64,
}

impl GpuRange {
    pub fn len(self) -> u64 {
        self.last - self.first + 1
    }
    pub fn is_empty(self) -> bool {
        false
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Where {
    /// GPUs of its own.
    Own,
    /// The GPUs of another stage (colocated, or eval on the rollout engines).
    Shared,
    /// No GPU: the host CPU.
    Host,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StagePlan {
    pub name: String,
    pub kind: String,
    pub role: Role,
    /// `+` own GPUs, `~` shares GPUs, `=` on the host, `!` has an error.
    pub symbol: String,
    pub placed: Where,
    pub gpus: u64,
    pub ranges: Vec<GpuRange>,
    pub shares_with: Vec<String>,
    pub model: Option<String>,
    pub precision: Option<String>,
    /// Layout in words: `4 engines x TP8`, `TP2 PP4 CP4 EP8 DP1`.
    pub layout: String,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GpuSlice {
    pub first: u64,
    pub last: u64,
    pub first_node: u64,
    pub last_node: u64,
    /// Stage names hosted there; empty: idle.
    pub stages: Vec<String>,
    /// The role that colours the slice in the GPU map (train wins over rollout when colocated).
    pub role: Option<Role>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MemItem {
    /// weights, gradients, optimizer, activations, stream_buffer, kv_cache...
    pub name: String,
    /// Bytes on each GPU (0 when moved off the GPU, see `note`).
    pub bytes: u64,
    pub note: String,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MemoryReport {
    pub stage: String,
    pub role: Role,
    pub device: String,
    /// Bytes of the device (HBM, or host memory on a CPU-only cluster).
    pub capacity: u64,
    /// Bytes the stage may use.
    pub usable: u64,
    pub items: Vec<MemItem>,
    pub total: u64,
    pub fits: bool,
    pub offload: Option<OffloadReport>,
    /// A LoRA trainer's adapters (absent for a full fine-tune).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lora: Option<LoraReport>,
    /// A data-parallel embedded trainer: this row is one rank's process, of `ranks` (absent:
    /// one process).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ranks: Option<RanksMemory>,
}

/// The memory of a data-parallel embedded trainer (docs/plan.md, "Data-parallel embedded
/// trainers"): its row is one trainer rank's worker process; `ranks` of them run at once.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RanksMemory {
    pub ranks: u64,
    /// `none` or `optimizer` (ZeRO-1: the Adam moments sharded over the ranks).
    pub zero: String,
    /// All the ranks together, ranks x the row's total: what a CPU-only host must hold, and what
    /// `fits` checks there.
    pub all_ranks: u64,
}

/// LoRA on a training stage (docs/plan.md, "LoRA"): the adapters' sizes, what a weight update
/// moves, and the full fine-tune this rank would hold without them.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LoraReport {
    pub rank: u64,
    /// Adapters trained at once on the one base (multi-LoRA).
    pub adapters: u64,
    pub target_modules: Vec<String>,
    /// One adapter's parameters per target module.
    pub targets: Vec<TargetParams>,
    pub params_per_adapter: u64,
    /// All adapters.
    pub params: u64,
    /// Bytes a weight update moves: every adapter, in the trainer's precision.
    pub sync_bytes: u64,
    /// The adapters in words, as the text plan prints them.
    pub summary: String,
    /// The PEFT adapter directory training starts from (`lora { init }`); absent: fresh adapters.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub init: Option<String>,
    /// `LoRA from DIR (rank r, targets q, k, v, o)`, the text plan's line for `init`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub init_line: Option<String>,
    pub full_finetune: FullFinetune,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TargetParams {
    /// `q_proj`, `gate_proj`...
    pub module: String,
    /// One adapter's parameters on this module, whole model.
    pub params: u64,
    /// Linear layers wrapped: one per layer, or per routed expert of every MoE layer.
    pub wrapped_layers: u64,
    /// Whether they wrap routed experts.
    pub on_experts: bool,
}

/// Bytes per rank of the same stage without LoRA.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FullFinetune {
    pub weights: u64,
    pub gradients: u64,
    pub optimizer: u64,
    /// On the GPU, under the stage's optimizer offload.
    pub total: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OffloadReport {
    pub mode: String,
    /// Optimizer bytes per GPU kept off the GPU.
    pub bytes_per_gpu: u64,
    /// Host memory per node that CPU offload needs (0 when streamed from disk).
    pub host_bytes_per_node: u64,
    pub per_step: Estimate,
}

/// A time with the assumptions it used and how far it can be trusted.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Estimate {
    pub seconds: f64,
    pub assumptions: Vec<String>,
    pub evidence: Evidence,
}

/// A rate estimate (tokens per second) with the assumptions it used and its evidence.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Rate {
    pub per_s: f64,
    pub assumptions: Vec<String>,
    pub evidence: Evidence,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RolloutReport {
    pub stage: String,
    pub engines: u64,
    pub gpus_per_engine: u64,
    pub weights_per_gpu: u64,
    pub kv_bytes_per_gpu: u64,
    /// KV bytes one token takes on one GPU.
    pub kv_bytes_per_token: u64,
    /// Tokens the KV cache of one engine holds.
    pub kv_tokens_per_engine: u64,
    /// Sequences of prompt_len + response_len that fit at once per engine.
    pub sequences_per_engine: u64,
    pub requested_concurrent: Option<u64>,
    /// Concurrent sequences per engine assumed for throughput.
    pub decode_batch: u64,
    /// Generated tokens per second, whole fleet.
    pub tokens_per_s: Rate,
    /// Wall time to generate one rollout batch.
    pub rollout_time: Option<Estimate>,
    /// The step waits for this rollout while the recipe keeps its engines below their KV caches
    /// (E0412; docs/plan.md, "A throttled rollout").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub throttle: Option<ThrottleReport>,
}

/// The setting that holds a rollout's engines below the sequences their KV caches hold, while
/// the step waits for the rollout, and what raising it would give.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ThrottleReport {
    /// The binding setting as the recipe writes it: `max_concurrent` (fully_async's, samples in
    /// flight across the fleet), `engine.max_concurrent` (per engine) or `rollout_batch`.
    pub limit: String,
    pub value: u64,
    pub engines: u64,
    /// Sequences an engine decodes together under it.
    pub in_flight_per_engine: u64,
    /// Sequences an engine's KV cache holds.
    pub kv_sequences_per_engine: u64,
    /// The value to set, priced by planning the recipe again with it; `None` when no value
    /// shortens the step by 5% or more.
    pub fix: Option<ThrottleFix>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ThrottleFix {
    /// Each field to set and its value (`max_concurrent = 152`, and the engine's own
    /// `max_concurrent` when it would bind next).
    pub settings: Vec<Setting>,
    pub in_flight_per_engine: u64,
    /// Samples per rollout step after the fix over before (more than 1 when the rollout batch grows).
    pub samples_factor: u64,
    pub rollout_s: f64,
    pub rollout_s_after: f64,
    pub step_s: f64,
    pub step_s_after: f64,
    /// Seconds per optimizer step before and after (the step over its optimizer steps).
    pub per_optimizer_step_s: f64,
    pub per_optimizer_step_s_after: f64,
    /// Why not more: the KV slots are filled, or training (or a compute-bound decode) would then
    /// set the step.
    pub bound: String,
    /// What the change costs besides GPUs' time (staleness under fully_async).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Setting {
    pub field: String,
    pub value: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TransportEstimate {
    pub transport: Transport,
    pub seconds: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SyncReport {
    pub name: String,
    pub from: String,
    pub to: String,
    pub transport: Transport,
    /// The recipe's channel for broadcast and p2p; written only when not auto.
    #[serde(skip_serializing_if = "WeightChannel::is_auto")]
    pub channel: WeightChannel,
    pub bucket: u64,
    /// Bytes of converted weights every rollout engine receives (with LoRA: the adapters).
    pub bytes: u64,
    /// Whether only LoRA adapters move (the base is frozen); written only when true.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub lora: bool,
    pub estimate: Estimate,
    /// The same update by the other transports the placement allows.
    pub alternatives: Vec<TransportEstimate>,
}

impl SyncReport {
    /// The transport as the plan writes it: `broadcast`, or `broadcast over nccl` where the
    /// recipe chose a channel.
    pub fn how(&self) -> String {
        match (self.transport, self.channel) {
            (Transport::Broadcast | Transport::P2p, c) if !c.is_auto() => {
                format!("{} over {}", self.transport.as_str(), c.as_str())
            }
            (t, _) => t.as_str().to_string(),
        }
    }
}

/// Colocated rollout and training on the same GPUs (docs/plan.md, "Colocated placement").
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ColocationReport {
    /// Rollout plus training memory per GPU, were both resident.
    pub resident_bytes: u64,
    pub usable_bytes: u64,
    pub fits_resident: bool,
    /// Bytes per GPU evicted (and reloaded) at each pair of switches.
    pub offload_bytes: u64,
    pub offload_s: f64,
    pub reload_s: f64,
    /// What the step pays per rollout step: 0 when both fit, else offload + reload.
    pub switch: Estimate,
    /// switch / step.
    pub share_of_step: Option<f64>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StepReport {
    pub mode: ScheduleMode,
    pub rollout_s: f64,
    /// Dynamic sampling: generation rounds per step at most. `rollout_s` and the step count one
    /// round (how many run depends on the rewards); each further one adds `rollout_s`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dynamic_rounds: Option<u64>,
    /// Training time per rollout step (all of its optimizer steps).
    pub train_s: f64,
    pub train_step: Estimate,
    /// PPO: the critic's share of `train_s` (its values and value loss); absent without a critic.
    #[serde(skip_serializing_if = "is_zero")]
    pub critic_s: f64,
    /// OPD: the teacher's no-grad forward's share of `train_s`; absent without a teacher.
    #[serde(skip_serializing_if = "is_zero")]
    pub teacher_s: f64,
    /// OPD: a teacher stage on GPUs of its own, per rollout step (not in `train_s`); absent
    /// without one.
    #[serde(skip_serializing_if = "is_zero")]
    pub teacher_stage_s: f64,
    pub sync_s: f64,
    pub offload_s: f64,
    /// Colocated: evicting and reloading the idle actor (0 elsewhere, or when both fit).
    pub switch_s: f64,
    /// rollout + teacher stage + train + sync (+ offload, + switch): one step when nothing overlaps.
    pub sync_step_s: f64,
    /// max(rollout, train + offload, teacher stage) + sync: one step when generation and
    /// training overlap.
    pub async_step_s: f64,
    /// The figure for the recipe's schedule.
    pub step: Estimate,
    /// A data-parallel embedded trainer: its ranks, their share of the micro-batches and the
    /// collectives per optimizer step (absent: one process).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_parallel: Option<DataParallelReport>,
}

/// A data-parallel embedded trainer's step (docs/plan.md, "Data-parallel embedded trainers"):
/// what each rank computes and what the ranks exchange. Its collectives are in `train_s` and
/// `train_step` already.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DataParallelReport {
    pub ranks: u64,
    /// `none` or `optimizer` (ZeRO-1).
    pub zero: String,
    /// Micro-batches of an optimizer step in all, and on the busiest rank (ceil(all / ranks)).
    pub micro_batches: u64,
    pub micro_batches_per_rank: u64,
    /// Gradient bytes all-reduced per optimizer step (the trainable parameters' FP32 gradients,
    /// PPO's critic's included), in buckets of `bucket_bytes`.
    pub gradient_bytes: u64,
    pub bucket_bytes: u64,
    pub buckets: u64,
    /// Seconds per optimizer step: the gradients' all-reduce.
    pub all_reduce_s: f64,
    /// Bytes and seconds per optimizer step of ZeRO-1's parameter broadcast (each rank's updated
    /// share to the others); 0 without ZeRO.
    pub broadcast_bytes: u64,
    pub broadcast_s: f64,
    /// all_reduce_s + broadcast_s: the collectives of one optimizer step.
    pub collective: Estimate,
    /// The collectives of a rollout step (all its optimizer steps): what `miles report` sets
    /// against the run's `perf/collective_s`.
    pub collective_s: f64,
}

fn is_one(x: &u64) -> bool {
    *x == 1
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BatchReport {
    pub rollout_batch: u64,
    pub samples_per_prompt: u64,
    pub global_batch: u64,
    pub steps_per_rollout: u64,
    /// Passes over each rollout batch: epochs x steps_per_rollout optimizer steps per rollout.
    #[serde(skip_serializing_if = "is_one")]
    pub epochs: u64,
    /// Which of the four the planner derived, if any.
    pub derived: Option<String>,
    /// rollout_batch x samples_per_prompt.
    pub samples_per_rollout: u64,
    /// global_batch / (dp x micro_batch) of the first train stage.
    pub micro_batches_per_step: Option<u64>,
    /// Tokens per optimizer step (global_batch x seq_len).
    pub tokens_per_step: Option<u64>,
}

/// A multi-turn episode's token arithmetic (docs/plan.md, "Episodes").
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EpisodeReport {
    pub env: String,
    /// The recipe's `max_turns`.
    pub max_turns: u64,
    /// Turns of the longest episode: those that fit the model's context (at most `max_turns`).
    pub turns: u64,
    /// The model's context, when it is known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_context: Option<u64>,
    pub prompt_tokens: u64,
    /// Sampled tokens per turn at most (the rollout's max_new_tokens).
    pub turn_tokens: u64,
    pub observation_tokens: u64,
    /// Whether `observation_tokens` is the planner's assumption (the environment does not say).
    pub observation_assumed: bool,
    /// Whether it is the recipe's (`env_reward.observation_tokens`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub observation_stated: bool,
    /// The longest trajectory: prompt, every turn and the observations between them, capped by
    /// the model's context when it is known.
    pub tokens_per_episode: u64,
    /// Tokens the policy samples in the longest episode (the turns that fit the context).
    pub sampled_tokens: u64,
    /// `env_reward.prompt`: what the first turn shows of a chat row, within `prompt_tokens`.
    pub prompt: String,
    /// Tokens prefilled over an episode when each turn's context is the last one plus the new
    /// observation (TITO: the ids never change, so the engine's prefix cache holds).
    pub prefill_tito: u64,
    /// Tokens prefilled when each turn re-renders and re-tokenises the conversation (the ids can
    /// change, so no prefix can be trusted).
    pub prefill_retokenize: u64,
    /// Compactions in the longest episode (each starts a new TITO chain, prefilled whole).
    pub compactions: u64,
    /// The reward at or above which an episode counts as solved (`env_reward.solved_at`).
    pub solved_at: f64,
}

/// Per sample: the bounds (max_prompt_tokens, max_new_tokens per turn, the turns that fit) and
/// the lengths the time estimates use: the recipe's means where it states them, else the bounds.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LengthReport {
    pub max_prompt_tokens: f64,
    pub max_response_tokens: f64,
    pub prompt_tokens: f64,
    /// Per turn in an episode.
    pub response_tokens: f64,
    /// Whether the recipe stated the figure (`mean_prompt_tokens`, ...), else it is the bound.
    pub prompt_stated: bool,
    pub response_stated: bool,
    /// Episodes only: the turns that fit and the turns time is priced at.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_turns: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub turns: Option<f64>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub turns_stated: bool,
    /// Tokens of a trained sequence at these lengths and at most (the first RL trainer's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sequence_tokens: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_sequence_tokens: Option<u64>,
    /// The recipe's max_prompt_tokens and max_new_tokens where the model's `max_len` cut them
    /// (the bounds above are the cut ones); absent when they fit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capped: Option<crate::input::ContextCap>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BufferReport {
    pub max_staleness: Option<u64>,
    pub capacity_groups: u64,
    pub trajectories: u64,
    pub tokens_per_trajectory: u64,
    pub bytes_per_trajectory: u64,
    /// R3 data, when the engine records routing: (tokens - 1) x MoE layers x top_k x the id
    /// type's bytes (the last response token is never forwarded, so it has no routing).
    pub r3_bytes_per_trajectory: Option<u64>,
    /// MoE layers x top_k x the id type's bytes, when the engine records routing.
    pub r3_bytes_per_token: Option<u64>,
    /// Host memory the full buffer takes.
    pub bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RoleGpus {
    /// The roles sharing these GPUs (several when colocated).
    pub roles: Vec<Role>,
    pub gpus: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Summary {
    pub stages: usize,
    pub gpus: u64,
    pub by_role: Vec<RoleGpus>,
    pub idle_gpus: u64,
    pub errors: usize,
    pub warnings: usize,
    /// Advice that is neither an error nor a warning (E0412).
    #[serde(skip_serializing_if = "is_zero_count")]
    pub notes: usize,
}

fn is_zero_count(x: &usize) -> bool {
    *x == 0
}

/// A diffusion RL recipe on the embedded backend (docs/plan.md, "Diffusion RL").
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DiffusionReport {
    /// `denoiser 16x16 h256 x2`.
    pub model: String,
    pub params: u64,
    pub batch: DiffusionBatch,
    /// One RL step under the names of the run's metrics (`perf/rollout_s`, `perf/denoise_s`,
    /// `perf/reward_wait_s`, `perf/train_s`, `perf/step_s`).
    pub step: DiffusionStep,
    /// Denoising every micro-group of a step, one after another (n x d).
    pub denoise: Estimate,
    /// Denoising one micro-group (d).
    pub denoise_micro_group_s: f64,
    /// Scoring every micro-group (n x r); absent without a reward stage.
    pub reward: Option<Estimate>,
    /// Scoring one micro-group (r): the classifier, the analytic term, `extra_cost`.
    pub reward_micro_group_s: f64,
    /// Whether the recipe streams micro-groups to the reward stage.
    pub streaming: bool,
    /// Whether the reward stage is a worker process (else a thread of the run).
    #[serde(default)]
    pub reward_process: bool,
    /// Rollout with every micro-group scored after the last one: n d + n r.
    pub whole_batch_s: f64,
    /// Rollout with micro-group k scored while k + 1 denoises: d + (n - 1) max(d, r) + r.
    pub streamed_s: f64,
    /// Training one RL step; absent without a `diffusion_grpo` stage.
    pub train: Option<Estimate>,
    /// One held-out evaluation (not in the step time; every `eval_every` steps and at step 0).
    pub eval: Option<Estimate>,
    pub eval_every: Option<u64>,
    /// Before the first RL step, once: the denoiser's pretraining.
    pub pretrain: Option<Estimate>,
    /// Before the first RL step, once: training the reward classifier and the judge.
    pub classifiers: Option<Estimate>,
    /// pretrain + classifiers.
    pub one_off_s: f64,
}

/// Images per RL step and how the sampler and the trainer walk them.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DiffusionBatch {
    pub conditions_per_step: u64,
    pub samples_per_condition: u64,
    /// conditions_per_step x samples_per_condition.
    pub images_per_step: u64,
    pub micro_group: u64,
    /// images_per_step / micro_group.
    pub micro_groups_per_step: u64,
    /// T.
    pub denoising_steps: u64,
    /// Denoising steps recomputed with gradients per image (`train_steps`, else T).
    pub trained_steps: u64,
    /// Denoiser rows per image and denoising step: 2 under classifier-free guidance, else 1.
    pub forwards_per_step: u64,
    /// Host bytes of one step's trajectories: (T + 1) latents and T means of S^2 fp32 pixels
    /// and T f64 log-probabilities per image.
    pub trajectory_bytes: u64,
}

/// One RL step, seconds, named as the run's `perf/*` metrics.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DiffusionStep {
    pub rollout_s: f64,
    pub denoise_s: f64,
    /// Waiting for rewards after the last micro-group is denoised: rollout - denoise.
    pub reward_wait_s: f64,
    pub train_s: f64,
    pub step_s: f64,
}
