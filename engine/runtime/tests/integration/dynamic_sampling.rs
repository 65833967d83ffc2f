//! DAPO's dynamic sampling under the sync schedule (`RunSpec::dynamic_sampling`), on the
//! simulated backend: flat groups (every response scored alike) are dropped and more prompts are
//! generated until the step holds `rollout_batch` groups with signal or `max_rounds` rounds were
//! generated; the extra generation is reported, a step short after the cap trains on what it
//! kept (or on nothing, saying so), and a resumed run draws the same prompts as an uninterrupted
//! one.

use super::support::opts;
use miles_runtime::sim::{SimBackend, SimConfig, SimTrainerState, SIM_TRAINER_FILE};
use miles_runtime::{run_with, RunSpec};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Two responses per prompt: with the simulator's 40% chance of solving a prompt, about half the
/// groups are flat (both right or both wrong under exact match).
fn spec(max_rounds: u32, steps: u64) -> RunSpec {
    let text = format!(
        r#"{{
  "seed": 3, "steps": {steps},
  "model": {{"vocab_size": 16, "d_model": 8, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1, "d_ff": 8, "max_len": 24}},
  "task": {{"kind": {{"type": "reverse", "min_len": 3, "max_len": 6}}, "split": {{"test_size": 8, "seed": 7}}}},
  "rollout": {{"rollout_batch": 4, "samples_per_prompt": 2, "max_new_tokens": 12}},
  "train": {{"lr": 0.001, "micro_batch": 8, "global_batch": 8}},
  "eval": {{"every": 0, "prompts": 8}},
  "checkpoint": {{"every": 1, "keep": 2}},
  "samples": {{"every": 1, "count": 8}},
  "dynamic_sampling": {{"max_rounds": {max_rounds}}}
}}"#
    );
    RunSpec::from_json(&text).unwrap()
}

fn backend(p_solve: f64) -> SimBackend {
    SimBackend { cfg: SimConfig { p_solve, ..SimConfig::default() } }
}

fn tmp(name: &str) -> PathBuf {
    super::support::fresh_dir(&format!("dynamic-{name}"))
}

/// The rows of RL steps (those with rollout columns), timings left out.
fn step_rows(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|v| v.get("rollout/gen_rounds").is_some())
        .map(|mut v| {
            v.as_object_mut().unwrap().retain(|k, _| !k.starts_with("perf/"));
            v
        })
        .collect()
}

/// Per step, each shown group's rewards (samples.jsonl shows every sample trained: count 8).
fn shown_groups(dir: &Path) -> BTreeMap<u64, BTreeMap<u64, Vec<f64>>> {
    let mut out: BTreeMap<u64, BTreeMap<u64, Vec<f64>>> = BTreeMap::new();
    for l in std::fs::read_to_string(dir.join("samples.jsonl")).unwrap().lines() {
        let v: Value = serde_json::from_str(l).unwrap();
        let (step, group) = (v["step"].as_u64().unwrap(), v["group"].as_u64().unwrap());
        out.entry(step).or_default().entry(group).or_default().push(v["reward"].as_f64().unwrap());
    }
    out
}

fn trainer_state(dir: &Path) -> SimTrainerState {
    let mut ckpts: Vec<PathBuf> =
        std::fs::read_dir(dir.join("checkpoints")).unwrap().flatten().map(|e| e.path()).collect();
    ckpts.sort();
    let last = ckpts.last().expect("a checkpoint");
    serde_json::from_str(&std::fs::read_to_string(last.join(SIM_TRAINER_FILE)).unwrap()).unwrap()
}

fn col(row: &Value, k: &str) -> f64 {
    row[k].as_f64().unwrap_or_else(|| panic!("no {k} in {row}"))
}

#[test]
fn dynamic_sampling_over_samples_until_groups_have_signal() {
    // Up to 3 rounds a step: every trained group has signal, the extra generation is counted.
    let dir = tmp("three");
    let s = run_with(&spec(3, 6), &opts(&dir, false, None), &backend(0.4)).unwrap();
    assert_eq!(s.steps_done, 6);
    let rows = step_rows(&dir);
    assert_eq!(rows.len(), 6, "{rows:?}");
    let groups = shown_groups(&dir);
    let mut extra_rounds = 0;
    for row in &rows {
        let step = row["step"].as_u64().unwrap();
        let (rounds, kept, extra) =
            (col(row, "rollout/gen_rounds"), col(row, "rollout/kept_groups"), col(row, "rollout/extra_samples"));
        assert!((1.0..=3.0).contains(&rounds), "{row}");
        assert_eq!(extra, (rounds - 1.0) * 4.0 * 2.0, "a round is 4 prompts x 2 samples: {row}");
        assert!(kept == 4.0 || rounds == 3.0, "short only after the last round: {row}");
        // A first round without a flat group is the only round; one with any needs another.
        assert_eq!(rounds == 1.0, col(row, "rollout/flat_group_frac") == 0.0, "{row}");
        assert!(row["train/loss"].is_number(), "the step trained: {row}");
        // The trained batch: `kept` groups, none flat.
        let shown = &groups[&step];
        assert_eq!(shown.len() as f64, kept, "step {step}: {shown:?}");
        for (g, rewards) in shown {
            assert_eq!(rewards.len(), 2, "step {step} group {g}");
            assert_ne!(rewards[0], rewards[1], "step {step} group {g} is flat: {rewards:?}");
        }
        if rounds > 1.0 {
            extra_rounds += 1;
        }
    }
    assert!(extra_rounds >= 2, "the seed gives steps with flat groups: {rows:?}");
    let kept_total: f64 = rows.iter().map(|r| col(r, "rollout/kept_groups")).sum();
    let trained = trainer_state(&dir).trained_prompts;
    assert_eq!(trained.len() as f64, kept_total, "the trainer got exactly the kept groups");
    // Every group trained on its own prompt: the rounds drew fresh prompts (the reverse task
    // has 4^3 + ... prompts; a repeat among 24 would be a cursor that does not advance).
    let distinct: std::collections::BTreeSet<_> = trained.iter().collect();
    assert!(distinct.len() + 2 >= trained.len(), "prompts repeat: {} of {}", distinct.len(), trained.len());

    // The same run stopped after 2 steps and resumed: the prompt cursor comes back from the
    // checkpoint, so the rows and the groups trained are the uninterrupted run's.
    assert!(rows[..2].iter().any(|r| col(r, "rollout/gen_rounds") > 1.0), "steps 1-2 over-sample: {rows:?}");
    let again = tmp("resumed");
    run_with(&spec(3, 6), &opts(&again, false, Some(2)), &backend(0.4)).unwrap();
    let s = run_with(&spec(3, 6), &opts(&again, true, None), &backend(0.4)).unwrap();
    assert_eq!(s.steps_done, 6);
    assert_eq!(step_rows(&again), rows, "a resumed run samples as the uninterrupted one");
    assert_eq!(trainer_state(&again).trained_prompts, trained);

    // One round: the cap. Steps with flat groups train on fewer groups, and say how many.
    let one = tmp("one");
    run_with(&spec(1, 6), &opts(&one, false, None), &backend(0.4)).unwrap();
    let rows = step_rows(&one);
    assert!(rows.iter().all(|r| col(r, "rollout/gen_rounds") == 1.0 && col(r, "rollout/extra_samples") == 0.0));
    let short: Vec<&Value> = rows.iter().filter(|r| col(r, "rollout/kept_groups") < 4.0).collect();
    assert!(!short.is_empty(), "{rows:?}");
    for r in short {
        let frac = col(r, "rollout/flat_group_frac");
        assert_eq!(col(r, "rollout/kept_groups"), 4.0 - 4.0 * frac, "kept = the first round's groups with signal: {r}");
        match col(r, "rollout/kept_groups") {
            0.0 => assert_eq!(r["train/skipped"], 1, "no group kept, no optimizer step: {r}"),
            _ => assert!(r["train/loss"].is_number(), "{r}"),
        }
    }

    // Nothing ever solved: every group is flat, every round. Each step generates its 2 rounds,
    // keeps nothing and skips the optimizer step, with a row that says so; the run finishes.
    let none = tmp("none");
    let s = run_with(&spec(2, 3), &opts(&none, false, None), &backend(0.0)).unwrap();
    assert_eq!(s.steps_done, 3);
    let rows = step_rows(&none);
    assert_eq!(rows.len(), 3);
    for r in &rows {
        assert_eq!(col(r, "rollout/gen_rounds"), 2.0, "{r}");
        assert_eq!(col(r, "rollout/kept_groups"), 0.0, "{r}");
        assert_eq!(col(r, "rollout/extra_samples"), 8.0, "{r}");
        assert_eq!(col(r, "rollout/flat_group_frac"), 1.0, "{r}");
        assert_eq!(col(r, "rollout/reward_mean"), 0.0, "the flat groups' rewards: {r}");
        assert_eq!(r["train/skipped"], 1, "{r}");
        assert!(r.get("train/loss").is_none(), "no optimizer step, no loss: {r}");
    }
    assert!(trainer_state(&none).trained_prompts.is_empty());
    for d in [dir, again, one, none] {
        let _ = std::fs::remove_dir_all(d);
    }
}

/// Dynamic sampling over-samples single responses; a run of episodes is refused before it starts,
/// naming the schedule and what to use instead.
#[test]
fn dynamic_sampling_refuses_episodes() {
    let mut s = spec(3, 2);
    s.model.vocab_size = 64; // the calculator's tokenizer
    s.env = Some(
        serde_json::from_value(serde_json::json!({"env": {"type": "calculator"}}))
            .expect("a calculator environment spec"),
    );
    let dir = tmp("episodes");
    let e = run_with(&s, &opts(&dir, false, None), &backend(0.4)).unwrap_err();
    assert!(e.message.contains("filter = drop_flat") && e.message.contains("episodes"), "{e}");
    assert!(!dir.join("metrics.jsonl").exists(), "refused before the run opened its outputs");
    let _ = std::fs::remove_dir_all(&dir);
}
