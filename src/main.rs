//! `miles`: check, graph, plan and run `.miles` recipes. One module per verb.

mod add;
mod check;
mod data;
mod diagnostics;
mod doc;
mod engine;
mod explain;
mod fetch;
mod files;
mod fmt;
mod graph;
mod packages;
mod plan;
mod planfile;
mod report;
mod run;
mod runspec;
mod saved_plan;
mod test;
mod update;
mod vendor;
mod watch;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "miles",
    version,
    about = "Typed recipes for reinforcement-learning post-training: check, plan and run"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DiagFormat {
    /// Graphical on a terminal, plain text otherwise.
    Auto,
    Graphical,
    Plain,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Check recipes and modules: every mistake that can be known before a GPU is allocated.
    Check(check::Args),
    /// Print a recipe's stage graph as Mermaid, DOT or JSON.
    Graph(graph::Args),
    /// A dry run: placement, memory per rank, weight-sync and step time, every infeasibility.
    Plan(plan::Args),
    /// Train a recipe on the embedded backend (libtorch, CPU): metrics, checkpoints, --resume.
    Run(run::Args),
    /// What the model will see: rendered prompts and ids, prompt lengths, the train/test split.
    Data(data::Args),
    /// Draw a run's curves (reward, accuracy, loss, divergence, length) as SVG and summarise it.
    Report(report::Args),
    /// Host one stage of a distributed run (started by `miles run`'s launcher).
    #[command(disable_help_flag = true)]
    Worker {
        /// Arguments for `miles-engine worker` (`miles worker --help` lists them).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Serve a model directory through the SGLang-compatible HTTP API.
    #[command(disable_help_flag = true)]
    Serve {
        /// Arguments for `miles-engine serve` (`miles serve --help` lists them).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Explain an error code (`miles explain E0301`); with no code, list them all.
    Explain(explain::Args),
    /// Rewrite `.miles` files in the canonical layout (`--check`: only report).
    Fmt(fmt::Args),
    /// The language server, over stdio (editor set-ups: docs/editors.md).
    Lsp,
    /// Add a dependency to miles.toml and lock it: `--git URL --tag v1` or `--path DIR`.
    Add(add::Args),
    /// Resolve dependencies again against their repositories' tags and rewrite miles.lock.
    Update(update::Args),
    /// Bring every locked dependency into the cache (hash-checked), for offline work.
    Fetch(fetch::Args),
    /// Copy every dependency into vendor/ for air-gapped machines.
    Vendor(vendor::Args),
    /// Run a package's own tests (the `[[test]]` tables of miles.toml).
    Test(test::Args),
    /// Render a package's (or, with --std, the standard library's) reference as Markdown and HTML.
    Doc(doc::Args),
}

fn main() -> ExitCode {
    // Like other Unix tools, die quietly when the reader of our output goes away
    // (`miles graph x | head`) instead of panicking on a failed print.
    #[cfg(unix)]
    // SAFETY: restoring the default disposition of one signal before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = Cli::parse();
    let code = match cli.command {
        Command::Check(a) => check::run(a),
        Command::Graph(a) => graph::run(a),
        Command::Explain(a) => explain::run(a),
        Command::Fmt(a) => fmt::run(a),
        Command::Lsp => match miles_lsp::run_stdio() {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("miles lsp: {e}");
                1
            }
        },
        Command::Plan(a) => plan::run(a),
        Command::Run(a) => run::run(a),
        Command::Worker { args } => engine::forward("worker", &args),
        Command::Serve { args } => engine::forward("serve", &args),
        Command::Report(a) => report::run(a),
        Command::Data(a) => data::run(a),
        Command::Add(a) => add::run(a),
        Command::Update(a) => update::run(a),
        Command::Fetch(a) => fetch::run(a),
        Command::Vendor(a) => vendor::run(a),
        Command::Test(a) => test::run(a),
        Command::Doc(a) => doc::run(a),
    };
    ExitCode::from(code)
}
