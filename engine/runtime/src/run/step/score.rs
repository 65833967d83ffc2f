//! Scoring: responses through the run's reward (`eval` measures held-out success with it), and
//! that reward shared by every part of a run that scores.

use crate::reward::spec::build_run_reward;
use crate::reward::{BatchReward, RewardInput, RewardOutcome};
use crate::sample::FinishReason;
use crate::spec::RunSpec;
use crate::tasks::{PromptRow, TaskSet};
use crate::token::TokenId;
use crate::RunError;
use std::sync::{Arc, Mutex};

/// The run's one reward: rollouts and evaluations, on any thread, score through clones of it, so
/// a command reward's program is started once per run and an HTTP reward's client made once. A
/// call holds it for one batch (a program answers one request at a time anyway).
#[derive(Clone)]
pub(crate) struct SharedReward {
    name: String,
    inner: Arc<Mutex<Box<dyn BatchReward>>>,
}

impl SharedReward {
    pub(crate) fn for_run(spec: &RunSpec) -> Result<SharedReward, RunError> {
        let r = build_run_reward(spec)?;
        Ok(SharedReward { name: r.name().to_string(), inner: Arc::new(Mutex::new(r)) })
    }

    pub(crate) fn boxed(&self) -> Box<dyn BatchReward> {
        Box::new(self.clone())
    }
}

impl BatchReward for SharedReward {
    fn name(&self) -> &str {
        &self.name
    }

    fn score_batch(&mut self, items: &[RewardInput]) -> Result<Vec<RewardOutcome>, RunError> {
        // A thread that panicked while scoring is reported by its join; the reward itself settles
        // a half-answered batch (a command is restarted on its next batch).
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).score_batch(items)
    }
}

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
