//! Combined and group rewards through the built binary (docs/rewards.md): a recipe weighing a
//! format reward, a correctness reward and a group ranking reward trains 2 steps and writes each
//! part's mean beside the combined reward; `recipes/grpo-combined-rewards.miles` checks, plans
//! and runs.

use crate::common;

use common::process::{miles, output, temp_dir, text};
use common::tiny::tiny_recipe;
use serde_json::Value;
use std::time::Duration;

fn run(args: &[&str]) -> std::process::Output {
    let opts: &[&str] = if args[0] == "run" { &["--threads", "1", "--progress", "off"] } else { &[] };
    output(miles().args(args).args(opts), Duration::from_secs(300))
}

#[test]
fn combined_and_group_rewards_train_and_write_their_columns() {
    let dir = temp_dir("combined-rewards");
    let rank = format!("{}/recipes/rewards/rank.py", env!("CARGO_MANIFEST_DIR"));
    let extra = format!(
        "recipe combined extends tiny {{\n    \
         format = verify(rollout) {{ kind = regex, pattern = \"^[0-9]+$\" }}\n    \
         correct = exact_match(rollout)\n    \
         rank = group_command_reward(rollout) {{ command = [\"python3\", \"{rank}\"], timeout = 30.s }}\n    \
         reward = combine(rollout) {{ parts = [format, correct, rank], weights = [0.2, 1.0, 0.5] }}\n}}\n"
    );
    let path = dir.join("combined.miles");
    std::fs::write(&path, tiny_recipe("transport = local", 2, &[]) + &extra).unwrap();
    let p = path.to_str().unwrap();
    let o = run(&["check", p]);
    assert!(o.status.success(), "{}", text(&o));
    let out = dir.join("out");
    let o = run(&["run", p, "--recipe", "combined", "--out", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let spec: Value = serde_json::from_str(&std::fs::read_to_string(out.join("spec.json")).unwrap()).unwrap();
    assert_eq!(spec["reward"]["type"], "combine", "{spec}");
    assert_eq!(spec["reward"]["parts"][2]["group"], true, "{spec}");
    let rows: Vec<Value> =
        common::metrics::untimed(&out).into_iter().filter(|r| r["rollout/reward_mean"].is_number()).collect();
    assert_eq!(rows.len(), 2);
    for r in &rows {
        let col = |k: &str| r[k].as_f64().unwrap_or_else(|| panic!("step {}: no `{k}` in {r}", r["step"]));
        let (format, correct, rank) = (col("reward/format"), col("reward/correct"), col("reward/rank"));
        // Each group of 4 ranks one response 1 and one 0.5: a mean of 1.5 / 4 in every group.
        assert_eq!(rank, 0.375);
        // No sample failed, so the headline is the weighted sum of the parts' means.
        assert_eq!(col("reward/scored"), 32.0);
        let want = 0.2 * format + correct + 0.5 * rank;
        assert!((col("rollout/reward_mean") - want).abs() < 1e-6, "{r}");
    }
    // Under fully_async each group is scored as it completes: the same columns, the same ranks.
    let out = dir.join("async");
    let o = run(&[
        "run",
        p,
        "--recipe",
        "combined",
        "--out",
        out.to_str().unwrap(),
        "--set",
        "schedule=fully_async { max_staleness = 1 }",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let rows: Vec<Value> =
        common::metrics::untimed(&out).into_iter().filter(|r| r["rollout/reward_mean"].is_number()).collect();
    assert_eq!(rows.len(), 2);
    for r in &rows {
        assert_eq!(r["reward/rank"].as_f64(), Some(0.375), "{r}");
        assert!(r["reward/format"].is_number() && r["reward/correct"].is_number(), "{r}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_combined_rewards_recipe_checks_plans_and_runs() {
    let r = "recipes/grpo-combined-rewards.miles";
    let o = run(&["check", r]);
    assert!(o.status.success(), "{}", text(&o));
    let o = run(&["plan", r]);
    let plan = text(&o);
    assert!(o.status.success() && plan.contains("group_command_reward") && plan.contains("combine"), "{plan}");
    let dir = temp_dir("combined-recipe");
    let out = dir.join("out");
    let o = run(&["run", r, "--out", out.to_str().unwrap(), "--set", "stop=2.steps", "--set", "warmup.steps=10.steps"]);
    assert!(o.status.success(), "{}", text(&o));
    let last = common::metrics::untimed(&out).into_iter().rev().find(|r| r["rollout/reward_mean"].is_number());
    let last = last.expect("an RL step's row");
    for k in ["reward/format", "reward/correct", "reward/rank"] {
        assert!(last[k].is_number(), "no `{k}` in {last}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
