//! On-policy distillation through the built binary: a run's own final model is the teacher of
//! another recipe, which checks, trains with the opd/* metrics, and refuses a teacher with another
//! vocabulary or one that is not trained weights at `miles check`.

mod common;

use common::process::{miles, output, temp_dir, text};
use common::tiny::{tiny_recipe, EVAL};
use serde_json::Value;
use std::path::Path;
use std::time::Duration;

fn run(args: &[&str]) -> std::process::Output {
    let opts: &[&str] = if args[0] == "run" { &["--threads", "1", "--progress", "off"] } else { &[] };
    output(miles().args(args).args(opts), Duration::from_secs(300))
}

fn with_teacher(dir: &Path, name: &str, teacher: &str) -> String {
    let p = dir.join(format!("{name}.miles"));
    let text = tiny_recipe("transport = local", 4, &[EVAL])
        + &format!("model teacher = {teacher}\n")
        + "recipe tiny_opd extends tiny {\n    train.opd = opd { teacher = teacher, coef = 1.0, task_coef = 0.5 }\n}\n";
    std::fs::write(&p, text).unwrap();
    p.to_string_lossy().into_owned()
}

#[test]
fn an_opd_recipe_distils_through_the_binary() {
    let dir = temp_dir("opd-run");
    // The teacher: the tiny recipe's own final model.
    let base = dir.join("base.miles");
    std::fs::write(&base, tiny_recipe("transport = local", 4, &[])).unwrap();
    let t_out = dir.join("teacher");
    let o = run(&["run", base.to_str().unwrap(), "--out", t_out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let teacher = format!("hf {{ path = \"{}\" }}", t_out.join("model").display());
    let r = with_teacher(&dir, "opd", &teacher);
    let o = run(&["check", &r]);
    assert!(o.status.success(), "{}", text(&o));
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
    }
    // Under fully_async and in worker processes too (the teacher lives in the trainer).
    for (name, extra) in [
        ("async", "schedule = fully_async { max_staleness = 1 }"),
        ("workers", "launcher = local_processes { engines = 1 }"),
    ] {
        let p = dir.join(format!("{name}.miles"));
        let sync = if name == "workers" { "transport = broadcast, bucket = 1.MB" } else { "transport = local" };
        let body = tiny_recipe(sync, 3, &[extra])
            + &format!("model teacher = {teacher}\n")
            + "recipe tiny_opd extends tiny {\n    train.opd = opd { teacher = teacher }\n}\n";
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
    let _ = std::fs::remove_dir_all(&dir);
}
