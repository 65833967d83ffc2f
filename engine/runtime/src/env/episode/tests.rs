//! The episode driver on scripted policies: tool use, limits, faults, compaction, the buffer's
//! view of a group.

use super::*;
use crate::env::calculator::{CalculatorSpec, ALPHABET};
use crate::env::{Calculator, StepResult};
use crate::token::EOS;
use crate::tokenize::CharTokenizer;
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
    TurnSample { ids, logprobs: vec![-0.25; n], versions: vec![7; n], finish, routing: None }
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
                    None => say(t, &format!("<tool>calc {}</tool>", text.trim_end_matches("=?")), FinishReason::Stop),
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
        assert_eq!((r.end, r.reward, r.turns, r.tool_calls, r.retokenize_mismatch), (EndReason::Done, 1.0, 2, 1, 0));
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

#[test]
fn a_buffered_group_carries_each_episodes_prompt_mask_and_reward() {
    // The asynchronous buffer's view of a group (run::step::episodes::buffered_group): what the
    // trainer gets for an episode is its TITO trajectory, observations masked.
    let t = tok();
    let codec = ChatCodec::new(&t, None).unwrap();
    let env = Calculator::new(CalculatorSpec::default());
    let mut rs = run_episodes(&env, &tasks(3), &codec, &EpisodeLimits::default(), &mut solver(&t)).unwrap();
    rs[2].end = EndReason::EnvCrashed;
    let (samples, rewards, parts) = crate::run::step::episodes::buffered_group(rs.clone(), OnEnvError::Drop);
    assert_eq!((samples.len(), rewards, parts.results.len()), (2, vec![1.0, 1.0], 3));
    for (i, s) in samples.iter().enumerate() {
        let tr = &rs[i].session.trajectories()[0];
        assert_eq!((&s.response, &parts.prompts[i], &parts.masks[i]), (&tr.response, &tr.prompt, &tr.loss_mask));
        assert_eq!(parts.masks[i].iter().filter(|m| **m == 0.0).count(), rs[i].observation_tokens);
        assert_eq!((s.finish, s.oldest_version(), s.token_versions().len()), (FinishReason::Stop, 7, s.response.len()));
    }
    let (kept, ..) = crate::run::step::episodes::buffered_group(rs, OnEnvError::Score);
    assert_eq!((kept.len(), kept[2].finish), (3, FinishReason::Length));
}

#[test]
fn a_compacted_episode_branches_into_a_new_chain() {
    // Every turn calls the tool; the context holds the question and about two calls with
    // their results. Compaction keeps the first observation and the last turn, so each
    // compaction starts a new TITO chain (branching) whose prompt is exactly those ids.
    let t = tok();
    let codec = ChatCodec::new(&t, None).unwrap();
    let env = Calculator::new(CalculatorSpec::default());
    let call = "<tool>calc 1+1</tool>";
    let limits = EpisodeLimits {
        max_turns: 6,
        max_context: 64,
        rule: Rule::Branching,
        compact: Some(1),
        ..EpisodeLimits::default()
    };
    let r = one(&t, &env, &limits, call, FinishReason::Stop);
    assert_eq!((r.end, r.turns), (EndReason::MaxTurns, 6), "{r:?}");
    assert!(r.compactions >= 2, "{}", r.compactions);
    let chains = r.session.trajectories();
    assert_eq!(chains.len(), r.compactions + 1);
    let first = &r.session.checkpoints[0].prompt;
    let turn = say(&t, call, FinishReason::Stop).ids;
    let obs = codec.observation(Role::Tool, "<result>2</result>").unwrap();
    for c in &chains[1..] {
        // First observation, the kept turn, its result: ids as sampled and as tokenised once.
        let want: Vec<TokenId> = first.iter().chain(&turn).chain(&obs).copied().collect();
        assert_eq!(c.prompt, want);
    }
    // No turn was asked with a context of the model's length or more.
    assert!(r.session.checkpoints.iter().all(|c| c.prompt.len() < 64));
    // Every sampled turn is trained on exactly once, in one chain or another.
    let sampled: usize = chains.iter().map(|c| c.sampled_tokens()).sum();
    assert_eq!(sampled, 6 * turn.len());
    assert_eq!(r.retokenize_mismatch, 0);
    // Without compaction (or under the linear rule, which cannot start a new chain), the
    // same episode ends when its context is full.
    for l in [EpisodeLimits { compact: None, ..limits.clone() }, EpisodeLimits { rule: Rule::Linear, ..limits }] {
        let r = one(&t, &env, &l, call, FinishReason::Stop);
        assert_eq!((r.end, r.compactions, r.session.trajectories().len()), (EndReason::ContextOverflow, 0, 1));
    }
}

#[test]
fn compaction_keeping_no_turn_shows_the_question_and_the_last_observation() {
    let t = tok();
    let codec = ChatCodec::new(&t, None).unwrap();
    let env = Calculator::new(CalculatorSpec::default());
    let call = "<tool>calc 1+1</tool>";
    let limits = EpisodeLimits {
        max_turns: 3,
        max_context: 40,
        rule: Rule::Branching,
        compact: Some(0),
        ..EpisodeLimits::default()
    };
    let r = one(&t, &env, &limits, call, FinishReason::Stop);
    assert_eq!(r.end, EndReason::MaxTurns);
    let obs = codec.observation(Role::Tool, "<result>2</result>").unwrap();
    let first = &r.session.checkpoints[0].prompt;
    let want: Vec<TokenId> = first.iter().chain(&obs).copied().collect();
    assert_eq!(r.session.checkpoints[1].prompt, want);
    assert_eq!(r.session.checkpoints[1].parent, None);
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
            _ => Ok(StepResult { observation: String::new(), reward: Some(1.0), terminated: true, truncated: false }),
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
    let short =
        EpisodeLimits { turn_timeout: Duration::from_secs(5), episode_timeout: Duration::from_millis(80), ..limits };
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

/// An environment whose reset says `the observation` and whose first step ends the episode.
struct Observes;

impl Environment for Observes {
    fn name(&self) -> &str {
        "observes"
    }
    fn reset(&self, _: &Task, _: Duration) -> Result<String, EnvFault> {
        Ok("the observation".into())
    }
    fn step(&self, _: &str, _: &Action, _: Duration) -> Result<StepResult, EnvFault> {
        Ok(StepResult { observation: String::new(), reward: Some(1.0), terminated: true, truncated: false })
    }
    fn close(&self, _: &str) {}
}

fn qwen3_chat() -> Tokenizer {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/hf/qwen3-chat");
    Tokenizer::Hf(Box::new(crate::tokenize::HfTokenizer::load(&dir).unwrap()))
}

/// The first context each episode's first turn was given, decoded, for `prompt` and `max_prompt`.
fn first_contexts(prompt: EpisodePrompt, max_prompt: Option<usize>) -> Result<Vec<String>, RunError> {
    let tok = qwen3_chat();
    let Tokenizer::Hf(h) = &tok else { unreachable!() };
    let codec = ChatCodec::new(&tok, None).unwrap();
    let chat = json!([
        {"role": "system", "content": "You are a careful guesser."},
        {"role": "user", "content": "Guess the product of 3 and 4."}
    ]);
    let tasks = vec![
        Task { episode: "chat".into(), prompt: chat, label: json!(12), metadata: json!({}), seed: 0 },
        Task { episode: "text".into(), prompt: json!("3*4="), label: json!(12), metadata: json!({}), seed: 1 },
    ];
    let eos = h.special().stop.first().copied().unwrap();
    let mut seen = Vec::new();
    let mut policy = |ctxs: &[Vec<TokenId>]| -> Result<Vec<TurnSample>, RunError> {
        seen.extend(ctxs.iter().map(|c| h.decode(c, false)));
        Ok(ctxs
            .iter()
            .map(|_| TurnSample {
                ids: vec![eos],
                logprobs: vec![0.0],
                versions: vec![0],
                finish: FinishReason::Stop,
                routing: None,
            })
            .collect())
    };
    let limits = EpisodeLimits { prompt, max_prompt, max_context: 4096, ..EpisodeLimits::default() };
    let rs = run_episodes(&Observes, &tasks, &codec, &limits, &mut policy)?;
    assert!(rs.iter().all(|r| r.end == EndReason::Done), "{:?}", rs.iter().map(|r| r.end).collect::<Vec<_>>());
    // The naive path renders the same first prompt: it sees no difference on these episodes.
    assert!(
        rs.iter().all(|r| r.retokenize_mismatch == 0),
        "{:?}",
        rs.iter().map(|r| r.retokenize_mismatch).collect::<Vec<_>>()
    );
    Ok(seen)
}

/// Issue #41: a data row whose prompt is a chat gives its messages to the episode's first turn;
/// the reset observation follows them (`append`), takes the user message's place (`replace`), or
/// is all the turn sees (`observation_only`). A row whose prompt is a string shows the observation
/// alone whatever the setting.
#[test]
fn a_rows_chat_prompt_reaches_the_episodes_first_turn() {
    let append = first_contexts(EpisodePrompt::Append, None).unwrap();
    let (sys, user, obs) = ("You are a careful guesser.", "Guess the product of 3 and 4.", "the observation");
    let at = |s: &str, x: &str| s.find(x).unwrap_or_else(|| panic!("{x:?} not in {s:?}"));
    assert!(at(&append[0], sys) < at(&append[0], user) && at(&append[0], user) < at(&append[0], obs), "{}", append[0]);
    assert!(append[0].starts_with("<|im_start|>system\n") && append[0].ends_with("<|im_start|>assistant\n"));
    let replace = first_contexts(EpisodePrompt::Replace, None).unwrap();
    assert!(replace[0].contains(sys) && replace[0].contains(obs) && !replace[0].contains(user), "{}", replace[0]);
    let only = first_contexts(EpisodePrompt::ObservationOnly, None).unwrap();
    assert!(only[0].contains(obs) && !only[0].contains(sys) && !only[0].contains(user), "{}", only[0]);
    for ctxs in [&append, &replace, &only] {
        assert!(ctxs[1].contains(obs) && !ctxs[1].contains("3*4="), "a string row: {}", ctxs[1]);
    }
}

/// `max_prompt_tokens` bounds the first prompt as sent: the row's chat and the observation.
#[test]
fn max_prompt_tokens_bounds_the_first_prompt_as_sent() {
    let tok = qwen3_chat();
    let sent = first_contexts(EpisodePrompt::Append, None).unwrap()[0].clone();
    let Tokenizer::Hf(h) = &tok else { unreachable!() };
    let n = h.encode(&sent, false).unwrap().len();
    let e = first_contexts(EpisodePrompt::Append, Some(n - 1)).unwrap_err();
    assert_eq!(e.code, "E0510", "{e}");
    assert!(e.message.contains(&format!("is {n} tokens, over the rollout's max_prompt_tokens {}", n - 1)), "{e}");
    assert!(first_contexts(EpisodePrompt::Append, Some(n)).is_ok());
    assert!(
        e.message.contains("(the row's chat, then the reset observation, as rendered; env_reward.prompt = append)"),
        "{e}"
    );
    assert!(e.help.as_deref().is_some_and(|h| h.contains("env_reward.prompt = observation_only")), "{e:?}");
    // Shown alone, the observation fits where the row's chat did not.
    assert!(first_contexts(EpisodePrompt::ObservationOnly, Some(n - 1)).is_ok());
    // Over the bound alone, it is not told to show what it already shows.
    let e = first_contexts(EpisodePrompt::ObservationOnly, Some(3)).unwrap_err();
    assert!(e.message.contains("(the reset observation, as rendered; env_reward.prompt = observation_only)"), "{e}");
    assert!(e.help.as_deref().is_some_and(|h| !h.contains("observation_only")), "{e:?}");
}
