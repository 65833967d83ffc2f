//! The RL algorithm variants of issue #43 end to end: the built `miles` runs
//! recipes/grpo-laptop.miles for 3 steps with each variant set from the command line (the
//! advantage estimators, Dr. GRPO's constant normaliser, GSPO's sequence ratio, several epochs,
//! masked importance sampling, DAPO's overlong shaping and dynamic sampling), and each run
//! finishes, writes the variant's columns and a finite loss at every step it trained.

use crate::common;

use common::metrics::untimed;
use common::process::{run_miles as miles, temp_dir, text};
use serde_json::Value;
use std::path::Path;

/// Runs the laptop recipe for 3 steps with `sets` (`KEY=VALUE` each) into a fresh directory;
/// returns the RL steps' rows (step 0, the opening evaluation, left out) after checking that the
/// run finished, that it wrote steps 1 to 3, and that each step that trained has a finite loss.
fn run(name: &str, sets: &[&str]) -> Vec<Value> {
    let d = temp_dir(&format!("algorithms-{name}"));
    let out = d.join("run");
    let mut args = vec!["run", "recipes/grpo-laptop.miles", "--out", out.to_str().unwrap()];
    args.extend(["--threads", "1", "--progress", "off", "--set", "stop=3.steps"]);
    for s in sets {
        args.extend(["--set", s]);
    }
    let o = miles(&args);
    assert_eq!(o.status.code(), Some(0), "{name}: {}", text(&o));
    let rows: Vec<Value> = untimed(&out).into_iter().filter(|r| r["step"].as_u64().is_some_and(|s| s > 0)).collect();
    let steps: Vec<u64> = rows.iter().map(|r| r["step"].as_u64().unwrap()).collect();
    assert_eq!(steps, [1, 2, 3], "{name}: {rows:?}");
    for r in &rows {
        if r.get("train/skipped").is_none() {
            let loss = r["train/loss"].as_f64().unwrap_or(f64::NAN);
            assert!(loss.is_finite(), "{name}: a finite loss: {r}");
        }
    }
    let spec = spec_of(&out);
    let _ = std::fs::remove_dir_all(&d);
    let mut rows = rows;
    rows.push(spec);
    rows
}

/// The run spec the run executed (`OUT/spec.json`).
fn spec_of(out: &Path) -> Value {
    let t = std::fs::read_to_string(out.join("spec.json")).expect("spec.json");
    serde_json::from_str(&t).unwrap()
}

/// Splits `run`'s answer into the step rows and the spec.
fn rows_and_spec(mut v: Vec<Value>) -> (Vec<Value>, Value) {
    let spec = v.pop().unwrap();
    (v, spec)
}

fn num(r: &Value, k: &str) -> f64 {
    r[k].as_f64().unwrap_or_else(|| panic!("no number {k} in {r}"))
}

#[test]
fn rloo_advantages_train() {
    let (rows, spec) = rows_and_spec(run("rloo", &["train.advantage=rloo"]));
    assert_eq!(spec["train"]["advantage"], "rloo");
    // RLOO's std_norm defaults off.
    assert_eq!(spec["train"]["std_norm"], false);
    assert!(rows.iter().all(|r| num(r, "train/tokens") > 0.0));
}

#[test]
fn reinforce_pp_trains_with_the_kl_in_its_reward() {
    let (rows, spec) = rows_and_spec(run("reinforce-pp", &["train.advantage=reinforce_pp", "train.kl_coef=0.01"]));
    assert_eq!(spec["train"]["advantage"], "reinforce_pp");
    for r in &rows {
        assert!(num(r, "train/kl").is_finite(), "{r}");
    }
}

#[test]
fn dr_grpo_constant_normaliser_trains() {
    let (_, spec) = rows_and_spec(run("constant", &["train.aggregation=constant", "train.std_norm=false"]));
    assert_eq!(spec["train"]["aggregation"]["constant"]["tokens"], 8, "max_new_tokens: {}", spec["train"]);
    assert_eq!(spec["train"]["std_norm"], false);
}

#[test]
fn gspo_sequence_ratio_trains_and_clips() {
    let sets = ["train.ratio=sequence", "train.clip_low=0.0003", "train.clip_high=0.0004"];
    let (rows, spec) = rows_and_spec(run("gspo", &sets));
    assert_eq!(spec["train"]["ratio"], "sequence");
    for r in &rows {
        let c = num(r, "train/clip_frac");
        assert!((0.0..=1.0).contains(&c), "{r}");
    }
}

#[test]
fn two_epochs_report_each_pass() {
    let sets = ["train.epochs=2", "train.global_batch=128", "train.steps_per_rollout=2", "train.micro_batch=64"];
    let (rows, spec) = rows_and_spec(run("epochs", &sets));
    assert_eq!(spec["train"]["epochs"], 2);
    for r in &rows {
        for e in ["train/epoch1/", "train/epoch2/"] {
            assert!(num(r, &format!("{e}clip_frac")).is_finite(), "{r}");
            assert!(num(r, &format!("{e}approx_kl")).is_finite(), "{r}");
        }
    }
}

#[test]
fn mis_reports_the_share_masked() {
    let (rows, spec) = rows_and_spec(run("mis", &["train.mis=mis{low=0.5,high=2.0}"]));
    assert_eq!(spec["train"]["mis"]["low"], 0.5);
    for r in &rows {
        assert!((0.0..=1.0).contains(&num(r, "train/mis_masked")), "{r}");
    }
}

#[test]
fn overlong_shaping_reports_its_penalty() {
    let (rows, spec) = rows_and_spec(run("overlong", &["train.overlong=overlong{cache=4.tokens}"]));
    assert_eq!(spec["train"]["overlong"]["cache"], 4);
    assert_eq!(spec["train"]["overlong"]["max"], 8, "max_new_tokens by default");
    for r in &rows {
        let (mean, frac) = (num(r, "reward/overlong_mean"), num(r, "reward/overlong_frac"));
        assert!((-1.0..=0.0).contains(&mean) && (0.0..=1.0).contains(&frac), "{r}");
        assert_eq!(mean < 0.0, frac > 0.0, "a penalty only where some response was penalised: {r}");
    }
}

#[test]
fn dynamic_sampling_reports_its_rounds() {
    let (rows, spec) = rows_and_spec(run("dynamic", &["schedule=sync{filter=drop_flat,max_rounds=3}"]));
    assert_eq!(spec["dynamic_sampling"]["max_rounds"], 3);
    for r in &rows {
        let (rounds, kept, extra) =
            (num(r, "rollout/gen_rounds"), num(r, "rollout/kept_groups"), num(r, "rollout/extra_samples"));
        assert!((1.0..=3.0).contains(&rounds), "{r}");
        // Rounds of 32 prompts x 8 samples; short of 32 groups only after the last round.
        assert_eq!(extra, (rounds - 1.0) * 256.0, "{r}");
        assert!(kept == 32.0 || rounds == 3.0, "{r}");
        assert!((0.0..=1.0).contains(&num(r, "rollout/flat_group_frac")), "{r}");
    }
}
