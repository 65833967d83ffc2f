//! Demonstrations: gold episodes an environment plays against itself (`Environment::demonstrate`
//! says each expert turn), cut into SFT pairs. Each pair is one expert turn: the context the
//! episode driver would show the policy before that turn (first prompt, earlier turns with their
//! stop token, each observation tokenised once with its delimiters: the TITO layout), and the
//! turn's ids ending in the stop token. SFT trains on the turn alone, so observation ids are
//! never targets, exactly as in RL.

use super::{Action, EnvFault, Environment, Task};
use crate::session::{ChatCodec, Role};
use crate::token::TokenId;
use crate::RunError;
use std::time::Duration;

/// One SFT example: the context (not trained on) and the expert turn (trained on).
pub type Example = (Vec<TokenId>, Vec<TokenId>);

/// (context, expert turn) pairs of one gold episode per task. A task the environment cannot
/// demonstrate (it has no expert, or the expert's episode does not end within `max_turns` and
/// `max_context`) is an error naming the episode: SFT would otherwise train on a partial story.
pub fn demonstration_pairs(
    env: &dyn Environment,
    tasks: &[Task],
    codec: &ChatCodec,
    tool_format: super::ToolFormat,
    max_turns: usize,
    max_context: usize,
    timeout: Duration,
) -> Result<Vec<Example>, RunError> {
    let mut pairs = Vec::new();
    for task in tasks {
        let r = demonstrate_one(env, task, codec, tool_format, max_turns, max_context, timeout);
        env.close(&task.episode);
        pairs.extend(r.map_err(|e| {
            RunError::new(crate::E_SPEC, format!("demonstration of episode {} by `{}`: {e}", task.episode, env.name()))
        })?);
    }
    Ok(pairs)
}

fn demonstrate_one(
    env: &dyn Environment,
    task: &Task,
    codec: &ChatCodec,
    tool_format: super::ToolFormat,
    max_turns: usize,
    max_context: usize,
    timeout: Duration,
) -> Result<Vec<Example>, String> {
    let fault = |f: EnvFault| f.to_string();
    let first = env.reset(task, timeout).map_err(fault)?;
    let mut context = codec.first_prompt(&first)?;
    let mut observations = vec![first];
    let mut pairs = Vec::new();
    for _ in 0..max_turns {
        let text = env
            .demonstrate(task, &observations)
            .ok_or_else(|| "the environment has no demonstration for this turn".to_string())?;
        let turn = codec.tokenizer().encode_answer(&text).map_err(|e| e.message)?;
        if context.len() + turn.len() > max_context {
            return Err(format!("the gold episode outgrows the model's {max_context}-token context"));
        }
        pairs.push((context.clone(), turn.clone()));
        context.extend(turn);
        let tool_calls = tool_format.parse(&text).map_err(|e| format!("the expert's tool call is malformed: {e}"))?;
        let role = if tool_calls.is_empty() { Role::User } else { Role::Tool };
        let step = env.step(&task.episode, &Action { text, tool_calls }, timeout).map_err(fault)?;
        if step.terminated || step.truncated {
            return Ok(pairs);
        }
        context.extend(codec.observation(role, &step.observation)?);
        observations.push(step.observation);
    }
    Err(format!("the gold episode does not end within max_turns = {max_turns}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::{run_episodes, Calculator, EpisodeLimits, OnEnvError, RewardMode, ToolFormat, TurnSample};
    use crate::token::EOS;
    use crate::tokenize::CharTokenizer;
    use crate::tokenize::Tokenizer;
    use crate::FinishReason;
    use serde_json::json;
    use std::collections::HashMap;

    fn tasks(n: usize) -> Vec<Task> {
        (0..n)
            .map(|i| Task {
                episode: format!("d{i}"),
                prompt: json!(null),
                label: json!(null),
                metadata: json!({}),
                seed: i as u64,
            })
            .collect()
    }

    fn limits(max_turns: usize) -> EpisodeLimits {
        EpisodeLimits {
            max_turns,
            turn_timeout: Duration::from_secs(5),
            episode_timeout: Duration::from_secs(60),
            max_context: 96,
            concurrency: 2,
            tool_format: ToolFormat::Tag,
            reward: RewardMode::Final,
            on_env_error: OnEnvError::Drop,
            ..EpisodeLimits::default()
        }
    }

    /// The pairs' contexts are exactly what the episode driver shows a policy that says the
    /// expert's turns, and that policy solves every episode: SFT trains on the RL layout.
    #[test]
    fn pairs_are_the_contexts_the_episode_driver_shows() {
        let tok = Tokenizer::Char(CharTokenizer::new(crate::env::calculator::ALPHABET.chars()));
        let codec = ChatCodec::new(&tok, None).unwrap();
        let env = Calculator::new(Default::default());
        let t = tasks(6);
        let pairs = demonstration_pairs(&env, &t, &codec, ToolFormat::Tag, 3, 96, Duration::from_secs(5)).unwrap();
        assert_eq!(pairs.len(), 12, "a tool call and an answer per episode");
        assert!(pairs.iter().all(|(_, turn)| turn.last() == Some(&EOS)));
        let expert: HashMap<Vec<TokenId>, Vec<TokenId>> = pairs.iter().cloned().collect();
        let mut generate = |contexts: &[Vec<TokenId>]| -> Result<Vec<TurnSample>, RunError> {
            Ok(contexts
                .iter()
                .map(|c| {
                    let ids = expert.get(c).cloned().expect("a context the demonstrations never showed");
                    let n = ids.len();
                    TurnSample {
                        ids,
                        logprobs: vec![0.0; n],
                        versions: vec![0; n],
                        finish: FinishReason::Stop,
                        routing: None,
                    }
                })
                .collect())
        };
        let results = run_episodes(&env, &t, &codec, &limits(3), &mut generate).unwrap();
        assert!(results.iter().all(|r| r.reward == 1.0 && r.tool_calls == 1 && r.turns == 2), "{results:?}");
        // The observation between the turns is context, never a target.
        let (ctx, answer) = &pairs[1];
        let shown = tok.decode(&ctx[pairs[0].0.len() + pairs[0].1.len()..]);
        assert!(shown.starts_with("<result>") && !tok.decode(answer).contains("result"), "{shown}");
    }

    #[test]
    fn an_environment_without_an_expert_or_turns_is_an_error_naming_the_episode() {
        let tok = Tokenizer::Char(CharTokenizer::new(crate::env::calculator::ALPHABET.chars()));
        let codec = ChatCodec::new(&tok, None).unwrap();
        let env = Calculator::new(Default::default());
        let e =
            demonstration_pairs(&env, &tasks(1), &codec, ToolFormat::Tag, 1, 96, Duration::from_secs(5)).unwrap_err();
        assert!(e.message.contains("episode d0") && e.message.contains("max_turns = 1"), "{e}");
        let e =
            demonstration_pairs(&env, &tasks(1), &codec, ToolFormat::Tag, 3, 12, Duration::from_secs(5)).unwrap_err();
        assert!(e.message.contains("12-token context"), "{e}");
    }
}
