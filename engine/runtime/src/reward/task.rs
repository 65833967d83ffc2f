//! The built-in tasks' exact-match verifier as a [`BatchReward`], so the executors score every
//! batch through one interface: the label is the task's answer. A row whose metadata has
//! `answer_ends_at` (the verbose reverse task's, `>`) is scored on the text before the first such
//! separator, of its label and of the response (all of the response when it has none).

use super::{BatchReward, RewardInput, RewardOutcome};
use crate::RunError;

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
                let score = match it.metadata.get(crate::tasks::ANSWER_ENDS_AT).and_then(|v| v.as_str()) {
                    Some(sep) => crate::tasks::verify(
                        crate::tasks::answer_part(&label, sep),
                        crate::tasks::answer_part(&it.response, sep),
                        it.finish,
                        self.partial_credit,
                    ),
                    None => crate::tasks::verify(&label, &it.response, it.finish, self.partial_credit),
                };
                RewardOutcome::Score(score)
            })
            .collect())
    }
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
            split: SplitSpec { test_size: 5, seed: 1 },
            partial_credit: false,
        };
        let task = crate::tasks::TaskSet::build(&spec).unwrap();
        let mut r = TaskReward { partial_credit: task.partial_credit() };
        let out = r.score_batch(&[input("a", "12", json!("12")), input("b", "12", json!(13))]).unwrap();
        assert_eq!(out, vec![RewardOutcome::Score(1.0), RewardOutcome::Score(0.0)]);
    }
}
