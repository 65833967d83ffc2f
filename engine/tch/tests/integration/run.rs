//! End-to-end runs of the executor on a tiny model: determinism, exact resume (clean stop and
//! SIGKILL), and clear errors. Kept small so the whole file runs in a few seconds.

use crate::common;

use miles_runtime::{RunOptions, RunSpec};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn tiny() -> RunSpec {
    let text = include_str!("../../../runtime/tests/data/tiny.json");
    RunSpec::from_json(text).unwrap()
}

fn tmp(name: &str) -> PathBuf {
    common::run_dir(&format!("run-{name}"))
}

fn opts(dir: &Path) -> RunOptions {
    common::quiet(dir)
}

fn metrics(dir: &Path) -> Vec<Value> {
    common::untimed_metrics(dir)
}

#[test]
fn same_seed_gives_identical_metrics() {
    let (a, b) = (tmp("det-a"), tmp("det-b"));
    let s = tiny();
    let sa = miles_tch::run(&s, &opts(&a)).unwrap();
    miles_tch::run(&s, &opts(&b)).unwrap();
    assert_eq!(sa.steps_done, 4);
    let (ma, mb) = (metrics(&a), metrics(&b));
    // SFT line, step-0 eval, 4 steps.
    assert_eq!(ma.len(), 6, "{ma:?}");
    assert_eq!(ma, mb);
    assert!(ma[2].get("train/logp_diff").is_some());
    assert!(a.join("model/model.safetensors").exists());
    assert!(a.join("model/config.json").exists());
    // Another seed gives another run.
    let c = tmp("det-c");
    let mut s2 = s.clone();
    s2.seed = 2;
    miles_tch::run(&s2, &opts(&c)).unwrap();
    assert_ne!(metrics(&c), ma);
    for d in [a, b, c] {
        let _ = std::fs::remove_dir_all(d);
    }
}

#[test]
fn resume_after_clean_stop_equals_uninterrupted() {
    let (full, part) = (tmp("res-full"), tmp("res-part"));
    let s = tiny();
    miles_tch::run(&s, &opts(&full)).unwrap();
    let mut o = opts(&part);
    o.stop_after = Some(3); // checkpoint every 2: resume redoes step 3
    let r = miles_tch::run(&s, &o).unwrap();
    assert!(r.stopped_early);
    // Without --resume the directory is refused.
    let e = miles_tch::run(&s, &opts(&part)).unwrap_err();
    assert_eq!(e.code, "E0507");
    let mut o = opts(&part);
    o.resume = true;
    let r = miles_tch::run(&s, &o).unwrap();
    assert_eq!(r.steps_done, 4);
    assert_eq!(metrics(&full), metrics(&part));
    // Checkpoints keep the newest `keep` = 2.
    let n = std::fs::read_dir(part.join("checkpoints")).unwrap().count();
    assert_eq!(n, 2);
    for d in [full, part] {
        let _ = std::fs::remove_dir_all(d);
    }
}

/// A checkpoint whose tensor file was torn (cut short) or corrupted after it was written is found
/// by its manifest's SHA-256, and the resume goes on from the one before it, exactly.
#[test]
fn a_damaged_tensor_file_falls_back_to_the_previous_checkpoint_exactly() {
    let full = tmp("torn-full");
    let mut s = tiny();
    s.steps = 6;
    miles_tch::run(&s, &opts(&full)).unwrap();
    for (name, damage) in [("torn", 0usize), ("flipped", 1)] {
        let part = tmp(&format!("torn-{name}"));
        let mut o = opts(&part);
        o.stop_after = Some(4); // checkpoints at 2 and 4
        miles_tch::run(&s, &o).unwrap();
        let f = part.join("checkpoints/step-00000004/model.safetensors");
        let mut bytes = std::fs::read(&f).unwrap();
        match damage {
            0 => bytes.truncate(bytes.len() / 2),
            _ => *bytes.last_mut().unwrap() ^= 0x40,
        }
        std::fs::write(&f, &bytes).unwrap();
        let mut o = opts(&part);
        o.resume = true;
        let r = miles_tch::run(&s, &o).unwrap();
        assert_eq!(r.steps_done, 6, "{name}");
        assert_eq!(metrics(&full), metrics(&part), "{name}: resumed from step 2, the same run");
        let _ = std::fs::remove_dir_all(&part);
    }
    let _ = std::fs::remove_dir_all(&full);
}

#[test]
fn resume_after_kill_9_equals_uninterrupted() {
    let (full, part) = (tmp("kill-full"), tmp("kill-part"));
    let mut s = tiny();
    // Long enough that the kill lands mid-run; checkpoints every 2 steps.
    s.steps = 24;
    s.eval.every = 10;
    let spec_path = tmp("kill-spec.json");
    std::fs::write(&spec_path, serde_json::to_string(&s).unwrap()).unwrap();
    miles_tch::run(&s, &opts(&full)).unwrap();

    let bin = env!("CARGO_BIN_EXE_miles-tch-run");
    let mut child = std::process::Command::new(bin)
        .arg(&spec_path)
        .arg(&part)
        .args(["--quiet", "--threads", "1"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Bounded wait for step >= 5 in metrics.jsonl, then SIGKILL (Child::kill sends SIGKILL).
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let text = std::fs::read_to_string(part.join("metrics.jsonl")).unwrap_or_default();
        let reached = text.contains("\"step\":5,") || text.contains("\"step\":5}");
        if reached || Instant::now() > deadline {
            break;
        }
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let _ = child.kill();
    let _ = child.wait();
    // The kill must have landed mid-run, or this test proves nothing.
    assert!(!part.join("model").exists(), "the run finished before the kill");
    let mut o = opts(&part);
    o.resume = true;
    let r = miles_tch::run(&s, &o).unwrap();
    assert_eq!(r.steps_done, 24);
    assert_eq!(metrics(&full), metrics(&part));
    for d in [full, part, spec_path] {
        let _ = std::fs::remove_dir_all(&d);
        let _ = std::fs::remove_file(&d);
    }
}

#[test]
fn clear_errors_before_training() {
    let d = tmp("err");
    let mut s = tiny();
    s.model.vocab_size = 8;
    let e = miles_tch::run(&s, &opts(&d)).unwrap_err();
    assert_eq!(e.code, "E0503");
    assert!(e.message.contains("vocab_size 8"), "{e}");

    let mut s = tiny();
    s.task.kind = miles_runtime::TaskKind::Data {
        path: "/nonexistent/data.jsonl".into(),
        prompt_field: "q".into(),
        label_field: "a".into(),
        test_path: None,
        on_error: miles_runtime::OnError::Stop,
    };
    let e = miles_tch::run(&s, &opts(&d)).unwrap_err();
    assert_eq!(e.code, "E0501");

    let mut s = tiny();
    s.train.global_batch = 5;
    let e = miles_tch::run(&s, &opts(&d)).unwrap_err();
    assert_eq!(e.code, "E0504");

    let mut s = tiny();
    s.model.max_len = 6;
    let e = miles_tch::run(&s, &opts(&d)).unwrap_err();
    assert_eq!(e.code, "E0510");

    // The recipe's max_prompt_tokens is a bound the run keeps, not a comment.
    let mut s = tiny();
    s.rollout.max_prompt_tokens = Some(2);
    let e = miles_tch::run(&s, &opts(&d)).unwrap_err();
    assert_eq!(e.code, "E0510");
    assert!(e.message.contains("max_prompt_tokens 2"), "{e}");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn jsonl_task_runs_end_to_end() {
    let d = tmp("jsonl");
    std::fs::create_dir_all(&d).unwrap();
    let data = d.join("data.jsonl");
    let mut lines = String::new();
    for a in 0..10 {
        for b in 0..4 {
            lines.push_str(&format!("{{\"question\": \"{a}+{b}=\", \"answer\": \"{}\"}}\n", a + b));
        }
    }
    lines.push_str("{broken\n");
    std::fs::write(&data, lines).unwrap();
    let mut s = tiny();
    s.task.kind = miles_runtime::TaskKind::Data {
        path: data.clone(),
        prompt_field: "question".into(),
        label_field: "answer".into(),
        test_path: None,
        on_error: miles_runtime::OnError::Skip,
    };
    s.task.split.test_size = 10;
    s.eval.prompts = 10;
    let out = d.join("out");
    let r = miles_tch::run(&s, &opts(&out)).unwrap();
    assert_eq!(r.steps_done, 4);
    s.task.kind = miles_runtime::TaskKind::Data {
        path: data,
        prompt_field: "question".into(),
        label_field: "answer".into(),
        test_path: None,
        on_error: miles_runtime::OnError::Stop,
    };
    let e = miles_tch::run(&s, &opts(&d.join("out2"))).unwrap_err();
    assert_eq!(e.code, "E0502");
    assert!(e.message.contains("data.jsonl:41"), "{e}");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn nan_loss_stops_with_a_clear_error_and_keeps_the_checkpoint() {
    let d = tmp("nan");
    let mut s = tiny();
    s.sft = None;
    s.train.kl_coef = 0.0;
    s.train.lr = 1e30;
    s.train.grad_clip = 0.0;
    s.steps = 6;
    s.checkpoint.every = 1;
    let e = miles_tch::run(&s, &opts(&d)).unwrap_err();
    assert_eq!(e.code, "E0505", "{e}");
    assert!(e.message.contains("last good checkpoint"), "{e}");
    let kept: Vec<_> = std::fs::read_dir(d.join("checkpoints")).unwrap().collect();
    assert!(!kept.is_empty());
    let _ = std::fs::remove_dir_all(&d);
}
