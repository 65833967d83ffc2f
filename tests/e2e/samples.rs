//! samples.jsonl end to end (docs/runs.md, "Samples"): a recipe's `samples` stage and the default
//! a recipe without one gets, single responses and calculator episodes, resumed without
//! duplicates, and `miles report`'s page and text lines.

use crate::common;

use common::process::{run_miles as miles, run_recipe, temp_dir, text};
use common::tiny::tiny_recipe;
use serde_json::Value;
use std::path::Path;
use std::time::Duration;

fn rows(out: &Path) -> Vec<Value> {
    let t = std::fs::read_to_string(out.join("samples.jsonl")).expect("samples.jsonl");
    t.lines().map(|l| serde_json::from_str(l).expect("one JSON object per line")).collect()
}

fn steps(rows: &[Value]) -> Vec<u64> {
    rows.iter().map(|r| r["step"].as_u64().unwrap()).collect()
}

/// The tiny recipe with `samples(rollout) { every = 1.steps, count = 3 }`, 2 steps: three rows a
/// step with the prompt, response, reward, advantage, finish and weight version; a resume of the
/// same run repeats its last step without a duplicate; `miles report` shows them in
/// report/samples.html and names the file in its text. Then the agent recipe, which has no
/// samples stage: its episodes are sampled by default, transcripts and all.
#[test]
fn samples_jsonl_is_written_and_shown_by_the_report() {
    let d = temp_dir("samples");
    let recipe = d.join("tiny.miles");
    let src = tiny_recipe(
        "transport = local",
        2,
        &["save = checkpoint(train) { every = 1.steps }", "show = samples(rollout) { every = 1.steps, count = 3 }"],
    );
    std::fs::write(&recipe, src).unwrap();
    let out = d.join("run");
    let o = run_recipe(&recipe, &out, Duration::from_secs(300));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let r = rows(&out);
    assert_eq!(steps(&r), vec![1, 1, 1, 2, 2, 2], "{r:?}");
    for row in &r {
        assert!(row["prompt"]["text"].as_str().unwrap().ends_with('='), "an addition prompt: {row}");
        assert!(!row["prompt"]["ids"].as_array().unwrap().is_empty());
        assert!(row["response"]["ids"].as_array().is_some() && row["response"]["text"].is_string(), "{row}");
        assert!(row["reward"].is_number() && row["advantage"].is_number(), "{row}");
        assert!(row["finish"] == "stop" || row["finish"] == "length", "{row}");
        assert!(row["weight_version"].is_u64() && row.get("episode").is_none(), "{row}");
    }
    assert_ne!(r[0]["group"], r[1]["group"], "one sample of each prompt first");

    // Resume the finished run for one more step: steps 1 and 2 are kept once, step 3 appended.
    let o = miles(&[
        "run",
        recipe.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--threads",
        "1",
        "--progress",
        "off",
        "--resume",
        "--steps",
        "3",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(steps(&rows(&out)), vec![1, 1, 1, 2, 2, 2, 3, 3, 3]);

    let o = miles(&["report", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("samples.jsonl: 9 samples shown of 3 steps (report/samples.html)"), "{}", text(&o));
    let html = std::fs::read_to_string(out.join("report/samples.html")).unwrap();
    let id = r[0]["id"].as_str().unwrap();
    assert!(html.contains(&format!("<details><summary>{id}")), "{html}");
    assert!(html.contains("<h3>step 3</h3>") && html.contains("<h4>response</h4>"), "{html}");

    // The agent recipe names no samples stage: samples at step 1 and the last, 4 each.
    let agent = d.join("agent");
    let o = miles(&[
        "run",
        "recipes/agent-laptop.miles",
        "--out",
        agent.to_str().unwrap(),
        "--threads",
        "1",
        "--progress",
        "off",
        "--set",
        "warmup.steps=20.steps",
        "--set",
        "stop=2.steps",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let r = rows(&agent);
    assert_eq!(steps(&r), vec![1, 1, 1, 1, 2, 2, 2, 2], "{r:?}");
    for row in &r {
        let e = &row["episode"];
        assert!(e["end"].is_string() && e["chains"].as_u64() >= Some(1), "{row}");
        let turns = e["transcript"].as_array().unwrap();
        assert!(!turns.is_empty() && turns[0]["role"] == "assistant", "{row}");
        assert!(turns[0]["tool_calls"].is_array(), "{row}");
        assert!(row["id"].as_str().unwrap().contains("/e"), "an episode's id: {row}");
    }
    std::fs::remove_dir_all(&d).ok();
}
