//! Drives a batch of episodes against one environment, turn by turn: every live episode's
//! context goes to the policy in one `generate` call (the engine batches them), then the
//! environment steps of that turn run concurrently (at most `concurrency` at once), each within
//! the turn's timeout and what is left of the episode's. Each episode keeps a TITO session: the
//! sampled ids as they are, observation ids appended (tokenised once, with the chat template's
//! delimiters). An episode ends when the environment says so, at the turn limit, when the model's
//! turn ends by length, when the next observation would overflow the context, at its deadline, or
//! when the environment fails (`EndReason`); only the policy failing stops the run.
//!
//! Compaction (`EpisodeLimits::compact`): instead of ending at a full context, the driver acts as
//! a harness that compacts its context (as Claude Code-style agents do): the next turn sees the
//! first observation, the last `keep_turns` turns with the observations after them (their ids as
//! sampled and as tokenised, never re-tokenised) and the new observation. That context does not
//! extend the last turn, so the session must use the `branching` rule: the compacted turn starts a
//! new chain, and each chain is a trajectory of its own.

pub use crate::spec::env::{EpisodePrompt, OnEnvError, RewardMode};

use super::{Action, EndReason, EnvFault, Environment, StepResult, Task, ToolFormat};
use crate::sample::FinishReason;
use crate::session::{message_key, output_key, retokenize, ChatCodec, MessageKey, Role, Rule, Session};
use crate::token::TokenId;
use crate::RunError;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, PartialEq)]
pub struct EpisodeLimits {
    /// Model turns per episode (>= 1).
    pub max_turns: usize,
    /// Longest wait for one environment call.
    pub turn_timeout: Duration,
    /// Longest episode, generation included.
    pub episode_timeout: Duration,
    /// Longest context in tokens: an observation that would pass it ends the episode.
    pub max_context: usize,
    /// Environment calls in flight at once (>= 1).
    pub concurrency: usize,
    pub tool_format: ToolFormat,
    pub reward: RewardMode,
    pub on_env_error: OnEnvError,
    /// The TITO rule of each episode's session.
    pub rule: Rule,
    /// Compact a full context, keeping this many of the last turns (`None`: the episode ends by
    /// `context_overflow`). Needs `rule = Branching`.
    pub compact: Option<usize>,
    /// What the first turn shows of a row whose prompt is a chat.
    pub prompt: EpisodePrompt,
    /// The rollout's `max_prompt_tokens`: the first turn's prompt as sent (the row's chat and the
    /// reset observation) may not be longer (E0510, `run_episodes`).
    pub max_prompt: Option<usize>,
}

impl Default for EpisodeLimits {
    fn default() -> Self {
        EpisodeLimits {
            max_turns: 4,
            turn_timeout: Duration::from_secs(30),
            episode_timeout: Duration::from_secs(600),
            max_context: 4096,
            concurrency: 16,
            tool_format: ToolFormat::Tag,
            reward: RewardMode::Final,
            on_env_error: OnEnvError::Drop,
            rule: Rule::Linear,
            compact: None,
            prompt: EpisodePrompt::Append,
            max_prompt: None,
        }
    }
}

/// Samples one turn per context, in order (the engine, batched).
pub type Policy<'a> = dyn FnMut(&[Vec<TokenId>]) -> Result<Vec<TurnSample>, RunError> + 'a;

/// One sampled turn, as the engine returns it.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnSample {
    pub ids: Vec<TokenId>,
    pub logprobs: Vec<f32>,
    /// Weight version per token (a single version repeated when it did not change).
    pub versions: Vec<u64>,
    pub finish: FinishReason,
    /// R3: the experts the engine routed the turn's context and output to, when recorded.
    pub routing: Option<crate::Routing>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct EpisodeResult {
    pub task: Task,
    /// The TITO session: its trajectories are what the trainer gets.
    pub session: Session,
    /// Reward by the `reward` mode, from the steps that answered.
    pub reward: f32,
    pub end: EndReason,
    /// What the environment did, when it failed.
    pub fault: Option<String>,
    pub turns: usize,
    /// Well-formed tool calls the model made; and turns whose tool call did not parse.
    pub tool_calls: usize,
    pub bad_tool_calls: usize,
    /// Observation tokens appended (delimiters included).
    pub observation_tokens: usize,
    /// Tokens a re-tokenising path would have got wrong on this episode.
    pub retokenize_mismatch: usize,
    /// Times the context was compacted.
    pub compactions: usize,
    /// What a plug-in layer's program reported beside its reward (`agent/<name>` metrics,
    /// metadata for samples.jsonl); `None` for an episode this driver stepped.
    pub reported: Option<Box<super::reported::Reported>>,
}

impl EpisodeResult {
    /// The reward to train on; `None` when the episode leaves the batch.
    pub fn training_reward(&self, on_env_error: OnEnvError) -> Option<f32> {
        match (self.end.is_fault(), on_env_error) {
            (true, OnEnvError::Drop) => None,
            _ => Some(self.reward),
        }
    }
}

/// One episode as it is played: its TITO session, the conversation so far, and why it ended.
/// `run_episodes` drives a batch of them turn by turn; the asynchronous executor drives each on
/// its own (a finished turn steps the environment and starts the next turn at once).
/// A turn of the conversation as compaction may keep it.
struct Compacted {
    /// The first kept turn; how many were asked to be kept.
    from: usize,
    keep: usize,
    ids: Vec<TokenId>,
    path: Vec<MessageKey>,
}

struct KeptTurn {
    output: Vec<TokenId>,
    output_key: MessageKey,
    observation: Vec<TokenId>,
    observation_key: MessageKey,
}

pub struct Episode {
    task: Task,
    start: Instant,
    first: String,
    session: Session,
    /// The conversation so far (message keys), and the ids not yet sampled on.
    path: Vec<MessageKey>,
    pending: Vec<TokenId>,
    /// Decoded earlier turns and the observations after them, for the naive path: the
    /// conversation as the next turn sees it (compaction drops what it leaves out).
    history: Vec<(String, Role, String)>,
    /// The first prompt's ids, and each turn of the conversation the next turn sees: its sampled
    /// ids and the observation ids after them, with their message keys (what compaction keeps).
    first_ids: Vec<TokenId>,
    kept: Vec<KeptTurn>,
    /// `pending` is the whole context of the next turn (after a compaction), not a suffix.
    fresh: bool,
    compactions: usize,
    /// Entries of `history` the last sampled turn saw.
    seen: usize,
    rewards: Vec<f32>,
    turns: usize,
    tool_calls: usize,
    bad_tool_calls: usize,
    observation_tokens: usize,
    end: Option<(EndReason, Option<String>)>,
    reset_ok: bool,
    /// The first prompt as sent is longer than the rollout's `max_prompt_tokens`: what to say,
    /// and the help.
    over_prompt: Option<(String, String)>,
}

impl Episode {
    /// Resets the environment for `task`: the first observation becomes the prompt of the first
    /// turn, or the episode ends (a fault, an observation that fills the context).
    pub fn start(env: &dyn Environment, task: Task, codec: &ChatCodec, limits: &EpisodeLimits) -> Episode {
        let mut e = Episode::new(task, limits.rule);
        e.reset(env, codec, limits);
        e
    }

    fn new(task: Task, rule: Rule) -> Episode {
        Episode {
            task,
            start: Instant::now(),
            first: String::new(),
            session: Session::new(rule),
            path: Vec::new(),
            pending: Vec::new(),
            history: Vec::new(),
            first_ids: Vec::new(),
            kept: Vec::new(),
            fresh: false,
            compactions: 0,
            seen: 0,
            rewards: Vec::new(),
            turns: 0,
            tool_calls: 0,
            bad_tool_calls: 0,
            observation_tokens: 0,
            end: None,
            reset_ok: false,
            over_prompt: None,
        }
    }

    fn reset(&mut self, env: &dyn Environment, codec: &ChatCodec, limits: &EpisodeLimits) {
        match env.reset(&self.task, limits.turn_timeout.min(limits.episode_timeout)) {
            Err(f) => self.end(f.reason(), Some(f.what().to_string())),
            Ok(obs) => {
                self.reset_ok = true;
                match row_codec(&self.task, codec, limits).first_prompt(&obs) {
                    Err(e) => self
                        .end(EndReason::EnvMalformed, Some(format!("the first observation cannot be tokenised: {e}"))),
                    Ok(ids) if limits.max_prompt.is_some_and(|m| ids.len() > m) => {
                        self.over_prompt = Some(over_prompt(&self.task, limits, ids.len()));
                        self.end(EndReason::ContextOverflow, None)
                    }
                    Ok(ids) if ids.len() >= limits.max_context => self.end(EndReason::ContextOverflow, None),
                    Ok(ids) => {
                        self.path.push(message_key("user", obs.as_bytes()));
                        self.first = obs;
                        self.first_ids = ids.clone();
                        self.pending = ids;
                    }
                }
            }
        }
    }

    pub fn task(&self) -> &Task {
        &self.task
    }

    /// E0510 when the first prompt as sent was longer than the rollout's `max_prompt_tokens`:
    /// the run stops, as it does for a prompt file's prompt over it before training.
    pub fn prompt_error(&self) -> Option<RunError> {
        self.over_prompt.as_ref().map(|(m, help)| RunError::new(crate::E_TOO_LONG, m.clone()).with_help(help.clone()))
    }

    /// Whether the episode wants another turn; one whose deadline passed ends here.
    pub fn wants_turn(&mut self, limits: &EpisodeLimits) -> bool {
        if self.end.is_some() {
            return false;
        }
        if self.left(limits).is_none() {
            self.end(EndReason::EpisodeTimeout, None);
            return false;
        }
        true
    }

    pub fn is_over(&self) -> bool {
        self.end.is_some()
    }

    /// What the next turn is conditioned on: the last turn's context and output, then the new
    /// observation's ids.
    pub fn context(&self) -> Vec<TokenId> {
        if self.fresh {
            return self.pending.clone();
        }
        match self.session.checkpoints.last() {
            Some(c) => c.prompt.iter().chain(&c.output).chain(&self.pending).copied().collect(),
            None => self.pending.clone(),
        }
    }

    /// Records a sampled turn (`ctx` is what it was conditioned on). Returns the action for the
    /// environment; `None` when the episode ended (by length) or the turn's tool call did not
    /// parse (the error is shown to the model as the next observation, not sent).
    pub fn record(
        &mut self,
        ctx: Vec<TokenId>,
        s: TurnSample,
        codec: &ChatCodec,
        limits: &EpisodeLimits,
    ) -> Result<Option<Action>, RunError> {
        let path = self.path.clone();
        let at = self
            .session
            .attach(&path)
            .map_err(|e| RunError::new(crate::E_BACKEND, format!("episode {}: {e}", self.task.episode)))?;
        self.session.record(at, &path, ctx, s.ids.clone(), s.logprobs, s.versions, s.finish);
        self.session.set_routing(s.routing);
        self.seen = self.history.len();
        self.path.push(output_key(&s.ids));
        self.kept.push(KeptTurn {
            output_key: output_key(&s.ids),
            output: s.ids.clone(),
            observation: Vec::new(),
            observation_key: 0,
        });
        self.pending.clear();
        self.fresh = false;
        self.turns += 1;
        if s.finish == FinishReason::Length {
            self.end(EndReason::Length, None);
            return Ok(None);
        }
        let text = codec.decode(&s.ids);
        match limits.tool_format.parse(&text) {
            Ok(calls) => {
                self.tool_calls += calls.len();
                Ok(Some(Action { text, tool_calls: calls }))
            }
            Err(bad) => {
                // A bad tool call is shown to the model, not sent to the environment.
                self.bad_tool_calls += 1;
                let obs = format!("<error>{bad}</error>");
                self.observe(codec, limits, Role::Tool, text, obs);
                Ok(None)
            }
        }
    }

    /// What an environment call for this episode needs, taken out so the call holds no lock.
    pub fn env_call(&self, limits: &EpisodeLimits) -> EnvCall {
        EnvCall { episode: self.task.episode.clone(), left: self.left(limits) }
    }

    /// Applies what the environment answered to `action`.
    pub fn apply(
        &mut self,
        r: Result<StepResult, EnvFault>,
        action: Action,
        codec: &ChatCodec,
        limits: &EpisodeLimits,
    ) {
        match r {
            Err(EnvFault::Timeout(_)) if self.left(limits).is_none() => self.end(EndReason::EpisodeTimeout, None),
            Err(f) => self.end(f.reason(), Some(f.what().to_string())),
            Ok(step) => {
                self.rewards.extend(step.reward);
                if step.terminated {
                    self.end(EndReason::Done, None);
                } else if step.truncated {
                    self.end(EndReason::Truncated, None);
                } else {
                    let role = if action.tool_calls.is_empty() { Role::User } else { Role::Tool };
                    self.observe(codec, limits, role, action.text, step.observation);
                }
            }
        }
    }

    /// The episode's result; frees its state in the environment.
    pub fn finish(self, env: &dyn Environment, codec: &ChatCodec, limits: &EpisodeLimits) -> EpisodeResult {
        if self.reset_ok {
            env.close(&self.task.episode);
        }
        let (end, fault) = self.end.clone().unwrap_or((EndReason::Done, None));
        let reward = match limits.reward {
            RewardMode::Final => self.rewards.last().copied().unwrap_or(0.0),
            RewardMode::Sum => self.rewards.iter().sum(),
        };
        let mismatch = naive_mismatch(&self, codec, limits);
        EpisodeResult {
            task: self.task,
            session: self.session,
            reward,
            end,
            fault,
            turns: self.turns,
            tool_calls: self.tool_calls,
            bad_tool_calls: self.bad_tool_calls,
            observation_tokens: self.observation_tokens,
            retokenize_mismatch: mismatch,
            compactions: self.compactions,
            reported: None,
        }
    }

    /// Frees the episode's state in the environment without a result (the run is stopping).
    pub fn abandon(&self, env: &dyn Environment) {
        if self.reset_ok {
            env.close(&self.task.episode);
        }
    }

    fn end(&mut self, reason: EndReason, fault: Option<String>) {
        if self.end.is_none() {
            self.end = Some((reason, fault));
        }
    }

    fn left(&self, limits: &EpisodeLimits) -> Option<Duration> {
        limits.episode_timeout.checked_sub(self.start.elapsed()).filter(|d| !d.is_zero())
    }

    /// Appends an observation after the last turn, or ends the episode at the turn limit or when
    /// it would overflow the context.
    fn observe(&mut self, codec: &ChatCodec, limits: &EpisodeLimits, role: Role, action_text: String, obs: String) {
        if self.turns >= limits.max_turns {
            return self.end(EndReason::MaxTurns, None);
        }
        let ids = match codec.observation(role, &obs) {
            Ok(ids) => ids,
            Err(e) => {
                return self.end(EndReason::EnvMalformed, Some(format!("an observation cannot be tokenised: {e}")))
            }
        };
        let key = message_key(if role == Role::Tool { "tool" } else { "user" }, obs.as_bytes());
        let used = self.session.checkpoints.last().map_or(0, |c| c.prompt.len() + c.output.len());
        let compacted = match limits.compact {
            _ if used + ids.len() < limits.max_context => None,
            Some(keep) if self.session.rule == Rule::Branching => {
                let c = self.compacted(keep, &ids, key);
                if c.ids.len() >= limits.max_context {
                    return self.end(EndReason::ContextOverflow, None);
                }
                Some(c)
            }
            _ => return self.end(EndReason::ContextOverflow, None),
        };
        self.observation_tokens += ids.len();
        if let Some(last) = self.kept.last_mut() {
            last.observation = ids.clone();
            last.observation_key = key;
        }
        match compacted {
            None => {
                self.history.push((action_text, role, obs));
                self.path.push(key);
                self.pending = ids;
            }
            Some(c) => {
                self.compactions += 1;
                self.kept.drain(..c.from);
                // The naive path re-renders what the next turn sees: the kept turns (an
                // observation kept without its turn follows an empty one).
                self.history.push((if c.keep == 0 { String::new() } else { action_text }, role, obs));
                let dropped = self.history.len().saturating_sub(self.kept.len().max(1));
                self.history.drain(..dropped);
                self.path = c.path;
                self.pending = c.ids;
                self.fresh = true;
            }
        }
    }

    /// The next turn's context after a compaction keeping the last `keep` turns (the newest one is
    /// the turn just sampled, answered by the observation `obs`): the first observation, those
    /// turns with the observations after them, and `obs`. Its path starts with a key of its own,
    /// so no checkpoint's conversation is a prefix of it and the next turn starts a new chain.
    fn compacted(&self, keep: usize, obs: &[TokenId], obs_key: MessageKey) -> Compacted {
        let from = self.kept.len().saturating_sub(keep);
        let mut ids = self.first_ids.clone();
        let mut path = vec![
            message_key("compaction", &(self.compactions as u64 + 1).to_le_bytes()),
            message_key("user", self.first.as_bytes()),
        ];
        let newest = self.kept.len().saturating_sub(1);
        for (i, t) in self.kept.iter().enumerate().skip(from) {
            ids.extend(&t.output);
            path.push(t.output_key);
            if i < newest {
                ids.extend(&t.observation);
                path.push(t.observation_key);
            }
        }
        ids.extend(obs);
        path.push(obs_key);
        Compacted { from, keep, ids, path }
    }
}

/// One environment step of one episode: within the turn's timeout and what is left of the
/// episode's.
pub struct EnvCall {
    episode: String,
    left: Option<Duration>,
}

impl EnvCall {
    pub fn run(&self, env: &dyn Environment, action: &Action, limits: &EpisodeLimits) -> Result<StepResult, EnvFault> {
        match self.left {
            None => Err(EnvFault::Timeout("the episode's deadline passed".into())),
            Some(left) => env.step(&self.episode, action, limits.turn_timeout.min(left)),
        }
    }
}

/// Runs `f(i)` for every index in `todo` on at most `concurrency` threads.
pub(crate) fn parallel<F: Fn(usize) + Sync>(todo: &[usize], concurrency: usize, f: F) {
    let next = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..concurrency.clamp(1, todo.len().max(1)) {
            s.spawn(|| loop {
                let k = next.fetch_add(1, Ordering::Relaxed);
                let Some(&i) = todo.get(k) else { break };
                f(i);
            });
        }
    });
}

/// Plays one episode per task to its end. `generate` samples one turn per context (in order);
/// its error (the engine failed) is the only error returned.
pub fn run_episodes(
    env: &dyn Environment,
    tasks: &[Task],
    codec: &ChatCodec,
    limits: &EpisodeLimits,
    generate: &mut Policy,
) -> Result<Vec<EpisodeResult>, RunError> {
    let lives: Vec<Mutex<Episode>> = tasks.iter().map(|t| Mutex::new(Episode::new(t.clone(), limits.rule))).collect();
    let lock = |i: usize| lives[i].lock().unwrap_or_else(|p| p.into_inner());
    let all: Vec<usize> = (0..tasks.len()).collect();
    parallel(&all, limits.concurrency, |i| {
        // The reset call runs outside the lock of every other episode.
        let mut e = Episode::new(lock(i).task.clone(), limits.rule);
        e.reset(env, codec, limits);
        *lock(i) = e;
    });
    if let Some(err) = (0..lives.len()).find_map(|i| lock(i).prompt_error()) {
        for i in 0..lives.len() {
            lock(i).abandon(env);
        }
        return Err(err);
    }
    loop {
        let mut active = Vec::new();
        let mut contexts = Vec::new();
        for i in 0..lives.len() {
            let mut l = lock(i);
            if l.wants_turn(limits) {
                active.push(i);
                contexts.push(l.context());
            }
        }
        if active.is_empty() {
            break;
        }
        let samples = match generate(&contexts) {
            Ok(s) if s.len() == contexts.len() => s,
            failed => {
                // The run stops: free every episode the environment holds first.
                for i in 0..lives.len() {
                    lock(i).abandon(env);
                }
                return Err(match failed {
                    Err(e) => e,
                    Ok(s) => RunError::new(
                        crate::E_BACKEND,
                        format!("the engine answered {} turns for {} contexts", s.len(), contexts.len()),
                    ),
                });
            }
        };
        // Record each turn; the ones that act on the environment step below.
        let mut stepping = Vec::new();
        let mut actions: BTreeMap<usize, Action> = BTreeMap::new();
        for ((&i, ctx), s) in active.iter().zip(contexts).zip(samples) {
            if let Some(a) = lock(i).record(ctx, s, codec, limits)? {
                actions.insert(i, a);
                stepping.push(i);
            }
        }
        let answers: Vec<Mutex<Option<Result<StepResult, EnvFault>>>> =
            (0..lives.len()).map(|_| Mutex::new(None)).collect();
        parallel(&stepping, limits.concurrency, |i| {
            // The environment call runs without holding the episode's lock.
            let call = lock(i).env_call(limits);
            let r = call.run(env, &actions[&i], limits);
            *answers[i].lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
        });
        for i in stepping {
            let r = answers[i].lock().unwrap_or_else(|p| p.into_inner()).take();
            if let (Some(r), Some(a)) = (r, actions.remove(&i)) {
                lock(i).apply(r, a, codec, limits);
            }
        }
    }
    Ok(lives
        .into_iter()
        .map(|m| m.into_inner().unwrap_or_else(|p| p.into_inner()).finish(env, codec, limits))
        .collect())
}

/// E0510's message and help for `task`'s first prompt of `len` tokens, over `limits.max_prompt`:
/// what that prompt held (the row's chat only where `limits.prompt` shows it), and what shortens it.
fn over_prompt(task: &Task, limits: &EpisodeLimits, len: usize) -> (String, String) {
    let chat = task.prompt.is_array() && limits.prompt != EpisodePrompt::ObservationOnly;
    let held = match (chat, limits.prompt) {
        (false, _) => "the reset observation",
        (true, EpisodePrompt::Replace) => "the row's chat with the reset observation as its user message",
        (true, _) => "the row's chat, then the reset observation",
    };
    let message = format!(
        "episode {}: its first prompt as sent ({held}, as rendered; env_reward.prompt = {}) is {len} tokens, over the rollout's max_prompt_tokens {}",
        task.episode,
        limits.prompt.name(),
        limits.max_prompt.unwrap_or(0)
    );
    let mut help = "raise the rollout's `max_prompt_tokens` (and the model's `max_len` with it), or shorten the \
                    environment's first observation"
        .to_string();
    if chat {
        help.push_str(", shorten the rows' chat, or show the observation alone (env_reward.prompt = observation_only)");
    }
    (message, help)
}

/// The codec of `task`'s first prompt: its row's chat messages joined as `limits.prompt` says
/// (a row whose prompt is a string, or `observation_only`: the observation alone).
pub(crate) fn row_codec<'c>(task: &Task, codec: &ChatCodec<'c>, limits: &EpisodeLimits) -> ChatCodec<'c> {
    let messages = match (&task.prompt, limits.prompt) {
        (_, EpisodePrompt::ObservationOnly) => &[][..],
        (serde_json::Value::Array(m), _) => m.as_slice(),
        _ => &[][..],
    };
    codec.for_row(messages, limits.prompt == EpisodePrompt::Replace)
}

/// The re-tokenising path's error on the episode's last turn (0 before any turn).
fn naive_mismatch(l: &Episode, codec: &ChatCodec, limits: &EpisodeLimits) -> usize {
    let Some(last) = l.session.checkpoints.last() else { return 0 };
    // The turns before the last one, as the last turn saw them (after any compaction).
    let codec = row_codec(&l.task, codec, limits);
    let Ok(naive) = codec.naive_ids(&l.first, &l.history[..l.seen.min(l.history.len())], &last.output) else {
        return 0;
    };
    let tito: Vec<TokenId> = last.prompt.iter().chain(&last.output).copied().collect();
    retokenize::mismatch(&tito, &naive)
}

/// The run's metrics over finished episodes: `rollout/episode_end/<reason>` (counts),
/// `rollout/turns` (mean), `rollout/tool_use_rate` (episodes with a tool call),
/// `rollout/tool_calls`, `rollout/bad_tool_calls`, `rollout/observation_tokens` (sums),
/// `rollout/episode_reward` (mean), `tito/retokenize_mismatch` and `rollout/compactions` (sums);
/// and a plug-in layer's programs' `agent/<name>` means (`reported::metrics`).
pub fn metrics(results: &[EpisodeResult]) -> Vec<(String, f64)> {
    let n = results.len().max(1) as f64;
    let mut m: Vec<(String, f64)> = Vec::new();
    for r in EndReason::ALL {
        let c = results.iter().filter(|e| e.end == r).count();
        if c > 0 {
            m.push((r.metric(), c as f64));
        }
    }
    let sum = |f: &dyn Fn(&EpisodeResult) -> f64| results.iter().map(f).sum::<f64>();
    m.push(("rollout/turns".into(), sum(&|e| e.turns as f64) / n));
    m.push(("rollout/tool_use_rate".into(), sum(&|e| (e.tool_calls > 0) as u8 as f64) / n));
    m.push(("rollout/tool_calls".into(), sum(&|e| e.tool_calls as f64)));
    m.push(("rollout/bad_tool_calls".into(), sum(&|e| e.bad_tool_calls as f64)));
    m.push(("rollout/observation_tokens".into(), sum(&|e| e.observation_tokens as f64)));
    m.push(("rollout/episode_reward".into(), sum(&|e| e.reward as f64) / n));
    m.push(("tito/retokenize_mismatch".into(), sum(&|e| e.retokenize_mismatch as f64)));
    m.push(("rollout/compactions".into(), sum(&|e| e.compactions as f64)));
    m.extend(super::reported::metrics(results));
    m
}

#[cfg(test)]
mod tests;
