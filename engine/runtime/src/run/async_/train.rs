//! The trainer's side of the asynchronous executor: per step it draws groups that are not stale,
//! trains, pushes weights every `update_interval` steps, requests evaluations, writes the step's
//! metrics and checkpoints.

use super::eval::{write_eval_row, EvalResult, EvalRunner};
use super::{checkpoint, timeout_err, GenCounters, Shared, State};
use crate::advantage::AdvantageRule;
use crate::backend::{TrainStats, Trainer, WeightTransport};
use crate::buffer::{DropCounts, Group};
use crate::env::episode::metrics as episode_metrics;
use crate::env::faults::Faults;
use crate::env::EpisodeResult;
use crate::progress::Progress;
use crate::run::step::metrics::Metrics;
use crate::run::step::samples::SamplesLog;
use crate::run::step::teacher::TeacherStage;
use crate::run::step::train::{check_wall_time, insert_perf, insert_train_stats, step_lrs, train_checked, StepTimes};
use crate::run::sync::fault_kinds;
use crate::sample::{FinishReason, Trajectory};
use crate::schedule::{AsyncSpec, EvalMode};
use crate::spec::{RunOptions, RunSpec, StageNames};
use crate::tasks::TaskSet;
use crate::{RunError, E_BACKEND};
use serde_json::{json, Map, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(super) struct TrainProgress<'a> {
    pub(super) step: &'a mut u64,
    pub(super) eval_start: Option<f64>,
    pub(super) eval_last: &'a mut Option<f64>,
    pub(super) last_ckpt: &'a mut Option<PathBuf>,
}

/// The trainer's loop; returns (stopped early, last step's mean reward). An interrupt stops it
/// between steps, as `stop_after` does (`opts.interrupted()` tells them apart).
#[allow(clippy::too_many_arguments)]
pub(super) fn train_loop(
    spec: &RunSpec,
    opts: &RunOptions,
    cfg: &AsyncSpec,
    shared: &Shared,
    trainer: &mut dyn Trainer,
    mut teacher: Option<&mut TeacherStage>,
    transport: &mut dyn WeightTransport,
    evals: &mut EvalRunner,
    metrics: &mut Metrics,
    (samples, task): (&mut SamplesLog, &TaskSet),
    progress: &mut Progress,
    tp: TrainProgress<'_>,
    ckpt_root: &Path,
    started: Instant,
) -> Result<(bool, Option<f64>), RunError> {
    let r = &spec.rollout;
    let stall = Duration::from_secs_f64(cfg.stall_timeout_s);
    let mut last_reward = None;
    let mut steps_this_run = 0u64;
    let step = tp.step;
    while *step < spec.steps {
        if opts.stop_after.is_some_and(|n| steps_this_run >= n) || opts.interrupted() {
            return Ok((true, last_reward));
        }
        check_wall_time(opts, started, *step)?;
        *step += 1;
        steps_this_run += 1;
        let t_step = Instant::now();

        // Draw a step's groups (stale ones are dropped on the way).
        let t_wait = Instant::now();
        let (groups, version) = match draw(shared, r.rollout_batch, cfg, stall, &spec.stages) {
            Ok(drawn) => drawn,
            Err(e) => {
                // Episodes discarded for their faults still get their step's row (E0509's help
                // points at it), and the console's warning.
                let discarded = std::mem::take(&mut shared.lock().counters.discarded);
                if !discarded.is_empty() {
                    let f = Faults::of(&discarded, on_env_error(spec));
                    progress.faults(*step, &fault_kinds(&f), f.warning(&format!("step {}", *step)).as_deref());
                    let mut row = Map::new();
                    row.insert("step".into(), json!(*step));
                    row.insert("weight_version".into(), json!(shared.lock().version));
                    for (k, v) in episode_metrics(&discarded) {
                        row.insert(k, json!(v));
                    }
                    row.extend(f.columns());
                    metrics.write(&row)?;
                }
                return Err(e);
            }
        };
        let trainer_idle_s = t_wait.elapsed().as_secs_f64();

        let t_reward = Instant::now();
        let (mut batch, rewards) = trajectories(&groups, AdvantageRule::of(&spec.train));
        let reward_s = t_reward.elapsed().as_secs_f64();
        let teacher_s = match teacher.as_deref_mut() {
            Some(t) => t.score(&mut batch)?,
            None => 0.0,
        };
        let lrs = step_lrs(spec, *step);
        let t_train = Instant::now();
        let mut ts = train_checked(trainer, &batch, &lrs, r.temperature, *step, tp.last_ckpt)?;
        let train_s = t_train.elapsed().as_secs_f64();
        if let Some(t) = teacher.as_deref() {
            t.note(&mut ts);
        }

        // Push weights every update_interval steps; the engine swaps them between two steps.
        let (mut sync_s, mut sync_bytes) = (0.0, 0);
        if *step % cfg.update_interval == 0 || *step == spec.steps {
            (sync_s, sync_bytes) = push_weights(shared, trainer, transport)?;
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
        let mut st = StepState::take(shared, *step, version);
        st.results.extend(evals.poll()?);
        let done = Trained { groups: &groups, rewards: &rewards, batch: &batch, ts: &ts, lrs: &lrs };
        let times = (trainer_idle_s, reward_s, teacher_s, train_s, sync_s, sync_bytes);
        let (row, reward_mean, trained) = step_row(spec, *step, version, &done, &st, times, t_step);
        let faults = spec.env.is_some().then(|| step_faults(spec, &groups, &st.counters.discarded));
        if let Some(f) = &faults {
            progress.faults(*step, &fault_kinds(f), f.warning(&format!("step {}", *step)).as_deref());
        }
        metrics.write(&row)?;
        samples.write(&crate::run::step::samples::drawn(spec, &task.tokenizer, *step, &groups, &batch))?;
        for res in &st.results {
            if let Some(acc) = write_eval_row(metrics, res, *step)? {
                *tp.eval_last = Some(acc);
                progress.eval(res.step, acc);
            }
        }
        last_reward = Some(reward_mean);
        let counters = &st.counters;
        progress.step(
            *step,
            reward_mean,
            &faults.as_ref().map(Faults::reward_note).unwrap_or_default(),
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

fn on_env_error(spec: &RunSpec) -> crate::env::OnEnvError {
    spec.env.as_ref().map(|e| e.on_env_error).unwrap_or_default()
}

/// The faults of a step's drawn groups' episodes and of the groups discarded since the last step.
fn step_faults(spec: &RunSpec, groups: &[Group], discarded: &[EpisodeResult]) -> Faults {
    let mut f = Faults::new(on_env_error(spec));
    for r in groups.iter().filter_map(|g| g.episodes.as_ref()).flat_map(|e| e.results.iter()).chain(discarded) {
        f.count(r);
    }
    f
}

/// A step's drawn groups as trajectories, with the run's advantages; and one reward per response
/// (an episode's trajectories share theirs): the advantages count each response once.
fn trajectories(groups: &[Group], rule: AdvantageRule) -> (Vec<Trajectory>, Vec<f32>) {
    let mut batch = Vec::new();
    let mut rewards = Vec::new();
    let mut group_of = Vec::new();
    let mut response_of = Vec::new();
    for (gi, g) in groups.iter().enumerate() {
        for (i, (s, &rw)) in g.samples.iter().zip(&g.rewards).enumerate() {
            if i == 0 || g.response_of(i) != g.response_of(i - 1) {
                rewards.push(rw);
                group_of.push(gi);
            }
            response_of.push(rewards.len() - 1);
            batch.push(Trajectory {
                prompt: g.prompt_of(i).to_vec(),
                response: s.response.clone(),
                rollout_logprobs: s.logprobs.clone(),
                loss_mask: g.mask_of(i),
                reward: rw,
                advantage: 0.0,
                group: gi,
                weight_version: s.oldest_version(),
                routing: s.routing.clone(),
                teacher_logprobs: Vec::new(),
            });
        }
    }
    let adv = rule.compute(&rewards, &group_of);
    for (t, &k) in batch.iter_mut().zip(&response_of) {
        t.advantage = adv[k];
    }
    (batch, rewards)
}

/// Publishes the trainer's weights as the next version for the engine to swap in; returns the
/// seconds it took and the bytes moved.
fn push_weights(
    shared: &Shared,
    trainer: &mut dyn Trainer,
    transport: &mut dyn WeightTransport,
) -> Result<(f64, usize), RunError> {
    let t_sync = Instant::now();
    let mut w = transport.transfer(trainer.export_weights()?)?;
    let sync_bytes = w.bytes();
    let mut st = shared.lock();
    st.version += 1;
    w.version = st.version;
    st.weights = Some(Arc::new(w));
    drop(st);
    shared.cv.notify_all();
    Ok((t_sync.elapsed().as_secs_f64(), sync_bytes))
}

/// The shared state as a step ends, for its metrics row: the buffer and the data source, the
/// generation counters and drops since the last step (taken), and the evaluations finished.
struct StepState {
    queue: usize,
    in_flight_groups: usize,
    drops: DropCounts,
    waiting: (f64, u64),
    retry_queue: usize,
    starving: usize,
    version: u64,
    results: Vec<EvalResult>,
    counters: GenCounters,
}

impl StepState {
    /// Takes it under the lock, and moves the data source on to step `step + 1`; staleness is
    /// judged against `version`.
    fn take(shared: &Shared, step: u64, version: u64) -> StepState {
        let mut st = shared.lock();
        st.step = step + 1;
        let c = std::mem::take(&mut st.counters);
        let drops = std::mem::take(&mut st.buffer.drops);
        let waiting = st.buffer.waiting_staleness(version);
        let results: Vec<EvalResult> = st.eval_results.drain(..).collect();
        StepState {
            queue: st.buffer.len(),
            in_flight_groups: st.buffer.in_flight(),
            drops,
            waiting,
            retry_queue: st.source.queued(),
            starving: st.source.starving(),
            version: st.version,
            results,
            counters: c,
        }
    }
}

/// What a step trained on: its groups, one reward per response, the trajectories, and the
/// training's stats and learning rates.
struct Trained<'a> {
    groups: &'a [Group],
    rewards: &'a [f32],
    batch: &'a [Trajectory],
    ts: &'a TrainStats,
    lrs: &'a [f64],
}

/// A step's metrics row: the rollout's columns, `rollout/fully_async/*`, the training stats and
/// `perf/*` (`times`: trainer idle, reward, teacher, train and sync seconds, and sync bytes);
/// with the step's mean reward and the tokens trained.
fn step_row(
    spec: &RunSpec,
    step: u64,
    version: u64,
    done: &Trained<'_>,
    st: &StepState,
    times: (f64, f64, f64, f64, f64, usize),
    t_step: Instant,
) -> (Map<String, Value>, f64, usize) {
    let Trained { groups, rewards, batch, ts, lrs } = *done;
    let (trainer_idle_s, reward_s, teacher_s, train_s, sync_s, sync_bytes) = times;
    let counters = &st.counters;
    let n = rewards.len().max(1) as f64;
    let reward_mean = rewards.iter().map(|&x| x as f64).sum::<f64>() / n;
    let gen_tokens: usize = groups.iter().map(|g| (0..g.samples.len()).map(|i| g.sampled_len(i)).sum::<usize>()).sum();
    let staleness: Vec<u64> = groups.iter().map(|g| g.staleness(version)).collect();
    let mut hist = vec![0u64; staleness.iter().copied().max().map_or(0, |m| m as usize + 1)];
    for &s in &staleness {
        hist[s as usize] += 1;
    }
    let spans = groups.iter().flat_map(|g| &g.samples).filter(|s| s.versions.len() > 1).count();
    let flat = groups.iter().filter(|g| g.is_flat()).count();
    let mut row = Map::new();
    row.insert("step".into(), json!(step));
    row.insert("weight_version".into(), json!(st.version));
    row.insert("rollout/reward_mean".into(), json!(reward_mean));
    let solved = crate::spec::env::solved_frac(rewards.iter().map(|&x| f64::from(x)), spec.solved_at());
    row.insert("rollout/solved_frac".into(), json!(solved));
    row.insert("rollout/response_len".into(), json!(gen_tokens as f64 / n));
    row.insert(
        "rollout/stop_frac".into(),
        json!(groups.iter().flat_map(|g| &g.samples).filter(|s| s.finish == FinishReason::Stop).count() as f64 / n),
    );
    row.insert("rollout/flat_group_frac".into(), json!(flat as f64 / groups.len().max(1) as f64));
    for (k, v) in crate::reward::combine::part_metrics(groups.iter().flat_map(|g| &g.reward_parts)) {
        row.insert(k, json!(v));
    }
    if let Some(o) = &spec.train.overlong {
        // The shaping `score_rollout` added to the trained single responses' rewards.
        let single = groups.iter().filter(|g| g.episodes.is_none());
        let lens = single.flat_map(|g| g.samples.iter().map(|s| s.response.len()));
        for (k, v) in crate::run::step::score::overlong_metrics(o, lens) {
            row.insert(k, json!(v));
        }
    }
    if spec.env.is_some() {
        // The drawn groups' episodes and those of groups discarded since the last step.
        let mut episodes: Vec<EpisodeResult> =
            groups.iter().filter_map(|g| g.episodes.as_ref()).flat_map(|e| e.results.iter().cloned()).collect();
        episodes.extend(counters.discarded.iter().cloned());
        for (k, v) in episode_metrics(&episodes) {
            row.insert(k, json!(v));
        }
        row.extend(step_faults(spec, groups, &counters.discarded).columns());
    }
    let fa = |k: &str| format!("rollout/fully_async/{k}");
    row.insert(fa("queue_size"), json!(st.queue));
    row.insert(fa("groups_in_flight"), json!(st.in_flight_groups));
    row.insert(fa("dropped_aborted"), json!(st.drops.aborted));
    row.insert(fa("dropped_filtered"), json!(st.drops.filtered));
    row.insert(fa("dropped_stale"), json!(st.drops.stale));
    row.insert(fa("retried"), json!(st.drops.retried));
    row.insert(fa("retry_queue"), json!(st.retry_queue));
    row.insert(fa("starving_queue"), json!(st.starving));
    row.insert(fa("starving_served"), json!(counters.served_starving));
    row.insert(fa("retry_served"), json!(counters.served_retry));
    row.insert(fa("retry_age_max"), json!(counters.retry_age_max));
    let smax = staleness.iter().copied().max().unwrap_or(0);
    let smean = staleness.iter().sum::<u64>() as f64 / staleness.len().max(1) as f64;
    row.insert(fa("staleness_drawn_mean"), json!(smean));
    row.insert(fa("staleness_drawn_max"), json!(smax));
    row.insert(fa("staleness_drawn_hist"), json!(hist));
    row.insert(fa("staleness_waiting_mean"), json!(st.waiting.0));
    row.insert(fa("staleness_waiting_max"), json!(st.waiting.1));
    row.insert(fa("samples_spanning_versions"), json!(spans));
    let concurrency = counters.in_flight_integral / counters.busy_s.max(1e-9);
    row.insert(fa("concurrency_mean"), json!(concurrency));
    row.insert(fa("trainer_idle_s"), json!(trainer_idle_s));
    row.insert(fa("engine_idle_s"), json!(counters.idle_s));
    row.insert(fa("engine_busy_s"), json!(counters.busy_s));
    row.insert(fa("weight_swaps"), json!(counters.swaps));
    row.insert(fa("swap_s"), json!(counters.swap_s));
    insert_train_stats(&mut row, ts, lrs);
    let trained: usize = batch.iter().map(|t| t.prompt.len() + t.response.len()).sum();
    let times = StepTimes {
        gen_s: counters.busy_s,
        reward_s,
        teacher_s,
        train_s,
        sync_s,
        step_s: t_step.elapsed().as_secs_f64(),
    };
    insert_perf(&mut row, ts, &times, counters.tokens, trained, sync_bytes);
    (row, reward_mean, trained)
}

/// Waits (bounded) for `n` groups that are not stale; returns them and the version they were
/// judged against.
fn draw(
    shared: &Shared,
    n: usize,
    cfg: &AsyncSpec,
    stall: Duration,
    stages: &StageNames,
) -> Result<(Vec<Group>, u64), RunError> {
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
        for g in &more {
            source.mark_trained(g.prompt.id);
        }
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
                format!("the rollout stage `{}` stopped before the trainer had its groups", stages.rollout),
            ));
        }
        let left = stall.saturating_sub(t0.elapsed());
        if left.is_zero() {
            return Err(timeout_err(format!(
                "the trainer (stage `{}`) waited {:.0} s for {n} groups; the rollout stage `{}` delivered {} \
                 ({} in flight, {} buffered; dropped so far: {} filtered, {} stale, {} aborted)",
                stages.train,
                stall.as_secs_f64(),
                stages.rollout,
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
