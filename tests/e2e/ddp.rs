//! The trainer as data-parallel ranks (`embedded_trainer { dp = 2 }`, issue #37): N `miles worker`
//! trainer processes meeting at the controller's c10d store, each training its share of every
//! optimizer step. Two ranks train as one process does (the same rewards, losses within float
//! summation order, the same final weights within 1e-5), two runs of two ranks are the same run
//! number for number, and a rank killed (SIGKILL) or stopped (SIGSTOP) mid-run stops the run
//! within a bound, named, with its last checkpoint intact for `--resume`. Under the test Slurm
//! and Ray head (skipped, saying why, when they are not up) the ranks train as local processes do.

use crate::common;

use common::process::{output, temp_dir};
use common::tiny::{tiny_recipe, EVAL};
use common::workers::{
    assert_nothing_left, f32_tensors as tensors, quiet_miles as miles, signal, start, wait_for_step, worker_pid,
};
use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// A run of the tiny recipe ends well within this.
const LIMIT: Duration = Duration::from_secs(300);

/// The tiny recipe with two micro-batches per optimizer step (one per rank at dp = 2; the same
/// two, summed, at dp = 1), its trainer `embedded_trainer { TRAINER }` (`dp = 2`, ...), under
/// `launcher`, a checkpoint every 2 steps.
fn recipe(dir: &Path, name: &str, trainer: &str, launcher: &str, steps: u32) -> PathBuf {
    let launcher = format!("launcher = {launcher}");
    let lines = [launcher.as_str(), EVAL, "ckpt = checkpoint(train) { every = 2.steps, keep = 2 }"];
    let text = tiny_recipe("transport = broadcast, bucket = 1.MB", steps, &lines);
    // A collective's deadline is a setting of the ranks: one rank has none (E0511).
    let timeout = if trainer.contains("dp = 1") { "" } else { ", collective_timeout = 10" };
    let train = format!("micro_batch = 16, lr = 1e-3, backend = embedded_trainer {{ {trainer}{timeout} }} }}");
    let edited = text.replace("micro_batch = 32, lr = 1e-3 }", &train);
    assert_ne!(text, edited, "the tiny recipe's train stage changed: update this test");
    let p = dir.join(format!("{name}.miles"));
    std::fs::write(&p, edited).unwrap();
    p
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `miles run RECIPE --out OUT` (and `more` arguments), which must succeed.
fn run_ok(recipe: &Path, out: &Path, more: &[&str]) -> String {
    let mut args = vec!["run", recipe.to_str().unwrap(), "--out", out.to_str().unwrap()];
    args.extend_from_slice(more);
    let o = output(&mut miles(&args), LIMIT);
    let err = stderr(&o);
    assert!(o.status.success(), "{}: {err}", out.display());
    err
}

/// The largest relative difference of `a` from `b` over the tensors, each measured as
/// ||a - b|| / ||b|| (an element near zero is not a relative scale of its own).
fn max_relative(a: &HashMap<String, Vec<f32>>, b: &HashMap<String, Vec<f32>>) -> (f64, String) {
    assert!(!b.is_empty(), "no F32 tensor to compare");
    assert_eq!(a.len(), b.len(), "the same tensors");
    let mut worst = (0.0, String::new());
    for (name, x) in a {
        let y = &b[name];
        assert_eq!(x.len(), y.len(), "{name}");
        let diff: f64 = x.iter().zip(y).map(|(p, q)| (*p as f64 - *q as f64).powi(2)).sum::<f64>().sqrt();
        let norm: f64 = y.iter().map(|q| (*q as f64).powi(2)).sum::<f64>().sqrt().max(1e-12);
        if diff / norm > worst.0 {
            worst = (diff / norm, name.clone());
        }
    }
    worst
}

/// A run's trained rows: step -> the row.
fn trained(out: &Path) -> Vec<Value> {
    common::metrics::untimed(out).into_iter().filter(|r| r.get("train/loss").is_some()).collect()
}

/// dp = 2, plain and with ZeRO-1, against dp = 1 (all worker processes, the same micro-batches):
/// every step's samples, rewards and tokens equal, the trainer's figures within float summation
/// order, the final model within 1e-5 relative per tensor; two dp = 2 runs are the same run,
/// number for number.
#[test]
fn two_ranks_train_as_one_process_and_repeat_bit_identically() {
    let dir = temp_dir("ddp-same");
    let steps = 4;
    let one = recipe(&dir, "dp1", "dp = 1", "local_processes {}", steps);
    let two = recipe(&dir, "dp2", "dp = 2", "local_processes {}", steps);
    let (out1, out2, out2b) = (dir.join("dp1"), dir.join("dp2"), dir.join("dp2-again"));
    let t0 = Instant::now();
    run_ok(&one, &out1, &[]);
    let t1 = t0.elapsed();
    let err = run_ok(&two, &out2, &[]);
    let t2 = t0.elapsed() - t1;
    println!("dp = 1: {:.1} s, dp = 2: {:.1} s (wall, this machine)", t1.as_secs_f64(), t2.as_secs_f64());
    assert!(err.contains("2 data-parallel trainer ranks meet at the c10d store 127.0.0.1:"), "{err}");
    assert!(err.contains("trainer-0@") && err.contains("trainer-1@") && err.contains("rollout-0@"), "{err}");
    run_ok(&two, &out2b, &[]);
    // ZeRO-1: each rank steps its shard of the optimizer and broadcasts it; the checkpoints
    // gather the moments to rank 0.
    let zero = recipe(&dir, "zero", "dp = 2, zero = optimizer", "local_processes {}", steps);
    let out_zero = dir.join("zero");
    run_ok(&zero, &out_zero, &[]);
    let a = trained(&out1);
    assert_eq!(
        a.iter().map(|r| r["step"].as_u64().unwrap()).collect::<Vec<_>>(),
        (1..=steps as u64).collect::<Vec<_>>()
    );
    for (what, out) in [("dp 2", &out2), ("ZeRO", &out_zero)] {
        let b = trained(out);
        assert_eq!(a.len(), b.len(), "{what}");
        for (x, y) in a.iter().zip(&b) {
            let (x, y) = (x.as_object().unwrap(), y.as_object().unwrap());
            assert_eq!(x.keys().collect::<Vec<_>>(), y.keys().collect::<Vec<_>>(), "the same columns");
            for (k, p) in x {
                let q = &y[k];
                // The trainer's figures are sums in another order; everything else (the samples,
                // their rewards, the tokens trained) is the same.
                match (k.starts_with("train/"), p.as_f64(), q.as_f64()) {
                    (true, Some(p), Some(q)) => {
                        assert!(
                            (p - q).abs() <= 1e-6 + 1e-4 * q.abs(),
                            "{what}, step {}: {k} {p} (dp 1) vs {q}",
                            x["step"]
                        )
                    }
                    _ => assert_eq!(p, q, "{what}, step {}: {k}", x["step"]),
                }
            }
        }
    }
    let (m1, m2) = (tensors(&out1.join("model/model.safetensors")), tensors(&out2.join("model/model.safetensors")));
    let (rel, name) = max_relative(&m2, &m1);
    let exact = common::metrics::untimed(&out1) == common::metrics::untimed(&out2);
    println!("final model, dp 2 vs dp 1 ({} tensors): max relative difference {rel:.2e} {name}; metrics bit-identical: {exact}", m1.len());
    assert!(rel <= 1e-5, "{name}: {rel:e} relative");
    let (rel, name) = max_relative(&tensors(&out_zero.join("model/model.safetensors")), &m1);
    println!("final model, ZeRO-1 on 2 ranks vs dp 1: max relative difference {rel:.2e} {name}");
    assert!(rel <= 1e-5, "ZeRO: {name}: {rel:e} relative");
    // Two ranks, twice: the same reduction order, the same run.
    assert_eq!(common::metrics::untimed(&out2), common::metrics::untimed(&out2b));
    assert_eq!(m2, tensors(&out2b.join("model/model.safetensors")));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The newest checkpoint (`step-N`, zero-padded: the last by name).
fn newest_checkpoint(out: &Path) -> PathBuf {
    let mut v: Vec<PathBuf> = std::fs::read_dir(out.join("checkpoints")).unwrap().flatten().map(|e| e.path()).collect();
    v.sort();
    v.pop().unwrap_or_else(|| panic!("no checkpoint in {}", out.display()))
}

/// Every file a checkpoint's manifest lists matches its SHA-256 (what `--resume` checks first).
fn assert_checkpoint_verifies(dir: &Path) {
    let manifest = common::metrics::json_file(&dir.join("manifest.json"));
    let files = manifest["files"].as_object().unwrap_or_else(|| panic!("no files in {manifest}"));
    assert!(!files.is_empty(), "{manifest}");
    for (name, sum) in files {
        let o = output(Command::new("sha256sum").arg(dir.join(name)), Duration::from_secs(30));
        let got = String::from_utf8_lossy(&o.stdout).split_whitespace().next().unwrap_or_default().to_string();
        assert_eq!(Some(got.as_str()), sum["sha256"].as_str(), "{}/{name}", dir.display());
    }
}

/// Kills (`SIGKILL`) or stops (`SIGSTOP`) trainer-1 after step 3: the run stops within `bound`
/// naming it as rank 1 of 2, leaves nothing running, its newest checkpoint verifies, and
/// `--resume` (with `resume_args`) finishes the run.
fn a_rank_lost_mid_run(name: &str, sig: i32, bound: Duration, resume_args: &[&str]) {
    let dir = temp_dir(name);
    let r = recipe(&dir, "dp2", "dp = 2", "local_processes {}", 10);
    let out = dir.join("out");
    let mut child = start(&["run", r.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    wait_for_step(&out, 3, &mut child, Duration::from_secs(120));
    let pid = worker_pid(&out, "trainer-1");
    signal(pid, sig);
    let t0 = Instant::now();
    let o = child.wait_output(LIMIT);
    let took = t0.elapsed();
    let err = stderr(&o);
    println!("{name}: the run stopped {:.1} s after the signal:\n{}", took.as_secs_f64(), err.trim_end());
    assert!(!o.status.success(), "{err}");
    assert!(took < bound, "stopped after {took:?}, past {bound:?}: {err}");
    assert!(err.contains("error[E0513]") && err.contains("worker trainer-1, rank 1 of 2, on host"), "{err}");
    assert!(err.contains("rank 1 of 2 failed first"), "{err}");
    if sig == libc::SIGSTOP {
        assert!(err.contains("sent no heartbeat"), "{err}");
    }
    assert_nothing_left(&child);
    let ckpt = newest_checkpoint(&out);
    assert_checkpoint_verifies(&ckpt);
    let mut args = vec!["--resume"];
    args.extend_from_slice(resume_args);
    let err = run_ok(&r, &out, &args);
    assert!(err.contains("done: 10 steps"), "{err}");
    assert_eq!(common::metrics::trained_steps(&out).last(), Some(&10));
    let _ = std::fs::remove_dir_all(&dir);
}

/// SIGKILL: the rank's connection fails at once and the other rank's collective fails on its
/// closed socket; the dead one is named. Resumed on the same two ranks.
#[test]
fn a_killed_rank_stops_the_run_named_and_resume_finishes_it() {
    a_rank_lost_mid_run("ddp-kill", libc::SIGKILL, Duration::from_secs(40), &[])
}

/// SIGSTOP: the rank's heartbeats stop; it is named within the heartbeat deadline (15 s) while
/// the other rank waits in its collective (10 s here). Resumed on one rank: the checkpoint holds
/// the whole optimizer state.
#[test]
fn a_stopped_rank_stops_the_run_named_and_resume_finishes_it_on_one_rank() {
    a_rank_lost_mid_run(
        "ddp-stop",
        libc::SIGSTOP,
        Duration::from_secs(45),
        &["--set", "train.backend=embedded_trainer { dp = 1 }"],
    )
}

/// The test Slurm's idle node, if it can hold `steps` one-CPU steps at once (a job of more waits
/// in the queue for ever: the 2-CPU test node holds a trainer and an engine, not two ranks and an
/// engine).
fn slurm_for(steps: usize) -> Result<(), String> {
    let o = Command::new("sinfo").args(["-h", "-o", "%t %c"]).output().map_err(|e| format!("no sinfo ({e})"))?;
    let s = String::from_utf8_lossy(&o.stdout);
    let idle = s.lines().filter_map(|l| l.split_once(' ')).filter(|(t, _)| matches!(*t, "idle" | "mix"));
    match idle.filter_map(|(_, c)| c.trim().parse::<usize>().ok()).max() {
        None => Err(format!("no idle Slurm node (sinfo: {:?})", s.trim())),
        Some(c) if c < steps => Err(format!("the test Slurm node has {c} CPUs; {steps} one-CPU steps do not fit")),
        Some(_) => Ok(()),
    }
}

const RAY_HEAD: &str = "http://127.0.0.1:8265";

fn ray_ready() -> Result<(), String> {
    miles_workers::http::get_json(&format!("{RAY_HEAD}/api/version"), Duration::from_secs(3))
        .map(|_| ())
        .map_err(|e| format!("no Ray Jobs API at {RAY_HEAD} ({e})"))
}

/// Two ranks under the test Slurm (one `srun` step per rank) and the test Ray head (one job per
/// rank) train number for number as under local processes; each skipped, saying why, when absent.
#[test]
fn two_ranks_under_slurm_and_ray_train_as_under_local_processes() {
    let slurm = "slurm { partition = \"debug\", start_timeout = 60 }".to_string();
    let ray = format!("ray {{ address = \"{RAY_HEAD}\", start_timeout = 120 }}");
    let mut launchers = Vec::new();
    match slurm_for(3) {
        Ok(()) => launchers.push(("slurm", slurm)),
        Err(why) => println!("slurm skipped: {why} (scripts/start-test-slurm.sh starts one on this machine)"),
    }
    match ray_ready() {
        Ok(()) => launchers.push(("ray", ray)),
        Err(why) => println!("ray skipped: {why}; start one with `bash scripts/start-test-ray.sh`"),
    }
    if launchers.is_empty() {
        return;
    }
    let dir = temp_dir("ddp-launchers");
    let local = dir.join("local");
    run_ok(&recipe(&dir, "local", "dp = 2", "local_processes {}", 3), &local, &[]);
    for (name, launcher) in launchers {
        let out = dir.join(name);
        let err = run_ok(&recipe(&dir, name, "dp = 2", &launcher, 3), &out, &[]);
        assert!(err.contains("2 data-parallel trainer ranks meet at the c10d store"), "{name}: {err}");
        if name == "slurm" {
            let script = std::fs::read_to_string(out.join("job.sbatch")).unwrap();
            assert_eq!(script.matches("srun ").count(), 3, "a step per rank and one for the engine: {script}");
        }
        assert_eq!(common::metrics::untimed(&local), common::metrics::untimed(&out), "{name}");
        println!("{name}: dp = 2 number for number as under local processes");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A run spec written by hand that asks for data-parallel ranks with the trainer in the engine's
/// own process (no launcher) is refused, naming the field and the fix, not run on one rank.
#[test]
fn ranks_without_a_launcher_are_refused_by_the_engine() {
    let dir = temp_dir("ddp-inproc");
    let r = recipe(&dir, "dp2", "dp = 2", "local_processes {}", 2);
    let o = output(&mut miles(&["run", r.to_str().unwrap(), "--print-spec"]), LIMIT);
    assert!(o.status.success(), "{}", stderr(&o));
    let mut spec: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(spec["train"]["dp"]["ranks"], 2, "{spec}");
    spec.as_object_mut().unwrap().remove("distributed");
    let path = dir.join("spec.json");
    std::fs::write(&path, spec.to_string()).unwrap();
    let engine = Path::new(env!("CARGO_BIN_EXE_miles-engine"));
    let out = dir.join("out");
    let o = output(
        Command::new(engine).args(["run", "--spec", path.to_str().unwrap(), "--out", out.to_str().unwrap()]),
        LIMIT,
    );
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("train.dp asks for 2 data-parallel trainer ranks") && err.contains("launcher = local_processes"),
        "{err}"
    );
    assert!(!out.join("metrics.jsonl").exists(), "nothing trained");
    let _ = std::fs::remove_dir_all(&dir);
}
