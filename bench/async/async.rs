//! Sync vs one_step_off vs fully_async at equal batch on the simulated backend, whose response
//! lengths are long-tailed (log-normal, a tenth of the prompts 4x longer): the bubble of sync RL
//! is the wait for each batch's longest sample while training idles, and vice versa.
//!
//! `cargo bench -p miles-runtime --bench async` (see bench/RESULTS.md). The simulated engine and
//! trainer sleep for modelled times, so the figures barely depend on the machine's load; the
//! executors, buffer and threads are the real ones.
//!
//! Reported per schedule: median step time over the measured steps (first 3 are warm-up) of
//! each of `ROUNDS` alternating rounds, then the median over rounds. The ideal overlap bound is
//! max(median generation, median training) of the sync run: what perfect overlap would give at
//! sync's generation efficiency; the fraction achieved is (sync - x) / (sync - bound).

use miles_runtime::sim::{SimBackend, SimConfig};
use miles_runtime::{run_with, ProgressMode, RunOptions, RunSpec};
use serde_json::Value;
use std::path::Path;

const STEPS: u64 = 30;
const WARMUP: usize = 3;
const ROUNDS: usize = 3;

fn spec(schedule: &str) -> RunSpec {
    let text = format!(
        r#"{{
  "seed": 1, "steps": {STEPS},
  "model": {{"vocab_size": 16, "d_model": 8, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1, "d_ff": 8, "max_len": 160}},
  "task": {{"kind": {{"type": "reverse", "min_len": 3, "max_len": 6}}, "split": {{"test_size": 16, "seed": 7}}}},
  "rollout": {{"rollout_batch": 8, "samples_per_prompt": 8, "max_new_tokens": 128}},
  "train": {{"lr": 0.001, "micro_batch": 64, "global_batch": 64}},
  "eval": {{"every": 0, "prompts": 16}},
  "schedule": {schedule}
}}"#
    );
    RunSpec::from_json(&text).expect("bench spec")
}

/// `train_per_token_s` picks the regime: 100 us is training-bound (~0.2 s of training against
/// ~0.15 s of sync generation), 20 us generation-bound (~0.07 s).
fn sim(train_per_token_s: f64) -> SimConfig {
    SimConfig {
        // A decode step: 1 ms fixed + 15 us per sample in flight (memory-bound decoding).
        step_s: 0.001,
        per_sample_s: 0.000_015,
        len_mu: 2.5,
        len_sigma: 0.9,
        hard_frac: 0.1,
        hard_len_factor: 4.0,
        p_solve: 0.3,
        train_fixed_s: 0.04,
        train_per_token_s,
        slots: 64,
        crash_at_train: None,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    v[v.len() / 2]
}

struct Run {
    step_s: f64,
    gen_s: f64,
    train_s: f64,
    wall_s: f64,
    hist: Vec<u64>,
    concurrency: f64,
    trainer_idle: f64,
    engine_idle: f64,
}

fn run(schedule: &str, dir: &Path, per_token: f64) -> Run {
    let _ = std::fs::remove_dir_all(dir);
    let mut o = RunOptions::new(dir);
    o.progress = ProgressMode::Off;
    let s = run_with(&spec(schedule), &o, &SimBackend { cfg: sim(per_token) }).expect("bench run");
    let rows: Vec<Value> = std::fs::read_to_string(dir.join("metrics.jsonl"))
        .expect("metrics")
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v.get("train/loss").is_some())
        .skip(WARMUP)
        .collect();
    let col = |k: &str| rows.iter().filter_map(|r| r.get(k).and_then(Value::as_f64)).collect::<Vec<_>>();
    let mut hist = Vec::new();
    for r in &rows {
        if let Some(h) = r.get("rollout/fully_async/staleness_drawn_hist").and_then(Value::as_array) {
            for (i, c) in h.iter().enumerate() {
                if hist.len() <= i {
                    hist.resize(i + 1, 0);
                }
                hist[i] += c.as_u64().unwrap_or(0);
            }
        }
    }
    Run {
        step_s: median(col("perf/step_s")),
        gen_s: median(col("perf/gen_s")),
        train_s: median(col("perf/train_s")),
        wall_s: s.wall_seconds,
        hist,
        concurrency: median(col("rollout/fully_async/concurrency_mean")),
        trainer_idle: median(col("rollout/fully_async/trainer_idle_s")),
        engine_idle: median(col("rollout/fully_async/engine_idle_s")),
    }
}

fn main() {
    for (name, per_token) in [("training-bound", 0.000_1), ("generation-bound", 0.000_02)] {
        println!("\n### {name} (training {:.0} us per token)\n", per_token * 1e6);
        scenario(per_token);
    }
}

fn scenario(per_token: f64) {
    let tmp = std::env::temp_dir().join(format!("miles-bench-async-{}", std::process::id()));
    let schedules = [
        ("sync", r#"{"type": "sync"}"#.to_string()),
        ("one_step_off", r#"{"type": "one_step_off"}"#.to_string()),
        (
            "fully_async",
            r#"{"type": "fully_async", "max_staleness": 2, "max_concurrent": 64, "buffer_capacity": 16}"#.to_string(),
        ),
    ];
    let mut per: Vec<Vec<Run>> = schedules.iter().map(|_| Vec::new()).collect();
    for round in 0..ROUNDS {
        for (i, (name, sched)) in schedules.iter().enumerate() {
            let r = run(sched, &tmp.join(format!("{name}-{round}")), per_token);
            eprintln!("round {round} {name}: median step {:.3} s, wall {:.1} s", r.step_s, r.wall_s);
            per[i].push(r);
        }
    }
    let _ = std::fs::remove_dir_all(&tmp);
    let med = |i: usize, f: &dyn Fn(&Run) -> f64| median(per[i].iter().map(f).collect());
    let sync = med(0, &|r| r.step_s);
    let bound = med(0, &|r| r.gen_s).max(med(0, &|r| r.train_s));
    println!("steps {STEPS} (first {WARMUP} not measured), {ROUNDS} alternating rounds, batch 8 prompts x 8 samples");
    println!(
        "sync generation {:.3} s + training {:.3} s per step; ideal overlap bound max(gen, train) = {bound:.3} s",
        med(0, &|r| r.gen_s),
        med(0, &|r| r.train_s)
    );
    println!();
    println!("| schedule | median step | vs sync | fraction of ideal overlap | concurrency | trainer idle/step | engine idle/step |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (i, (name, _)) in schedules.iter().enumerate() {
        let s = med(i, &|r| r.step_s);
        let frac = (sync - s) / (sync - bound);
        let conc = med(i, &|r| r.concurrency);
        println!(
            "| {name} | {s:.3} s | {:.2}x | {} | {} | {} | {} |",
            sync / s,
            if i == 0 { "-".to_string() } else { format!("{:.0}%", 100.0 * frac) },
            if conc.is_nan() { "-".to_string() } else { format!("{conc:.1}") },
            if i == 0 { "-".to_string() } else { format!("{:.3} s", med(i, &|r| r.trainer_idle)) },
            if i == 0 { "-".to_string() } else { format!("{:.3} s", med(i, &|r| r.engine_idle)) },
        );
    }
    for (i, (name, _)) in schedules.iter().enumerate().skip(1) {
        let mut hist = Vec::new();
        for r in &per[i] {
            for (k, c) in r.hist.iter().enumerate() {
                if hist.len() <= k {
                    hist.resize(k + 1, 0);
                }
                hist[k] += c;
            }
        }
        let total: u64 = hist.iter().sum();
        let cells: Vec<String> = hist
            .iter()
            .enumerate()
            .map(|(k, c)| format!("{k}: {c} ({:.0}%)", 100.0 * *c as f64 / total.max(1) as f64))
            .collect();
        println!("\nstaleness of the groups drawn, {name} (all rounds): {}", cells.join(", "));
    }
}
