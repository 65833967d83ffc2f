//! From a compiled recipe to the embedded backend's `RunSpec`: the recipe's typed `Job`
//! (`miles_compiler::job`, the reading `miles plan` uses too) mapped onto the runtime's types.
//! What the embedded backend cannot run is reported as E0511 at the line that asks for it, all
//! at once. Runtime-only readings live beside this file: the task and the rewards
//! (`runspec/task.rs`, `runspec/reward.rs`), the launcher (`runspec/launch.rs`), diffusion
//! (`runspec/diffusion.rs`).

use miles_compiler::capability;
use miles_compiler::graph::StageNode;
use miles_compiler::job::read::Fields;
use miles_compiler::job::{self, Job, ModelJob, StageJob};
use miles_compiler::{CompiledRecipe, Diagnostic};
use miles_grammar::diag::ErrorCode;
use miles_runtime::routing::RouteId;
use miles_runtime::spec::*;

#[cfg(test)]
mod agree;
pub mod diffusion;
mod launch;
#[cfg(test)]
mod model_tests;
mod reward;
pub(crate) mod task;

/// What `miles run` hands the engine: a language-model run or a diffusion run.
#[derive(serde::Serialize)]
#[serde(untagged)]
pub enum RunJob {
    Lm(Box<RunSpec>),
    Diffusion(Box<miles_runtime::diffusion::DiffusionRunSpec>),
}

/// The run a compiled recipe maps onto: a diffusion run when it samples with `denoise`.
pub fn run_job(recipe: &CompiledRecipe) -> Result<RunJob, Vec<Diagnostic>> {
    if diffusion::is_diffusion(recipe) {
        diffusion::diffusion_spec(recipe).map(|s| RunJob::Diffusion(Box::new(s)))
    } else {
        run_spec(recipe).map(|s| RunJob::Lm(Box::new(s)))
    }
}

/// One mapping: the compiled recipe and its lowered stages.
struct Mapper<'r> {
    recipe: &'r CompiledRecipe,
}

impl<'r> Mapper<'r> {
    fn new(recipe: &'r CompiledRecipe) -> Mapper<'r> {
        Mapper { recipe }
    }

    fn job(&self) -> &'r Job {
        &self.recipe.job
    }

    /// The lowered stage behind a typed one.
    fn node(&self, s: &StageJob) -> Option<&'r StageNode> {
        self.recipe.graph.node(&s.name)
    }

    /// The first stage of `kind`, in graph order.
    fn first_of_kind(&self, kind: &str) -> Option<&'r StageJob> {
        self.job().stages.iter().find(|s| s.kind == kind)
    }

    /// A recipe the run contract accepted but this mapping cannot read: a bug in miles.
    fn internal(&self, what: &str) -> Vec<Diagnostic> {
        vec![Diagnostic::error(ErrorCode::E0511, format!("internal error: cannot map {what} of this recipe"))
            .with_primary(self.recipe.span, "while mapping this recipe to a run")
            .with_help("this is a bug in miles, not in the recipe; please report it")]
    }

    /// The trainer's distillation: its `opd` record and the `teacher_logprobs` stage it names (a
    /// teacher stage no trainer reads was refused by `capability::shape`).
    fn opd_spec(&self, train: &StageJob) -> Option<OpdSpec> {
        let read = self.job().teacher_of(train);
        let (o, teacher) = (train.train.as_ref()?.opd.as_ref()?, read?);
        Some(OpdSpec {
            stage: teacher.name.clone(),
            teacher: match &teacher.model {
                Some(ModelJob::Hf(h)) => h.path.clone().into(),
                _ => Default::default(),
            },
            coef: o.coef,
            task_coef: o.task_coef,
            process: teacher.teacher.as_ref().is_some_and(|t| t.process),
        })
    }
}

fn decoder_sizes(d: &job::Decoder) -> DecoderSizes {
    DecoderSizes {
        vocab_size: d.vocab as usize,
        d_model: d.d_model as usize,
        n_layers: d.layers as usize,
        n_heads: d.heads as usize,
        n_kv_heads: d.kv_heads as usize,
        d_ff: d.d_ff as usize,
        max_len: d.max_len as usize,
    }
}

/// A mixture of experts: a `transformer`'s, or an `hf` directory's with its layer set.
fn moe_config(m: &job::Moe) -> MoeConfig {
    MoeConfig {
        experts: m.experts as usize,
        top_k: m.top_k as usize,
        expert_d_ff: m.expert_d_ff as usize,
        shared_expert_d_ff: m.shared_expert_d_ff as usize,
        dense_layers: m.dense_layers as usize,
        mlp_only_layers: m.mlp_only_layers.iter().map(|&i| i as usize).collect(),
        sparse_step: m.sparse_step.max(1) as usize,
        gating: match m.gating {
            job::Gating::Sigmoid => Gating::Sigmoid,
            job::Gating::Softmax => Gating::Softmax,
        },
        norm_topk: m.norm_topk,
        aux_loss_coef: m.aux_loss_coef,
    }
}

/// The model: a seeded `transformer`, or a Hugging Face directory whose config.json `miles
/// check` read. None for any other model (refused by the caller).
fn model_config(m: Option<&ModelJob>) -> Option<(ModelConfig, Option<HfModelSpec>)> {
    Some(match m? {
        ModelJob::Hf(h) => (
            ModelConfig {
                rope_theta: h.rope_theta.unwrap_or(10000.0),
                // config.json's `rms_norm_eps`, as the engine reads it when it loads the directory.
                norm_eps: h.norm_eps,
                head_dim: Some(h.head_dim as usize),
                qkv_bias: h.qkv_bias,
                o_bias: h.o_bias,
                qk_norm: h.qk_norm,
                tie_embeddings: h.tie_embeddings.unwrap_or(false),
                moe: h.moe.as_ref().map(moe_config),
                ..ModelConfig::decoder(decoder_sizes(&h.sizes))
            },
            Some(HfModelSpec { path: h.path.clone().into() }),
        ),
        ModelJob::Transformer { sizes, moe, qk_norm } => (
            ModelConfig {
                moe: moe.as_ref().map(moe_config),
                qk_norm: *qk_norm,
                ..ModelConfig::decoder(decoder_sizes(sizes))
            },
            None,
        ),
        _ => return None,
    })
}

/// The `precision` of an engine or trainer of the embedded backend's `schema`; fp32 for any
/// other (a server by URL), whose precision is not the embedded backend's to run.
fn embedded_precision(schema: Option<&str>, precision: Option<job::Precision>, embedded: &str) -> Precision {
    match (schema == Some(embedded), precision) {
        (true, Some(job::Precision::Bf16)) => Precision::Bf16,
        _ => Precision::Fp32,
    }
}

/// R3 from the rollout's `record_routing`, `routing_replay` and `routing_dtype`; None when the
/// engine records no routing. The id type defaults to the smallest that holds the expert count.
fn r3_spec(rollout: &StageJob) -> Option<R3Spec> {
    let r3 = rollout.rollout.as_ref()?.r3.as_ref()?;
    let id = match r3.dtype {
        Some(job::RouteDtype::U8) => RouteId::U8,
        Some(job::RouteDtype::U16) => RouteId::U16,
        Some(job::RouteDtype::I32) => RouteId::I32,
        None => RouteId::smallest_for(rollout.model.as_ref().map_or(0, |m| m.experts()) as usize),
    };
    Some(R3Spec { replay: r3.replay, id })
}

pub fn run_spec(recipe: &CompiledRecipe) -> Result<RunSpec, Vec<Diagnostic>> {
    // Every refusal (E0511) comes from the run contract, before any mapping.
    let (rollout, train) = capability::shape::lm_run(recipe)?;
    let m = Mapper::new(recipe);
    let job = &recipe.job;
    let (r, t) = (rollout.rollout.as_ref(), train.train.as_ref());
    let engine = r.and_then(|r| r.engine.as_ref());
    // An SGLang-compatible server fleet given by URL serves the rollout (the trainer stays here).
    let engine_urls: Vec<String> = engine.filter(|e| e.schema == "sglang").map(|e| e.urls.clone()).unwrap_or_default();
    let Some((model, hf)) = model_config(rollout.model.as_ref()) else { return Err(m.internal("the model")) };

    // The task, from the rollout's prompts.
    let reward_stage = t.and_then(|t| t.reward.as_deref()).and_then(|n| recipe.graph.node(n));
    let partial_credit = reward_stage.and_then(|r| r.bool("partial_credit")).is_some_and(|b| b.value);
    let prompts = m.node(rollout).and_then(|n| n.record("prompts"));
    let Some(task) = task::task_spec(prompts, partial_credit) else { return Err(m.internal("the prompts")) };
    let reward = reward_stage.and_then(|r| reward::reward_spec(&recipe.graph, r));
    let env = reward_stage
        .and_then(|r| Some((r, job.stage(&r.name)?.episodes.as_ref()?)))
        .and_then(|(r, e)| reward::env_spec(r, e, session_rule(rollout)));

    // SFT warm-up: an sft stage feeding the rollout's policy.
    let sft = m.first_of_kind("sft").and_then(|s| s.train.as_ref()).map(|s| SftSpec {
        steps: s.steps,
        lr: s.lr.unwrap_or(1e-3),
        batch: s.batch.map_or(32, |b| b.value).max(1) as usize,
        warmup_steps: s.warmup,
    });
    let train_spec = match t {
        Some(t) => {
            let max_new = r.map_or(0, |r| r.response_tokens.value) as usize;
            train_spec(&m, train, t, job.seed, partial_credit, max_new)
        }
        None => return Err(m.internal("the trainer")),
    };
    let rollout_spec = RolloutSpec {
        rollout_batch: t.and_then(|t| t.rollout_batch).map_or(0, |v| v.value) as usize,
        samples_per_prompt: r.and_then(|r| r.samples_per_prompt).map_or(0, |v| v.value) as usize,
        max_new_tokens: r.map_or(0, |r| r.response_tokens.value) as usize,
        temperature: r.map_or(0.0, |r| r.temperature),
        top_p: r.map_or(0.0, |r| r.top_p),
        top_k: r.map_or(0, |r| r.top_k) as usize,
        max_prompt_tokens: Some(r.map_or(0, |r| r.prompt_tokens.value) as usize).filter(|n| *n > 0),
        precision: embedded_precision(
            engine.map(|e| e.schema.as_str()),
            engine.and_then(|e| e.precision).map(|p| p.value),
            "embedded_engine",
        ),
        r3: r3_spec(rollout),
        batch_invariant: r.is_some_and(|r| r.batch_invariant),
    };
    let eval = m
        .first_of_kind("evaluate")
        .and_then(|e| e.eval.as_ref())
        .map(|e| EvalSpec {
            every: e.every,
            prompts: e.limit.unwrap_or(200).max(1) as usize,
            mode: match e.mode.as_deref() {
                Some("snapshot") => EvalMode::Snapshot,
                Some("external") => EvalMode::External,
                _ => EvalMode::Shared,
            },
            command: e.command.clone(),
        })
        .unwrap_or_default();
    let checkpoint = recipe
        .graph
        .nodes()
        .find(|n| n.kind == "checkpoint")
        .map(|c| CheckpointSpec {
            every: c.u64("every").map_or(0, |v| v.value),
            keep: c.value("keep").and_then(|v| v.as_i64()).unwrap_or(2).max(1) as usize,
        })
        .unwrap_or_default();
    // samples.jsonl: the recipe's `samples` stage, else its defaults (on, docs/runs.md).
    let samples = recipe
        .graph
        .nodes()
        .find(|n| n.kind == "samples")
        .map(|c| SamplesSpec {
            every: c.u64("every").map_or(0, |v| v.value),
            count: c.value("count").and_then(|v| v.as_i64()).unwrap_or(0).max(0) as usize,
        })
        .unwrap_or_default();
    let distributed = launch::distributed(&m, engine_urls);
    Ok(RunSpec {
        seed: job.seed,
        steps: job.stop,
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
        samples,
        distributed,
        schedule: schedule_spec(&job.schedule),
        dynamic_sampling: dynamic_sampling(&job.schedule),
        device: device_of(job),
        stages: StageNames {
            rollout: rollout.name.clone(),
            train: train.name.clone(),
            eval: m.first_of_kind("evaluate").map_or_else(|| "eval".into(), |e| e.name.clone()),
        },
    })
}

/// The rollout's TITO session rule (`None` without a session: the environment's default).
fn session_rule(rollout: &StageJob) -> Option<miles_runtime::session::Rule> {
    match rollout.rollout.as_ref().and_then(|r| r.session_rule.as_deref())? {
        "branching" => Some(miles_runtime::session::Rule::Branching),
        _ => Some(miles_runtime::session::Rule::Linear),
    }
}

/// The trainer's settings; `max_new_tokens` is the rollout's (Dr. GRPO's constant normaliser and
/// the overlong punishment's default length).
fn train_spec(
    m: &Mapper,
    train: &StageJob,
    t: &job::TrainJob,
    seed: u64,
    partial_credit: bool,
    max_new_tokens: usize,
) -> TrainSpec {
    let opt = t.optimizer.as_ref();
    let o = |f: fn(&job::OptimizerJob) -> f64, default: f64| opt.map_or(default, f);
    let count = |v: Option<miles_compiler::Spanned<u64>>| v.map_or(0, |v| v.value) as usize;
    TrainSpec {
        lr: t.lr.unwrap_or(0.0),
        weight_decay: o(|o| o.weight_decay, 0.0),
        beta1: o(|o| o.beta1, 0.9),
        beta2: o(|o| o.beta2, 0.999),
        eps: o(|o| o.eps, 1e-8),
        warmup_steps: opt.map_or(0, |o| o.warmup),
        decay: match opt.and_then(|o| o.decay.as_deref()) {
            Some("linear") => Decay::Linear,
            Some("cosine") => Decay::Cosine,
            _ => Decay::None,
        },
        min_lr_ratio: 0.0,
        clip_low: t.clip_low,
        clip_high: t.clip_high,
        kl_coef: t.kl_coef,
        tis_cap: t.tis,
        entropy_coef: t.entropy_coef,
        std_norm: t.std_norm,
        aggregation: match t.aggregation.as_deref() {
            Some("sequence") => Aggregation::Sequence,
            Some("micro_token") => Aggregation::MicroToken,
            Some("constant") => Aggregation::Constant { tokens: max_new_tokens },
            _ => Aggregation::Token,
        },
        epochs: t.epochs.value.max(1) as usize,
        ratio: match t.ratio.as_deref() {
            Some("sequence") => RatioLevel::Sequence,
            _ => RatioLevel::Token,
        },
        advantage: match t.advantage.as_deref() {
            Some("rloo") => AdvantageEstimator::Rloo,
            Some("reinforce_pp") => AdvantageEstimator::ReinforcePp,
            _ => AdvantageEstimator::Grpo,
        },
        mis: t.mis.map(|(low, high)| MisSpec { low, high }),
        overlong: t.overlong.as_ref().map(|o| OverlongSpec {
            max: o.max.map_or(max_new_tokens, |v| v as usize),
            cache: o.cache as usize,
            penalty: o.penalty,
        }),
        grad_clip: t.grad_clip,
        micro_batch: count(t.micro_batch),
        global_batch: count(t.global_batch),
        lora: t.lora.as_ref().map(|l| task::lora_spec(l, seed, partial_credit)),
        opd: m.opd_spec(train),
        dp: t.backend.as_ref().and_then(data_parallel),
        precision: embedded_precision(
            t.backend.as_ref().map(|b| b.schema.as_str()),
            t.backend.as_ref().and_then(|b| b.precision).map(|p| p.value),
            "embedded_trainer",
        ),
        ppo: t.ppo.as_ref().map(|p| PpoSpec {
            critic_lr: p.critic_lr,
            gamma: p.gamma,
            lambda: p.lambda,
            value_clip: p.value_clip,
            rollout_logprobs: p.rollout_logprobs,
        }),
    }
}

/// `embedded_trainer { dp, zero, dp_bucket, collective_timeout }` when it asks for more than one
/// rank; one rank is the single-process trainer, with no collectives at all. The stdlib gives
/// every field of an `embedded_trainer` a default, so each is present where the ranks are.
fn data_parallel(b: &job::BackendJob) -> Option<DataParallelSpec> {
    Some(DataParallelSpec {
        ranks: b.embedded_ranks()?.value as usize,
        zero: match b.zero?.value {
            job::Zero::None => ZeroStage::None,
            job::Zero::Optimizer => ZeroStage::Optimizer,
        },
        bucket_bytes: b.dp_bucket?.value,
        timeout_s: b.collective_timeout?.value as f64,
    })
}

/// The `local` cluster's `device` (a spec without one computes on the CPU).
fn device_of(job: &Job) -> DeviceSpec {
    job.device.as_ref().and_then(|d| DeviceSpec::parse(&d.value)).unwrap_or_default()
}

/// `sync { filter = drop_flat, max_rounds }`: DAPO's dynamic sampling.
fn dynamic_sampling(s: &job::ScheduleJob) -> Option<DynamicSampling> {
    s.dynamic_rounds().map(|n| DynamicSampling { max_rounds: n.min(u64::from(u32::MAX)) as u32 })
}

/// The recipe's `schedule` setting (std/prelude: sync, one_step_off, fully_async).
fn schedule_spec(s: &job::ScheduleJob) -> ScheduleSpec {
    match s.mode.value.as_str() {
        "one_step_off" => ScheduleSpec::OneStepOff,
        "fully_async" => {
            let d = AsyncSpec::default();
            let action = |a: &Option<String>| match a.as_deref() {
                Some("discard") => DropAction::Discard,
                _ => DropAction::Retry,
            };
            ScheduleSpec::FullyAsync(AsyncSpec {
                max_staleness: s.max_staleness.map_or(d.max_staleness, |v| v.value),
                max_concurrent: s.max_concurrent.map_or(d.max_concurrent, |v| v.value as usize),
                refill: match s.refill.as_deref() {
                    Some("per_group") => Refill::PerGroup,
                    _ => Refill::PerSample,
                },
                buffer_capacity: s.buffer_capacity.map_or(d.buffer_capacity, |v| v.value as usize),
                update_interval: s.update_interval.unwrap_or(d.update_interval),
                pause: match s.pause.as_deref() {
                    Some("retract") => PauseMode::Retract,
                    Some("abort") => PauseMode::Abort,
                    _ => PauseMode::InPlace,
                },
                on_stale: action(&s.on_stale),
                on_abort: action(&s.on_abort),
                starvation_retries: s.starvation_retries.map_or(d.starvation_retries, |v| v as u32),
                filter: match s.filter.as_deref() {
                    Some("drop_flat") => GroupFilter::DropFlat,
                    _ => GroupFilter::KeepAll,
                },
                staleness_gate: s.staleness_gate.unwrap_or(d.staleness_gate),
                stall_timeout_s: s.stall_timeout_s.unwrap_or(d.stall_timeout_s),
            })
        }
        _ => ScheduleSpec::Sync,
    }
}
