//! Continuous batching (`TchStreamEngine`): the log-probs it reports are the trainer's, greedy
//! answers equal the batch engine's whatever the staggering of requests, weight versions are
//! recorded across a swap, and a fully_async run of the tiny spec trains and resumes.

use crate::common;

use miles_runtime::tasks::{BOS, EOS};
use miles_runtime::{
    GenRequest, ModelConfig, ProgressMode, RolloutEngine, RunOptions, RunSpec, SamplingParams, StreamEngine,
    StreamSample, TrainSpec, Trainer, VersionSpan,
};
use miles_tch::model::Policy;
use miles_tch::stream::TchStreamEngine;
use miles_tch::train::TchTrainer;
use miles_tch::TchEngine;

fn cfg() -> ModelConfig {
    common::tiny_config(0.3)
}

fn params(seed: u64, greedy: bool) -> SamplingParams {
    SamplingParams { max_new_tokens: 10, temperature: 0.8, top_p: 1.0, top_k: 0, stop_tokens: vec![EOS], greedy, seed }
}

fn prompts() -> Vec<Vec<u32>> {
    (0..7u32).map(|i| (0..(2 + i % 5)).map(|j| if j == 0 { BOS } else { 3 + (i * 7 + j) % 9 }).collect()).collect()
}

/// Submits the prompts two at a time, one step apart, and collects every sample (by id).
fn run_staggered(e: &mut TchStreamEngine, greedy: bool) -> Vec<StreamSample> {
    let ps = prompts();
    let mut out = Vec::new();
    let mut next = 0;
    while out.len() < ps.len() {
        for _ in 0..2 {
            if next < ps.len() && e.in_flight() < e.slots() {
                e.submit(GenRequest { id: next as u64, prompt: ps[next].clone(), params: params(next as u64, greedy) })
                    .unwrap();
                next += 1;
            }
        }
        out.extend(e.step().unwrap());
    }
    out.sort_by_key(|s| s.id);
    out
}

fn trainer_logprobs(policy: &Policy, samples: &[StreamSample], temperature: f64) -> Vec<Vec<f32>> {
    let mut t = TchTrainer::new(
        policy.deep_copy(),
        TrainSpec {
            lr: 0.0,
            weight_decay: 0.0,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            warmup_steps: 0,
            decay: Default::default(),
            min_lr_ratio: 0.0,
            clip_low: 0.2,
            clip_high: 0.2,
            kl_coef: 0.0,
            tis_cap: None,
            entropy_coef: 0.0,
            std_norm: true,
            aggregation: Default::default(),
            epochs: 1,
            ratio: Default::default(),
            advantage: Default::default(),
            mis: None,
            overlong: None,
            grad_clip: 0.0,
            micro_batch: 8,
            global_batch: 8,
            lora: None,
            ppo: None,
            opd: None,
            precision: Default::default(),
            dp: None,
        },
    );
    let ps = prompts();
    let p: Vec<Vec<u32>> = samples.iter().map(|s| ps[s.id as usize].clone()).collect();
    let r: Vec<Vec<u32>> = samples.iter().map(|s| s.response.clone()).collect();
    t.logprobs(&p, &r, temperature).unwrap()
}

#[test]
fn staggered_continuous_batching_reports_the_trainers_logprobs() {
    tch::set_num_threads(1);
    let policy = Policy::init(&cfg(), 5);
    // Three slots for seven requests: slots are reused as samples finish.
    let mut e = TchStreamEngine::new(policy.deep_copy(), 3);
    let samples = run_staggered(&mut e, false);
    assert_eq!(samples.len(), 7);
    let want = trainer_logprobs(&policy, &samples, 0.8);
    for (s, w) in samples.iter().zip(&want) {
        assert_eq!(s.logprobs.len(), w.len());
        for (a, b) in s.logprobs.iter().zip(w) {
            assert!((a - b).abs() < 1e-4, "sample {}: {:?} vs {:?}", s.id, s.logprobs, w);
        }
    }
}

#[test]
fn greedy_answers_match_the_batch_engine() {
    tch::set_num_threads(1);
    let policy = Policy::init(&cfg(), 9);
    let mut stream = TchStreamEngine::new(policy.deep_copy(), 2);
    let got = run_staggered(&mut stream, true);
    let mut batch = TchEngine::new(policy.deep_copy());
    let want = batch.generate(&prompts(), 1, &params(0, true)).unwrap();
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(g.response, w.response, "prompt {}", g.id);
        assert_eq!(g.finish, w.finish);
    }
}

#[test]
fn a_swap_in_flight_records_both_versions() {
    tch::set_num_threads(1);
    let a = Policy::init(&cfg(), 1);
    let b = Policy::init(&cfg(), 2);
    let mut e = TchStreamEngine::new(a, 2);
    let mut p = params(3, false);
    p.stop_tokens.clear(); // run to max_new_tokens
    e.submit(GenRequest { id: 0, prompt: vec![BOS, 4, 5], params: p }).unwrap();
    assert!(e.step().unwrap().is_empty()); // token 0 (prefill logits), logits for token 1
    assert!(e.step().unwrap().is_empty()); // token 1, logits for token 2
    let mut w = b.snapshot(0).unwrap();
    w.version = 1;
    e.load_weights(&w).unwrap();
    let mut out = Vec::new();
    while out.is_empty() {
        out = e.step().unwrap();
    }
    // Token 2 came from logits computed before the swap; tokens 3.. from the new weights.
    assert_eq!(
        out[0].versions,
        vec![VersionSpan { version: 0, from_token: 0 }, VersionSpan { version: 1, from_token: 3 }]
    );
    assert_eq!(out[0].response.len(), 10);
    assert_eq!(e.weight_version(), 1);
}

#[test]
fn fully_async_tiny_run_trains_and_resumes() {
    let mut spec = RunSpec::from_json(include_str!("../../../runtime/tests/data/tiny.json")).unwrap();
    spec.schedule = serde_json::from_str(
        r#"{"type": "fully_async", "max_staleness": 1, "max_concurrent": 8, "buffer_capacity": 8, "stall_timeout_s": 60}"#,
    )
    .unwrap();
    let dir = std::env::temp_dir().join(format!("miles-tch-async-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut o = RunOptions::new(&dir);
    o.progress = ProgressMode::Off;
    o.threads = Some(1);
    o.stop_after = Some(2);
    let s = miles_tch::run(&spec, &o).unwrap();
    assert!(s.stopped_early);
    o.stop_after = None;
    o.resume = true;
    let s = miles_tch::run(&spec, &o).unwrap();
    assert_eq!(s.steps_done, 4);
    assert!(s.eval_end.is_some());
    assert!(dir.join("model").join("model.safetensors").exists());
    let text = std::fs::read_to_string(dir.join("metrics.jsonl")).unwrap();
    let steps: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v.get("train/loss").is_some())
        .collect();
    assert_eq!(steps.len(), 4);
    for v in &steps {
        assert!(v["rollout/fully_async/staleness_drawn_max"].as_u64().unwrap() <= 1);
        assert!(v["train/logp_diff"].as_f64().unwrap() < 1.0, "rollout and trainer log-probs agree: {v}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
