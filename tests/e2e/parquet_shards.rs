//! Parquet as Hugging Face datasets ship it (docs/data.md, "Parquet"), through the built binary:
//! `parquet { path = DIR }` over the fixture repository tests/fixtures/data/hf-dataset (three zstd
//! train shards in `data/`, a test shard beside them), trained by the built-in tiny model; the
//! test shards are the held-out split, or with `held_out = drawn` the train shards give it; a
//! directory with no shard is `miles check`'s error.

use crate::common;

use common::process::{run_miles as miles, temp_dir, text};
use serde_json::Value;
use std::path::Path;

const REPO: &str = "tests/fixtures/data/hf-dataset";

/// A reward program that scores 0 and logs each sample's id and its row's `id` column (which
/// reaches the reward as metadata) to the file named by its argument.
const LOGGING_REWARD: &str = r#"
import json, sys
log = open(sys.argv[1], "a")
for line in sys.stdin:
    request = json.loads(line)
    for s in request["samples"]:
        log.write(json.dumps({"sample": s["sample_id"], "row": s["metadata"]["id"], "label": s["label"]}) + "\n")
    log.flush()
    print(json.dumps({"id": request["id"], "scores": [0.0 for _ in request["samples"]]}), flush=True)
"#;

fn recipe(dir: &Path, data: &str, log: &Path) -> std::path::PathBuf {
    recipe_with(dir, data, log, "")
}

/// The recipe with `extra` fields in both prompt sets (`, held_out = drawn`).
fn recipe_with(dir: &Path, data: &str, log: &Path, extra: &str) -> std::path::PathBuf {
    let script = dir.join("log_reward.py");
    std::fs::write(&script, LOGGING_REWARD).unwrap();
    let prompts = format!(r#"parquet {{ path = "{data}", prompt_field = "question", label_field = "answer"{extra}"#);
    let path = dir.join("shards.miles");
    std::fs::write(
        &path,
        format!(
            r#"
model policy = transformer {{ layers = 1, d_model = 32, heads = 2, vocab = 64, max_len = 32 }}
recipe shards {{
    rollout = generate(policy) {{
        prompts = {prompts} }}
        samples_per_prompt = 2
        max_prompt_tokens = 8.tokens
        max_new_tokens = 2.tokens
    }}
    reward = command_reward(rollout) {{ command = ["python3", "{script}", "{log}"], timeout = 30.s }}
    train  = grpo(rollout, reward) {{ rollout_batch = 4, global_batch = 8, micro_batch = 8, lr = 1e-3 }}
    sync   = weights(train -> rollout) {{ transport = local }}
    eval   = evaluate(rollout) {{ prompts = {prompts}, split = test }}, every = 1.steps }}
    stop   = 2.steps
}}
"#,
            script = script.display(),
            log = log.display(),
        ),
    )
    .unwrap();
    path
}

/// Two steps from the three-shard zstd repository: the run's spec names the directory, every
/// trained prompt comes from a train shard and every evaluated one from the test shard (all six
/// of its rows), and the row's other columns reach the reward.
#[test]
fn a_run_from_a_sharded_datasets_repository_holds_out_its_test_shards() {
    let d = temp_dir("parquet-shards");
    std::fs::create_dir_all(&d).unwrap();
    let log = d.join("reward.jsonl");
    let r = recipe(&d, REPO, &log);
    let o = miles(&["check", r.to_str().unwrap()]);
    assert!(o.status.success(), "a directory is a path `miles check` accepts: {}", text(&o));
    let out = d.join("run");
    let o =
        miles(&["run", r.to_str().unwrap(), "--out", out.to_str().unwrap(), "--progress", "plain", "--threads", "1"]);
    assert!(o.status.success(), "{}", text(&o));
    let spec: Value = serde_json::from_str(&std::fs::read_to_string(out.join("spec.json")).unwrap()).unwrap();
    assert_eq!(spec["task"]["kind"]["path"], REPO, "{}", spec["task"]);
    let logged: Vec<Value> =
        std::fs::read_to_string(&log).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let (eval, train): (Vec<&Value>, Vec<&Value>) =
        logged.iter().partition(|v| v["sample"].as_str().unwrap().starts_with("eval/"));
    // 2 steps of 4 prompts x 2 samples; an evaluation before the first step and after each.
    assert_eq!(train.len(), 16, "{logged:?}");
    assert!(train.iter().all(|v| v["row"].as_str().unwrap().starts_with("train-")), "{train:?}");
    let mut evaluated: Vec<&str> = eval.iter().map(|v| v["row"].as_str().unwrap()).collect();
    evaluated.sort_unstable();
    evaluated.dedup();
    assert_eq!(evaluated, ["test-0", "test-1", "test-2", "test-3", "test-4", "test-5"], "{eval:?}");
    let metrics = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
    let last: Value = serde_json::from_str(metrics.lines().last().unwrap()).unwrap();
    assert_eq!(last["step"], 2, "{last}");
    let _ = std::fs::remove_dir_all(&d);
}

/// `held_out = drawn`: the test shards are not read; the evaluation's rows are drawn from the
/// train shards (4 of them, `test_size`), training never sees them, and `miles data` says the
/// split drew them.
#[test]
fn held_out_drawn_evaluates_on_train_shard_rows() {
    let d = temp_dir("parquet-drawn");
    std::fs::create_dir_all(&d).unwrap();
    let log = d.join("reward.jsonl");
    let r = recipe_with(&d, REPO, &log, ", held_out = drawn, test_size = 4");
    let r = r.to_str().unwrap();
    let o = miles(&["data", "--json", r]);
    assert!(o.status.success(), "{}", text(&o));
    let preview: Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&o)));
    let split = &preview["split"];
    assert_eq!((split["train"].as_u64(), split["test"].as_u64()), (Some(20), Some(4)), "{split}");
    assert!(split["test_from"].is_null(), "drawn, not shipped: {split}");
    let out = d.join("run");
    let o = miles(&["run", r, "--out", out.to_str().unwrap(), "--progress", "plain", "--threads", "1"]);
    assert!(o.status.success(), "{}", text(&o));
    let spec: Value = serde_json::from_str(&std::fs::read_to_string(out.join("spec.json")).unwrap()).unwrap();
    assert_eq!(spec["task"]["split"]["held_out"], "drawn", "{}", spec["task"]);
    let logged: Vec<Value> =
        std::fs::read_to_string(&log).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let (eval, train): (Vec<&Value>, Vec<&Value>) =
        logged.iter().partition(|v| v["sample"].as_str().unwrap().starts_with("eval/"));
    let rows = |vs: &[&Value]| {
        let mut r: Vec<String> = vs.iter().map(|v| v["row"].as_str().unwrap().to_string()).collect();
        r.sort_unstable();
        r.dedup();
        r
    };
    let (evaluated, trained) = (rows(&eval), rows(&train));
    assert_eq!(evaluated.len(), 4, "{eval:?}");
    assert!(evaluated.iter().all(|r| r.starts_with("train-")), "no test shard row: {evaluated:?}");
    assert!(trained.iter().all(|r| r.starts_with("train-") && !evaluated.contains(r)), "{trained:?} {evaluated:?}");
    let _ = std::fs::remove_dir_all(&d);
}

/// A directory with no .parquet file where the run looks for shards is `miles check`'s error at
/// the prompt set (the `parquet_files` builtin walks the layouts the run walks), as is a path that
/// is not there at all.
#[test]
fn a_directory_without_shards_is_a_check_error() {
    let d = temp_dir("parquet-noshards");
    let data = d.join("empty-repo");
    std::fs::create_dir_all(data.join("data")).unwrap();
    std::fs::write(data.join("README.md"), "no shards here\n").unwrap();
    let r = recipe(&d, data.to_str().unwrap(), &d.join("reward.jsonl"));
    let o = miles(&["check", r.to_str().unwrap()]);
    assert!(!o.status.success(), "{}", text(&o));
    let t = text(&o);
    assert!(t.contains("the directory holds no .parquet file"), "{t}");
    assert!(t.contains("E0301"), "{t}");
    // `miles run` checks first: it stops before training with the same error.
    let out = d.join("run");
    let o =
        miles(&["run", r.to_str().unwrap(), "--out", out.to_str().unwrap(), "--progress", "plain", "--threads", "1"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("the directory holds no .parquet file"), "{}", text(&o));
    let r = recipe(&d, &d.join("not-here").display().to_string(), &d.join("reward.jsonl"));
    let o = miles(&["check", r.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(text(&o).contains("the prompt file is not there"), "{}", text(&o));
    assert!(!text(&o).contains("holds no .parquet file"), "one error for a missing path: {}", text(&o));
    let _ = std::fs::remove_dir_all(&d);
}
