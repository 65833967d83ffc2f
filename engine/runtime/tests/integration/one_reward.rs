//! A run's reward is started once (docs/rewards.md): rollouts and evaluations, on every thread of
//! either schedule, score through the same command reward program.

use miles_runtime::sim::{SimBackend, SimConfig};
use miles_runtime::{run_with, ProgressMode, RunOptions, RunSpec};
use std::path::Path;

/// Appends its pid to the file named by its argument when it starts, then scores every sample 0.
const PROGRAM: &str = r#"
import json, os, sys
with open(sys.argv[1], "a") as f:
    f.write(f"{os.getpid()}\n")
for line in sys.stdin:
    req = json.loads(line)
    print(json.dumps({"id": req["id"], "scores": [0.0 for _ in req["samples"]]}), flush=True)
"#;

fn spec(schedule: &str, pids: &Path) -> RunSpec {
    let reward = serde_json::json!({
        "type": "command", "name": "judge",
        "command": ["python3", "-c", PROGRAM, pids.display().to_string()],
    });
    let text = format!(
        r#"{{
  "seed": 2, "steps": 4,
  "model": {{"vocab_size": 16, "d_model": 8, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1, "d_ff": 8, "max_len": 24}},
  "task": {{"kind": {{"type": "reverse", "min_len": 3, "max_len": 6}}, "split": {{"test_size": 8, "seed": 7}}}},
  "reward": {reward},
  "rollout": {{"rollout_batch": 4, "samples_per_prompt": 4, "max_new_tokens": 12}},
  "train": {{"lr": 0.001, "micro_batch": 16, "global_batch": 16}},
  "eval": {{"every": 2, "prompts": 8{mode}}},
  "schedule": {schedule}
}}"#,
        mode = if schedule.contains("fully_async") { r#", "mode": "snapshot""# } else { "" }
    );
    RunSpec::from_json(&text).unwrap()
}

#[test]
fn the_reward_program_is_started_once_for_rollouts_and_evaluations() {
    let schedules = [
        ("sync", r#"{"type": "sync"}"#),
        ("one-step-off", r#"{"type": "one_step_off"}"#),
        ("fully-async-snapshot", r#"{"type": "fully_async", "max_concurrent": 8, "buffer_capacity": 8}"#),
    ];
    for (name, schedule) in schedules {
        let dir = std::env::temp_dir().join(format!("miles-one-reward-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let pids = dir.join("pids.txt");
        let mut opts = RunOptions::new(dir.join("out"));
        opts.progress = ProgressMode::Off;
        let cfg = SimConfig { step_s: 0.0002, train_fixed_s: 0.001, slots: 8, ..SimConfig::default() };
        let s = run_with(&spec(schedule, &pids), &opts, &SimBackend { cfg }).unwrap();
        assert_eq!(s.steps_done, 4, "{name}");
        assert!(s.eval_end.is_some(), "{name}: evaluated");
        let started = std::fs::read_to_string(&pids).unwrap();
        assert_eq!(started.lines().count(), 1, "{name}: the program started once, pids: {started:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
