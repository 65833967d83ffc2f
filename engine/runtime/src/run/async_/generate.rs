//! The generation thread of the asynchronous executor: it owns the streaming engine, admits
//! prompts while the buffer has room (and the staleness gate allows), keeps up to
//! `max_concurrent` samples in flight, scores finished groups into the buffer, swaps weights
//! between two engine steps as `pause` says, and runs shared-engine evaluations.
//!
//! In a run with an environment a sample is a multi-turn episode: each of its turns is one
//! request, and when a turn comes back the episode records it (TITO), the environment steps (the
//! turns that finished in one engine step call it concurrently) and the episode's next turn is
//! queued at once, so a slot freed by one episode's turn goes to whichever episode is ready
//! (per-sample refill fills it when an episode ends). A weight update between two turns, or
//! within one (in-place pause), is recorded per token. The group goes to the buffer when its last
//! episode ends.

use super::eval::{acc_metrics, evaluate_stream, EvalResult};
use super::{timeout_err, Shared, State};
use crate::backend::StreamEngine;
use crate::buffer::Group;
use crate::env::episode::{parallel, EnvCall};
use crate::env::faults::Faults;
use crate::env::{Action, EnvFault, Episode, EpisodeResult, StepResult, TurnSample};
use crate::reward::BatchReward;
use crate::rng::derive_seed;
use crate::run::step::episodes::{all_episodes_faulted, buffered_group, tasks_of, EnvRunner};
use crate::run::step::score::{score_rollout, Scored};
use crate::sample::{GenRequest, SamplingParams, StreamSample};
use crate::schedule::{AsyncSpec, DropAction, PauseMode, Refill};
use crate::session::ChatCodec;
use crate::source::{Pending, Served};
use crate::spec::RunSpec;
use crate::tasks::{PromptRow, TaskSet};
use crate::RunError;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::Path;
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
    /// The group's episodes, in a run with an environment.
    play: Option<Playing>,
}

/// The episodes of a group, one per sample.
struct Playing {
    /// Live episodes (`None` once over).
    live: Vec<Option<Episode>>,
    /// What each episode's turn in flight is conditioned on.
    ctx: Vec<Vec<TaskId>>,
    /// Turns sampled so far per episode (seeds each turn's stream).
    turns: Vec<u64>,
    results: Vec<Option<EpisodeResult>>,
    /// Episodes over (a result, or abandoned after an abort).
    over: usize,
}

/// A turn that came back and acts on the environment.
struct EnvWork {
    pid: u64,
    j: usize,
    action: Action,
    call: EnvCall,
}

type TaskId = crate::token::TokenId;

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
    /// The run's environment and the codec of its tokenizer (episodes), else `None`.
    env: Option<(EnvRunner, ChatCodec<'a>)>,
    /// Groups in a row whose every episode ended by an environment fault and was dropped, and
    /// their faults.
    faulted_in_a_row: usize,
    faults_in_a_row: Faults,
    /// The run's output directory (metrics.jsonl, the environment's log).
    out: &'a Path,
}

pub(super) fn generation_loop(
    shared: &Shared,
    engine: &mut dyn StreamEngine,
    reward: Box<dyn BatchReward>,
    spec: &RunSpec,
    cfg: &AsyncSpec,
    (task, out): (&TaskSet, &Path),
) -> Result<(), RunError> {
    let mut g = Generator {
        spec,
        cfg,
        task,
        reward,
        stop: task.stop_tokens(),
        building: BTreeMap::new(),
        requests: HashMap::new(),
        next_request: 0,
        slots: engine.slots().min(cfg.max_concurrent).max(1),
        env: match EnvRunner::for_run(spec)? {
            Some(env) => {
                let codec = env.codec(task)?;
                Some((env, codec))
            }
            None => None,
        },
        faulted_in_a_row: 0,
        faults_in_a_row: Faults::default(),
        out,
    };
    if let Some((e, _)) = &g.env {
        e.env.keep_log_in(&crate::run::sync::env_log_dir(out));
    }
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
            g.abandon_episodes();
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
                let env = g.env.as_ref().map(|e| &e.0);
                let acc = evaluate_stream(spec, task, g.reward.as_mut(), env, engine)?;
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
        g.finish_samples(shared, engine, finished)?;
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
        let mut params = self.params(&b.prompt, j);
        let prompt = match &b.play {
            // An episode's turn: its own context, and a stream of its own per turn.
            Some(p) => {
                params.seed = derive_seed(params.seed, "turn", p.turns[j]);
                p.ctx[j].clone()
            }
            None => b.tokens.clone(),
        };
        let id = self.next_request;
        self.next_request += 1;
        self.requests.insert(id, (pid, j));
        engine.submit(GenRequest { id, prompt, params })
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
            let play = self.start_episodes(&p, &item)?;
            let unsubmitted: VecDeque<usize> = match &play {
                Some(pl) => (0..n).filter(|&j| pl.live[j].is_some()).collect(),
                None => (0..n).collect(),
            };
            let pid = p.id;
            let b = Building { prompt: p, item, tokens, samples: vec![None; n], unsubmitted, aborted: false, play };
            self.building.insert(pid, b);
            if self.cfg.refill == Refill::PerGroup {
                let todo = self.building.get_mut(&pid).map(|b| std::mem::take(&mut b.unsubmitted)).unwrap_or_default();
                for j in todo {
                    self.submit(engine, pid, j)?;
                }
            }
            // Every episode may have ended at its reset (a failing environment).
            self.group_done(shared, pid)?;
        }
    }

    /// A group's episodes, reset (concurrently, within the environment's limits); `None` in a run
    /// without an environment. A first prompt over `max_prompt_tokens` stops the run (E0510).
    fn start_episodes(&self, p: &Pending, item: &PromptRow) -> Result<Option<Playing>, RunError> {
        let Some((env, codec)) = self.env.as_ref() else { return Ok(None) };
        let n = self.spec.rollout.samples_per_prompt;
        // Ids unique per try of a prompt, seeds a function of the prompt and the try.
        let seed = derive_seed(derive_seed(self.spec.seed, "episodes-async", p.id), "try", p.retries as u64);
        let tasks = tasks_of(std::slice::from_ref(item), n, seed, &format!("prompt{}/try{}", p.id, p.retries));
        let started: Vec<std::sync::Mutex<Option<Episode>>> = (0..n).map(|_| std::sync::Mutex::new(None)).collect();
        let all: Vec<usize> = (0..n).collect();
        parallel(&all, env.limits.concurrency, |j| {
            let e = Episode::start(env.env.as_ref(), tasks[j].1.clone(), codec, &env.limits);
            *started[j].lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
        });
        let mut play = Playing {
            live: Vec::with_capacity(n),
            ctx: vec![Vec::new(); n],
            turns: vec![0; n],
            results: vec![None; n],
            over: 0,
        };
        let started: Vec<Option<Episode>> =
            started.into_iter().map(|m| m.into_inner().unwrap_or_else(|p| p.into_inner())).collect();
        if let Some(err) = started.iter().flatten().find_map(Episode::prompt_error) {
            started.iter().flatten().for_each(|e| e.abandon(env.env.as_ref()));
            return Err(err);
        }
        for (j, e) in started.into_iter().enumerate() {
            let Some(mut e) = e else { return Ok(None) };
            if e.wants_turn(&env.limits) {
                play.ctx[j] = e.context();
                play.live.push(Some(e));
            } else {
                play.results[j] = Some(e.finish(env.env.as_ref(), codec, &env.limits));
                play.over += 1;
                play.live.push(None);
            }
        }
        Ok(Some(play))
    }

    /// Records what an engine step finished: single responses, or episode turns (each recorded,
    /// the environment stepped for those that act, the episode's next turn queued or its result
    /// kept); a group whose samples are all in is scored and goes to the buffer.
    fn finish_samples(
        &mut self,
        shared: &Shared,
        engine: &mut dyn StreamEngine,
        finished: Vec<StreamSample>,
    ) -> Result<(), RunError> {
        let mut work: Vec<EnvWork> = Vec::new();
        // Episode turns that came back (they go on or end below), and the groups to look at.
        let mut returned: Vec<(u64, usize)> = Vec::new();
        let mut touched: Vec<u64> = Vec::new();
        for s in finished {
            let Some((pid, j)) = self.requests.remove(&s.id) else { continue };
            let Some(b) = self.building.get_mut(&pid) else { continue };
            touched.push(pid);
            b.aborted |= s.aborted;
            let Some(play) = b.play.as_mut() else {
                b.samples[j] = Some(s);
                continue;
            };
            let Some((env, codec)) = self.env.as_ref() else { continue };
            let Some(mut e) = play.live[j].take() else { continue };
            if b.aborted {
                // The group is served again (or dropped): its episodes end here.
                e.abandon(env.env.as_ref());
                play.over += 1;
                continue;
            }
            let turn = TurnSample {
                versions: s.token_versions(),
                ids: s.response,
                logprobs: s.logprobs,
                finish: s.finish,
                routing: s.routing,
            };
            play.turns[j] += 1;
            if let Some(action) = e.record(std::mem::take(&mut play.ctx[j]), turn, codec, &env.limits)? {
                work.push(EnvWork { pid, j, call: e.env_call(&env.limits), action });
            }
            play.live[j] = Some(e);
            returned.push((pid, j));
        }
        let Some((env, codec)) = self.env.as_ref() else {
            return touched.into_iter().try_for_each(|pid| self.group_done(shared, pid));
        };
        // The environment calls of this step's turns, concurrently and outside the shared lock.
        let answers: Vec<std::sync::Mutex<Option<Result<StepResult, EnvFault>>>> =
            work.iter().map(|_| std::sync::Mutex::new(None)).collect();
        let all: Vec<usize> = (0..work.len()).collect();
        parallel(&all, env.limits.concurrency, |k| {
            let r = work[k].call.run(env.env.as_ref(), &work[k].action, &env.limits);
            *answers[k].lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
        });
        for (w, a) in work.into_iter().zip(answers) {
            let Some(r) = a.into_inner().unwrap_or_else(|p| p.into_inner()) else { continue };
            let Some(play) = self.building.get_mut(&w.pid).and_then(|b| b.play.as_mut()) else { continue };
            if let Some(e) = play.live[w.j].as_mut() {
                e.apply(r, w.action, codec, &env.limits);
            }
        }
        // Each episode whose turn came back queues its next turn or ends.
        let mut submit_now = Vec::new();
        for (pid, j) in returned {
            let Some(b) = self.building.get_mut(&pid) else { continue };
            let Some(play) = b.play.as_mut() else { continue };
            let Some(mut e) = play.live[j].take() else { continue };
            if !b.aborted && e.wants_turn(&env.limits) {
                play.ctx[j] = e.context();
                play.live[j] = Some(e);
                match self.cfg.refill {
                    Refill::PerSample => b.unsubmitted.push_back(j),
                    Refill::PerGroup => submit_now.push((pid, j)),
                }
            } else {
                play.results[j] = Some(e.finish(env.env.as_ref(), codec, &env.limits));
                play.over += 1;
            }
        }
        touched.sort_unstable();
        touched.dedup();
        // An aborted group's episodes waiting for a slot end now rather than being sampled.
        for pid in &touched {
            let Some(b) = self.building.get_mut(pid).filter(|b| b.aborted) else { continue };
            let Some(play) = b.play.as_mut() else { continue };
            for j in b.unsubmitted.drain(..) {
                if let Some(e) = play.live[j].take() {
                    e.abandon(env.env.as_ref());
                    play.over += 1;
                }
            }
        }
        for (pid, j) in submit_now {
            self.submit(engine, pid, j)?;
        }
        touched.into_iter().try_for_each(|pid| self.group_done(shared, pid))
    }

    /// A group whose samples (episodes) are all in is scored (outside the lock: a reward may be a
    /// slow program) and goes to the buffer; an aborted one is served again or dropped.
    fn group_done(&mut self, shared: &Shared, pid: u64) -> Result<(), RunError> {
        let Some(b) = self.building.get(&pid) else { return Ok(()) };
        let complete = match &b.play {
            Some(p) => p.over == p.live.len(),
            None => b.samples.iter().all(Option::is_some),
        };
        if !complete {
            return Ok(());
        }
        let Some(Building { prompt, item, tokens, samples, aborted, play, .. }) = self.building.remove(&pid) else {
            return Ok(());
        };
        let scored = if aborted {
            None
        } else if let Some(play) = play {
            let on_env_error = self.env.as_ref().map(|e| e.0.limits.on_env_error).unwrap_or_default();
            let results: Vec<EpisodeResult> = play.results.into_iter().flatten().collect();
            let (samples, rewards, parts) = buffered_group(results, on_env_error);
            if samples.is_empty() {
                self.faulted_in_a_row += 1;
                self.faults_in_a_row.merge(&Faults::of(&parts.results, on_env_error));
                if self.faulted_in_a_row >= self.spec.rollout.rollout_batch.max(1) {
                    // The trainer writes the row of the step in progress (these episodes counted)
                    // before it reports this error.
                    let mut st = shared.lock();
                    st.counters.discarded.extend(parts.results);
                    let what = format!("{} groups in a row", self.faulted_in_a_row);
                    let metrics = self.out.join("metrics.jsonl");
                    return Err(all_episodes_faulted(&what, &self.faults_in_a_row, st.step, &metrics));
                }
            } else {
                self.faulted_in_a_row = 0;
                self.faults_in_a_row = Faults::default();
            }
            Some((samples, rewards, Some(parts), Vec::new()))
        } else {
            let samples: Vec<StreamSample> = samples.into_iter().flatten().collect();
            let responses: Vec<Scored> = samples
                .iter()
                .enumerate()
                .map(|(j, s)| (format!("prompt{}/s{j}", prompt.id), &item, &s.response[..], s.finish))
                .collect();
            // The buffer's unit is a whole group: a group reward gets it entire.
            let one_group = vec![0; responses.len()];
            let scores = score_rollout(self.spec, self.reward.as_mut(), self.task, &responses, &one_group)?;
            // A dropped sample leaves its group; the others keep their rewards.
            let kept: (Vec<StreamSample>, Vec<f32>) =
                samples.into_iter().zip(&scores.outcomes).filter_map(|(s, o)| o.reward().map(|r| (s, r))).unzip();
            Some((kept.0, kept.1, None, scores.parts))
        };
        let mut st = shared.lock();
        let State { buffer, source, counters, .. } = &mut *st;
        match scored {
            None => buffer.abort(prompt, self.cfg.on_abort, source),
            Some((samples, _, episodes, _)) if samples.is_empty() => {
                // Nothing of the group trains; its episodes still count in the step's row.
                if let Some(p) = episodes {
                    counters.discarded.extend(p.results);
                }
                buffer.abort(prompt, DropAction::Discard, source)
            }
            Some((samples, rewards, episodes, reward_parts)) => {
                let g = Group { prompt, prompt_tokens: tokens, samples, rewards, episodes, reward_parts };
                buffer.finish(g, self.cfg.filter, source);
            }
        }
        drop(st);
        shared.cv.notify_all();
        Ok(())
    }

    /// Frees every live episode's state in the environment (the run stops, or a pause aborts).
    fn abandon_episodes(&mut self) {
        let Some((env, _)) = self.env.as_ref() else { return };
        for b in self.building.values_mut() {
            if let Some(p) = b.play.as_mut() {
                for e in p.live.iter_mut().filter_map(Option::take) {
                    e.abandon(env.env.as_ref());
                }
            }
        }
    }

    /// Aborts every request in flight (and every admitted group) for a retract/abort pause.
    fn abort_all(&mut self, shared: &Shared, engine: &mut dyn StreamEngine, action: DropAction) {
        let _ = engine.abort_all();
        self.requests.clear();
        self.abandon_episodes();
        let mut st = shared.lock();
        let State { buffer, source, .. } = &mut *st;
        for (_, b) in std::mem::take(&mut self.building) {
            buffer.abort(b.prompt, action, source);
        }
        drop(st);
        shared.cv.notify_all();
    }
}
