//! Compacted episodes end to end: an environment in Python (tests/fixtures/envs/hint_env.py)
//! answers every wrong turn with a hint, so contexts fill; the episode driver compacts them (the
//! first observation and the last turn) instead of ending the episode, each compaction starting a
//! new TITO chain (the branching rule), under the sync and the fully_async executors. The engine
//! and trainer are the simulated backend's, so the file runs in seconds.

use miles_runtime::env::jsonl::JsonlSpec;
use miles_runtime::env::spec::{EnvRunSpec, EnvSpec};
use miles_runtime::session::Rule;
use miles_runtime::sim::{SimBackend, SimConfig};
use miles_runtime::{run_with, ProgressMode, RunOptions, RunSpec};
use serde_json::Value;
use std::path::{Path, PathBuf};

fn repo(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(p)
}

fn spec(schedule: &str) -> RunSpec {
    let text = format!(
        r#"{{
  "seed": 5, "steps": 4,
  "model": {{"vocab_size": 16, "d_model": 8, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1, "d_ff": 8, "max_len": 28}},
  "task": {{"kind": {{"type": "reverse", "min_len": 3, "max_len": 5}}, "split": {{"test_size": 8, "seed": 7}}}},
  "rollout": {{"rollout_batch": 4, "samples_per_prompt": 4, "max_new_tokens": 8}},
  "train": {{"lr": 0.001, "micro_batch": 16, "global_batch": 16}},
  "eval": {{"every": 2, "prompts": 8}},
  "checkpoint": {{"every": 0, "keep": 1}},
  "schedule": {schedule}
}}"#
    );
    let mut s = RunSpec::from_json(&text).unwrap();
    s.env = Some(EnvRunSpec {
        env: EnvSpec::Jsonl(JsonlSpec {
            name: "hint".into(),
            argv: vec!["python3".into(), repo("tests/fixtures/envs/hint_env.py").display().to_string()],
            cwd: None,
            pass_env: vec![],
        }),
        max_turns: 6,
        turn_timeout_s: 20.0,
        episode_timeout_s: 60.0,
        concurrency: 4,
        tool_format: Default::default(),
        reward: Default::default(),
        on_env_error: Default::default(),
        session: Rule::Branching,
        compact_keep_turns: Some(1),
        solved_at: 1.0,
        prompt: Default::default(),
    });
    s
}

fn rows(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn total(rows: &[Value], key: &str) -> f64 {
    rows.iter().filter_map(|r| r.get(key).and_then(Value::as_f64)).sum()
}

fn sim() -> SimBackend {
    // Short responses that end on a stop token: episodes go on until max_turns, their contexts fill.
    SimBackend { cfg: SimConfig { p_solve: 0.15, len_mu: 1.0, len_sigma: 0.3, slots: 8, ..SimConfig::default() } }
}

#[test]
fn compacted_episodes_train_end_to_end() {
    let async_ = r#"{"type": "fully_async", "max_concurrent": 8, "buffer_capacity": 8, "stall_timeout_s": 30}"#;
    for (name, schedule) in [("sync", r#"{"type": "sync"}"#), ("async", async_)] {
        let dir = std::env::temp_dir().join(format!("miles-compaction-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut o = RunOptions::new(&dir);
        o.progress = ProgressMode::Off;
        let s = spec(schedule);
        let sum = run_with(&s, &o, &sim()).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(sum.steps_done, 4, "{name}");
        let r = rows(&dir);
        let steps: Vec<&Value> = r.iter().filter(|x| x.get("rollout/turns").is_some()).collect();
        assert_eq!(steps.len(), 4, "{name}: {r:?}");
        // Contexts filled and were compacted; no episode ended by overflowing, none by a fault.
        assert!(total(&r, "rollout/compactions") > 0.0, "{name}: {r:?}");
        assert_eq!(total(&r, "rollout/episode_end/context_overflow"), 0.0, "{name}: {r:?}");
        assert!(r.iter().all(|x| x.as_object().unwrap().keys().all(|k| !k.contains("episode_end/env_"))), "{name}");
        assert!(total(&r, "rollout/episode_end/max_turns") > 0.0, "{name}: {r:?}");
        for x in &steps {
            assert!(x["train/loss"].is_number(), "{name}: {x}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn compaction_needs_the_branching_rule() {
    let mut s = spec(r#"{"type": "sync"}"#);
    if let Some(e) = s.env.as_mut() {
        e.session = Rule::Linear;
    }
    let dir = std::env::temp_dir().join(format!("miles-compaction-{}-linear", std::process::id()));
    let e = run_with(&s, &RunOptions::new(&dir), &sim()).unwrap_err();
    assert!(e.message.contains("compaction needs `env.session = branching`"), "{e}");
    assert!(!dir.exists(), "refused before anything was written");
}
