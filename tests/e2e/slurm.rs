//! The distributed run under a real Slurm: `launcher = slurm { ... }` submits one job with an
//! `srun` step per worker; the run learns exactly as in-process. Needs the single-node test
//! cluster of scripts/start-test-slurm.sh; skipped (with the reason printed) when it is absent.

use crate::common;

use common::process::{run_recipe, temp_dir};
use common::tiny::{tiny_recipe, EVAL};
use std::process::Command;
use std::time::Duration;

fn slurm_ready() -> Result<(), String> {
    // Spawned directly, not through `output`: a missing sinfo is a skip, not a failure.
    let o = Command::new("sinfo").args(["-h", "-o", "%t"]).output().map_err(|e| format!("no sinfo ({e})"))?;
    let s = String::from_utf8_lossy(&o.stdout);
    if !o.status.success() || !s.lines().any(|l| matches!(l.trim(), "idle" | "mix")) {
        return Err(format!("no idle Slurm node (sinfo: {:?})", s.trim()));
    }
    Ok(())
}

fn metrics(out: &std::path::Path) -> Vec<serde_json::Value> {
    common::metrics::untimed(out)
}

#[test]
fn grpo_under_slurm_learns_as_in_process() {
    if let Err(why) = slurm_ready() {
        println!("skipped: {why}; start one with `bash scripts/start-test-slurm.sh`");
        return;
    }
    let dir = temp_dir("slurm");
    let mut outs = Vec::new();
    for (name, launcher, transport) in [
        ("inproc", "in_process", "local"),
        ("slurm", "slurm { partition = \"debug\", gpus_per_engine = 1, start_timeout = 60 }", "broadcast"),
    ] {
        let r = dir.join(format!("{name}.miles"));
        // Buckets split transfers between processes; in one process there is none to split.
        let sync = if transport == "local" {
            "transport = local".to_string()
        } else {
            format!("transport = {transport}, bucket = 1.MB")
        };
        let launcher = format!("launcher = {launcher}");
        std::fs::write(&r, tiny_recipe(&sync, 4, &[&launcher, EVAL])).unwrap();
        let out = dir.join(name);
        let o = run_recipe(&r, &out, Duration::from_secs(600));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{name}: {err}");
        if name == "slurm" {
            assert!(err.contains("submitted Slurm job"), "{err}");
            let script = std::fs::read_to_string(out.join("job.sbatch")).unwrap();
            assert_eq!(script.matches("srun ").count(), 2, "{script}");
            let log = std::fs::read_to_string(out.join("workers/rollout-0.log")).unwrap();
            assert!(log.contains("CUDA_VISIBLE_DEVICES="), "--gres gave the engine a GPU: {log}");
        }
        outs.push(out);
    }
    assert_eq!(metrics(&outs[0]), metrics(&outs[1]));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn fully_async_under_slurm_trains_with_every_prompt_accounted_for() {
    if let Err(why) = slurm_ready() {
        println!("skipped: {why}; start one with `bash scripts/start-test-slurm.sh`");
        return;
    }
    let dir = temp_dir("slurm-async");
    let r = dir.join("async.miles");
    // One engine: the test node's two CPUs hold two one-CPU steps at once.
    let launcher = "launcher = slurm { partition = \"debug\", start_timeout = 60 }";
    let text = tiny_recipe(
        "transport = broadcast, bucket = 1.MB",
        6,
        &[
            launcher,
            EVAL,
            "ckpt = checkpoint(train) { every = 3.steps }",
            "schedule = fully_async { max_staleness = 1 }",
        ],
    );
    std::fs::write(&r, text).unwrap();
    let out = dir.join("out");
    let o = run_recipe(&r, &out, Duration::from_secs(600));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("submitted Slurm job"), "{err}");
    let script = std::fs::read_to_string(out.join("job.sbatch")).unwrap();
    assert_eq!(script.matches("srun ").count(), 2, "a trainer and an engine: {script}");
    assert_eq!(common::metrics::trained_steps(&out), (1..=6).collect::<Vec<_>>());
    assert_eq!(common::metrics::prompt_ledger(&out).accounting_faults(), Vec::<String>::new());
    let _ = std::fs::remove_dir_all(&dir);
}
