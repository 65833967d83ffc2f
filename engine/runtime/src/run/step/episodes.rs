//! A step of RL as episodes: `n` episodes per prompt row against the run's environment, each turn
//! sampled by the rollout engine (one batched `generate` per turn), each episode's TITO session
//! turned into trajectories whose loss mask covers only the sampled ids, and group-relative
//! advantages over the episodes of one row. Evaluation plays one greedy episode per test row.

use super::batch::StepBatch;
use crate::backend::{grpo_advantages, RolloutEngine};
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

/// The run's environment, its episode limits and the chat codec of its tokenizer.
pub struct EnvRunner {
    pub env: Box<dyn Environment>,
    pub limits: EpisodeLimits,
    /// Divide group-centred rewards by the group's std (the trainer's `std_norm`).
    pub std_norm: bool,
    /// The reward at or above which an episode counts as solved (`env_reward.solved_at`).
    pub solved_at: f64,
}

impl EnvRunner {
    pub fn new(run: &EnvRunSpec, max_context: usize, std_norm: bool) -> Result<EnvRunner, RunError> {
        Ok(EnvRunner { env: run.env.build()?, limits: run.limits(max_context)?, std_norm, solved_at: run.solved_at })
    }

    /// The run's environment (`None` when its samples are single responses). Each thread that
    /// plays episodes builds its own (a `command_env` starts one process each).
    pub fn for_run(spec: &crate::spec::RunSpec) -> Result<Option<EnvRunner>, RunError> {
        spec.env.as_ref().map(|e| EnvRunner::new(e, spec.model.max_len, spec.train.std_norm)).transpose()
    }

    /// The chat codec episodes are framed with (the run's tokenizer, no system prompt).
    pub fn codec(task: &TaskSet) -> Result<ChatCodec<'_>, RunError> {
        ChatCodec::new(&task.tokenizer, None)
            .map_err(|e| RunError::new(crate::E_SPEC, format!("the tokenizer cannot frame observations: {e}")))
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
        let codec = Self::codec(task)?;
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
        let adv = grpo_advantages(&rewards, &groups, self.std_norm);
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

/// The run stops: in `what` (a step, or groups in a row), every episode ended by an environment
/// fault and `on_env_error = drop` left nothing to train on.
pub fn all_episodes_faulted(what: &str) -> RunError {
    RunError::new(crate::E_TIMEOUT, format!("{what}: every episode ended by an environment fault and was dropped"))
        .with_help("see rollout/episode_end/* in metrics.jsonl; or train on faulted episodes (on_env_error = score)")
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
