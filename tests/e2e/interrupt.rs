//! Ending a run by hand, through the built binaries: Ctrl-C finishes the step in progress, writes
//! a checkpoint there, prints the command that resumes it and exits 130; a second Ctrl-C stops at
//! once; `--resume` may change the run's steps and is refused, field by field, for anything else.

use crate::common;

use common::process::{miles, run_miles, temp_dir, text, Proc};
use common::tiny::tiny_recipe;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Stdio;
use std::sync::mpsc;
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(300);

/// `miles run` of `recipe` into `out` with plain progress, its stderr lines sent to the receiver
/// as they come.
fn start(recipe: &Path, out: &Path) -> (Proc, mpsc::Receiver<String>) {
    let mut p = Proc::spawn(
        miles()
            .args(["run", recipe.to_str().unwrap(), "--out", out.to_str().unwrap()])
            .args(["--threads", "1", "--progress", "plain"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped()),
    );
    let err = p.child().stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    (p, rx)
}

/// Lines from `rx` until one contains `needle` (bounded by LIMIT); all of them.
fn until(rx: &mpsc::Receiver<String>, needle: &str, seen: &mut Vec<String>) {
    let t0 = Instant::now();
    while !seen.iter().any(|l| l.contains(needle)) {
        let left = LIMIT.checked_sub(t0.elapsed()).unwrap_or_else(|| panic!("no `{needle}` in {seen:#?}"));
        match rx.recv_timeout(left) {
            Ok(l) => seen.push(l),
            Err(_) => panic!("no `{needle}` before the output ended: {seen:#?}"),
        }
    }
}

/// The run's exit status, when it came, and the rest of its stderr (bounded by LIMIT).
fn finish(mut p: Proc, rx: mpsc::Receiver<String>, mut seen: Vec<String>) -> (Option<i32>, Instant, String) {
    let status = p.wait(LIMIT);
    let ended = Instant::now();
    seen.extend(rx.iter());
    (status.code(), ended, seen.join("\n"))
}

fn sigint(pid: i32) {
    // SAFETY: kill(2) on a process (or, negative, the process group) this test started.
    unsafe {
        libc::kill(pid, libc::SIGINT);
    }
}

fn trained_steps(out: &Path) -> Vec<u64> {
    common::metrics::trained_steps(out)
}

/// Ctrl-C after the first step's line, sent to `miles` alone (`kill -INT`, which it passes on)
/// or to the whole group (as a terminal does: both get it, and the engine takes the two for one).
#[test]
fn ctrl_c_ends_the_step_writes_a_checkpoint_and_names_the_resume_command() {
    for (name, group) in [("miles", false), ("group", true)] {
        let d = temp_dir(&format!("ctrl-c-{name}"));
        let recipe = d.join("tiny.miles");
        std::fs::write(&recipe, tiny_recipe("transport = local", 500, &[])).unwrap();
        let out = d.join("out");
        let (p, rx) = start(&recipe, &out);
        let mut seen = Vec::new();
        until(&rx, "step 1/500", &mut seen);
        let pid = p.id() as i32;
        sigint(if group { -pid } else { pid });
        let (code, _, all) = finish(p, rx, seen);
        assert_eq!(code, Some(130), "{name}: {all}");
        assert!(all.contains("interrupt: finishing the step in progress"), "{name}: {all}");
        assert!(!all.contains("stopped at once"), "{name}: one Ctrl-C, not two: {all}");
        let steps = trained_steps(&out);
        let n = *steps.last().unwrap_or_else(|| panic!("{name}: no step trained: {all}"));
        assert!(n < 500, "{name}: {all}");
        let ckpt = out.join(format!("checkpoints/step-{n:08}"));
        assert!(ckpt.join("manifest.json").exists(), "{name}: a checkpoint at the step reached, step {n}: {all}");
        assert!(all.contains(&format!("interrupted after step {n} of 500")), "{name}: {all}");
        let line = all.lines().find(|l| l.contains("resume with:")).unwrap_or_else(|| panic!("{name}: {all}"));
        let typed = format!("run {} --out {} --threads 1 --progress plain", recipe.display(), out.display());
        assert!(line.ends_with(&format!("/miles {typed} --resume")), "{line}");

        // The resume goes on from there, here with fewer steps than the recipe's 500.
        let total = (n + 2).to_string();
        let o = run_miles(
            &["run", recipe.to_str().unwrap(), "--out", out.to_str().unwrap(), "--resume"]
                .into_iter()
                .chain(["--steps", &total, "--threads", "1", "--progress", "plain"])
                .collect::<Vec<_>>(),
        );
        assert_eq!(o.status.code(), Some(0), "{name}: {}", text(&o));
        assert!(text(&o).contains(&format!("resuming with steps: 500 -> {total}")), "{}", text(&o));
        assert_eq!(trained_steps(&out).last().copied(), Some(n + 2), "{name}");
        assert!(out.join("model/model.safetensors").exists(), "{name}: the resumed run finished");
        let _ = std::fs::remove_dir_all(&d);
    }
}

/// A second Ctrl-C, while the step is still running (its reward takes 4 s a batch), stops at once:
/// no checkpoint at a step not finished, and the resume goes on from the last complete one.
#[test]
fn a_second_ctrl_c_stops_at_once() {
    let d = temp_dir("ctrl-c-twice");
    let slow = d.join("slow.py");
    std::fs::write(
        &slow,
        "import json, sys, time\nfor line in sys.stdin:\n    req = json.loads(line)\n    time.sleep(4)\n    \
         print(json.dumps({\"id\": req[\"id\"], \"scores\": [0.0 for _ in req[\"samples\"]]}), flush=True)\n",
    )
    .unwrap();
    let reward = format!(
        "reward = command_reward(rollout) {{ command = [\"python3\", \"{}\"], timeout = 60.s }}",
        slow.display()
    );
    let recipe = d.join("tiny.miles");
    let text_ = tiny_recipe("transport = local", 50, &["ckpt = checkpoint(train) { every = 1.steps }"])
        .replace("reward = exact_match(rollout)", &reward);
    std::fs::write(&recipe, text_).unwrap();
    let out = d.join("out");
    let (p, rx) = start(&recipe, &out);
    let mut seen = Vec::new();
    until(&rx, "step 1/50", &mut seen);
    // A second into step 2's reward (4 s): the first asks for the end of the step, the second,
    // half a second later, ends the process.
    std::thread::sleep(Duration::from_secs(1));
    sigint(p.id() as i32);
    until(&rx, "interrupt: finishing the step in progress", &mut seen);
    std::thread::sleep(Duration::from_millis(500));
    let t0 = Instant::now();
    sigint(p.id() as i32);
    let (code, ended, all) = finish(p, rx, seen);
    let took = ended.duration_since(t0);
    assert!(took < Duration::from_secs(2), "not at once: {took:?}\n{all}");
    assert_eq!(code, Some(130), "{all}");
    assert!(all.contains("stopped at once"), "{all}");
    assert!(!out.join("checkpoints/step-00000002").exists(), "step 2 never finished: {all}");
    assert!(out.join("checkpoints/step-00000001/manifest.json").exists(), "{all}");
    let o = run_miles(&["run", recipe.to_str().unwrap(), "--out", out.to_str().unwrap(), "--resume", "--steps", "2"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("resumed from"), "{}", text(&o));
    let _ = std::fs::remove_dir_all(&d);
}

/// A resume with another learning rate is refused, the field named with both values.
#[test]
fn a_resume_with_another_setting_names_the_field() {
    let d = temp_dir("resume-refused");
    let recipe = d.join("tiny.miles");
    std::fs::write(&recipe, tiny_recipe("transport = local", 2, &[])).unwrap();
    let out = d.join("out");
    let o = run_miles(&["run", recipe.to_str().unwrap(), "--out", out.to_str().unwrap(), "--threads", "1"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let r = recipe.to_str().unwrap();
    let o = run_miles(&["run", r, "--out", out.to_str().unwrap(), "--resume", "--set", "train.lr=2e-3"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let t = text(&o);
    assert!(t.contains("E0507") && t.contains("train.lr: 0.001 -> 0.002"), "{t}");
    let _ = std::fs::remove_dir_all(&d);
}
