//! What one RL step's rollout gives the trainer and the metrics, and the step of single responses
//! (`episodes` makes the same from played episodes).

use super::samples;
use super::score::{score_responses, Scored};
use crate::backend::grpo_advantages;
use crate::reward::combine::part_metrics;
use crate::reward::{BatchReward, BatchScores, RewardTally};
use crate::sample::{FinishReason, Sample, Trajectory};
use crate::spec::RunSpec;
use crate::tasks::{PromptRow, TaskSet};
use crate::token::TokenId;
use crate::RunError;

/// What one RL step's rollout gives the trainer and the metrics: single responses or episodes.
#[derive(Default)]
pub struct StepBatch {
    pub batch: Vec<Trajectory>,
    /// One per trained response (episode); a dropped one leaves its group.
    pub rewards: Vec<f32>,
    pub groups: Vec<usize>,
    /// Sampled tokens, responses (episodes), and those that ended on a stop token.
    pub sampled_tokens: usize,
    pub responses: usize,
    pub stopped: usize,
    /// Extra columns of the step's metrics row (reward counts, episode ends, ...).
    pub metrics: Vec<(String, f64)>,
    /// The rows samples.jsonl shows of this step (none on a step that writes no samples).
    pub shown: Vec<super::samples::SampleRow>,
}

/// A step of single responses: scored by the run's reward (sample ids `step12/p3/s1`), dropped
/// samples left out of their group, group-relative advantages.
pub(crate) fn single_turn_batch(
    spec: &RunSpec,
    task: &TaskSet,
    reward: &mut dyn BatchReward,
    items: &[PromptRow],
    prompts: &[Vec<TokenId>],
    samples: &[Sample],
    step: u64,
) -> Result<StepBatch, RunError> {
    let mut nth = vec![0usize; items.len()];
    let scored: Vec<Scored> = samples
        .iter()
        .map(|s| {
            let j = nth[s.prompt_index];
            nth[s.prompt_index] += 1;
            (format!("step{step}/p{}/s{j}", s.prompt_index), &items[s.prompt_index], &s.response[..], s.finish)
        })
        .collect();
    // A group reward scores the responses to one prompt together.
    let prompt_of: Vec<usize> = samples.iter().map(|s| s.prompt_index).collect();
    let BatchScores { outcomes, parts } = score_responses(reward, task, &scored, &prompt_of)?;
    let ids: Vec<String> = scored.into_iter().map(|s| s.0).collect();
    // Counts of this step's samples (a resumed run writes the same rows).
    let mut tally = RewardTally::default();
    tally.add(&outcomes);
    let kept: Vec<(&Sample, f32)> =
        samples.iter().zip(&outcomes).filter_map(|(s, o)| o.reward().map(|r| (s, r))).collect();
    let rewards: Vec<f32> = kept.iter().map(|k| k.1).collect();
    let groups: Vec<usize> = kept.iter().map(|k| k.0.prompt_index).collect();
    let adv = grpo_advantages(&rewards, &groups, spec.train.std_norm);
    let mut advantages = vec![None; samples.len()];
    let trained = outcomes.iter().enumerate().filter(|(_, o)| o.reward().is_some());
    for ((i, _), a) in trained.zip(&adv) {
        advantages[i] = Some(*a);
    }
    let shown = samples::single_turn(spec, &task.tokenizer, step, &ids, prompts, samples, &outcomes, &advantages);
    let batch = kept
        .iter()
        .zip(&adv)
        .map(|(&(s, reward), &advantage)| Trajectory {
            prompt: prompts[s.prompt_index].clone(),
            response: s.response.clone(),
            rollout_logprobs: s.logprobs.clone(),
            loss_mask: vec![1.0; s.response.len()],
            reward,
            advantage,
            group: s.prompt_index,
            weight_version: s.weight_version,
            routing: s.routing.clone(),
            teacher_logprobs: Vec::new(),
        })
        .collect();
    Ok(StepBatch {
        batch,
        rewards,
        groups,
        sampled_tokens: samples.iter().map(|s| s.response.len()).sum(),
        responses: samples.len(),
        stopped: samples.iter().filter(|s| s.finish == FinishReason::Stop).count(),
        metrics: tally.metrics().iter().map(|(k, v)| (k.to_string(), *v)).chain(part_metrics(&parts)).collect(),
        shown,
    })
}
