//! `miles check FILES...`: exit 0 when clean, 1 on errors (warnings too with --deny-warnings).
//! One `hint:` line names the given files `miles fmt` would change; it changes no exit status.

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
    let c = crate::packages::compile(
        &DiskFs,
        &args.files,
        &Options { overrides, recipe: None, hub_cache: crate::packages::hub_cache() },
    );
    let mut read: Vec<std::path::PathBuf> = args.files.iter().map(std::path::PathBuf::from).collect();
    read.extend(c.program.modules.iter().filter(|m| !m.is_std).map(|m| std::path::PathBuf::from(&m.key)));
    emit(&c.program.sources, &c.diagnostics, args.format);
    let (errors, warnings) = summary(&c.diagnostics);
    if resolve_format(args.format) != DiagFormat::Json {
        if let Some(hint) = layout_hint(&c.program, &c.diagnostics) {
            eprintln!("{hint}");
        }
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

/// One line naming the files given to `miles check` that `miles fmt` would change, as `cargo
/// clippy` points at `cargo fmt`: a hint, never an error, so the exit status is the check's
/// alone. Imported modules are not named (a dependency's files are not the user's to format);
/// a file with syntax errors has its diagnostics already and is not named either.
fn layout_hint(program: &miles_compiler::Program, diagnostics: &[miles_compiler::Diagnostic]) -> Option<String> {
    let syntax_error = |file| {
        diagnostics.iter().any(|d| {
            d.is_error()
                && d.code.as_str().starts_with("E00")
                && d.primary.as_ref().is_some_and(|p| p.span.file == file)
        })
    };
    let unformatted: Vec<&str> = program
        .entries
        .iter()
        .map(|&m| program.module(m))
        .filter(|m| !m.is_std && !syntax_error(m.file))
        .filter_map(|m| Some((m, program.sources.get(m.file)?)))
        // The tree the check parsed: formatting it costs no second parse.
        .filter(|(m, src)| miles_grammar::fmt::format_parsed(&m.ast, &src.text) != src.text)
        .map(|(_, src)| src.path.as_str())
        .collect();
    if unformatted.is_empty() {
        return None;
    }
    let files = unformatted.join(" ");
    Some(format!("hint: {} file(s) not in the canonical layout: {files}; run `miles fmt {files}`", unformatted.len()))
}
