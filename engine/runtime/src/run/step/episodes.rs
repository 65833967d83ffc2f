//! A step of RL as episodes: `n` episodes per prompt row against the run's environment, each turn
//! sampled by the rollout engine (one batched `generate` per turn), each episode's TITO session
//! turned into trajectories whose loss mask covers only the sampled ids, and the run's
//! advantages (`advantage`: group-relative over the episodes of one row, or REINFORCE++'s). Evaluation plays one greedy episode per test row.

use super::batch::StepBatch;
use crate::advantage::AdvantageRule;
use crate::backend::RolloutEngine;
use crate::env::episode::{metrics, run_episodes, EpisodeLimits, EpisodeResult, TurnSample};
use crate::env::spec::EnvRunSpec;
use crate::env::{EndReason, Environment, OnEnvError, Task};
use crate::rng::derive_seed;
use crate::sample::SamplingParams;
use crate::session::ChatCodec;
use crate::tasks::{PromptRow, TaskSet};
use crate::token::TokenId;
use crate::RunError;
use serde_json::Value;

/// `n` episodes of each row (with the row's index, its group): ids `{prefix}/p{row}/e{j}`, seeds
/// derived from `seed`.
pub fn tasks_of(rows: &[PromptRow], n: usize, seed: u64, prefix: &str) -> Vec<(usize, Task)> {
    let mut tasks = Vec::with_capacity(rows.len() * n);
    for (i, row) in rows.iter().enumerate() {
        for j in 0..n {
            tasks.push((
                i,
                Task {
                    episode: format!("{prefix}/p{i}/e{j}"),
                    prompt: row.prompt.to_json(),
                    label: row.label.clone(),
                    metadata: Value::Object(row.metadata.clone()),
                    seed: derive_seed(seed, "episode", (i * n + j) as u64),
                },
            ));
        }
    }
    tasks
}

/// The run's environment, its episode limits and the chat codec of its tokenizer; or, for a
/// plug-in layer (`agent_program`, `rollout_program`, `external_agents`), the layer that plays
/// each episode through the chat server (attached by the sync executor, `with_layer`).
pub struct EnvRunner {
    pub env: Box<dyn Environment>,
    /// The plug-in layer that plays the episodes instead of `env` (`None`: the episode driver).
    pub layer: Option<crate::agent::Layer>,
    pub limits: EpisodeLimits,
    /// How the episodes' advantages are formed (the trainer's `advantage` and `std_norm`).
    pub advantage: AdvantageRule,
    /// The reward at or above which an episode counts as solved (`env_reward.solved_at`).
    pub solved_at: f64,
}

impl EnvRunner {
    pub fn new(run: &EnvRunSpec, max_context: usize, advantage: AdvantageRule) -> Result<EnvRunner, RunError> {
        if run.env.is_layer() {
            // `miles check` refuses this (E0511); a spec written by hand meets it here.
            return Err(RunError::new(
                crate::E_SPEC,
                "the plug-in layers (agent_program, rollout_program, external_agents) play under the `sync` schedule in `miles run`'s own process",
            )
            .with_help("set `schedule = sync` and drop the launcher, or use `command_env`"));
        }
        let env = run.env.build()?;
        Ok(EnvRunner { env, layer: None, limits: run.limits(max_context)?, advantage, solved_at: run.solved_at })
    }

    /// `for_run` for the sync executor, which also plays the plug-in layers: their programs reach
    /// the policy through the chat server `opts.chat_server` starts.
    pub fn for_sync_run(
        spec: &crate::spec::RunSpec,
        opts: &crate::spec::RunOptions,
        tokenizer: &crate::tokenize::Tokenizer,
    ) -> Result<Option<EnvRunner>, RunError> {
        let Some(run) = spec.env.as_ref().filter(|e| e.env.is_layer()) else { return Self::for_run(spec) };
        let tokenizer = std::sync::Arc::new(copy_tokenizer(spec, tokenizer)?);
        let model_name = spec.hf.as_ref().map_or_else(|| "miles-policy".to_string(), |h| h.path.display().to_string());
        let layer = crate::agent::Layer::new(
            run,
            tokenizer,
            opts.chat_server.clone(),
            opts.out_dir.clone(),
            spec.model.max_len,
            model_name,
        )?;
        Ok(Some(EnvRunner {
            env: Box::new(crate::agent::NotStepped),
            layer,
            limits: run.limits(spec.model.max_len)?,
            advantage: AdvantageRule::of(&spec.train),
            solved_at: run.solved_at,
        }))
    }

    /// The run's environment (`None` when its samples are single responses). Each thread that
    /// plays episodes builds its own (a `command_env` starts one process each).
    pub fn for_run(spec: &crate::spec::RunSpec) -> Result<Option<EnvRunner>, RunError> {
        let mut r = spec
            .env
            .as_ref()
            .map(|e| EnvRunner::new(e, spec.model.max_len, AdvantageRule::of(&spec.train)))
            .transpose()?;
        // The first prompt as sent is what `max_prompt_tokens` bounds (E0510).
        if let Some(r) = r.as_mut() {
            r.limits.max_prompt = spec.rollout.max_prompt_tokens;
        }
        Ok(r)
    }

    /// The chat codec episodes are framed with: the run's tokenizer, no system prompt, and the
    /// environment's tools in the template's system turn under the Hermes format
    /// (`env::tools::chat_codec`, which the SFT warm-up's demonstrations use too).
    pub fn codec<'a>(&self, task: &'a TaskSet) -> Result<ChatCodec<'a>, RunError> {
        crate::env::tools::chat_codec(&task.tokenizer, self.env.as_ref(), self.limits.tool_format)
    }

    /// Plays `n` episodes of each row; `params` samples every turn (its seed varies per turn).
    pub fn play(
        &self,
        task: &TaskSet,
        engine: &mut dyn RolloutEngine,
        rows: &[PromptRow],
        n: usize,
        params: &SamplingParams,
        prefix: &str,
    ) -> Result<(Vec<usize>, Vec<EpisodeResult>), RunError> {
        if let Some(layer) = &self.layer {
            let tasks = tasks_of(rows, n, params.seed, prefix);
            let results = layer.play(engine, &tasks, params)?;
            return Ok((tasks.into_iter().map(|t| t.0).collect(), results));
        }
        let codec = self.codec(task)?;
        let (groups, tasks): (Vec<usize>, Vec<Task>) = tasks_of(rows, n, params.seed, prefix).into_iter().unzip();
        let mut turn = 0u64;
        let mut generate = |contexts: &[Vec<TokenId>]| -> Result<Vec<TurnSample>, RunError> {
            turn += 1;
            let p = SamplingParams { seed: derive_seed(params.seed, "turn", turn), ..params.clone() };
            let mut samples = engine.generate(contexts, 1, &p)?;
            samples.sort_by_key(|s| s.prompt_index);
            Ok(samples
                .into_iter()
                .map(|s| {
                    let versions = vec![s.weight_version; s.response.len()];
                    TurnSample { ids: s.response, logprobs: s.logprobs, versions, finish: s.finish, routing: s.routing }
                })
                .collect())
        };
        let results = run_episodes(self.env.as_ref(), &tasks, &codec, &self.limits, &mut generate)?;
        Ok((groups, results))
    }

    /// A training step's batch from played episodes (`play`'s groups and results).
    pub fn batch(&self, groups_of: &[usize], results: &[EpisodeResult]) -> StepBatch {
        let kept: Vec<(usize, &EpisodeResult, f32)> = groups_of
            .iter()
            .zip(results)
            .filter_map(|(g, r)| r.training_reward(self.limits.on_env_error).map(|w| (*g, r, w)))
            .collect();
        let rewards: Vec<f32> = kept.iter().map(|k| k.2).collect();
        let groups: Vec<usize> = kept.iter().map(|k| k.0).collect();
        let adv = self.advantage.compute(&rewards, &groups);
        let mut batch = Vec::new();
        let mut sampled_tokens = 0;
        for ((g, r, reward), a) in kept.iter().zip(&adv) {
            for t in r.session.trajectories() {
                sampled_tokens += t.sampled_tokens();
                batch.push(t.to_trajectory(*reward, *a, *g));
            }
        }
        let stopped = results.iter().filter(|r| r.end == EndReason::Done).count();
        StepBatch {
            batch,
            rewards,
            groups,
            sampled_tokens,
            responses: results.len(),
            stopped,
            metrics: metrics(results),
            shown: Vec::new(),
        }
    }

    /// Held-out success (the share of episodes whose reward reaches `solved_at`) and mean sampled
    /// tokens per episode, one greedy episode per test row.
    pub fn evaluate(
        &self,
        task: &TaskSet,
        engine: &mut dyn RolloutEngine,
        rows: &[PromptRow],
        max_new_tokens: usize,
    ) -> Result<(f64, f64), RunError> {
        let params = SamplingParams::greedy(max_new_tokens).with_stop(task.stop_tokens());
        let (_, results) = self.play(task, engine, rows, 1, &params, "eval")?;
        let n = results.len().max(1) as f64;
        let solved = crate::spec::env::solved_frac(results.iter().map(|r| f64::from(r.reward)), self.solved_at);
        let tokens: usize = results.iter().map(|r| r.session.sampled_tokens()).sum();
        Ok((solved, tokens as f64 / n))
    }
}

/// A second copy of the run's tokenizer for the chat hub (the task owns the first): the
/// character tokenizer is cloned, a Hugging Face one loaded again from the model's directory.
fn copy_tokenizer(
    spec: &crate::spec::RunSpec,
    t: &crate::tokenize::Tokenizer,
) -> Result<crate::tokenize::Tokenizer, RunError> {
    use crate::tokenize::{HfTokenizer, Tokenizer};
    Ok(match (t, &spec.hf) {
        (Tokenizer::Char(c), _) => Tokenizer::Char(c.clone()),
        (Tokenizer::Hf(_), Some(h)) => Tokenizer::Hf(Box::new(HfTokenizer::load(&h.path)?)),
        (Tokenizer::Hf(_), None) => {
            return Err(RunError::internal("a Hugging Face tokenizer without its model directory"))
        }
    })
}

/// The run stops: in `what` (a step, or groups in a row), every episode ended by an environment
/// fault and `on_env_error = drop` left nothing to train on. `faults` says why; the row of step
/// `row_step` in `metrics` (written before this error) counts them.
pub fn all_episodes_faulted(
    what: &str,
    faults: &crate::env::faults::Faults,
    row_step: u64,
    metrics: &std::path::Path,
) -> RunError {
    RunError::new(
        crate::E_TIMEOUT,
        format!("{what}: every episode ended by an environment fault and was dropped ({})", faults.reasons_text()),
    )
    .with_help(format!(
        "the row of step {row_step} in {} counts them (rollout/episode_end/*, rollout/faults); fix the environment, \
         or train on faulted episodes (on_env_error = score)",
        metrics.display()
    ))
}

/// A finished group of episodes as the asynchronous buffer holds it: one sample per trajectory of
/// each episode that trains (one per TITO chain: a compacted episode has several), carrying the
/// episode's reward, with its
/// own prompt and loss mask (observation ids 0); every episode's result is kept for the step's
/// metrics. A sample's finish is `Stop` when its episode ended `done`.
pub fn buffered_group(
    results: Vec<EpisodeResult>,
    on_env_error: OnEnvError,
) -> (Vec<crate::sample::StreamSample>, Vec<f32>, crate::buffer::EpisodeParts) {
    use crate::sample::{StreamSample, VersionSpan};
    let mut samples = Vec::new();
    let mut rewards = Vec::new();
    let mut parts = crate::buffer::EpisodeParts::default();
    for (k, r) in results.iter().enumerate() {
        let Some(reward) = r.training_reward(on_env_error) else { continue };
        let finish = if r.end == EndReason::Done {
            crate::sample::FinishReason::Stop
        } else {
            crate::sample::FinishReason::Length
        };
        for t in r.session.trajectories() {
            samples.push(StreamSample {
                id: 0,
                versions: VersionSpan::of_tokens(&t.versions),
                response: t.response,
                logprobs: t.logprobs,
                finish,
                aborted: false,
                routing: t.routing,
            });
            rewards.push(reward);
            parts.prompts.push(t.prompt);
            parts.masks.push(t.loss_mask);
            parts.episode_of.push(k);
        }
    }
    parts.results = results;
    (samples, rewards, parts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::episode::row_codec;
    use crate::env::EpisodePrompt;
    use crate::tokenize::{HfTokenizer, Messages, Prompt, Tokenizer};
    use serde_json::{json, Map};

    /// Issue #41: a data row whose prompt is a chat reaches each of its episodes whole (system
    /// message included), so the first prompt as sent shows it (`env_reward.prompt = append`).
    #[test]
    fn a_chat_rows_messages_reach_its_episodes() {
        let chat = json!([
            {"role": "system", "content": "You are a careful guesser."},
            {"role": "user", "content": "Guess the product of 3 and 4."}
        ]);
        let list: Vec<Map<String, Value>> =
            chat.as_array().unwrap().iter().map(|m| m.as_object().unwrap().clone()).collect();
        let row = PromptRow {
            prompt: Prompt::Chat(Messages { json: chat.to_string(), list }),
            label: json!(12),
            metadata: Map::new(),
            origin: "rows.jsonl:1".into(),
        };
        let tasks = tasks_of(&[row], 2, 7, "step1");
        assert_eq!(
            tasks.iter().map(|(g, t)| (*g, t.episode.as_str())).collect::<Vec<_>>(),
            [(0, "step1/p0/e0"), (0, "step1/p0/e1")]
        );
        assert!(tasks.iter().all(|(_, t)| t.prompt == chat), "{:?}", tasks[0].1.prompt);
        let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/hf/qwen3-chat");
        let tok = Tokenizer::Hf(Box::new(HfTokenizer::load(&dir).unwrap()));
        let codec = ChatCodec::new(&tok, None).unwrap();
        let limits = EpisodeLimits { prompt: EpisodePrompt::Append, ..EpisodeLimits::default() };
        let ids = row_codec(&tasks[0].1, &codec, &limits).first_prompt("the observation").unwrap();
        let Tokenizer::Hf(h) = &tok else { unreachable!() };
        let sent = h.decode(&ids, false);
        assert!(sent.starts_with("<|im_start|>system\nYou are a careful guesser.<|im_end|>"), "{sent}");
        assert!(sent.contains("the observation"), "{sent}");
    }
}
