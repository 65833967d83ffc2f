//! The saved plan (`miles plan --out plan.json`): the resolved recipe and its plan, which
//! `miles run --plan plan.json` executes exactly, and refuses if the recipe changed since.

use serde::{Deserialize, Serialize};

pub const PLAN_FILE_VERSION: u32 = 1;

#[derive(Serialize, Deserialize)]
pub struct PlanFile {
    pub format_version: u32,
    pub recipe: String,
    /// Every source file the recipe was compiled from, with a hash of its text, so a run can tell
    /// that the recipe changed after planning.
    pub sources: Vec<SourceHash>,
    /// The lowered stage graph (as `miles graph --format json` prints it).
    pub graph: serde_json::Value,
    /// The plan (as `miles plan --format json` prints it).
    pub plan: serde_json::Value,
}

#[derive(Serialize, Deserialize, PartialEq, Debug)]
pub struct SourceHash {
    pub path: String,
    pub fnv1a64: String,
}

/// FNV-1a, 64-bit: a stable content hash without another dependency (not for security).
pub fn fnv1a64(bytes: &[u8]) -> String {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x100000001b3);
    }
    format!("{h:016x}")
}

impl PlanFile {
    pub fn new(
        c: &miles_compiler::Compilation,
        recipe: &miles_compiler::CompiledRecipe,
        plan: &miles_plan::Plan,
    ) -> PlanFile {
        let sources = c
            .program
            .sources
            .files
            .iter()
            .filter(|f| !f.path.starts_with("--set "))
            .map(|f| SourceHash { path: f.path.clone(), fnv1a64: fnv1a64(f.text.as_bytes()) })
            .collect();
        PlanFile {
            format_version: PLAN_FILE_VERSION,
            recipe: recipe.name.clone(),
            sources,
            graph: recipe.graph.to_json(),
            plan: serde_json::from_str(&miles_plan::render_json(plan)).unwrap_or(serde_json::Value::Null),
        }
    }
}
