//! From a compiled recipe to the embedded backend's `RunSpec`. What the embedded backend cannot
//! do is reported as E0511 at the line that asks for it, all at once.

use miles_compiler::graph::{StageGraph, StageNode};
use miles_compiler::value::{PortKind, Record, Value};
use miles_compiler::{CompiledRecipe, Diagnostic, Span};
use miles_runtime::reward::RewardSpec;
use miles_runtime::routing::RouteId;
use miles_runtime::spec::*;

pub mod diffusion;

/// What `miles run` hands the engine: a language-model run or a diffusion run.
#[derive(serde::Serialize)]
#[serde(untagged)]
pub enum Job {
    Lm(Box<RunSpec>),
    Diffusion(Box<miles_runtime::diffusion::DiffusionRunSpec>),
}

/// The run a compiled recipe maps onto: a diffusion run when it samples with `denoise`.
pub fn job(recipe: &CompiledRecipe) -> Result<Job, Vec<Diagnostic>> {
    if diffusion::is_diffusion(recipe) {
        diffusion::diffusion_spec(recipe).map(|s| Job::Diffusion(Box::new(s)))
    } else {
        run_spec(recipe).map(|s| Job::Lm(Box::new(s)))
    }
}

struct Mapper<'r> {
    g: &'r StageGraph,
    diags: Vec<Diagnostic>,
}

fn param_span(node: &StageNode, name: &str) -> Span {
    node.params.get(name).map(|p| p.span).unwrap_or(node.name_span)
}

impl<'r> Mapper<'r> {
    fn unsupported(&mut self, span: Span, what: String, help: &str) {
        self.diags.push(
            Diagnostic::error("E0511", format!("the embedded backend cannot run {what}"))
                .with_primary(span, "not supported by `miles run` on this machine")
                .with_help(help.to_string()),
        );
    }

    fn u64(&self, node: &StageNode, name: &str) -> u64 {
        node.param(name).and_then(Value::as_q).map(|q| q.to_f64().max(0.0).round() as u64).unwrap_or(0)
    }
    fn f64(&self, node: &StageNode, name: &str) -> f64 {
        node.param(name).and_then(Value::as_f64).unwrap_or(0.0)
    }
    fn bool(&self, node: &StageNode, name: &str) -> bool {
        node.param(name).and_then(Value::as_bool).unwrap_or(false)
    }
    fn record<'n>(&self, node: &'n StageNode, name: &str) -> Option<&'n Record> {
        node.param(name).and_then(Value::as_record)
    }
    fn stage_by_kind(&self, pred: impl Fn(&StageNode) -> bool) -> Vec<&'r StageNode> {
        self.g.nodes().filter(|n| pred(n)).collect()
    }
    /// The first stage of `kind`, in graph order.
    fn first_of_kind(&self, kind: &str) -> Option<&'r StageNode> {
        self.g.nodes().find(|n| n.kind == kind)
    }
    fn upstream(&self, node: &StageNode, port: PortKind) -> Option<&'r StageNode> {
        node.inputs.values().find_map(|v| match v {
            Value::Stage(n) => self.g.node(n).filter(|up| up.output == Some(port)),
            _ => None,
        })
    }
    /// The trainer's distillation: its `opd` record and the `teacher_logprobs` stage it names. A
    /// teacher stage no trainer reads is refused (E0511), never run for nothing.
    fn opd_spec(&mut self, train: &StageNode) -> Option<OpdSpec> {
        let o = self.record(train, "opd");
        let read = o.and_then(|o| match o.get("teacher") {
            Some(Value::Stage(n)) => self.g.node(n),
            _ => None,
        });
        for t in self.stage_by_kind(|n| n.kind == "teacher_logprobs") {
            if read.is_none_or(|r| r.name != t.name) {
                self.unsupported(
                    t.name_span,
                    format!("a teacher stage no trainer reads (`{}`)", t.name),
                    "name it in the trainer's distillation: train.opd = opd { teacher = ... }, or remove it",
                );
            }
        }
        let (o, teacher) = (o?, read?);
        Some(OpdSpec {
            stage: teacher.name.clone(),
            teacher: teacher.model.as_deref().map(|t| rec_str(t, "path")).unwrap_or_default().into(),
            coef: o.get("coef").and_then(Value::as_f64).unwrap_or(1.0),
            task_coef: o.get("task_coef").and_then(Value::as_f64).unwrap_or(1.0),
            process: self.bool(teacher, "process"),
        })
    }

    /// E0511 when the record in `field` of `node` (an engine, a backend) is not the embedded
    /// one, `embedded`; `what` names it in the message ("a `megatron` trainer").
    fn require_embedded(&mut self, node: &StageNode, field: &str, embedded: &str, what: &str) {
        let Some(r) = self.record(node, field).filter(|r| r.schema_name != embedded) else { return };
        let message = format!("a `{}` {what}", r.schema_name);
        let help = format!("remove `{field}` (the embedded {what} is the default) to run here");
        self.unsupported(param_span(node, field), message, &help);
    }
}

/// The sizes both model schemas (`transformer`, `hf`) name alike.
fn decoder_sizes(r: &Record) -> DecoderSizes {
    let n = |name: &str| rec_u64(r, name) as usize;
    DecoderSizes {
        vocab_size: n("vocab"),
        d_model: n("d_model"),
        n_layers: n("layers"),
        n_heads: n("heads"),
        n_kv_heads: n("kv_heads"),
        d_ff: n("d_ff"),
        max_len: n("max_len"),
    }
}

/// The task a prompt set (the rollout's `prompts`, or a multi-LoRA adapter's) names; None for a
/// prompt set the runtime does not read.
fn task_spec(prompts: Option<&Record>, partial_credit: bool) -> Option<TaskSpec> {
    let p = prompts?;
    let kind = match p.schema_name.as_str() {
        "addition" => TaskKind::Addition { digits: rec_u64(p, "digits") as u32 },
        "multiplication" => TaskKind::Multiplication { digits: rec_u64(p, "digits") as u32 },
        kind @ ("reverse" | "sort") => {
            let (min_len, max_len, alphabet) =
                (rec_u64(p, "min_len") as usize, rec_u64(p, "max_len") as usize, rec_str(p, "alphabet"));
            if kind == "reverse" {
                TaskKind::Reverse { min_len, max_len, alphabet, working: rec_u64(p, "working") as usize }
            } else {
                TaskKind::Sort { min_len, max_len, alphabet }
            }
        }
        "jsonl" | "parquet" => TaskKind::Data {
            path: rec_str(p, "path").into(),
            prompt_field: rec_str(p, "prompt_field"),
            label_field: rec_str(p, "label_field"),
            test_path: None,
            on_error: if p.get("on_error").and_then(Value::as_enum) == Some("stop") {
                OnError::Stop
            } else {
                OnError::Skip
            },
        },
        _ => return None,
    };
    let test_size = p.get("test_size").and_then(Value::as_i64).unwrap_or(200).max(1) as usize;
    let split_seed = p.get("split_seed").and_then(Value::as_i64).unwrap_or(1234).max(0) as u64;
    Some(TaskSpec { kind, split: SplitSpec { test_size, seed: split_seed }, partial_credit })
}

/// std/prelude's `lora` record (its fields all have defaults, so each is present); the `named`
/// adapters' prompts become their tasks (the capability table refused any the runtime cannot read).
fn lora_spec(r: &Record, seed: u64, partial_credit: bool) -> LoraSpec {
    let f = |name: &str| r.get(name).and_then(Value::as_f64).unwrap_or(0.0);
    let list = |name: &str| match r.get(name) {
        Some(Value::List(items)) => items.clone(),
        _ => Vec::new(),
    };
    let target_modules = list("target_modules").iter().filter_map(Value::as_enum).map(str::to_string).collect();
    let adapters = list("named")
        .iter()
        .filter_map(Value::as_record)
        .filter_map(|a| {
            Some(AdapterSpec {
                name: rec_str(a, "name"),
                task: task_spec(
                    a.get("prompts").and_then(Value::as_record),
                    a.get("partial_credit").and_then(Value::as_bool).unwrap_or(partial_credit),
                )?,
                lr: a.get("lr").and_then(Value::as_f64),
            })
        })
        .collect();
    LoraSpec {
        rank: rec_u64(r, "rank") as usize,
        alpha: f("alpha"),
        dropout: f("dropout"),
        target_modules,
        init_seed: seed,
        adapters,
    }
}

/// A `transformer`'s MoE fields; None for a dense model (`experts = 0`).
fn moe_config(r: &Record) -> Option<MoeConfig> {
    let n = |name: &str| rec_u64(r, name) as usize;
    (n("experts") > 0).then(|| MoeConfig {
        experts: n("experts"),
        top_k: n("top_k"),
        expert_d_ff: n("expert_d_ff"),
        shared_expert_d_ff: n("shared_expert_d_ff"),
        dense_layers: n("dense_layers"),
        gating: match r.get("gating").and_then(Value::as_enum) {
            Some("sigmoid") => Gating::Sigmoid,
            _ => Gating::Softmax,
        },
        norm_topk: r.get("norm_topk").and_then(Value::as_bool).unwrap_or(true),
        aux_loss_coef: r.get("aux_loss_coef").and_then(Value::as_f64).unwrap_or(0.0),
    })
}

/// The `precision` of a record of the embedded backend's `schema` (its engine or its trainer);
/// fp32 for any other record (a server by URL), whose precision is not the embedded backend's to
/// run.
fn embedded_precision(record: Option<&Record>, schema: &str) -> Precision {
    match record.filter(|e| e.schema_name == schema).and_then(|e| e.get("precision")).and_then(Value::as_enum) {
        Some("bf16") => Precision::Bf16,
        _ => Precision::Fp32,
    }
}

/// R3 from the rollout's `record_routing`, `routing_replay` and `routing_dtype`; None when the
/// engine records no routing. The id type defaults to the smallest that holds the expert count.
fn r3_spec(rollout: &StageNode) -> Option<R3Spec> {
    let flag = |name: &str| rollout.param(name).and_then(Value::as_bool).unwrap_or(false);
    if !flag("record_routing") {
        return None;
    }
    let experts = rollout.model.as_deref().map_or(0, |r| rec_u64(r, "experts"));
    let id = match rollout.param("routing_dtype").and_then(Value::as_enum) {
        Some("u8") => RouteId::U8,
        Some("u16") => RouteId::U16,
        Some("i32") => RouteId::I32,
        _ => RouteId::smallest_for(experts as usize),
    };
    Some(R3Spec { replay: flag("routing_replay"), id })
}

fn rec_u64(r: &Record, name: &str) -> u64 {
    r.get(name).and_then(Value::as_q).map(|q| q.to_f64().max(0.0).round() as u64).unwrap_or(0)
}
fn rec_str(r: &Record, name: &str) -> String {
    r.get(name).and_then(|v| v.as_str()).unwrap_or_default().to_string()
}

/// The recipe's `seed` and `stop` (training steps) settings.
fn seed_and_stop(recipe: &CompiledRecipe) -> (u64, u64) {
    let settings = recipe.settings.as_record();
    let seed = settings.and_then(|s| s.get("seed")).and_then(Value::as_i64).unwrap_or(0).max(0) as u64;
    let stop =
        settings.and_then(|s| s.get("stop")).and_then(Value::as_q).map(|q| q.to_f64().round() as u64).unwrap_or(0);
    (seed, stop)
}

/// The `local` cluster's `device` (a spec without one computes on the CPU).
pub fn device_of(recipe: &CompiledRecipe) -> DeviceSpec {
    recipe
        .settings
        .as_record()
        .and_then(|s| s.get("cluster"))
        .and_then(Value::as_record)
        .filter(|c| c.schema_name == "local")
        .and_then(|c| c.get("device"))
        .and_then(Value::as_enum)
        .and_then(DeviceSpec::parse)
        .unwrap_or_default()
}

pub fn run_spec(recipe: &CompiledRecipe) -> Result<RunSpec, Vec<Diagnostic>> {
    let mut m = Mapper { g: &recipe.graph, diags: Vec::new() };
    let settings = recipe.settings.as_record();
    let (seed, steps) = seed_and_stop(recipe);
    let schedule =
        settings.and_then(|s| s.get("schedule")).and_then(Value::as_record).map(schedule_spec).unwrap_or_default();

    // Exactly one rollout and one trainer.
    let rollouts = m.stage_by_kind(|n| n.kind == "generate");
    let trainers = m.stage_by_kind(|n| n.output == Some(PortKind::Policy) && n.kind != "sft");
    let (Some(rollout), Some(train)) = (rollouts.first().copied(), trainers.first().copied()) else {
        let d = Diagnostic::error(
            "E0511",
            "the embedded backend runs a recipe with a `generate` rollout and a `grpo` trainer",
        )
        .with_primary(
            recipe.graph.nodes().next().map(|n| n.name_span).unwrap_or(recipe.span),
            "this recipe has no rollout and trainer pair",
        )
        .with_help("add `rollout = generate(...)`, a reward and `train = grpo(rollout, reward)`");
        return Err(vec![d]);
    };
    for extra in rollouts.iter().skip(1).chain(trainers.iter().skip(1)) {
        m.unsupported(
            extra.name_span,
            format!("a second `{}` stage", extra.kind),
            "the embedded backend runs one rollout and one trainer",
        );
    }
    for node in recipe.graph.nodes() {
        match node.kind.as_str() {
            "generate" | "grpo" | "ppo" | "sft" | "weights" | "evaluate" | "checkpoint" | "exact_match" | "verify"
            | "command_reward" | "http_reward" | "env_reward" | "teacher_logprobs" => {}
            other => m.unsupported(
                node.name_span,
                format!("a `{other}` stage"),
                "the embedded backend runs sft, generate, exact_match, verify, command_reward, http_reward, env_reward, \
                 teacher_logprobs, grpo, weights, evaluate and checkpoint",
            ),
        }
    }
    // An SGLang-compatible server fleet given by URL serves the rollout (the trainer stays here).
    let engine_urls: Vec<String> = m
        .record(rollout, "engine")
        .filter(|e| e.schema_name == "sglang")
        .and_then(|e| e.get("url"))
        .and_then(|u| u.as_str())
        .map(|u| u.split(',').map(|x| x.trim().to_string()).filter(|x| !x.is_empty()).collect())
        .unwrap_or_default();
    if engine_urls.is_empty() {
        m.require_embedded(rollout, "engine", "embedded_engine", "engine");
    }
    m.require_embedded(train, "backend", "embedded_trainer", "trainer");

    // The model: a seeded `transformer`, or a Hugging Face directory whose config.json `miles
    // check` read (the `hf` schema's fields and its `config` map).
    let mut hf = None;
    let model = match rollout.model.as_deref() {
        Some(r) if r.schema_name == "hf" => {
            let config = r.get("config");
            let flag = |name: &str| match config {
                Some(Value::Map(m)) => m.get(name).and_then(Value::as_bool).unwrap_or(false),
                _ => false,
            };
            let rope_theta = match config {
                Some(Value::Map(m)) => m.get("rope_theta").and_then(Value::as_f64).unwrap_or(10000.0),
                _ => 10000.0,
            };
            hf = Some(HfModelSpec { path: rec_str(r, "path").into() });
            ModelConfig {
                rope_theta,
                norm_eps: 1e-6,
                head_dim: Some(rec_u64(r, "head_dim") as usize),
                qkv_bias: flag("qkv_bias"),
                o_bias: flag("o_bias"),
                qk_norm: flag("qk_norm"),
                tie_embeddings: flag("tie_embeddings"),
                ..ModelConfig::decoder(decoder_sizes(r))
            }
        }
        Some(r) if r.schema_name == "transformer" => {
            ModelConfig { moe: moe_config(r), ..ModelConfig::decoder(decoder_sizes(r)) }
        }
        other => {
            let span = other.map(|r| r.span).unwrap_or(rollout.name_span);
            m.unsupported(
                span,
                format!("a `{}` model", other.map(|r| r.schema_name.as_str()).unwrap_or("unknown")),
                "the embedded backend trains a `transformer { ... }` from a seed",
            );
            return Err(m.diags);
        }
    };

    // The task, from the rollout's prompts.
    let prompts = m.record(rollout, "prompts").cloned();
    let partial_credit = m.upstream_reward(train);
    let Some(task) = task_spec(prompts.as_ref(), partial_credit) else {
        m.unsupported(
            param_span(rollout, "prompts"),
            format!("prompts from `{}`", prompts.as_ref().map_or("?", |p| p.schema_name.as_str())),
            "use a built-in task (std/tasks/arith, std/tasks/strings), `jsonl { ... }` or `parquet { ... }`",
        );
        return Err(m.diags);
    };
    let scores = m.upstream(train, PortKind::Scores);
    let reward = scores.and_then(|r| reward_spec(&mut m, r));
    let env = scores.filter(|r| r.kind == "env_reward").and_then(|r| env_spec(r, rollout));

    // SFT warm-up: an sft stage feeding the rollout's policy.
    let sft = m.first_of_kind("sft").map(|s| {
        let (steps, lr, batch, warmup) = (
            rec_steps(s, "steps"),
            s.param("lr").and_then(Value::as_f64).unwrap_or(1e-3),
            s.param("batch").and_then(Value::as_i64).unwrap_or(32).max(1) as usize,
            rec_steps(s, "warmup"),
        );
        SftSpec { steps, lr, batch, warmup_steps: warmup }
    });

    let rollout_batch = m.u64(train, "rollout_batch") as usize;
    let rollout_spec = RolloutSpec {
        rollout_batch,
        samples_per_prompt: m.u64(rollout, "samples_per_prompt") as usize,
        max_new_tokens: m.u64(rollout, "max_new_tokens") as usize,
        temperature: m.f64(rollout, "temperature"),
        top_p: m.f64(rollout, "top_p"),
        top_k: m.u64(rollout, "top_k") as usize,
        max_prompt_tokens: Some(m.u64(rollout, "max_prompt_tokens") as usize).filter(|n| *n > 0),
        precision: embedded_precision(m.record(rollout, "engine"), "embedded_engine"),
        r3: r3_spec(rollout),
        batch_invariant: m.bool(rollout, "batch_invariant"),
    };
    let opt = m.record(train, "optimizer").cloned();
    let o =
        |name: &str, default: f64| opt.as_ref().and_then(|r| r.get(name)).and_then(Value::as_f64).unwrap_or(default);
    let decay = match opt.as_ref().and_then(|r| r.get("decay")).and_then(Value::as_enum) {
        Some("linear") => Decay::Linear,
        Some("cosine") => Decay::Cosine,
        _ => Decay::None,
    };
    let warmup_steps = opt.as_ref().map(|r| rec_u64(r, "warmup")).unwrap_or(0);
    let train_spec = TrainSpec {
        lr: m.f64(train, "lr"),
        weight_decay: o("weight_decay", 0.0),
        beta1: o("beta1", 0.9),
        beta2: o("beta2", 0.999),
        eps: o("eps", 1e-8),
        warmup_steps,
        decay,
        min_lr_ratio: 0.0,
        clip_low: m.f64(train, "clip_low"),
        clip_high: m.f64(train, "clip_high"),
        kl_coef: m.f64(train, "kl_coef"),
        tis_cap: train.param("tis").and_then(Value::as_f64),
        entropy_coef: m.f64(train, "entropy_coef"),
        std_norm: m.bool(train, "std_norm"),
        aggregation: if train.param("aggregation").and_then(Value::as_enum) == Some("sequence") {
            Aggregation::Sequence
        } else {
            Aggregation::Token
        },
        grad_clip: m.f64(train, "grad_clip"),
        micro_batch: m.u64(train, "micro_batch") as usize,
        global_batch: m.u64(train, "global_batch") as usize,
        lora: m.record(train, "lora").map(|r| lora_spec(r, seed, partial_credit)),
        opd: m.opd_spec(train),
        precision: embedded_precision(m.record(train, "backend"), "embedded_trainer"),
        ppo: (train.kind == "ppo").then(|| PpoSpec {
            critic_lr: m.f64(train, "critic_lr"),
            gamma: m.f64(train, "gamma"),
            lambda: m.f64(train, "lambda"),
            value_clip: m.f64(train, "value_clip"),
            rollout_logprobs: m.bool(train, "rollout_logprobs"),
        }),
    };
    let eval = m
        .first_of_kind("evaluate")
        .map(|e| EvalSpec {
            every: rec_steps(e, "every"),
            prompts: e.param("limit").and_then(Value::as_i64).unwrap_or(200).max(1) as usize,
            mode: match e.param("mode").and_then(Value::as_enum) {
                Some("snapshot") => EvalMode::Snapshot,
                Some("external") => EvalMode::External,
                _ => EvalMode::Shared,
            },
            command: e.param("command").and_then(|v| v.as_str()).map(str::to_string),
        })
        .unwrap_or_default();
    let checkpoint = m
        .first_of_kind("checkpoint")
        .map(|c| CheckpointSpec {
            every: rec_steps(c, "every"),
            keep: c.param("keep").and_then(Value::as_i64).unwrap_or(2).max(1) as usize,
        })
        .unwrap_or_default();
    let sync = m.first_of_kind("weights");
    let mut distributed =
        settings.and_then(|s| s.get("launcher")).and_then(Value::as_record).and_then(|l| distributed_spec(l, sync));
    if !engine_urls.is_empty() {
        if distributed.is_some() {
            m.unsupported(
                param_span(rollout, "engine"),
                "rollout servers given by URL together with a launcher".into(),
                "with `engine = sglang { url = ... }` the trainer runs in `miles run`; remove `launcher`",
            );
        }
        distributed = Some(miles_runtime::distributed::DistributedSpec {
            launcher: miles_runtime::distributed::LauncherSpec::InProcess,
            rollout_workers: engine_urls.len(),
            transport: "disk".into(),
            channel: "auto".into(),
            bucket_bytes: 0,
            verify_full: false,
            on_worker_failure: Default::default(),
            call_timeout_s: 600.0,
            start_timeout_s: 0.0,
            heartbeat_timeout_s: 0.0,
            bind_host: "127.0.0.1".into(),
            threads: 0,
            engine_urls,
        });
    }
    if !m.diags.is_empty() {
        return Err(m.diags);
    }
    Ok(RunSpec {
        seed,
        steps,
        model,
        task,
        hf,
        reward,
        env,
        sft,
        rollout: rollout_spec,
        train: train_spec,
        eval,
        checkpoint,
        distributed,
        schedule,
        device: device_of(recipe),
        stages: StageNames {
            rollout: rollout.name.clone(),
            train: train.name.clone(),
            eval: m.first_of_kind("evaluate").map_or_else(|| "eval".into(), |e| e.name.clone()),
        },
    })
}

/// The recipe's `schedule` setting (std/prelude: sync, one_step_off, fully_async).
fn schedule_spec(r: &Record) -> ScheduleSpec {
    match r.schema_name.as_str() {
        "one_step_off" => ScheduleSpec::OneStepOff,
        "fully_async" => {
            let d = AsyncSpec::default();
            let int =
                |name: &str, default: u64| r.get(name).and_then(Value::as_i64).map_or(default, |v| v.max(0) as u64);
            let action = |name: &str| match r.get(name).and_then(Value::as_enum) {
                Some("discard") => DropAction::Discard,
                _ => DropAction::Retry,
            };
            ScheduleSpec::FullyAsync(AsyncSpec {
                max_staleness: int("max_staleness", d.max_staleness),
                max_concurrent: int("max_concurrent", d.max_concurrent as u64) as usize,
                refill: match r.get("refill").and_then(Value::as_enum) {
                    Some("per_group") => Refill::PerGroup,
                    _ => Refill::PerSample,
                },
                buffer_capacity: int("buffer_capacity", d.buffer_capacity as u64) as usize,
                update_interval: int("update_interval", d.update_interval),
                pause: match r.get("pause").and_then(Value::as_enum) {
                    Some("retract") => PauseMode::Retract,
                    Some("abort") => PauseMode::Abort,
                    _ => PauseMode::InPlace,
                },
                on_stale: action("on_stale"),
                on_abort: action("on_abort"),
                starvation_retries: int("starvation_retries", d.starvation_retries as u64) as u32,
                filter: match r.get("filter").and_then(Value::as_enum) {
                    Some("drop_flat") => GroupFilter::DropFlat,
                    _ => GroupFilter::KeepAll,
                },
                staleness_gate: r.get("staleness_gate").and_then(Value::as_bool).unwrap_or(d.staleness_gate),
                stall_timeout_s: r.get("stall_timeout").and_then(Value::as_f64).unwrap_or(d.stall_timeout_s),
            })
        }
        _ => ScheduleSpec::Sync,
    }
}

fn rec_steps(node: &StageNode, name: &str) -> u64 {
    node.param(name).and_then(Value::as_q).map(|q| q.to_f64().max(0.0).round() as u64).unwrap_or(0)
}

impl Mapper<'_> {
    /// Partial credit, from the reward stage feeding the trainer.
    fn upstream_reward(&self, train: &StageNode) -> bool {
        self.upstream(train, PortKind::Scores)
            .and_then(|r| r.param("partial_credit"))
            .and_then(Value::as_bool)
            .unwrap_or(false)
    }
}

/// The reward stage feeding the trainer, as the run spec carries it (None: the task's exact match).
fn reward_spec(m: &mut Mapper, r: &StageNode) -> Option<RewardSpec> {
    use miles_runtime::reward::OnRewardError;
    let on_error = match r.param("on_error").and_then(Value::as_enum) {
        Some("drop") => OnRewardError::Drop,
        Some("zero") => OnRewardError::Zero,
        _ => OnRewardError::Stop,
    };
    let timeout_s = r.param("timeout").and_then(Value::as_q).map(|q| q.to_f64()).unwrap_or(60.0);
    let text = |name: &str| r.param(name).and_then(|v| v.as_str()).map(str::to_string);
    let name = r.name.clone();
    match r.kind.as_str() {
        "verify" => {
            let schema = match text("schema_text") {
                None => None,
                Some(t) => match serde_json::from_str(&t) {
                    Ok(v) => Some(v),
                    Err(e) => {
                        let span = param_span(r, "schema_text");
                        m.diags.push(
                            Diagnostic::error("E0511", format!("`schema_text` is not valid JSON: {e}"))
                                .with_primary(span, "a JSON schema, as text"),
                        );
                        None
                    }
                },
            };
            Some(RewardSpec::Verifier {
                name,
                kind: r.param("kind").and_then(Value::as_enum).unwrap_or("math").to_string(),
                pattern: text("pattern"),
                schema,
                on_error,
            })
        }
        "command_reward" => {
            let command = match r.param("command") {
                Some(Value::List(items)) => items.iter().filter_map(|v| v.as_str().map(str::to_string)).collect(),
                _ => Vec::new(),
            };
            Some(RewardSpec::Command { name, command, cwd: None, timeout_s, on_error })
        }
        "http_reward" => Some(RewardSpec::Http {
            name,
            url: text("url").unwrap_or_default(),
            concurrency: m.u64(r, "concurrency").max(1) as usize,
            batch_size: m.u64(r, "batch_size").max(1) as usize,
            timeout_s,
            retries: m.u64(r, "retries") as u32,
            on_error,
        }),
        _ => None,
    }
}

/// An `env_reward` stage as the run spec's episodes: its environment, limits and reward rules,
/// with the TITO rule of the rollout's `session`.
fn env_spec(r: &StageNode, rollout: &StageNode) -> Option<miles_runtime::env::spec::EnvRunSpec> {
    use miles_runtime::env::calculator::CalculatorSpec;
    use miles_runtime::env::jsonl::JsonlSpec;
    use miles_runtime::env::openenv::OpenEnvSpec;
    use miles_runtime::env::spec::{EnvRunSpec, EnvSpec};
    use miles_runtime::env::{OnEnvError, RewardMode, ToolFormat};
    use miles_runtime::session::Rule;
    let e = r.param("env").and_then(Value::as_record)?;
    let text = |name: &str| e.get(name).and_then(|v| v.as_str()).map(str::to_string);
    let env = match e.schema_name.as_str() {
        "calculator" => EnvSpec::Calculator(CalculatorSpec {
            digits: rec_u64(e, "digits") as u32,
            tool_reward: e.get("tool_reward").and_then(Value::as_f64).unwrap_or(0.0) as f32,
            demo_tool_rate: e.get("demo_tool_rate").and_then(Value::as_f64).unwrap_or(1.0) as f32,
        }),
        "command_env" => EnvSpec::Jsonl(JsonlSpec {
            name: r.name.clone(),
            argv: match e.get("command") {
                Some(Value::List(items)) => items.iter().filter_map(|v| v.as_str().map(str::to_string)).collect(),
                _ => Vec::new(),
            },
            cwd: None,
        }),
        "openenv" => EnvSpec::OpenEnv(OpenEnvSpec {
            name: r.name.clone(),
            url: text("url").unwrap_or_default(),
            action_field: text("action_field"),
            observation_field: text("observation_field"),
        }),
        _ => return None,
    };
    let secs = |name: &str, default: f64| r.param(name).and_then(Value::as_q).map_or(default, |q| q.to_f64());
    Some(EnvRunSpec {
        env,
        max_turns: r.param("max_turns").and_then(Value::as_i64).unwrap_or(4).max(1) as usize,
        turn_timeout_s: secs("turn_timeout", 30.0),
        episode_timeout_s: secs("timeout", 600.0),
        concurrency: r.param("concurrency").and_then(Value::as_i64).unwrap_or(64).max(1) as usize,
        tool_format: match r.param("tool_format").and_then(Value::as_enum) {
            Some("hermes") => ToolFormat::Hermes,
            _ => ToolFormat::Tag,
        },
        reward: match r.param("reward").and_then(Value::as_enum) {
            Some("sum") => RewardMode::Sum,
            _ => RewardMode::Final,
        },
        on_env_error: match r.param("on_env_error").and_then(Value::as_enum) {
            Some("score") => OnEnvError::Score,
            _ => OnEnvError::Drop,
        },
        session: match rollout.param("session").and_then(Value::as_record).and_then(|t| t.get("rule")) {
            Some(v) if v.as_enum() == Some("branching") => Rule::Branching,
            _ => Rule::Linear,
        },
        compact_keep_turns: r.param("compact").and_then(Value::as_record).map(|c| rec_u64(c, "keep_turns") as usize),
    })
}

/// The recipe's `launcher` setting and `weights` stage as the distributed part of the run spec
/// (None for `in_process`).
fn distributed_spec(l: &Record, sync: Option<&StageNode>) -> Option<miles_runtime::distributed::DistributedSpec> {
    use miles_runtime::distributed::{DistributedSpec, LauncherSpec, WorkerFailure};
    let int = |name: &str, default: i64| l.get(name).and_then(Value::as_i64).unwrap_or(default).max(0);
    let opt_str = |name: &str| l.get(name).and_then(|v| v.as_str()).map(str::to_string);
    let launcher = match l.schema_name.as_str() {
        "local_processes" => LauncherSpec::LocalProcesses { cpus_per_worker: int("cpus_per_worker", 0) as usize },
        "slurm" => LauncherSpec::Slurm {
            partition: opt_str("partition"),
            time_limit: opt_str("time_limit"),
            gpus_per_engine: int("gpus_per_engine", 0) as u32,
            gpus_per_trainer: int("gpus_per_trainer", 0) as u32,
            cpus_per_worker: int("cpus_per_worker", 1) as usize,
        },
        "ray" => LauncherSpec::Ray {
            address: opt_str("address").unwrap_or_default(),
            gpus_per_engine: int("gpus_per_engine", 0) as u32,
            gpus_per_trainer: int("gpus_per_trainer", 0) as u32,
        },
        _ => return None,
    };
    let transport = sync.and_then(|n| n.param("transport")).and_then(Value::as_enum).unwrap_or("broadcast").to_string();
    let channel = sync.and_then(|n| n.param("channel")).and_then(Value::as_enum).unwrap_or("auto").to_string();
    let bucket_bytes = sync
        .and_then(|n| n.param("bucket"))
        .and_then(Value::as_q)
        .map(|q| q.to_f64().max(65536.0) as u64)
        .unwrap_or(512 << 20);
    let verify_full = sync.and_then(|n| n.param("verify_full")).and_then(Value::as_bool).unwrap_or(false);
    Some(DistributedSpec {
        launcher,
        rollout_workers: int("engines", 1).max(1) as usize,
        transport,
        channel,
        bucket_bytes,
        verify_full,
        on_worker_failure: if l.get("on_failure").and_then(Value::as_enum) == Some("drop_engine") {
            WorkerFailure::Continue
        } else {
            WorkerFailure::Stop
        },
        call_timeout_s: int("call_timeout", 600) as f64,
        start_timeout_s: int("start_timeout", 120) as f64,
        heartbeat_timeout_s: 15.0,
        bind_host: opt_str("bind").unwrap_or_else(|| "127.0.0.1".into()),
        threads: 0,
        engine_urls: Vec::new(),
    })
}
