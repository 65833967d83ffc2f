//! Mixture-of-experts and R3 through the built binary: the routing a bf16 engine records is
//! replayed by the fp32 trainer (no route mismatch), in process and across worker processes, and
//! the R3 bytes the run measures are the planner's figure for the same recipe.

use crate::common;

use common::metrics::without_perf;
use common::process::{miles, output, temp_dir, text};
use common::tiny::tiny_recipe;
use serde_json::Value;
use std::path::Path;
use std::time::Duration;

fn run(args: &[&str]) -> std::process::Output {
    let opts: &[&str] = if args[0] == "run" { &["--threads", "1", "--progress", "off"] } else { &[] };
    output(miles().args(args).args(opts), Duration::from_secs(300))
}

/// The tiny recipe with a 4-expert top-2 policy, a bf16 engine and R3.
fn moe_recipe(dir: &Path, name: &str, sync: &str, extra: &[&str]) -> String {
    let p = dir.join(format!("{name}.miles"));
    let text = tiny_recipe(sync, 3, extra).replace("max_len = 12 }", "max_len = 12, experts = 4, top_k = 2 }")
        + "recipe tiny_moe extends tiny {\n    rollout.routing_replay = true\n    \
           rollout.engine = embedded_engine { precision = bf16 }\n}\n";
    std::fs::write(&p, text).unwrap();
    p.to_string_lossy().into_owned()
}

fn train_rows(out: &Path) -> Vec<Value> {
    common::metrics::rows(out).into_iter().filter(|r| r["r3/bytes"].is_number()).collect()
}

#[test]
fn r3_bytes_match_the_plan() {
    let dir = temp_dir("moe-r3");
    let r = moe_recipe(&dir, "moe", "transport = local", &[]);
    let o = run(&["plan", &r, "--recipe", "tiny_moe", "--format", "json"]);
    assert!(o.status.success(), "{}", text(&o));
    let plan: Value = serde_json::from_slice(&o.stdout).unwrap();
    let per_token = plan["buffer"]["r3_bytes_per_token"].as_u64().expect("the plan sizes R3");
    let per_traj = plan["buffer"]["r3_bytes_per_trajectory"].as_u64().unwrap();
    // 1 MoE layer x top-2 x u8 ids; the engine records prompt + response - 1 tokens (6 + 3 - 1).
    assert_eq!(per_token, 2);
    assert_eq!(per_traj, (6 + 3 - 1) * per_token);
    let out = dir.join("out");
    let o = run(&["run", &r, "--recipe", "tiny_moe", "--out", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let rows = train_rows(&out);
    assert_eq!(rows.len(), 3);
    for row in &rows {
        let (bytes, tokens) = (row["r3/bytes"].as_u64().unwrap(), row["r3/tokens"].as_u64().unwrap());
        assert!(tokens > 0);
        assert_eq!(bytes, tokens * per_token, "measured R3 bytes are the plan's per token, exactly");
        // 8 prompts x 4 samples: no trajectory carries more than the plan's per-trajectory bound.
        assert!(bytes <= 32 * per_traj);
        assert_eq!(row["r3/replayed"], 1);
        assert_eq!(row["r3/route_mismatch"].as_f64(), Some(0.0), "replay uses the recorded experts");
        assert_eq!(row["r3/dropped"], 0);
        assert!(row["moe/load_max/0"].as_f64().unwrap() >= 1.0);
        assert!(row["train/logp_diff"].as_f64().unwrap() > 1e-4, "a bf16 engine differs from the fp32 trainer");
    }
    // `miles report` draws the route mismatch and the expert load next to the usual curves.
    let o = run(&["report", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    for f in ["r3_route_mismatch.svg", "r3_router_disagreement.svg", "moe_aux_loss.svg"] {
        assert!(out.join("report").join(f).exists(), "{f}: {}", text(&o));
    }
    // Across worker processes: the routing travels the worker protocol, and the run is the same.
    let w = moe_recipe(
        &dir,
        "workers",
        "transport = broadcast, bucket = 1.MB",
        &["launcher = local_processes { engines = 1 }"],
    );
    let wout = dir.join("workers-out");
    let o = run(&["run", &w, "--recipe", "tiny_moe", "--out", wout.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let strip = |rows: Vec<Value>| -> Vec<Value> {
        without_perf(rows)
            .into_iter()
            .map(|mut r| {
                if let Some(m) = r.as_object_mut() {
                    m.retain(|k, _| k.starts_with("r3/") || k.starts_with("moe/") || k.starts_with("train/"));
                }
                r
            })
            .collect()
    };
    assert_eq!(strip(train_rows(&wout)), strip(rows), "worker processes carry the routing bit for bit");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn routing_replay_on_a_dense_model_is_refused_at_check() {
    let dir = temp_dir("moe-dense");
    let p = dir.join("dense.miles");
    let text_ = tiny_recipe("transport = local", 2, &[])
        + "recipe tiny_r3 extends tiny {\n    rollout.routing_replay = true\n}\n";
    std::fs::write(&p, text_).unwrap();
    let o = run(&["check", p.to_str().unwrap()]);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("recording routed experts (R3) needs experts"), "{}", text(&o));
    let _ = std::fs::remove_dir_all(&dir);
}

/// True on-policy through the binary: with `batch_invariant` the trainer's log-probs equal the
/// sampler's in every step (`train/logp_diff` exactly 0), in process and across worker processes.
#[test]
fn a_batch_invariant_run_has_no_train_rollout_difference() {
    let dir = temp_dir("moe-invariant");
    for (name, sync, extra) in [
        ("inproc", "transport = local", vec![]),
        ("workers", "transport = broadcast, bucket = 1.MB", vec!["launcher = local_processes { engines = 1 }"]),
    ] {
        let p = dir.join(format!("{name}.miles"));
        let text_ = tiny_recipe(sync, 3, &extra).replace("max_len = 12 }", "max_len = 12, experts = 4, top_k = 2 }")
            + "recipe tiny_inv extends tiny {\n    rollout.batch_invariant = true\n    rollout.routing_replay = true\n}\n";
        std::fs::write(&p, text_).unwrap();
        let out = dir.join(format!("{name}-out"));
        let o = run(&["run", p.to_str().unwrap(), "--recipe", "tiny_inv", "--out", out.to_str().unwrap()]);
        assert!(o.status.success(), "{name}: {}", text(&o));
        let rows = train_rows(&out);
        assert_eq!(rows.len(), 3, "{name}");
        for r in rows {
            assert_eq!(r["train/logp_diff"].as_f64(), Some(0.0), "{name}: {r}");
            assert_eq!(r["r3/router_disagreement"].as_f64(), Some(0.0), "{name}: the same kernels route alike");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
