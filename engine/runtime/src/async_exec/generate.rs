//! The generation thread of the asynchronous executor: it owns the streaming engine, admits
//! prompts while the buffer has room (and the staleness gate allows), keeps up to
//! `max_concurrent` samples in flight, scores finished groups into the buffer, swaps weights
//! between two engine steps as `pause` says, and runs shared-engine evaluations.

use super::eval::{acc_metrics, evaluate_stream, EvalResult};
use super::{timeout_err, Shared, State};
use crate::backend::*;
use crate::buffer::Group;
use crate::reward::BatchReward;
use crate::rng::derive_seed;
use crate::schedule::{AsyncSpec, DropAction, PauseMode, Refill};
use crate::source::{Pending, Served};
use crate::spec::RunSpec;
use crate::stream::{GenRequest, StreamEngine, StreamSample};
use crate::tasks::{PromptRow, TaskSet};
use crate::*;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, Instant};

/// The train prompt with id `id`: a pure function of the seed, so a resumed run serves the same.
fn prompt_item(task: &TaskSet, seed: u64, id: u64) -> PromptRow {
    task.train_batch(seed, "rollout-async", id, 1)
        .into_iter()
        .next()
        .unwrap_or_else(|| PromptRow::text(String::new(), String::new()))
}

/// A group being generated.
struct Building {
    prompt: Pending,
    item: PromptRow,
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
    /// This thread's reward (rollouts and shared-engine evaluations).
    reward: Box<dyn BatchReward>,
    stop: Vec<TaskId>,
    building: BTreeMap<u64, Building>,
    /// Request id -> (prompt id, sample index).
    requests: HashMap<u64, (u64, usize)>,
    next_request: u64,
    slots: usize,
}

pub(super) fn generation_loop(
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
        reward: crate::reward::spec::build_run_reward(spec)?,
        stop: task.stop_tokens(),
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
                let acc = evaluate_stream(spec, task, g.reward.as_mut(), engine)?;
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
                    spec.stages.train
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
            g.finish_sample(shared, s)?;
        }
    }
}

impl Generator<'_> {
    fn params(&self, p: &Pending, j: usize) -> SamplingParams {
        // A retried prompt gets a fresh stream: same id, different retry count.
        let base = derive_seed(self.spec.seed, "sampling-async", p.id);
        SamplingParams::rollout(&self.spec.rollout, derive_seed(base, "sample", (p.retries as u64) << 32 | j as u64))
            .with_stop(self.stop.clone())
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

    /// Records a finished sample; a group whose samples are all in is scored (outside the lock: a
    /// reward may be a slow program) and goes to the buffer.
    fn finish_sample(&mut self, shared: &Shared, s: StreamSample) -> Result<(), RunError> {
        let Some((pid, j)) = self.requests.remove(&s.id) else { return Ok(()) };
        let Some(b) = self.building.get_mut(&pid) else { return Ok(()) };
        if s.aborted {
            b.aborted = true;
        }
        b.samples[j] = Some(s);
        if b.samples.iter().any(Option::is_none) {
            return Ok(());
        }
        let Some(Building { prompt, item, tokens, samples, aborted, .. }) = self.building.remove(&pid) else {
            return Ok(());
        };
        let scored = if aborted {
            None
        } else {
            let samples: Vec<StreamSample> = samples.into_iter().flatten().collect();
            let responses: Vec<crate::exec::Scored> = samples
                .iter()
                .enumerate()
                .map(|(j, s)| (format!("prompt{}/s{j}", prompt.id), &item, &s.response[..], s.finish))
                .collect();
            let outcomes = crate::exec::score_responses(self.reward.as_mut(), self.task, &responses)?;
            // A dropped sample leaves its group; the others keep their rewards.
            let kept: (Vec<StreamSample>, Vec<f32>) =
                samples.into_iter().zip(&outcomes).filter_map(|(s, o)| o.reward().map(|r| (s, r))).unzip();
            Some(kept)
        };
        let mut st = shared.lock();
        let State { buffer, source, .. } = &mut *st;
        match scored {
            None => buffer.abort(prompt, self.cfg.on_abort, source),
            Some((samples, _)) if samples.is_empty() => buffer.abort(prompt, DropAction::Discard, source),
            Some((samples, rewards)) => {
                buffer.finish(Group { prompt, prompt_tokens: tokens, samples, rewards }, self.cfg.filter, source);
            }
        }
        drop(st);
        shared.cv.notify_all();
        Ok(())
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
