//! Hand-computed checks of the loss pieces, and model/sampler/checkpoint properties.

use crate::common;
use crate::common::{close, vals};

use miles_runtime::rng::Rng;
use miles_runtime::tasks::EOS;
use miles_runtime::{FinishReason, ModelConfig, SamplingParams, TrainSpec, Trainer};
use miles_tch::model::{left_pad, Policy};
use miles_tch::train::{kl_k3, pg_terms, TchTrainer};
use tch::Tensor;

/// Tests run in parallel threads: one intra-op thread each avoids OpenMP oversubscription.
fn one_thread() {
    tch::set_num_threads(1);
}

fn t(v: &[f32]) -> Tensor {
    Tensor::from_slice(v)
}

fn cfg() -> ModelConfig {
    common::tiny_config(0.5)
}

fn train_spec() -> TrainSpec {
    serde_json::from_str(r#"{"lr": 0.01, "micro_batch": 3, "global_batch": 6}"#).unwrap()
}

#[test]
fn clipped_loss_with_asymmetric_clip_by_hand() {
    one_thread();
    // ratios 1.5, 0.5, 0.5, 1.5 with advantages +1, -1, +1, -1; clip_low 0.2, clip_high 0.28.
    let old = t(&[0.0, 0.0, 0.0, 0.0]);
    let logp = t(&[1.5f32.ln(), 0.5f32.ln(), 0.5f32.ln(), 1.5f32.ln()]);
    let adv = t(&[1.0, -1.0, 1.0, -1.0]);
    let terms = pg_terms(&logp, &old, &old, &adv, 0.2, 0.28, None);
    // +1, r=1.5: max(-1.5, -1.28) = -1.28 (clipped). -1, r=0.5: max(0.5, 0.8) = 0.8 (clipped).
    // +1, r=0.5: max(-0.5, -0.8) = -0.5. -1, r=1.5: max(1.5, 1.28) = 1.5.
    close(&vals(&terms.pg), &[-1.28, 0.8, -0.5, 1.5], 1e-6);
    close(&vals(&terms.clipped), &[1.0, 1.0, 0.0, 0.0], 0.0);
    close(&vals(&terms.tis), &[1.0; 4], 0.0);
}

#[test]
fn tis_weights_by_hand() {
    one_thread();
    // old - rollout = ln 4 -> 4, capped at 2; = -ln 2 -> 0.5; = 0 -> 1.
    let old = t(&[0.0, 0.0, 0.0]);
    let rollout = t(&[0.25f32.ln(), 2f32.ln(), 0.0]);
    let logp = old.copy();
    let adv = t(&[1.0, 1.0, 1.0]);
    let terms = pg_terms(&logp, &old, &rollout, &adv, 0.2, 0.2, Some(2.0));
    close(&vals(&terms.tis), &[2.0, 0.5, 1.0], 1e-6);
    // Ratio 1: pg = -A * tis.
    close(&vals(&terms.pg), &[-2.0, -0.5, -1.0], 1e-6);
}

#[test]
fn kl_k3_by_hand() {
    one_thread();
    // p = 0.5, ref = 0.25: d = ln 0.5; e^d - d - 1 = 0.5 + ln 2 - 1 = 0.193147.
    let k = kl_k3(&t(&[0.5f32.ln(), 0.3f32.ln()]), &t(&[0.25f32.ln(), 0.3f32.ln()]));
    close(&vals(&k), &[0.5 + std::f32::consts::LN_2 - 1.0, 0.0], 1e-6);
}

fn prompts() -> Vec<Vec<u32>> {
    vec![vec![1, 5, 6, 7], vec![1, 8], vec![1, 9, 10, 11, 3, 4]]
}

#[test]
fn recomputed_logprobs_equal_sampling_logprobs() {
    one_thread();
    let policy = Policy::init(&cfg(), 3);
    let mut engine = miles_tch::TchEngine::new(policy.deep_copy());
    let mut trainer = TchTrainer::new(policy, train_spec());
    for (temp, top_k, top_p) in [(1.0, 0, 1.0), (0.7, 5, 0.9)] {
        let params = SamplingParams {
            max_new_tokens: 8,
            temperature: temp,
            top_p,
            top_k,
            stop_tokens: vec![EOS],
            greedy: false,
            seed: 11,
        };
        let samples = miles_runtime::RolloutEngine::generate(&mut engine, &prompts(), 3, &params).unwrap();
        assert_eq!(samples.len(), 9);
        let ps: Vec<Vec<u32>> = samples.iter().map(|s| prompts()[s.prompt_index].clone()).collect();
        let rs: Vec<Vec<u32>> = samples.iter().map(|s| s.response.clone()).collect();
        let lp = trainer.logprobs(&ps, &rs, temp).unwrap();
        for (s, l) in samples.iter().zip(&lp) {
            close(&s.logprobs, l, 2e-5);
        }
    }
}

#[test]
fn kv_cache_and_full_recompute_sample_the_same() {
    one_thread();
    let policy = Policy::init(&cfg(), 5);
    let params = SamplingParams {
        max_new_tokens: 10,
        temperature: 1.0,
        top_p: 1.0,
        top_k: 0,
        stop_tokens: vec![EOS],
        greedy: false,
        seed: 2,
    };
    let a = miles_tch::generate::generate(&policy, &prompts(), 2, &params, 0, true).unwrap();
    let b = miles_tch::generate::generate(&policy, &prompts(), 2, &params, 0, false).unwrap();
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x.response, y.response);
        close(&x.logprobs, &y.logprobs, 2e-5);
    }
    // Same seed, same samples; another seed, other samples.
    let c = miles_tch::generate::generate(&policy, &prompts(), 2, &params, 0, true).unwrap();
    assert_eq!(a, c);
    let other = SamplingParams { seed: 3, ..params };
    let d = miles_tch::generate::generate(&policy, &prompts(), 2, &other, 0, true).unwrap();
    assert_ne!(a, d);
}

/// A long context in the batch (an episode's later turn) leaves the others their whole
/// `max_new_tokens`: each row stops at the model's length on its own, and greedy rows sample what
/// they sample alone.
#[test]
fn each_row_of_a_ragged_batch_has_its_own_length_budget() {
    one_thread();
    let policy = Policy::init(&cfg(), 5);
    let max_len = cfg().max_len;
    let params = SamplingParams { stop_tokens: vec![], ..SamplingParams::greedy(12) };
    let short = vec![1, 4, 5];
    let long: Vec<_> = std::iter::once(1).chain((0..max_len - 5).map(|i| 4 + (i % 6) as u32)).collect();
    let both = miles_tch::generate::generate(&policy, &[short.clone(), long.clone()], 1, &params, 0, true).unwrap();
    assert_eq!(both[0].response.len(), 12, "the short row keeps its budget");
    assert_eq!(both[1].response.len(), max_len - long.len(), "the long row stops at max_len");
    assert!(both.iter().all(|s| s.finish == FinishReason::Length));
    let alone = miles_tch::generate::generate(&policy, &[short], 1, &params, 0, true).unwrap();
    assert_eq!(alone[0].response, both[0].response);
    let recompute = miles_tch::generate::generate(&policy, std::slice::from_ref(&long), 1, &params, 0, false).unwrap();
    assert_eq!(recompute[0].response, both[1].response);
}

#[test]
fn padding_does_not_change_logits() {
    one_thread();
    let policy = Policy::init(&cfg(), 9);
    let _g = tch::no_grad_guard();
    let short = vec![1i64, 4, 5];
    let (tok, valid, pos, _) = left_pad(std::slice::from_ref(&short));
    let alone = policy.forward(&tok, &pos, &valid, None);
    let (tok, valid, pos, _) = left_pad(&[vec![1, 2, 3, 4, 5, 6, 7], short.clone()]);
    let batched = policy.forward(&tok, &pos, &valid, None);
    let a = vals(&alone.select(0, 0));
    let b = vals(&batched.select(0, 1).narrow(0, 4, 3));
    close(&a, &b, 1e-5);
}

#[test]
fn save_load_round_trips_bit_for_bit() {
    one_thread();
    let dir = std::env::temp_dir().join(format!("miles-tch-rt-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut trainer = TchTrainer::new(Policy::init(&cfg(), 1), train_spec());
    // One SFT step so optimizer moments are non-zero.
    trainer.train_sft(&[(vec![1, 5], vec![6, 7, EOS]), (vec![1, 8], vec![9, EOS])], 0.01).unwrap();
    Trainer::freeze_reference(&mut trainer).unwrap();
    Trainer::save(&trainer, &dir).unwrap();
    let loaded = Policy::load(&dir).unwrap();
    assert_eq!(loaded.cfg, trainer.policy.cfg);
    for ((n1, a), (n2, b)) in trainer.policy.params().iter().zip(loaded.params()) {
        assert_eq!(n1, n2);
        let (a, b) = (vals(a), vals(b));
        assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()), "{n1}");
    }
    // The trainer state too: same next step from the loaded checkpoint.
    let mut t2 = TchTrainer::new(Policy::init(&cfg(), 99), train_spec());
    Trainer::load(&mut t2, &dir).unwrap();
    let batch = [(vec![1, 5], vec![6, EOS])];
    let s1 = trainer.train_sft(&batch, 0.01).unwrap();
    let s2 = t2.train_sft(&batch, 0.01).unwrap();
    assert_eq!(s1.loss.to_bits(), s2.loss.to_bits());
    assert_eq!(trainer.export_weights().unwrap(), t2.export_weights().unwrap());
    let names: Vec<String> = trainer.policy.params().iter().map(|p| p.0.clone()).collect();
    assert_eq!(names[0], "model.embed_tokens.weight");
    assert!(names.contains(&"model.layers.1.self_attn.k_proj.weight".to_string()));
    assert!(names.contains(&"model.layers.0.mlp.gate_proj.weight".to_string()));
    assert_eq!(names.last().unwrap(), "lm_head.weight");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sft_lowers_the_loss_and_init_is_deterministic() {
    one_thread();
    let a = Policy::init(&cfg(), 4).snapshot(0).unwrap();
    let b = Policy::init(&cfg(), 4).snapshot(0).unwrap();
    assert_eq!(a, b);
    let mut tr = TchTrainer::new(Policy::init(&cfg(), 4), train_spec());
    let mut rng = Rng::new(0);
    let batch: Vec<(Vec<u32>, Vec<u32>)> = (0..6)
        .map(|_| {
            let x = 3 + rng.below(8) as u32;
            (vec![1, x], vec![x, x, EOS])
        })
        .collect();
    let first = tr.train_sft(&batch, 0.01).unwrap().loss;
    let mut last = first;
    for _ in 0..30 {
        last = tr.train_sft(&batch, 0.01).unwrap().loss;
    }
    assert!(last < first * 0.5, "{first} -> {last}");
}

#[test]
fn micro_batches_accumulate_to_the_full_batch_gradient() {
    one_thread();
    let traj = |p: Vec<u32>, r: Vec<u32>, adv: f32| common::trajectory(p, r, 0.0, adv);
    let batch = vec![
        traj(vec![1, 4], vec![5, 6, EOS], 1.0),
        traj(vec![1, 4, 7, 8], vec![5, EOS], -0.5),
        traj(vec![1], vec![9, 9, 9, 9, EOS], 0.3),
        traj(vec![1, 3], vec![EOS], -1.0),
        traj(vec![1, 10, 11], vec![6, 7, EOS], 0.8),
        traj(vec![1, 2], vec![4, 4, EOS], -0.2),
    ];
    for agg in ["token", "sequence"] {
        let spec = |micro: usize| -> TrainSpec {
            serde_json::from_str(&format!(
                r#"{{"lr": 0.01, "micro_batch": {micro}, "global_batch": 6, "aggregation": "{agg}",
                   "tis_cap": 2.0, "entropy_coef": 0.01}}"#
            ))
            .unwrap()
        };
        let mut full = TchTrainer::new(Policy::init(&cfg(), 8), spec(6));
        let mut micro = TchTrainer::new(Policy::init(&cfg(), 8), spec(2));
        let a = full.train_rl(&batch, &[0.01], 1.0).unwrap();
        let b = micro.train_rl(&batch, &[0.01], 1.0).unwrap();
        assert!((a.loss - b.loss).abs() < 1e-6, "{agg}: {} vs {}", a.loss, b.loss);
        assert!((a.grad_norm - b.grad_norm).abs() < 1e-5 * a.grad_norm.max(1.0));
        assert!(a.tis_weight > 0.0 && a.tis_weight <= 2.0);
        assert!((a.tis_weight - b.tis_weight).abs() < 1e-6);
        let (wa, wb) = (full.export_weights().unwrap(), micro.export_weights().unwrap());
        for (x, y) in wa.tensors.iter().zip(&wb.tensors) {
            close(&x.data, &y.data, 1e-5);
        }
    }
}

/// `precision = bf16` on the embedded trainer: the GEMMs run in bf16 (the logits move by bf16
/// rounding, not more, and not by nothing), while weights and gradients stay fp32 and the
/// gradient points where fp32's does.
#[test]
fn bf16_matmuls_follow_fp32_within_rounding_and_keep_fp32_weights_and_gradients() {
    one_thread();
    let seqs = vec![vec![1i64, 5, 6, 7, 8], vec![1, 9, 10, 3]];
    let (tok, valid, pos, _) = left_pad(&seqs);
    let run = |bf16: bool| -> (Tensor, Vec<f32>) {
        let mut p = Policy::init(&cfg(), 7);
        p.bf16_matmuls = bf16;
        p.set_requires_grad(true);
        let logits = p.forward(&tok, &pos, &valid, None);
        assert_eq!(logits.kind(), tch::Kind::Float, "logits come back in fp32");
        logits.log_softmax(-1, tch::Kind::Float).mean(tch::Kind::Float).backward();
        let mut grad = Vec::new();
        for (name, w) in p.params() {
            assert_eq!(w.kind(), tch::Kind::Float, "{name}: master weights stay fp32");
            let g = w.grad();
            assert_eq!(g.kind(), tch::Kind::Float, "{name}: fp32 gradient");
            grad.extend(vals(&g));
        }
        (logits.detach(), grad)
    };
    let (l32, g32) = run(false);
    let (l16, g16) = run(true);
    let diff = vals(&(&l16 - &l32).abs()).into_iter().fold(0f32, f32::max);
    let scale = vals(&l32.abs()).into_iter().fold(0f32, f32::max);
    assert!(diff > 0.0, "bf16 GEMMs must change the logits (else they did not run in bf16)");
    assert!(diff <= 0.05 * scale.max(1.0), "bf16 rounding only: max |diff| {diff}, max |logit| {scale}");
    let dot: f64 = g32.iter().zip(&g16).map(|(a, b)| (*a as f64) * (*b as f64)).sum();
    let norm = |g: &[f32]| g.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    let cosine = dot / (norm(&g32) * norm(&g16));
    assert!(cosine > 0.99, "the bf16 gradient points where fp32's does: cosine {cosine}");
}
