//! The RL variants of issue #43 on the trainer's side, by hand: the loss normalisations (token,
//! sequence, micro_token, constant), GSPO's sequence ratio, MIS's mask, REINFORCE++'s per-token
//! returns, and several passes (`epochs`) over a batch with its shuffles and kept old log-probs.

use crate::common;
use crate::common::{close, vals};

use miles_runtime::tasks::EOS;
use miles_runtime::{Aggregation, RatioLevel, TrainSpec, TrainStats, Trainer, Trajectory};
use miles_tch::model::Policy;
use miles_tch::train::{
    aggregate, epoch_orders, policy_terms, reinforce_pp_returns, Denominators, PgOptions, TchTrainer,
};
use tch::{Kind, Tensor};

fn one_thread() {
    tch::set_num_threads(1);
}

fn rows<const W: usize>(v: &[[f32; W]]) -> Tensor {
    Tensor::from_slice(&v.concat()).view([v.len() as i64, W as i64])
}

fn spec(json: &str) -> TrainSpec {
    serde_json::from_str(json).unwrap()
}

/// Six trajectories of the tiny model's vocabulary, with advantages of both signs.
fn batch() -> Vec<Trajectory> {
    let traj = |p: Vec<u32>, r: Vec<u32>, adv: f32| common::trajectory(p, r, adv, adv);
    vec![
        traj(vec![1, 4], vec![5, 6, EOS], 1.0),
        traj(vec![1, 4, 7, 8], vec![5, EOS], -0.5),
        traj(vec![1], vec![9, 9, 9, 9, EOS], 0.3),
        traj(vec![1, 3], vec![7, EOS], -1.0),
        traj(vec![1, 10, 11], vec![6, 7, EOS], 0.8),
        traj(vec![1, 2], vec![4, 4, EOS], -0.2),
    ]
}

fn weights(t: &TchTrainer) -> Vec<Vec<f32>> {
    t.export_weights().unwrap().tensors.into_iter().map(|x| x.data).collect()
}

#[test]
fn loss_normalisations_by_hand() {
    one_thread();
    // Per-token losses of 4 sequences (3 columns), trained where the mask is 1:
    //   row 0: 1 2 3 / mask 1 1 1 -> sum 6, 3 tokens, mean 2
    //   row 1: 4 0 0 / mask 1 0 0 -> sum 4, 1 token,  mean 4
    //   row 2: 2 5 0 / mask 1 0 0 -> sum 2, 1 token,  mean 2   (the 5 is not trained)
    //   row 3: 6 3 9 / mask 0 1 1 -> sum 12, 2 tokens, mean 6  (the 6 is not trained)
    // The step: sum 24 over 7 tokens, 4 sequences, micro-batches {0, 1} and {2, 3}.
    let loss = [[1f32, 2., 3.], [4., 0., 0.], [2., 5., 0.], [6., 3., 9.]];
    let mask = [[1f32, 1., 1.], [1., 0., 0.], [1., 0., 0.], [0., 1., 1.]];
    // Denominators as the trainer takes them from the step's trajectories (micro-batches of 2).
    let trajs: Vec<Trajectory> = mask
        .iter()
        .map(|m| Trajectory { loss_mask: m.to_vec(), ..common::trajectory(vec![1], vec![4, 5, 6], 0.0, 0.0) })
        .collect();
    let d = Denominators::of(&trajs, 2);
    assert_eq!(d, Denominators { tokens: 7.0, seqs: 4.0, micro_batches: 2.0 });
    let step = |agg: Aggregation| -> f64 {
        // The two micro-batches' shares, accumulated as the trainer accumulates their gradients.
        (0..2)
            .map(|k| {
                let l = rows(&[loss[2 * k], loss[2 * k + 1]]);
                let m = rows(&[mask[2 * k], mask[2 * k + 1]]);
                aggregate(l * &m, &m, agg, &d).double_value(&[])
            })
            .sum()
    };
    // token (DAPO): 24 / 7.
    assert!((step(Aggregation::Token) - 24.0 / 7.0).abs() < 1e-6);
    // sequence (GRPO): (2 + 4 + 2 + 6) / 4 = 3.5.
    assert!((step(Aggregation::Sequence) - 3.5).abs() < 1e-6);
    // micro_token (BNPO per micro-batch): (10 / 4 + 14 / 3) / 2 = (2.5 + 4.666667) / 2 = 3.583333.
    assert!((step(Aggregation::MicroToken) - (2.5 + 14.0 / 3.0) / 2.0).abs() < 1e-6);
    // constant (Dr. GRPO, max_new_tokens 5): 24 / (4 x 5) = 1.2.
    assert!((step(Aggregation::Constant { tokens: 5 }) - 1.2).abs() < 1e-6);
}

/// Through the trainer: micro_token with one micro-batch per step is the token mean, and constant
/// accumulates over micro-batches to the whole step's value (same loss and weights for 1 or 3
/// micro-batches).
#[test]
fn micro_token_and_constant_through_the_trainer() {
    one_thread();
    let run = |agg: &str, micro: usize| -> (TrainStats, Vec<Vec<f32>>) {
        let s = spec(&format!(r#"{{"lr": 0.01, "micro_batch": {micro}, "global_batch": 6, "aggregation": {agg}}}"#));
        let mut t = TchTrainer::new(Policy::init(&common::tiny_config(0.5), 8), s);
        let st = t.train_rl(&batch(), &[0.01], 1.0).unwrap();
        (st, weights(&t))
    };
    let (token, wt) = run(r#""token""#, 6);
    let (micro_token, wm) = run(r#""micro_token""#, 6);
    assert!((token.loss - micro_token.loss).abs() < 1e-7, "{} vs {}", token.loss, micro_token.loss);
    assert_eq!(wt, wm);
    let (c1, w1) = run(r#"{"constant": {"tokens": 8}}"#, 6);
    let (c3, w3) = run(r#"{"constant": {"tokens": 8}}"#, 2);
    assert!((c1.loss - c3.loss).abs() < 1e-6);
    for (a, b) in w1.iter().zip(&w3) {
        close(a, b, 1e-5);
    }
    // 18 trained tokens over 6 x 8: the constant loss is the token loss x 18 / 48.
    assert!((c1.loss - token.loss * 18.0 / 48.0).abs() < 1e-6, "{} vs {}", c1.loss, token.loss);
}

#[test]
fn gspo_sequence_ratio_by_hand() {
    one_thread();
    // old = 0, so logp - old = d. Per sequence s = exp(masked mean of d):
    //   row 0: d = 0.1, 0.3 (third column padding, d = 5 must not count) -> s = e^0.2 = 1.221403,
    //          A = +1, inside [0.8, 1.28]: -A s = -1.221403 on each token, not clipped.
    //   row 1: d = 0.5, 0.4, 0.6 -> s = e^0.5 = 1.648721, A = +1: max(-1.648721, -1.28) = -1.28,
    //          clipped on all 3 tokens.
    //   row 2: d = -0.5, -0.3 (+ padding) -> s = e^-0.4 = 0.670320, A = -1:
    //          max(0.670320, 0.8) = 0.8, clipped on both tokens.
    let logp = rows(&[[0.1, 0.3, 5.0], [0.5, 0.4, 0.6], [-0.5, -0.3, 5.0]]).set_requires_grad(true);
    let mask = rows(&[[1., 1., 0.], [1., 1., 1.], [1., 1., 0.]]);
    let old = Tensor::zeros([3, 3], (Kind::Float, tch::Device::Cpu));
    let adv = Tensor::from_slice(&[1f32, 1., -1.]).view([3, 1]);
    let o = PgOptions { clip_low: 0.2, clip_high: 0.28, tis_cap: None, mis: None, ratio: RatioLevel::Sequence };
    let t = policy_terms(&logp, &old, &old, &adv, &mask, &o);
    let pg = vals(&(&t.pg * &mask));
    close(&pg, &[-1.221_403, -1.221_403, 0.0, -1.28, -1.28, -1.28, 0.8, 0.8, 0.0], 1e-5);
    // The clip fraction counts every token of a clipped sequence: 5 of the 7 trained tokens.
    let clipped = (&t.clipped * &mask).sum(Kind::Float).double_value(&[]);
    assert_eq!(clipped, 5.0);
    // The gradient flows through the sequence's mean: with the token mean over 7 tokens,
    // L = (2 x -A0 s0 + const) / 7 and dL/dlogp_t = -A0 s0 m_t / n0 x n0 / 7 = -1.221403 / 7
    // = -0.174486 on row 0's trained tokens; 0 on its padding and on the clipped sequences.
    let d = Denominators { tokens: 7.0, seqs: 3.0, micro_batches: 1.0 };
    aggregate(&t.pg * &mask, &mask, Aggregation::Token, &d).backward();
    let g = -0.174_486;
    close(&vals(&logp.grad()), &[g, g, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], 1e-6);
    // Per token the same inputs clip differently: row 0's tokens r = e^0.1, e^0.3 = 1.105, 1.350.
    let tok = policy_terms(&logp, &old, &old, &adv, &mask, &PgOptions { ratio: RatioLevel::Token, ..o });
    close(&vals(&tok.clipped.narrow(0, 0, 1)), &[0.0, 1.0, 1.0], 0.0);
    // The recipe's setting reaches the loss.
    let s = spec(r#"{"lr": 0.01, "micro_batch": 1, "global_batch": 1, "ratio": "sequence"}"#);
    assert_eq!(PgOptions::of(&s).ratio, RatioLevel::Sequence);
}

#[test]
fn mis_masks_tokens_outside_the_band_by_hand() {
    one_thread();
    // w = exp(old - rollout), band [0.5, 2.0], TIS cap 1.5; ratio 1 (logp = old), A = 1:
    //   w = 0.4 -> masked (tis 0.4); w = 0.55 -> kept, tis 0.55; w = 1 -> kept, tis 1;
    //   w = 1.9 -> kept, tis capped 1.5; w = 2.5 -> masked (tis 1.5).
    // pg = -A r tis mis = 0, -0.55, -1, -1.5, 0; the gradient dpg/dlogp = -A r tis mis the same.
    let w = [0.4f32, 0.55, 1.0, 1.9, 2.5];
    let old = Tensor::zeros([1, 5], (Kind::Float, tch::Device::Cpu));
    let rollout = Tensor::from_slice(&w.map(|x| -x.ln())).view([1, 5]);
    let logp = old.copy().set_requires_grad(true);
    let adv = Tensor::ones([1, 1], (Kind::Float, tch::Device::Cpu));
    let mask = Tensor::ones([1, 5], (Kind::Float, tch::Device::Cpu));
    let o = PgOptions {
        clip_low: 0.2,
        clip_high: 0.28,
        tis_cap: Some(1.5),
        mis: Some(miles_runtime::MisSpec { low: 0.5, high: 2.0 }),
        ratio: RatioLevel::Token,
    };
    let t = policy_terms(&logp, &old, &rollout, &adv, &mask, &o);
    close(&vals(&t.mis), &[0.0, 1.0, 1.0, 1.0, 0.0], 0.0);
    close(&vals(&t.tis), &[0.4, 0.55, 1.0, 1.5, 1.5], 1e-6);
    close(&vals(&t.pg), &[0.0, -0.55, -1.0, -1.5, 0.0], 1e-6);
    t.pg.sum(Kind::Float).backward();
    close(&vals(&logp.grad()), &[0.0, -0.55, -1.0, -1.5, 0.0], 1e-6);

    // Through the trainer: the sampler's log-probs are the trainer's own, moved by +1 on every
    // third token (w = e^-1 = 0.37, masked) and left alone elsewhere (w = 1 within rounding, kept).
    let policy = Policy::init(&common::tiny_config(0.5), 8);
    let mut probe = TchTrainer::new(policy.deep_copy(), spec(r#"{"lr": 0.01, "micro_batch": 2, "global_batch": 6}"#));
    let b = batch();
    let ps: Vec<Vec<u32>> = b.iter().map(|t| t.prompt.clone()).collect();
    let rs: Vec<Vec<u32>> = b.iter().map(|t| t.response.clone()).collect();
    let lp = probe.logprobs(&ps, &rs, 1.0).unwrap();
    let (mut shifted, mut total) = (0, 0);
    let moved: Vec<Trajectory> = b
        .into_iter()
        .zip(&lp)
        .map(|(mut t, l)| {
            t.rollout_logprobs = l.iter().enumerate().map(|(j, x)| if j % 3 == 0 { x + 1.0 } else { *x }).collect();
            shifted += l.len().div_ceil(3);
            total += l.len();
            t
        })
        .collect();
    let want = shifted as f64 / total as f64; // 7 of 18 tokens
    assert_eq!((shifted, total), (7, 18));
    let ppo = r#", "ppo": {"critic_lr": 0.01, "gamma": 1.0, "lambda": 0.95}"#;
    for (extra, lrs) in [("", &[0.01][..]), ("", &[0.01, 0.01][..]), (ppo, &[0.01][..]), (ppo, &[0.01, 0.01][..])] {
        let s = spec(&format!(
            r#"{{"lr": 0.01, "micro_batch": 2, "global_batch": 6, "mis": {{"low": 0.5, "high": 2.0}}{extra}}}"#
        ));
        let mut t = TchTrainer::new(policy.deep_copy(), s);
        let st = t.train_rl(&moved, lrs, 1.0).unwrap();
        let f = st.mis_masked.expect("mis_masked with mis");
        assert!((f - want).abs() < 1e-9, "{extra} {lrs:?}: {f} vs {want}");
    }
    // A band that holds no token: nothing trains (no gradient at all) and everything is masked.
    let s = spec(r#"{"lr": 0.01, "micro_batch": 2, "global_batch": 6, "mis": {"low": 1.5, "high": 3.0}}"#);
    let mut t = TchTrainer::new(policy.deep_copy(), s);
    let st = t.train_rl(&moved, &[0.01], 1.0).unwrap();
    assert_eq!(st.mis_masked, Some(1.0));
    assert_eq!(st.grad_norm, 0.0);
    assert_eq!(st.loss, 0.0);
    // Without mis, no statistic.
    let mut t = TchTrainer::new(policy.deep_copy(), spec(r#"{"lr": 0.01, "micro_batch": 2, "global_batch": 6}"#));
    assert_eq!(t.train_rl(&moved, &[0.01], 1.0).unwrap().mis_masked, None);
}

#[test]
fn reinforce_pp_token_returns_by_hand() {
    one_thread();
    // kl_coef 0.1, k1 = old - ref on trained tokens, the reward at the last trained token:
    //   T0 (mask 1 1 1, reward 1): k1 = 0.5, 0, 0.5 -> r = -0.05, 0, -0.05 + 1
    //      G = 0.9, 0.95, 0.95.
    //   T1 (mask 1 0 1 0, reward -1): k1 = 1, (-2 untrained), 0, (0 untrained) -> r = -0.1, 0, -1, 0
    //      G = -1.1, -1.0, -1.0, 0.
    let mut t0 = common::trajectory(vec![1], vec![4, 5, 6], 1.0, 1.0);
    let mut t1 = common::trajectory(vec![1], vec![4, 5, 6, 7], -1.0, -1.0);
    t0.loss_mask = vec![1.0, 1.0, 1.0];
    t1.loss_mask = vec![1.0, 0.0, 1.0, 0.0];
    let b = [t0, t1];
    let old = vec![vec![-1.0, -2.0, -0.5], vec![-1.0, -3.0, -2.0, -1.0]];
    let rf = vec![vec![-1.5, -2.0, -1.0], vec![-2.0, -1.0, -2.0, -1.0]];
    let g = reinforce_pp_returns(&b, Some(&old), Some(&rf), 0.1, false);
    close(&g[0], &[0.9, 0.95, 0.95], 1e-6);
    close(&g[1], &[-1.1, -1.0, -1.0, 0.0], 1e-6);
    // Without a reference (kl_coef 0): the reward alone, at every token up to the last trained.
    let g = reinforce_pp_returns(&b, Some(&old), None, 0.1, false);
    close(&g[0], &[1.0, 1.0, 1.0], 0.0);
    close(&g[1], &[-1.0, -1.0, -1.0, 0.0], 0.0);
    // Whitened over the 5 trained tokens 0.9, 0.95, 0.95, -1.1, -1.0: mean 0.14,
    // var = 4.825 / 5 - 0.14^2 = 0.9454, std 0.972317; (x - 0.14) / (std + 1e-8).
    let g = reinforce_pp_returns(&b, Some(&old), Some(&rf), 0.1, true);
    close(&g[0], &[0.781_638, 0.833_062, 0.833_062], 1e-5);
    close(&g[1], &[-1.275_304, -1.172_457, -1.172_457, -0.143_986], 1e-5);

    // Through the trainer: the KL is in the reward, not in the loss. After a step moves the policy
    // from its reference, a step's loss is -mean(A) over the trained tokens (ratio exactly 1 on
    // the one on-policy step), which whitening makes 0, while the KL to the reference is not 0.
    let s = spec(r#"{"lr": 0.05, "micro_batch": 2, "global_batch": 6, "kl_coef": 1.0, "advantage": "reinforce_pp"}"#);
    let mut t = TchTrainer::new(Policy::init(&common::tiny_config(0.5), 8), s);
    Trainer::freeze_reference(&mut t).unwrap();
    let first = t.train_rl(&batch(), &[0.05], 1.0).unwrap();
    assert_eq!(first.kl, 0.0, "the policy is its reference before any update");
    let second = t.train_rl(&batch(), &[0.05], 1.0).unwrap();
    assert!(second.kl > 1e-4, "the policy moved: KL {}", second.kl);
    assert!(second.loss.abs() < 1e-6, "no KL term in the loss: {}", second.loss);
    assert!(first.loss.abs() < 1e-6, "{}", first.loss);
}

#[test]
fn epochs_reshuffle_mini_batches_and_keep_old_logprobs() {
    one_thread();
    // The passes' orders: permutations, the same for a seed, others for another; one pass keeps
    // the batch's order.
    let a = epoch_orders(8, 3, 7);
    assert_eq!(a, epoch_orders(8, 3, 7));
    assert_ne!(a, epoch_orders(8, 3, 8));
    assert!(a.iter().all(|o| {
        let mut s = o.clone();
        s.sort();
        s == (0..8).collect::<Vec<_>>()
    }));
    assert!(a[0] != a[1] && a[1] != a[2], "each pass its own shuffle: {a:?}");
    assert_eq!(epoch_orders(8, 1, 7), vec![(0..8).collect::<Vec<_>>()]);

    let policy = Policy::init(&common::tiny_config(0.5), 8);
    let two = r#"{"lr": 0.05, "micro_batch": 2, "global_batch": 6, "epochs": 2}"#;
    // Two passes of one optimizer step each: the first pass's ratio is exactly 1 on every token
    // (the old log-probs were computed in its micro-batches, before any update), the second's is
    // not (the weights moved, and the old log-probs were kept, not recomputed).
    let mut t = TchTrainer::new(policy.deep_copy(), spec(two));
    let st = t.train_rl(&batch(), &[0.05, 0.05], 1.0).unwrap();
    assert_eq!(st.optimizer_steps, 2);
    assert_eq!(t.version(), 2);
    assert_eq!(st.epochs.len(), 2);
    let (e1, e2) = (&st.epochs[0], &st.epochs[1]);
    assert_eq!(e1.max_abs_log_ratio, 0.0, "{e1:?}");
    assert_eq!((e1.approx_kl, e1.approx_kl_k3, e1.clip_frac), (0.0, 0.0, 0.0));
    assert!(e2.max_abs_log_ratio > 1e-4 && e2.approx_kl_k3 > 0.0, "{e2:?}");
    // Two passes of two steps: E x steps optimizer steps, and the shuffles follow the seed.
    let run = |seed: u64| -> (TrainStats, Vec<Vec<f32>>) {
        let mut t = TchTrainer::new(policy.deep_copy(), spec(two));
        t.seed = seed;
        let st = t.train_rl(&batch(), &[0.05; 4], 1.0).unwrap();
        (st, weights(&t))
    };
    let (s1, w1) = run(1);
    let (_, w1b) = run(1);
    let (_, w2) = run(2);
    assert_eq!(s1.optimizer_steps, 4);
    assert_eq!(w1, w1b, "the same seed shuffles alike");
    assert_ne!(w1, w2, "another seed shuffles otherwise");
    // The learning rates must come as passes x steps.
    let mut t = TchTrainer::new(policy.deep_copy(), spec(two));
    let e = t.train_rl(&batch(), &[0.05; 3], 1.0).unwrap_err();
    assert!(e.message.contains("3 learning rates for 2 passes"), "{}", e.message);
    // One pass has no per-pass statistics.
    let mut t = TchTrainer::new(policy.deep_copy(), spec(r#"{"lr": 0.05, "micro_batch": 2, "global_batch": 6}"#));
    assert!(t.train_rl(&batch(), &[0.05, 0.05], 1.0).unwrap().epochs.is_empty());
}

/// A resumed trainer shuffles as the uninterrupted one: the shuffle's seed is the run's seed and
/// the optimizer steps taken so far, which the checkpoint holds. PPO's critic makes the same passes.
#[test]
fn epochs_shuffle_resumes_exactly_and_the_critic_makes_the_same_passes() {
    one_thread();
    let dir = common::run_dir("epochs-resume");
    std::fs::create_dir_all(&dir).unwrap();
    let s = spec(
        r#"{"lr": 0.02, "micro_batch": 2, "global_batch": 6, "epochs": 2,
            "ppo": {"critic_lr": 0.01, "gamma": 1.0, "lambda": 0.95}}"#,
    );
    let mut a = TchTrainer::new(Policy::init(&common::tiny_config(0.5), 3), s.clone());
    a.seed = 5;
    let st = a.train_rl(&batch(), &[0.02; 4], 1.0).unwrap();
    assert_eq!(st.optimizer_steps, 4);
    let c = st.critic.expect("PPO's critic trained");
    assert!(c.value_loss.is_finite() && c.grad_norm > 0.0);
    Trainer::save(&a, &dir).unwrap();
    let mut b = TchTrainer::new(Policy::init(&common::tiny_config(0.5), 99), s);
    b.seed = 5;
    Trainer::load(&mut b, &dir).unwrap();
    assert_eq!(b.version(), 4);
    let (sa, sb) = (a.train_rl(&batch(), &[0.02; 4], 1.0).unwrap(), b.train_rl(&batch(), &[0.02; 4], 1.0).unwrap());
    assert_eq!(sa.loss.to_bits(), sb.loss.to_bits());
    assert_eq!(sa.epochs, sb.epochs);
    assert_eq!(weights(&a), weights(&b));
    let _ = std::fs::remove_dir_all(&dir);
}
