//! `export-prompts SPEC.json OUT.json`: the problems a miles run with this spec trains on, in
//! order, drawn by miles' own task code (not a re-implementation of its RNG), so the peer trains
//! on exactly the same prompts.
//!
//! OUT.json: {"tokenizer": {"chars": [...]}, "sft": [[{prompt,label}] per SFT step],
//! "rollout": [[{prompt,label}] per RL step 1..=steps], "test": [{prompt,label}]}

use miles_runtime::tasks::{PromptRow, TaskSet};
use miles_runtime::tokenize::Tokenizer;
use miles_runtime::RunSpec;
use serde_json::{json, Value};

/// A built-in task's rows: string prompts and string labels (as `PromptRow::text` makes them).
fn items(v: &[PromptRow]) -> Value {
    Value::Array(v.iter().map(|it| json!({"prompt": it.prompt.to_json(), "label": it.label})).collect())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 3 {
        eprintln!("usage: export-prompts SPEC.json OUT.json");
        std::process::exit(2);
    }
    let text = std::fs::read_to_string(&args[1]).unwrap_or_else(|e| panic!("cannot read {}: {e}", args[1]));
    let spec = RunSpec::from_json(&text).unwrap_or_else(|e| panic!("{e}"));
    let task = TaskSet::build(&spec.task).unwrap_or_else(|e| panic!("{e}"));
    // The same calls as miles_runtime::exec: SFT step k (0-based) draws ("sft", k); RL step s
    // (1-based) draws ("rollout", s).
    let sft: Vec<Value> = match &spec.sft {
        Some(s) => (0..s.steps).map(|k| items(&task.train_batch(spec.seed, "sft", k, s.batch))).collect(),
        None => Vec::new(),
    };
    let rollout: Vec<Value> = (1..=spec.steps)
        .map(|s| items(&task.train_batch(spec.seed, "rollout", s, spec.rollout.rollout_batch)))
        .collect();
    let out = json!({
        "tokenizer": match &task.tokenizer {
            Tokenizer::Char(t) => serde_json::to_value(t).expect("tokenizer serialises"),
            Tokenizer::Hf(_) => panic!("export-prompts: the TRL script mirrors only the character tokenizer"),
        },
        "sft": sft,
        "rollout": rollout,
        "test": items(&task.test),
    });
    std::fs::write(&args[2], serde_json::to_string(&out).expect("json")).unwrap_or_else(|e| panic!("{e}"));
}
