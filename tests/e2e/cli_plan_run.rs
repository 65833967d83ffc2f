//! End to end through the built binary: `miles plan` (text, JSON, --out, --html,
//! --detailed-exitcode, --set), `miles run` (a tiny recipe, --plan, refusals) and `miles report`.

use crate::common;

use common::process::{run_miles as miles, temp_dir, text};
use std::path::Path;

/// A laptop recipe small enough to train for two steps in a second.
const TINY: &str = r#"
import std/tasks/arith
model policy = transformer { layers = 1, d_model = 32, heads = 2, vocab = arith.vocab, max_len = 16 }
recipe tiny {
    warmup  = sft(policy) { data = arith.addition { digits = 1, test_size = 20 }, steps = 5.steps, batch = 8 }
    rollout = generate(warmup) {
        prompts = arith.addition { digits = 1, test_size = 20 }
        samples_per_prompt = 4
        max_prompt_tokens = 8.tokens
        max_new_tokens = 3.tokens
    }
    reward = exact_match(rollout)
    train  = grpo(rollout, reward) { rollout_batch = 4, global_batch = 16, micro_batch = 16, lr = 1e-3 }
    sync   = weights(train -> rollout) { transport = local }
    eval   = evaluate(rollout) { prompts = arith.addition { digits = 1, split = test, test_size = 20 }, every = 1.steps, limit = 20 }
    stop   = 2.steps
}
"#;

#[test]
fn plan_writes_json_html_and_a_plan_file() {
    let d = temp_dir("plan");
    let (out, html) = (d.join("plan.json"), d.join("plan.html"));
    let o = miles(&[
        "plan",
        "recipes/glm5-agentic.miles",
        "--detailed-exitcode",
        "--out",
        out.to_str().unwrap(),
        "--html",
        html.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("Plan: 4 stages on 64 GPUs"), "{}", text(&o));
    let file: serde_json::Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    assert_eq!(file["format_version"], 1);
    assert_eq!(file["recipe"], "glm5_agentic");
    assert!(file["run_spec"].is_null(), "a cluster recipe has no embedded run spec");
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("<svg") && page.contains("glm5_agentic"));

    let json = miles(&["plan", "recipes/glm5-agentic.miles", "--format", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).expect("plan JSON");
    assert_eq!(v["format_version"], 2);
    // Findings are located as `check --format json` locates them.
    let o = miles(&["plan", "recipes/glm5-agentic.miles", "--set", "train.optimizer.state=on_gpu", "--format", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("plan JSON");
    let d = &v["diagnostics"][0];
    let at = &d["primary"]["location"];
    assert!(d["code"].is_string() && at["file"].is_string() && at["line"].is_u64(), "{d}");
}

#[test]
fn plan_exit_codes_follow_the_findings() {
    // Optimizer state in HBM does not fit: an error, exit 1, with the fix named.
    let o =
        miles(&["plan", "recipes/glm5-agentic.miles", "--set", "train.optimizer.state=on_gpu", "--detailed-exitcode"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("E0401") && text(&o).contains("stream_from_disk"), "{}", text(&o));
    // More samples in flight per engine than its KV cache holds (fully_async keeps
    // max_concurrent in flight over the engines): a warning, exit 2 with --detailed-exitcode.
    let o = miles(&[
        "plan",
        "recipes/glm5-agentic.miles",
        "--set",
        "rollout.engine.max_concurrent=500",
        "--set",
        "schedule.max_concurrent=2000",
        "--detailed-exitcode",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let o = miles(&["plan", "recipes/glm5-agentic.miles", "--set", "rollout.engine.max_concurrent=500"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    // A recipe error stops before planning.
    let o = miles(&["plan", "recipes/glm5-agentic.miles", "--set", "train.backend.tp=3"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("E0301"), "{}", text(&o));
}

#[test]
fn run_trains_and_a_saved_plan_runs_exactly() {
    let d = temp_dir("run");
    let recipe = d.join("tiny.miles");
    std::fs::write(&recipe, TINY).unwrap();
    let r = recipe.to_str().unwrap();

    let run_dir = d.join("run");
    let o = miles(&["run", r, "--out", run_dir.to_str().unwrap(), "--progress", "plain", "--threads", "1"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let metrics = std::fs::read_to_string(run_dir.join("metrics.jsonl")).unwrap();
    assert!(metrics.lines().any(|l| l.contains("\"step\":2") && l.contains("train/loss")), "{metrics}");

    // The plan file carries the run spec; running it gives the same metrics as the recipe.
    let plan = d.join("plan.json");
    let o = miles(&["plan", r, "--out", plan.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let planned_dir = d.join("planned");
    let o = miles(&[
        "run",
        "--plan",
        plan.to_str().unwrap(),
        "--out",
        planned_dir.to_str().unwrap(),
        "--progress",
        "off",
        "--threads",
        "1",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let strip = |s: &str| -> Vec<String> {
        // Timing figures differ between runs; everything else must not.
        s.lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                let m: serde_json::Map<String, serde_json::Value> = v
                    .as_object()
                    .unwrap()
                    .iter()
                    .filter(|(k, _)| !k.starts_with("perf/"))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                serde_json::Value::Object(m).to_string()
            })
            .collect()
    };
    let planned = std::fs::read_to_string(planned_dir.join("metrics.jsonl")).unwrap();
    assert_eq!(strip(&metrics), strip(&planned));

    // Change the recipe after planning: the plan is refused.
    std::fs::write(&recipe, TINY.replace("lr = 1e-3", "lr = 2e-3")).unwrap();
    let o = miles(&["run", "--plan", plan.to_str().unwrap(), "--out", d.join("stale").to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("E0512"), "{}", text(&o));

    // The report draws the curves of the first run.
    let o = miles(&["report", run_dir.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(Path::new(&run_dir.join("report/eval_accuracy.svg")).exists(), "{}", text(&o));
    std::fs::remove_dir_all(&d).ok();
}

#[test]
fn run_refuses_what_the_embedded_backend_cannot_do_all_at_once() {
    let o = miles(&["run", "recipes/glm5-agentic.miles"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let t = text(&o);
    for what in ["sglang", "megatron"] {
        assert!(t.contains(what), "missing {what}: {t}");
    }
    assert!(t.contains("E0511"));
}

#[test]
fn the_run_spec_carries_the_recipes_stage_names() {
    let d = temp_dir("names");
    let recipe = d.join("named.miles");
    std::fs::write(
        &recipe,
        TINY.replace("train  = grpo", "learner = grpo").replace("weights(train ->", "weights(learner ->"),
    )
    .unwrap();
    let plan = d.join("plan.json");
    let o = miles(&["plan", recipe.to_str().unwrap(), "--out", plan.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&plan).unwrap()).unwrap();
    let stages = &v["run_spec"]["stages"];
    assert_eq!(
        (&stages["rollout"], &stages["train"], &stages["eval"]),
        (&"rollout".into(), &"learner".into(), &"eval".into())
    );
    std::fs::remove_dir_all(&d).ok();
}

fn metrics_rows(dir: &Path) -> Vec<serde_json::Value> {
    common::metrics::rows(dir)
}

/// recipes/agent-laptop.miles as users run it: checked, planned with its episodes, and a few steps
/// of calculator episodes trained, with the episode metrics written.
#[test]
fn the_agent_recipe_checks_plans_and_runs() {
    let recipe = "recipes/agent-laptop.miles";
    let o = miles(&["check", recipe]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = miles(&["plan", recipe]);
    let t = text(&o);
    assert!(
        t.contains("Episodes (calculator environment)")
            && t.contains(
                "up to 2 turns (max_turns 3; a third does not fit the model's 64-token context) x 28 sampled tokens"
            ),
        "{t}"
    );
    let d = temp_dir("agent");
    let out = d.join("run");
    let o = miles(&[
        "run",
        recipe,
        "--out",
        out.to_str().unwrap(),
        "--threads",
        "1",
        "--set",
        "warmup.steps=20.steps",
        "--set",
        "stop=2.steps",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        text(&o).contains("(solved: episode reward >= 1 (env_reward.solved_at)); last reward"),
        "the done line names the success rule: {}",
        text(&o)
    );
    let rows = metrics_rows(&out);
    let last = rows.last().unwrap();
    for k in ["rollout/tool_use_rate", "rollout/turns", "tito/retokenize_mismatch", "rollout/episode_end/done"] {
        assert!(last.get(k).is_some(), "{k} missing: {last}");
    }
    assert!(rows.iter().any(|r| r.get("sft/loss").is_some()), "the warm-up trained on demonstrations");
    assert!(out.join("model/model.safetensors").exists());
    std::fs::remove_dir_all(&d).ok();
}

/// The agent recipe with compaction and the branching rule set from the command line: the plan
/// models the compaction, the run spec carries both to the runtime, and a short run under
/// fully_async trains on its episodes.
#[test]
fn a_compacting_agent_recipe_plans_and_runs_under_fully_async() {
    let recipe = "recipes/agent-laptop.miles";
    let sets = [
        "--set",
        "reward.compact=compaction { keep_turns = 1 }",
        "--set",
        "rollout.session=tito { rule = branching }",
        "--set",
        "schedule=fully_async { max_staleness = 1 }",
    ];
    let d = temp_dir("compact");
    let plan = d.join("plan.json");
    let mut args = vec!["plan", recipe, "--out", plan.to_str().unwrap()];
    args.extend(sets);
    let o = miles(&args);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert!(t.contains("1 compaction(s) per episode"), "{t}");
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&plan).unwrap()).unwrap();
    let env = &v["run_spec"]["env"];
    assert_eq!((&env["session"], &env["compact_keep_turns"]), (&"branching".into(), &1.into()), "{env}");
    // Under the linear rule, compaction is refused before anything runs.
    let o = miles(&["check", recipe, "--set", "reward.compact=compaction {}"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("needs a branching TITO session"), "{}", text(&o));
    let out = d.join("run");
    let mut args = vec!["run", recipe, "--out", out.to_str().unwrap(), "--threads", "1"];
    args.extend(sets);
    args.extend(["--set", "warmup.steps=20.steps", "--set", "stop=2.steps"]);
    let o = miles(&args);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let rows = metrics_rows(&out);
    let last = rows.iter().rev().find(|r| r.get("train/loss").is_some()).unwrap();
    for k in ["rollout/compactions", "rollout/turns", "rollout/fully_async/weight_swaps"] {
        assert!(last.get(k).is_some(), "{k} missing: {last}");
    }
    std::fs::remove_dir_all(&d).ok();
}

/// An environment written in Python (tests/fixtures/envs/guess_env.py, JSON lines) drives a run:
/// every episode is reset and stepped by the program, none ends by an environment fault.
#[test]
fn a_python_environment_drives_a_run_end_to_end() {
    let d = temp_dir("pyenv");
    let script = std::fs::canonicalize("tests/fixtures/envs/guess_env.py").unwrap();
    let recipe = d.join("guess.miles");
    std::fs::write(
        &recipe,
        format!(
            r#"
import std/tasks/arith
model policy = transformer {{ layers = 1, d_model = 32, heads = 2, vocab = 64, max_len = 48 }}
recipe guess {{
    rollout = generate(policy) {{
        prompts = arith.multiplication {{ digits = 1, test_size = 20 }}
        samples_per_prompt = 4
        max_prompt_tokens = 8.tokens
        max_new_tokens = 6.tokens
    }}
    reward = env_reward(rollout) {{
        env = command_env {{ command = ["python3", "{}"] }}
        max_turns = 3
        concurrency = 4
        turn_timeout = 20.s
    }}
    train  = grpo(rollout, reward) {{ rollout_batch = 4, global_batch = 16, micro_batch = 16, lr = 1e-3 }}
    sync   = weights(train -> rollout) {{ transport = local }}
    eval   = evaluate(rollout) {{ prompts = arith.multiplication {{ digits = 1, split = test, test_size = 20 }}, every = 1.steps, limit = 20 }}
    stop   = 2.steps
}}
"#,
            script.display()
        ),
    )
    .unwrap();
    let o = miles(&["check", recipe.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let out = d.join("run");
    let o = miles(&["run", recipe.to_str().unwrap(), "--out", out.to_str().unwrap(), "--threads", "1"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let rows = metrics_rows(&out);
    let last = rows.last().unwrap();
    let ends: f64 = last
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| k.starts_with("rollout/episode_end/"))
        .map(|(_, v)| v.as_f64().unwrap())
        .sum();
    assert_eq!(ends, 16.0, "4 questions x 4 episodes, each ended for a reason: {last}");
    // The program served every reset and step: no episode ended by an environment fault.
    let faults: Vec<&String> = last.as_object().unwrap().keys().filter(|k| k.contains("episode_end/env_")).collect();
    assert!(faults.is_empty(), "{faults:?}: {last}");
    assert!(last["rollout/turns"].as_f64().unwrap() >= 1.0, "{last}");
    std::fs::remove_dir_all(&d).ok();
}
