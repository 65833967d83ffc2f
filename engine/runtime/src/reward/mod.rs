//! Rewards a user writes: built-in verifiers (`verifier`), an external program kept alive and
//! spoken to in JSON lines (`command`), and a reward service over HTTP (`http`). The executors call
//! one trait per batch, [`BatchReward`]; a reward's fault becomes a named [`RewardFailure`] that
//! the stage's [`OnRewardError`] policy turns into a dropped sample, a counted zero, or a stopped
//! run. Never a silent 0 and never a hang: every wait has a timeout. A command or HTTP reward may
//! score whole groups (`group`: one request per group, one score per member), and `combine`
//! weighs several rewards into one. See docs/rewards.md.

pub mod combine;
pub mod command;
pub mod group;
pub mod http;
pub mod math;
pub mod protocol;
pub mod schema;
pub mod spec;
pub mod task;
pub mod text;
pub mod verifier;

pub use crate::quote::{truncate, truncate_tail};
pub use crate::spec::reward::OnRewardError;
pub use command::{CommandReward, CommandSpec};
pub use http::{HttpReward, HttpSpec};
pub use spec::RewardSpec;
pub use task::TaskReward;
pub use verifier::{Verifier, VerifierReward};

use crate::{FinishReason, RunError};
use serde::Serialize;
use std::fmt;

/// A reward stage failed (crashed, timed out, answered malformed output) and its policy is
/// `stop`. Not yet in grammar/src/codes.rs: the lead registers it at merge time.
pub const E_REWARD: &str = "E0517";

/// One finished sample as a reward sees it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RewardInput {
    /// Unique within the run (e.g. "step12/g3/s1"); named in every failure.
    pub sample_id: String,
    /// The prompt as the data file gave it: a string or a list of chat messages.
    pub prompt: serde_json::Value,
    /// The decoded response (stop token removed).
    pub response: String,
    /// The label field of the data row, untouched (`null` when the row had none).
    pub label: serde_json::Value,
    /// The other fields of the data row, untouched (a JSON object).
    pub metadata: serde_json::Value,
    #[serde(rename = "finish_reason")]
    pub finish: FinishReason,
    /// The sample's group within this batch (the responses to one prompt share it): what a group
    /// reward sends together. Not part of the per-sample protocol.
    #[serde(skip)]
    pub group: usize,
}

/// Why one sample got no score: the stage, the sample, and what happened (truncated).
#[derive(Debug, Clone, PartialEq)]
pub struct RewardFailure {
    pub stage: String,
    pub sample_id: String,
    pub what: String,
    /// A timeout (stops with E0509 instead of E0517 under `stop`).
    pub timed_out: bool,
}

impl fmt::Display for RewardFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "reward `{}` failed on sample {}: {}", self.stage, self.sample_id, self.what)
    }
}

/// One sample's result, in the order of the inputs.
#[derive(Debug, Clone, PartialEq)]
pub enum RewardOutcome {
    Score(f32),
    /// Failed under `on_error: zero`: train on 0, and count it.
    Zeroed(RewardFailure),
    /// Failed under `on_error: drop`: leave the sample out of training, and count it.
    Dropped(RewardFailure),
}

impl RewardOutcome {
    /// The reward to train on; `None` for a dropped sample.
    pub fn reward(&self) -> Option<f32> {
        match self {
            RewardOutcome::Score(s) => Some(*s),
            RewardOutcome::Zeroed(_) => Some(0.0),
            RewardOutcome::Dropped(_) => None,
        }
    }
}

/// What the executors call: scores a batch of finished samples. Returns one outcome per input, in
/// order, or an error when the policy is `stop` (or the reward cannot run at all).
pub trait BatchReward: Send {
    /// The stage name, as failures and metrics name it.
    fn name(&self) -> &str;
    fn score_batch(&mut self, items: &[RewardInput]) -> Result<Vec<RewardOutcome>, RunError>;

    /// Scores a batch and says what each part of a combination gave it (the metrics'
    /// `reward/<stage>`); a reward of one stage has no parts. One call, so a reward shared by
    /// threads reports the parts of the very batch it scored.
    fn score_parts(&mut self, items: &[RewardInput]) -> Result<BatchScores, RunError> {
        Ok(BatchScores { outcomes: self.score_batch(items)?, parts: Vec::new() })
    }
}

/// A batch's outcomes, and the scores each part of a combined reward gave it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BatchScores {
    pub outcomes: Vec<RewardOutcome>,
    pub parts: Vec<PartScores>,
}

/// What one part of a combined reward gave a batch: one entry per sample, `None` where the part
/// failed on it.
#[derive(Debug, Clone, PartialEq)]
pub struct PartScores {
    pub stage: String,
    pub scores: Vec<Option<f32>>,
}

/// Applies `policy` to one failure.
pub fn settle(policy: OnRewardError, failure: RewardFailure) -> Result<RewardOutcome, RunError> {
    match policy {
        OnRewardError::Drop => Ok(RewardOutcome::Dropped(failure)),
        OnRewardError::Zero => Ok(RewardOutcome::Zeroed(failure)),
        OnRewardError::Stop => {
            let code = if failure.timed_out { crate::E_TIMEOUT } else { E_REWARD };
            Err(RunError::new(code, failure.to_string())
                .with_help("fix the reward, or set its `on_error` to `drop` or `zero` to go on without the sample"))
        }
    }
}

/// Settles per-sample results (`Err` = that sample failed) into outcomes under `policy`.
pub fn settle_all(
    policy: OnRewardError,
    results: Vec<Result<f32, RewardFailure>>,
) -> Result<Vec<RewardOutcome>, RunError> {
    results
        .into_iter()
        .map(|r| match r {
            Ok(s) => Ok(RewardOutcome::Score(s)),
            Err(f) => settle(policy, f),
        })
        .collect()
}

/// Counts of a run's reward outcomes, for the metrics (`reward/scored`, `reward/zeroed`,
/// `reward/dropped`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RewardTally {
    pub scored: u64,
    pub zeroed: u64,
    pub dropped: u64,
}

impl RewardTally {
    pub fn add(&mut self, outcomes: &[RewardOutcome]) {
        for o in outcomes {
            match o {
                RewardOutcome::Score(_) => self.scored += 1,
                RewardOutcome::Zeroed(_) => self.zeroed += 1,
                RewardOutcome::Dropped(_) => self.dropped += 1,
            }
        }
    }

    pub fn metrics(&self) -> [(&'static str, f64); 3] {
        [
            ("reward/scored", self.scored as f64),
            ("reward/zeroed", self.zeroed as f64),
            ("reward/dropped", self.dropped as f64),
        ]
    }
}

#[cfg(test)]
pub(crate) fn input(id: &str, response: &str, label: serde_json::Value) -> RewardInput {
    RewardInput {
        sample_id: id.to_string(),
        prompt: serde_json::Value::String("q".into()),
        response: response.to_string(),
        label,
        metadata: serde_json::json!({}),
        finish: FinishReason::Stop,
        group: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(timed_out: bool) -> RewardFailure {
        RewardFailure { stage: "judge".into(), sample_id: "s7".into(), what: "returned \"x\"".into(), timed_out }
    }

    #[test]
    fn policies_name_the_stage_and_sample() {
        assert!(matches!(settle(OnRewardError::Drop, failure(false)), Ok(RewardOutcome::Dropped(_))));
        let z = settle(OnRewardError::Zero, failure(false)).unwrap();
        assert_eq!(z.reward(), Some(0.0));
        let e = settle(OnRewardError::Stop, failure(false)).unwrap_err();
        assert_eq!(e.code, E_REWARD);
        assert_eq!(e.message, "reward `judge` failed on sample s7: returned \"x\"");
        assert_eq!(settle(OnRewardError::Stop, failure(true)).unwrap_err().code, crate::E_TIMEOUT);
        let mut t = RewardTally::default();
        t.add(&[z, RewardOutcome::Score(1.0), settle(OnRewardError::Drop, failure(false)).unwrap()]);
        assert_eq!(t, RewardTally { scored: 1, zeroed: 1, dropped: 1 });
    }
}
