//! A batch's advantages from its rewards, the one rule every call site uses (a step of single
//! responses, a step of episodes, samples.jsonl, the asynchronous trainer's groups, multi-LoRA's
//! lanes): the trainer's estimator (`train.advantage`) and `std_norm`. Formulas in
//! docs/algorithms.md.
//!
//! - GRPO: A_i = r_i - mean_g, divided by (std_g + 1e-6) when `std_norm` (unbiased std).
//! - RLOO: A_i = r_i - mean_{j != i} r_j = n/(n-1) (r_i - mean_g), divided by (std_g + 1e-6) when
//!   `std_norm` (off by default for RLOO).
//! - REINFORCE++: A_i = r_i. The trainer turns it into per-token returns (the reward at the last
//!   trained token minus the KL penalty at every token, summed to the end) and whitens them over
//!   the batch's trained tokens: no group baseline here.
//!
//! A group of one has no baseline under GRPO and RLOO: its advantage is 0.

use crate::spec::{AdvantageEstimator, TrainSpec};

/// How a batch's advantages are formed: the trainer's estimator and whether the group-relative
/// estimators divide by the group's std.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AdvantageRule {
    pub estimator: AdvantageEstimator,
    pub std_norm: bool,
}

impl AdvantageRule {
    pub fn of(train: &TrainSpec) -> AdvantageRule {
        AdvantageRule { estimator: train.advantage, std_norm: train.std_norm }
    }

    /// One advantage per reward; `group_of[i]` is reward i's group (the responses to one prompt).
    pub fn compute(&self, rewards: &[f32], group_of: &[usize]) -> Vec<f32> {
        debug_assert_eq!(rewards.len(), group_of.len());
        match self.estimator {
            AdvantageEstimator::Grpo => grpo_advantages(rewards, group_of, self.std_norm),
            AdvantageEstimator::Rloo => rloo_advantages(rewards, group_of, self.std_norm),
            // The trainer forms the per-token returns from the reward (and the KL to the reference).
            AdvantageEstimator::ReinforcePp => rewards.to_vec(),
        }
    }
}

/// `AdvantageRule::of(train).compute(rewards, group_of)`.
pub fn advantages(train: &TrainSpec, rewards: &[f32], group_of: &[usize]) -> Vec<f32> {
    AdvantageRule::of(train).compute(rewards, group_of)
}

/// Per group: count, mean and unbiased variance of the rewards.
struct GroupStats {
    count: Vec<usize>,
    mean: Vec<f64>,
    var: Vec<f64>,
}

impl GroupStats {
    fn of(rewards: &[f32], group_of: &[usize]) -> GroupStats {
        let groups = group_of.iter().copied().max().map_or(0, |m| m + 1);
        let mut sum = vec![0f64; groups];
        let mut count = vec![0usize; groups];
        for (r, &g) in rewards.iter().zip(group_of) {
            sum[g] += f64::from(*r);
            count[g] += 1;
        }
        let mean: Vec<f64> = sum.iter().zip(&count).map(|(s, &c)| if c > 0 { s / c as f64 } else { 0.0 }).collect();
        let mut sq = vec![0f64; groups];
        for (r, &g) in rewards.iter().zip(group_of) {
            sq[g] += (f64::from(*r) - mean[g]).powi(2);
        }
        let var = sq.iter().zip(&count).map(|(s, &c)| if c > 1 { s / (c - 1) as f64 } else { 0.0 }).collect();
        GroupStats { count, mean, var }
    }

    /// `centred` (already baseline-subtracted) divided by the group's std + 1e-6 when `std_norm`.
    fn scaled(&self, g: usize, centred: f64, std_norm: bool) -> f32 {
        if std_norm {
            (centred / (self.var[g].sqrt() + 1e-6)) as f32
        } else {
            centred as f32
        }
    }
}

/// GRPO group-relative advantages: per group, reward minus the group mean, divided by the group's
/// (unbiased) std + 1e-6 when `std_norm`. `group_of[i]` is sample i's group. A group of one gets 0.
pub fn grpo_advantages(rewards: &[f32], group_of: &[usize], std_norm: bool) -> Vec<f32> {
    let s = GroupStats::of(rewards, group_of);
    rewards
        .iter()
        .zip(group_of)
        .map(|(r, &g)| if s.count[g] < 2 { 0.0 } else { s.scaled(g, f64::from(*r) - s.mean[g], std_norm) })
        .collect()
}

/// RLOO leave-one-out advantages: reward minus the mean of the group's other rewards, which is
/// n/(n-1) (r - mean); divided by the group's std + 1e-6 when `std_norm`. A group of one gets 0.
pub fn rloo_advantages(rewards: &[f32], group_of: &[usize], std_norm: bool) -> Vec<f32> {
    let s = GroupStats::of(rewards, group_of);
    rewards
        .iter()
        .zip(group_of)
        .map(|(r, &g)| {
            let n = s.count[g];
            if n < 2 {
                return 0.0;
            }
            let centred = n as f64 / (n - 1) as f64 * (f64::from(*r) - s.mean[g]);
            s.scaled(g, centred, std_norm)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(got: &[f32], want: &[f64]) {
        assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
        for (g, w) in got.iter().zip(want) {
            assert!((f64::from(*g) - w).abs() < 1e-5, "{got:?} vs {want:?}");
        }
    }

    #[test]
    fn grpo_advantages_by_hand() {
        // Group 0: rewards 1,0,0,1 -> mean 0.5, unbiased std sqrt(1/3) = 0.57735.
        // Group 1: all equal -> 0 advantage. Group 2: single sample -> 0.
        let r = [1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 1.0];
        let g = [0, 0, 0, 0, 1, 1, 2];
        let a = grpo_advantages(&r, &g, false);
        assert_eq!(a, vec![0.5, -0.5, -0.5, 0.5, 0.0, 0.0, 0.0]);
        let a = grpo_advantages(&r, &g, true);
        let want = 0.5 / (0.577_350_27 + 1e-6);
        assert!((a[0] - want as f32).abs() < 1e-5, "{a:?}");
        assert!((a[1] + want as f32).abs() < 1e-5);
        assert_eq!(a[4], 0.0);
        assert_eq!(a[6], 0.0);
        // 3 samples 0, 0, 1: mean 1/3, std = sqrt(((1/3)^2*2 + (2/3)^2)/2) = sqrt(1/3).
        let a = grpo_advantages(&[0.0, 0.0, 1.0], &[0, 0, 0], true);
        assert!((a[2] - (2.0 / 3.0) / 0.577_350_3).abs() < 1e-4);
    }

    #[test]
    fn rloo_and_reinforce_pp_advantages_by_hand() {
        let mut train: TrainSpec = serde_json::from_str(r#"{"lr": 0.001, "micro_batch": 4, "global_batch": 4}"#)
            .expect("a minimal train spec");
        // Group 0: rewards 1, 0, 0 (interleaved with group 1). Leave-one-out baselines: sample 0
        // against (0 + 0) / 2 = 0 -> 1; samples 1 and 2 against (1 + 0) / 2 = 0.5 -> -0.5. The
        // same as 3/2 (r - 1/3): 3/2 * 2/3 = 1, 3/2 * -1/3 = -0.5.
        // Group 1: rewards 2, 4 -> 2 - 4 = -2, 4 - 2 = 2. Group 2: one sample -> 0.
        let r = [1.0, 2.0, 0.0, 4.0, 0.0, 7.0];
        let g = [0, 1, 0, 1, 0, 2];
        train.advantage = AdvantageEstimator::Rloo;
        train.std_norm = false;
        close(&advantages(&train, &r, &g), &[1.0, -2.0, -0.5, 2.0, -0.5, 0.0]);
        // With std_norm: group 0's unbiased std is sqrt(1/3) = 0.5773503, group 1's sqrt(2).
        train.std_norm = true;
        let s0 = (1.0f64 / 3.0).sqrt() + 1e-6;
        let s1 = 2.0f64.sqrt() + 1e-6;
        close(&advantages(&train, &r, &g), &[1.0 / s0, -2.0 / s1, -0.5 / s0, 2.0 / s1, -0.5 / s0, 0.0]);
        // A flat group has no signal under RLOO either.
        close(&rloo_advantages(&[0.5, 0.5], &[0, 0], true), &[0.0, 0.0]);
        // GRPO on the same batch, for contrast: group 0 centred at 1/3 (not scaled by 3/2).
        train.advantage = AdvantageEstimator::Grpo;
        train.std_norm = false;
        close(&advantages(&train, &r, &g), &[2.0 / 3.0, -1.0, -1.0 / 3.0, 1.0, -1.0 / 3.0, 0.0]);
        // REINFORCE++: the reward itself, whatever the groups and std_norm (the trainer forms the
        // returns and whitens them over the batch's tokens); a group of one keeps its reward.
        train.advantage = AdvantageEstimator::ReinforcePp;
        for std_norm in [false, true] {
            train.std_norm = std_norm;
            assert_eq!(advantages(&train, &r, &g), r.to_vec());
        }
    }
}
