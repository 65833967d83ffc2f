//! Drives a batch of episodes against one environment, turn by turn: every live episode's
//! context goes to the policy in one `generate` call (the engine batches them), then the
//! environment steps of that turn run concurrently (at most `concurrency` at once), each within
//! the turn's timeout and what is left of the episode's. Each episode keeps a TITO session: the
//! sampled ids as they are, observation ids appended (tokenised once, with the chat template's
//! delimiters). An episode ends when the environment says so, at the turn limit, when the model's
//! turn ends by length, when the next observation would overflow the context, at its deadline, or
//! when the environment fails (`EndReason`); only the policy failing stops the run.

use super::{Action, EndReason, EnvFault, Environment, Task, ToolFormat};
use crate::backend::FinishReason;
use crate::session::{message_key, output_key, retokenize, ChatCodec, MessageKey, Role, Rule, Session};
use crate::tasks::TokenId;
use crate::RunError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How an episode's reward is made from the environment's per-step rewards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RewardMode {
    /// The last reward the environment gave (0 when none).
    #[default]
    Final,
    /// The sum of every step's reward.
    Sum,
}

/// What an episode ended by an environment fault trains on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnEnvError {
    /// Leaves the batch (its group keeps the others).
    #[default]
    Drop,
    /// Trains on the reward so far (0 under `final` when none came).
    Score,
}

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

/// Everything a live episode carries between turns.
struct Live {
    task: Task,
    start: Instant,
    first: String,
    session: Session,
    /// The conversation so far (message keys), and the ids not yet sampled on.
    path: Vec<MessageKey>,
    pending: Vec<TokenId>,
    /// Decoded earlier turns and the observations after them, for the naive path.
    history: Vec<(String, Role, String)>,
    rewards: Vec<f32>,
    turns: usize,
    tool_calls: usize,
    bad_tool_calls: usize,
    observation_tokens: usize,
    end: Option<(EndReason, Option<String>)>,
    reset_ok: bool,
}

impl Live {
    fn context(&self) -> Vec<TokenId> {
        match self.session.checkpoints.last() {
            Some(c) => c.prompt.iter().chain(&c.output).chain(&self.pending).copied().collect(),
            None => self.pending.clone(),
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
}

/// Runs `f(i)` for every index in `todo` on at most `concurrency` threads.
fn parallel<F: Fn(usize) + Sync>(todo: &[usize], concurrency: usize, f: F) {
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
    let lives: Vec<Mutex<Live>> = tasks
        .iter()
        .map(|t| {
            Mutex::new(Live {
                task: t.clone(),
                start: Instant::now(),
                first: String::new(),
                session: Session::new(Rule::Linear),
                path: Vec::new(),
                pending: Vec::new(),
                history: Vec::new(),
                rewards: Vec::new(),
                turns: 0,
                tool_calls: 0,
                bad_tool_calls: 0,
                observation_tokens: 0,
                end: None,
                reset_ok: false,
            })
        })
        .collect();
    let lock = |i: usize| lives[i].lock().unwrap_or_else(|p| p.into_inner());
    let all: Vec<usize> = (0..tasks.len()).collect();
    parallel(&all, limits.concurrency, |i| {
        let task = lock(i).task.clone();
        let r = env.reset(&task, limits.turn_timeout.min(limits.episode_timeout));
        let mut l = lock(i);
        match r {
            Err(f) => l.end(f.reason(), Some(f.what().to_string())),
            Ok(obs) => {
                l.reset_ok = true;
                match codec.first_prompt(&obs) {
                    Err(e) => {
                        l.end(EndReason::EnvMalformed, Some(format!("the first observation cannot be tokenised: {e}")))
                    }
                    Ok(ids) if ids.len() >= limits.max_context => l.end(EndReason::ContextOverflow, None),
                    Ok(ids) => {
                        l.path.push(message_key("user", obs.as_bytes()));
                        l.first = obs;
                        l.pending = ids;
                    }
                }
            }
        }
    });
    loop {
        let mut active = Vec::new();
        let mut contexts = Vec::new();
        for i in 0..lives.len() {
            let mut l = lock(i);
            if l.end.is_some() {
                continue;
            }
            if l.left(limits).is_none() {
                l.end(EndReason::EpisodeTimeout, None);
                continue;
            }
            active.push(i);
            contexts.push(l.context());
        }
        if active.is_empty() {
            break;
        }
        let samples = match generate(&contexts) {
            Ok(s) if s.len() == contexts.len() => s,
            failed => {
                // The run stops: free every episode the environment holds first.
                for i in 0..lives.len() {
                    let (open, episode) = {
                        let l = lock(i);
                        (l.reset_ok, l.task.episode.clone())
                    };
                    if open {
                        env.close(&episode);
                    }
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
            let mut l = lock(i);
            let path = l.path.clone();
            let at = match l.session.attach(&path) {
                Ok(at) => at,
                Err(e) => return Err(RunError::new(crate::E_BACKEND, format!("episode {}: {e}", l.task.episode))),
            };
            l.session.record(at, &path, ctx, s.ids.clone(), s.logprobs, s.versions, s.finish);
            l.path.push(output_key(&s.ids));
            l.pending.clear();
            l.turns += 1;
            if s.finish == FinishReason::Length {
                l.end(EndReason::Length, None);
                continue;
            }
            let text = codec.decode(&s.ids);
            match limits.tool_format.parse(&text) {
                Ok(calls) => {
                    l.tool_calls += calls.len();
                    actions.insert(i, Action { text, tool_calls: calls });
                    stepping.push(i);
                }
                Err(bad) => {
                    // A bad tool call is shown to the model, not sent to the environment.
                    l.bad_tool_calls += 1;
                    let obs = format!("<error>{bad}</error>");
                    observe(&mut l, codec, limits, Role::Tool, text, obs);
                }
            }
        }
        parallel(&stepping, limits.concurrency, |i| {
            let (episode, left) = {
                let l = lock(i);
                (l.task.episode.clone(), l.left(limits))
            };
            let action = &actions[&i];
            let r = match left {
                None => Err(EnvFault::Timeout("the episode's deadline passed".into())),
                Some(left) => env.step(&episode, action, limits.turn_timeout.min(left)),
            };
            let mut l = lock(i);
            match r {
                Err(EnvFault::Timeout(_)) if l.left(limits).is_none() => l.end(EndReason::EpisodeTimeout, None),
                Err(f) => l.end(f.reason(), Some(f.what().to_string())),
                Ok(step) => {
                    l.rewards.extend(step.reward);
                    if step.terminated {
                        l.end(EndReason::Done, None);
                    } else if step.truncated {
                        l.end(EndReason::Truncated, None);
                    } else {
                        let role = if action.tool_calls.is_empty() { Role::User } else { Role::Tool };
                        observe(&mut l, codec, limits, role, action.text.clone(), step.observation);
                    }
                }
            }
        });
    }
    let results = lives
        .into_iter()
        .map(|m| {
            let l = m.into_inner().unwrap_or_else(|p| p.into_inner());
            if l.reset_ok {
                env.close(&l.task.episode);
            }
            let (end, fault) = l.end.clone().unwrap_or((EndReason::Done, None));
            let reward = match limits.reward {
                RewardMode::Final => l.rewards.last().copied().unwrap_or(0.0),
                RewardMode::Sum => l.rewards.iter().sum(),
            };
            let mismatch = naive_mismatch(&l, codec);
            EpisodeResult {
                task: l.task,
                session: l.session,
                reward,
                end,
                fault,
                turns: l.turns,
                tool_calls: l.tool_calls,
                bad_tool_calls: l.bad_tool_calls,
                observation_tokens: l.observation_tokens,
                retokenize_mismatch: mismatch,
            }
        })
        .collect();
    Ok(results)
}

/// Appends an observation after the last turn, or ends the episode at the turn limit or when it
/// would overflow the context.
fn observe(l: &mut Live, codec: &ChatCodec, limits: &EpisodeLimits, role: Role, action_text: String, obs: String) {
    if l.turns >= limits.max_turns {
        return l.end(EndReason::MaxTurns, None);
    }
    let ids = match codec.observation(role, &obs) {
        Ok(ids) => ids,
        Err(e) => return l.end(EndReason::EnvMalformed, Some(format!("an observation cannot be tokenised: {e}"))),
    };
    let used = l.session.checkpoints.last().map_or(0, |c| c.prompt.len() + c.output.len());
    if used + ids.len() >= limits.max_context {
        return l.end(EndReason::ContextOverflow, None);
    }
    l.observation_tokens += ids.len();
    l.path.push(message_key(if role == Role::Tool { "tool" } else { "user" }, obs.as_bytes()));
    l.pending = ids;
    l.history.push((action_text, role, obs));
}

/// The re-tokenising path's error on the episode's last turn (0 before any turn).
fn naive_mismatch(l: &Live, codec: &ChatCodec) -> usize {
    let Some(last) = l.session.checkpoints.last() else { return 0 };
    let before = l.session.checkpoints.len() - 1;
    let Ok(naive) = codec.naive_ids(&l.first, &l.history[..before.min(l.history.len())], &last.output) else {
        return 0;
    };
    let tito: Vec<TokenId> = last.prompt.iter().chain(&last.output).copied().collect();
    retokenize::mismatch(&tito, &naive)
}

/// The run's metrics over finished episodes: `rollout/episode_end/<reason>` (counts),
/// `rollout/turns` (mean), `rollout/tool_use_rate` (episodes with a tool call),
/// `rollout/tool_calls`, `rollout/bad_tool_calls`, `rollout/observation_tokens` (sums),
/// `rollout/episode_reward` (mean) and `tito/retokenize_mismatch` (sum).
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
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::calculator::{CalculatorSpec, ALPHABET};
    use crate::env::{Calculator, StepResult};
    use crate::tasks::{CharTokenizer, EOS};
    use crate::tokenize::Tokenizer;
    use serde_json::json;

    fn tok() -> Tokenizer {
        Tokenizer::Char(CharTokenizer::new(ALPHABET.chars()))
    }

    fn tasks(n: usize) -> Vec<Task> {
        (0..n)
            .map(|i| Task {
                episode: format!("e{i}"),
                prompt: json!(null),
                label: json!(null),
                metadata: json!({}),
                seed: i as u64,
            })
            .collect()
    }

    fn text_of(t: &Tokenizer, ids: &[TokenId]) -> String {
        let Tokenizer::Char(c) = t else { unreachable!() };
        ids.iter().filter_map(|&id| ALPHABET.chars().find(|&ch| c.id(ch) == Some(id))).collect()
    }

    fn say(t: &Tokenizer, text: &str, finish: FinishReason) -> TurnSample {
        let Tokenizer::Char(c) = t else { unreachable!() };
        let mut ids = c.encode(text).unwrap();
        if finish == FinishReason::Stop {
            ids.push(EOS);
        }
        let n = ids.len();
        TurnSample { ids, logprobs: vec![-0.25; n], versions: vec![7; n], finish }
    }

    /// A policy that uses the tool, then copies its result.
    fn solver(t: &Tokenizer) -> impl FnMut(&[Vec<TokenId>]) -> Result<Vec<TurnSample>, RunError> + '_ {
        move |ctxs| {
            Ok(ctxs
                .iter()
                .map(|c| {
                    let text = text_of(t, c);
                    match text.rsplit_once("<result>") {
                        Some((_, r)) => say(t, r.trim_end_matches("</result>"), FinishReason::Stop),
                        None => {
                            say(t, &format!("<tool>calc {}</tool>", text.trim_end_matches("=?")), FinishReason::Stop)
                        }
                    }
                })
                .collect())
        }
    }

    #[test]
    fn a_policy_that_uses_the_tool_solves_every_episode() {
        let t = tok();
        let codec = ChatCodec::new(&t, None).unwrap();
        let env = Calculator::new(CalculatorSpec::default());
        let limits = EpisodeLimits { concurrency: 2, ..EpisodeLimits::default() };
        let rs = run_episodes(&env, &tasks(3), &codec, &limits, &mut solver(&t)).unwrap();
        for r in &rs {
            assert_eq!(
                (r.end, r.reward, r.turns, r.tool_calls, r.retokenize_mismatch),
                (EndReason::Done, 1.0, 2, 1, 0)
            );
            let ts = r.session.trajectories();
            assert_eq!(ts.len(), 1);
            let tr = &ts[0];
            let turn1 = &r.session.checkpoints[0].output;
            let turn2 = &r.session.checkpoints[1].output;
            // Sampled, observation, sampled: the mask follows exactly.
            assert_eq!(tr.response.len(), turn1.len() + r.observation_tokens + turn2.len());
            assert_eq!(tr.sampled_tokens(), turn1.len() + turn2.len());
            assert!(tr.loss_mask[turn1.len()..turn1.len() + r.observation_tokens].iter().all(|m| *m == 0.0));
            assert_eq!(
                text_of(&t, &tr.response[turn1.len()..turn1.len() + r.observation_tokens]),
                format!("<result>{}</result>", text_of(&t, &turn2[..turn2.len() - 1]))
            );
        }
        let m = metrics(&rs);
        assert!(m.contains(&("rollout/episode_end/done".into(), 3.0)));
        assert!(m.contains(&("rollout/tool_use_rate".into(), 1.0)));
        assert!(m.contains(&("tito/retokenize_mismatch".into(), 0.0)));
    }

    fn one(
        t: &Tokenizer,
        env: &dyn Environment,
        limits: &EpisodeLimits,
        turn: &str,
        finish: FinishReason,
    ) -> EpisodeResult {
        let codec = ChatCodec::new(t, None).unwrap();
        let mut policy = |ctxs: &[Vec<TokenId>]| Ok(ctxs.iter().map(|_| say(t, turn, finish)).collect());
        run_episodes(env, &tasks(1), &codec, limits, &mut policy).unwrap().remove(0)
    }

    #[test]
    fn limits_end_episodes() {
        let t = tok();
        let env = Calculator::new(CalculatorSpec { tool_reward: 0.5, ..Default::default() });
        let three = EpisodeLimits { max_turns: 3, reward: RewardMode::Sum, ..EpisodeLimits::default() };
        let r = one(&t, &env, &three, "<tool>calc 1+1</tool>", FinishReason::Stop);
        assert_eq!((r.end, r.turns, r.tool_calls, r.reward), (EndReason::MaxTurns, 3, 3, 1.5));
        let fin = EpisodeLimits { reward: RewardMode::Final, ..three.clone() };
        assert_eq!(one(&t, &env, &fin, "<tool>calc 1+1</tool>", FinishReason::Stop).reward, 0.5);
        // A bad call is an observation: the episode goes on to its turn limit.
        let r = one(&t, &env, &three, "<tool>calc 1", FinishReason::Stop);
        assert_eq!((r.end, r.turns, r.bad_tool_calls, r.tool_calls), (EndReason::MaxTurns, 3, 3, 0));
        let obs = &r.session.checkpoints[1].prompt
            [r.session.checkpoints[0].prompt.len() + r.session.checkpoints[0].output.len()..];
        assert_eq!(text_of(&t, obs), "<error><tool> without </tool></error>");
        let r = one(&t, &env, &three, "<tool>calc 1+1", FinishReason::Length);
        assert_eq!((r.end, r.turns), (EndReason::Length, 1));
        let tight = EpisodeLimits { max_context: 40, ..three };
        let r = one(&t, &env, &tight, "<tool>calc 1+1</tool>", FinishReason::Stop);
        assert_eq!(r.end, EndReason::ContextOverflow);
        assert!(r.session.checkpoints.iter().all(|c| c.prompt.len() + c.output.len() < 40));
    }

    /// Misbehaves by episode: `seed` 0 answers, 1 crashes, 2 is malformed, 3 hangs past the
    /// turn timeout, 4 errors at reset.
    struct Flaky;

    impl Environment for Flaky {
        fn name(&self) -> &str {
            "flaky"
        }
        fn reset(&self, task: &Task, _: Duration) -> Result<String, EnvFault> {
            if task.seed == 4 {
                return Err(EnvFault::Error("no such task".into()));
            }
            Ok("1*1=?".into())
        }
        fn step(&self, episode: &str, _: &Action, timeout: Duration) -> Result<StepResult, EnvFault> {
            match episode {
                "e1" => Err(EnvFault::Crashed("exited (status 3)".into())),
                "e2" => Err(EnvFault::Malformed("not json".into())),
                "e3" => {
                    std::thread::sleep(timeout);
                    Err(EnvFault::Timeout("no answer".into()))
                }
                _ => {
                    Ok(StepResult { observation: String::new(), reward: Some(1.0), terminated: true, truncated: false })
                }
            }
        }
        fn close(&self, _: &str) {}
    }

    #[test]
    fn environment_faults_end_their_episode_not_the_run() {
        let t = tok();
        let codec = ChatCodec::new(&t, None).unwrap();
        let limits = EpisodeLimits { turn_timeout: Duration::from_millis(50), ..EpisodeLimits::default() };
        let mut policy = |ctxs: &[Vec<TokenId>]| Ok(ctxs.iter().map(|_| say(&t, "1", FinishReason::Stop)).collect());
        let rs = run_episodes(&Flaky, &tasks(5), &codec, &limits, &mut policy).unwrap();
        let ends: Vec<_> = rs.iter().map(|r| r.end).collect();
        use EndReason::*;
        assert_eq!(ends, vec![Done, EnvCrashed, EnvMalformed, EnvTimeout, EnvError]);
        assert_eq!(rs[1].fault.as_deref(), Some("exited (status 3)"));
        assert_eq!(rs[0].training_reward(OnEnvError::Drop), Some(1.0));
        assert_eq!(rs[1].training_reward(OnEnvError::Drop), None);
        assert_eq!(rs[1].training_reward(OnEnvError::Score), Some(0.0));
        // The episode deadline bounds a slow environment too.
        let short = EpisodeLimits {
            turn_timeout: Duration::from_secs(5),
            episode_timeout: Duration::from_millis(80),
            ..limits
        };
        let rs = run_episodes(&Flaky, &tasks(4), &codec, &short, &mut policy).unwrap();
        assert_eq!(rs[3].end, EpisodeTimeout);
        let m = metrics(&rs);
        assert!(m.contains(&("rollout/episode_end/episode_timeout".into(), 1.0)), "{m:?}");
    }

    #[test]
    fn the_engine_failing_stops_the_run() {
        let t = tok();
        let codec = ChatCodec::new(&t, None).unwrap();
        let env = Calculator::new(CalculatorSpec::default());
        let mut policy = |_: &[Vec<TokenId>]| Err(RunError::new(crate::E_BACKEND, "engine died"));
        let e = run_episodes(&env, &tasks(2), &codec, &EpisodeLimits::default(), &mut policy).unwrap_err();
        assert_eq!(e.message, "engine died");
    }
}
