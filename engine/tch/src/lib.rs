//! The embedded libtorch backend of miles (CPU, fp32): a Llama-style policy, batched sampling with
//! a KV cache, GRPO, PPO with a learned critic (`critic`) and SFT training, and LoRA adapters (`lora`). Implements the traits of `miles-runtime`.
//!
//! Entry point for the CLI: [`run`] (a `RunSpec` plus `RunOptions`), or [`TchBackend`] with
//! `miles_runtime::run_with`.

pub mod cli;
pub mod critic;
pub mod device;
pub mod diffusion;
pub mod generate;
pub mod hf;
pub mod invariant;
pub mod lora;
pub mod model;
pub mod moe;
pub mod stream;
pub mod teacher;
mod torch_version;
pub mod train;

use miles_runtime::tasks::TokenId;
use miles_runtime::{
    Backend, RolloutEngine, RunError, RunOptions, RunSpec, Sample, SamplingParams, SftStats, Summary, TrainStats,
    Trainer, Trajectory, WeightSnapshot, E_BACKEND,
};
use model::Policy;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

/// The `miles-engine` binary this process runs, which hosts a stage's worker process (a diffusion
/// reward, a teacher) when asked again with the worker's verb; `what` names the worker for the
/// error when this process is something else (a test binary).
pub fn engine_exe(what: &str) -> Result<std::path::PathBuf, RunError> {
    let exe =
        std::env::current_exe().map_err(|e| RunError::new(E_BACKEND, format!("cannot find miles-engine: {e}")))?;
    if exe.file_name().is_some_and(|n| n.to_string_lossy().starts_with("miles-engine")) {
        Ok(exe)
    } else {
        Err(RunError::new(
            miles_runtime::E_SPEC,
            format!(
                "a {what} worker process is started from the `miles-engine` binary: run the recipe with `miles run`"
            ),
        ))
    }
}

/// Runs a spec on the embedded backend.
pub fn run(spec: &RunSpec, opts: &RunOptions) -> Result<Summary, RunError> {
    miles_runtime::run_with(spec, opts, &TchBackend)
}

/// tch's non-`f_` tensor ops panic on libtorch errors. Shapes are validated up front, so a panic
/// here is a bug, but it must surface as an error (E0508), not abort the user's process.
fn guard<T>(what: &str, f: impl FnOnce() -> Result<T, RunError>) -> Result<T, RunError> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown panic".into());
            Err(RunError::new(E_BACKEND, format!("libtorch failed during {what}: {msg}")))
        }
    }
}

pub struct TchBackend;

/// The recipe's `device` for this process, chosen before its first tensor and said once.
pub fn select_device(spec: &RunSpec) -> Result<tch::Device, RunError> {
    static SAID: std::sync::Once = std::sync::Once::new();
    let (device, why) = device::select(spec.device)?;
    SAID.call_once(|| {
        if !(spec.device.is_cpu() && device == tch::Device::Cpu) {
            eprintln!("miles: computing on {why}");
        }
    });
    Ok(device)
}

/// The policy a run starts from: the spec's Hugging Face directory, else a seeded init. The
/// directory must still say what `miles check` read from it (`spec.model`). Worker processes
/// build their stages with it too, so a distributed run starts from the same weights.
pub fn initial_policy(spec: &RunSpec) -> Result<(Policy, Option<hf::HfMeta>), RunError> {
    select_device(spec)?;
    let Some(h) = &spec.hf else {
        let mut policy = Policy::init(&spec.model, spec.seed);
        policy.lora_spec = spec.train.lora.clone();
        attach_init(&mut policy, spec)?;
        return Ok((policy, None));
    };
    let (mut policy, meta) = Policy::load_hf(&h.path, Some(spec.model.max_len))?;
    policy.lora_spec = spec.train.lora.clone();
    attach_init(&mut policy, spec)?;
    if let Some(field) = hf::first_difference(&policy.cfg, &spec.model) {
        return Err(RunError::new(
            miles_runtime::E_CHECKPOINT,
            format!(
                "{}: config.json no longer matches the recipe's model ({field} differs); it changed after `miles check` read it",
                h.path.join("config.json").display()
            ),
        )
        .with_help("run `miles check` (or `miles run`) again on the recipe"));
    }
    Ok((policy, Some(meta)))
}

/// `lora { init }`: the adapter is attached before anything samples, so the engines, the
/// trainer and the KL reference all start from base + adapter (fresh adapters, B zero, wait
/// for the first training step: they change nothing before it).
fn attach_init(policy: &mut Policy, spec: &RunSpec) -> Result<(), RunError> {
    if spec.train.lora.as_ref().is_some_and(|l| l.init.is_some()) {
        policy.attach_lora()?;
    }
    Ok(())
}

impl Backend for TchBackend {
    fn name(&self) -> &'static str {
        "tch"
    }

    fn set_threads(&self, threads: Option<usize>) {
        if let Some(n) = threads {
            tch::set_num_threads(n.max(1) as i32);
        }
    }

    fn create(&self, spec: &RunSpec) -> Result<miles_runtime::EngineAndTrainer, RunError> {
        guard("model init", || {
            let (policy, source) = initial_policy(spec)?;
            let engine = TchEngine::for_run(&policy, spec)?;
            let trainer = train::TchTrainer::for_run(policy, spec, source);
            Ok((Box::new(engine) as Box<dyn RolloutEngine>, Box::new(trainer) as Box<dyn Trainer>))
        })
    }

    fn teacher(&self, spec: &RunSpec) -> Result<Box<dyn miles_runtime::TeacherScorer>, RunError> {
        guard("the teacher's load", || {
            Ok(Box::new(teacher::TchTeacher::for_run(spec)?) as Box<dyn miles_runtime::TeacherScorer>)
        })
    }

    /// Three copies of the weights, one per thread: the trainer's, the streaming engine's
    /// (continuous batching, `max_concurrent` slots) and, for snapshot evaluation, a batch engine's.
    fn create_async(&self, spec: &RunSpec) -> Result<Option<miles_runtime::AsyncParts>, RunError> {
        let Some(a) = spec.async_schedule() else {
            return Ok(None);
        };
        guard("model init", || {
            let (policy, source) = initial_policy(spec)?;
            let mut engine = stream::TchStreamEngine::new(engine_policy(&policy, spec)?, a.max_concurrent);
            engine.record = spec.rollout.r3.as_ref().map(|r| r.id);
            let eval_engine: Option<Box<dyn miles_runtime::EvalEngine>> =
                match spec.eval.mode == miles_runtime::EvalMode::Snapshot {
                    true => Some(Box::new(TchEngine::for_run(&policy, spec)?) as Box<dyn miles_runtime::EvalEngine>),
                    false => None,
                };
            let trainer = train::TchTrainer::for_run(policy, spec, source);
            Ok(Some(miles_runtime::AsyncParts { engine: Box::new(engine), trainer: Box::new(trainer), eval_engine }))
        })
    }
}

impl miles_runtime::EvalEngine for TchEngine {
    fn bind_thread(&mut self, threads: Option<usize>) {
        if let Some(n) = threads {
            tch::set_num_threads(n.max(1) as i32);
        }
    }
}

/// The rollout side: its own copy of the weights, replaced on each sync.
pub struct TchEngine {
    pub policy: Policy,
    pub version: u64,
    /// Off only to measure what the cache saves.
    pub use_cache: bool,
    /// R3: record routed experts in this id type (an MoE policy); None: do not.
    pub record: Option<miles_runtime::RouteId>,
}

impl TchEngine {
    pub fn new(policy: Policy) -> TchEngine {
        TchEngine { policy, version: 0, use_cache: true, record: None }
    }

    /// A run's engine: its own copy of `policy` in the rollout's precision, recording routing
    /// when the rollout asks for it (in process and in a `miles worker` alike).
    pub fn for_run(policy: &Policy, spec: &RunSpec) -> Result<TchEngine, RunError> {
        let mut e = TchEngine::new(engine_policy(policy, spec)?);
        e.record = spec.rollout.r3.as_ref().map(|r| r.id);
        Ok(e)
    }
}

/// The engine's copy of the weights: fp32, or bf16 (`precision = bf16`: weights and activations
/// rounded as production engines sample, while the trainer stays fp32).
pub fn engine_policy(policy: &Policy, spec: &RunSpec) -> Result<Policy, RunError> {
    let mut p = engine_copy(policy, spec)?;
    p.invariant = spec.rollout.batch_invariant;
    // The engine computes in its own `precision`, whatever the trainer's.
    p.bf16_matmuls = false;
    Ok(p)
}

fn engine_copy(policy: &Policy, spec: &RunSpec) -> Result<Policy, RunError> {
    match spec.rollout.precision {
        miles_runtime::Precision::Fp32 => Ok(policy.deep_copy()),
        miles_runtime::Precision::Bf16 if spec.train.lora.is_some() => Err(RunError::new(
            E_BACKEND,
            "a bf16 embedded engine does not run LoRA adapters (they stay fp32): sample in fp32 or train without LoRA",
        )),
        miles_runtime::Precision::Bf16 => Ok(policy.to_kind(tch::Kind::BFloat16)),
    }
}

impl RolloutEngine for TchEngine {
    fn generate(
        &mut self,
        prompts: &[Vec<TokenId>],
        n: usize,
        params: &SamplingParams,
    ) -> Result<Vec<Sample>, RunError> {
        guard("generation", || {
            generate::generate_recording(&self.policy, prompts, n, params, self.version, self.use_cache, self.record)
        })
    }

    fn weight_version(&self) -> u64 {
        self.version
    }

    fn load_weights(&mut self, weights: &WeightSnapshot) -> Result<(), RunError> {
        guard("weight load", || self.policy.load_snapshot(weights))?;
        self.version = weights.version;
        Ok(())
    }

    fn select_adapter(&mut self, i: usize) -> Result<(), RunError> {
        self.policy.select_adapter(i)
    }
}

impl Trainer for train::TchTrainer {
    fn train_rl(&mut self, batch: &[Trajectory], lrs: &[f64], temperature: f64) -> Result<TrainStats, RunError> {
        guard("training", || self.train_rl_impl(batch, lrs, temperature))
    }

    fn train_sft(&mut self, batch: &[(Vec<TokenId>, Vec<TokenId>)], lr: f64) -> Result<SftStats, RunError> {
        guard("SFT", || self.train_sft_impl(batch, lr))
    }

    fn reset_optimizer(&mut self) {
        train::TchTrainer::reset_optimizer(self)
    }

    fn freeze_reference(&mut self) -> Result<(), RunError> {
        guard("reference copy", || {
            train::TchTrainer::freeze_reference(self);
            Ok(())
        })
    }

    fn logprobs(
        &mut self,
        prompts: &[Vec<TokenId>],
        responses: &[Vec<TokenId>],
        temperature: f64,
    ) -> Result<Vec<Vec<f32>>, RunError> {
        guard("log-prob recomputation", || self.logprobs_impl(prompts, responses, temperature))
    }

    fn version(&self) -> u64 {
        train::TchTrainer::version(self)
    }

    fn export_weights(&self) -> Result<WeightSnapshot, RunError> {
        guard("weight export", || self.export())
    }

    fn export_full_weights(&self) -> Result<WeightSnapshot, RunError> {
        guard("weight export", || self.export_full())
    }

    fn select_adapter(&mut self, i: usize) -> Result<(), RunError> {
        train::TchTrainer::select_adapter(self, i)
    }

    fn save(&self, dir: &Path) -> Result<(), RunError> {
        guard("checkpoint save", || train::TchTrainer::save(self, dir))
    }

    fn load(&mut self, dir: &Path) -> Result<(), RunError> {
        guard("checkpoint load", || train::TchTrainer::load(self, dir))
    }

    fn save_model(&self, dir: &Path) -> Result<(), RunError> {
        guard("model save", || self.policy.write_hf(dir, self.source.as_ref()))
    }
}
