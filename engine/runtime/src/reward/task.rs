//! The built-in tasks' exact-match verifier as a [`BatchReward`], so the executors score every
//! batch through one interface: the label is the task's answer. A row whose metadata has
//! `answer_ends_at` (the verbose reverse task's, `>`) is scored on the text before the first such
//! separator, of its label and of the response (all of the response when it has none): the
//! generators of `tasks` mark such rows with [`ANSWER_ENDS_AT`].

use super::{BatchReward, RewardInput, RewardOutcome};
use crate::{FinishReason, RunError};

/// Exact match against the label, with the task's partial credit.
pub struct TaskReward {
    pub partial_credit: bool,
}

impl BatchReward for TaskReward {
    fn name(&self) -> &str {
        "exact_match"
    }

    fn score_batch(&mut self, items: &[RewardInput]) -> Result<Vec<RewardOutcome>, RunError> {
        let text = |v: &serde_json::Value| v.as_str().map(str::to_string).unwrap_or_else(|| v.to_string());
        Ok(items
            .iter()
            .map(|it| {
                let label = text(&it.label);
                let score = match it.metadata.get(ANSWER_ENDS_AT).and_then(|v| v.as_str()) {
                    Some(sep) => {
                        verify(answer_part(&label, sep), answer_part(&it.response, sep), it.finish, self.partial_credit)
                    }
                    None => verify(&label, &it.response, it.finish, self.partial_credit),
                };
                RewardOutcome::Score(score)
            })
            .collect())
    }
}

/// The metadata key of a row whose answer ends at a separator: its value (a string, `>` for the
/// verbose reverse task) is where the scored text of the label and of a response ends, at its
/// first occurrence (the whole text when it has none).
pub const ANSWER_ENDS_AT: &str = "answer_ends_at";

/// The text of `text` before the first `sep` (all of it when `sep` is absent or empty).
pub fn answer_part<'a>(text: &'a str, sep: &str) -> &'a str {
    if sep.is_empty() {
        return text;
    }
    text.split_once(sep).map_or(text, |(head, _)| head)
}

/// The verifier (public for tests and other backends).
pub fn verify(label: &str, response: &str, finish: FinishReason, partial_credit: bool) -> f32 {
    let exact = finish == FinishReason::Stop && response == label;
    if exact {
        return 1.0;
    }
    if !partial_credit {
        return 0.0;
    }
    let l: Vec<char> = label.chars().collect();
    let r: Vec<char> = response.chars().collect();
    let n = l.len().max(r.len());
    if n == 0 {
        return 0.0;
    }
    let same = l.iter().zip(r.iter()).filter(|(a, b)| a == b).count();
    // An inexact answer never earns full credit.
    (same as f32 / n as f32).min(0.9)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reward::input;
    use crate::spec::{SplitSpec, TaskKind, TaskSpec};
    use serde_json::json;

    #[test]
    fn the_task_verifier_behind_the_batch_interface() {
        let spec = TaskSpec {
            kind: TaskKind::Addition { digits: 1 },
            split: SplitSpec { test_size: 5, seed: 1, ..Default::default() },
            partial_credit: false,
        };
        let task = crate::tasks::TaskSet::build(&spec).unwrap();
        let mut r = TaskReward { partial_credit: task.partial_credit() };
        let out = r.score_batch(&[input("a", "12", json!("12")), input("b", "12", json!(13))]).unwrap();
        assert_eq!(out, vec![RewardOutcome::Score(1.0), RewardOutcome::Score(0.0)]);
    }
}
