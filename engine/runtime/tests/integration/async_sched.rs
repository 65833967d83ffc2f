//! The asynchronous executor on the simulated backend: drop reasons and retry/discard, capacity
//! blocking and its timeout, version accounting across weight swaps, one_step_off, evaluation
//! modes, and that a crash and resume loses and repeats no prompt. Simulated times are tiny, so
//! the whole file runs in a few seconds.

use miles_runtime::schedule::*;
use miles_runtime::sim::{SimBackend, SimConfig, SimTrainerState, SIM_TRAINER_FILE};
use miles_runtime::source::{DropReason, SourceState};
use miles_runtime::tasks::TaskSet;
use miles_runtime::{run_with, ProgressMode, RunOptions, RunSpec, StageNames};
use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

fn spec(schedule: &str, steps: u64) -> RunSpec {
    let text = format!(
        r#"{{
  "seed": 3, "steps": {steps},
  "model": {{"vocab_size": 16, "d_model": 8, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1, "d_ff": 8, "max_len": 24}},
  "task": {{"kind": {{"type": "reverse", "min_len": 3, "max_len": 6}}, "split": {{"test_size": 8, "seed": 7}}}},
  "rollout": {{"rollout_batch": 4, "samples_per_prompt": 4, "max_new_tokens": 12}},
  "train": {{"lr": 0.001, "micro_batch": 16, "global_batch": 16}},
  "eval": {{"every": 0, "prompts": 8}},
  "checkpoint": {{"every": 4, "keep": 2}},
  "schedule": {schedule}
}}"#
    );
    RunSpec::from_json(&text).unwrap()
}

/// A fully_async schedule for the tests: small defaults, `extra` (JSON members) overriding them.
fn fully_async(extra: &str) -> String {
    let mut v: serde_json::Map<String, Value> = serde_json::from_str(
        r#"{"type": "fully_async", "max_concurrent": 8, "buffer_capacity": 8, "stall_timeout_s": 20}"#,
    )
    .unwrap();
    let more: serde_json::Map<String, Value> = serde_json::from_str(&format!("{{{extra}}}")).unwrap();
    v.extend(more);
    Value::Object(v).to_string()
}

fn fast() -> SimConfig {
    SimConfig { step_s: 0.0002, train_fixed_s: 0.002, slots: 8, ..SimConfig::default() }
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("miles-async-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn opts(dir: &Path) -> RunOptions {
    let mut o = RunOptions::new(dir);
    o.progress = ProgressMode::Off;
    o
}

fn rows(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|v: &Value| v.get("rollout/reward_mean").is_some())
        .collect()
}

fn sum(rows: &[Value], key: &str) -> f64 {
    rows.iter().map(|r| r[format!("rollout/fully_async/{key}")].as_f64().unwrap()).sum()
}

fn max(rows: &[Value], key: &str) -> f64 {
    rows.iter().map(|r| r[format!("rollout/fully_async/{key}")].as_f64().unwrap()).fold(0.0, f64::max)
}

fn newest_ckpt(dir: &Path) -> PathBuf {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir.join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("state.json").exists())
        .collect();
    v.sort();
    v.pop().unwrap()
}

fn source_state(ckpt: &Path) -> SourceState {
    let v: Value = serde_json::from_str(&std::fs::read_to_string(ckpt.join("async.json")).unwrap()).unwrap();
    serde_json::from_value(v["source"].clone()).unwrap()
}

fn trainer_state(ckpt: &Path) -> SimTrainerState {
    serde_json::from_str(&std::fs::read_to_string(ckpt.join(SIM_TRAINER_FILE)).unwrap()).unwrap()
}

#[test]
fn fully_async_runs_and_reports_its_metrics() {
    let dir = tmp("basic");
    let s = spec(&fully_async(""), 8);
    let sum_ = run_with(&s, &opts(&dir), &SimBackend { cfg: fast() }).unwrap();
    assert_eq!(sum_.steps_done, 8);
    assert!(sum_.eval_end.is_some());
    let r = rows(&dir);
    assert_eq!(r.len(), 8);
    for k in [
        "queue_size",
        "dropped_aborted",
        "dropped_filtered",
        "dropped_stale",
        "staleness_drawn_mean",
        "staleness_drawn_max",
        "staleness_waiting_mean",
        "staleness_waiting_max",
        "concurrency_mean",
        "trainer_idle_s",
        "engine_idle_s",
    ] {
        assert!(r[0].get(format!("rollout/fully_async/{k}")).is_some(), "missing {k}");
    }
    assert!(max(&r, "concurrency_mean") > 1.0, "samples run concurrently");
    assert!(max(&r, "staleness_drawn_max") <= 2.0);
    assert!(dir.join("model").join(SIM_TRAINER_FILE).exists());
}

#[test]
fn filtered_groups_are_never_trained() {
    let dir = tmp("filter");
    let s = spec(&fully_async(r#""filter": "drop_flat""#), 6);
    run_with(&s, &opts(&dir), &SimBackend { cfg: SimConfig { p_solve: 0.3, ..fast() } }).unwrap();
    let r = rows(&dir);
    assert!(sum(&r, "dropped_filtered") > 0.0);
    assert_eq!(sum(&r, "retried"), 0.0, "filtered groups are always discarded");
    for row in &r {
        assert_eq!(row["rollout/flat_group_frac"].as_f64(), Some(0.0));
    }
    let st = source_state(&newest_ckpt(&dir));
    assert_eq!(st.accounting_faults(), Vec::<String>::new(), "every prompt trained, dropped or waiting");
    assert!(st.discarded.iter().all(|(_, why)| *why == DropReason::Filtered));
    // Groups finished after the last step's metrics row are discarded before the final checkpoint.
    assert!(st.discarded.len() as f64 >= sum(&r, "dropped_filtered"));
}

#[test]
fn stale_groups_retry_or_discard() {
    for (action, name) in [(DropAction::Retry, "retry"), (DropAction::Discard, "discard")] {
        let dir = tmp(&format!("stale-{name}"));
        // Staleness 0: whatever was generated before the latest update is stale. A slow trainer
        // lets the buffer fill under old weights.
        let s = spec(&fully_async(&format!(r#""max_staleness": 0, "on_stale": "{name}", "staleness_gate": false"#)), 6);
        let cfg = SimConfig { train_fixed_s: 0.03, ..fast() };
        run_with(&s, &opts(&dir), &SimBackend { cfg }).unwrap();
        let r = rows(&dir);
        assert!(sum(&r, "dropped_stale") > 0.0, "{name}");
        assert_eq!(max(&r, "staleness_drawn_max"), 0.0, "{name}: nothing stale is trained");
        let st = source_state(&newest_ckpt(&dir));
        assert_eq!(st.accounting_faults(), Vec::<String>::new(), "every prompt trained, dropped or waiting");
        let stale_discarded = st.discarded.iter().filter(|(_, w)| *w == DropReason::Stale).count() as f64;
        match action {
            DropAction::Retry => {
                assert_eq!(sum(&r, "retried"), sum(&r, "dropped_stale"));
                assert_eq!(stale_discarded, 0.0);
                assert!(sum(&r, "retry_served") > 0.0, "retried prompts come back");
            }
            DropAction::Discard => {
                assert_eq!(sum(&r, "retried"), 0.0);
                assert_eq!(stale_discarded, sum(&r, "dropped_stale"));
            }
        }
    }
}

#[test]
fn retract_and_abort_pauses_drop_requests_in_flight() {
    for (pause, name) in [(PauseMode::Retract, "retract"), (PauseMode::Abort, "abort")] {
        let dir = tmp(&format!("pause-{name}"));
        let s = spec(&fully_async(&format!(r#""pause": "{name}""#)), 6);
        let cfg = SimConfig { len_mu: 2.3, ..fast() };
        run_with(&s, &opts(&dir), &SimBackend { cfg }).unwrap();
        let r = rows(&dir);
        assert!(sum(&r, "dropped_aborted") > 0.0, "{name}");
        assert_eq!(sum(&r, "samples_spanning_versions"), 0.0, "{name}: nothing continues across a swap");
        let st = source_state(&newest_ckpt(&dir));
        assert_eq!(st.accounting_faults(), Vec::<String>::new(), "every prompt trained, dropped or waiting");
        let aborted_discarded = st.discarded.iter().filter(|(_, w)| *w == DropReason::Aborted).count() as f64;
        match pause {
            PauseMode::Retract => {
                assert_eq!(aborted_discarded, 0.0);
                assert_eq!(sum(&r, "retried"), sum(&r, "dropped_aborted"));
            }
            _ => {
                assert!(aborted_discarded > 0.0);
                assert_eq!(sum(&r, "retried"), 0.0);
            }
        }
    }
}

#[test]
fn in_place_swaps_record_every_version_and_respect_staleness() {
    let dir = tmp("in-place");
    let s = spec(&fully_async(r#""max_staleness": 1, "buffer_capacity": 12"#), 10);
    // Long responses: many samples are in flight when weights change.
    let cfg = SimConfig { len_mu: 2.4, len_sigma: 0.3, ..fast() };
    run_with(&s, &opts(&dir), &SimBackend { cfg }).unwrap();
    let r = rows(&dir);
    assert!(sum(&r, "samples_spanning_versions") > 0.0, "some samples continued under new weights");
    // The trainer saw, per step, each sample's oldest version: version at the draw minus it is at
    // most max_staleness. Versions count updates: the draw of step k sees version k - 1.
    let t = trainer_state(&newest_ckpt(&dir));
    for (k, versions) in t.batch_versions.iter().enumerate() {
        for &v in versions {
            assert!(k as u64 - v.min(k as u64) <= 1, "step {}: version {v}", k + 1);
        }
    }
    assert!(max(&r, "staleness_drawn_max") <= 1.0);
}

#[test]
fn one_step_off_is_exactly_one_version_behind() {
    let dir = tmp("one-step-off");
    let s = spec(r#"{"type": "one_step_off"}"#, 6);
    let cfg = SimConfig { slots: 16, ..fast() };
    run_with(&s, &opts(&dir), &SimBackend { cfg }).unwrap();
    let r = rows(&dir);
    assert_eq!(sum(&r, "dropped_stale") + sum(&r, "dropped_aborted"), 0.0);
    assert_eq!(sum(&r, "samples_spanning_versions"), 0.0, "a batch never mixes versions");
    let t = trainer_state(&newest_ckpt(&dir));
    for (k, versions) in t.batch_versions.iter().enumerate() {
        // Step 1 trains on version 0; step k >= 2 on version k - 2 (drawn at version k - 1).
        let want = (k as u64).saturating_sub(1);
        assert!(versions.iter().all(|&v| v == want), "step {}: {versions:?}", k + 1);
    }
}

#[test]
fn a_full_buffer_blocks_generation() {
    let dir = tmp("capacity");
    // Room for exactly one step's groups; the trainer is slow, so generation waits on it.
    let s = spec(&fully_async(r#""buffer_capacity": 4, "max_concurrent": 16"#), 5);
    let cfg = SimConfig { train_fixed_s: 0.05, slots: 16, ..fast() };
    run_with(&s, &opts(&dir), &SimBackend { cfg }).unwrap();
    let r = rows(&dir);
    for row in &r {
        let q = row["rollout/fully_async/queue_size"].as_u64().unwrap();
        let f = row["rollout/fully_async/groups_in_flight"].as_u64().unwrap();
        assert!(q + f <= 4, "{q} buffered + {f} in flight over a capacity of 4");
    }
    assert!(sum(&r, "engine_idle_s") > 0.05, "generation blocked while the trainer trained");
}

#[test]
fn a_stuck_trainer_or_engine_is_named_after_the_timeout() {
    // The trainer takes longer than the stall timeout: generation gives up waiting for room.
    let dir = tmp("stuck-trainer");
    let s = spec(&fully_async(r#""buffer_capacity": 4, "stall_timeout_s": 0.2"#), 3);
    let e = run_with(&s, &opts(&dir), &SimBackend { cfg: SimConfig { train_fixed_s: 0.6, ..fast() } }).unwrap_err();
    assert_eq!(e.code, "E0509", "{e}");
    assert!(e.message.contains("stage `train`"), "{e}");
    // The engine takes longer than the stall timeout to deliver a step's groups.
    let dir = tmp("stuck-engine");
    let s = spec(&fully_async(r#""stall_timeout_s": 0.2"#), 3);
    let e = run_with(&s, &opts(&dir), &SimBackend { cfg: SimConfig { step_s: 0.05, ..fast() } }).unwrap_err();
    assert_eq!(e.code, "E0509", "{e}");
    assert!(e.message.contains("rollout stage `rollout`"), "{e}");
}

#[test]
fn a_stall_names_the_stages_as_the_recipe_calls_them() {
    let named = |s: &mut RunSpec| {
        s.stages = StageNames { rollout: "gen".into(), train: "learner".into(), eval: "score".into() };
    };
    let dir = tmp("stuck-learner");
    let mut s = spec(&fully_async(r#""buffer_capacity": 4, "stall_timeout_s": 0.2"#), 3);
    named(&mut s);
    let e = run_with(&s, &opts(&dir), &SimBackend { cfg: SimConfig { train_fixed_s: 0.6, ..fast() } }).unwrap_err();
    assert_eq!(e.code, "E0509", "{e}");
    assert!(e.message.contains("stage `learner`") && !e.message.contains("`train`"), "{e}");
    let dir = tmp("stuck-gen");
    let mut s = spec(&fully_async(r#""stall_timeout_s": 0.2"#), 3);
    named(&mut s);
    let e = run_with(&s, &opts(&dir), &SimBackend { cfg: SimConfig { step_s: 0.05, ..fast() } }).unwrap_err();
    assert_eq!(e.code, "E0509", "{e}");
    assert!(e.message.contains("rollout stage `gen`") && e.message.contains("stage `learner`"), "{e}");
    // The names travel in spec.json; a spec without them reads the defaults.
    let back = RunSpec::from_json(&serde_json::to_string(&s).unwrap()).unwrap();
    assert_eq!(back.stages.rollout, "gen");
    assert_eq!(spec(r#"{"type": "sync"}"#, 1).stages.train, "train");
}

#[test]
fn starving_prompts_are_served_first_and_their_age_reported() {
    let dir = tmp("starving");
    // Hard prompts ramble long; with staleness 0 they are stale again and again.
    let s = spec(&fully_async(r#""max_staleness": 0, "starvation_retries": 1, "staleness_gate": false"#), 8);
    let cfg = SimConfig { hard_frac: 0.4, hard_len_factor: 6.0, train_fixed_s: 0.01, ..fast() };
    run_with(&s, &opts(&dir), &SimBackend { cfg }).unwrap();
    let r = rows(&dir);
    assert!(sum(&r, "starving_served") > 0.0);
    assert!(max(&r, "retry_age_max") >= 1.0);
}

/// Every prompt id handed out is trained exactly once, discarded exactly once, or still pending
/// (buffered, in flight or queued for retry): nothing lost, nothing twice.
fn account(spec: &RunSpec, ckpt: &Path) {
    let st = source_state(ckpt);
    let trained = trainer_state(ckpt).trained_prompts;
    let task = TaskSet::build(&spec.task).unwrap();
    let tokens_of = |id: u64| {
        let item = task.train_batch(spec.seed, "rollout-async", id, 1).remove(0);
        task.tokenizer.encode_prompt(&item.prompt).unwrap()
    };
    let mut count: HashMap<u64, usize> = HashMap::new();
    let ids: HashMap<Vec<u32>, u64> = (0..st.next_id).map(|id| (tokens_of(id), id)).collect();
    assert_eq!(ids.len() as u64, st.next_id, "the test's prompts are distinct");
    for p in &trained {
        *count.entry(ids[p]).or_default() += 1;
    }
    for (id, _) in &st.discarded {
        *count.entry(*id).or_default() += 1;
    }
    for p in st.unfinished.iter().chain(&st.starving).chain(&st.retry) {
        *count.entry(p.id).or_default() += 1;
    }
    for id in 0..st.next_id {
        assert_eq!(count.get(&id).copied().unwrap_or(0), 1, "prompt {id}");
    }
    assert_eq!(count.len() as u64, st.next_id);
    // The source's own ledger says the same as what the trainer saw.
    assert_eq!(st.accounting_faults(), Vec::<String>::new());
    let mut by_trainer: Vec<u64> = trained.iter().map(|p| ids[p]).collect();
    let mut by_source = st.trained.clone();
    by_trainer.sort();
    by_source.sort();
    assert_eq!(by_source, by_trainer, "the ledger's trained prompts are the trainer's");
}

#[test]
fn no_prompt_is_lost_or_repeated_across_a_crash_and_resume() {
    let path = tmp("prompts.jsonl");
    let lines: String = (0..3000)
        .map(|i| {
            let p: String = format!("{i:05}").chars().map(|c| (b'a' + c as u8 - b'0') as char).collect();
            let l: String = p.chars().rev().collect();
            format!("{{\"q\": \"{p}>\", \"a\": \"{l}\"}}\n")
        })
        .collect();
    std::fs::write(&path, lines).unwrap();
    let mut s = spec(
        &fully_async(r#""max_staleness": 1, "filter": "drop_flat", "on_stale": "retry", "stall_timeout_s": 3"#),
        12,
    );
    s.task.kind = miles_runtime::TaskKind::Data {
        path: path.clone(),
        prompt_field: "q".into(),
        label_field: "a".into(),
        test_path: None,
        on_error: Default::default(),
    };
    s.model.vocab_size = 16;
    s.checkpoint.every = 3;
    let backend = |crash: Option<u64>| SimBackend { cfg: SimConfig { p_solve: 0.3, crash_at_train: crash, ..fast() } };
    let dir = tmp("crash");
    // The trainer fails during step 8: steps 7-8's work after the step-6 checkpoint is lost.
    let e = run_with(&s, &opts(&dir), &backend(Some(8))).unwrap_err();
    assert!(e.message.contains("simulated crash"), "{e}");
    let ck = newest_ckpt(&dir);
    assert!(ck.ends_with("step-00000006"), "{}", ck.display());
    account(&s, &ck);
    let mut o = opts(&dir);
    o.resume = true;
    let done = run_with(&s, &o, &backend(None)).unwrap();
    assert_eq!(done.steps_done, 12);
    let ck = newest_ckpt(&dir);
    assert!(ck.ends_with("step-00000012"));
    account(&s, &ck);
    let t = trainer_state(&ck);
    assert_eq!(t.trained_prompts.len(), 12 * 4, "12 steps of 4 groups");
}

#[test]
fn evaluation_modes_report_their_lag() {
    for mode in ["shared", "snapshot", "external"] {
        let dir = tmp(&format!("eval-{mode}"));
        let mut s = spec(&fully_async(""), 6);
        s.eval.every = 2;
        s.eval.mode = serde_json::from_value(Value::String(mode.into())).unwrap();
        if mode == "external" {
            // The model directory arrives as the last argument.
            s.eval.command = Some(r#"f() { test -d "$1" && echo '{"accuracy": 0.75}'; }; f"#.into());
        }
        let sum_ = run_with(&s, &opts(&dir), &SimBackend { cfg: fast() }).unwrap();
        let evals: Vec<Value> = std::fs::read_to_string(dir.join("metrics.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .filter(|v| v.get("eval/accuracy").is_some())
            .collect();
        let steps: Vec<u64> = evals.iter().map(|v| v["step"].as_u64().unwrap()).collect();
        for want in [0, 2, 4, 6] {
            assert!(steps.contains(&want), "{mode}: evaluations at {steps:?}");
        }
        assert!(evals.iter().all(|v| v.get("eval/lag_steps").is_some()), "{mode}");
        if mode == "external" {
            assert_eq!(sum_.eval_end, Some(0.75));
            assert!(dir.join("eval").join("step-00000002").join(SIM_TRAINER_FILE).exists());
        } else {
            assert!(sum_.eval_end.is_some());
        }
    }
}

#[test]
fn sync_and_async_specs_round_trip_and_validate() {
    let s = spec(&fully_async(""), 2);
    let back = RunSpec::from_json(&serde_json::to_string(&s).unwrap()).unwrap();
    assert_eq!(back, s);
    let mut bad = spec(&fully_async(r#""buffer_capacity": 2"#), 2);
    let e = bad.validate().unwrap_err();
    assert!(e.message.contains("schedule.buffer_capacity"), "{e}");
    bad.schedule = ScheduleSpec::Sync;
    bad.validate().unwrap();
    // A sync spec serialises without the schedule, as before it existed.
    assert!(!serde_json::to_string(&bad).unwrap().contains("schedule"));
}

#[test]
fn the_staleness_gate_keeps_generation_from_running_ahead() {
    // A fast engine and a slow trainer: without the gate generation fills the buffer and most of
    // it goes stale; with it, generation waits and nothing is dropped.
    let cfg = SimConfig { train_fixed_s: 0.03, ..fast() };
    let dir = tmp("gate-off");
    let s = spec(&fully_async(r#""max_staleness": 0, "buffer_capacity": 16, "staleness_gate": false"#), 6);
    run_with(&s, &opts(&dir), &SimBackend { cfg: cfg.clone() }).unwrap();
    assert!(sum(&rows(&dir), "dropped_stale") > 0.0);
    let dir = tmp("gate-on");
    let s = spec(&fully_async(r#""max_staleness": 0, "buffer_capacity": 16"#), 6);
    run_with(&s, &opts(&dir), &SimBackend { cfg }).unwrap();
    let r = rows(&dir);
    assert_eq!(sum(&r, "dropped_stale"), 0.0);
    assert!(sum(&r, "engine_idle_s") > 0.05, "generation waited for newer weights");
}
