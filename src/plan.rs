//! `miles plan FILE`: a dry run. Where each stage runs, memory per rank item by item, weight-sync
//! and step time, batch arithmetic, and every infeasibility, before a GPU is allocated.

use crate::diagnostics::{emit, summary};
use crate::files::{write_atomic, DiskFs};
use crate::DiagFormat;
use miles_compiler::Options;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PlanFormat {
    Text,
    Json,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum GraphFormat {
    Mermaid,
    Dot,
}

#[derive(clap::Args)]
pub struct Args {
    pub file: String,
    /// Which recipe, when the file has several.
    #[arg(long)]
    pub recipe: Option<String>,
    /// Override a field with full type checking: `--set train.backend.tp=4` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    #[arg(long, value_enum, default_value = "text")]
    pub format: PlanFormat,
    /// Write the plan (with the resolved recipe) to a file that `miles run --plan` executes exactly.
    #[arg(long, value_name = "PATH")]
    pub out: Option<String>,
    /// Also print the stage graph.
    #[arg(long, value_enum)]
    pub graph: Option<GraphFormat>,
    /// Write a self-contained HTML page drawing the GPU map and the stage graph.
    #[arg(long, value_name = "PATH")]
    pub html: Option<String>,
    /// Exit 0 when the plan is clean, 1 on errors, 2 when it only has warnings.
    #[arg(long)]
    pub detailed_exitcode: bool,
    /// Plan again whenever the recipe or a module it imports changes (Ctrl-C to stop).
    #[arg(long)]
    pub watch: bool,
}

pub fn run(args: Args) -> u8 {
    let overrides = match crate::check::sets_or_exit(&args.set) {
        Ok(o) => o,
        Err(code) => return code,
    };
    if args.watch {
        return crate::watch::watch(|| plan_once(&args, overrides.clone()).1);
    }
    plan_once(&args, overrides).0
}

/// One plan: the exit code, and the user files it read (for `--watch`).
fn plan_once(args: &Args, overrides: Vec<(String, String)>) -> (u8, Vec<std::path::PathBuf>) {
    let c = crate::packages::compile(
        &DiskFs,
        std::slice::from_ref(&args.file),
        &Options { overrides, recipe: args.recipe.clone(), hub_cache: crate::packages::hub_cache() },
    );
    let mut read = vec![std::path::PathBuf::from(&args.file)];
    read.extend(c.program.modules.iter().filter(|m| !m.is_std).map(|m| std::path::PathBuf::from(&m.key)));
    (plan_compiled(args, &c), read)
}

/// The plan of a compiled recipe: the one path from recipe to planner input, shared by
/// `miles plan` and `miles run` (which saves it as OUT/plan.json for `miles report`).
pub fn make_plan(recipe: &miles_compiler::CompiledRecipe) -> miles_plan::Plan {
    let mut input = miles_plan::plan_input(recipe);
    // The planner is pure; the machine's GPUs are looked up here, only when the recipe may use one.
    if let Some(d) = input.device.as_mut().filter(|d| d.asked.value != "cpu" && d.cpu_only.is_none()) {
        d.machine = Some(machine_gpus());
    }
    if let Some(d) = input.device.as_mut() {
        d.cpu_bf16 = cpu_has_bf16();
    }
    miles_plan::plan(&input)
}

/// Whether this CPU has bf16 GEMM instructions (AVX512-BF16 or AMX), from /proc/cpuinfo's
/// flags; `None` where that cannot be read (not Linux).
fn cpu_has_bf16() -> Option<bool> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let flags = info.lines().find(|l| l.starts_with("flags"))?;
    Some(flags.split_whitespace().any(|f| f == "avx512_bf16" || f == "amx_bf16"))
}

/// This machine's GPUs through the CUDA driver (loaded at run time; absent: why, in words).
fn machine_gpus() -> miles_plan::input::MachineGpus {
    match miles_cuda::devices() {
        Ok(gpus) => miles_plan::input::MachineGpus {
            gpus: gpus
                .iter()
                .map(|g| miles_plan::input::MachineGpu {
                    index: g.index,
                    name: g.name.clone(),
                    memory: g.memory_bytes,
                    sm: g.sm(),
                })
                .collect(),
            unavailable: None,
        },
        Err(e) => miles_plan::input::MachineGpus { gpus: Vec::new(), unavailable: Some(e.reason) },
    }
}

/// The plan as `miles plan --format json` prints it: diagnostics with path, line and column.
pub fn plan_json(c: &miles_compiler::Compilation, plan: &miles_plan::Plan) -> String {
    let located = crate::diagnostics::to_json(&c.program.sources, &plan.diagnostics)["diagnostics"].clone();
    miles_plan::render_json_located(plan, located)
}

fn plan_compiled(args: &Args, c: &miles_compiler::Compilation) -> u8 {
    let (errors, _) = summary(&c.diagnostics);
    if errors > 0 {
        emit(&c.program.sources, &c.diagnostics, DiagFormat::Auto);
        eprintln!("Plan: not made: the recipe has {errors} error(s).");
        return 1;
    }
    let recipe = match crate::graph::pick_recipe(c, &args.file) {
        Ok(r) => r,
        Err(code) => return code,
    };
    let plan = make_plan(recipe);
    // Compiler warnings first, then the plan's own findings, all in one renderer.
    let mut diags = c.diagnostics.clone();
    diags.extend(plan.diagnostics.iter().cloned());
    match args.format {
        PlanFormat::Text => {
            // Terraform-style: the plan, then every finding with its source lines, then one
            // summary line, all on stdout.
            let mut out = miles_plan::render_sections(&plan);
            let color = crate::diagnostics::resolve_format(DiagFormat::Auto) == DiagFormat::Graphical
                && std::io::IsTerminal::is_terminal(&std::io::stdout());
            if !diags.is_empty() {
                out.push('\n');
            }
            for d in &diags {
                out.push_str(&crate::diagnostics::render(&c.program.sources, d, color));
            }
            let (e, w) = summary(&diags);
            let line = miles_plan::summary_line(&plan);
            // The planner counts its own findings; the compiler's warnings are added here.
            let compiler_warnings =
                w - plan.diagnostics.iter().filter(|d| d.severity == miles_compiler::Severity::Warning).count();
            if compiler_warnings > 0 {
                out.push_str(&format!(
                    "{line} (+{compiler_warnings} recipe warning(s); {e} error(s), {w} warning(s) in all)\n"
                ));
            } else {
                out.push_str(&format!("{line}\n"));
            }
            print!("{out}");
        }
        // Diagnostics as `check --format json` gives them: path, line and column.
        PlanFormat::Json => println!("{}", plan_json(c, &plan)),
    }
    if let Some(g) = args.graph {
        match g {
            GraphFormat::Mermaid => print!("{}", recipe.graph.to_mermaid()),
            GraphFormat::Dot => print!("{}", recipe.graph.to_dot()),
        }
    }
    if let Some(path) = &args.html {
        if let Err(e) = write_atomic(path, miles_plan::render_html(&plan).as_bytes()) {
            eprintln!("error: cannot write {path}: {e}");
            return 1;
        }
    }
    if let Some(path) = &args.out {
        let from = crate::planfile::CompiledFrom {
            file: args.file.clone(),
            set: args.set.clone(),
            recipe: args.recipe.clone(),
        };
        let file = crate::planfile::PlanFile::new(c, recipe, &plan, from);
        match serde_json::to_vec_pretty(&file) {
            Ok(bytes) => {
                if let Err(e) = write_atomic(path, &bytes) {
                    eprintln!("error: cannot write {path}: {e}");
                    return 1;
                }
            }
            Err(e) => {
                eprintln!("error: cannot encode the plan: {e}");
                return 1;
            }
        }
    }
    let (errors, warnings) = summary(&diags);
    if errors > 0 {
        1
    } else if args.detailed_exitcode && warnings > 0 {
        2
    } else {
        0
    }
}
