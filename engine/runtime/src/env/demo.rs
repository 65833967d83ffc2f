//! Demonstrations: gold episodes an environment plays against itself (`Environment::demonstrate`
//! says each expert turn), cut into SFT pairs. Each pair is one expert turn: the context the
//! episode driver would show the policy before that turn (first prompt, earlier turns with their
//! stop token, each observation tokenised once with its delimiters: the TITO layout), and the
//! turn's ids ending in the stop token. SFT trains on the turn alone, so observation ids are
//! never targets, exactly as in RL.

use super::episode::{row_codec, EpisodeLimits};
use super::{Action, EnvFault, Environment, Task};
use crate::session::{ChatCodec, Role};
use crate::token::TokenId;
use crate::RunError;

/// One SFT example: the context (not trained on) and the expert turn (trained on).
pub type Example = (Vec<TokenId>, Vec<TokenId>);

/// (context, expert turn) pairs of one gold episode per task, under the run's episode `limits`
/// (its tool format, turns, context, call timeout, and `prompt`: a chat row's messages join the
/// first prompt as they do in RL). A task the environment cannot demonstrate (it has no expert,
/// or the expert's episode does not end within `max_turns` and `max_context`) is an error naming
/// the episode: SFT would otherwise train on a partial story.
pub fn demonstration_pairs(
    env: &dyn Environment,
    tasks: &[Task],
    codec: &ChatCodec,
    limits: &EpisodeLimits,
) -> Result<Vec<Example>, RunError> {
    let mut pairs = Vec::new();
    for task in tasks {
        let r = demonstrate_one(env, task, codec, limits);
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
    limits: &EpisodeLimits,
) -> Result<Vec<Example>, String> {
    let (tool_format, max_turns, max_context, timeout) =
        (limits.tool_format, limits.max_turns, limits.max_context, limits.turn_timeout);
    let fault = |f: EnvFault| f.to_string();
    let first = env.reset(task, timeout).map_err(fault)?;
    // The first prompt the episode driver would show: the row's chat joined as `limits.prompt` says.
    let mut context = row_codec(task, codec, limits).first_prompt(&first)?;
    let mut observations = vec![first];
    let mut pairs = Vec::new();
    for _ in 0..max_turns {
        let text = env
            .demonstrate(task, &observations, tool_format)
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
    use crate::env::{
        run_episodes, Calculator, EpisodeLimits, EpisodePrompt, OnEnvError, RewardMode, ToolFormat, TurnSample,
    };
    use crate::token::EOS;
    use crate::tokenize::CharTokenizer;
    use crate::tokenize::Tokenizer;
    use crate::FinishReason;
    use serde_json::json;
    use std::collections::HashMap;
    use std::time::Duration;

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

    /// The expert's turn as a policy that sampled it would return it.
    fn expert_turn(ids: Vec<TokenId>) -> TurnSample {
        let n = ids.len();
        TurnSample { ids, logprobs: vec![0.0; n], versions: vec![0; n], finish: FinishReason::Stop, routing: None }
    }

    /// The pairs' contexts are exactly what the episode driver shows a policy that says the
    /// expert's turns, and that policy solves every episode: SFT trains on the RL layout.
    #[test]
    fn pairs_are_the_contexts_the_episode_driver_shows() {
        let tok = Tokenizer::Char(CharTokenizer::new(crate::env::calculator::ALPHABET.chars()));
        let codec = ChatCodec::new(&tok, None).unwrap();
        let env = Calculator::new(Default::default());
        let t = tasks(6);
        let pairs = demonstration_pairs(&env, &t, &codec, &limits(3)).unwrap();
        assert_eq!(pairs.len(), 12, "a tool call and an answer per episode");
        assert!(pairs.iter().all(|(_, turn)| turn.last() == Some(&EOS)));
        let expert: HashMap<Vec<TokenId>, Vec<TokenId>> = pairs.iter().cloned().collect();
        let mut generate = |contexts: &[Vec<TokenId>]| -> Result<Vec<TurnSample>, RunError> {
            Ok(contexts
                .iter()
                .map(|c| expert_turn(expert.get(c).cloned().expect("a context the demonstrations never showed")))
                .collect())
        };
        let results = run_episodes(&env, &t, &codec, &limits(3), &mut generate).unwrap();
        assert!(results.iter().all(|r| r.reward == 1.0 && r.tool_calls == 1 && r.turns == 2), "{results:?}");
        // The observation between the turns is context, never a target.
        let (ctx, answer) = &pairs[1];
        let shown = tok.decode(&ctx[pairs[0].0.len() + pairs[0].1.len()..]);
        assert!(shown.starts_with("<result>") && !tok.decode(answer).contains("result"), "{shown}");
    }

    /// The Hugging Face chat fixture's tokenizer and transformers' renderings of its template.
    fn chat_fixture() -> (Tokenizer, serde_json::Value) {
        let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/hf/qwen3-chat");
        let tok = Tokenizer::Hf(Box::new(crate::tokenize::HfTokenizer::load(&dir).unwrap()));
        let text = std::fs::read_to_string(dir.join("reference/chat.json")).unwrap();
        (tok, serde_json::from_str(&text).unwrap())
    }

    fn rendering<'a>(reference: &'a serde_json::Value, name: &str, generation_prompt: bool) -> &'a serde_json::Value {
        let all = reference.as_array().unwrap();
        all.iter().find(|e| e["name"] == name && e["add_generation_prompt"] == generation_prompt).unwrap()
    }

    /// Issue #41: a calculator episode played by the driver under a Hugging Face chat template in
    /// the Hermes tool format is, id for id, the conversation as transformers renders it
    /// (`apply_chat_template` with the environment's tools), and its loss mask is transformers'
    /// assistant mask (`return_assistant_tokens_mask`): 1 on each assistant turn and its
    /// `<|im_end|>`, 0 on the system turn with the tools, role headers and the tool response.
    #[test]
    fn a_chat_episode_is_the_template_rendering_and_trains_only_the_assistant_turns() {
        let (tok, reference) = chat_fixture();
        let want = rendering(&reference, "tool_episode", false);
        let ids: Vec<TokenId> = serde_json::from_value(want["ids"].clone()).unwrap();
        let mask: Vec<u8> = serde_json::from_value(want["assistant_masks"].clone()).unwrap();
        let env = Calculator::new(Default::default());
        let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/hf/qwen3-chat");
        let tools = std::fs::read_to_string(dir.join("reference/tools.json")).unwrap();
        assert_eq!(env.tools().as_deref(), Some(tools.trim_end()), "the fixture's tools are the calculator's");
        let codec = crate::env::tools::chat_codec(&tok, &env, ToolFormat::Hermes).unwrap();
        let task =
            Task { episode: "h".into(), prompt: json!("37*59=?"), label: json!(2183), metadata: json!({}), seed: 0 };
        let limits = EpisodeLimits { max_context: 512, tool_format: ToolFormat::Hermes, ..limits(3) };
        let pairs = demonstration_pairs(&env, std::slice::from_ref(&task), &codec, &limits).unwrap();
        assert_eq!(pairs.len(), 2, "a tool call, then the answer");
        let expert: HashMap<Vec<TokenId>, Vec<TokenId>> = pairs.into_iter().collect();
        let mut generate = |contexts: &[Vec<TokenId>]| -> Result<Vec<TurnSample>, RunError> {
            Ok(contexts
                .iter()
                .map(|c| {
                    let ids = expert.get(c).cloned().expect("a context the demonstrations never showed");
                    let n = ids.len();
                    let (logprobs, versions) = (vec![-0.5; n], vec![0; n]);
                    TurnSample { ids, logprobs, versions, finish: FinishReason::Stop, routing: None }
                })
                .collect())
        };
        let results = run_episodes(&env, &[task], &codec, &limits, &mut generate).unwrap();
        let r = &results[0];
        assert_eq!((r.reward, r.tool_calls, r.bad_tool_calls, r.turns), (1.0, 1, 0, 2), "{r:?}");
        assert_eq!(r.retokenize_mismatch, 0, "the episode is what re-rendering the conversation gives");
        let trajectories = r.session.trajectories();
        assert_eq!(trajectories.len(), 1);
        let tr = &trajectories[0];
        let got: Vec<TokenId> = tr.prompt.iter().chain(&tr.response).copied().collect();
        let got_mask: Vec<u8> =
            std::iter::repeat_n(0, tr.prompt.len()).chain(tr.loss_mask.iter().map(|&m| m as u8)).collect();
        // The template ends the last turn with a newline that no turn samples.
        let Tokenizer::Hf(h) = &tok else { unreachable!() };
        assert_eq!((h.decode(&ids[ids.len() - 1..], false).as_str(), mask[ids.len() - 1]), ("\n", 0));
        let n = ids.len() - 1;
        let listing = |upto: usize| -> String {
            (0..upto.min(got.len()).min(n))
                .map(|i| format!("{:>4} {:?} want {} got {}\n", i, h.decode(&ids[i..=i], false), mask[i], got_mask[i]))
                .collect()
        };
        assert_eq!(got, ids[..n], "ids differ:\n{}", listing(n));
        assert_eq!(got_mask, mask[..n], "masks differ, token by token:\n{}", listing(n));
        assert_eq!(tr.sampled_tokens(), mask.iter().filter(|&&m| m == 1).count());
    }

    /// Issue #41: the SFT warm-up shows a chat row's messages as RL's episodes do (`prompt`):
    /// under `append` the demonstration's first context carries the row's system message and is
    /// exactly the context the driver gives the policy; under `observation_only` neither has it.
    #[test]
    fn a_chat_rows_demonstration_starts_from_the_first_prompt_rl_shows() {
        let (tok, _) = chat_fixture();
        let Tokenizer::Hf(h) = &tok else { unreachable!() };
        let env = Calculator::new(Default::default());
        let codec = crate::env::tools::chat_codec(&tok, &env, ToolFormat::Hermes).unwrap();
        // A chat row without a label: the calculator asks its own question (seeded).
        let chat = json!([
            {"role": "system", "content": "You are a careful calculator user."},
            {"role": "user", "content": "Multiply, please."}
        ]);
        let task = Task { episode: "c".into(), prompt: chat, label: json!(null), metadata: json!({}), seed: 3 };
        for (prompt, shows_row) in [(EpisodePrompt::Append, true), (EpisodePrompt::ObservationOnly, false)] {
            let limits = EpisodeLimits { max_context: 512, tool_format: ToolFormat::Hermes, prompt, ..limits(3) };
            let pairs = demonstration_pairs(&env, std::slice::from_ref(&task), &codec, &limits).unwrap();
            let first = h.decode(&pairs[0].0, false);
            assert_eq!(first.contains("You are a careful calculator user."), shows_row, "{prompt:?}: {first}");
            assert_eq!(first.contains("Multiply, please."), shows_row, "{prompt:?}: {first}");
            let expert: HashMap<Vec<TokenId>, Vec<TokenId>> = pairs.into_iter().collect();
            let mut generate = |contexts: &[Vec<TokenId>]| -> Result<Vec<TurnSample>, RunError> {
                Ok(contexts
                    .iter()
                    .map(|c| {
                        expert_turn(expert.get(c).cloned().unwrap_or_else(|| {
                            panic!("{prompt:?}: a context the demonstrations never showed: {}", h.decode(c, false))
                        }))
                    })
                    .collect())
            };
            let results = run_episodes(&env, std::slice::from_ref(&task), &codec, &limits, &mut generate).unwrap();
            assert_eq!(results[0].reward, 1.0, "{prompt:?}: {:?}", results[0].end);
        }
    }

    #[test]
    fn an_environment_without_an_expert_or_turns_is_an_error_naming_the_episode() {
        let tok = Tokenizer::Char(CharTokenizer::new(crate::env::calculator::ALPHABET.chars()));
        let codec = ChatCodec::new(&tok, None).unwrap();
        let env = Calculator::new(Default::default());
        let e = demonstration_pairs(&env, &tasks(1), &codec, &limits(1)).unwrap_err();
        assert!(e.message.contains("episode d0") && e.message.contains("max_turns = 1"), "{e}");
        let e =
            demonstration_pairs(&env, &tasks(1), &codec, &EpisodeLimits { max_context: 12, ..limits(3) }).unwrap_err();
        assert!(e.message.contains("12-token context"), "{e}");
    }
}
