//! `peak-flops [--threads N] [--json] [--kind fp32|bf16] [--shape MxKxN]...`: matmul FLOP/s of
//! libtorch on this machine in fp32 (default) or bf16 (a bf16 recipe's GEMMs), the denominator of
//! our MFU. Square matmuls n = 256..2048 (the best is the "peak"),
//! plus the shapes of the compared model's linear layers (what the step can reach at its own
//! sizes): each `--shape` (bench/peers/run.py passes the recipe's), else the 0.1M model's.
//! Median of several repetitions each; this machine is shared, so the runner measures it in the
//! same run as the comparison.

use std::time::Instant;
use tch::{Device, Kind, Tensor};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// GFLOP/s of [m,k] x [k,n] (2mkn FLOPs), median of `reps` timed calls after a warm-up.
fn gflops(kind: Kind, m: i64, k: i64, n: i64) -> f64 {
    let a = Tensor::randn([m, k], (kind, Device::Cpu));
    let b = Tensor::randn([k, n], (kind, Device::Cpu));
    let flops = 2.0 * (m * k * n) as f64;
    // Enough calls per timing that one lasts >= ~20 ms, so timer and dispatch noise vanish.
    let per = ((2e8 / flops).ceil() as usize).clamp(1, 100_000);
    let _ = a.matmul(&b);
    let reps = 9;
    let runs: Vec<f64> = (0..reps)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..per {
                let _ = a.matmul(&b);
            }
            flops * per as f64 / t.elapsed().as_secs_f64() / 1e9
        })
        .collect();
    median(runs)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let threads = args
        .iter()
        .position(|a| a == "--threads")
        .and_then(|i| args.get(i + 1))
        .and_then(|s| s.parse::<i32>().ok());
    if let Some(t) = threads {
        tch::set_num_threads(t);
    }
    let json = args.iter().any(|a| a == "--json");
    let kind = match args.iter().position(|a| a == "--kind").and_then(|i| args.get(i + 1)).map(String::as_str) {
        None | Some("fp32") => Kind::Float,
        Some("bf16") => Kind::BFloat16,
        Some(other) => {
            eprintln!("peak-flops: --kind takes fp32 or bf16, not {other}");
            std::process::exit(2);
        }
    };
    let kind_name = if kind == Kind::Float { "fp32" } else { "bf16" };
    let _g = tch::no_grad_guard();
    let square: Vec<(i64, f64)> = [256i64, 512, 1024, 2048].iter().map(|&n| (n, gflops(kind, n, n, n))).collect();
    let peak = square.iter().map(|x| x.1).fold(0.0, f64::max);
    // The compared model's GEMMs: by default recipes/compare-trl.miles' 1024 rows (128 sequences x
    // 8 tokens) through d=64 -> 176 (MLP) and d=64 -> 64 (attention projections), and 128 rows.
    let mut shapes: Vec<(i64, i64, i64)> = Vec::new();
    for (i, a) in args.iter().enumerate() {
        if a == "--shape" {
            let dims: Vec<i64> = args
                .get(i + 1)
                .map(|s| s.split('x').filter_map(|d| d.parse().ok()).collect())
                .unwrap_or_default();
            if dims.len() != 3 || dims.iter().any(|&d| d < 1) {
                eprintln!("peak-flops: --shape takes MxKxN (positive integers)");
                std::process::exit(2);
            }
            shapes.push((dims[0], dims[1], dims[2]));
        }
    }
    if shapes.is_empty() {
        shapes = vec![(1024, 64, 176), (1024, 64, 64), (1024, 176, 64), (128, 64, 176)];
    }
    let small: Vec<(String, f64)> = shapes
        .iter()
        .map(|&(m, k, n)| (format!("{m}x{k}x{n}"), gflops(kind, m, k, n)))
        .collect();
    if json {
        let sq: Vec<String> = square.iter().map(|(n, g)| format!("\"{n}\": {g:.2}")).collect();
        let sm: Vec<String> = small.iter().map(|(s, g)| format!("\"{s}\": {g:.2}")).collect();
        println!(
            "{{\"threads\": {}, \"peak_gflops\": {peak:.2}, \"square\": {{{}}}, \"model_shapes\": {{{}}}}}",
            tch::get_num_threads(),
            sq.join(", "),
            sm.join(", ")
        );
    } else {
        println!("libtorch {kind_name} matmul, {} thread(s):", tch::get_num_threads());
        for (n, g) in &square {
            println!("  {n}x{n}x{n}: {g:.1} GFLOP/s");
        }
        for (s, g) in &small {
            println!("  {s}: {g:.1} GFLOP/s");
        }
        println!("peak: {peak:.1} GFLOP/s");
    }
}
