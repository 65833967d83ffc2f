//! Scoring: responses through the run's reward (`eval` measures held-out success with it).

use crate::reward::{BatchReward, RewardOutcome};
use crate::sample::FinishReason;
use crate::tasks::{PromptRow, TaskSet};
use crate::token::TokenId;
use crate::RunError;

/// A response to score: its sample id (what a failing reward's message names, e.g.
/// `step12/p3/s1`), its prompt row, its ids and how it ended.
pub(crate) type Scored<'a> = (String, &'a PromptRow, &'a [TokenId], FinishReason);

/// Scores responses with `reward`, in order.
pub(crate) fn score_responses(
    reward: &mut dyn BatchReward,
    task: &TaskSet,
    responses: &[Scored],
) -> Result<Vec<RewardOutcome>, RunError> {
    let inputs: Vec<_> = responses
        .iter()
        .map(|(id, row, ids, finish)| row.reward_input(id.clone(), task.tokenizer.decode(ids), *finish))
        .collect();
    let out = reward.score_batch(&inputs)?;
    if out.len() != inputs.len() {
        return Err(RunError::new(
            crate::reward::E_REWARD,
            format!("reward `{}` returned {} results for {} samples", reward.name(), out.len(), inputs.len()),
        ));
    }
    Ok(out)
}
