//! End to end through the built binary: recipes that start from a Hugging Face directory check,
//! plan and run, and leave a Hugging Face directory behind. `recipes/grpo-hf.miles` (the qwen3
//! fixture, chat prompts from JSONL, a Python `command_reward`) and a Parquet + `verify` variant on
//! the qwen2 fixture; what the directory lacks is a `miles check` error at the user's line.

use crate::common;

use common::metrics::{json_file, rows, untimed};
use common::process::{run_miles as miles, run_recipe, temp_dir, text};
use serde_json::Value;
use std::path::Path;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(300);

/// The Parquet prompts the recipes below train on (`prompt`, `answer`).
pub(crate) const PROMPTS: &str = "tests/fixtures/data/prompts.parquet";

/// A GRPO recipe over `data`'s prompts (Parquet, `prompt` and `answer` columns, one test row) with
/// `model` (a model expression), scored by the math verifier, stopping after `steps`: `rollout`
/// adds rollout settings and `members` recipe members, one a line; `train` ends grpo's settings
/// (its lr, at least). Shared by hf_moe.rs and hf_hub.rs.
pub(crate) fn parquet_recipe(
    model: &str,
    data: &str,
    rollout: &[&str],
    train: &str,
    members: &[&str],
    steps: u32,
) -> String {
    let rollout: String = rollout.iter().map(|l| format!("        {l}\n")).collect();
    let members: String = members.iter().map(|l| format!("    {l}\n")).collect();
    format!(
        r#"
model policy = {model}
recipe r {{
    rollout = generate(policy) {{
        prompts = parquet {{ path = "{data}", prompt_field = "prompt", label_field = "answer", test_size = 1 }}
        samples_per_prompt = 4
        max_prompt_tokens = 32.tokens
        max_new_tokens = 3.tokens
{rollout}    }}
    reward = verify(rollout) {{ kind = math, on_error = zero }}
    train  = grpo(rollout, reward) {{ rollout_batch = 2, global_batch = 8, micro_batch = 8, {train} }}
    sync   = weights(train -> rollout) {{ transport = local }}
{members}    stop   = {steps}.steps
}}
"#
    )
}

#[test]
fn hf_recipe_runs_end_to_end() {
    let r = "recipes/grpo-hf.miles";
    let o = miles(&["check", r]);
    assert!(o.status.success(), "{}", text(&o));
    let o = miles(&["plan", r]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("qwen3"), "the plan names the model it read: {}", text(&o));

    let d = temp_dir("hf-recipe");
    let out = d.join("run");
    let o = miles(&["run", r, "--steps", "2", "--out", out.to_str().unwrap(), "--progress", "plain", "--threads", "1"]);
    assert!(o.status.success(), "{}", text(&o));
    let spec = json_file(&out.join("spec.json"));
    assert_eq!(spec["hf"]["path"], "tests/fixtures/hf/qwen3");
    assert_eq!(spec["reward"]["type"], "command");
    assert_eq!(spec["reward"]["name"], "reward");
    let last = rows(&out).pop().unwrap();
    assert_eq!(last["step"], 2);
    assert_eq!(last["reward/scored"], 128.0, "every sample went through the Python program: {last}");
    let config = json_file(&out.join("model/config.json"));
    assert_eq!(config["architectures"][0], "Qwen3ForCausalLM");
    assert!(out.join("model/tokenizer.json").is_file());
    let _ = std::fs::remove_dir_all(&d);
}

/// The qwen2 fixture (tied embeddings, QKV bias) with string prompts from Parquet, scored by the
/// built-in math verifier.
fn evaluated_recipe(model_path: &str, data_path: &str) -> String {
    let eval = format!(
        r#"eval   = evaluate(rollout) {{ prompts = parquet {{ path = "{data_path}", prompt_field = "prompt", label_field = "answer", split = test, test_size = 1 }}, every = 1.steps }}"#
    );
    parquet_recipe(&format!(r#"hf {{ path = "{model_path}" }}"#), data_path, &[], "lr = 1e-4", &[&eval], 1)
}

#[test]
fn a_parquet_and_verify_recipe_runs_and_a_bad_directory_is_a_check_error() {
    let d = temp_dir("hf-parquet");
    std::fs::create_dir_all(&d).unwrap();
    let recipe = d.join("byo.miles");
    std::fs::write(&recipe, evaluated_recipe("tests/fixtures/hf/qwen2", PROMPTS)).unwrap();
    let out = d.join("run");
    let o = run_recipe(&recipe, &out, LIMIT);
    assert!(o.status.success(), "{}", text(&o));
    let spec = json_file(&out.join("spec.json"));
    assert_eq!(spec["reward"]["type"], "verifier");
    assert_eq!(spec["reward"]["kind"], "math");
    assert_eq!(spec["reward"]["on_error"], "zero");
    assert!(spec["model"]["tie_embeddings"].as_bool().unwrap(), "{}", spec["model"]);
    assert_eq!(json_file(&out.join("model/config.json"))["architectures"][0], "Qwen2ForCausalLM");

    // A directory that is not there and a data file that is not there: both at `miles check`
    // time, at the lines that name them, before anything starts.
    std::fs::write(&recipe, evaluated_recipe("models/not-here", "data/missing.parquet")).unwrap();
    let o = miles(&["check", recipe.to_str().unwrap()]);
    assert!(!o.status.success());
    let t = text(&o);
    assert!(t.contains("models/not-here"), "{t}");
    assert!(t.contains("data/missing.parquet"), "{t}");
    let _ = std::fs::remove_dir_all(&d);
}

/// The same hf recipe with its stages in worker processes (a trainer and a rollout engine, weights
/// broadcast over shared memory) trains exactly as in one process: the workers load the same
/// directory, and the saved model carries its config and tokenizer.
#[test]
fn an_hf_recipe_in_worker_processes_equals_the_in_process_run() {
    let d = temp_dir("hf-workers");
    std::fs::create_dir_all(&d).unwrap();
    let recipe = |launcher: &str, transport: &str| {
        format!(
            r#"
model policy = hf {{ path = "tests/fixtures/hf/qwen3" }}
recipe w {{
    rollout = generate(policy) {{
        prompts = jsonl {{ path = "recipes/data/add.jsonl", prompt_field = "messages", label_field = "answer", test_size = 20 }}
        samples_per_prompt = 4
        max_prompt_tokens = 32.tokens
        max_new_tokens = 4.tokens
    }}
    reward = verify(rollout) {{ kind = exact }}
    train = grpo(rollout, reward) {{ rollout_batch = 4, global_batch = 16, micro_batch = 16, lr = 1e-3 }}
    sync = weights(train -> rollout) {{ transport = {transport} }}
    eval = evaluate(rollout) {{ prompts = jsonl {{ path = "recipes/data/add.jsonl", prompt_field = "messages", label_field = "answer", split = test, test_size = 20 }}, every = 1.steps }}
    {launcher}
    stop = 2.steps
}}
"#
        )
    };
    let metrics = |dir: &Path| -> Vec<Value> {
        let mut rows = untimed(dir);
        for v in &mut rows {
            v.as_object_mut().unwrap().remove("weight_version");
        }
        rows
    };
    let mut runs = Vec::new();
    for (name, launcher, transport) in
        [("inproc", "", "local"), ("workers", "launcher = local_processes { engines = 1 }", "broadcast")]
    {
        let file = d.join(format!("{name}.miles"));
        std::fs::write(&file, recipe(launcher, transport)).unwrap();
        let out = d.join(name);
        let o = run_recipe(&file, &out, LIMIT);
        assert!(o.status.success(), "{name}: {}", text(&o));
        runs.push(out);
    }
    assert_eq!(metrics(&runs[0]), metrics(&runs[1]));
    assert_eq!(json_file(&runs[1].join("model/config.json"))["architectures"][0], "Qwen3ForCausalLM");
    assert!(runs[1].join("model/tokenizer.json").is_file());
    let _ = std::fs::remove_dir_all(&d);
}

/// A reward program that answers once and exits: the run's next write to its stdin meets a
/// closed pipe. That is the reward's fault, named with its stage and the sample (E0517), never
/// a SIGPIPE that kills the engine.
#[test]
fn a_reward_program_that_exits_early_is_named_not_a_signal() {
    let dir = common::process::temp_dir("reward-exits");
    let script = dir.join("once.py");
    std::fs::write(
        &script,
        "import json, sys\nr = json.loads(sys.stdin.readline())\n\
         print(json.dumps({\"id\": r[\"id\"], \"scores\": [0.0 for _ in r[\"samples\"]]}), flush=True)\n",
    )
    .unwrap();
    let reward = format!(
        "reward = command_reward(rollout) {{ command = [\"python3\", \"{}\"], timeout = 30.s }}",
        script.display()
    );
    let recipe =
        common::tiny::tiny_recipe("transport = local", 6, &[]).replace("reward = exact_match(rollout)", &reward);
    assert!(recipe.contains("command_reward"), "{recipe}");
    let r = dir.join("once.miles");
    std::fs::write(&r, recipe).unwrap();
    let o = run_recipe(&r, &dir.join("out"), LIMIT);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(!err.contains("killed by signal"), "{err}");
    assert!(err.contains("error[E0517]: reward `reward` failed") && err.contains("closed its stdout"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
