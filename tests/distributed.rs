//! Stages as worker processes (`launcher = local_processes`): the run learns exactly as in-process,
//! and the faults of docs/distributed.md are reported with the worker's name and handled as the
//! recipe says. Each test runs a tiny model for a few seconds.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const RECIPE: &str = r#"
import std/tasks/arith
model policy = transformer { layers = 1, d_model = 32, heads = 2, vocab = arith.vocab, max_len = 12 }
cluster laptop = local { cpus = 2 }
recipe tiny on laptop {
    launcher = LAUNCHER
    warmup = sft(policy) { data = arith.addition { digits = 1 }, steps = 30.steps, lr = 3e-3 }
    rollout = generate(warmup) {
        prompts = arith.addition { digits = 1, split = train }
        samples_per_prompt = 4
        max_prompt_tokens = 6.tokens
        max_new_tokens = 3.tokens
    }
    reward = exact_match(rollout)
    train = grpo(rollout, reward) { rollout_batch = 8, global_batch = 32, micro_batch = 32, lr = 1e-3 }
    sync = weights(train -> rollout) { transport = TRANSPORT, bucket = 1.MB }
    eval = evaluate(rollout) { prompts = arith.addition { digits = 1, split = test }, every = 2.steps, limit = 20 }
    ckpt = checkpoint(train) { every = 2.steps, keep = 2 }
    stop = STEPS.steps
}
"#;

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("miles-workers-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn recipe(dir: &Path, launcher: &str, transport: &str, steps: u32) -> PathBuf {
    let p = dir.join("tiny.miles");
    let text =
        RECIPE.replace("LAUNCHER", launcher).replace("TRANSPORT", transport).replace("STEPS", &steps.to_string());
    std::fs::write(&p, text).unwrap();
    p
}

fn miles(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_miles"));
    c.args(args).args(["--threads", "1", "--progress", "off"]).env("NO_COLOR", "1");
    c
}

fn run(args: &[&str]) -> Output {
    miles(args).output().expect("run miles")
}

/// metrics.jsonl without timings.
fn metrics(out: &Path) -> Vec<Value> {
    std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let mut v: Value = serde_json::from_str(l).unwrap();
            if let Some(o) = v.as_object_mut() {
                o.retain(|k, _| !k.starts_with("perf/"));
            }
            v
        })
        .collect()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Waits (bounded) until the run has logged step `n`.
fn wait_for_step(out: &Path, n: u64, child: &mut Child) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let text = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap_or_default();
        if text.lines().filter_map(|l| serde_json::from_str::<Value>(l).ok()).any(|v| v["step"].as_u64() >= Some(n)) {
            return;
        }
        assert!(child.try_wait().unwrap().is_none(), "the run ended before step {n}");
        assert!(Instant::now() < deadline, "no step {n} within 60 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The pid a worker logged when it started.
fn worker_pid(out: &Path, id: &str) -> i32 {
    let log = std::fs::read_to_string(out.join("workers").join(format!("{id}.log"))).unwrap();
    let line = log.lines().find(|l| l.contains(" pid ")).unwrap_or_else(|| panic!("no pid in {id}.log: {log}"));
    line.split(" pid ").nth(1).and_then(|r| r.split_whitespace().next()).and_then(|p| p.parse().ok()).unwrap()
}

fn signal(pid: i32, sig: &str) {
    Command::new("kill").args([sig, &pid.to_string()]).status().unwrap();
}

#[test]
fn one_engine_in_worker_processes_learns_bit_identically_to_in_process() {
    let dir = tmp("same");
    let a = recipe(&dir, "in_process", "local", 4);
    let out_a = dir.join("a");
    let o = run(&["run", a.to_str().unwrap(), "--out", out_a.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    for transport in ["broadcast", "p2p", "disk_delta"] {
        let b = recipe(&dir, "local_processes { engines = 1 }", transport, 4);
        let out_b = dir.join(transport);
        let o = run(&["run", b.to_str().unwrap(), "--out", out_b.to_str().unwrap()]);
        assert!(o.status.success(), "{transport}: {}", stderr(&o));
        assert!(stderr(&o).contains("workers up (local_processes)"), "{}", stderr(&o));
        // Same seed, same threads, exact weight transfer: the same run, number for number.
        let (ma, mb) = (metrics(&out_a), metrics(&out_b));
        assert_eq!(ma.len(), mb.len());
        for (x, y) in ma.iter().zip(&mb) {
            assert_eq!(x, y, "{transport}: metrics differ");
        }
        let sync = std::fs::read_to_string(out_b.join("sync.jsonl")).unwrap();
        assert!(sync.lines().count() >= 5, "one report per update: {sync}");
        assert!(out_b.join("model/model.safetensors").exists());
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_killed_rollout_engine_is_dropped_when_the_recipe_says_so() {
    let dir = tmp("drop");
    let r = recipe(&dir, "local_processes { engines = 2, on_failure = drop_engine }", "broadcast", 14);
    let out = dir.join("out");
    let mut child =
        miles(&["run", r.to_str().unwrap(), "--out", out.to_str().unwrap()]).stderr(Stdio::piped()).spawn().unwrap();
    wait_for_step(&out, 2, &mut child);
    signal(worker_pid(&out, "rollout-1"), "-9");
    let o = child.wait_with_output().unwrap();
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("worker rollout-1 on host"), "the dead worker is named: {err}");
    assert!(err.contains("continuing with 1 rollout engine"), "{err}");
    // Every step trained on a full batch: no step is missing.
    let steps: Vec<u64> =
        metrics(&out).iter().filter_map(|v| v["train/tokens"].as_u64().map(|_| v["step"].as_u64().unwrap())).collect();
    assert_eq!(steps, (1..=14).collect::<Vec<_>>());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_killed_trainer_stops_the_run_clearly_and_resume_finishes_it() {
    let dir = tmp("trainer");
    let r = recipe(&dir, "local_processes { engines = 1 }", "broadcast", 12);
    let out = dir.join("out");
    let mut child =
        miles(&["run", r.to_str().unwrap(), "--out", out.to_str().unwrap()]).stderr(Stdio::piped()).spawn().unwrap();
    wait_for_step(&out, 3, &mut child);
    signal(worker_pid(&out, "trainer-0"), "-9");
    let o = child.wait_with_output().unwrap();
    let err = stderr(&o);
    assert!(!o.status.success());
    assert!(err.contains("error[E0513]") && err.contains("stage `train` (worker trainer-0 on host"), "{err}");
    let o = run(&["run", r.to_str().unwrap(), "--out", out.to_str().unwrap(), "--resume"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("done: 12 steps"), "{}", stderr(&o));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_silent_engine_hits_its_deadline_and_is_named() {
    let dir = tmp("silent");
    let r = recipe(&dir, "local_processes { engines = 1, call_timeout = 2 }", "broadcast", 200);
    let out = dir.join("out");
    let mut child =
        miles(&["run", r.to_str().unwrap(), "--out", out.to_str().unwrap()]).stderr(Stdio::piped()).spawn().unwrap();
    wait_for_step(&out, 1, &mut child);
    let pid = worker_pid(&out, "rollout-0");
    signal(pid, "-STOP");
    let t0 = Instant::now();
    let o = child.wait_with_output().unwrap();
    signal(pid, "-KILL");
    let err = stderr(&o);
    assert!(!o.status.success());
    assert!(t0.elapsed() < Duration::from_secs(30), "the deadline bounds the wait");
    assert!(err.contains("error[E0513]") && err.contains("worker rollout-0"), "{err}");
    assert!(err.contains("deadline of 2 s") || err.contains("no heartbeat"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_corrupted_weight_bucket_is_detected_and_not_loaded() {
    let dir = tmp("corrupt");
    let r = recipe(&dir, "local_processes { engines = 1 }", "broadcast", 4);
    let out = dir.join("out");
    // Workers inherit the variable: the trainer flips a byte of bucket 0 after its CRC.
    let o = miles(&["run", r.to_str().unwrap(), "--out", out.to_str().unwrap()])
        .env("MILES_FAULT_CORRUPT_BUCKET", "0")
        .output()
        .unwrap();
    let err = stderr(&o);
    assert!(!o.status.success());
    assert!(err.contains("error[E0514]") && err.contains("bucket 0 failed its CRC-32"), "{err}");
    assert!(err.contains("not loaded"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_worker_refuses_to_start_without_the_run_token() {
    let o = Command::new(env!("CARGO_BIN_EXE_miles"))
        .args(["worker", "--id", "rollout-0", "--role", "rollout"])
        .env_remove("MILES_RUN_TOKEN")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("MILES_RUN_TOKEN is not set"));
}
