//! PPO through the built binary: a `ppo` recipe checks, plans its critic, trains with critic
//! metrics, checkpoints the critic, and runs in worker processes number for number as in process.

use crate::common;

use common::process::{miles, output, temp_dir, text};
use common::tiny::{tiny_recipe, EVAL};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::Duration;

const PPO: &str = "train = ppo(rollout, reward) { rollout_batch = 8, global_batch = 32, micro_batch = 32, lr = 1e-3, critic_lr = 1e-3 }";

fn recipe(dir: &Path, name: &str, sync: &str, extra: &[&str]) -> PathBuf {
    let p = dir.join(format!("{name}.miles"));
    let mut lines = vec![EVAL, "ckpt = checkpoint(train) { every = 2.steps, keep = 2 }"];
    lines.extend_from_slice(extra);
    let text = tiny_recipe(sync, 4, &lines) + "recipe tiny_ppo extends tiny {\n    " + PPO + "\n}\n";
    std::fs::write(&p, text).unwrap();
    p
}

fn run(args: &[&str]) -> std::process::Output {
    let opts: &[&str] = if args[0] == "run" { &["--threads", "1", "--progress", "off"] } else { &[] };
    output(miles().args(args).args(opts), Duration::from_secs(300))
}

use common::metrics::untimed as metrics;

#[test]
fn a_ppo_recipe_runs_and_learns_through_the_binary() {
    let dir = temp_dir("ppo-run");
    let r = recipe(&dir, "a", "transport = local", &[]);
    let path = r.to_str().unwrap();
    let o = run(&["check", path]);
    assert!(o.status.success(), "{}", text(&o));
    let o = run(&["plan", path, "--recipe", "tiny_ppo"]);
    assert!(o.status.success() && text(&o).contains("critic_weights"), "{}", text(&o));
    let out = dir.join("a-out");
    let o = run(&["run", path, "--recipe", "tiny_ppo", "--out", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let rows = metrics(&out);
    let rl: Vec<&Value> = rows.iter().filter(|r| r["rollout/reward_mean"].is_number()).collect();
    assert_eq!(rl.len(), 4);
    for r in &rl {
        for k in ["value_loss", "value_mean", "return_mean", "explained_variance", "grad_norm", "clip_frac"] {
            assert!(r[format!("critic/{k}")].is_number(), "step {}: critic/{k}", r["step"]);
        }
    }
    // The critic learns from the first step on: its values leave 0.
    assert_eq!(rl[0]["critic/value_mean"].as_f64(), Some(0.0));
    assert_ne!(rl[3]["critic/value_mean"].as_f64(), Some(0.0));
    assert!(out.join("checkpoints/step-00000004/critic.safetensors").exists());
    assert!(!out.join("checkpoints/step-00000000/critic.safetensors").exists(), "no critic before RL");
    // In worker processes: the same run, number for number (the critic lives in the trainer worker).
    let b = recipe(&dir, "b", "transport = broadcast, bucket = 1.MB", &["launcher = local_processes { engines = 1 }"]);
    let out_b = dir.join("b-out");
    let o = run(&["run", b.to_str().unwrap(), "--recipe", "tiny_ppo", "--out", out_b.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(metrics(&out), metrics(&out_b));
    let _ = std::fs::remove_dir_all(&dir);
}
