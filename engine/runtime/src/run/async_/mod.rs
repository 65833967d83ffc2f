//! The asynchronous executor (`one_step_off` and `fully_async` schedules, docs/async.md).
//!
//! Two threads share one mutex-protected [`State`] (the buffer, the data source, the weights
//! waiting for the engine, evaluation requests) and one condition variable:
//!
//! - the **generation thread** owns the [`StreamEngine`]: it admits prompts while the buffer has
//!   room, keeps up to `max_concurrent` samples in flight (refilled per sample or per group),
//!   scores each finished group and buffers it, and swaps weights between two engine steps
//!   according to `pause`;
//! - the **trainer** (the caller's thread) draws `rollout_batch` groups per step (stale ones are
//!   dropped on the way), trains, pushes weights every `update_interval` steps, evaluates,
//!   checkpoints (the data source with it) and writes `rollout/fully_async/*` metrics.
//!
//! Weight versions count the updates pushed to the engine (0 = the weights the run starts from).
//! Every wait is bounded by `stall_timeout_s` and fails with E0509 naming the stage that stopped
//! answering.

//! Its parts: this file starts and ends a run and holds the shared state; `generate` is the
//! generation thread, `train` the trainer's loop, `eval` the evaluations beside training.

mod eval;
mod generate;
mod train;

use crate::atomic_write::write_json;
use crate::backend::{AsyncParts, Backend, LocalHandoff, StreamEngine, Trainer, WeightSnapshot, WeightTransport};
use crate::buffer::Buffer;
use crate::reward::BatchReward;
use crate::run::step::checkpoint::{is_checkpoint_of, save_checkpoint, save_final_model};
use crate::run::step::episodes::EnvRunner;
use crate::run::step::open::{start_fresh, summary, Outputs, Position};
use crate::run::step::score::SharedReward;
use crate::run::step::teacher::TeacherStage;
use crate::schedule::{AsyncSpec, EvalMode};
use crate::source::{PromptSource, SourceState};
use crate::spec::{RunOptions, RunSpec, Summary};
use crate::tasks::TaskSet;
use crate::{RunError, E_BACKEND, E_CHECKPOINT, E_SPEC, E_TIMEOUT};
use eval::{acc_metrics, evaluate_stream, write_eval_row, EvalResult, EvalRunner};
use generate::generation_loop;
use serde_json::{json, Map};
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use train::{train_loop, TrainProgress};

/// The executor's own checkpoint file, beside the trainer's files and state.json.
const ASYNC_FILE: &str = "async.json";

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct AsyncCkpt {
    /// Weight updates pushed so far (the engine's version after a resume).
    version: u64,
    source: SourceState,
}

/// Counters the generation thread adds to and the trainer takes once per step.
#[derive(Debug, Default, Clone)]
struct GenCounters {
    /// Seconds the engine was stepping.
    busy_s: f64,
    /// Seconds the generation thread had nothing in flight (buffer full, or waiting to swap).
    idle_s: f64,
    /// Integral of samples in flight over engine time (sample-seconds).
    in_flight_integral: f64,
    tokens: u64,
    samples: u64,
    served_starving: u64,
    served_retry: u64,
    /// Oldest age (steps since first served) of the retried prompts served.
    retry_age_max: u64,
    /// Weight swaps and the seconds generation spent in them (incl. draining for one).
    swaps: u64,
    swap_s: f64,
    /// The episodes of groups discarded because none of them trains (every episode faulted and
    /// was dropped): the step's row counts them with the drawn groups' (docs/agents.md).
    discarded: Vec<crate::env::EpisodeResult>,
}

struct State {
    buffer: Buffer,
    source: PromptSource,
    /// Training step in progress (prompts served now record it as their first step).
    step: u64,
    /// Weight updates pushed (the current version for the staleness rule).
    version: u64,
    /// The newest weights the engine has not loaded yet (an older unloaded one is replaced).
    weights: Option<Arc<WeightSnapshot>>,
    /// Shared-mode evaluations requested (training steps), oldest first.
    eval_requests: VecDeque<u64>,
    eval_results: Vec<EvalResult>,
    counters: GenCounters,
    /// Groups the trainer has drawn since step 0 (a resumed run starts at step x rollout_batch).
    drawn_total: u64,
    stop: bool,
    gen_error: Option<RunError>,
    gen_done: bool,
}

impl State {
    /// Whether generation may start another group: the buffer has room, and the group would not
    /// be stale when its turn comes (staleness-aware admission, as in AReaL). Groups are drawn in
    /// order, so the k-th group (0-based, counting every group drawn since step 0) is trained at
    /// step k / rollout_batch + 1, under version (k / rollout_batch) / update_interval; started
    /// now, under `version`, it is fresh enough while k < (version + max_staleness + 1) x
    /// update_interval x rollout_batch. Without this gate a fast engine fills the buffer with
    /// groups that can only go stale, burning the cores the trainer needs.
    fn may_admit(&self, cfg: &AsyncSpec, rollout_batch: usize) -> bool {
        let k = self.drawn_total + self.buffer.len() as u64 + self.buffer.in_flight() as u64;
        let limit = self
            .version
            .saturating_add(cfg.max_staleness)
            .saturating_add(1)
            .saturating_mul(cfg.update_interval)
            .saturating_mul(rollout_batch as u64);
        self.buffer.has_room() && (!cfg.staleness_gate || k < limit)
    }
}

struct Shared {
    st: Mutex<State>,
    cv: Condvar,
}

impl Shared {
    /// A poisoned lock means the other thread panicked inside the backend; its state is still
    /// consistent for our purposes (the error is reported by the join), so carry on.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn timeout_err(msg: String) -> RunError {
    RunError::new(E_TIMEOUT, msg).with_help(
        "the stage named is stuck or far slower than the other; raise schedule.stall_timeout_s if it is only slow",
    )
}

pub(crate) fn run(
    spec: &RunSpec,
    opts: &RunOptions,
    backend: &dyn Backend,
    task: TaskSet,
    started: Instant,
) -> Result<Summary, RunError> {
    let r = &spec.rollout;
    let Some(cfg) = spec.async_schedule() else {
        return Err(RunError::internal("the asynchronous executor was given the sync schedule"));
    };
    let out = &opts.out_dir;
    let mut outs = Outputs::open(spec, opts)?;
    backend.set_threads(opts.threads);
    let Some(parts) = backend.create_async(spec)? else {
        return Err(RunError::new(E_SPEC, format!("the `{}` backend runs only the sync schedule", backend.name()))
            .with_help("set schedule = sync, or run in-process on the embedded backend"));
    };
    let AsyncParts { mut engine, mut trainer, eval_engine } = parts;
    let mut teacher = TeacherStage::for_run(spec, backend)?;
    let mut transport: Box<dyn WeightTransport> = Box::new(LocalHandoff);
    let task = Arc::new(task);
    // The run's one reward: evaluations on this thread (the first and the last), the generation
    // thread's rollouts and shared evaluations, and a snapshot evaluation thread's all score
    // through it.
    let reward = SharedReward::for_run(spec)?;
    let mut main = MainEval { reward: reward.boxed(), env: EnvRunner::for_run(spec)? };
    if let Some(e) = &main.env {
        e.env.keep_log_in(&crate::run::sync::env_log_dir(out));
    }

    let (start, version, source) =
        open(spec, opts, &cfg, &mut outs, trainer.as_mut(), transport.as_mut(), engine.as_mut(), &task, &mut main)?;
    let Position { mut step, eval_start, mut eval_last, mut last_ckpt } = start;
    let Outputs { ckpt_root, metrics_path, mut metrics, mut samples, mut progress, .. } = outs;

    let shared = Arc::new(Shared {
        st: Mutex::new(State {
            buffer: Buffer::new(cfg.buffer_capacity),
            source,
            step: step + 1,
            version,
            weights: None,
            eval_requests: VecDeque::new(),
            eval_results: Vec::new(),
            counters: GenCounters::default(),
            drawn_total: step * r.rollout_batch as u64,
            stop: false,
            gen_error: None,
            gen_done: false,
        }),
        cv: Condvar::new(),
    });
    let stall = Duration::from_secs_f64(cfg.stall_timeout_s);

    // The generation thread. It hands the engine back when it stops, for the final evaluation.
    let engine_rx = spawn_generation(&shared, engine, reward.boxed(), spec, &cfg, &task, (opts.threads, out))?;
    let mut evals = EvalRunner::start(spec, &cfg, eval_engine, reward.boxed(), &task, out, opts.threads)?;

    let result = train_loop(
        spec,
        opts,
        &cfg,
        &shared,
        trainer.as_mut(),
        teacher.as_mut(),
        transport.as_mut(),
        &mut evals,
        &mut metrics,
        (&mut samples, &task),
        &mut progress,
        TrainProgress { step: &mut step, eval_start, eval_last: &mut eval_last, last_ckpt: &mut last_ckpt },
        &ckpt_root,
        started,
    );
    // Stop generation whatever happened, and wait (bounded) for the engine to come back.
    {
        shared.lock().stop = true;
        shared.cv.notify_all();
    }
    let engine_back = engine_rx.recv_timeout(stall);
    let (stopped_early, last_reward) = result?;
    let mut engine = engine_back.map_err(|_| {
        timeout_err(format!(
            "the rollout stage `{}` did not stop within {:.0} s after training ended",
            spec.stages.rollout,
            stall.as_secs_f64()
        ))
    })?;
    if let Some(e) = shared.lock().gen_error.take() {
        return Err(e);
    }
    // Requests still in flight belong to groups the final checkpoint serves again.
    let _ = engine.abort_all();
    // Ctrl-C: a checkpoint at the step reached, generation stopped (its groups in flight are in it).
    let interrupted = stopped_early && opts.interrupted();
    if interrupted && !is_checkpoint_of(&last_ckpt, step) {
        last_ckpt = Some(checkpoint(spec, &ckpt_root, &shared, step, eval_start, eval_last, trainer.as_ref())?);
    }

    if !stopped_early {
        // The final evaluation, on exactly the final weights (the engine may lag an update).
        let done = final_evals(
            spec,
            &task,
            &shared,
            engine.as_mut(),
            trainer.as_ref(),
            transport.as_mut(),
            &mut main,
            &mut evals,
            step,
            stall,
        )?;
        for r in done {
            if let Some(acc) = write_eval_row(&mut metrics, &r, step)? {
                if r.step == step {
                    eval_last = Some(acc);
                    progress.eval(step, acc);
                }
            }
        }
        last_ckpt = Some(checkpoint(spec, &ckpt_root, &shared, step, eval_start, eval_last, trainer.as_ref())?);
        save_final_model(out, trainer.as_ref(), &task)?;
    }
    let at = Position { step, eval_start, eval_last, last_ckpt };
    Ok(summary(at, last_reward, stopped_early, interrupted, metrics_path, started, &mut progress))
}

/// The reward and environment of the evaluations on the executor's thread (the first and the
/// last); the generation thread builds its own. Made reward first; dropped environment first.
struct MainEval {
    env: Option<EnvRunner>,
    reward: Box<dyn BatchReward>,
}

/// Where the run starts (its position, the weight version, the data source): the checkpoint it
/// resumes from (the executor's own file beside the trainer's), or a fresh run's opening.
#[allow(clippy::too_many_arguments)]
fn open(
    spec: &RunSpec,
    opts: &RunOptions,
    cfg: &AsyncSpec,
    outs: &mut Outputs,
    trainer: &mut dyn Trainer,
    transport: &mut dyn WeightTransport,
    engine: &mut dyn StreamEngine,
    task: &TaskSet,
    main: &mut MainEval,
) -> Result<(Position, u64, PromptSource), RunError> {
    Ok(match outs.resume_from.take() {
        Some((dir, st)) => {
            let p = dir.join(ASYNC_FILE);
            let text = std::fs::read_to_string(&p).map_err(|e| RunError::io(E_CHECKPOINT, "cannot read", &p, e))?;
            let ac: AsyncCkpt = serde_json::from_str(&text)
                .map_err(|e| RunError::new(E_CHECKPOINT, format!("{}: {e}", p.display())))?;
            trainer.load(&dir)?;
            let mut w = transport.transfer(trainer.export_weights()?)?;
            w.version = ac.version;
            engine.load_weights(&w)?;
            outs.progress.note(&format!(
                "resumed from {} (step {}, weight version {})",
                dir.display(),
                st.step,
                ac.version
            ));
            (Position::resumed(dir, &st), ac.version, PromptSource::from_state(ac.source, cfg.starvation_retries))
        }
        None => {
            let source = PromptSource::new(cfg.starvation_retries);
            let snap = AsyncCkpt { version: 0, source: source.state([]) };
            let mut row = Map::new();
            row.insert("eval/lag_steps".into(), json!(0));
            let start = start_fresh(
                spec,
                task,
                trainer,
                transport,
                outs,
                engine,
                |e, mut w| {
                    w.version = 0;
                    e.load_weights(&w)?;
                    e.bind_thread(opts.threads);
                    Ok(())
                },
                |e, _| evaluate_stream(spec, task, main.reward.as_mut(), main.env.as_ref(), e),
                row,
                |d| write_json(&d.join(ASYNC_FILE), &snap),
            )?;
            (start, 0, source)
        }
    })
}

/// Starts the generation thread with the engine; the receiver gets the engine back when the
/// thread stops.
fn spawn_generation(
    shared: &Arc<Shared>,
    mut engine: Box<dyn StreamEngine>,
    reward: Box<dyn BatchReward>,
    spec: &RunSpec,
    cfg: &AsyncSpec,
    task: &Arc<TaskSet>,
    (threads, out): (Option<usize>, &Path),
) -> Result<Receiver<Box<dyn StreamEngine>>, RunError> {
    let out = out.to_path_buf();
    let (engine_tx, engine_rx) = std::sync::mpsc::channel::<Box<dyn StreamEngine>>();
    let shared = shared.clone();
    let task = task.clone();
    let spec = spec.clone();
    let cfg = cfg.clone();
    std::thread::Builder::new()
        .name("miles-generation".into())
        .spawn(move || {
            engine.bind_thread(threads);
            let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                generation_loop(&shared, engine.as_mut(), reward, &spec, &cfg, (&task, &out))
            }));
            let err = match res {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(e),
                Err(_) => Some(RunError::internal("the generation thread panicked")),
            };
            {
                let mut st = shared.lock();
                st.gen_error = err;
                st.gen_done = true;
            }
            shared.cv.notify_all();
            let _ = engine_tx.send(engine);
        })
        .map_err(|e| RunError::new(E_BACKEND, format!("cannot start the generation thread: {e}")))?;
    Ok(engine_rx)
}

/// The evaluations a finished run still owes, the final one included: on the shared engine (with
/// the final weights loaded when it lags them), or requested from the snapshot or external
/// runner; then every evaluation still running, and those the generation thread finished.
#[allow(clippy::too_many_arguments)]
fn final_evals(
    spec: &RunSpec,
    task: &TaskSet,
    shared: &Shared,
    engine: &mut dyn StreamEngine,
    trainer: &dyn Trainer,
    transport: &mut dyn WeightTransport,
    main: &mut MainEval,
    evals: &mut EvalRunner,
    step: u64,
    stall: Duration,
) -> Result<Vec<EvalResult>, RunError> {
    let pending = shared.lock().weights.take();
    let version = shared.lock().version;
    let t0 = Instant::now();
    let res = match spec.eval.mode {
        EvalMode::Shared => {
            if pending.is_some() || engine.weight_version() != version {
                let mut w = transport.transfer(trainer.export_weights()?)?;
                w.version = version;
                engine.load_weights(&w)?;
            }
            let acc = evaluate_stream(spec, task, main.reward.as_mut(), main.env.as_ref(), engine)?;
            Some(EvalResult { step, metrics: acc_metrics(acc), seconds: t0.elapsed().as_secs_f64() })
        }
        _ => {
            evals.request(step, trainer, transport)?;
            None
        }
    };
    let mut done: Vec<EvalResult> = res.into_iter().collect();
    done.extend(evals.finish(stall)?);
    done.append(&mut shared.lock().eval_results);
    Ok(done)
}

/// The data source and the prompts buffered or in flight, as one consistent snapshot.
fn checkpoint(
    spec: &RunSpec,
    root: &Path,
    shared: &Shared,
    step: u64,
    eval_start: Option<f64>,
    eval_last: Option<f64>,
    trainer: &dyn Trainer,
) -> Result<PathBuf, RunError> {
    let snap = {
        let st = shared.lock();
        AsyncCkpt { version: st.version, source: st.source.state(st.buffer.unfinished()) }
    };
    save_checkpoint(root, spec, step, eval_start, eval_last, trainer, |d| write_json(&d.join(ASYNC_FILE), &snap))
}
