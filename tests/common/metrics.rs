//! A run directory's metrics.jsonl as the end-to-end tests read it.

use serde_json::Value;
use std::path::Path;

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
