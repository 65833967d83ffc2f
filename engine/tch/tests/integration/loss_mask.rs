//! The loss mask is tested, not assumed: tokens with mask 0 (observations, tool results of a
//! multi-turn episode) must get no gradient and no weight in the statistics. Two batches that
//! differ only at masked tokens (the last token's id, so only its own log-prob changes, and the
//! rollout log-probs of masked tokens, so their TIS weights and the train-rollout divergence would
//! change) must give bit-identical updates and statistics; with the mask all ones the same
//! difference must show (so the test can fail).

use crate::common;

use miles_runtime::tasks::EOS;
use miles_runtime::{ModelConfig, TrainSpec, TrainStats, Trainer, Trajectory};
use miles_tch::model::Policy;
use miles_tch::train::TchTrainer;

fn cfg() -> ModelConfig {
    common::tiny_config(0.5)
}

fn spec(agg: &str) -> TrainSpec {
    serde_json::from_str(&format!(
        r#"{{"lr": 0.01, "micro_batch": 2, "global_batch": 4, "aggregation": "{agg}",
           "tis_cap": 100.0, "entropy_coef": 0.01, "kl_coef": 0.1}}"#
    ))
    .unwrap()
}

/// Turn 1 sampled (5), an observation (6, 7), turn 2 sampled (8, EOS), a last observation
/// (`last`). The observation positions (1, 2, 5) carry `obs_logprob` as their rollout log-prob;
/// `masked` says whether they have mask 0 or are (wrongly) trained on.
fn episode(last: u32, obs_logprob: f32, masked: bool, adv: f32) -> Trajectory {
    let obs = |j: usize| [1, 2, 5].contains(&j);
    Trajectory {
        prompt: vec![1, 4],
        response: vec![5, 6, 7, 8, EOS, last],
        rollout_logprobs: (0..6).map(|j| if obs(j) { obs_logprob } else { -1.5 }).collect(),
        loss_mask: (0..6).map(|j| if obs(j) && masked { 0.0 } else { 1.0 }).collect(),
        reward: 0.0,
        advantage: adv,
        group: 0,
        weight_version: 0,
        routing: None,
        teacher_logprobs: Vec::new(),
    }
}

fn batch(last: u32, obs_logprob: f32, masked: bool) -> Vec<Trajectory> {
    let mut b: Vec<Trajectory> = [1.0, -0.5, 0.7].iter().map(|&a| episode(last, obs_logprob, masked, a)).collect();
    let single = Trajectory {
        prompt: vec![1, 3],
        response: vec![9, EOS],
        rollout_logprobs: vec![-2.0; 2],
        loss_mask: vec![1.0; 2],
        ..b[0].clone()
    };
    b.push(single);
    b
}

/// One trainer: a warm-up step (so the policy differs from its frozen reference and the KL term
/// has a gradient), then the step under test. Its statistics and the weights after it.
fn step(agg: &str, b: &[Trajectory], lrs: &[f64]) -> (TrainStats, Vec<Vec<f32>>) {
    let mut tr = TchTrainer::new(Policy::init(&cfg(), 5), spec(agg));
    Trainer::freeze_reference(&mut tr).unwrap();
    let warm = vec![Trajectory {
        prompt: vec![1, 2],
        response: vec![3, 4, EOS],
        rollout_logprobs: vec![-2.0; 3],
        loss_mask: vec![1.0; 3],
        reward: 1.0,
        advantage: 1.0,
        group: 0,
        weight_version: 0,
        routing: None,
        teacher_logprobs: Vec::new(),
    }];
    tr.train_rl(&warm, &[0.05], 1.0).unwrap();
    let st = tr.train_rl(b, lrs, 1.0).unwrap();
    let w = tr.export_weights().unwrap().tensors.into_iter().map(|t| t.data).collect();
    (st, w)
}

fn same(a: &(TrainStats, Vec<Vec<f32>>), b: &(TrainStats, Vec<Vec<f32>>)) -> bool {
    let (sa, sb) = (&a.0, &b.0);
    a.1 == b.1
        && sa.loss == sb.loss
        && sa.grad_norm == sb.grad_norm
        && sa.entropy == sb.entropy
        && sa.kl == sb.kl
        && sa.clip_frac == sb.clip_frac
        && sa.tis_weight == sb.tis_weight
        && sa.logp_diff == sb.logp_diff
        && sa.tokens == sb.tokens
}

#[test]
fn masked_tokens_get_no_gradient_and_no_weight() {
    tch::set_num_threads(1);
    // One optimizer step (on-policy: the divergence comes from the training forward) and two
    // (the "old" log-probs come from a separate pass).
    for lrs in [&[0.01][..], &[0.01, 0.01][..]] {
        for agg in ["token", "sequence"] {
            let base = step(agg, &batch(10, -0.1, true), lrs);
            let perturbed = step(agg, &batch(11, -6.0, true), lrs);
            assert!(
                same(&base, &perturbed),
                "{agg} {lrs:?}: a masked token changed the update: {:?} vs {:?}",
                base.0,
                perturbed.0
            );
            assert_eq!(base.0.tokens, 3 * 3 + 2);
            // Unmasked, the same difference does change the update: the comparison can fail.
            let open = step(agg, &batch(10, -0.1, false), lrs);
            let open_perturbed = step(agg, &batch(11, -6.0, false), lrs);
            assert!(!same(&open, &open_perturbed), "{agg} {lrs:?}: the perturbation is invisible even unmasked");
            assert!(open.0.logp_diff != open_perturbed.0.logp_diff);
            assert!(open.1 != open_perturbed.1);
        }
    }
}
