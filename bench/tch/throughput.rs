//! Throughput of the embedded backend (not a timed test): generated tokens/s with and without the
//! KV cache, and trained tokens/s of a GRPO step. Medians of several runs.
//!
//! `cargo bench -p miles-tch --bench throughput` (add `-- --threads N` to pin libtorch threads).
//! `-- --device cuda` instead measures a ~0.5B decoder on the GPU against the same run's bf16
//! matmul peak (bench/gpu/run.sh runs it there).

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

/// A GRPO batch over `ps`: each prompt's response from `response`, rewards and advantages
/// alternating, groups of 8.
fn grpo_batch(ps: Vec<Vec<u32>>, response: impl Fn(&[u32]) -> Vec<u32>) -> Vec<Trajectory> {
    ps.into_iter()
        .enumerate()
        .map(|(i, p)| {
            let r = response(&p);
            Trajectory {
                rollout_logprobs: vec![-1.0; r.len()],
                loss_mask: vec![1.0; r.len()],
                response: r,
                prompt: p,
                reward: (i % 2) as f32,
                advantage: if i % 2 == 0 { 1.0 } else { -1.0 },
                group: i / 8,
                weight_version: 0,
                routing: None,
                teacher_logprobs: Vec::new(),
            }
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
    if args.windows(2).any(|w| w[0] == "--device" && w[1] == "cuda") {
        gpu_throughput();
        return;
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
        let batch = grpo_batch(ps, |p| p.iter().rev().take(7).copied().chain([2]).collect());
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

    train_mfu();
}

/// Matmul parameters: every 2-D weight but the embeddings (a lookup, not a product).
fn matmul_params(policy: &Policy) -> i64 {
    policy
        .params()
        .iter()
        .filter(|(n, t)| t.dim() == 2 && !n.contains("embed_tokens"))
        .map(|(_, t)| t.numel() as i64)
        .sum()
}

/// Trained tokens and the median seconds of 5 on-policy GRPO optimizer steps (after a warm-up) of
/// `seqs` sequences of `len` tokens, on the policy's device (waited for on a GPU).
fn time_train_step(policy: Policy, seqs: usize, len: usize) -> (usize, f64) {
    let on_gpu = policy.device().is_cuda();
    let spec: TrainSpec =
        serde_json::from_str(&format!(r#"{{"lr": 0.0002, "micro_batch": {seqs}, "global_batch": {seqs}}}"#))
            .expect("spec");
    let mut tr = TchTrainer::new(policy, spec);
    let batch = grpo_batch(prompts(seqs, len / 2), |p| p.iter().rev().copied().collect());
    let toks: usize = batch.iter().map(|t| t.prompt.len() + t.response.len()).sum();
    let _ = tr.train_rl_impl(&batch, &[0.0002], 1.0).expect("train");
    let s = median(
        (0..5)
            .map(|_| {
                let t = Instant::now();
                tr.train_rl_impl(&batch, &[0.0002], 1.0).expect("train");
                if on_gpu {
                    tch::Cuda::synchronize(0);
                }
                t.elapsed().as_secs_f64()
            })
            .collect(),
    );
    (toks, s)
}

/// The best fp32 matmul rate of this run (FLOP/s): square and model-shaped products, each the
/// median of several, on the same threads as the training below.
fn matmul_peak(shapes: &[(i64, i64, i64)]) -> (f64, String) {
    let mut best = (0.0, String::new());
    for &(m, k, n) in shapes {
        let a = tch::Tensor::randn([m, k], (tch::Kind::Float, tch::Device::Cpu));
        let b = tch::Tensor::randn([k, n], (tch::Kind::Float, tch::Device::Cpu));
        let _ = a.matmul(&b);
        let reps = ((2e10 / (2.0 * (m * k * n) as f64)) as usize).clamp(3, 50);
        let rate = median(
            (0..reps)
                .map(|_| {
                    let t = Instant::now();
                    let c = a.matmul(&b);
                    let _ = c.double_value(&[0, 0]);
                    2.0 * (m * k * n) as f64 / t.elapsed().as_secs_f64()
                })
                .collect(),
        );
        if rate > best.0 {
            best = (rate, format!("{m}x{k}x{n}"));
        }
    }
    best
}

/// Training MFU at three sizes: one on-policy GRPO optimizer step (forward + backward over every
/// position, no separate old-log-prob pass) against this run's fp32 matmul peak. FLOPs: 6 x the
/// matmul parameters x tokens, plus attention's 12 x layers x d x T per token (fwd + bwd).
fn train_mfu() {
    println!();
    println!(
        "| size | params | batch | s/step (median) | trained tok/s | achieved GFLOP/s | peak GFLOP/s (shape) | MFU |"
    );
    println!("|---|---:|---|---:|---:|---:|---:|---:|");
    for (name, d, layers, seqs, len) in [
        ("0.1M (laptop, d64 L2)", 64i64, 2usize, 256usize, 16usize),
        ("~10M (d384 L6)", 384, 6, 64, 64),
        ("~50M (d640 L10)", 640, 10, 32, 64),
    ] {
        let policy = Policy::init(&cfg(d as usize, layers, len + 4), 1);
        let params = matmul_params(&policy);
        let (toks, s) = time_train_step(policy, seqs, len);
        let flops = toks as f64 * (6.0 * params as f64 + 12.0 * layers as f64 * d as f64 * len as f64);
        let rows = (seqs * len) as i64;
        let (peak, shape) = matmul_peak(&[(rows, d, 3 * d), (rows, d, d), (rows, 3 * d, d), (1024, 1024, 1024)]);
        let got = flops / s;
        println!(
            "| {name} | {:.2}M | {seqs} x {len} tok | {s:.3} | {:.0} | {:.1} | {:.1} ({shape}) | {:.1}% |",
            params as f64 / 1e6,
            toks as f64 / s,
            got / 1e9,
            peak / 1e9,
            100.0 * got / peak
        );
        let _ = std::io::Write::flush(&mut std::io::stdout());
    }
}

/// The bf16 matmul rate of the GPU (FLOP/s), the median of 10 timed 8192^3 products after 3
/// warm-ups: the peak a run's MFU is set against.
fn bf16_peak(device: tch::Device) -> f64 {
    let n = 8192i64;
    let a = tch::Tensor::randn([n, n], (tch::Kind::BFloat16, device));
    let b = tch::Tensor::randn([n, n], (tch::Kind::BFloat16, device));
    for _ in 0..3 {
        let _ = a.matmul(&b);
    }
    tch::Cuda::synchronize(0);
    median(
        (0..10)
            .map(|_| {
                let t = Instant::now();
                let _ = a.matmul(&b);
                tch::Cuda::synchronize(0);
                2.0 * (n * n * n) as f64 / t.elapsed().as_secs_f64()
            })
            .collect(),
    )
}

/// A ~0.5B decoder on the GPU: generated tokens/s with the KV cache, and one GRPO optimizer step's
/// trained tokens/s and MFU against `bf16_peak` of the same run (fp32 master weights, bf16 matmuls).
fn gpu_throughput() {
    let spec = miles_runtime::DeviceSpec::Cuda;
    let (device, why) = miles_tch::device::select(spec).unwrap_or_else(|e| {
        eprintln!("error[{}]: {}", e.code, e.message);
        std::process::exit(1)
    });
    println!("device: {why}");
    let peak = bf16_peak(device);
    println!("bf16 matmul peak (8192^3, median of 10): {:.1} TFLOP/s", peak / 1e12);
    let (d, layers, heads, len, seqs) = (1536usize, 16usize, 16usize, 512usize, 32usize);
    let cfg = ModelConfig::decoder(DecoderSizes {
        vocab_size: 16,
        d_model: d,
        n_layers: layers,
        n_heads: heads,
        n_kv_heads: heads / 4,
        d_ff: 4096,
        max_len: len + 8,
    });
    let mut policy = Policy::init(&cfg, 1);
    // The trainer's `precision = bf16`: bf16 GEMMs on tensor cores against fp32 weights.
    policy.bf16_matmuls = true;
    let params = matmul_params(&policy);
    println!("model: d{d} L{layers}, {:.0}M matmul parameters", params as f64 / 1e6);
    let gen = gen_tps(&policy, &prompts(64, 16), 1, 128, true, 3);
    println!("generation (64 prompts, 128 new tokens, KV cache): {gen:.0} tok/s");
    let (toks, s) = time_train_step(policy, seqs, len);
    let flops = toks as f64 * (6.0 * params as f64 + 12.0 * layers as f64 * d as f64 * len as f64);
    println!(
        "training ({seqs} x {len} tokens, one GRPO step, median of 5): {s:.3} s, {:.0} tok/s, {:.1} TFLOP/s, MFU {:.1}% of the bf16 peak",
        toks as f64 / s,
        flops / s / 1e12,
        100.0 * flops / s / peak
    );
}
