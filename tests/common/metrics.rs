//! A run directory's metrics.jsonl, and its other JSON files (spec.json, model/config.json), as the
//! end-to-end tests read them.

use serde_json::Value;
use std::path::Path;

/// A JSON file's value.
pub fn json_file(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every row of `out/metrics.jsonl`.
pub fn rows(out: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
    text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// The rows without their timings (`perf/*`): what two runs of the same spec share exactly.
pub fn without_perf(rows: Vec<Value>) -> Vec<Value> {
    rows.into_iter()
        .map(|mut v| {
            if let Some(o) = v.as_object_mut() {
                o.retain(|k, _| !k.starts_with("perf/"));
            }
            v
        })
        .collect()
}

/// `rows(out)` without timings.
pub fn untimed(out: &Path) -> Vec<Value> {
    without_perf(rows(out))
}

/// Steps that trained (a row with trained tokens), in order.
pub fn trained_steps(out: &Path) -> Vec<u64> {
    untimed(out).iter().filter_map(|v| v["train/tokens"].as_u64().and(v["step"].as_u64())).collect()
}

/// The prompt ledger of an asynchronous run's newest checkpoint (`async.json`'s source): every
/// prompt served is trained, discarded with its reason, or waiting.
pub fn prompt_ledger(out: &Path) -> miles_runtime::source::SourceState {
    let mut ckpts: Vec<std::path::PathBuf> = std::fs::read_dir(out.join("checkpoints"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("async.json").exists())
        .collect();
    ckpts.sort();
    let p = ckpts.pop().unwrap_or_else(|| panic!("no asynchronous checkpoint in {}", out.display()));
    let v: Value = serde_json::from_str(&std::fs::read_to_string(p.join("async.json")).unwrap()).unwrap();
    serde_json::from_value(v["source"].clone()).unwrap()
}
