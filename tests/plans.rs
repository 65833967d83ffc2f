//! Every plan figure of the shipped recipes, snapshotted in text and JSON: the path from a
//! `.miles` file through the compiler and `plan_input` to the planner.

use miles_compiler::fs::FileSystem;
use miles_compiler::{compile, Options};

struct Disk;
impl FileSystem for Disk {
    fn read(&self, path: &str) -> Result<Vec<u8>, String> {
        std::fs::read(path).map_err(|e| e.to_string())
    }
}

fn plan(file: &str, sets: &[(&str, &str)]) -> miles_plan::Plan {
    let overrides = sets.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let c = compile(&Disk, &[file.to_string()], &Options { overrides, recipe: None });
    assert!(!c.has_errors(), "{file} has errors: {:#?}", c.diagnostics);
    assert_eq!(c.recipes.len(), 1, "{file}");
    miles_plan::plan(&miles_plan::plan_input(&c.recipes[0]))
}

#[test]
fn laptop_recipe() {
    let p = plan("recipes/grpo-laptop.miles", &[]);
    assert_eq!(p.summary.errors, 0);
    insta::assert_snapshot!("grpo_laptop.txt", miles_plan::render_text(&p));
    insta::assert_snapshot!("grpo_laptop.json", miles_plan::render_json(&p));
}

/// The paper's reference run plans cleanly with optimizer state streamed from disk ...
#[test]
fn glm5_reference_plans_cleanly_with_streaming() {
    let p = plan("recipes/glm5-agentic.miles", &[]);
    assert_eq!((p.summary.errors, p.summary.warnings), (0, 0), "{}", miles_plan::render_text(&p));
    insta::assert_snapshot!("glm5_agentic.txt", miles_plan::render_text(&p));
    insta::assert_snapshot!("glm5_agentic.json", miles_plan::render_json(&p));
}

/// ... and does not fit with weights, gradients and ~279 GB of optimizer state in HBM.
#[test]
fn glm5_reference_does_not_fit_with_optimizer_on_gpu() {
    let p = plan("recipes/glm5-agentic.miles", &[("train.optimizer.state", "on_gpu")]);
    let text = miles_plan::render_text(&p);
    assert!(p.diagnostics.iter().any(|d| d.code == "E0401"), "{text}");
    let train = p.memory.iter().find(|m| m.stage == "train").expect("train memory");
    let optimizer = train.items.iter().find(|i| i.name == "optimizer").expect("optimizer item");
    // 744e9 parameters x 12 bytes / 32 ranks = 279 GB (Miles §9).
    assert!((optimizer.bytes as f64 / 1e9 - 279.0).abs() < 1.0, "{text}");
    insta::assert_snapshot!("glm5_agentic_optimizer_on_gpu.txt", text);
}

/// Explicit placement: `first_gpu` pins a stage to a GPU range; overlapping or out-of-cluster
/// ranges are plan errors (E0403); without `gpus` an engine takes what the trainer leaves.
#[test]
fn explicit_and_automatic_gpu_placement() {
    let codes = |p: &miles_plan::Plan| p.diagnostics.iter().map(|d| d.code).collect::<Vec<_>>();
    let p = plan("recipes/glm5-agentic.miles", &[("rollout.engine.first_gpu", "32"), ("train.backend.first_gpu", "0")]);
    assert!(codes(&p).is_empty(), "{}", miles_plan::render_text(&p));
    assert!(miles_plan::render_text(&p).contains("GPUs 32-63"));
    let p = plan("recipes/glm5-agentic.miles", &[("rollout.engine.first_gpu", "16"), ("train.backend.first_gpu", "0")]);
    assert!(codes(&p).contains(&"E0403"), "{}", miles_plan::render_text(&p));
    let p = plan("recipes/glm5-agentic.miles", &[("rollout.engine.first_gpu", "48")]);
    assert!(codes(&p).contains(&"E0403"), "{}", miles_plan::render_text(&p));
    let p = plan("recipes/glm5-agentic.miles", &[("rollout.engine.gpus", "none")]);
    assert!(codes(&p).is_empty(), "{}", miles_plan::render_text(&p));
    assert!(miles_plan::render_text(&p).contains("32 rollout"));
}
