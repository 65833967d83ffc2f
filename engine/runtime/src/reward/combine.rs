//! `combine`: several reward stages weighed into one (a format reward plus a correctness reward,
//! a group ranking plus a per-sample verifier). Every part scores the whole batch, groups intact,
//! under its own `on_error`; a sample's reward is the weighted sum of its parts' scores. A sample
//! one part drops is dropped; one a part zeroes is trained on with reward 0 (counted in
//! `reward/zeroed`), so a failure never passes as a smaller but plausible reward. Each part's
//! mean over the samples it scored is a metrics column, `reward/<stage>` (docs/rewards.md).

use super::{BatchReward, BatchScores, PartScores, RewardInput, RewardOutcome, E_REWARD};
use crate::{RunError, E_SPEC};

/// One part: its stage name, the reward and its weight.
pub struct Part {
    pub name: String,
    pub reward: Box<dyn BatchReward>,
    pub weight: f64,
}

pub struct CombinedReward {
    name: String,
    parts: Vec<Part>,
}

impl CombinedReward {
    pub fn new(name: &str, parts: Vec<Part>) -> Result<CombinedReward, RunError> {
        let bad = |what: String| RunError::new(E_SPEC, format!("reward `{name}`: {what}"));
        if parts.is_empty() {
            return Err(bad("a combination needs at least one part".into()));
        }
        if let Some(p) = parts.iter().find(|p| !p.weight.is_finite()) {
            return Err(bad(format!("the weight of `{}` is {}, not a finite number", p.name, p.weight)));
        }
        Ok(CombinedReward { name: name.to_string(), parts })
    }
}

impl BatchReward for CombinedReward {
    fn name(&self) -> &str {
        &self.name
    }

    fn score_batch(&mut self, items: &[RewardInput]) -> Result<Vec<RewardOutcome>, RunError> {
        Ok(self.score_parts(items)?.outcomes)
    }

    fn score_parts(&mut self, items: &[RewardInput]) -> Result<BatchScores, RunError> {
        let mut each = Vec::with_capacity(self.parts.len());
        for p in &mut self.parts {
            let out = p.reward.score_batch(items)?;
            if out.len() != items.len() {
                return Err(RunError::new(
                    E_REWARD,
                    format!("reward `{}` returned {} results for {} samples", p.name, out.len(), items.len()),
                ));
            }
            each.push(out);
        }
        let outcomes = (0..items.len())
            .map(|i| {
                let of_sample = || each.iter().map(|out| &out[i]);
                if let Some(d) = of_sample().find(|o| matches!(o, RewardOutcome::Dropped(_))) {
                    return d.clone();
                }
                if let Some(z) = of_sample().find(|o| matches!(o, RewardOutcome::Zeroed(_))) {
                    return z.clone();
                }
                let sum: f64 =
                    of_sample().zip(&self.parts).map(|(o, p)| p.weight * f64::from(o.reward().unwrap_or(0.0))).sum();
                RewardOutcome::Score(sum as f32)
            })
            .collect();
        let parts = self
            .parts
            .iter()
            .zip(&each)
            .map(|(p, out)| PartScores {
                stage: p.name.clone(),
                scores: out.iter().map(|o| if let RewardOutcome::Score(s) = o { Some(*s) } else { None }).collect(),
            })
            .collect();
        Ok(BatchScores { outcomes, parts })
    }
}

/// The metrics columns of parts' scores, gathered over one or more batches (a step's groups):
/// `reward/<stage>`, the mean of the scores that stage gave, in the order the stages first come.
/// A stage that scored nothing has no column (a mean of nothing is no number).
pub fn part_metrics<'a>(parts: impl IntoIterator<Item = &'a PartScores>) -> Vec<(String, f64)> {
    let mut sums: Vec<(String, f64, usize)> = Vec::new();
    for p in parts {
        let at = match sums.iter().position(|(s, ..)| *s == p.stage) {
            Some(at) => at,
            None => {
                sums.push((p.stage.clone(), 0.0, 0));
                sums.len() - 1
            }
        };
        for s in p.scores.iter().flatten() {
            sums[at].1 += f64::from(*s);
            sums[at].2 += 1;
        }
    }
    sums.into_iter().filter(|(.., n)| *n > 0).map(|(s, sum, n)| (format!("reward/{s}"), sum / n as f64)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reward::{input, RewardFailure};
    use serde_json::json;

    /// A part that answers fixed outcomes, for the combination's arithmetic alone.
    struct Fixed(&'static str, Vec<RewardOutcome>);

    impl BatchReward for Fixed {
        fn name(&self) -> &str {
            self.0
        }
        fn score_batch(&mut self, _: &[RewardInput]) -> Result<Vec<RewardOutcome>, RunError> {
            Ok(self.1.clone())
        }
    }

    fn failed(what: &str) -> RewardFailure {
        RewardFailure { stage: "fmt".into(), sample_id: "s1".into(), what: what.into(), timed_out: false }
    }

    fn part(name: &'static str, weight: f64, out: Vec<RewardOutcome>) -> Part {
        Part { name: name.into(), reward: Box::new(Fixed(name, out)), weight }
    }

    #[test]
    fn a_weighted_sum_whose_failures_are_never_a_smaller_reward() {
        use RewardOutcome::*;
        let items: Vec<_> = (0..3).map(|i| input(&format!("s{i}"), "r", json!("l"))).collect();
        let mut c = CombinedReward::new(
            "both",
            vec![
                part("fmt", 0.2, vec![Score(1.0), Zeroed(failed("z")), Score(0.0)]),
                part("correct", 1.0, vec![Score(0.5), Score(1.0), Dropped(failed("d"))]),
            ],
        )
        .unwrap();
        let got = c.score_parts(&items).unwrap();
        assert_eq!(got.outcomes, vec![Score(0.7), Zeroed(failed("z")), Dropped(failed("d"))]);
        assert_eq!(got.parts[0], PartScores { stage: "fmt".into(), scores: vec![Some(1.0), None, Some(0.0)] });
        assert_eq!(
            part_metrics(&got.parts),
            vec![("reward/fmt".to_string(), 0.5), ("reward/correct".to_string(), 0.75)]
        );
        // Over two batches, a stage's mean is over all the scores it gave.
        let more = PartScores { stage: "fmt".into(), scores: vec![Some(1.0)] };
        assert_eq!(part_metrics(got.parts.iter().chain([&more]))[0], ("reward/fmt".to_string(), 2.0 / 3.0));
    }

    #[test]
    fn bad_combinations_are_refused() {
        let e = CombinedReward::new("both", vec![]).err().unwrap();
        assert_eq!(e.message, "reward `both`: a combination needs at least one part");
        let e = CombinedReward::new("both", vec![part("fmt", f64::NAN, vec![])]).err().unwrap();
        assert_eq!(e.message, "reward `both`: the weight of `fmt` is NaN, not a finite number");
        let mut short = CombinedReward::new("both", vec![part("fmt", 1.0, vec![])]).unwrap();
        let e = short.score_batch(&[input("s0", "r", json!("l"))]).unwrap_err();
        assert_eq!(e.message, "reward `fmt` returned 0 results for 1 samples");
    }
}
