//! Resume on the simulated backend, under both schedules: a resume may change the run's steps
//! (and cadences) and is refused, naming each field, for anything else; a damaged newest
//! checkpoint is passed over for the one before it.

use super::support::opts;
use miles_runtime::sim::{SimBackend, SimConfig, SimTrainerState, SIM_TRAINER_FILE};
use miles_runtime::{run_with, RunSpec};
use serde_json::Value;
use std::path::{Path, PathBuf};

fn spec(schedule: &str, steps: u64) -> RunSpec {
    let text = format!(
        r#"{{
  "seed": 5, "steps": {steps},
  "model": {{"vocab_size": 16, "d_model": 8, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1, "d_ff": 8, "max_len": 24}},
  "task": {{"kind": {{"type": "reverse", "min_len": 3, "max_len": 6}}, "split": {{"test_size": 8, "seed": 7}}}},
  "rollout": {{"rollout_batch": 4, "samples_per_prompt": 4, "max_new_tokens": 12}},
  "train": {{"lr": 0.001, "micro_batch": 16, "global_batch": 16}},
  "eval": {{"every": 0, "prompts": 8}},
  "checkpoint": {{"every": 1, "keep": 2}},
  "schedule": {schedule}
}}"#
    );
    RunSpec::from_json(&text).unwrap()
}

const SYNC: &str = r#"{"type": "sync"}"#;
const ASYNC: &str = r#"{"type": "one_step_off"}"#;

fn backend() -> SimBackend {
    SimBackend { cfg: SimConfig { step_s: 0.0002, train_fixed_s: 0.001, slots: 8, ..SimConfig::default() } }
}

fn tmp(name: &str) -> PathBuf {
    super::support::fresh_dir(&format!("resume-{name}"))
}

fn steps_in_metrics(dir: &Path) -> Vec<u64> {
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|v| v.get("rollout/reward_mean").is_some())
        .map(|v| v["step"].as_u64().unwrap())
        .collect()
}

#[test]
fn a_resume_may_extend_or_shorten_the_steps_under_both_schedules() {
    for (name, schedule) in [("sync", SYNC), ("async", ASYNC)] {
        let dir = tmp(&format!("steps-{name}"));
        run_with(&spec(schedule, 20), &opts(&dir, false, Some(3)), &backend()).unwrap();
        // Shorter than the run's 20 (as `--steps 6` would), past the checkpoint at 3.
        let s = run_with(&spec(schedule, 6), &opts(&dir, true, None), &backend()).unwrap();
        assert_eq!((s.steps_done, s.stopped_early), (6, false), "{name}");
        assert_eq!(steps_in_metrics(&dir), (1..=6).collect::<Vec<_>>(), "{name}");
        // Longer again: from the final checkpoint at 6.
        let s = run_with(&spec(schedule, 8), &opts(&dir, true, None), &backend()).unwrap();
        assert_eq!(s.steps_done, 8, "{name}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn a_resume_with_another_setting_is_refused_naming_each_field() {
    let dir = tmp("refused");
    run_with(&spec(SYNC, 6), &opts(&dir, false, Some(2)), &backend()).unwrap();
    let mut other = spec(SYNC, 6);
    other.train.lr = 0.002;
    other.rollout.samples_per_prompt = 8;
    other.train.global_batch = 32;
    other.train.micro_batch = 32;
    let e = run_with(&other, &opts(&dir, true, None), &backend()).err().unwrap();
    assert_eq!(e.code, "E0507");
    for field in ["train.lr: 0.001 -> 0.002", "rollout.samples_per_prompt: 4 -> 8", "train.global_batch: 16 -> 32"] {
        assert!(e.message.contains(field), "{field} not named in: {}", e.message);
    }
    assert!(e.help.as_deref().unwrap_or("").contains("steps, checkpoint.every"), "{:?}", e.help);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_checkpoint_past_the_new_steps_is_refused_with_the_steps_to_ask_for() {
    let dir = tmp("past");
    run_with(&spec(SYNC, 6), &opts(&dir, false, Some(4)), &backend()).unwrap();
    let e = run_with(&spec(SYNC, 2), &opts(&dir, true, None), &backend()).err().unwrap();
    assert_eq!(e.code, "E0507");
    assert!(e.message.contains("at step 4, past the run's 2 steps"), "{}", e.message);
    assert!(e.help.as_deref().unwrap_or("").contains("--steps 4"), "{:?}", e.help);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_damaged_newest_checkpoint_is_passed_over_for_the_previous_one() {
    for (name, schedule) in [("sync", SYNC), ("async", ASYNC)] {
        let dir = tmp(&format!("damaged-{name}"));
        run_with(&spec(schedule, 6), &opts(&dir, false, Some(3)), &backend()).unwrap();
        let newest = dir.join("checkpoints/step-00000003");
        let f = newest.join(SIM_TRAINER_FILE);
        let text = std::fs::read_to_string(&f).unwrap();
        // A torn write: the file cut short.
        std::fs::write(&f, &text[..text.len() / 2]).unwrap();
        let s = run_with(&spec(schedule, 6), &opts(&dir, true, None), &backend()).unwrap();
        assert_eq!(s.steps_done, 6, "{name}");
        assert_eq!(steps_in_metrics(&dir), (1..=6).collect::<Vec<_>>(), "{name}: step 3 is redone once");
        let last: SimTrainerState = serde_json::from_str(
            &std::fs::read_to_string(dir.join("checkpoints/step-00000006").join(SIM_TRAINER_FILE)).unwrap(),
        )
        .unwrap();
        assert_eq!(last.batch_versions.len(), 6, "{name}: six steps trained, none twice");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Sets `flag` once metrics.jsonl holds a step's row (bounded: 60 s).
fn interrupt_after_first_step(dir: PathBuf, flag: std::sync::Arc<std::sync::atomic::AtomicBool>) {
    std::thread::spawn(move || {
        let t0 = std::time::Instant::now();
        while t0.elapsed() < std::time::Duration::from_secs(60) {
            if std::fs::read_to_string(dir.join("metrics.jsonl")).is_ok_and(|t| t.contains("rollout/reward_mean")) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        flag.store(true, std::sync::atomic::Ordering::SeqCst);
    });
}

#[test]
fn an_interrupt_ends_the_step_writes_a_checkpoint_there_and_the_resume_goes_on() {
    for (name, schedule) in [("sync", SYNC), ("async", ASYNC)] {
        let dir = tmp(&format!("interrupt-{name}"));
        let mut s = spec(schedule, 200);
        // No periodic checkpoints: the one at the interrupted step is the interrupt's own.
        s.checkpoint.every = 0;
        let flag = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut o = opts(&dir, false, None);
        o.interrupt = Some(flag.clone());
        interrupt_after_first_step(dir.clone(), flag);
        let cfg = SimConfig { step_s: 0.0002, train_fixed_s: 0.02, slots: 8, ..SimConfig::default() };
        let sum = run_with(&s, &o, &SimBackend { cfg }).unwrap();
        assert!(sum.interrupted && sum.stopped_early, "{name}");
        assert!(sum.steps_done >= 1 && sum.steps_done < 200, "{name}: {}", sum.steps_done);
        let ckpt = dir.join(format!("checkpoints/step-{:08}", sum.steps_done));
        assert_eq!(sum.checkpoint.as_deref(), Some(ckpt.as_path()), "{name}");
        assert!(ckpt.join("manifest.json").exists(), "{name}: a complete checkpoint");
        assert!(!dir.join("model").exists(), "{name}: no final model for an unfinished run");
        let done = steps_in_metrics(&dir);
        assert_eq!(done, (1..=sum.steps_done).collect::<Vec<_>>(), "{name}");
        let mut s2 = s.clone();
        s2.steps = sum.steps_done + 2;
        let end = run_with(&s2, &opts(&dir, true, None), &backend()).unwrap();
        assert_eq!((end.steps_done, end.interrupted), (sum.steps_done + 2, false), "{name}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
