//! Parquet as Hugging Face datasets ship it (docs/data.md, "Parquet"), through the built binary:
//! `parquet { path = DIR }` over the fixture repository tests/fixtures/data/hf-dataset (three zstd
//! train shards in `data/`, a test shard beside them), trained by the built-in tiny model; the
//! test shards are the held-out split; a directory with no shard is the run's error.

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
    let script = dir.join("log_reward.py");
    std::fs::write(&script, LOGGING_REWARD).unwrap();
    let prompts = format!(r#"parquet {{ path = "{data}", prompt_field = "question", label_field = "answer""#);
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

/// `miles check` reads no directory listing (the compiler does no IO beyond its files), so a
/// directory without shards passes it; the run stops before training, naming the directory.
#[test]
fn a_directory_without_shards_stops_the_run_with_its_name() {
    let d = temp_dir("parquet-noshards");
    let data = d.join("empty-repo");
    std::fs::create_dir_all(data.join("data")).unwrap();
    std::fs::write(data.join("README.md"), "no shards here\n").unwrap();
    let r = recipe(&d, data.to_str().unwrap(), &d.join("reward.jsonl"));
    let o = miles(&["check", r.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let out = d.join("run");
    let o =
        miles(&["run", r.to_str().unwrap(), "--out", out.to_str().unwrap(), "--progress", "plain", "--threads", "1"]);
    assert!(!o.status.success());
    let t = text(&o);
    assert!(t.contains(&format!("{}: holds no .parquet file", data.display())), "{t}");
    assert!(t.contains("E0501"), "{t}");
    // A path that is not there at all is `miles check`'s error.
    let r = recipe(&d, &d.join("not-here").display().to_string(), &d.join("reward.jsonl"));
    let o = miles(&["check", r.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(text(&o).contains("the prompt file is not there"), "{}", text(&o));
    let _ = std::fs::remove_dir_all(&d);
}
