//! The built-in tasks' verifier (`backend::Reward` on a `TaskSet`) as a [`BatchReward`], so the
//! executors score every batch through one interface: the label is the task's answer, the
//! prompt a string.

use super::{BatchReward, RewardInput, RewardOutcome};
use crate::tasks::{TaskItem, TaskSet};
use crate::{Reward, RunError};

pub struct TaskReward<'a> {
    pub task: &'a TaskSet,
}

impl BatchReward for TaskReward<'_> {
    fn name(&self) -> &str {
        "task"
    }

    fn score_batch(&mut self, items: &[RewardInput]) -> Result<Vec<RewardOutcome>, RunError> {
        let text = |v: &serde_json::Value| v.as_str().map(str::to_string).unwrap_or_else(|| v.to_string());
        Ok(items
            .iter()
            .map(|it| {
                let item = TaskItem { prompt: text(&it.prompt), label: text(&it.label) };
                RewardOutcome::Score(self.task.score(&item, &it.response, it.finish))
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
        let task = TaskSet::build(&spec).unwrap();
        let mut r = TaskReward { task: &task };
        let out = r.score_batch(&[input("a", "12", json!("12")), input("b", "12", json!(13))]).unwrap();
        assert_eq!(out, vec![RewardOutcome::Score(1.0), RewardOutcome::Score(0.0)]);
    }
}
