//! Held-out evaluation: greedy single responses scored by the run's reward, or greedy episodes.

use super::episodes::EnvRunner;
use super::score::{score_responses, Scored};
use crate::backend::RolloutEngine;
use crate::reward::{BatchReward, RewardOutcome};
use crate::sample::SamplingParams;
use crate::spec::RunSpec;
use crate::tasks::{PromptRow, TaskSet};
use crate::RunError;

/// Held-out success and mean sampled tokens on the first `eval.prompts` test items: greedy
/// responses scored by the run's reward, or, in a run with an environment, one greedy episode per
/// item. Every executor and evaluation mode measures through here.
pub(crate) fn evaluate(
    spec: &RunSpec,
    task: &TaskSet,
    reward: &mut dyn BatchReward,
    env: Option<&EnvRunner>,
    engine: &mut dyn RolloutEngine,
) -> Result<(f64, f64), RunError> {
    if let Some(env) = env {
        return env.evaluate(task, engine, eval_rows(spec, task), spec.rollout.max_new_tokens);
    }
    let items: Vec<&PromptRow> = eval_rows(spec, task).iter().collect();
    let prompts = items.iter().map(|it| task.tokenizer.encode_prompt(&it.prompt)).collect::<Result<Vec<_>, _>>()?;
    let params = SamplingParams::greedy(spec.rollout.max_new_tokens).with_stop(task.stop_tokens());
    let samples = engine.generate(&prompts, 1, &params)?;
    let scored: Vec<Scored> = samples
        .iter()
        .map(|s| (format!("eval/p{}", s.prompt_index), items[s.prompt_index], &s.response[..], s.finish))
        .collect();
    // Each held-out prompt is a group of one response.
    let groups: Vec<usize> = (0..scored.len()).collect();
    let outcomes = score_responses(reward, task, &scored, &groups)?.outcomes;
    let len: usize = samples.iter().map(|s| s.response.len()).sum();
    let n = samples.len().max(1) as f64;
    Ok((eval_score(&outcomes), len as f64 / n))
}

/// The test rows an evaluation plays (the first `eval.prompts`).
fn eval_rows<'t>(spec: &RunSpec, task: &'t TaskSet) -> &'t [PromptRow] {
    &task.test[..spec.eval.prompts.max(1).min(task.test.len())]
}

/// Held-out score of greedy responses: the fraction the reward scores 1 (exact match: accuracy);
/// a dropped sample counts as 0 here, so a failing reward never raises the score.
pub(crate) fn eval_score(outcomes: &[RewardOutcome]) -> f64 {
    let full = outcomes.iter().filter(|o| o.reward().is_some_and(|r| r >= 1.0)).count();
    full as f64 / outcomes.len().max(1) as f64
}
