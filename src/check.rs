//! `miles check FILES...`: exit 0 when clean, 1 on errors (warnings too with --deny-warnings).

use crate::diagnostics::{emit, resolve_format, summary};
use crate::files::DiskFs;
use crate::DiagFormat;
use miles_compiler::Options;

#[derive(clap::Args)]
pub struct Args {
    /// Recipe and module files to check.
    #[arg(required = true)]
    pub files: Vec<String>,
    /// Fail on warnings too.
    #[arg(long)]
    pub deny_warnings: bool,
    /// Override a field with full type checking: `--set train.lr=1e-4` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    #[arg(long, value_enum, default_value = "auto")]
    pub format: DiagFormat,
    /// Check again whenever a checked file or a module it imports changes; Ctrl-C stops.
    #[arg(long)]
    pub watch: bool,
}

pub fn parse_sets(sets: &[String]) -> Result<Vec<(String, String)>, String> {
    sets.iter()
        .map(|s| match s.split_once('=') {
            Some((k, v)) => Ok((k.trim().to_string(), v.trim().to_string())),
            None => Err(format!("--set {s}: expected KEY=VALUE, e.g. --set train.lr=1e-4")),
        })
        .collect()
}

/// `--set` pairs, or the exit code after saying what is wrong (2: a usage error).
pub fn sets_or_exit(sets: &[String]) -> Result<Vec<(String, String)>, u8> {
    parse_sets(sets).map_err(|e| {
        eprintln!("error: {e}");
        2
    })
}

pub fn run(args: Args) -> u8 {
    let overrides = match sets_or_exit(&args.set) {
        Ok(o) => o,
        Err(code) => return code,
    };
    if args.watch {
        return crate::watch::watch(|| check_once(&args, overrides.clone()).1);
    }
    check_once(&args, overrides).0
}

/// One check: the exit code, and the user files it read (for `--watch`).
fn check_once(args: &Args, overrides: Vec<(String, String)>) -> (u8, Vec<std::path::PathBuf>) {
    let c = crate::packages::compile(&DiskFs, &args.files, &Options { overrides, recipe: None });
    let mut read: Vec<std::path::PathBuf> = args.files.iter().map(std::path::PathBuf::from).collect();
    read.extend(c.program.modules.iter().filter(|m| !m.is_std).map(|m| std::path::PathBuf::from(&m.key)));
    emit(&c.program.sources, &c.diagnostics, args.format);
    let (errors, warnings) = summary(&c.diagnostics);
    if resolve_format(args.format) != DiagFormat::Json {
        let recipes = c.recipes.len();
        let stages: usize = c.recipes.iter().map(|r| r.graph.graph.node_count()).sum();
        eprintln!(
            "{}: {} file(s), {recipes} recipe(s), {stages} stage(s): {errors} error(s), {warnings} warning(s)",
            if errors > 0 || (args.deny_warnings && warnings > 0) { "failed" } else { "ok" },
            args.files.len()
        );
    }
    (u8::from(errors > 0 || (args.deny_warnings && warnings > 0)), read)
}
