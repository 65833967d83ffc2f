//! `miles run RECIPE`: trains on the embedded backend (libtorch, CPU). Compiles the recipe (or
//! reads a saved plan), maps it onto a `RunSpec`, and runs the synchronous executor with
//! metrics, checkpoints and `--resume`.

use crate::diagnostics::{emit, summary};
use crate::files::DiskFs;
use crate::DiagFormat;
use miles_compiler::{compile, Options};
use miles_runtime::spec::{ProgressMode, RunOptions, RunSpec};
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
    /// Run this many RL steps instead of the recipe's `stop`.
    #[arg(long)]
    pub steps: Option<u64>,
    /// Output directory: metrics.jsonl, checkpoints, the final model. Default: runs/RECIPE.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Continue from the newest checkpoint in the output directory, exactly.
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
    let (mut spec, name) = match &args.plan {
        Some(path) => match crate::planfile::load_for_run(path) {
            Ok(x) => x,
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
        spec.steps = n;
    }
    if args.print_spec {
        println!("{}", serde_json::to_string_pretty(&spec).unwrap_or_default());
        return 0;
    }
    let out = args.out.clone().unwrap_or_else(|| PathBuf::from("runs").join(&name));
    let mut opts = RunOptions::new(out.clone());
    opts.resume = args.resume;
    opts.threads = args.threads;
    opts.progress = match args.progress {
        Progress::Auto => ProgressMode::Auto,
        Progress::Plain => ProgressMode::Plain,
        Progress::Off => ProgressMode::Off,
    };
    let result = match &spec.distributed {
        None => {
            eprintln!(
                "miles run: {name}: {} RL steps on the embedded backend; output in {}",
                spec.steps,
                out.display()
            );
            miles_tch::run(&spec, &opts)
        }
        Some(d) if !d.engine_urls.is_empty() => {
            eprintln!(
                "miles run: {name}: {} RL steps, trainer here, rollout on SGLang-compatible server(s) {}; output in {}",
                spec.steps,
                d.engine_urls.join(", "),
                out.display()
            );
            crate::dist::run(&spec, &opts)
        }
        Some(d) => {
            eprintln!(
                "miles run: {name}: {} RL steps, trainer and {} rollout engine(s) as worker processes ({:?} launcher, {} transport); output in {}",
                spec.steps,
                d.rollout_workers,
                d.launcher,
                d.transport,
                out.display()
            );
            crate::dist::run(&spec, &opts)
        }
    };
    match result {
        Ok(s) => {
            let pct = |x: Option<f64>| x.map(|v| format!("{:.1}%", 100.0 * v)).unwrap_or_else(|| "-".into());
            eprintln!(
                "miles run: done: {} steps in {:.1} s; held-out accuracy {} -> {}; last reward {}; metrics in {}",
                s.steps_done,
                s.wall_seconds,
                pct(s.eval_start),
                pct(s.eval_end),
                s.last_reward.map(|r| format!("{r:.3}")).unwrap_or_else(|| "-".into()),
                s.metrics_path.display()
            );
            0
        }
        Err(e) => {
            eprintln!("{e}");
            1
        }
    }
}

/// Compiles a recipe and maps it onto a run spec, rendering every diagnostic on failure.
pub fn compile_spec(file: &str, set: &[String], recipe: Option<String>) -> Result<(RunSpec, String), u8> {
    let overrides = crate::check::parse_sets(set).map_err(|e| {
        eprintln!("error: {e}");
        2u8
    })?;
    let c = compile(&DiskFs, &[file.to_string()], &Options { overrides, recipe });
    let (errors, warnings) = summary(&c.diagnostics);
    if errors > 0 || warnings > 0 {
        emit(&c.program.sources, &c.diagnostics, DiagFormat::Auto);
    }
    if errors > 0 {
        eprintln!("miles run: not started: the recipe has {errors} error(s)");
        return Err(1);
    }
    let r = crate::graph::pick_recipe(&c, file)?;
    match crate::runspec::run_spec(r) {
        Ok(spec) => Ok((spec, r.name.clone())),
        Err(diags) => {
            emit(&c.program.sources, &diags, DiagFormat::Auto);
            eprintln!("miles run: not started: {} thing(s) the embedded backend cannot run", diags.len());
            Err(1)
        }
    }
}
