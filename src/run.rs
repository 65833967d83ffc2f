//! `miles run RECIPE`: trains on the embedded backend (libtorch, CPU). Compiles the recipe (or
//! reads a saved plan), maps it onto a `RunSpec`, and hands it to `miles-engine run` (the
//! executor with metrics, checkpoints and `--resume`; src/bin/miles-engine/execute.rs). Ctrl-C is
//! the engine's to handle (src/engine.rs); an interrupted run (exit 130) gets its resume command.

use crate::diagnostics::{emit, summary};
use crate::files::{write_atomic, DiskFs};
use crate::runspec::RunJob;
use crate::DiagFormat;
use miles_compiler::Options;
use std::path::PathBuf;

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum Progress {
    Auto,
    Plain,
    Off,
}

#[derive(clap::Args)]
pub struct Args {
    /// The recipe file (omit with --plan).
    #[arg(required_unless_present = "plan")]
    pub file: Option<String>,
    /// Which recipe, when the file has several.
    #[arg(long)]
    pub recipe: Option<String>,
    /// Override a field with full type checking: `--set train.lr=1e-4` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Run this many RL steps instead of the recipe's `stop` (with --resume: extend or shorten the run).
    #[arg(long)]
    pub steps: Option<u64>,
    /// Output directory: metrics.jsonl, checkpoints, the final model. Default: runs/RECIPE.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Continue from the newest checkpoint in the output directory whose files match their
    /// SHA-256s, exactly; refused, naming each field, when the spec changed more than its steps and
    /// cadences (docs/runs.md).
    #[arg(long)]
    pub resume: bool,
    /// Execute a plan saved by `miles plan --out`, exactly (refused if the recipe changed).
    #[arg(long, value_name = "PLAN.json", conflicts_with_all = ["set", "recipe"])]
    pub plan: Option<PathBuf>,
    /// CPU threads for libtorch (results are bit-exact for one thread count).
    #[arg(long)]
    pub threads: Option<usize>,
    #[arg(long, value_enum, default_value = "auto")]
    pub progress: Progress,
    /// Print the run spec the recipe maps to and exit.
    #[arg(long)]
    pub print_spec: bool,
}

pub fn run(args: Args) -> u8 {
    let (mut job, name, plan) = match &args.plan {
        Some(path) => match crate::planfile::load_for_run(path) {
            Ok((spec, name)) => (spec, name, saved_plan(path)),
            Err(code) => return code,
        },
        None => {
            let file = args.file.clone().unwrap_or_default();
            match compile_spec(&file, &args.set, args.recipe.clone()) {
                Ok(x) => x,
                Err(code) => return code,
            }
        }
    };
    if let Some(n) = args.steps {
        match &mut job {
            RunJob::Lm(s) => s.steps = n,
            RunJob::Diffusion(s) => s.rl.steps = n,
        }
    }
    if args.print_spec {
        println!("{}", serde_json::to_string_pretty(&job).unwrap_or_default());
        return 0;
    }
    if args.resume && matches!(job, RunJob::Diffusion(_)) {
        eprintln!(
            "error[E0511]: a diffusion run does not resume yet: it writes no checkpoints to resume from (its last \
             good denoiser is OUT/denoiser.safetensors)\n  help: run it again without --resume, into a new --out"
        );
        return 1;
    }
    let out = args.out.clone().unwrap_or_else(|| PathBuf::from("runs").join(&name));
    // The plan beside the metrics, before the engine starts, so `miles report` can set the
    // estimates next to what the run measured (a run killed early still has it). Not over a
    // run already there unless resuming it: the engine refuses that directory, and its plan
    // must survive the refusal.
    let holds_run = out.join("spec.json").exists() || out.join("metrics.jsonl").exists();
    if let Some(plan) = plan.filter(|_| args.resume || !holds_run) {
        let path = out.join("plan.json");
        if let Err(e) =
            std::fs::create_dir_all(&out).and_then(|_| write_atomic(&path.to_string_lossy(), plan.as_bytes()))
        {
            eprintln!("warning: cannot write {}: {e}; `miles report` will show no plan vs actual", path.display());
        }
    }
    // Training links libtorch, whose loading alone costs ~0.5 s; it runs in the sibling
    // `miles-engine` binary so that `miles check` and the other language verbs start instantly.
    let (verb, json) = match &job {
        RunJob::Lm(s) => ("run", serde_json::to_vec(s)),
        RunJob::Diffusion(s) => ("diffuse", serde_json::to_vec(s)),
    };
    let json = match json {
        Ok(j) => j,
        Err(e) => {
            eprintln!("error: cannot encode the run spec: {e}");
            return 1;
        }
    };
    let mut cmd = match crate::engine::command() {
        Ok(c) => c,
        Err(code) => return code,
    };
    cmd.arg(verb).arg("--spec").arg("-").arg("--name").arg(&name).arg("--out").arg(&out);
    if verb == "run" {
        cmd.arg("--progress").arg(match args.progress {
            Progress::Auto => "auto",
            Progress::Plain => "plain",
            Progress::Off => "off",
        });
    }
    if args.resume {
        cmd.arg("--resume");
    }
    if let Some(t) = args.threads {
        cmd.arg("--threads").arg(t.to_string());
    }
    let code = crate::engine::run_with_stdin(cmd, &json);
    if code == miles_runtime::spec::EXIT_INTERRUPTED && verb == "run" {
        let argv: Vec<String> = std::env::args().collect();
        eprintln!("  resume with: {}", resume_command(&argv, &out));
    }
    code
}

/// The command line that resumes an interrupted run: this one as typed, with `--out` (when it
/// was left to its default) and `--resume` added.
fn resume_command(argv: &[String], out: &std::path::Path) -> String {
    let mut words: Vec<String> = argv.to_vec();
    let has = |flag: &str| argv.iter().any(|a| a == flag || a.starts_with(&format!("{flag}=")));
    if !has("--out") {
        words.push("--out".into());
        words.push(out.display().to_string());
    }
    if !has("--resume") {
        words.push("--resume".into());
    }
    words.iter().map(|w| shell_word(w)).collect::<Vec<_>>().join(" ")
}

/// `w` as a POSIX shell reads it back: bare when it holds only safe characters, else in single
/// quotes.
fn shell_word(w: &str) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || "_-./=:,+@%".contains(c);
    if !w.is_empty() && w.chars().all(safe) {
        return w.to_string();
    }
    format!("'{}'", w.replace('\'', "'\\''"))
}

/// The `plan` a `miles plan --out` file holds, as `miles plan --format json` prints it.
fn saved_plan(path: &std::path::Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v.get("plan").filter(|p| p.is_object()).and_then(|p| serde_json::to_string_pretty(p).ok())
}

/// Compiles a recipe and maps it onto a run spec, rendering every diagnostic on failure; also
/// the recipe's plan as JSON (OUT/plan.json).
pub fn compile_spec(
    file: &str,
    set: &[String],
    recipe: Option<String>,
) -> Result<(RunJob, String, Option<String>), u8> {
    let overrides = crate::check::parse_sets(set).map_err(|e| {
        eprintln!("error: {e}");
        2u8
    })?;
    let c = crate::packages::compile(
        &DiskFs,
        &[file.to_string()],
        &Options { overrides, recipe, hub_cache: crate::packages::hub_cache() },
    );
    let (errors, warnings) = summary(&c.diagnostics);
    if errors > 0 || warnings > 0 {
        emit(&c.program.sources, &c.diagnostics, DiagFormat::Auto);
    }
    if errors > 0 {
        eprintln!("miles run: not started: the recipe has {errors} error(s)");
        return Err(1);
    }
    let r = crate::graph::pick_recipe(&c, file)?;
    match crate::runspec::run_job(r) {
        Ok(spec) => {
            let plan = crate::plan::make_plan(r);
            // A GPU the machine lacks stops the run here, at the recipe's line, before the engine
            // starts (the engine would refuse it too, without the line).
            let no_gpu: Vec<_> =
                plan.diagnostics.iter().filter(|d| d.code == miles_runtime::E_NO_GPU).cloned().collect();
            if !no_gpu.is_empty() {
                emit(&c.program.sources, &no_gpu, DiagFormat::Auto);
                eprintln!("miles run: not started: this machine cannot give the recipe its device");
                return Err(1);
            }
            Ok((spec, r.name.clone(), Some(crate::plan::plan_json(&c, &plan))))
        }
        Err(diags) => {
            emit(&c.program.sources, &diags, DiagFormat::Auto);
            eprintln!("miles run: not started: {} thing(s) the embedded backend cannot run", diags.len());
            Err(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::resume_command;
    use std::path::Path;

    #[test]
    fn the_resume_command_is_the_run_as_typed_with_out_and_resume() {
        let argv = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            resume_command(&argv(&["miles", "run", "recipes/x.miles", "--steps", "60"]), Path::new("runs/x")),
            "miles run recipes/x.miles --steps 60 --out runs/x --resume"
        );
        assert_eq!(
            resume_command(
                &argv(&["miles", "run", "a b.miles", "--set", "train.lr=1e-4", "--out=o", "--resume"]),
                Path::new("o")
            ),
            "miles run 'a b.miles' --set train.lr=1e-4 --out=o --resume"
        );
        assert_eq!(
            resume_command(&argv(&["miles", "run", "it's.miles"]), Path::new("o")),
            "miles run 'it'\\''s.miles' --out o --resume"
        );
    }
}
