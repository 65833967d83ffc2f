//! On-policy distillation through the built binary: a run's own final model is the teacher stage
//! of another recipe, which checks, graphs (rollout -> teacher -> train), trains with the opd/*
//! metrics, and refuses a teacher with another vocabulary, one that is not trained weights and a
//! teacher stage no trainer reads.

use crate::common;

use common::process::{miles, output, temp_dir, text, Proc};
use common::tiny::{tiny_recipe, EVAL};
use serde_json::Value;
use std::path::Path;
use std::time::Duration;

fn run(args: &[&str]) -> std::process::Output {
    let opts: &[&str] = if args[0] == "run" { &["--threads", "1", "--progress", "off"] } else { &[] };
    output(miles().args(args).args(opts), Duration::from_secs(300))
}

/// Whether `metrics` holds at least `steps` distilled RL steps: the teacher is up and answering.
fn distilled(metrics: &Path, steps: usize) -> impl Fn() -> bool + '_ {
    move || {
        std::fs::read_to_string(metrics)
            .map(|t| t.lines().filter(|l| l.contains("opd/reverse_kl")).count() >= steps)
            .unwrap_or(false)
    }
}

/// The teacher: the tiny recipe's own final model, trained into `dir`, as an `hf { path }` record.
fn trained_teacher(dir: &Path) -> String {
    let base = dir.join("base.miles");
    std::fs::write(&base, tiny_recipe("transport = local", 4, &[])).unwrap();
    let t_out = dir.join("teacher");
    let o = run(&["run", base.to_str().unwrap(), "--out", t_out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    format!("hf {{ path = \"{}\" }}", t_out.join("model").display())
}

/// The tiny recipe distilling from `model` (a record), its teacher stage's fields `fields`.
fn distilling(model: &str, fields: &str, opd: &str) -> String {
    format!(
        "model teacher_model = {model}\n\
         recipe tiny_opd extends tiny {{\n    \
         teacher = teacher_logprobs(teacher_model, rollout) {{ {fields} }}\n    \
         train.opd = opd {{ teacher = teacher{opd} }}\n}}\n"
    )
}

fn with_teacher(dir: &Path, name: &str, teacher: &str) -> String {
    let p = dir.join(format!("{name}.miles"));
    let text = tiny_recipe("transport = local", 4, &[EVAL]) + &distilling(teacher, "", ", coef = 1.0, task_coef = 0.5");
    std::fs::write(&p, text).unwrap();
    p.to_string_lossy().into_owned()
}

#[test]
fn an_opd_recipe_distils_through_the_binary() {
    let dir = temp_dir("opd-run");
    let teacher = trained_teacher(&dir);
    let r = with_teacher(&dir, "opd", &teacher);
    let o = run(&["check", &r]);
    assert!(o.status.success(), "{}", text(&o));
    let o = run(&["graph", &r, "--recipe", "tiny_opd"]);
    assert!(text(&o).contains("rollout -- Trajectories --> teacher"), "{}", text(&o));
    assert!(text(&o).contains("teacher -- TokenScores --> train"), "{}", text(&o));
    let out = dir.join("out");
    let o = run(&["run", &r, "--recipe", "tiny_opd", "--out", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let rows = common::metrics::rows(&out);
    let rl: Vec<&Value> = rows.iter().filter(|r| r["rollout/reward_mean"].is_number()).collect();
    assert_eq!(rl.len(), 4);
    for r in &rl {
        for k in ["reverse_kl", "teacher_logp", "share"] {
            assert!(r[format!("opd/{k}")].is_number(), "step {}: opd/{k}", r["step"]);
        }
        let share = r["opd/share"].as_f64().unwrap();
        assert!(share > 0.0 && share < 1.0, "both terms count: {share}");
        assert!(r["perf/teacher_s"].as_f64().unwrap() > 0.0, "the stage's own time");
    }
    // Under fully_async and in worker processes too (the teacher stage beside the executor, the
    // trainer in its worker: the log-probs cross the wire with the batch).
    for (name, extra) in [
        ("async", "schedule = fully_async { max_staleness = 1 }"),
        ("workers", "launcher = local_processes { engines = 1 }"),
    ] {
        let p = dir.join(format!("{name}.miles"));
        let sync = if name == "workers" { "transport = broadcast, bucket = 1.MB" } else { "transport = local" };
        let body = tiny_recipe(sync, 3, &[extra]) + &distilling(&teacher, "", "");
        std::fs::write(&p, body).unwrap();
        let o2 = dir.join(format!("{name}-out"));
        let o = run(&["run", p.to_str().unwrap(), "--recipe", "tiny_opd", "--out", o2.to_str().unwrap()]);
        assert!(o.status.success(), "{name}: {}", text(&o));
        let m = std::fs::read_to_string(o2.join("metrics.jsonl")).unwrap();
        assert_eq!(m.lines().filter(|l| l.contains("opd/reverse_kl")).count(), 3, "{name}: {m}");
    }
    // A teacher of another vocabulary, and one that is not trained weights: check-time errors.
    let r = with_teacher(&dir, "bad-vocab", "hf { path = \"tests/fixtures/hf/llama\" }");
    let o = run(&["check", &r]);
    assert!(!o.status.success() && text(&o).contains("the teacher's vocabulary differs"), "{}", text(&o));
    let r = with_teacher(&dir, "untrained", "transformer { layers = 1, d_model = 32, heads = 2, vocab = 13 }");
    let o = run(&["check", &r]);
    assert!(!o.status.success() && text(&o).contains("a teacher must be trained weights"), "{}", text(&o));
    // A teacher stage that no trainer reads would run for nothing: a warning at check, refused
    // by the run, named.
    let p = dir.join("unread.miles");
    let body = tiny_recipe("transport = local", 4, &[EVAL])
        + &format!("model teacher_model = {teacher}\n")
        + "recipe tiny_opd extends tiny {\n    teacher = teacher_logprobs(teacher_model, rollout)\n}\n";
    std::fs::write(&p, body).unwrap();
    let o = run(&["check", p.to_str().unwrap()]);
    assert!(text(&o).contains("stage `teacher` produces TokenScores that no stage consumes"), "{}", text(&o));
    let o = run(&["run", p.to_str().unwrap(), "--recipe", "tiny_opd", "--out", dir.join("unread").to_str().unwrap()]);
    assert!(!o.status.success() && text(&o).contains("a teacher stage no trainer reads (`teacher`)"), "{}", text(&o));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The teacher in a worker process of its own gives the run the in-process teacher gives, number
/// for number; it runs under fully_async and in worker processes; killed with SIGKILL
/// mid-run it is named, started again and sent the batch again, and the run ends the same.
#[test]
fn a_teacher_in_its_own_process_distils_alike_and_survives_a_kill() {
    let dir = temp_dir("opd-teacher-process");
    let teacher = trained_teacher(&dir);
    let recipe = |name: &str, process: bool, steps: u32, extra: &[&str], sync: &str| {
        let p = dir.join(format!("{name}.miles"));
        let body = tiny_recipe(sync, steps, extra) + &distilling(&teacher, &format!("process = {process}"), "");
        std::fs::write(&p, body).unwrap();
        p.to_string_lossy().into_owned()
    };
    let cols = |d: &Path| -> Vec<Vec<Value>> {
        let rows = common::metrics::rows(d);
        ["rollout/reward_mean", "train/loss", "opd/reverse_kl", "opd/teacher_logp"]
            .iter()
            .map(|k| rows.iter().map(|r| r[*k].clone()).collect())
            .collect()
    };
    let (a, b) = (dir.join("in-trainer"), dir.join("in-worker"));
    for (r, out) in
        [(recipe("a", false, 12, &[], "transport = local"), &a), (recipe("b", true, 12, &[], "transport = local"), &b)]
    {
        let o = run(&["run", &r, "--recipe", "tiny_opd", "--out", out.to_str().unwrap()]);
        assert!(o.status.success(), "{}", text(&o));
    }
    assert_eq!(cols(&a), cols(&b), "the worker's log-probs are the trainer's, bit for bit");

    // Under fully_async (the teacher the run's child), and with the stages as worker processes,
    // where the teacher is a worker of its own the launcher starts like any stage (teacher-0,
    // gRPC): it runs and distils, number for number the run whose teacher is in the controller.
    let mut logs = Vec::new();
    for (name, process, extra, sync) in [
        ("async", true, "schedule = fully_async { max_staleness = 1 }", "transport = local"),
        ("workers", true, "launcher = local_processes { engines = 1 }", "transport = broadcast, bucket = 1.MB"),
        ("workers-here", false, "launcher = local_processes { engines = 1 }", "transport = broadcast, bucket = 1.MB"),
    ] {
        let w = recipe(name, process, 3, &[extra], sync);
        let wo = dir.join(format!("{name}-out"));
        let o = run(&["run", &w, "--recipe", "tiny_opd", "--out", wo.to_str().unwrap()]);
        assert!(o.status.success(), "{name}: {}", text(&o));
        let n = common::metrics::rows(&wo).iter().filter(|r| r["opd/reverse_kl"].is_number()).count();
        assert_eq!(n, 3, "{name}");
        logs.push(text(&o));
    }
    assert!(logs[1].contains("teacher-0@"), "the teacher is a worker of its own: {}", logs[1]);
    assert!(!logs[2].contains("teacher-0@"), "{}", logs[2]);
    assert_eq!(cols(&dir.join("workers-out")), cols(&dir.join("workers-here-out")));

    // Kill -9 the teacher a few steps in.
    let c = dir.join("killed");
    let r = recipe("b", true, 12, &[], "transport = local");
    let mut p = Proc::spawn(
        miles()
            .args([
                "run",
                &r,
                "--recipe",
                "tiny_opd",
                "--out",
                c.to_str().unwrap(),
                "--threads",
                "1",
                "--progress",
                "off",
            ])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped()),
    );
    // Two RL steps distilled: the teacher is loaded and has answered.
    let metrics = c.join("metrics.jsonl");
    let pid = p.sigkill_member_when(" teacher --model", Duration::from_secs(120), distilled(&metrics, 2));
    let o = p.wait_output(Duration::from_secs(300));
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains(&format!("teacher worker process {pid} exited")), "{}", text(&o));
    assert_eq!(cols(&b), cols(&c), "nothing lost, nothing changed");
    let restarts: Vec<f64> =
        common::metrics::rows(&c).iter().filter_map(|r| r["opd/teacher_restarts"].as_f64()).collect();
    assert_eq!(restarts.last(), Some(&1.0), "{restarts:?}");

    // The teacher worker of a distributed run killed mid-run: the run stops, naming it, and its
    // last checkpoint resumes it to the end, the same run as one never interrupted.
    let (k, whole) = (dir.join("killed-worker"), dir.join("whole-worker"));
    let sync = "transport = broadcast, bucket = 1.MB";
    let extra =
        ["launcher = local_processes { engines = 1 }", "save = checkpoint(train) { every = 2.steps, keep = 2 }"];
    let r = recipe("kw", true, 60, &extra, sync);
    let o = run(&["run", &r, "--recipe", "tiny_opd", "--out", whole.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let args = |out: &Path| {
        let mut c = miles();
        c.args([
            "run",
            &r,
            "--recipe",
            "tiny_opd",
            "--out",
            out.to_str().unwrap(),
            "--threads",
            "1",
            "--progress",
            "off",
        ]);
        c
    };
    let mut p = Proc::spawn(args(&k).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()));
    let metrics = k.join("metrics.jsonl");
    let pid = p.sigkill_member_when("--role teacher", Duration::from_secs(120), distilled(&metrics, 3));
    let o = p.wait_output(Duration::from_secs(300));
    assert!(!o.status.success() && text(&o).contains("(worker teacher-0 on host"), "killed {pid}: {}", text(&o));
    assert!(!k.join("model").exists(), "the kill came after the run had finished");
    let saved = std::fs::read_dir(k.join("checkpoints")).map(|d| d.count()).unwrap_or(0);
    assert!(saved > 0, "a checkpoint to resume from");
    let o = run(&["run", &r, "--recipe", "tiny_opd", "--out", k.to_str().unwrap(), "--resume"]);
    assert!(o.status.success(), "{}", text(&o));
    // The resumed run logs the steps after its checkpoint again; the last row of a step counts.
    let last_rows = |d: &Path| -> Vec<Vec<Value>> {
        let rows = common::metrics::rows(d);
        let mut by_step = std::collections::BTreeMap::new();
        for r in &rows {
            let keep: Vec<Value> =
                ["rollout/reward_mean", "train/loss", "opd/reverse_kl", "opd/teacher_logp", "eval/accuracy"]
                    .iter()
                    .map(|k| r[*k].clone())
                    .collect();
            by_step.insert((r["step"].as_u64(), r["sft/step"].as_u64(), r["eval/accuracy"].is_number()), keep);
        }
        by_step.into_values().collect()
    };
    assert_eq!(last_rows(&k), last_rows(&whole), "resumed from its checkpoint, nothing lost");
    let _ = std::fs::remove_dir_all(&dir);
}
