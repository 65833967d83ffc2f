//! A stage of the recipe as the planner sees it: its role, GPUs, engine and trainer layout.

use super::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Rollout,
    Train,
    Reward,
    Eval,
    Sft,
    /// An OPD teacher stage (`teacher_logprobs`).
    Teacher,
    Other,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Rollout => "rollout",
            Role::Train => "train",
            Role::Reward => "reward",
            Role::Eval => "eval",
            Role::Sft => "sft",
            Role::Teacher => "teacher",
            Role::Other => "other",
        }
    }
    /// Roles that run a trainer (and so hold gradients and optimizer state).
    pub fn trains(self) -> bool {
        matches!(self, Role::Train | Role::Sft)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Stage {
    /// The binding name in the recipe (`rollout`, `train`...).
    pub name: String,
    /// The stage kind (`generate`, `grpo`, `sft`, `terminal_bench`...).
    pub kind: String,
    pub role: Role,
    #[serde(default)]
    pub model: Option<ModelSpec>,
    /// GPUs asked for; `None` lets the planner decide (see docs/plan.md, "Placement").
    #[serde(default)]
    pub gpus: Option<Spanned<GpuRequest>>,
    /// For rollout and eval stages that run an inference engine.
    #[serde(default)]
    pub engine: Option<Engine>,
    /// For train and sft stages.
    #[serde(default)]
    pub trainer: Option<Trainer>,
    /// An OPD teacher stage on GPUs of its own (`teacher_logprobs { gpus = N }`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub teacher: Option<TeacherJob>,
    #[serde(default, serialize_with = "opt_span", deserialize_with = "de_opt_span")]
    pub span: Option<Span>,
}

/// What a teacher stage on GPUs of its own scores per optimizer step, read off the trainer it
/// feeds: that trainer's sequences, micro-batches and compute precision.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TeacherJob {
    pub seq_len: u64,
    pub micro_batch: u64,
    pub precision: Precision,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum GpuRequest {
    /// This many GPUs, taken in order from the free ones.
    Count(u64),
    /// GPU ids `first..=last` (ids number pools in order, nodes in order within a pool).
    Range { first: u64, last: u64 },
    /// Let the planner size it.
    #[default]
    Auto,
}

/// An inference engine fleet (SGLang semantics: an engine spans `tp` GPUs; data-parallel
/// attention and expert parallelism partition those GPUs, they do not add to them).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Engine {
    /// Number of engines; `None`: as many as fit in the stage's GPUs.
    #[serde(default)]
    pub engines: Option<Spanned<u64>>,
    pub tp: Spanned<u64>,
    #[serde(default = "one")]
    pub dp: Spanned<u64>,
    #[serde(default = "one")]
    pub ep: Spanned<u64>,
    pub precision: Spanned<Precision>,
    /// The embedded engine (`embedded_engine`): its `precision` is what its CPU GEMMs run in.
    #[serde(default)]
    pub embedded: bool,
    /// KV-cache element type; `None`: bf16.
    #[serde(default)]
    pub kv_precision: Option<Spanned<Precision>>,
    /// Share of HBM the engine may use for weights plus KV cache (SGLang `mem_fraction_static`).
    #[serde(default = "default_mem_fraction")]
    pub mem_fraction: Spanned<f64>,
    /// Concurrent requests per engine the recipe asks for.
    #[serde(default)]
    pub max_concurrent: Option<Spanned<u64>>,
    /// Share of prompt tokens found in the prefix cache (`None`: each context prefilled once).
    #[serde(default)]
    pub prefix_cache_hit: Option<Spanned<f64>>,
    /// Tokens.
    pub prompt_len: Spanned<u64>,
    /// Tokens.
    pub response_len: Spanned<u64>,
}

pub(super) fn one() -> Spanned<u64> {
    Spanned::new(1)
}
fn default_mem_fraction() -> Spanned<f64> {
    Spanned::new(0.85)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    Megatron,
    Fsdp,
    /// The in-process libtorch trainer (one process, no sharding).
    Embedded,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Recompute {
    Full,
    Selective,
    /// `off` in std/prelude's `Recompute`.
    #[serde(alias = "none")]
    Off,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OptimizerOffload {
    /// `on_gpu` in std/prelude's `OptimizerOffload`.
    #[serde(alias = "none")]
    OnGpu,
    Cpu,
    StreamFromDisk,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Trainer {
    pub backend: Spanned<Backend>,
    #[serde(default = "one")]
    pub tp: Spanned<u64>,
    #[serde(default = "one")]
    pub pp: Spanned<u64>,
    #[serde(default = "one")]
    pub cp: Spanned<u64>,
    #[serde(default = "one")]
    pub ep: Spanned<u64>,
    /// `None`: the stage's GPUs divided by tp x pp x cp.
    #[serde(default)]
    pub dp: Option<Spanned<u64>>,
    pub precision: Spanned<Precision>,
    #[serde(default = "one")]
    pub micro_batch: Spanned<u64>,
    /// Tokens per sample (prompt + response).
    pub seq_len: Spanned<u64>,
    pub recompute: Spanned<Recompute>,
    pub optimizer_offload: Spanned<OptimizerOffload>,
    /// Low-rank adapters (`lora = lora { ... }`): the base is frozen; only adapters train and sync.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora: Option<Lora>,
    /// On-policy distillation (`opd = opd { teacher = ... }` on `grpo`/`ppo`): the model of the
    /// teacher stage the trainer reads, frozen, run forward over every trajectory beside the
    /// trainer (docs/plan.md, "On-policy distillation: the teacher"). `None`: no distillation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub teacher: Option<ModelSpec>,
    /// The teacher stage runs in a worker process of its own (`process = true`): its memory is
    /// that process's, not this rank's; its forward still precedes the trainer's each step.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub teacher_process: bool,
    /// The embedded trainer as data-parallel worker processes (`embedded_trainer { dp }` above
    /// 1, docs/plan.md "Data-parallel embedded trainers"); `None`: one process. Megatron's and
    /// FSDP's data parallelism is `dp`, over GPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_parallel: Option<DataParallel>,
}

/// `embedded_trainer { dp, zero, dp_bucket, collective_timeout }` with dp > 1: `ranks` trainer
/// processes, each training its share of an optimizer step's micro-batches, gradients summed by
/// all-reduce over c10d before identical optimizer steps.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DataParallel {
    pub ranks: Spanned<u64>,
    #[serde(default)]
    pub zero: Spanned<Zero>,
    /// Gradient bytes per all-reduce bucket (`dp_bucket`).
    pub bucket_bytes: u64,
    /// Seconds a collective or the rendezvous may take (`collective_timeout`).
    pub timeout_s: u64,
}

/// std/prelude's `Zero`: how far the optimizer state is sharded over the data-parallel ranks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Zero {
    /// Every rank holds the whole Adam state.
    #[default]
    None,
    /// ZeRO-1: each rank holds the moments of the parameters it owns, updates them and
    /// broadcasts them to the others.
    Optimizer,
}

impl Zero {
    pub fn as_str(self) -> &'static str {
        match self {
            Zero::None => "none",
            Zero::Optimizer => "optimizer",
        }
    }
}
