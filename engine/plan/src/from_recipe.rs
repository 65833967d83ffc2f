//! From a compiled recipe to the planner's input. The recipe's meaning comes from its typed
//! `Job` (`miles_compiler::job`, the reading `miles run` uses too); what is left here is the
//! planner's own: the hardware and model catalogs (`schema gpu`, `schema llm`, clusters), the
//! parameter count of a decoder, and the plan input's shape.

use crate::input::*;
use crate::output::ModelSource;
use miles_compiler::graph::{ChannelKind, StageGraph};
use miles_compiler::job::read::Fields;
use miles_compiler::job::{self as job, Family, Job, ModelJob, StageJob};
use miles_compiler::value::Record;
use miles_compiler::CompiledRecipe;

/// Builds the planner's input for one compiled recipe.
pub fn plan_input(recipe: &CompiledRecipe) -> PlanInput {
    let job = &recipe.job;
    let settings = recipe.settings.as_record();
    let cluster = cluster_of(&recipe.cluster_name, settings.and_then(|s| s.record("cluster")));
    let episodes = episodes_of(job);
    // The rollout's expected lengths, when the recipe states them (time only: docs/plan.md).
    let main_stage = job.main_rollout();
    let main = main_stage.and_then(|r| r.rollout.as_ref());
    // The main rollout's bounds where its model's context cuts them (docs/plan.md, "Expected
    // lengths"): every stage's lengths below are cut the same way.
    let context_cap = main
        .zip(main_stage.and_then(|s| s.model.as_ref()).and_then(model_spec))
        .and_then(|(r, m)| ContextCap::of(m.max_context, r.prompt_tokens.value, r.response_tokens.value));
    let assumptions = Assumptions {
        mean_prompt_tokens: main.and_then(|r| r.mean_prompt_tokens),
        mean_response_tokens: main.and_then(|r| r.mean_response_tokens),
        ..Assumptions::default()
    };
    let planner = Planner { job, episodes: &episodes, assumptions: &assumptions };
    let mut stages = Vec::new();
    let mut batch = Batch::default();
    let mut r3 = Spanned::new(false);
    let mut r3_id_bytes = None;
    for s in &job.stages {
        let stage = planner.stage(s);
        if let Some(r) = s.rollout.as_ref().and_then(|r| r.r3.as_ref()) {
            r3 = Spanned { value: true, span: r.span };
            r3_id_bytes = r.dtype.map(|d| match d {
                job::RouteDtype::U8 => 1,
                job::RouteDtype::U16 => 2,
                job::RouteDtype::I32 => 4,
            });
        }
        if let Some(t) = s.train.as_ref().filter(|_| s.role == job::Role::Train && batch.rollout_batch.is_none()) {
            batch.rollout_batch = t.rollout_batch;
            batch.global_batch = t.global_batch;
            batch.steps_per_rollout = t.steps_per_rollout;
            batch.epochs = Some(t.epochs);
            batch.samples_per_prompt =
                job.rollout_of(s).and_then(|r| r.rollout.as_ref()).and_then(|r| r.samples_per_prompt);
        }
        stages.push(stage);
    }
    let mode = job.placement.as_ref().map(|p| Spanned {
        value: if p.value == "colocated" { PlacementMode::Colocated } else { PlacementMode::Disaggregated },
        span: p.span,
    });
    let placement =
        Placement { embedded: embedded_extras(job), diffusion: diffusion_of(job), mode: mode.unwrap_or_default() };
    PlanInput {
        recipe: recipe.name.clone(),
        cluster,
        stages,
        graph: graph_of(&recipe.graph, job),
        placement,
        syncs: job.syncs.iter().map(sync_of).collect(),
        schedule: schedule_of(&job.schedule),
        batch,
        r3,
        r3_id_bytes,
        episodes,
        context_cap,
        assumptions,
        device: device_of(job),
        models: models_of(job),
    }
}

/// Each `hf` model the stages run (a teacher's too), once by directory, with what its
/// config.json read and did not.
fn models_of(job: &Job) -> Vec<ModelSource> {
    let mut out: Vec<ModelSource> = Vec::new();
    for m in job.stages.iter().flat_map(|s| s.model.iter().chain(s.field_models.iter())) {
        let ModelJob::Hf(h) = m else { continue };
        if out.iter().any(|o| o.path == h.path) {
            continue;
        }
        out.push(ModelSource {
            name: model_spec(m).map_or_else(|| h.architecture.clone(), |s| s.name),
            path: h.path.clone(),
            architecture: h.architecture.clone(),
            loadable: h.loadable,
            params: h.params,
            active_params: h.active_params,
            mtp_params: h.mtp_params,
            read: h.read.clone(),
            ignored: h.ignored.clone(),
        });
    }
    out
}

/// What the planner reads of a job, with the episodes and assumptions that size its sequences.
struct Planner<'a> {
    job: &'a Job,
    episodes: &'a Option<Episodes>,
    assumptions: &'a Assumptions,
}

impl Planner<'_> {
    /// With episodes, a rollout's (and its trainer's) sequence is a whole episode.
    fn as_episode(
        &self,
        (prompt, response): (Spanned<u64>, Spanned<u64>),
        model: Option<&ModelSpec>,
    ) -> (Spanned<u64>, Spanned<u64>) {
        match self.episodes {
            Some(e) => {
                let n = e.tokens(self.assumptions, model.map(|m| m.max_context));
                (prompt, Spanned { value: n.saturating_sub(prompt.value), span: response.span })
            }
            None => (prompt, response),
        }
    }

    /// What a trainer trains on per sequence: its rollout's prompt + response (an episode's
    /// whole context).
    fn trainer_seq_len(&self, train: &StageJob, model: Option<&ModelSpec>) -> Spanned<u64> {
        let rollout = self
            .job
            .rollout_of(train)
            .and_then(|s| Some((s.rollout.as_ref()?, s.model.as_ref().and_then(model_spec))))
            .map(|(r, m)| lengths(r, m.as_ref()));
        let (prompt, response) = self.as_episode(rollout.unwrap_or((Spanned::new(0), Spanned::new(0))), model);
        Spanned::new(prompt.value + response.value)
    }

    fn stage(&self, s: &StageJob) -> Stage {
        let mut stage = Stage {
            name: s.name.clone(),
            kind: s.kind.clone(),
            role: role_of(s.role),
            model: s.model.as_ref().and_then(model_spec),
            gpus: None,
            engine: None,
            trainer: None,
            teacher: None,
            span: Some(s.name_span),
        };
        if let Some(engine) = s.rollout.as_ref().and_then(|r| Some((r, r.engine.as_ref()?))) {
            let (rollout, engine) = engine;
            if engine.on_gpus() {
                stage.gpus = Some(gpu_request(engine.gpus, engine.first_gpu));
            }
            let (prompt, response) = self.as_episode(lengths(rollout, stage.model.as_ref()), stage.model.as_ref());
            stage.engine = Some(engine_of(engine, prompt, response));
        }
        if let Some(backend) = s.train.as_ref().and_then(|t| t.backend.as_ref()) {
            let seq_len = self.trainer_seq_len(s, stage.model.as_ref());
            if backend.on_gpus() {
                stage.gpus = Some(gpu_request(backend.gpus, backend.first_gpu));
            }
            let offload = s.train.as_ref().and_then(|t| t.optimizer.as_ref()).and_then(|o| o.state.clone());
            stage.trainer = Some(self.trainer_of(s, backend, seq_len, offload));
        }
        // An OPD teacher stage on GPUs of its own: the trainer that reads it says what it scores.
        if let Some(n) = s.teacher.as_ref().and_then(|t| t.gpus) {
            stage.gpus = Some(Spanned { value: GpuRequest::Count(n.value), span: n.span });
            let reader = self.job.stages.iter().find(|t| self.job.teacher_of(t).is_some_and(|x| x.name == s.name));
            stage.teacher = reader.and_then(|t| {
                let student = t.model.as_ref().and_then(model_spec);
                let backend = t.train.as_ref()?.backend.as_ref()?;
                let tr = self.trainer_of(t, backend, self.trainer_seq_len(t, student.as_ref()), None);
                Some(TeacherJob {
                    seq_len: tr.seq_len.value,
                    micro_batch: tr.micro_batch.value,
                    precision: tr.precision.value,
                })
            });
        }
        // A kind the planner does not know, running a model of its own (a teacher in a field):
        // that model is the one E0410 names, whatever the stage's ports lead to.
        if stage.trainer.is_none() && stage.engine.is_none() && !KNOWN_KINDS.contains(&s.kind.as_str()) {
            if let Some(m) = s.field_models.iter().find_map(model_spec) {
                stage.model = Some(m);
            }
        }
        stage
    }

    fn trainer_of(
        &self,
        s: &StageJob,
        b: &job::BackendJob,
        seq_len: Spanned<u64>,
        offload: Option<Spanned<String>>,
    ) -> Trainer {
        let t = s.train.as_ref();
        // `opd = opd { teacher = <a teacher_logprobs stage> }`: that stage's model, read like the
        // policy (`model_spec`), and where it runs; on GPUs of its own it is planned apart.
        let teacher = self.job.teacher_of(s).filter(|t| t.teacher.as_ref().is_none_or(|x| x.gpus.is_none()));
        let one = |v: Option<Spanned<u64>>| v.unwrap_or(Spanned::new(1));
        let backend = match b.schema.as_str() {
            "megatron" => Backend::Megatron,
            "fsdp" => Backend::Fsdp,
            _ => Backend::Embedded,
        };
        let recompute = match &b.recompute {
            Some(r) => Spanned {
                value: match r.value.as_str() {
                    "full" => Recompute::Full,
                    "selective" => Recompute::Selective,
                    _ => Recompute::Off,
                },
                span: r.span,
            },
            None => Spanned::new(Recompute::Off),
        };
        let optimizer_offload = match offload {
            Some(o) => Spanned {
                value: match o.value.as_str() {
                    "cpu" => OptimizerOffload::Cpu,
                    "stream_from_disk" => OptimizerOffload::StreamFromDisk,
                    _ => OptimizerOffload::OnGpu,
                },
                span: o.span,
            },
            None => Spanned::new(OptimizerOffload::OnGpu),
        };
        // The embedded trainer has no micro-batch of its own: the stage's `micro_batch` (or the
        // SFT `batch`) is what it holds in memory at once.
        let micro_batch = if backend == Backend::Embedded {
            one(t.and_then(|t| t.micro_batch.or(t.batch)))
        } else {
            one(b.micro_batch)
        };
        Trainer {
            backend: Spanned::new(backend),
            tp: one(b.tp),
            pp: one(b.pp),
            cp: one(b.cp),
            ep: one(b.ep),
            // The embedded trainer's `dp` is its worker processes (`data_parallel`), not GPUs.
            dp: if backend == Backend::Embedded { None } else { b.dp },
            precision: precision_of(b.precision),
            micro_batch,
            seq_len,
            recompute,
            optimizer_offload,
            lora: t.and_then(|t| t.lora.as_ref()).map(lora_of),
            teacher: teacher.and_then(|t| t.model.as_ref()).and_then(model_spec),
            teacher_process: teacher.and_then(|t| t.teacher.as_ref()).is_some_and(|t| t.process),
            data_parallel: data_parallel_of(b),
        }
    }
}

/// The embedded trainer's data-parallel ranks (`embedded_trainer { dp > 1 }`) with their ZeRO
/// stage, bucket and deadline; `None`: one process. The stdlib gives each field of an
/// `embedded_trainer` a default, so all are present where the ranks are (as the run spec reads
/// them, src/runspec.rs).
fn data_parallel_of(b: &job::BackendJob) -> Option<DataParallel> {
    let zero = b.zero?;
    Some(DataParallel {
        ranks: b.embedded_ranks()?,
        zero: Spanned {
            value: match zero.value {
                job::Zero::None => Zero::None,
                job::Zero::Optimizer => Zero::Optimizer,
            },
            span: zero.span,
        },
        bucket_bytes: b.dp_bucket?.value,
        timeout_s: b.collective_timeout?.value,
    })
}

fn role_of(role: job::Role) -> Role {
    match role {
        job::Role::Sft => Role::Sft,
        job::Role::Rollout => Role::Rollout,
        job::Role::Eval => Role::Eval,
        job::Role::Teacher => Role::Teacher,
        job::Role::Reward => Role::Reward,
        job::Role::Train => Role::Train,
        job::Role::Other => Role::Other,
    }
}

/// Prompt and response lengths of a rollout (tokens), cut to what its model's context lets a run
/// reach (`ContextCap`).
fn lengths(r: &job::RolloutJob, model: Option<&ModelSpec>) -> (Spanned<u64>, Spanned<u64>) {
    let (prompt, response) = (r.prompt_tokens, r.response_tokens);
    match model.and_then(|m| ContextCap::of(m.max_context, prompt.value, response.value)) {
        Some(cap) => {
            let (p, n) = cap.lengths();
            (Spanned { value: p, span: prompt.span }, Spanned { value: n, span: response.span })
        }
        None => (prompt, response),
    }
}

/// A `local` cluster's `device`, with its span when the recipe set it.
fn device_of(job: &Job) -> Option<DeviceInput> {
    let asked = job.device.clone()?;
    // engine/tch/src/diffusion makes its tensors on the CPU (`device = cuda` there is E0511).
    let cpu_only =
        job.stages.iter().any(|s| s.kind == "denoise").then(|| "a diffusion recipe computes on the CPU".to_string());
    Some(DeviceInput { asked, machine: None, cpu_only, cpu_bf16: None })
}

/// The episodes of a rollout scored by an environment (`env_reward`): its turn limit, and what an
/// observation of a built-in environment adds (the calculator's `<result>N</result>`, one token
/// per character on the embedded char tokenizer).
fn episodes_of(job: &Job) -> Option<Episodes> {
    let e = job.episodes()?;
    let env = e.env.as_ref();
    // The recipe's word first, then what a built-in environment is known to answer.
    let stated = e.observation_tokens.map(|o| o.value);
    let observation_tokens = stated.or(match env.map(|e| e.schema_name.as_str()) {
        Some("calculator") => {
            let digits = e.calculator_digits.unwrap_or(2);
            Some("<result></result>".len() as u64 + 2 * digits)
        }
        _ => None,
    });
    let stage = e.rollout.as_deref().and_then(|r| job.stage(r));
    let model = stage.and_then(|s| s.model.as_ref()).and_then(model_spec);
    let (prompt, turn) = stage.and_then(|s| s.rollout.as_ref()).map(|r| lengths(r, model.as_ref())).unwrap_or_default();
    Some(Episodes {
        env: env.map_or_else(|| "?".into(), |e| e.schema_name.clone()),
        max_turns: e.max_turns,
        observation_tokens,
        observation_stated: stated.is_some(),
        prompt_tokens: prompt.value,
        turn_tokens: turn.value,
        compact_keep_turns: e.compact_keep_turns,
        mean_turns: e.mean_turns,
        solved_at: e.solved_at.value,
        prompt: e.prompt.clone(),
    })
}

/// What the embedded process holds besides the trainer: a KL reference (`kl_coef > 0` on a
/// trainer), a snapshot evaluation's engine (`evaluate { mode = snapshot }`), the entropy's graph
/// (`entropy_coef > 0`).
fn embedded_extras(job: &Job) -> EmbeddedExtras {
    let trainers = || job.trainers().filter_map(|s| s.train.as_ref());
    EmbeddedExtras {
        kl_reference: trainers().any(|t| t.kl_coef > 0.0),
        eval_snapshot: job
            .stages
            .iter()
            .any(|s| s.role == job::Role::Eval && s.eval.as_ref().and_then(|e| e.mode.as_deref()) == Some("snapshot")),
        entropy_in_loss: trainers().any(|t| t.entropy_coef > 0.0),
    }
}

/// A diffusion RL recipe: a `denoise` stage sampling from a `denoiser` record, with the first
/// `denoise_pretrain`, `image_reward`, `diffusion_grpo` and `image_eval` stages (docs/plan.md,
/// "Diffusion RL"). `None` for every other recipe.
fn diffusion_of(job: &Job) -> Option<Diffusion> {
    let Family::Diffusion(d) = &job.family else { return None };
    let m = &d.model;
    Some(Diffusion {
        model: DenoiserSpec {
            side: m.side,
            conditions: m.conditions,
            hidden: m.hidden,
            layers: m.layers,
            params: m.params,
        },
        pretrain: d.pretrain.as_ref().map(|p| DenoisePretrain {
            stage: p.stage.clone(),
            steps: p.steps,
            batch: p.batch,
        }),
        rollout: DenoiseRollout {
            stage: d.rollout.stage.clone(),
            steps: d.rollout.steps,
            guidance: d.rollout.guidance,
            samples_per_condition: d.rollout.samples_per_condition,
            micro_group: d.rollout.micro_group,
        },
        reward: d.reward.as_ref().map(|r| ImageReward {
            stage: r.stage.clone(),
            streaming: r.streaming,
            process: r.process,
            extra_cost_s: Some(r.extra_cost_s).filter(|x| x.is_finite() && *x > 0.0).unwrap_or(0.0),
            classifier_steps: r.classifier.is_none().then_some(r.classifier_steps),
            analytic: r.analytic.is_some(),
        }),
        train: d.train.as_ref().map(|t| DiffusionTrainer {
            stage: t.stage.clone(),
            conditions_per_step: t.conditions_per_step,
            train_steps: t.train_steps,
            kl_coef: Some(t.kl_coef).filter(|x| x.is_finite() && *x > 0.0).unwrap_or(0.0),
        }),
        eval: d.eval.as_ref().map(|e| ImageEval {
            stage: e.stage.clone(),
            every: e.every,
            samples: e.samples,
            judge_steps: e.judge_steps,
        }),
    })
}

/// `gpus` (a count), `gpus` + `first_gpu` (a range), or neither (the planner sizes the stage).
fn gpu_request(gpus: Option<Spanned<u64>>, first_gpu: Option<Spanned<u64>>) -> Spanned<GpuRequest> {
    match (gpus, first_gpu) {
        (Some(n), Some(first)) => Spanned {
            value: GpuRequest::Range { first: first.value, last: first.value + n.value.saturating_sub(1) },
            span: first.span.or(n.span),
        },
        (Some(n), None) => Spanned { value: GpuRequest::Count(n.value), span: n.span },
        _ => Spanned::new(GpuRequest::Auto),
    }
}

fn precision_of(p: Option<Spanned<job::Precision>>) -> Spanned<Precision> {
    p.map_or(Spanned::new(Precision::Fp32), |p| {
        p.map(|p| match p {
            job::Precision::Fp32 => Precision::Fp32,
            job::Precision::Bf16 => Precision::Bf16,
            job::Precision::Fp16 => Precision::Fp16,
            job::Precision::Fp8Blockwise => Precision::Fp8Blockwise,
            job::Precision::Mxfp8 => Precision::Mxfp8,
            job::Precision::Nvfp4 => Precision::Nvfp4,
        })
    })
}

fn engine_of(e: &job::EngineJob, prompt_len: Spanned<u64>, response_len: Spanned<u64>) -> Engine {
    Engine {
        engines: None,
        tp: e.tp.unwrap_or(Spanned::new(1)),
        dp: Spanned::new(1),
        ep: e.ep.unwrap_or(Spanned::new(1)),
        precision: precision_of(e.precision),
        embedded: e.schema == "embedded_engine",
        kv_precision: None,
        mem_fraction: e.mem_fraction.unwrap_or(Spanned::new(0.85)),
        max_concurrent: e.max_concurrent,
        // A planning assumption the recipe states on its engine (std/prelude `sglang`).
        prefix_cache_hit: e.prefix_cache_hit,
        prompt_len,
        response_len,
    }
}

/// `lora { rank, adapters, target_modules }`; a module named twice is counted once.
fn lora_of(l: &job::LoraJob) -> Lora {
    let mut target_modules: Vec<LoraTarget> =
        l.target_modules.iter().filter_map(|m| LoraTarget::from_name(m)).collect();
    target_modules.sort();
    target_modules.dedup();
    Lora {
        rank: l.rank,
        adapters: l.adapters,
        target_modules,
        dropout: l.dropout,
        init: l.init.as_ref().map(|d| d.value.clone()),
        span: l.span,
    }
}

fn sync_of(s: &job::SyncJob) -> WeightSync {
    let transport = match s.transport.value.as_str() {
        "p2p" => Transport::P2p,
        "disk_delta" => Transport::DiskDelta,
        "local" => Transport::Local,
        _ => Transport::Broadcast,
    };
    let channel = match s.channel.as_str() {
        "tcp" => WeightChannel::Tcp,
        "shm" => WeightChannel::Shm,
        "nccl" => WeightChannel::Nccl,
        _ => WeightChannel::Auto,
    };
    WeightSync {
        name: s.name.clone(),
        from: s.from.clone(),
        to: s.to.clone(),
        transport: Spanned { value: transport, span: s.transport.span },
        channel,
        bucket: s.bucket,
        span: Some(s.name_span),
    }
}

fn schedule_of(s: &job::ScheduleJob) -> Schedule {
    let mode = match s.mode.value.as_str() {
        "fully_async" => ScheduleMode::FullyAsync,
        "one_step_off" => ScheduleMode::OneStepOff,
        _ => ScheduleMode::Sync,
    };
    Schedule {
        mode: Spanned { value: mode, span: s.mode.span },
        max_staleness: s.max_staleness,
        buffer_capacity: s.buffer_capacity,
        max_concurrent: if mode == ScheduleMode::FullyAsync { s.max_concurrent } else { None },
        dynamic_rounds: s.dynamic_rounds(),
    }
}

fn graph_of(g: &StageGraph, job: &Job) -> Graph {
    let role = |name: &str| job.stage(name).map_or(Role::Other, |s| role_of(s.role));
    Graph {
        nodes: g
            .nodes()
            .map(|n| GraphNode { id: n.name.clone(), label: n.kind.clone(), role: role(&n.name) })
            .collect(),
        edges: g
            .edges()
            .into_iter()
            .map(|(a, b, c)| GraphEdge {
                from: a.to_string(),
                to: b.to_string(),
                label: format!("{:?}", c.kind),
                weights: c.kind == ChannelKind::Weights,
            })
            .collect(),
    }
}

// ---- the planner's catalogs: clusters, GPUs, catalog models, a decoder's parameters ----------

fn u64_of(r: &Record, name: &str) -> Option<u64> {
    r.u64(name).map(|v| v.value)
}

fn f64_of(r: &Record, name: &str) -> Option<f64> {
    r.f64(name).map(|v| v.value)
}

fn str_of(r: &Record, name: &str) -> Option<String> {
    r.str(name).map(str::to_string)
}

fn cluster_of(name: &str, r: Option<&Record>) -> Cluster {
    let Some(r) = r else { return Cluster { name: name.to_string(), pools: Vec::new(), host: None, span: None } };
    match r.schema_name.as_str() {
        "gpu_cluster" => {
            let gpu = r.record("gpu").and_then(gpu_spec);
            let gpus = r.u64("gpus");
            let per_node = u64_of(r, "gpus_per_node").unwrap_or(1).max(1);
            let pools = gpu
                .map(|g| {
                    let n = gpus.map_or(0, |v| v.value);
                    vec![NodePool {
                        gpu: g,
                        nodes: Spanned { value: n.div_ceil(per_node), span: gpus.and_then(|v| v.span) },
                    }]
                })
                .unwrap_or_default();
            Cluster { name: name.to_string(), pools, host: None, span: Some(r.span) }
        }
        _ => Cluster {
            name: name.to_string(),
            pools: Vec::new(),
            host: Some(HostSpec {
                name: name.to_string(),
                cpus: u64_of(r, "cpus").unwrap_or(1),
                memory: u64_of(r, "memory").unwrap_or(0),
                memory_bandwidth: f64_of(r, "memory_bandwidth").unwrap_or(0.0),
                fp32: f64_of(r, "fp32"),
            }),
            span: Some(r.span),
        },
    }
}

fn arch_of(s: &str) -> Arch {
    match s {
        "ampere" => Arch::Ampere,
        "hopper" => Arch::Hopper,
        "blackwell" => Arch::Blackwell,
        "cdna3" => Arch::Cdna3,
        "cdna4" => Arch::Cdna4,
        _ => Arch::Cpu,
    }
}

fn gpu_spec(r: &Record) -> Option<GpuSpec> {
    Some(GpuSpec {
        name: str_of(r, "name")?,
        arch: arch_of(r.member("arch")?.value),
        hbm: u64_of(r, "hbm")?,
        hbm_bandwidth: f64_of(r, "hbm_bandwidth")?,
        bf16: f64_of(r, "bf16")?,
        fp8: f64_of(r, "fp8"),
        fp4: f64_of(r, "fp4"),
        scaleup_domain: u64_of(r, "scaleup_domain")?,
        scaleup_bandwidth: f64_of(r, "scaleup_bandwidth")?,
        network_bandwidth: f64_of(r, "network_bandwidth")?,
        gpus_per_node: u64_of(r, "gpus_per_node")?,
        host_link_bandwidth: f64_of(r, "host_link_bandwidth")?,
        host_memory: u64_of(r, "host_memory"),
        disk_bandwidth: f64_of(r, "disk_bandwidth"),
    })
}

/// A model as the planner sizes it: a catalog entry from its record, a decoder from its shape.
pub(crate) fn model_spec(m: &ModelJob) -> Option<ModelSpec> {
    match m {
        ModelJob::Catalog(r) => llm_spec(r),
        // The embedded backend's decoder: parameters counted from its shape (docs/plan.md).
        // With `experts > 0` every layer from `dense_layers` on is a mixture of experts: a router
        // (experts x d_model), `experts` SwiGLU experts of `expert_d_ff` (top_k of them active
        // per token) and an optional shared expert of `shared_expert_d_ff`.
        ModelJob::Transformer { sizes, moe, qk_norm } => {
            let (d, heads, kv) = (sizes.d_model, sizes.heads.max(1), sizes.kv_heads);
            let (ff, vocab, hd, layers) = (sizes.d_ff, sizes.vocab, d / heads, sizes.layers);
            // q/k/v/o, and with `qk_norm` an RMSNorm over each head's query and key.
            let attn = d * heads * hd + 2 * d * kv * hd + heads * hd * d + if *qk_norm { 2 * hd } else { 0 };
            let experts = moe.as_ref().map_or(0, |m| m.experts);
            let (top_k, dense_layers) = match moe {
                Some(m) => (m.top_k, m.dense_layers.min(layers)),
                None => (0, 0),
            };
            let moe_layers = if experts == 0 { 0 } else { layers - dense_layers };
            let expert = 3 * d * moe.as_ref().map_or(ff, |m| m.expert_d_ff);
            let shared = 3 * d * moe.as_ref().map_or(0, |m| m.shared_expert_d_ff);
            // The embedding and the LM head are two matrices (2 x vocab x d).
            let common = 2 * vocab * d
                + layers * (attn + 2 * d)
                + d
                + (layers - moe_layers) * 3 * d * ff
                + moe_layers * (shared + experts * d);
            let params = common + moe_layers * experts * expert;
            let active_params = common + moe_layers * top_k * expert;
            let m = decoder_spec(sizes, "transformer", params, hd);
            Some(ModelSpec {
                name: if experts == 0 { m.name } else { format!("{} MoE top-{top_k} of {experts}", m.name) },
                active_params,
                dense_layers,
                experts,
                top_k,
                tied_embeddings: Some(false),
                ..m
            })
        }
        // A Hugging Face directory: the sizes `miles check` read from its config.json, the
        // parameters counted there as transformers lays the architecture out (biases, q/k norms,
        // tied embeddings, MLA's projections, DSA's indexer and the experts included), the
        // experts and the layers that have them, and MLA's and DSA's cached widths.
        ModelJob::Hf(h) => {
            let m = decoder_spec(&h.sizes, &h.architecture, h.params, h.head_dim);
            let (experts, top_k) = h.moe.as_ref().map_or((0, 0), |m| (m.experts, m.top_k));
            Some(ModelSpec {
                name: if experts == 0 { m.name } else { format!("{} MoE top-{top_k} of {experts}", m.name) },
                active_params: h.active_params,
                // The planner's dense layers are those without experts, wherever they are.
                dense_layers: if experts == 0 { 0 } else { h.sizes.layers.saturating_sub(h.moe_layers) },
                experts,
                top_k,
                attention: match h.attention {
                    job::HfAttention::Mla => Attention::Mla,
                    job::HfAttention::Mha => Attention::Mha,
                    job::HfAttention::Gqa => Attention::Gqa,
                },
                kv_lora_rank: h.kv_lora_rank,
                qk_rope_head_dim: h.qk_rope_head_dim,
                sparse_topk: h.sparse_topk,
                index_head_dim: h.index_head_dim,
                tied_embeddings: h.tie_embeddings,
                ..m
            })
        }
        ModelJob::Denoiser(_) | ModelJob::Other { .. } => None,
    }
}

/// A `schema llm` catalog entry (std/models), field by field.
fn llm_spec(r: &Record) -> Option<ModelSpec> {
    Some(ModelSpec {
        name: str_of(r, "name")?,
        params: u64_of(r, "params")?,
        active_params: u64_of(r, "active_params")?,
        layers: u64_of(r, "layers")?,
        dense_layers: u64_of(r, "dense_layers").unwrap_or(0),
        hidden_size: u64_of(r, "hidden_size")?,
        heads: u64_of(r, "heads")?,
        kv_heads: u64_of(r, "kv_heads")?,
        head_dim: u64_of(r, "head_dim")?,
        vocab: u64_of(r, "vocab")?,
        experts: u64_of(r, "experts").unwrap_or(0),
        top_k: u64_of(r, "top_k").unwrap_or(0),
        max_context: u64_of(r, "max_context")?,
        attention: match r.member("attention")?.value {
            "mha" => Attention::Mha,
            "mla" => Attention::Mla,
            _ => Attention::Gqa,
        },
        kv_lora_rank: u64_of(r, "kv_lora_rank"),
        qk_rope_head_dim: u64_of(r, "qk_rope_head_dim"),
        sparse_topk: u64_of(r, "sparse_topk"),
        index_head_dim: u64_of(r, "index_head_dim"),
        update_requantize_s: f64_of(r, "update_requantize"),
        intermediate_size: None,
        tied_embeddings: None,
    })
}

/// A dense decoder's plan input from the sizes `transformer` and `hf` share, named
/// `<name> <layers>x<d_model>`.
fn decoder_spec(s: &job::Decoder, name: &str, params: u64, head_dim: u64) -> ModelSpec {
    let heads = s.heads.max(1);
    ModelSpec {
        name: format!("{name} {}x{}", s.layers, s.d_model),
        params,
        active_params: params,
        layers: s.layers,
        dense_layers: 0,
        hidden_size: s.d_model,
        heads,
        kv_heads: s.kv_heads,
        head_dim,
        vocab: s.vocab,
        experts: 0,
        top_k: 0,
        max_context: s.max_len,
        attention: if s.kv_heads == heads { Attention::Mha } else { Attention::Gqa },
        kv_lora_rank: None,
        qk_rope_head_dim: None,
        sparse_topk: None,
        index_head_dim: None,
        update_requantize_s: None,
        intermediate_size: Some(s.d_ff),
        tied_embeddings: None,
    }
}
