//! The saved plan (`miles plan --out plan.json`): the resolved recipe and its plan, which
//! `miles run --plan plan.json` executes exactly, and refuses if the recipe changed since. A
//! change is a change of the compiled recipe (its fingerprint), not of its bytes: a comment or a
//! reformatting changes nothing a run does.

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
    /// How the recipe was compiled, so a run can compile it again; absent in plans made before
    /// (their sources' bytes are compared instead).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compiled_from: Option<CompiledFrom>,
    /// The compiled recipe's fingerprint (`fingerprint`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<String>,
}

/// The `miles plan` arguments that chose and compiled the recipe.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct CompiledFrom {
    pub file: String,
    /// `--set KEY=VALUE` overrides, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub set: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recipe: Option<String>,
}

/// A fingerprint of what a compiled recipe means: the planner's input and the run spec, with
/// every source span left out (a span moves when a comment is added above it; the value it
/// locates does not). FNV-1a 64 in hex, like the sources' hashes.
pub fn fingerprint(recipe: &miles_compiler::CompiledRecipe) -> String {
    let mut plan = serde_json::to_value(miles_plan::plan_input(recipe)).unwrap_or(serde_json::Value::Null);
    strip_spans(&mut plan);
    let run = crate::runspec::run_job(recipe).ok().and_then(|j| serde_json::to_value(j).ok());
    fnv1a64(serde_json::json!({ "plan_input": plan, "run": run }).to_string().as_bytes())
}

/// Removes every `span` key; a spanned value left as `{"value": x}` becomes `x`, as an unspanned
/// one is written.
fn strip_spans(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(m) => {
            m.remove("span");
            m.values_mut().for_each(strip_spans);
            if m.len() == 1 {
                if let Some(inner) = m.remove("value") {
                    *v = inner;
                }
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(strip_spans),
        _ => {}
    }
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
        from: CompiledFrom,
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
            compiled_from: Some(from),
            fingerprint: Some(fingerprint(recipe)),
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

/// Compiles the recipe again as the plan did: an error if it no longer compiles or means
/// something else now.
fn unchanged(from: &CompiledFrom, name: &str, planned: &str) -> Result<(), String> {
    let overrides = crate::check::parse_sets(&from.set)?;
    let opts =
        miles_compiler::Options { overrides, recipe: from.recipe.clone(), hub_cache: crate::packages::hub_cache() };
    let c = crate::packages::compile(&crate::files::DiskFs, std::slice::from_ref(&from.file), &opts);
    let errors = c.diagnostics.iter().filter(|d| d.is_error()).count();
    if errors > 0 {
        return Err(format!(
            "{} no longer compiles ({errors} error(s)); `miles check {}` shows them",
            from.file, from.file
        ));
    }
    let Some(recipe) = c.recipes.iter().find(|r| r.name == name) else {
        return Err(format!("{} no longer has the recipe `{name}`", from.file));
    };
    if fingerprint(recipe) != planned {
        return Err(format!(
            "recipe `{name}` changed since the plan was made: compiled from {} it now means something else (comments and formatting do not count)",
            from.file
        ));
    }
    Ok(())
}

/// The byte-for-byte comparison of the sources, for plans made before fingerprints.
fn unchanged_bytes(sources: &[SourceHash]) -> Result<(), String> {
    for s in sources {
        let now = if s.path.starts_with("std/") {
            miles_compiler::program::stdlib_source(&s.path).map(|t| fnv1a64(t.as_bytes()))
        } else {
            std::fs::read(&s.path).ok().map(|b| fnv1a64(&b))
        };
        if now.as_deref() != Some(s.fnv1a64.as_str()) {
            return Err(format!("{} changed since the plan was made", s.path));
        }
    }
    Ok(())
}

/// Reads a saved plan for `miles run --plan`: refuses it when a source changed since planning.
pub fn load_for_run(path: &std::path::Path) -> Result<(crate::runspec::RunJob, String), u8> {
    let refuse = |msg: String| -> u8 {
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
    match (&file.compiled_from, &file.fingerprint) {
        (Some(from), Some(planned)) => unchanged(from, &file.recipe, planned).map_err(refuse)?,
        // A plan made before fingerprints: its sources' bytes.
        _ => unchanged_bytes(&file.sources).map_err(refuse)?,
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

#[cfg(test)]
mod tests {
    use super::*;

    const RECIPE: &str = r#"
import std/tasks/arith
model policy = transformer { layers = 1, d_model = 32, heads = 2, vocab = arith.vocab, max_len = 16 }
recipe tiny {
    rollout = generate(policy) { prompts = arith.addition { digits = 1, test_size = 20 }, samples_per_prompt = 4, max_new_tokens = 3.tokens }
    reward  = exact_match(rollout)
    train   = grpo(rollout, reward) { rollout_batch = 4, global_batch = 16, micro_batch = 16, lr = 1e-3 }
    sync    = weights(train -> rollout) { transport = local }
    stop    = 2.steps
}
"#;

    /// Plans `text` as `miles plan FILE --out` does, then writes `edited` over the recipe and
    /// asks whether `miles run --plan` accepts the plan.
    fn plan_then_edit(name: &str, text: &str, edited: &str) -> Result<(), u8> {
        let dir = std::env::temp_dir().join(format!("miles-planfile-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("r.miles").to_string_lossy().into_owned();
        std::fs::write(&file, text).unwrap();
        let c = crate::packages::compile(&crate::files::DiskFs, std::slice::from_ref(&file), &Default::default());
        assert!(!c.has_errors(), "{:#?}", c.diagnostics);
        let recipe = &c.recipes[0];
        let from = CompiledFrom { file: file.clone(), set: Vec::new(), recipe: None };
        let plan_file = PlanFile::new(&c, recipe, &miles_plan::plan(&miles_plan::plan_input(recipe)), from);
        let path = dir.join("plan.json");
        std::fs::write(&path, serde_json::to_vec(&plan_file).unwrap()).unwrap();
        std::fs::write(&file, edited).unwrap();
        let got = load_for_run(&path).map(|_| ());
        std::fs::remove_dir_all(&dir).ok();
        got
    }

    /// Issue #42: a comment made a saved plan "changed since the plan was made" (E0512).
    #[test]
    fn comments_and_formatting_do_not_stale_a_plan() {
        let edited = format!(
            "// A comment above everything.\n{}",
            RECIPE.replace("stop    = 2.steps", "/// The run's length.\n    stop = 2.steps   // two steps")
        );
        assert_eq!(plan_then_edit("comment", RECIPE, &edited), Ok(()));
    }

    #[test]
    fn a_changed_meaning_stales_a_plan() {
        assert_eq!(plan_then_edit("lr", RECIPE, &RECIPE.replace("lr = 1e-3", "lr = 2e-3")), Err(1));
        // A planning assumption is a change too: the plan would say something else.
        let means =
            RECIPE.replace("max_new_tokens = 3.tokens", "max_new_tokens = 3.tokens, mean_response_tokens = 2.tokens");
        assert_eq!(plan_then_edit("mean", RECIPE, &means), Err(1));
        // A recipe that no longer compiles.
        assert_eq!(plan_then_edit("broken", RECIPE, &RECIPE.replace("lr = 1e-3", "lr = oops")), Err(1));
    }
}
