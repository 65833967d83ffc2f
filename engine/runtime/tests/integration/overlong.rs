//! DAPO's overlong shaping (`train.overlong`) under both schedules, on the simulated backend
//! (whose responses do not depend on the weights, so two synchronous runs generate the same
//! samples): each step's mean reward is the unshaped run's plus `reward/overlong_mean`, and the
//! evaluation's accuracy is the task's reward, the same with or without shaping.

use miles_runtime::sim::{SimBackend, SimConfig};
use miles_runtime::{run_with, OverlongSpec, ProgressMode, RunOptions, RunSpec};
use serde_json::Value;
use std::path::{Path, PathBuf};

fn spec(schedule: &str, overlong: Option<OverlongSpec>) -> RunSpec {
    let text = format!(
        r#"{{
  "seed": 4, "steps": 3,
  "model": {{"vocab_size": 16, "d_model": 8, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1, "d_ff": 8, "max_len": 24}},
  "task": {{"kind": {{"type": "reverse", "min_len": 3, "max_len": 6}}, "split": {{"test_size": 8, "seed": 7}}}},
  "rollout": {{"rollout_batch": 4, "samples_per_prompt": 4, "max_new_tokens": 12}},
  "train": {{"lr": 0.001, "micro_batch": 16, "global_batch": 16}},
  "eval": {{"every": 1, "prompts": 8}},
  "schedule": {schedule}
}}"#
    );
    let mut s = RunSpec::from_json(&text).unwrap();
    s.train.overlong = overlong;
    s
}

fn run(dir: &Path, s: &RunSpec) -> Vec<Value> {
    let _ = std::fs::remove_dir_all(dir);
    let mut o = RunOptions::new(dir);
    o.progress = ProgressMode::Off;
    let backend = SimBackend { cfg: SimConfig { slots: 16, ..SimConfig::default() } };
    assert_eq!(run_with(s, &o, &backend).unwrap().steps_done, 3);
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|v| v.get("rollout/reward_mean").is_some())
        .collect()
}

fn tmp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("miles-overlong-{}-{name}", std::process::id()))
}

#[test]
fn overlong_shaping_shifts_the_trained_reward_under_both_schedules() {
    // Responses of up to 12 tokens: 0 up to 6, then -(len - 6) / 6 down to -1 at 12.
    let o = OverlongSpec { max: 12, cache: 6, penalty: 1.0 };
    for (name, schedule) in [("sync", r#"{"type": "sync"}"#), ("one-step-off", r#"{"type": "one_step_off"}"#)] {
        let plain = run(&tmp(&format!("{name}-plain")), &spec(schedule, None));
        let shaped = run(&tmp(&format!("{name}-shaped")), &spec(schedule, Some(o)));
        assert_eq!(plain.len(), 3, "{name}");
        let mut penalised = 0.0;
        for (p, s) in plain.iter().zip(&shaped) {
            assert!(p.get("reward/overlong_mean").is_none(), "{name}: no shaping, no column: {p}");
            let (mean, frac) =
                (s["reward/overlong_mean"].as_f64().unwrap(), s["reward/overlong_frac"].as_f64().unwrap());
            assert!((-1.0..=0.0).contains(&mean) && (0.0..=1.0).contains(&frac), "{name}: {s}");
            let (rp, rs) = (p["rollout/reward_mean"].as_f64().unwrap(), s["rollout/reward_mean"].as_f64().unwrap());
            if name == "sync" {
                assert!((rs - (rp + mean)).abs() < 1e-5, "{name}: shaped {rs} = task {rp} + shaping {mean}");
            } else {
                // Which prompts a one-step-off step trains on depends on the threads' timing, so
                // the two runs' steps may differ: the shaped mean minus the shaping is still a
                // mean of 16 exact-match rewards (0 or 1).
                let task = (rs - mean) * 16.0;
                assert!((task - task.round()).abs() < 1e-4 && (0.0..=16.0).contains(&task.round()), "{name}: {s}");
            }
            assert_eq!(p["eval/accuracy"], s["eval/accuracy"], "{name}: evaluation is not shaped");
            penalised += frac;
        }
        assert!(penalised > 0.0, "{name}: some response ran past 6 tokens: {shaped:?}");
        for d in [tmp(&format!("{name}-plain")), tmp(&format!("{name}-shaped"))] {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}
