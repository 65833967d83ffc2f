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
    /// What `miles run --plan` executes on the embedded backend; absent for a recipe that only a
    /// cluster can run.
    #[serde(default)]
    pub run_spec: Option<miles_runtime::spec::RunSpec>,
    /// What `miles run --plan` executes for a diffusion recipe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diffusion_spec: Option<miles_runtime::diffusion::DiffusionRunSpec>,
}

#[derive(Serialize, Deserialize, PartialEq, Debug)]
pub struct SourceHash {
    pub path: String,
    pub fnv1a64: String,
}

/// A source's hash as the plan file records it: FNV-1a 64 (`miles_compiler::fs::fnv1a64`) in hex.
pub fn fnv1a64(bytes: &[u8]) -> String {
    format!("{:016x}", miles_compiler::fs::fnv1a64([bytes]))
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
            run_spec: None,
            diffusion_spec: None,
        }
        .with_job(crate::runspec::run_job(recipe).ok())
    }

    fn with_job(mut self, job: Option<crate::runspec::RunJob>) -> PlanFile {
        match job {
            Some(crate::runspec::RunJob::Lm(s)) => self.run_spec = Some(*s),
            Some(crate::runspec::RunJob::Diffusion(s)) => self.diffusion_spec = Some(*s),
            None => {}
        }
        self
    }
}

/// Reads a saved plan for `miles run --plan`: refuses it when a source changed since planning.
pub fn load_for_run(path: &std::path::Path) -> Result<(crate::runspec::RunJob, String), u8> {
    let refuse = |msg: String| {
        eprintln!("error[E0512]: {msg}\n  help: plan again: miles plan RECIPE --out {}", path.display());
        1u8
    };
    let text = std::fs::read_to_string(path).map_err(|e| refuse(format!("cannot read {}: {e}", path.display())))?;
    let file: PlanFile =
        serde_json::from_str(&text).map_err(|e| refuse(format!("{} is not a miles plan: {e}", path.display())))?;
    if file.format_version != PLAN_FILE_VERSION {
        return Err(refuse(format!(
            "{} has plan format {}, this miles reads {PLAN_FILE_VERSION}",
            path.display(),
            file.format_version
        )));
    }
    for s in &file.sources {
        let now = if s.path.starts_with("std/") {
            miles_compiler::program::stdlib_source(&s.path).map(|t| fnv1a64(t.as_bytes()))
        } else {
            std::fs::read(&s.path).ok().map(|b| fnv1a64(&b))
        };
        if now.as_deref() != Some(s.fnv1a64.as_str()) {
            return Err(refuse(format!("{} changed since the plan was made", s.path)));
        }
    }
    match (file.run_spec, file.diffusion_spec) {
        (Some(spec), _) => Ok((crate::runspec::RunJob::Lm(Box::new(spec)), file.recipe)),
        (None, Some(spec)) => Ok((crate::runspec::RunJob::Diffusion(Box::new(spec)), file.recipe)),
        (None, None) => Err(refuse(format!(
            "recipe `{}` was planned for a cluster; the embedded backend cannot run it",
            file.recipe
        ))),
    }
}
