//! Diffusion RL runs end to end on a tiny spec: streamed micro-group rewards give exactly the run
//! the whole-batch mode gives (only the timing differs), RL raises an analytic reward, and bad
//! input stops before any work with a clear error.

use crate::common;

use miles_tch::diffusion::run::{run, DiffusionRunSpec};
use serde_json::Value;
use std::path::{Path, PathBuf};

fn tmp(name: &str) -> PathBuf {
    common::run_dir(&format!("diffusion-{name}"))
}

fn spec() -> DiffusionRunSpec {
    serde_json::from_str(
        r#"{
          "seed": 3,
          "model": { "side": 8, "conditions": 4, "hidden": 64, "layers": 1 },
          "steps": 8, "eta": 1.0, "guidance": 1.0,
          "pretrain": { "steps": 60, "lr": 2e-3, "batch": 16, "p_uncond": 0.1 },
          "reward": { "classifier_steps": 40, "classifier_weight": 0.5, "analytic": "brightness", "analytic_weight": 1.0 },
          "rl": { "steps": 4, "conditions_per_step": 2, "samples_per_condition": 4, "micro_group": 2,
                  "lr": 3e-4, "clip": 0.2, "kl_coef": 0.01, "train_steps": 4 },
          "eval": { "every": 2, "samples": 8, "judge_steps": 20 },
          "streaming": true
        }"#,
    )
    .unwrap()
}

fn rows(dir: &Path) -> Vec<Value> {
    common::untimed_metrics(dir)
}

#[test]
fn streamed_rewards_give_the_whole_batch_run_exactly() {
    let (a, b) = (tmp("stream"), tmp("batch"));
    let s = spec();
    let ra = run(&s, &a, Some(1)).unwrap();
    let mut w = s.clone();
    w.streaming = false;
    run(&w, &b, Some(1)).unwrap();
    assert_eq!(rows(&a), rows(&b), "streaming changes when rewards are computed, not what they are");
    assert_eq!(ra.steps_done, 4);
    let r = rows(&a);
    let train: Vec<&Value> = r.iter().filter(|r| r["rollout/reward_mean"].is_number()).collect();
    assert_eq!(train.len(), 4);
    for k in ["train/loss", "train/kl", "train/clip_frac", "train/grad_norm"] {
        assert!(train[3][k].is_number(), "{k}");
    }
    // Sample grids at the evaluations (steps 0, 2, 4) and the denoiser's checkpoint.
    for step in [0, 2, 4] {
        assert!(a.join(format!("grids/step-{step:05}.svg")).exists());
    }
    assert!(a.join("denoiser.safetensors").exists());
    // Held-out judge accuracy and diversity at each evaluation.
    let evals: Vec<&Value> = r.iter().filter(|r| r["eval/reward_mean"].is_number()).collect();
    assert_eq!(evals.len(), 3);
    for e in &evals {
        let j = e["eval/judge_accuracy"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&j), "{j}");
        assert!(e["eval/diversity"].as_f64().unwrap() > 0.0, "stochastic samples differ");
    }
    // The reward model the run trained is kept; a run that loads it rewards exactly alike.
    let c = tmp("loaded");
    let mut l = s.clone();
    l.reward.classifier_path = Some(a.join("classifier"));
    run(&l, &c, Some(1)).unwrap();
    let col = |d: &Path, k: &str| rows(d).iter().map(|r| r[k].clone()).collect::<Vec<_>>();
    assert_eq!(col(&a, "rollout/reward_mean"), col(&c, "rollout/reward_mean"));
    assert_eq!(col(&a, "eval/reward_mean"), col(&c, "eval/reward_mean"));
    for d in [a, b, c] {
        let _ = std::fs::remove_dir_all(d);
    }
}

#[test]
fn bad_diffusion_specs_are_refused_before_any_work() {
    let d = tmp("bad");
    let mut s = spec();
    s.rl.micro_group = 3;
    let e = run(&s, &d, Some(1)).unwrap_err();
    assert!(e.message.contains("micro_group = 3 must divide samples_per_condition = 4"), "{}", e.message);
    assert!(!d.join("metrics.jsonl").exists(), "nothing written");
    let mut s = spec();
    s.eta = 0.0;
    assert!(run(&s, &d, Some(1)).unwrap_err().message.contains("eta must be > 0"));
    // A reward model trained on other images than the denoiser makes is refused by shape.
    let c = miles_tch::diffusion::reward::Classifier::init(16, 4, 1);
    let p = d.join("classifier");
    c.save_dir(&p).unwrap();
    let mut s = spec();
    s.reward.classifier_path = Some(p.clone());
    let e = run(&s, &d.join("out"), Some(1)).unwrap_err();
    assert!(
        e.message.contains("reads [B, 1, 16, 16] images of 4 classes; the denoiser makes [B, 1, 8, 8] images"),
        "{}",
        e.message
    );
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_diverging_denoiser_stops_the_run_named_and_keeps_the_last_good_one() {
    // Pretraining that diverges stops at the step, before anything is saved.
    let d = tmp("nan-pretrain");
    let mut s = spec();
    s.pretrain.lr = 1e30;
    let e = run(&s, &d, Some(1)).unwrap_err();
    assert_eq!(e.code, "E0505", "{}", e.message);
    assert!(e.message.contains("pretraining loss became") && e.message.contains("pretraining step"), "{}", e.message);
    // RL that diverges: the step is named, its update is not applied, and denoiser.safetensors still
    // holds finite weights (those saved at the last evaluation).
    let d = tmp("nan-rl");
    let mut s = spec();
    s.rl.lr = 1e30;
    s.rl.grad_clip = 0.0;
    s.rl.steps = 6;
    let e = run(&s, &d, Some(1)).unwrap_err();
    assert_eq!(e.code, "E0505", "{}", e.message);
    assert!(e.message.contains("RL step") && e.message.contains("the last good denoiser is"), "{}", e.message);
    let kept = miles_tch::diffusion::model::Denoiser::load(&s.model, &d.join("denoiser.safetensors")).unwrap();
    for (name, t) in kept.params() {
        assert!(bool::try_from(t.isfinite().all()).unwrap(), "{name} of the kept denoiser is finite");
    }
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn the_pretraining_seed_fixes_what_rl_starts_from() {
    // Two RL seeds from one pretrained denoiser: the same pretraining loss, classifier accuracy
    // and held-out reward before RL; different RL draws after.
    let (a, b, c) = (tmp("seed-a"), tmp("seed-b"), tmp("seed-c"));
    let mut s = spec();
    s.pretrain.seed = Some(5);
    run(&s, &a, Some(1)).unwrap();
    s.seed = 4;
    run(&s, &b, Some(1)).unwrap();
    let first = |d: &Path, k: &str| rows(d).iter().find(|r| r[k].is_number()).map(|r| r[k].clone());
    for k in ["pretrain/loss", "reward/classifier_accuracy", "eval/reward_mean", "eval/judge_accuracy"] {
        assert_eq!(first(&a, k), first(&b, k), "{k} follows the pretraining seed");
    }
    assert_ne!(first(&a, "rollout/reward_mean"), first(&b, "rollout/reward_mean"), "RL draws follow the seed");
    // Without it, the run's seed seeds pretraining too.
    let mut s = spec();
    s.seed = 4;
    run(&s, &c, Some(1)).unwrap();
    assert_ne!(first(&b, "pretrain/loss"), first(&c, "pretrain/loss"));
    for d in [a, b, c] {
        let _ = std::fs::remove_dir_all(d);
    }
}
