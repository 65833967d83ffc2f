//! Runs with worker processes, seen from a test: waiting for a step, a worker's pid, signals, and
//! the F32 tensors of a saved model.

use super::process::{miles, Proc};
use serde_json::Value;
use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `miles ARGS` on one thread without progress bars, as the worker tests run it.
pub fn quiet_miles(args: &[&str]) -> Command {
    let mut c = miles();
    c.args(args).args(["--threads", "1", "--progress", "off"]);
    c
}

/// Starts a run in the background, its stderr piped.
pub fn start(args: &[&str]) -> Proc {
    Proc::spawn(quiet_miles(args).stdin(Stdio::null()).stderr(Stdio::piped()))
}

/// After a run that failed: nothing it started is still running (the launcher stopped its
/// workers). The workers get the launcher's grace period to exit first.
pub fn assert_nothing_left(p: &Proc) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !p.left_behind().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(p.left_behind(), Vec::<String>::new(), "processes the run left running");
}

/// Waits up to `limit` until the run has logged step `n`.
pub fn wait_for_step(out: &Path, n: u64, child: &mut Proc, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let text = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap_or_default();
        if text.lines().filter_map(|l| serde_json::from_str::<Value>(l).ok()).any(|v| v["step"].as_u64() >= Some(n)) {
            return;
        }
        assert!(!child.exited(), "the run ended before step {n}");
        assert!(Instant::now() < deadline, "no step {n} within {} s", limit.as_secs());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The pid a worker logged when it started.
pub fn worker_pid(out: &Path, id: &str) -> i32 {
    let log = std::fs::read_to_string(out.join("workers").join(format!("{id}.log"))).unwrap();
    let line = log.lines().find(|l| l.contains(" pid ")).unwrap_or_else(|| panic!("no pid in {id}.log: {log}"));
    line.split(" pid ").nth(1).and_then(|r| r.split_whitespace().next()).and_then(|p| p.parse().ok()).unwrap()
}

pub fn signal(pid: i32, sig: i32) {
    // SAFETY: kill(2) on a worker of this test's run.
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0, "kill({pid}, {sig})");
}

/// The F32 tensors of a safetensors file.
pub fn f32_tensors(path: &Path) -> HashMap<String, Vec<f32>> {
    let bytes = std::fs::read(path).unwrap();
    let h = miles_runtime::safetensors::parse(&bytes).unwrap();
    h.entries
        .iter()
        .filter(|e| e.dtype.name() == "F32")
        .map(|e| {
            let data = &bytes[e.start as usize..(e.start + e.len) as usize];
            (e.name.clone(), data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
        })
        .collect()
}
