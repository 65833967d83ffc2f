//! The distributed run under a real Ray: `launcher = ray { address = ... }` submits one job per
//! worker through the Jobs REST API; the run learns exactly as in-process (sync, one engine) and
//! runs fully_async with every prompt accounted for. Needs the single-node head of
//! scripts/start-test-ray.sh; skipped (with the reason printed) when it is absent.

use crate::common;

use common::process::{run_recipe, temp_dir};
use common::tiny::{tiny_recipe, EVAL};
use std::path::{Path, PathBuf};
use std::time::Duration;

const HEAD: &str = "http://127.0.0.1:8265";

fn ray_ready() -> Result<(), String> {
    miles_workers::http::get_json(&format!("{HEAD}/api/version"), Duration::from_secs(3))
        .map(|_| ())
        .map_err(|e| format!("no Ray Jobs API at {HEAD} ({e})"))
}

fn run(recipe: &Path, out: &Path) -> String {
    let o = run_recipe(recipe, out, Duration::from_secs(600));
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{}: {err}", recipe.display());
    err
}

#[test]
fn grpo_under_ray_learns_as_in_process_and_runs_fully_async() {
    if let Err(why) = ray_ready() {
        println!("skipped: {why}; start one with `bash scripts/start-test-ray.sh`");
        return;
    }
    let dir = temp_dir("ray");
    let launcher = format!("launcher = ray {{ address = \"{HEAD}\", gpus_per_engine = 1, start_timeout = 120 }}");
    let write = |name: &str, sync: &str, extra: &[&str]| -> PathBuf {
        let p = dir.join(format!("{name}.miles"));
        std::fs::write(&p, tiny_recipe(sync, 4, extra)).unwrap();
        p
    };
    let inproc = write("inproc", "transport = local", &["launcher = in_process", EVAL]);
    let ray = write("ray", "transport = broadcast, bucket = 1.MB", &[&launcher, EVAL]);
    let (out_a, out_b) = (dir.join("inproc"), dir.join("ray-sync"));
    run(&inproc, &out_a);
    let err = run(&ray, &out_b);
    assert!(err.contains("workers up (ray)"), "{err}");
    // Same seed, one engine, exact weight transfer: the same run, number for number.
    assert_eq!(common::metrics::untimed(&out_a), common::metrics::untimed(&out_b));

    let ray_async = write(
        "ray-async",
        "transport = broadcast, bucket = 1.MB",
        &[
            &launcher,
            EVAL,
            "ckpt = checkpoint(train) { every = 2.steps }",
            "schedule = fully_async { max_staleness = 1 }",
        ],
    );
    let out = dir.join("ray-async");
    let err = run(&ray_async, &out);
    assert!(err.contains("workers up (ray)"), "{err}");
    assert_eq!(common::metrics::trained_steps(&out), (1..=4).collect::<Vec<_>>());
    assert_eq!(common::metrics::prompt_ledger(&out).accounting_faults(), Vec::<String>::new());
    let _ = std::fs::remove_dir_all(&dir);
}
