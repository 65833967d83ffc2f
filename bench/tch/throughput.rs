//! Throughput of the embedded backend (not a timed test): generated tokens/s with and without the
//! KV cache, and trained tokens/s of a GRPO step. Medians of several runs.
//!
//! `cargo bench -p miles-tch --bench throughput` (add `-- --threads N` to pin libtorch threads).

use miles_runtime::{DecoderSizes, ModelConfig, SamplingParams, TrainSpec, Trajectory};
use miles_tch::model::Policy;
use miles_tch::train::TchTrainer;
use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn cfg(d: usize, layers: usize, max_len: usize) -> ModelConfig {
    ModelConfig::decoder(DecoderSizes {
        vocab_size: 16,
        d_model: d,
        n_layers: layers,
        n_heads: 4,
        n_kv_heads: 2,
        d_ff: 3 * d,
        max_len,
    })
}

fn prompts(n: usize, len: usize) -> Vec<Vec<u32>> {
    (0..n)
        .map(|i| {
            let mut p = vec![1u32];
            p.extend((0..len - 1).map(|j| 3 + ((i * 7 + j * 3) % 11) as u32));
            p
        })
        .collect()
}

fn gen_tps(policy: &Policy, ps: &[Vec<u32>], n: usize, new: usize, cache: bool, reps: usize) -> f64 {
    let params = SamplingParams {
        max_new_tokens: new,
        temperature: 1.0,
        top_p: 1.0,
        top_k: 0,
        // No stop token: every sample runs to max_new_tokens, so the token count is fixed.
        stop_tokens: vec![],
        greedy: false,
        seed: 1,
    };
    let runs = (0..reps)
        .map(|_| {
            let t = Instant::now();
            let s = miles_tch::generate::generate(policy, ps, n, &params, 0, cache).expect("generate");
            let toks: usize = s.iter().map(|x| x.response.len()).sum();
            toks as f64 / t.elapsed().as_secs_f64()
        })
        .collect();
    median(runs)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--threads") {
        if let Some(n) = args.get(i + 1).and_then(|s| s.parse::<i32>().ok()) {
            tch::set_num_threads(n);
        }
    }
    println!("libtorch threads: {}", tch::get_num_threads());
    println!("| case | cache tok/s | no-cache tok/s | ratio |");
    println!("|---|---|---|---|");
    for (name, d, layers, plen, new, max_len) in [
        ("laptop model d64 L2, 32x8 samples, 8 new", 64, 2, 8, 8, 20),
        ("d64 L2, 32x8 samples, 64 new", 64, 2, 8, 64, 80),
        ("d128 L2, 8x8 samples, 96 new", 128, 2, 16, 96, 120),
    ] {
        let policy = Policy::init(&cfg(d, layers, max_len), 1);
        let (np, n) = if d == 128 { (8, 8) } else { (32, 8) };
        let ps = prompts(np, plen);
        let reps = 5;
        let with = gen_tps(&policy, &ps, n, new, true, reps);
        let without = gen_tps(&policy, &ps, n, new, false, reps);
        println!("| {name} | {with:.0} | {without:.0} | {:.2}x |", with / without);
        // Flush per row so partial results survive an interrupted run.
        let _ = std::io::Write::flush(&mut std::io::stdout());
    }

    // Trained tokens/s: one GRPO step (one optimizer step) over 256 sequences of the laptop shape.
    println!();
    println!("| train case | trained tok/s (prompt+response) | s/step |");
    println!("|---|---|---|");
    for (name, d, layers) in [("laptop model d64 L2, 256 seqs x 16 tok", 64, 2), ("d128 L2, 256 seqs x 16 tok", 128, 2)]
    {
        let spec: TrainSpec =
            serde_json::from_str(r#"{"lr": 0.0002, "micro_batch": 256, "global_batch": 256}"#).expect("spec");
        let mut tr = TchTrainer::new(Policy::init(&cfg(d, layers, 20), 1), spec);
        let ps = prompts(256, 8);
        let batch: Vec<Trajectory> = ps
            .iter()
            .enumerate()
            .map(|(i, p)| Trajectory {
                prompt: p.clone(),
                response: p.iter().rev().take(7).copied().chain([2]).collect(),
                rollout_logprobs: vec![-1.0; 8],
                loss_mask: vec![1.0; 8],
                reward: (i % 2) as f32,
                advantage: if i % 2 == 0 { 1.0 } else { -1.0 },
                group: i / 8,
                weight_version: 0,
                routing: None,
                teacher_logprobs: Vec::new(),
            })
            .collect();
        let toks: usize = batch.iter().map(|t| t.prompt.len() + t.response.len()).sum();
        let runs: Vec<f64> = (0..5)
            .map(|_| {
                let t = Instant::now();
                tr.train_rl_impl(&batch, &[0.0002], 1.0).expect("train");
                t.elapsed().as_secs_f64()
            })
            .collect();
        let s = median(runs);
        println!("| {name} | {:.0} | {s:.3} |", toks as f64 / s);
    }
}
