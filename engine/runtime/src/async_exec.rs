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

use crate::backend::*;
use crate::buffer::{Buffer, Group};
use crate::exec::{
    latest_checkpoint, non_finite, prepare_out_dir, run_sft, save_checkpoint_with, write_dir_atomically, write_json,
    Metrics,
};
use crate::progress::Progress;
use crate::rng::derive_seed;
use crate::schedule::{AsyncSpec, DropAction, EvalMode, PauseMode, Refill};
use crate::source::{Pending, PromptSource, Served, SourceState};
use crate::spec::{RunOptions, RunSpec, Summary};
use crate::stream::{GenRequest, StreamEngine, StreamSample};
use crate::tasks::{TaskItem, TaskSet, EOS};
use crate::*;
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The executor's own checkpoint file, beside the trainer's files and state.json.
const ASYNC_FILE: &str = "async.json";

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct AsyncCkpt {
    /// Weight updates pushed so far (the engine's version after a resume).
    version: u64,
    source: SourceState,
}

/// Names of the stages the run's waits depend on, for error messages.
struct Stages {
    rollout: &'static str,
    train: &'static str,
    eval: &'static str,
}

const STAGES: Stages = Stages { rollout: "rollout", train: "train", eval: "eval" };

/// What one held-out evaluation measured.
#[derive(Debug, Clone)]
struct EvalResult {
    /// Training step whose weights were evaluated.
    step: u64,
    metrics: Vec<(String, f64)>,
    seconds: f64,
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

/// The train prompt with id `id`: a pure function of the seed, so a resumed run serves the same.
fn prompt_item(task: &TaskSet, seed: u64, id: u64) -> TaskItem {
    task.train_batch(seed, "rollout-async", id, 1)
        .into_iter()
        .next()
        .unwrap_or(TaskItem { prompt: String::new(), label: String::new() })
}

pub(crate) fn run(
    spec: &RunSpec,
    opts: &RunOptions,
    backend: &dyn Backend,
    task: TaskSet,
    started: Instant,
) -> Result<Summary, RunError> {
    let r = &spec.rollout;
    let Some(cfg) = crate::schedule::resolve(&spec.schedule, r.rollout_batch, r.samples_per_prompt) else {
        return Err(RunError::new(E_SPEC, "the asynchronous executor was given the sync schedule"));
    };
    let out = &opts.out_dir;
    let ckpt_root = out.join("checkpoints");
    let metrics_path = out.join("metrics.jsonl");
    prepare_out_dir(spec, opts)?;

    backend.set_threads(opts.threads);
    let Some(parts) = backend.create_async(spec)? else {
        return Err(RunError::new(E_SPEC, format!("the `{}` backend runs only the sync schedule", backend.name()))
            .with_help("set schedule = sync, or run in-process on the embedded backend"));
    };
    let AsyncParts { mut engine, mut trainer, eval_engine } = parts;
    let mut transport: Box<dyn WeightTransport> = Box::new(LocalHandoff);
    let task = Arc::new(task);

    let resume_from = if opts.resume { latest_checkpoint(&ckpt_root)? } else { None };
    let mut metrics = Metrics::open(&metrics_path, resume_from.as_ref().map(|c| c.1.step))?;
    let mut progress = Progress::new(opts.progress, spec.steps);

    let (mut step, eval_start, mut eval_last, version, source);
    let mut last_ckpt: Option<PathBuf> = None;
    if let Some((dir, st)) = resume_from {
        if st.spec != *spec {
            return Err(RunError::new(
                E_OUT_DIR,
                format!("{} holds a checkpoint of a different run spec; resume needs the same spec", dir.display()),
            ));
        }
        let p = dir.join(ASYNC_FILE);
        let text = std::fs::read_to_string(&p).map_err(|e| RunError::io(E_CHECKPOINT, "cannot read", &p, e))?;
        let ac: AsyncCkpt =
            serde_json::from_str(&text).map_err(|e| RunError::new(E_CHECKPOINT, format!("{}: {e}", p.display())))?;
        trainer.load(&dir)?;
        step = st.step;
        eval_start = st.eval_start;
        eval_last = st.eval_last;
        version = ac.version;
        source = PromptSource::from_state(ac.source, cfg.starvation_retries);
        let mut w = transport.transfer(trainer.export_weights()?)?;
        w.version = version;
        engine.load_weights(&w)?;
        progress.note(&format!("resumed from {} (step {step}, weight version {version})", dir.display()));
        last_ckpt = Some(dir);
    } else {
        step = 0;
        version = 0;
        source = PromptSource::new(cfg.starvation_retries);
        if let Some(sft) = &spec.sft {
            run_sft(spec, sft, &task, trainer.as_mut(), &mut metrics, &mut progress)?;
        }
        trainer.reset_optimizer();
        if spec.train.kl_coef > 0.0 {
            trainer.freeze_reference()?;
        }
        let mut w = transport.transfer(trainer.export_weights()?)?;
        w.version = 0;
        engine.load_weights(&w)?;
        engine.bind_thread(opts.threads);
        let t0 = Instant::now();
        let acc = evaluate_stream(spec, &task, engine.as_mut())?;
        let mut row = Map::new();
        row.insert("step".into(), json!(0));
        row.insert("eval/accuracy".into(), json!(acc.0));
        row.insert("eval/response_len".into(), json!(acc.1));
        row.insert("eval/lag_steps".into(), json!(0));
        row.insert("perf/eval_s".into(), json!(t0.elapsed().as_secs_f64()));
        metrics.write(&row)?;
        eval_start = Some(acc.0);
        eval_last = Some(acc.0);
        progress.eval(0, acc.0);
        if spec.checkpoint.every > 0 {
            let snap = AsyncCkpt { version, source: source.state([]) };
            last_ckpt =
                Some(save_checkpoint_with(&ckpt_root, spec, 0, eval_start, eval_last, trainer.as_ref(), |d| {
                    write_json(&d.join(ASYNC_FILE), &snap)
                })?);
        }
    }

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
    let (engine_tx, engine_rx) = std::sync::mpsc::channel::<Box<dyn StreamEngine>>();
    {
        let shared = shared.clone();
        let task = task.clone();
        let spec = spec.clone();
        let cfg = cfg.clone();
        let threads = opts.threads;
        std::thread::Builder::new()
            .name("miles-generation".into())
            .spawn(move || {
                engine.bind_thread(threads);
                let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    generation_loop(&shared, engine.as_mut(), &spec, &cfg, &task)
                }));
                let err = match res {
                    Ok(Ok(())) => None,
                    Ok(Err(e)) => Some(e),
                    Err(_) => {
                        Some(RunError::new(E_BACKEND, "the generation thread panicked (a bug; please report it)"))
                    }
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
    }
    let mut evals = EvalRunner::start(spec, &cfg, eval_engine, &task, out, opts.threads)?;

    let result = train_loop(
        spec,
        opts,
        &cfg,
        &shared,
        trainer.as_mut(),
        transport.as_mut(),
        &mut evals,
        &mut metrics,
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
            STAGES.rollout,
            stall.as_secs_f64()
        ))
    })?;
    if let Some(e) = shared.lock().gen_error.take() {
        return Err(e);
    }
    // Requests still in flight belong to groups the final checkpoint serves again.
    let _ = engine.abort_all();

    if !stopped_early {
        // The final evaluation, on exactly the final weights (the engine may lag an update).
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
                let acc = evaluate_stream(spec, &task, engine.as_mut())?;
                Some(EvalResult { step, metrics: acc_metrics(acc), seconds: t0.elapsed().as_secs_f64() })
            }
            _ => {
                evals.request(step, trainer.as_ref(), transport.as_mut())?;
                None
            }
        };
        let mut done: Vec<EvalResult> = res.into_iter().collect();
        done.extend(evals.finish(stall)?);
        done.append(&mut shared.lock().eval_results);
        for r in done {
            if let Some(acc) = write_eval_row(&mut metrics, &r, step)? {
                if r.step == step {
                    eval_last = Some(acc);
                    progress.eval(step, acc);
                }
            }
        }
        last_ckpt = Some(checkpoint(spec, &ckpt_root, &shared, step, eval_start, eval_last, trainer.as_ref())?);
        crate::exec::save_final_model(out, trainer.as_ref(), &task)?;
    }
    progress.finish(eval_start, eval_last);
    Ok(Summary {
        steps_done: step,
        eval_start,
        eval_end: eval_last,
        last_reward,
        checkpoint: last_ckpt,
        metrics_path,
        wall_seconds: started.elapsed().as_secs_f64(),
        stopped_early,
    })
}

fn acc_metrics(acc: (f64, f64)) -> Vec<(String, f64)> {
    vec![("accuracy".into(), acc.0), ("response_len".into(), acc.1)]
}

/// Writes one evaluation as its own row at the step it measured; returns its accuracy.
fn write_eval_row(metrics: &mut Metrics, r: &EvalResult, now: u64) -> Result<Option<f64>, RunError> {
    let mut row = Map::new();
    row.insert("step".into(), json!(r.step));
    for (k, v) in &r.metrics {
        row.insert(format!("eval/{k}"), json!(v));
    }
    row.insert("eval/lag_steps".into(), json!(now.saturating_sub(r.step)));
    row.insert("perf/eval_s".into(), json!(r.seconds));
    metrics.write(&row)?;
    Ok(r.metrics.iter().find(|(k, _)| k == "accuracy").map(|(_, v)| *v))
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
    save_checkpoint_with(root, spec, step, eval_start, eval_last, trainer, |d| write_json(&d.join(ASYNC_FILE), &snap))
}

struct TrainProgress<'a> {
    step: &'a mut u64,
    eval_start: Option<f64>,
    eval_last: &'a mut Option<f64>,
    last_ckpt: &'a mut Option<PathBuf>,
}

/// The trainer's loop; returns (stopped early, last step's mean reward).
#[allow(clippy::too_many_arguments)]
fn train_loop(
    spec: &RunSpec,
    opts: &RunOptions,
    cfg: &AsyncSpec,
    shared: &Shared,
    trainer: &mut dyn Trainer,
    transport: &mut dyn WeightTransport,
    evals: &mut EvalRunner,
    metrics: &mut Metrics,
    progress: &mut Progress,
    tp: TrainProgress<'_>,
    ckpt_root: &Path,
    started: Instant,
) -> Result<(bool, Option<f64>), RunError> {
    let r = &spec.rollout;
    let opt_per_step = spec.optimizer_steps_per_rl_step() as u64;
    let total_opt = opt_per_step * spec.steps;
    let stall = Duration::from_secs_f64(cfg.stall_timeout_s);
    let mut last_reward = None;
    let mut steps_this_run = 0u64;
    let step = tp.step;
    while *step < spec.steps {
        if opts.stop_after.is_some_and(|n| steps_this_run >= n) {
            return Ok((true, last_reward));
        }
        if let Some(limit) = opts.max_wall {
            if started.elapsed() > limit {
                return Err(RunError::new(
                    E_TIMEOUT,
                    format!("the run's wall-time limit ({:.0} s) expired after step {step}", limit.as_secs_f64()),
                )
                .with_help("resume with --resume to continue from the last checkpoint"));
            }
        }
        *step += 1;
        steps_this_run += 1;
        let t_step = Instant::now();

        // Draw a step's groups (stale ones are dropped on the way).
        let t_wait = Instant::now();
        let (groups, version) = draw(shared, r.rollout_batch, cfg, stall)?;
        let trainer_idle_s = t_wait.elapsed().as_secs_f64();

        let t_reward = Instant::now();
        let mut batch = Vec::new();
        let mut rewards = Vec::new();
        let mut group_of = Vec::new();
        for (gi, g) in groups.iter().enumerate() {
            for (s, &rw) in g.samples.iter().zip(&g.rewards) {
                rewards.push(rw);
                group_of.push(gi);
                batch.push(Trajectory {
                    prompt: g.prompt_tokens.clone(),
                    response: s.response.clone(),
                    rollout_logprobs: s.logprobs.clone(),
                    loss_mask: vec![1.0; s.response.len()],
                    reward: rw,
                    advantage: 0.0,
                    group: gi,
                    weight_version: s.oldest_version(),
                });
            }
        }
        let adv = grpo_advantages(&rewards, &group_of, spec.train.std_norm);
        for (t, a) in batch.iter_mut().zip(adv) {
            t.advantage = a;
        }
        let reward_s = t_reward.elapsed().as_secs_f64();
        let lrs: Vec<f64> =
            (0..opt_per_step).map(|j| lr_at(&spec.train, (*step - 1) * opt_per_step + j, total_opt)).collect();
        let t_train = Instant::now();
        let ts = trainer.train_rl(&batch, &lrs, r.temperature).map_err(|e| {
            if e.code == E_NONFINITE {
                non_finite(*step, tp.last_ckpt)
            } else {
                e
            }
        })?;
        let train_s = t_train.elapsed().as_secs_f64();
        if !ts.loss.is_finite() || !ts.grad_norm.is_finite() {
            return Err(non_finite(*step, tp.last_ckpt));
        }

        // Push weights every update_interval steps; the engine swaps them between two steps.
        let mut sync_s = 0.0;
        let mut sync_bytes = 0;
        if *step % cfg.update_interval == 0 || *step == spec.steps {
            let t_sync = Instant::now();
            let mut w = transport.transfer(trainer.export_weights()?)?;
            sync_bytes = w.bytes();
            let mut st = shared.lock();
            st.version += 1;
            w.version = st.version;
            st.weights = Some(Arc::new(w));
            drop(st);
            shared.cv.notify_all();
            sync_s = t_sync.elapsed().as_secs_f64();
        }

        // Evaluation: requested now, reported when it finishes (eval/lag_steps).
        let do_eval = *step < spec.steps && spec.eval.every > 0 && *step % spec.eval.every == 0;
        if do_eval {
            match spec.eval.mode {
                EvalMode::Shared => {
                    shared.lock().eval_requests.push_back(*step);
                    shared.cv.notify_all();
                }
                _ => evals.request(*step, trainer, transport)?,
            }
        }

        // Metrics.
        let (st_snapshot, counters) = {
            let mut st = shared.lock();
            st.step = *step + 1;
            let c = std::mem::take(&mut st.counters);
            let drops = std::mem::take(&mut st.buffer.drops);
            let waiting = st.buffer.waiting_staleness(version);
            let results: Vec<EvalResult> = st.eval_results.drain(..).collect();
            (
                (
                    st.buffer.len(),
                    st.buffer.in_flight(),
                    drops,
                    waiting,
                    st.source.queued(),
                    st.source.starving(),
                    st.version,
                    results,
                ),
                c,
            )
        };
        let (queue, in_flight_groups, drops, waiting, retry_queue, starving, cur_version, mut results) = st_snapshot;
        results.extend(evals.poll()?);
        let n = rewards.len().max(1) as f64;
        let reward_mean = rewards.iter().map(|&x| x as f64).sum::<f64>() / n;
        let gen_tokens: usize = groups.iter().flat_map(|g| &g.samples).map(|s| s.response.len()).sum();
        let staleness: Vec<u64> = groups.iter().map(|g| g.staleness(version)).collect();
        let mut hist = vec![0u64; staleness.iter().copied().max().map_or(0, |m| m as usize + 1)];
        for &s in &staleness {
            hist[s as usize] += 1;
        }
        let spans = groups.iter().flat_map(|g| &g.samples).filter(|s| s.versions.len() > 1).count();
        let flat = groups.iter().filter(|g| g.is_flat()).count();
        let mut row = Map::new();
        row.insert("step".into(), json!(*step));
        row.insert("weight_version".into(), json!(cur_version));
        row.insert("rollout/reward_mean".into(), json!(reward_mean));
        row.insert("rollout/solved_frac".into(), json!(rewards.iter().filter(|&&x| x >= 1.0).count() as f64 / n));
        row.insert("rollout/response_len".into(), json!(gen_tokens as f64 / n));
        row.insert(
            "rollout/stop_frac".into(),
            json!(groups.iter().flat_map(|g| &g.samples).filter(|s| s.finish == FinishReason::Stop).count() as f64 / n),
        );
        row.insert("rollout/flat_group_frac".into(), json!(flat as f64 / groups.len().max(1) as f64));
        let fa = |k: &str| format!("rollout/fully_async/{k}");
        row.insert(fa("queue_size"), json!(queue));
        row.insert(fa("groups_in_flight"), json!(in_flight_groups));
        row.insert(fa("dropped_aborted"), json!(drops.aborted));
        row.insert(fa("dropped_filtered"), json!(drops.filtered));
        row.insert(fa("dropped_stale"), json!(drops.stale));
        row.insert(fa("retried"), json!(drops.retried));
        row.insert(fa("retry_queue"), json!(retry_queue));
        row.insert(fa("starving_queue"), json!(starving));
        row.insert(fa("starving_served"), json!(counters.served_starving));
        row.insert(fa("retry_served"), json!(counters.served_retry));
        row.insert(fa("retry_age_max"), json!(counters.retry_age_max));
        let smax = staleness.iter().copied().max().unwrap_or(0);
        let smean = staleness.iter().sum::<u64>() as f64 / staleness.len().max(1) as f64;
        row.insert(fa("staleness_drawn_mean"), json!(smean));
        row.insert(fa("staleness_drawn_max"), json!(smax));
        row.insert(fa("staleness_drawn_hist"), json!(hist));
        row.insert(fa("staleness_waiting_mean"), json!(waiting.0));
        row.insert(fa("staleness_waiting_max"), json!(waiting.1));
        row.insert(fa("samples_spanning_versions"), json!(spans));
        let concurrency = counters.in_flight_integral / counters.busy_s.max(1e-9);
        row.insert(fa("concurrency_mean"), json!(concurrency));
        row.insert(fa("trainer_idle_s"), json!(trainer_idle_s));
        row.insert(fa("engine_idle_s"), json!(counters.idle_s));
        row.insert(fa("engine_busy_s"), json!(counters.busy_s));
        row.insert(fa("weight_swaps"), json!(counters.swaps));
        row.insert(fa("swap_s"), json!(counters.swap_s));
        row.insert("train/loss".into(), json!(ts.loss));
        row.insert("train/grad_norm".into(), json!(ts.grad_norm));
        row.insert("train/entropy".into(), json!(ts.entropy));
        row.insert("train/clip_frac".into(), json!(ts.clip_frac));
        row.insert("train/kl".into(), json!(ts.kl));
        row.insert("train/logp_diff".into(), json!(ts.logp_diff));
        row.insert("train/tis_weight".into(), json!(ts.tis_weight));
        row.insert("train/lr".into(), json!(lrs.last().copied().unwrap_or(0.0)));
        row.insert("train/tokens".into(), json!(ts.tokens));
        row.insert("perf/gen_tokens_per_s".into(), json!(counters.tokens as f64 / counters.busy_s.max(1e-9)));
        let trained: usize = batch.iter().map(|t| t.prompt.len() + t.response.len()).sum();
        row.insert("perf/train_tokens_per_s".into(), json!(trained as f64 / train_s.max(1e-9)));
        row.insert("perf/sync_s".into(), json!(sync_s));
        row.insert("perf/sync_bytes".into(), json!(sync_bytes));
        row.insert("perf/gen_s".into(), json!(counters.busy_s));
        row.insert("perf/reward_s".into(), json!(reward_s));
        row.insert("perf/train_s".into(), json!(train_s));
        row.insert("perf/logprob_s".into(), json!(ts.logprob_s));
        row.insert("perf/forward_s".into(), json!(ts.forward_s));
        row.insert("perf/backward_s".into(), json!(ts.backward_s));
        row.insert("perf/optimizer_s".into(), json!(ts.optimizer_s));
        row.insert("perf/gen_tokens".into(), json!(counters.tokens));
        row.insert("perf/trained_tokens".into(), json!(trained));
        row.insert("perf/step_s".into(), json!(t_step.elapsed().as_secs_f64()));
        metrics.write(&row)?;
        for res in &results {
            if let Some(acc) = write_eval_row(metrics, res, *step)? {
                *tp.eval_last = Some(acc);
                progress.eval(res.step, acc);
            }
        }
        last_reward = Some(reward_mean);
        progress.step(
            *step,
            reward_mean,
            counters.tokens as f64 / counters.busy_s.max(1e-9),
            trained as f64 / train_s.max(1e-9),
        );

        let ck = spec.checkpoint.every;
        if ck > 0 && *step % ck == 0 && *step < spec.steps {
            *tp.last_ckpt = Some(checkpoint(spec, ckpt_root, shared, *step, tp.eval_start, *tp.eval_last, trainer)?);
        }
    }
    Ok((false, last_reward))
}

/// Waits (bounded) for `n` groups that are not stale; returns them and the version they were
/// judged against.
fn draw(shared: &Shared, n: usize, cfg: &AsyncSpec, stall: Duration) -> Result<(Vec<Group>, u64), RunError> {
    let t0 = Instant::now();
    let mut got = Vec::with_capacity(n);
    let mut st = shared.lock();
    loop {
        if let Some(e) = st.gen_error.clone() {
            return Err(e);
        }
        let version = st.version;
        let State { buffer, source, drawn_total, .. } = &mut *st;
        let more = buffer.draw(n - got.len(), version, cfg.max_staleness, cfg.on_stale, source);
        *drawn_total += more.len() as u64;
        let freed = !more.is_empty() || buffer.drops.stale > 0;
        got.extend(more);
        if freed {
            shared.cv.notify_all();
        }
        if got.len() == n {
            return Ok((got, version));
        }
        if st.gen_done {
            return Err(RunError::new(
                E_BACKEND,
                format!("the rollout stage `{}` stopped before the trainer had its groups", STAGES.rollout),
            ));
        }
        let left = stall.saturating_sub(t0.elapsed());
        if left.is_zero() {
            return Err(timeout_err(format!(
                "the trainer (stage `{}`) waited {:.0} s for {n} groups; the rollout stage `{}` delivered {} \
                 ({} in flight, {} buffered; dropped so far: {} filtered, {} stale, {} aborted)",
                STAGES.train,
                stall.as_secs_f64(),
                STAGES.rollout,
                got.len(),
                st.buffer.in_flight(),
                st.buffer.len(),
                st.buffer.drops_total.filtered,
                st.buffer.drops_total.stale,
                st.buffer.drops_total.aborted,
            )));
        }
        st = shared
            .cv
            .wait_timeout(st, left.min(Duration::from_millis(200)))
            .map(|r| r.0)
            .unwrap_or_else(|p| p.into_inner().0);
    }
}

/// A group being generated.
struct Building {
    prompt: Pending,
    item: TaskItem,
    tokens: Vec<TaskId>,
    samples: Vec<Option<StreamSample>>,
    /// Requests not yet submitted (per-sample refill starts them as slots free up).
    unsubmitted: VecDeque<usize>,
    aborted: bool,
}

type TaskId = crate::tasks::TokenId;

struct Generator<'a> {
    spec: &'a RunSpec,
    cfg: &'a AsyncSpec,
    task: &'a TaskSet,
    building: BTreeMap<u64, Building>,
    /// Request id -> (prompt id, sample index).
    requests: HashMap<u64, (u64, usize)>,
    next_request: u64,
    slots: usize,
}

fn generation_loop(
    shared: &Shared,
    engine: &mut dyn StreamEngine,
    spec: &RunSpec,
    cfg: &AsyncSpec,
    task: &TaskSet,
) -> Result<(), RunError> {
    let mut g = Generator {
        spec,
        cfg,
        task,
        building: BTreeMap::new(),
        requests: HashMap::new(),
        next_request: 0,
        slots: engine.slots().min(cfg.max_concurrent).max(1),
    };
    let stall = Duration::from_secs_f64(cfg.stall_timeout_s);
    let mut blocked_since: Option<Instant> = None;
    let mut swap_started: Option<Instant> = None;
    loop {
        // Control: stop, weights to swap, shared evaluations. Weights come first (evaluation then
        // measures the newest pushed weights).
        let (stop, pending_w, eval_req) = {
            let st = shared.lock();
            (st.stop, st.weights.is_some(), st.eval_requests.front().copied())
        };
        if stop {
            return Ok(());
        }
        let mut hold_admission = false;
        if pending_w {
            swap_started.get_or_insert_with(Instant::now);
            let ready = match cfg.pause {
                PauseMode::InPlace => true,
                PauseMode::Retract | PauseMode::Abort => {
                    let action = if cfg.pause == PauseMode::Retract { DropAction::Retry } else { DropAction::Discard };
                    g.abort_all(shared, engine, action);
                    true
                }
                PauseMode::Drain => engine.in_flight() == 0 && g.building.is_empty(),
            };
            if ready {
                let w = shared.lock().weights.take();
                if let Some(w) = w {
                    engine.load_weights(&w)?;
                }
                let dt = swap_started.take().map_or(0.0, |t| t.elapsed().as_secs_f64());
                let mut st = shared.lock();
                st.counters.swaps += 1;
                st.counters.swap_s += dt;
            } else {
                hold_admission = true;
            }
        }
        if let Some(eval_step) = eval_req {
            // Shared-engine evaluation: no new generation while the requests in flight finish.
            if engine.in_flight() == 0 && g.building.is_empty() {
                let t0 = Instant::now();
                let acc = evaluate_stream(spec, task, engine)?;
                let mut st = shared.lock();
                st.eval_requests.pop_front();
                st.eval_results.push(EvalResult {
                    step: eval_step,
                    metrics: acc_metrics(acc),
                    seconds: t0.elapsed().as_secs_f64(),
                });
                st.counters.idle_s += t0.elapsed().as_secs_f64();
                continue;
            }
            hold_admission = true;
        }
        // Held: the groups already started still finish, no new one starts.
        g.admit(shared, engine, !hold_admission)?;
        if engine.in_flight() == 0 {
            // Nothing to do until the trainer draws (room), pushes weights or asks for an eval.
            let t0 = Instant::now();
            let since = *blocked_since.get_or_insert(t0);
            let mut st = shared.lock();
            let room = st.may_admit(cfg, spec.rollout.rollout_batch);
            if !room && since.elapsed() > stall {
                return Err(timeout_err(format!(
                    "generation waited {:.0} s for room in the buffer ({} groups) or a newer weight version: \
                     the trainer (stage `{}`) drew none",
                    stall.as_secs_f64(),
                    st.buffer.capacity(),
                    STAGES.train
                )));
            }
            if !st.stop && st.weights.is_none() && st.eval_requests.is_empty() && (!room || hold_admission) {
                st = shared
                    .cv
                    .wait_timeout(st, Duration::from_millis(100))
                    .map(|r| r.0)
                    .unwrap_or_else(|p| p.into_inner().0);
            }
            st.counters.idle_s += t0.elapsed().as_secs_f64();
            continue;
        }
        blocked_since = None;
        let before = engine.in_flight();
        let t0 = Instant::now();
        let finished = engine.step()?;
        let dt = t0.elapsed().as_secs_f64();
        {
            let mut st = shared.lock();
            st.counters.busy_s += dt;
            st.counters.in_flight_integral += before as f64 * dt;
            st.counters.samples += finished.len() as u64;
            st.counters.tokens += finished.iter().map(|s| s.response.len() as u64).sum::<u64>();
        }
        for s in finished {
            g.finish_sample(shared, s);
        }
    }
}

impl Generator<'_> {
    fn params(&self, p: &Pending, j: usize) -> SamplingParams {
        let r = &self.spec.rollout;
        // A retried prompt gets a fresh stream: same id, different retry count.
        let base = derive_seed(self.spec.seed, "sampling-async", p.id);
        SamplingParams {
            max_new_tokens: r.max_new_tokens,
            temperature: r.temperature,
            top_p: r.top_p,
            top_k: r.top_k,
            stop_tokens: vec![EOS],
            greedy: false,
            seed: derive_seed(base, "sample", (p.retries as u64) << 32 | j as u64),
        }
    }

    fn submit(&mut self, engine: &mut dyn StreamEngine, pid: u64, j: usize) -> Result<(), RunError> {
        let Some(b) = self.building.get(&pid) else { return Ok(()) };
        let params = self.params(&b.prompt, j);
        let id = self.next_request;
        self.next_request += 1;
        self.requests.insert(id, (pid, j));
        engine.submit(GenRequest { id, prompt: b.tokens.clone(), params })
    }

    /// Starts work while there are free slots: samples of admitted groups first, then new groups
    /// while the buffer has room.
    fn admit(&mut self, shared: &Shared, engine: &mut dyn StreamEngine, new_groups: bool) -> Result<(), RunError> {
        let n = self.spec.rollout.samples_per_prompt;
        loop {
            let free = self.slots.saturating_sub(engine.in_flight());
            if free == 0 {
                return Ok(());
            }
            if self.cfg.refill == Refill::PerSample {
                let next = self.building.iter_mut().find_map(|(&pid, b)| b.unsubmitted.pop_front().map(|j| (pid, j)));
                if let Some((pid, j)) = next {
                    self.submit(engine, pid, j)?;
                    continue;
                }
            } else if free < n {
                return Ok(());
            }
            if !new_groups {
                return Ok(());
            }
            // A new group, if the buffer has room for it.
            let p = {
                let mut st = shared.lock();
                if !st.may_admit(self.cfg, self.spec.rollout.rollout_batch) {
                    return Ok(());
                }
                let step = st.step;
                let (p, how) = st.source.next(step);
                st.buffer.admit(p);
                match how {
                    Served::Fresh => {}
                    Served::Retry => st.counters.served_retry += 1,
                    Served::Starving => st.counters.served_starving += 1,
                }
                if how != Served::Fresh {
                    st.counters.retry_age_max = st.counters.retry_age_max.max(step.saturating_sub(p.first_step));
                }
                p
            };
            let item = prompt_item(self.task, self.spec.seed, p.id);
            let tokens = self.task.tokenizer.encode_prompt(&item.prompt)?;
            self.building.insert(
                p.id,
                Building {
                    prompt: p,
                    item,
                    tokens,
                    samples: vec![None; n],
                    unsubmitted: (0..n).collect(),
                    aborted: false,
                },
            );
            if self.cfg.refill == Refill::PerGroup {
                for j in 0..n {
                    self.submit(engine, p.id, j)?;
                }
                if let Some(b) = self.building.get_mut(&p.id) {
                    b.unsubmitted.clear();
                }
            }
        }
    }

    fn finish_sample(&mut self, shared: &Shared, s: StreamSample) {
        let Some((pid, j)) = self.requests.remove(&s.id) else { return };
        let Some(b) = self.building.get_mut(&pid) else { return };
        if s.aborted {
            b.aborted = true;
        }
        b.samples[j] = Some(s);
        if b.samples.iter().any(Option::is_none) {
            return;
        }
        let Some(b) = self.building.remove(&pid) else { return };
        let mut st = shared.lock();
        let State { buffer, source, .. } = &mut *st;
        if b.aborted {
            buffer.abort(b.prompt, self.cfg.on_abort, source);
        } else {
            let samples: Vec<StreamSample> = b.samples.into_iter().flatten().collect();
            let rewards = samples
                .iter()
                .map(|s| self.task.score(&b.item, &self.task.tokenizer.decode(&s.response), s.finish))
                .collect();
            let g = Group { prompt: b.prompt, prompt_tokens: b.tokens, samples, rewards };
            buffer.finish(g, self.cfg.filter, source);
        }
        drop(st);
        shared.cv.notify_all();
    }

    /// Aborts every request in flight (and every admitted group) for a retract/abort pause.
    fn abort_all(&mut self, shared: &Shared, engine: &mut dyn StreamEngine, action: DropAction) {
        let _ = engine.abort_all();
        self.requests.clear();
        let mut st = shared.lock();
        let State { buffer, source, .. } = &mut *st;
        for (_, b) in std::mem::take(&mut self.building) {
            buffer.abort(b.prompt, action, source);
        }
        drop(st);
        shared.cv.notify_all();
    }
}

/// Greedy exact-match accuracy and mean response length on the first `eval.prompts` test items,
/// through the streaming interface (in chunks of the engine's slots).
fn evaluate_stream(spec: &RunSpec, task: &TaskSet, engine: &mut dyn StreamEngine) -> Result<(f64, f64), RunError> {
    let items: Vec<&TaskItem> = task.test.iter().take(spec.eval.prompts.max(1)).collect();
    let params = SamplingParams {
        max_new_tokens: spec.rollout.max_new_tokens,
        temperature: 1.0,
        top_p: 1.0,
        top_k: 0,
        stop_tokens: vec![EOS],
        greedy: true,
        seed: 0,
    };
    // Ids far above the generation thread's (which is idle while this runs).
    let base = u64::MAX / 2;
    let mut next = 0usize;
    let mut correct = 0usize;
    let mut len = 0usize;
    let mut done = 0usize;
    while done < items.len() {
        while next < items.len() && engine.in_flight() < engine.slots().max(1) {
            let prompt = task.tokenizer.encode_prompt(&items[next].prompt)?;
            engine.submit(GenRequest { id: base + next as u64, prompt, params: params.clone() })?;
            next += 1;
        }
        for s in engine.step()? {
            // Only our own requests (a caller drains or aborts generation first).
            let Some(item) = s.id.checked_sub(base).and_then(|i| items.get(i as usize)) else { continue };
            let text = task.tokenizer.decode(&s.response);
            if crate::tasks::verify(&item.label, &text, s.finish, false) >= 1.0 {
                correct += 1;
            }
            len += s.response.len();
            done += 1;
        }
        if engine.in_flight() == 0 && next >= items.len() && done < items.len() {
            return Err(RunError::new(E_BACKEND, "the rollout engine lost evaluation requests"));
        }
    }
    let n = items.len().max(1) as f64;
    Ok((correct as f64 / n, len as f64 / n))
}

/// Snapshot and external evaluations, which run beside training.
enum EvalRunner {
    /// Shared-mode evaluations go through the generation thread; nothing here.
    None,
    Snapshot {
        tx: std::sync::mpsc::Sender<(u64, Arc<WeightSnapshot>)>,
        rx: std::sync::mpsc::Receiver<Result<EvalResult, RunError>>,
        outstanding: usize,
    },
    External {
        command: String,
        dir: PathBuf,
        running: Vec<(u64, std::process::Child, Instant, PathBuf)>,
        stall: Duration,
        tokenizer: crate::tasks::CharTokenizer,
    },
}

impl EvalRunner {
    fn start(
        spec: &RunSpec,
        cfg: &AsyncSpec,
        eval_engine: Option<Box<dyn EvalEngine>>,
        task: &Arc<TaskSet>,
        out: &Path,
        threads: Option<usize>,
    ) -> Result<EvalRunner, RunError> {
        match spec.eval.mode {
            EvalMode::Shared => Ok(EvalRunner::None),
            EvalMode::Snapshot => {
                let Some(mut engine) = eval_engine else {
                    return Err(RunError::new(E_SPEC, "this backend has no second engine for eval.mode = snapshot")
                        .with_help("use eval mode shared or external"));
                };
                let (tx, req_rx) = std::sync::mpsc::channel::<(u64, Arc<WeightSnapshot>)>();
                let (res_tx, rx) = std::sync::mpsc::channel();
                let task = task.clone();
                let spec = spec.clone();
                std::thread::Builder::new()
                    .name("miles-eval".into())
                    .spawn(move || {
                        engine.bind_thread(threads);
                        while let Ok((step, w)) = req_rx.recv() {
                            let t0 = Instant::now();
                            let res = engine
                                .load_weights(&w)
                                .and_then(|_| crate::exec::evaluate(&spec, &task, engine.as_mut()))
                                .map(|acc| EvalResult {
                                    step,
                                    metrics: acc_metrics(acc),
                                    seconds: t0.elapsed().as_secs_f64(),
                                });
                            if res_tx.send(res).is_err() {
                                return;
                            }
                        }
                    })
                    .map_err(|e| RunError::new(E_BACKEND, format!("cannot start the evaluation thread: {e}")))?;
                Ok(EvalRunner::Snapshot { tx, rx, outstanding: 0 })
            }
            EvalMode::External => Ok(EvalRunner::External {
                command: spec.eval.command.clone().unwrap_or_default(),
                dir: out.join("eval"),
                running: Vec::new(),
                stall: Duration::from_secs_f64(cfg.stall_timeout_s),
                tokenizer: task.tokenizer.clone(),
            }),
        }
    }

    /// Starts the evaluation of the trainer's current weights (step `step`).
    fn request(
        &mut self,
        step: u64,
        trainer: &dyn Trainer,
        transport: &mut dyn WeightTransport,
    ) -> Result<(), RunError> {
        match self {
            EvalRunner::None => Ok(()),
            EvalRunner::Snapshot { tx, outstanding, .. } => {
                let w = transport.transfer(trainer.export_weights()?)?;
                tx.send((step, Arc::new(w))).map_err(|_| {
                    RunError::new(E_BACKEND, format!("the evaluation thread (stage `{}`) has stopped", STAGES.eval))
                })?;
                *outstanding += 1;
                Ok(())
            }
            EvalRunner::External { command, dir, running, tokenizer, .. } => {
                let model = dir.join(format!("step-{step:08}"));
                write_dir_atomically(&model, |tmp| {
                    trainer.save_model(tmp)?;
                    write_json(&tmp.join("tokenizer.json"), &*tokenizer)
                })?;
                let out_path = dir.join(format!("step-{step:08}.out"));
                let stdout = std::fs::File::create(&out_path)
                    .map_err(|e| RunError::io(E_OUT_DIR, "cannot create", &out_path, e))?;
                let stderr = stdout.try_clone().map_err(|e| RunError::io(E_OUT_DIR, "cannot open", &out_path, e))?;
                // The directory is the command's last argument, quoted for the shell.
                let quoted = format!("'{}'", model.display().to_string().replace('\'', "'\\''"));
                let child = std::process::Command::new("sh")
                    .arg("-c")
                    .arg(format!("{command} {quoted}"))
                    .stdin(std::process::Stdio::null())
                    .stdout(stdout)
                    .stderr(stderr)
                    .spawn()
                    .map_err(|e| RunError::new(E_BACKEND, format!("cannot start the eval command `{command}`: {e}")))?;
                running.push((step, child, Instant::now(), out_path));
                Ok(())
            }
        }
    }

    /// Evaluations that finished since the last call (never waits).
    fn poll(&mut self) -> Result<Vec<EvalResult>, RunError> {
        self.collect(Duration::ZERO)
    }

    /// Waits (bounded) for every evaluation still running.
    fn finish(&mut self, limit: Duration) -> Result<Vec<EvalResult>, RunError> {
        self.collect(limit)
    }

    fn collect(&mut self, wait: Duration) -> Result<Vec<EvalResult>, RunError> {
        let t0 = Instant::now();
        let mut out = Vec::new();
        match self {
            EvalRunner::None => {}
            EvalRunner::Snapshot { rx, outstanding, .. } => {
                while *outstanding > 0 {
                    let left = wait.saturating_sub(t0.elapsed());
                    let got = if left.is_zero() { rx.try_recv().ok() } else { rx.recv_timeout(left).ok() };
                    match got {
                        Some(r) => {
                            *outstanding -= 1;
                            out.push(r?);
                        }
                        None if wait.is_zero() => break,
                        None => {
                            return Err(timeout_err(format!(
                                "the evaluation stage `{}` (snapshot engine) did not answer within {:.0} s",
                                STAGES.eval,
                                wait.as_secs_f64()
                            )))
                        }
                    }
                }
            }
            EvalRunner::External { command, running, stall, .. } => loop {
                let mut i = 0;
                while i < running.len() {
                    let (step, child, since, out_path) = &mut running[i];
                    match child.try_wait() {
                        Ok(Some(status)) => {
                            let text = std::fs::read_to_string(&*out_path).unwrap_or_default();
                            if !status.success() {
                                return Err(RunError::new(
                                    E_BACKEND,
                                    format!(
                                        "the eval command `{command}` failed at step {step} ({status}); its output is in {}",
                                        out_path.display()
                                    ),
                                ));
                            }
                            out.push(EvalResult {
                                step: *step,
                                metrics: parse_external(&text),
                                seconds: since.elapsed().as_secs_f64(),
                            });
                            running.remove(i);
                        }
                        Ok(None) if since.elapsed() > *stall => {
                            let _ = child.kill();
                            let _ = child.wait();
                            return Err(timeout_err(format!(
                                "the eval command `{command}` (stage `{}`) ran over {:.0} s at step {step}",
                                STAGES.eval,
                                stall.as_secs_f64()
                            )));
                        }
                        Ok(None) => i += 1,
                        Err(e) => return Err(RunError::new(E_BACKEND, format!("cannot wait for `{command}`: {e}"))),
                    }
                }
                if running.is_empty() || wait.is_zero() {
                    break;
                }
                if t0.elapsed() > wait {
                    return Err(timeout_err(format!(
                        "the eval command `{command}` (stage `{}`) did not finish within {:.0} s",
                        STAGES.eval,
                        wait.as_secs_f64()
                    )));
                }
                std::thread::sleep(Duration::from_millis(20));
            },
        }
        Ok(out)
    }
}

/// The last line of an external evaluation's output that is a JSON object: its numbers.
fn parse_external(text: &str) -> Vec<(String, f64)> {
    text.lines()
        .rev()
        .find_map(|l| serde_json::from_str::<Map<String, Value>>(l.trim()).ok())
        .map(|m| m.into_iter().filter_map(|(k, v)| v.as_f64().map(|x| (k, x))).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn external_output() {
        let m = parse_external("loading\n{\"accuracy\": 0.5, \"note\": \"x\"}\n");
        assert_eq!(m, vec![("accuracy".to_string(), 0.5)]);
        assert!(parse_external("no json").is_empty());
    }
}
