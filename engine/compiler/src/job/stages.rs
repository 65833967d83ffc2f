//! A recipe's stages as typed values: what a rollout samples with, what a trainer trains with, a
//! teacher, the weight syncs, the schedule and the device. Read once from the lowered graph with
//! the accessors of `read.rs`; the values are the ones the stdlib's records hold (their defaults
//! included), never a Rust-side fallback.

use super::model::ModelJob;
use super::read::{stage_named, upstream, Fields};
use crate::graph::{StageGraph, StageNode};
use crate::value::{PortKind, Record, Value};
use miles_grammar::diag::{Span, Spanned};

/// What a stage does in the run, from its kind and its output port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Sft,
    Rollout,
    Eval,
    Teacher,
    Reward,
    Train,
    /// Weight syncs, checkpoints and kinds of no other role.
    Other,
}

impl Role {
    pub fn of(node: &StageNode) -> Role {
        match (node.kind.as_str(), node.output) {
            ("weights", _) => Role::Other,
            ("sft", _) => Role::Sft,
            ("generate", _) => Role::Rollout,
            ("evaluate", _) => Role::Eval,
            ("teacher_logprobs", _) => Role::Teacher,
            (_, Some(PortKind::Trajectories)) => Role::Rollout,
            (_, Some(PortKind::Scores)) => Role::Reward,
            (_, Some(PortKind::Policy)) => Role::Train,
            _ => Role::Other,
        }
    }
    pub fn trains(self) -> bool {
        matches!(self, Role::Sft | Role::Train)
    }
}

/// A number format (std/prelude `Precision`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precision {
    Fp32,
    Bf16,
    Fp16,
    Fp8Blockwise,
    Mxfp8,
    Nvfp4,
}

impl Precision {
    fn of(name: &str) -> Precision {
        match name {
            "fp32" => Precision::Fp32,
            "fp16" => Precision::Fp16,
            "fp8_blockwise" => Precision::Fp8Blockwise,
            "mxfp8" => Precision::Mxfp8,
            "nvfp4" => Precision::Nvfp4,
            _ => Precision::Bf16,
        }
    }
}

fn precision(r: &Record) -> Option<Spanned<Precision>> {
    r.member("precision").map(|p| p.map(Precision::of))
}

/// A rollout's `engine` record: the embedded engine, or an SGLang-compatible fleet.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineJob {
    /// `embedded_engine`, `sglang`, ...
    pub schema: String,
    pub precision: Option<Spanned<Precision>>,
    /// Servers given by URL (`sglang { url = "a,b" }`), in order.
    pub urls: Vec<String>,
    pub gpus: Option<Spanned<u64>>,
    pub first_gpu: Option<Spanned<u64>>,
    pub tp: Option<Spanned<u64>>,
    pub ep: Option<Spanned<u64>>,
    pub mem_fraction: Option<Spanned<f64>>,
    pub max_concurrent: Option<Spanned<u64>>,
    pub prefix_cache_hit: Option<Spanned<f64>>,
}

impl EngineJob {
    fn of(r: &Record) -> EngineJob {
        let urls = r
            .str("url")
            .map(|u| u.split(',').map(|x| x.trim().to_string()).filter(|x| !x.is_empty()).collect())
            .unwrap_or_default();
        EngineJob {
            schema: r.schema_name.clone(),
            precision: precision(r),
            urls,
            gpus: r.u64("gpus"),
            first_gpu: r.u64("first_gpu"),
            tp: r.u64("tp"),
            ep: r.u64("ep"),
            mem_fraction: r.f64("mem_fraction"),
            max_concurrent: r.u64("max_concurrent"),
            prefix_cache_hit: r.f64("prefix_cache_hit"),
        }
    }
    /// An engine started on the recipe's GPUs (an `sglang` fleet without a URL).
    pub fn on_gpus(&self) -> bool {
        self.schema == "sglang" && self.urls.is_empty()
    }
}

/// The integer type of a recorded expert id (std/prelude `RouteId`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RouteDtype {
    U8,
    U16,
    I32,
}

/// R3: the rollout records each token's routed experts (`record_routing`), and the trainer
/// replays them (`routing_replay`).
#[derive(Clone, Debug, PartialEq)]
pub struct R3Job {
    /// Where the recipe asked for it: `record_routing`, else `routing_replay` it defaults to.
    pub span: Option<Span>,
    pub replay: bool,
    /// None: the smallest type that holds the expert count.
    pub dtype: Option<RouteDtype>,
}

/// What a `generate` (or `evaluate`) stage samples with.
#[derive(Clone, Debug, PartialEq)]
pub struct RolloutJob {
    pub engine: Option<EngineJob>,
    /// `max_prompt_tokens` and `max_new_tokens`, an evaluation's from the rollout it reads.
    pub prompt_tokens: Spanned<u64>,
    pub response_tokens: Spanned<u64>,
    pub samples_per_prompt: Option<Spanned<u64>>,
    pub temperature: f64,
    pub top_p: f64,
    pub top_k: u64,
    pub r3: Option<R3Job>,
    pub batch_invariant: bool,
    /// Planning assumptions (read by `miles plan` only).
    pub mean_prompt_tokens: Option<f64>,
    pub mean_response_tokens: Option<f64>,
    /// A TITO session's rule (`session = tito { rule }`), None without a session.
    pub session_rule: Option<String>,
}

impl RolloutJob {
    fn of(g: &StageGraph, node: &StageNode) -> RolloutJob {
        // An evaluation states no lengths of its own: the rollout it reads does.
        let lengths = if node.param("max_new_tokens").is_some() {
            node
        } else {
            upstream(g, node, PortKind::Trajectories).unwrap_or(node)
        };
        let tokens = |name: &str| lengths.u64(name).unwrap_or(Spanned::new(0));
        let r3 = node.bool("record_routing").filter(|r| r.value).map(|r| R3Job {
            span: r.span.or_else(|| node.set_span("routing_replay")),
            replay: node.bool("routing_replay").is_some_and(|b| b.value),
            dtype: match node.member("routing_dtype").map(|d| d.value) {
                Some("u8") => Some(RouteDtype::U8),
                Some("u16") => Some(RouteDtype::U16),
                Some("i32") => Some(RouteDtype::I32),
                _ => None,
            },
        });
        let real = |name: &str| node.f64(name).map(|v| v.value);
        RolloutJob {
            engine: node.record("engine").map(EngineJob::of),
            prompt_tokens: tokens("max_prompt_tokens"),
            response_tokens: tokens("max_new_tokens"),
            samples_per_prompt: node.u64("samples_per_prompt"),
            temperature: real("temperature").unwrap_or(0.0),
            top_p: real("top_p").unwrap_or(0.0),
            top_k: node.u64("top_k").map_or(0, |v| v.value),
            r3,
            batch_invariant: node.bool("batch_invariant").is_some_and(|b| b.value),
            mean_prompt_tokens: real("mean_prompt_tokens").filter(|v| v.is_finite()),
            mean_response_tokens: real("mean_response_tokens").filter(|v| v.is_finite()),
            session_rule: node.record("session").and_then(|s| s.member("rule")).map(|r| r.value.to_string()),
        }
    }
}

/// A trainer's `backend` record: the embedded trainer, or Megatron/FSDP on GPUs.
#[derive(Clone, Debug, PartialEq)]
pub struct BackendJob {
    /// `embedded_trainer`, `megatron`, `fsdp`.
    pub schema: String,
    pub precision: Option<Spanned<Precision>>,
    pub gpus: Option<Spanned<u64>>,
    pub first_gpu: Option<Spanned<u64>>,
    pub tp: Option<Spanned<u64>>,
    pub pp: Option<Spanned<u64>>,
    pub cp: Option<Spanned<u64>>,
    pub ep: Option<Spanned<u64>>,
    /// Data-parallel ranks: Megatron's and FSDP's DP degree; the embedded trainer's worker
    /// processes (`embedded_trainer { dp }`, 1 unless set).
    pub dp: Option<Spanned<u64>>,
    pub micro_batch: Option<Spanned<u64>>,
    /// `off`, `selective`, `full`.
    pub recompute: Option<Spanned<String>>,
    /// The embedded trainer's ZeRO stage over its `dp` ranks (None: a backend without the field).
    pub zero: Option<Spanned<Zero>>,
    /// The embedded trainer's gradient bytes per all-reduce bucket.
    pub dp_bucket: Option<Spanned<u64>>,
    /// The embedded trainer's seconds a collective or the ranks' rendezvous may take.
    pub collective_timeout: Option<Spanned<u64>>,
}

/// What ZeRO shards over data-parallel ranks (std/prelude `Zero`; the field's `none` is `None`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Zero {
    /// Nothing: every rank holds the whole optimizer state.
    None,
    /// ZeRO-1: each rank holds the optimizer state of its share of the parameters.
    Optimizer,
}

impl BackendJob {
    fn of(r: &Record) -> BackendJob {
        BackendJob {
            schema: r.schema_name.clone(),
            precision: precision(r),
            gpus: r.u64("gpus"),
            first_gpu: r.u64("first_gpu"),
            tp: r.u64("tp"),
            pp: r.u64("pp"),
            cp: r.u64("cp"),
            ep: r.u64("ep"),
            dp: r.u64("dp"),
            micro_batch: r.u64("micro_batch"),
            recompute: r.member("recompute").map(|m| m.map(str::to_string)),
            // `zero: Zero? = none`: present as `none` on the embedded trainer, absent elsewhere.
            zero: r.value("zero").map(|v| Spanned {
                value: match v.as_enum() {
                    Some("optimizer") => Zero::Optimizer,
                    _ => Zero::None,
                },
                span: r.set_span("zero"),
            }),
            dp_bucket: r.u64("dp_bucket"),
            collective_timeout: r.u64("collective_timeout"),
        }
    }
    /// The embedded trainer's data-parallel ranks when more than one (each a worker process).
    pub fn embedded_ranks(&self) -> Option<Spanned<u64>> {
        self.dp.filter(|d| self.schema == "embedded_trainer" && d.value > 1)
    }
    /// A GPU trainer the planner places (`megatron`, `fsdp`).
    pub fn on_gpus(&self) -> bool {
        matches!(self.schema.as_str(), "megatron" | "fsdp")
    }
}

/// The trainer's `optimizer = adam { ... }`.
#[derive(Clone, Debug, PartialEq)]
pub struct OptimizerJob {
    pub weight_decay: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub warmup: u64,
    /// `constant`, `linear`, `cosine`.
    pub decay: Option<String>,
    /// Where the optimizer state lives: `on_gpu`, `cpu`, `stream_from_disk`.
    pub state: Option<Spanned<String>>,
}

impl OptimizerJob {
    fn of(r: &Record) -> OptimizerJob {
        let real = |name: &str, default: f64| r.f64(name).map_or(default, |v| v.value);
        OptimizerJob {
            weight_decay: real("weight_decay", 0.0),
            beta1: real("beta1", 0.9),
            beta2: real("beta2", 0.999),
            eps: real("eps", 1e-8),
            warmup: r.u64("warmup").map_or(0, |v| v.value),
            decay: r.member("decay").map(|d| d.value.to_string()),
            state: r.member("state").map(|m| m.map(str::to_string)),
        }
    }
}

/// `lora { rank, alpha, dropout, target_modules, adapters, named, init }` (std/prelude's record,
/// every field filled).
#[derive(Clone, Debug, PartialEq)]
pub struct LoraJob {
    /// Where the trainer's `lora` is set.
    pub span: Option<Span>,
    pub rank: Spanned<u64>,
    pub alpha: f64,
    pub dropout: f64,
    /// Module names in the recipe's order (`q_proj`, ...).
    pub target_modules: Vec<String>,
    pub adapters: Spanned<u64>,
    /// The multi-LoRA adapters' records (`adapter { name, prompts, lr, partial_credit }`).
    pub named: Vec<Record>,
    /// The PEFT adapter directory training starts from (`init`; `miles check` read it and
    /// checked it fits); none: fresh adapters.
    pub init: Option<Spanned<String>>,
}

impl LoraJob {
    fn of(r: &Record, span: Option<Span>) -> LoraJob {
        LoraJob {
            span,
            rank: r.u64("rank").unwrap_or(Spanned::new(1)),
            alpha: r.f64("alpha").map_or(0.0, |v| v.value),
            dropout: r.f64("dropout").map_or(0.0, |v| v.value),
            target_modules: r.list("target_modules").iter().filter_map(Value::as_enum).map(str::to_string).collect(),
            adapters: r.u64("adapters").unwrap_or(Spanned::new(1)),
            named: r.list("named").iter().filter_map(Value::as_record).cloned().collect(),
            init: r.str("init").map(|d| Spanned { value: d.to_string(), span: r.set_span("init") }),
        }
    }
}

/// A `ppo` trainer's critic and GAE.
#[derive(Clone, Debug, PartialEq)]
pub struct PpoJob {
    pub critic_lr: f64,
    pub gamma: f64,
    pub lambda: f64,
    pub value_clip: f64,
    pub rollout_logprobs: bool,
}

/// `opd = opd { teacher, coef, task_coef }`: distillation from a `teacher_logprobs` stage.
#[derive(Clone, Debug, PartialEq)]
pub struct OpdJob {
    /// The teacher stage's name (None: the field names no stage).
    pub teacher: Option<String>,
    pub coef: f64,
    pub task_coef: f64,
}

/// `overlong { cache, max, penalty }`: DAPO's soft overlong punishment.
#[derive(Clone, Debug, PartialEq)]
pub struct OverlongJob {
    pub cache: u64,
    /// None: the rollout's `max_new_tokens`.
    pub max: Option<u64>,
    pub penalty: f64,
}

/// A training stage (`grpo`, `ppo`, `sft`, a user kind with a Policy output).
#[derive(Clone, Debug, PartialEq)]
pub struct TrainJob {
    /// The rollout it trains on and the reward that scores it (stage names).
    pub rollout: Option<String>,
    pub reward: Option<String>,
    pub backend: Option<BackendJob>,
    pub optimizer: Option<OptimizerJob>,
    pub rollout_batch: Option<Spanned<u64>>,
    pub global_batch: Option<Spanned<u64>>,
    pub steps_per_rollout: Option<Spanned<u64>>,
    pub micro_batch: Option<Spanned<u64>>,
    /// An SFT stage's batch (and its steps, learning rate and warm-up below).
    pub batch: Option<Spanned<u64>>,
    pub steps: u64,
    pub warmup: u64,
    pub lr: Option<f64>,
    pub clip_low: f64,
    pub clip_high: f64,
    pub kl_coef: f64,
    pub tis: Option<f64>,
    pub entropy_coef: f64,
    pub std_norm: bool,
    /// `token`, `sequence`, `micro_token` or `constant`.
    pub aggregation: Option<String>,
    /// `token` or `sequence` (GSPO).
    pub ratio: Option<String>,
    /// `grpo`, `rloo` or `reinforce_pp`.
    pub advantage: Option<String>,
    /// Passes over each rollout batch.
    pub epochs: Spanned<u64>,
    /// `mis { low, high }`.
    pub mis: Option<(f64, f64)>,
    pub overlong: Option<OverlongJob>,
    pub grad_clip: f64,
    pub lora: Option<LoraJob>,
    pub ppo: Option<PpoJob>,
    pub opd: Option<OpdJob>,
}

impl TrainJob {
    fn of(g: &StageGraph, node: &StageNode) -> TrainJob {
        let real = |name: &str| node.f64(name).map_or(0.0, |v| v.value);
        let on = |name: &str| node.bool(name).is_some_and(|b| b.value);
        TrainJob {
            rollout: upstream(g, node, PortKind::Trajectories).map(|n| n.name.clone()),
            reward: upstream(g, node, PortKind::Scores).map(|n| n.name.clone()),
            backend: node.record("backend").map(BackendJob::of),
            optimizer: node.record("optimizer").map(OptimizerJob::of),
            rollout_batch: node.u64("rollout_batch"),
            global_batch: node.u64("global_batch"),
            steps_per_rollout: node.u64("steps_per_rollout"),
            micro_batch: node.u64("micro_batch"),
            batch: node.u64("batch"),
            steps: node.u64("steps").map_or(0, |v| v.value),
            warmup: node.u64("warmup").map_or(0, |v| v.value),
            lr: node.f64("lr").map(|v| v.value),
            clip_low: real("clip_low"),
            clip_high: real("clip_high"),
            kl_coef: real("kl_coef"),
            tis: node.f64("tis").map(|v| v.value),
            entropy_coef: real("entropy_coef"),
            std_norm: on("std_norm"),
            aggregation: node.member("aggregation").map(|a| a.value.to_string()),
            ratio: node.member("ratio").map(|a| a.value.to_string()),
            advantage: node.member("advantage").map(|a| a.value.to_string()),
            epochs: node.u64("epochs").unwrap_or(Spanned::new(1)),
            mis: node
                .record("mis")
                .map(|r| (r.f64("low").map_or(0.5, |v| v.value), r.f64("high").map_or(2.0, |v| v.value))),
            overlong: node.record("overlong").map(|r| OverlongJob {
                cache: r.u64("cache").map_or(0, |v| v.value),
                max: r.u64("max").map(|v| v.value),
                penalty: r.f64("penalty").map_or(1.0, |v| v.value),
            }),
            grad_clip: real("grad_clip"),
            lora: node.record("lora").map(|r| LoraJob::of(r, node.set_span("lora"))),
            ppo: (node.kind == "ppo").then(|| PpoJob {
                critic_lr: real("critic_lr"),
                gamma: real("gamma"),
                lambda: real("lambda"),
                value_clip: real("value_clip"),
                rollout_logprobs: on("rollout_logprobs"),
            }),
            opd: node.record("opd").map(|o| OpdJob {
                teacher: stage_named(g, o.get("teacher")).map(|t| t.name.clone()),
                coef: o.f64("coef").map_or(1.0, |v| v.value),
                task_coef: o.f64("task_coef").map_or(1.0, |v| v.value),
            }),
        }
    }
}

/// A `teacher_logprobs` stage: where the teacher runs.
#[derive(Clone, Debug, PartialEq)]
pub struct TeacherJob {
    /// GPUs of its own (planned apart); None: beside the trainer.
    pub gpus: Option<Spanned<u64>>,
    /// A child process of the run (or a worker), rather than in the trainer's process.
    pub process: bool,
}

/// One stage of the recipe (weight syncs are `SyncJob`s).
#[derive(Clone, Debug, PartialEq)]
pub struct StageJob {
    pub name: String,
    pub kind: String,
    pub role: Role,
    pub name_span: Span,
    /// The model it runs (`StageNode::model`), read once.
    pub model: Option<ModelJob>,
    pub rollout: Option<RolloutJob>,
    pub train: Option<TrainJob>,
    pub teacher: Option<TeacherJob>,
    pub eval: Option<EvalJob>,
    /// An `env_reward` stage's episodes.
    pub episodes: Option<EpisodesJob>,
    /// Models given in the stage's fields (a user kind's `teacher = ...`), in field order.
    pub field_models: Vec<ModelJob>,
}

/// An `env_reward` stage: the environment and the episode limits.
#[derive(Clone, Debug, PartialEq)]
pub struct EpisodesJob {
    /// The `env` record (`calculator`, `command_env`, `openenv`); its schema-specific fields are
    /// the run's to read.
    pub env: Option<Record>,
    /// The rollout that plays the episodes.
    pub rollout: Option<String>,
    /// A `calculator` environment's operand digits (its observations' length depends on them).
    pub calculator_digits: Option<u64>,
    pub max_turns: Spanned<u64>,
    /// `compact { keep_turns }`: turns kept whole when a context is compacted.
    pub compact_keep_turns: Option<u64>,
    /// A planning assumption (read by `miles plan` only).
    pub mean_turns: Option<Spanned<f64>>,
    /// Tokens of one observation between turns, a planning assumption (`None`: the planner's
    /// derivation or default).
    pub observation_tokens: Option<Spanned<u64>>,
    /// The reward at or above which an episode counts as solved (eval and `rollout/solved_frac`).
    pub solved_at: Spanned<f64>,
    /// What the first turn shows of a chat row (`append`, `replace`, `observation_only`).
    pub prompt: String,
}

impl EpisodesJob {
    fn of(g: &StageGraph, n: &StageNode) -> EpisodesJob {
        EpisodesJob {
            env: n.record("env").cloned(),
            rollout: upstream(g, n, PortKind::Trajectories).map(|r| r.name.clone()),
            calculator_digits: n
                .record("env")
                .filter(|e| e.schema_name == "calculator")
                .and_then(|e| e.u64("digits"))
                .map(|d| d.value),
            max_turns: n.u64("max_turns").unwrap_or(Spanned::new(4)),
            compact_keep_turns: n.record("compact").map(|c| c.u64("keep_turns").map_or(1, |k| k.value)),
            mean_turns: n.f64("mean_turns").filter(|v| v.value.is_finite()),
            observation_tokens: n.u64("observation_tokens"),
            solved_at: n.f64("solved_at").filter(|v| v.value.is_finite()).unwrap_or(Spanned::new(1.0)),
            prompt: n.member("prompt").map_or("append", |m| m.value).to_string(),
        }
    }
}

/// An `evaluate` stage: held-out evaluation every few steps.
#[derive(Clone, Debug, PartialEq)]
pub struct EvalJob {
    pub every: u64,
    /// Prompts per evaluation.
    pub limit: Option<i64>,
    /// `shared`, `snapshot`, `external`.
    pub mode: Option<String>,
    /// An external evaluation's command.
    pub command: Option<String>,
}

impl StageJob {
    pub(super) fn of(g: &StageGraph, node: &StageNode) -> StageJob {
        let role = Role::of(node);
        StageJob {
            name: node.name.clone(),
            kind: node.kind.clone(),
            role,
            name_span: node.name_span,
            model: node.model.as_deref().map(ModelJob::of),
            rollout: matches!(role, Role::Rollout | Role::Eval).then(|| RolloutJob::of(g, node)),
            train: role.trains().then(|| TrainJob::of(g, node)),
            teacher: (node.kind == "teacher_logprobs")
                .then(|| TeacherJob { gpus: node.u64("gpus"), process: node.bool("process").is_some_and(|b| b.value) }),
            eval: (node.kind == "evaluate").then(|| EvalJob {
                every: node.u64("every").map_or(0, |v| v.value),
                limit: node.value("limit").and_then(Value::as_i64),
                mode: node.member("mode").map(|m| m.value.to_string()),
                command: node.str("command").map(str::to_string),
            }),
            episodes: (node.kind == "env_reward").then(|| EpisodesJob::of(g, node)),
            field_models: node
                .params
                .values()
                .filter_map(|p| p.value.as_record().map(ModelJob::of))
                .filter(|m| !matches!(m, ModelJob::Other { .. }))
                .collect(),
        }
    }
}

/// A `weights(train -> rollout)` stage.
#[derive(Clone, Debug, PartialEq)]
pub struct SyncJob {
    pub name: String,
    pub name_span: Span,
    pub from: String,
    pub to: String,
    /// `broadcast`, `p2p`, `disk_delta`, `local`.
    pub transport: Spanned<String>,
    /// `auto`, `tcp`, `shm`, `nccl`.
    pub channel: String,
    pub bucket: Spanned<u64>,
    pub verify_full: bool,
}

impl SyncJob {
    pub(super) fn of(node: &StageNode) -> SyncJob {
        let name_of = |port: &str| match node.inputs.get(port) {
            Some(Value::Stage(n)) => n.clone(),
            _ => String::new(),
        };
        SyncJob {
            name: node.name.clone(),
            name_span: node.name_span,
            from: name_of("train"),
            to: name_of("rollout"),
            transport: node.member("transport").map_or(Spanned::new("broadcast".into()), |t| t.map(str::to_string)),
            channel: node.member("channel").map_or("auto", |c| c.value).to_string(),
            bucket: node.u64("bucket").unwrap_or(Spanned::new(512_000_000)),
            verify_full: node.bool("verify_full").is_some_and(|b| b.value),
        }
    }
}

/// The recipe's `schedule` (std/prelude: `sync`, `one_step_off`, `fully_async`).
#[derive(Clone, Debug, PartialEq)]
pub struct ScheduleJob {
    /// The schedule's schema name, with its span when the recipe set it.
    pub mode: Spanned<String>,
    pub max_staleness: Option<Spanned<u64>>,
    pub max_concurrent: Option<Spanned<u64>>,
    pub buffer_capacity: Option<Spanned<u64>>,
    pub update_interval: Option<u64>,
    pub starvation_retries: Option<u64>,
    pub refill: Option<String>,
    pub pause: Option<String>,
    pub on_stale: Option<String>,
    pub on_abort: Option<String>,
    pub filter: Option<String>,
    /// `sync`'s generation rounds per step at most (dynamic sampling).
    pub max_rounds: Option<u64>,
    pub staleness_gate: Option<bool>,
    pub stall_timeout_s: Option<f64>,
}

impl ScheduleJob {
    pub(super) fn of(r: &Record, span: Option<Span>) -> ScheduleJob {
        let member = |name: &str| r.member(name).map(|m| m.value.to_string());
        let count = |name: &str| r.u64(name).map(|v| v.value);
        ScheduleJob {
            mode: Spanned { value: r.schema_name.clone(), span },
            max_staleness: r.u64("max_staleness"),
            max_concurrent: r.u64("max_concurrent"),
            buffer_capacity: r.u64("buffer_capacity"),
            update_interval: count("update_interval"),
            starvation_retries: count("starvation_retries"),
            refill: member("refill"),
            pause: member("pause"),
            on_stale: member("on_stale"),
            on_abort: member("on_abort"),
            filter: member("filter"),
            max_rounds: count("max_rounds"),
            staleness_gate: r.bool("staleness_gate").map(|b| b.value),
            stall_timeout_s: r.f64("stall_timeout").map(|v| v.value),
        }
    }
    /// DAPO's dynamic sampling, `sync { filter = drop_flat }`: its generation rounds per step at
    /// most (the stdlib's default when unset); None without it. Plan and run both read this.
    pub fn dynamic_rounds(&self) -> Option<u64> {
        (self.mode.value == "sync" && self.filter.as_deref() == Some("drop_flat"))
            .then(|| self.max_rounds.unwrap_or(4).max(1))
    }
    /// The default schedule, for settings without one.
    pub fn sync() -> ScheduleJob {
        ScheduleJob {
            mode: Spanned::new("sync".to_string()),
            max_staleness: None,
            max_concurrent: None,
            buffer_capacity: None,
            update_interval: None,
            starvation_retries: None,
            refill: None,
            pause: None,
            on_stale: None,
            on_abort: None,
            filter: None,
            max_rounds: None,
            staleness_gate: None,
            stall_timeout_s: None,
        }
    }
}
