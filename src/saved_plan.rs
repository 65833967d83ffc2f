//! The plan `miles run` saves beside a run (OUT/plan.json), read back by `miles report` (plan vs
//! actual) and by `miles-engine` (an out-of-memory error set beside the plan's estimate). One file
//! compiled into both binaries.

use std::path::Path;

/// The plan `miles run` saved in a run directory; none for runs made before it did.
pub fn load_plan(dir: &Path) -> Result<Option<serde_json::Value>, String> {
    let path = dir.join("plan.json");
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{} is not valid JSON: {e}", path.display()))?;
    // A `miles plan --out` file nests the plan under `plan`; accept either shape.
    let plan = match v.get("plan") {
        Some(p) if p.is_object() => p.clone(),
        _ => v,
    };
    if !plan.is_object() || plan.get("format_version").is_none() {
        return Err(format!("{} is not a miles plan (no `format_version`)", path.display()));
    }
    Ok(Some(plan))
}
