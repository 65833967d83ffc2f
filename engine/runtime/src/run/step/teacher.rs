//! The teacher stage of on-policy distillation (std/stages `teacher_logprobs`, docs/recipes/opd.md):
//! between the reward and the trainer, a frozen teacher scores every response token of the
//! step's batch; the trainer folds the scores into the advantage. Both executors run it here.

use crate::backend::{Backend, TeacherScorer, TrainStats};
use crate::sample::Trajectory;
use crate::spec::RunSpec;
use crate::{RunError, E_BACKEND, E_NONFINITE};
use std::time::Instant;

pub(crate) struct TeacherStage {
    /// The recipe's stage name, for errors.
    name: String,
    scorer: Box<dyn TeacherScorer>,
}

impl TeacherStage {
    /// The run's teacher stage, loaded now (before any step, so a bad teacher fails the run at
    /// its start); None in a run without distillation.
    pub(crate) fn for_run(spec: &RunSpec, backend: &dyn Backend) -> Result<Option<TeacherStage>, RunError> {
        let Some(o) = &spec.train.opd else { return Ok(None) };
        Ok(Some(TeacherStage { name: o.stage.clone(), scorer: backend.teacher(spec)? }))
    }

    /// Sets every trajectory's teacher log-probs; returns the seconds it took. A missing or
    /// non-finite log-prob is an error naming the sample, never a number in the loss.
    pub(crate) fn score(&mut self, batch: &mut [Trajectory]) -> Result<f64, RunError> {
        let t0 = Instant::now();
        let lp = self.scorer.logprobs(batch)?;
        if lp.len() != batch.len() {
            return Err(RunError::new(
                E_BACKEND,
                format!("the teacher stage `{}` scored {} samples of {}", self.name, lp.len(), batch.len()),
            ));
        }
        for (i, (row, traj)) in lp.into_iter().zip(batch.iter_mut()).enumerate() {
            if row.len() != traj.response.len() {
                return Err(RunError::new(
                    E_BACKEND,
                    format!(
                        "the teacher stage `{}` gave {} log-probs for sample {i}'s {} response tokens",
                        self.name,
                        row.len(),
                        traj.response.len()
                    ),
                ));
            }
            if let Some(j) = row.iter().position(|x| !x.is_finite()) {
                return Err(RunError::new(
                    E_NONFINITE,
                    format!(
                        "the teacher stage `{}`: the teacher's log-prob of sample {i} (group {}) token {j} is {}; the weights were not updated",
                        self.name, traj.group, row[j]
                    ),
                ));
            }
            traj.teacher_logprobs = row;
        }
        Ok(t0.elapsed().as_secs_f64())
    }

    /// The step's statistics get the teacher's restarts so far (`opd/teacher_restarts`).
    pub(crate) fn note(&self, ts: &mut TrainStats) {
        if let Some(o) = ts.opd.as_mut() {
            o.teacher_restarts = self.scorer.restarts();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A teacher that answers what it is given: the stage's checks are what is under test.
    struct Fixed(Vec<Vec<f32>>);
    impl TeacherScorer for Fixed {
        fn logprobs(&mut self, _: &[Trajectory]) -> Result<Vec<Vec<f32>>, RunError> {
            Ok(self.0.clone())
        }
    }

    fn stage(answer: Vec<Vec<f32>>) -> TeacherStage {
        TeacherStage { name: "teach".into(), scorer: Box::new(Fixed(answer)) }
    }

    fn batch() -> Vec<Trajectory> {
        let mut b = vec![Trajectory::to_score(vec![1, 2], vec![3, 4]), Trajectory::to_score(vec![1], vec![5])];
        b[1].group = 7;
        b
    }

    #[test]
    fn scores_land_on_their_trajectories() {
        let mut b = batch();
        stage(vec![vec![-0.5, -1.0], vec![-2.0]]).score(&mut b).unwrap();
        assert_eq!(b[0].teacher_logprobs, vec![-0.5, -1.0]);
        assert_eq!(b[1].teacher_logprobs, vec![-2.0]);
    }

    #[test]
    fn a_bad_answer_is_named_and_sets_nothing_it_should_not() {
        let e = stage(vec![vec![-0.5, -1.0], vec![f32::NAN]]).score(&mut batch()).unwrap_err();
        assert_eq!(e.code, E_NONFINITE);
        assert!(e.message.contains("stage `teach`"), "{}", e.message);
        assert!(e.message.contains("sample 1 (group 7) token 0 is NaN"), "{}", e.message);
        let e = stage(vec![vec![-0.5, f32::INFINITY], vec![-1.0]]).score(&mut batch()).unwrap_err();
        assert!(e.message.contains("sample 0 (group 0) token 1 is inf"), "{}", e.message);
        let e = stage(vec![vec![-0.5]]).score(&mut batch()).unwrap_err();
        assert!(e.message.contains("scored 1 samples of 2"), "{}", e.message);
        let e = stage(vec![vec![-0.5], vec![-1.0]]).score(&mut batch()).unwrap_err();
        assert!(e.message.contains("gave 1 log-probs for sample 0's 2 response tokens"), "{}", e.message);
    }
}
