//! Stages as worker processes (`launcher = local_processes`): the run learns exactly as in-process,
//! and the faults of docs/distributed.md are reported with the worker's name and handled as the
//! recipe says. Each test runs a tiny model for a few seconds.

use crate::common;

use common::metrics::{prompt_ledger as ledger, trained_steps};
use common::process::{output, temp_dir, Proc};
use common::tiny::{tiny_recipe, EVAL};
use common::workers::{assert_nothing_left, quiet_miles as miles, signal, start, wait_for_step, worker_pid};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

/// A run of the tiny recipe ends well within this.
const LIMIT: Duration = Duration::from_secs(300);
/// A tiny run logs its first steps well within this.
const STEP_LIMIT: Duration = Duration::from_secs(60);

fn recipe(dir: &Path, launcher: &str, transport: &str, steps: u32) -> PathBuf {
    let p = dir.join("tiny.miles");
    // Buckets split transfers between processes; in one process there is none to split.
    let sync = if transport == "local" {
        "transport = local".to_string()
    } else {
        format!("transport = {transport}, bucket = 1.MB")
    };
    let launcher = format!("launcher = {launcher}");
    let text = tiny_recipe(&sync, steps, &[&launcher, EVAL, "ckpt = checkpoint(train) { every = 2.steps, keep = 2 }"]);
    std::fs::write(&p, text).unwrap();
    p
}

fn run(args: &[&str]) -> Output {
    output(&mut miles(args), LIMIT)
}

/// `miles run RECIPE --out OUT`, which must succeed (`what` names the run in the failure).
fn run_ok(recipe: &Path, out: &Path, what: &str) -> Output {
    let o = run(&["run", recipe.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    assert!(o.status.success(), "{what}: {}", stderr(&o));
    o
}

/// metrics.jsonl without timings.
fn metrics(out: &Path) -> Vec<Value> {
    common::metrics::untimed(out)
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Runs `recipe` (two engines, `on_failure = drop_engine`), SIGKILLs rollout-1 once step
/// `after` is logged, and checks the run names it, goes on with the other engine, succeeds and
/// leaves nothing running.
fn run_killing_rollout_1(recipe: &Path, out: &Path, after: u64) {
    let mut child = start(&["run", recipe.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    wait_for_step(out, after, &mut child, STEP_LIMIT);
    signal(worker_pid(out, "rollout-1"), libc::SIGKILL);
    let o = child.wait_output(LIMIT);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("worker rollout-1 on host"), "the dead worker is named: {err}");
    assert!(err.contains("continuing with 1 rollout engine"), "{err}");
    assert_nothing_left(&child);
}

#[test]
fn one_engine_in_worker_processes_learns_bit_identically_to_in_process() {
    let dir = temp_dir("workers-same");
    let a = recipe(&dir, "in_process", "local", 4);
    let out_a = dir.join("a");
    run_ok(&a, &out_a, "in process");
    for transport in ["broadcast", "p2p", "disk_delta"] {
        let b = recipe(&dir, "local_processes { engines = 1 }", transport, 4);
        let out_b = dir.join(transport);
        let o = run_ok(&b, &out_b, transport);
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

/// The trainer's `precision = bf16` reaches a trainer wherever it runs: in a worker process the
/// run is the in-process bf16 run number for number, and both differ from the fp32 run (so the
/// GEMMs really ran in bf16).
#[test]
fn a_bf16_trainer_trains_in_bf16_in_process_and_in_a_worker_alike() {
    let dir = temp_dir("workers-bf16");
    let bf16 = |p: PathBuf| -> PathBuf {
        let text = std::fs::read_to_string(&p).unwrap();
        let edited = text.replace("lr = 1e-3 }", "lr = 1e-3, backend = embedded_trainer { precision = bf16 } }");
        assert_ne!(text, edited, "the tiny recipe's train stage changed: update this test");
        let q = p.with_file_name(format!("bf16-{}", p.file_name().unwrap().to_str().unwrap()));
        std::fs::write(&q, edited).unwrap();
        q
    };
    let fp32 = recipe(&dir, "in_process", "local", 3);
    let in_process = bf16(recipe(&dir, "in_process", "local", 3));
    let dir_w = dir.join("w");
    std::fs::create_dir_all(&dir_w).unwrap();
    let worker = bf16(recipe(&dir_w, "local_processes { engines = 1 }", "broadcast", 3));
    let mut runs = Vec::new();
    for (name, r) in [("fp32", &fp32), ("bf16", &in_process), ("bf16-worker", &worker)] {
        let out = dir.join(name);
        run_ok(r, &out, name);
        runs.push(metrics(&out));
    }
    assert_eq!(runs[1], runs[2], "bf16 in a worker process is the in-process bf16 run");
    assert_ne!(runs[0], runs[1], "bf16 GEMMs change the run");
    let spec = std::fs::read_to_string(dir.join("bf16-worker/spec.json")).unwrap();
    assert!(spec.contains("\"precision\": \"bf16\""), "the run spec carries the trainer's precision: {spec}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_killed_rollout_engine_is_dropped_when_the_recipe_says_so() {
    let dir = temp_dir("workers-drop");
    let r = recipe(&dir, "local_processes { engines = 2, on_failure = drop_engine }", "broadcast", 14);
    let out = dir.join("out");
    run_killing_rollout_1(&r, &out, 2);
    // Every step trained on a full batch: no step is missing.
    assert_eq!(trained_steps(&out), (1..=14).collect::<Vec<_>>());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_killed_trainer_stops_the_run_clearly_and_resume_finishes_it() {
    let dir = temp_dir("workers-trainer");
    let r = recipe(&dir, "local_processes { engines = 1 }", "broadcast", 12);
    let out = dir.join("out");
    let mut child = start(&["run", r.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    wait_for_step(&out, 3, &mut child, STEP_LIMIT);
    signal(worker_pid(&out, "trainer-0"), libc::SIGKILL);
    let o = child.wait_output(LIMIT);
    let err = stderr(&o);
    assert!(!o.status.success());
    assert!(err.contains("error[E0513]") && err.contains("stage `train` (worker trainer-0 on host"), "{err}");
    assert_nothing_left(&child);
    let o = run(&["run", r.to_str().unwrap(), "--out", out.to_str().unwrap(), "--resume"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("done: 12 steps"), "{}", stderr(&o));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_silent_engine_hits_its_deadline_and_is_named() {
    let dir = temp_dir("workers-silent");
    let r = recipe(&dir, "local_processes { engines = 1, call_timeout = 2 }", "broadcast", 200);
    let out = dir.join("out");
    let mut child = start(&["run", r.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    wait_for_step(&out, 1, &mut child, STEP_LIMIT);
    let pid = worker_pid(&out, "rollout-0");
    signal(pid, libc::SIGSTOP);
    let t0 = Instant::now();
    let o = child.wait_output(LIMIT);
    let err = stderr(&o);
    assert!(!o.status.success());
    assert!(t0.elapsed() < Duration::from_secs(30), "the deadline bounds the wait");
    // The stopped engine too: the launcher kills what does not exit.
    assert_nothing_left(&child);
    assert!(err.contains("error[E0513]") && err.contains("worker rollout-0"), "{err}");
    assert!(err.contains("deadline of 2 s") || err.contains("no heartbeat"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_corrupted_weight_bucket_is_detected_and_not_loaded() {
    let dir = temp_dir("workers-corrupt");
    let r = recipe(&dir, "local_processes { engines = 1 }", "broadcast", 4);
    let out = dir.join("out");
    // Workers inherit the variable: the trainer flips a byte of bucket 0 after its CRC.
    let mut p = Proc::spawn(
        miles(&["run", r.to_str().unwrap(), "--out", out.to_str().unwrap()])
            .env("MILES_FAULT_CORRUPT_BUCKET", "0")
            .stdin(Stdio::null())
            .stderr(Stdio::piped()),
    );
    let o = p.wait_output(LIMIT);
    assert_nothing_left(&p);
    let err = stderr(&o);
    assert!(!o.status.success());
    assert!(err.contains("error[E0514]") && err.contains("bucket 0 failed its CRC-32"), "{err}");
    assert!(err.contains("not loaded"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The `weights` stage's `channel` reaches the trainer worker: a forced tcp is what every update
/// reports (auto would pick shared memory on loopback). `nccl` stops the run at the first update
/// naming what is missing (here: the CUDA driver or libnccl) and the stage's field, with no panic
/// and no process left; where NCCL is present, both worker processes take GPU 0 and the handshake
/// refuses two ranks on one GPU.
#[test]
fn the_weight_channel_reaches_the_workers_and_nccl_names_what_is_missing() {
    let dir = temp_dir("workers-channel");
    let r = recipe(&dir, "local_processes { engines = 1 }", "broadcast, channel = tcp", 2);
    let out = dir.join("tcp");
    run_ok(&r, &out, "channel = tcp");
    let sync = std::fs::read_to_string(out.join("sync.jsonl")).unwrap();
    assert!(sync.lines().count() >= 2 && sync.lines().all(|l| l.contains("\"broadcast/tcp\"")), "{sync}");

    let r = recipe(&dir, "local_processes { engines = 1 }", "broadcast, channel = nccl", 2);
    let out = dir.join("nccl");
    let mut p = Proc::spawn(
        miles(&["run", r.to_str().unwrap(), "--out", out.to_str().unwrap()])
            .stdin(Stdio::null())
            .stderr(Stdio::piped()),
    );
    let o = p.wait_output(LIMIT);
    assert_nothing_left(&p);
    let err = stderr(&o);
    assert!(!o.status.success());
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.contains("error[E0514]"), "{err}");
    match miles_cuda::nccl::available() {
        Err(_) => {
            assert!(err.contains("channel = nccl"), "{err}");
            assert!(err.contains("libnccl.so.2") || err.contains("libcuda.so"), "{err}");
        }
        Ok(_) => assert!(err.contains("two ranks on one GPU"), "{err}"),
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_worker_refuses_to_start_without_the_run_token() {
    let o = output(
        common::process::miles()
            .args(["worker", "--id", "rollout-0", "--role", "rollout"])
            .env_remove("MILES_RUN_TOKEN"),
        LIMIT,
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("MILES_RUN_TOKEN is not set"));
}

#[test]
fn async_schedules_run_with_engine_workers() {
    let dir = temp_dir("workers-async");
    for (name, schedule) in [
        ("one_step_off", "schedule = one_step_off"),
        ("fully_async", "schedule = fully_async { max_staleness = 1, max_concurrent = 16 }"),
    ] {
        let p = dir.join(format!("{name}.miles"));
        let text = tiny_recipe(
            "transport = broadcast, bucket = 1.MB",
            6,
            &[
                "launcher = local_processes { engines = 2 }",
                EVAL,
                "ckpt = checkpoint(train) { every = 3.steps }",
                schedule,
            ],
        );
        std::fs::write(&p, text).unwrap();
        let out = dir.join(name);
        let o = run(&["run", p.to_str().unwrap(), "--out", out.to_str().unwrap()]);
        let err = stderr(&o);
        assert!(o.status.success(), "{name}: {err}");
        assert!(err.contains("workers up (local_processes)") && err.contains("rollout-1@"), "{name}: {err}");
        assert_eq!(trained_steps(&out), (1..=6).collect::<Vec<_>>(), "{name}");
        let rows = metrics(&out);
        let swaps: f64 = rows.iter().filter_map(|v| v["rollout/fully_async/weight_swaps"].as_f64()).sum();
        assert!(swaps >= 1.0, "{name}: the engines took new weights while the run went on");
        let staleness =
            rows.iter().filter_map(|v| v["rollout/fully_async/staleness_drawn_max"].as_f64()).fold(0.0, f64::max);
        assert!(staleness <= 1.0, "{name}: staleness {staleness}");
        // Every update went to both engine processes over the transport.
        let sync = std::fs::read_to_string(out.join("sync.jsonl")).unwrap();
        assert!(sync.lines().count() >= 6, "{name}: {sync}");
        assert!(sync.lines().all(|l| l.contains("\"targets\":2")), "{name}: {sync}");
        assert_eq!(ledger(&out).accounting_faults(), Vec::<String>::new(), "{name}");
        assert!(rows.iter().any(|v| v.get("eval/accuracy").is_some()), "{name}: evaluated on the engines");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_killed_engine_under_fully_async_loses_no_prompt() {
    let dir = temp_dir("workers-async-kill");
    let p = dir.join("kill.miles");
    let text = tiny_recipe(
        "transport = broadcast, bucket = 1.MB",
        14,
        &[
            "launcher = local_processes { engines = 2, on_failure = drop_engine }",
            EVAL,
            "ckpt = checkpoint(train) { every = 5.steps }",
            "schedule = fully_async { max_staleness = 1 }",
        ],
    );
    std::fs::write(&p, text).unwrap();
    let out = dir.join("out");
    run_killing_rollout_1(&p, &out, 3);
    assert_eq!(trained_steps(&out), (1..=14).collect::<Vec<_>>());
    // Nothing lost: the groups rollout-1 had in flight were generated again on rollout-0.
    let st = ledger(&out);
    assert_eq!(st.accounting_faults(), Vec::<String>::new());
    assert_eq!(st.trained.len(), 14 * 8, "14 steps of 8 groups");
    // Updates after the kill went to the one engine left.
    let sync = std::fs::read_to_string(out.join("sync.jsonl")).unwrap();
    assert!(sync.lines().last().is_some_and(|l| l.contains("\"targets\":1")), "{sync}");
    let _ = std::fs::remove_dir_all(&dir);
}
