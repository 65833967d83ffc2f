//! Diffusion RL through the built binary: a tiny `.miles` diffusion recipe checks, plans, runs
//! (metrics, sample grids, the kept reward classifier, plan.json for `miles report`), a second
//! recipe rewards against the first run's classifier, and a classifier of another image size is a
//! `miles check` error, as are text stages on a denoiser and `--resume`.

use crate::common;

use common::process::{miles, output, temp_dir, text, Proc};
use serde_json::Value;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

fn run(args: &[&str]) -> std::process::Output {
    let opts: &[&str] = if args[0] == "run" { &["--threads", "1"] } else { &[] };
    output(miles().args(args).args(opts), Duration::from_secs(300))
}

/// A recipe small enough to run in seconds; `reward` is the image_reward's body.
fn recipe(dir: &Path, name: &str, side: u32, reward: &str) -> String {
    recipe_of(dir, name, side, reward, 4)
}

fn recipe_of(dir: &Path, name: &str, side: u32, reward: &str, steps: u32) -> String {
    let p = dir.join(format!("{name}.miles"));
    let text = format!(
        r#"model policy = denoiser {{ side = {side}, conditions = 4, hidden = 64, layers = 1 }}
cluster laptop = local {{ cpus = 2 }}
recipe tiny_diffusion on laptop {{
    pretrain = denoise_pretrain(policy) {{ steps = 60.steps, lr = 2e-3, batch = 16 }}
    rollout = denoise(pretrain) {{ steps = 8, guidance = 1.0, samples_per_condition = 4, micro_group = 2 }}
    reward = image_reward(rollout) {{ {reward} }}
    train = diffusion_grpo(rollout, reward) {{ conditions_per_step = 2, lr = 1e-4, train_steps = 4, kl_coef = 0.01 }}
    sync = weights(train -> rollout) {{ transport = local }}
    eval = image_eval(rollout) {{ every = 2.steps, samples = 8, judge_steps = 20 }}
    seed = 3
    stop = {steps}.steps
}}
"#
    );
    std::fs::write(&p, text).unwrap();
    p.to_string_lossy().into_owned()
}

fn rows(out: &Path) -> Vec<Value> {
    common::metrics::rows(out)
}

#[test]
fn a_diffusion_recipe_runs_through_the_binary() {
    let dir = temp_dir("diffusion-run");
    let r = recipe(&dir, "d", 8, "classifier_steps = 40, analytic = brightness, analytic_weight = 0.5");
    let o = run(&["check", &r]);
    assert!(o.status.success(), "{}", text(&o));
    let o = run(&["plan", &r]);
    assert!(o.status.success(), "{}", text(&o));
    let out = dir.join("out");
    let o = run(&["run", &r, "--out", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("held-out reward"), "{}", text(&o));
    let rows = rows(&out);
    let rl: Vec<&Value> = rows.iter().filter(|r| r["rollout/reward_mean"].is_number()).collect();
    assert_eq!(rl.len(), 4);
    for r in &rl {
        for k in ["train/loss", "train/kl", "train/clip_frac", "perf/denoise_s", "perf/reward_wait_s", "perf/step_s"] {
            assert!(r[k].is_number(), "step {}: {k}", r["step"]);
        }
    }
    let evals: Vec<&Value> = rows.iter().filter(|r| r["eval/reward_mean"].is_number()).collect();
    assert_eq!(evals.len(), 3, "steps 0, 2 and 4");
    for step in [0, 2, 4] {
        assert!(out.join(format!("grids/step-{step:05}.svg")).exists(), "grid of step {step}");
    }
    assert!(out.join("plan.json").exists(), "the plan beside the run, for `miles report`");
    assert!(out.join("denoiser.safetensors").exists());
    let report = run(&["report", out.to_str().unwrap()]);
    assert!(report.status.success(), "{}", text(&report));
    assert!(text(&report).contains("| diffusion run |"), "{}", text(&report));
    let samples = std::fs::read_to_string(out.join("report/samples.html")).unwrap();
    assert!(samples.contains("step-00000.svg") && samples.contains("step-00004.svg"), "{samples}");

    // Another recipe rewards against the classifier this run trained and kept.
    let classifier = out.join("classifier");
    let r2 = recipe(&dir, "d2", 8, &format!("classifier = \"{}\"", classifier.display()));
    let out2 = dir.join("out2");
    let o = run(&["run", &r2, "--out", out2.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(rows.len(), self::rows(&out2).len());

    // A denoiser of another image size cannot use it: refused by `miles check`, naming the rule.
    let r3 = recipe(&dir, "d3", 12, &format!("classifier = \"{}\"", classifier.display()));
    let o = run(&["check", &r3]);
    assert!(!o.status.success());
    assert!(text(&o).contains("reads images of another size or class count"), "{}", text(&o));
    // Nor is a diffusion run resumed: it writes no checkpoints.
    let o = run(&["run", &r, "--out", out.to_str().unwrap(), "--resume"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("does not resume yet"), "{}", text(&o));
    // A run directory is never overwritten.
    let o = run(&["run", &r, "--out", out.to_str().unwrap()]);
    assert!(!o.status.success());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn text_stages_on_a_denoiser_and_image_stages_on_text_are_check_errors() {
    let dir = temp_dir("diffusion-mixed");
    let p = dir.join("mixed.miles");
    std::fs::write(
        &p,
        r#"import std/tasks/strings
model policy = denoiser { side = 8, conditions = 4, hidden = 64, layers = 1 }
model lm = transformer { layers = 1, d_model = 16, heads = 2, vocab = strings.vocab }
recipe text_on_images {
    rollout = denoise(policy) { samples_per_condition = 4, micro_group = 3 }
    reward = image_reward(rollout)
    train = grpo(rollout, reward) { rollout_batch = 4, global_batch = 16 }
    sync = weights(train -> rollout) { transport = local }
    save = checkpoint(train)
}
recipe images_on_text {
    rollout = generate(lm) { prompts = strings.reverse {} }
    reward = image_reward(rollout)
    train = diffusion_grpo(rollout, reward)
    sync = weights(train -> rollout) { transport = local }
}
"#,
    )
    .unwrap();
    let o = run(&["check", p.to_str().unwrap()]);
    assert!(!o.status.success());
    let t = text(&o);
    for m in [
        "micro_group must divide samples_per_condition",
        "grpo trains a language model on a `generate` rollout",
        "`image_reward` scores the images of a `denoise` rollout",
        "`diffusion_grpo` trains a denoiser on a `denoise` rollout",
    ] {
        assert!(t.contains(m), "missing {m:?} in:\n{t}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_reward_in_a_worker_process_rewards_alike_and_survives_a_kill() {
    let dir = temp_dir("diffusion-worker");
    let body = "classifier_steps = 40, extra_cost = 40.ms";
    let thread = recipe_of(&dir, "thread", 8, body, 12);
    let process = recipe_of(&dir, "process", 8, &format!("{body}, process = true"), 12);
    let (a, b, c) = (dir.join("thread"), dir.join("process"), dir.join("killed"));
    for (r, out) in [(&thread, &a), (&process, &b)] {
        let o = run(&["run", r, "--out", out.to_str().unwrap()]);
        assert!(o.status.success(), "{}", text(&o));
    }
    let col = |d: &Path, k: &str| rows(d).iter().map(|r| r[k].clone()).collect::<Vec<_>>();
    for k in ["rollout/reward_mean", "eval/reward_mean", "train/loss"] {
        assert_eq!(col(&a, k), col(&b, k), "{k}: a worker process scores as the thread does");
    }
    // Kill -9 the worker once the run is a few steps in: it is named, started again, sent what it
    // owed, and the run ends with the same rewards.
    let mut p = Proc::spawn(
        miles()
            .args(["run", &process, "--out", c.to_str().unwrap(), "--threads", "1"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    );
    let metrics = c.join("metrics.jsonl");
    let pid = p.sigkill_member_when("image-reward", Duration::from_secs(120), || {
        std::fs::read_to_string(&metrics).map(|t| t.lines().count() >= 4).unwrap_or(false)
    });
    let o = p.wait_output(Duration::from_secs(300));
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains(&format!("reward worker process {pid} exited")), "{}", text(&o));
    assert!(text(&o).contains("starting it again"), "{}", text(&o));
    assert_eq!(col(&b, "rollout/reward_mean"), col(&c, "rollout/reward_mean"), "nothing lost, nothing changed");
    let restarts = col(&c, "reward/worker_restarts");
    assert_eq!(restarts.last().and_then(Value::as_f64), Some(1.0), "{restarts:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
