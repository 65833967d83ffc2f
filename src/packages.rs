//! Package builds for every verb that compiles: the project's `miles.toml` (found above the
//! first file), its dependencies from `miles.lock` (resolved and written when missing or stale),
//! and the compiler given the package map. Files outside any package compile as before.

use crate::diagnostics::emit;
use crate::DiagFormat;
use miles_compiler::fs::FileSystem;
use miles_compiler::{Compilation, Diagnostic, Options, Program, Sources};
use miles_package::cache::Cache;
use miles_package::project::{self, Build, Mode, Project};

/// The local Hugging Face Hub cache, from this process's environment, computed once: every verb
/// compiles with it (`hf { repo }`), and `miles run` hands the engine the directory it resolved.
pub fn hub_cache() -> Option<String> {
    static ROOT: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    ROOT.get_or_init(|| miles_compiler::hub::cache_root(&|k| std::env::var(k).ok())).clone()
}

/// `miles_compiler::compile` in the package of `entries[0]`, if it is in one. A failed package
/// build is returned as a compilation holding its one diagnostic.
pub fn compile(fs: &dyn FileSystem, entries: &[String], opts: &Options) -> Compilation {
    let root = entries.first().and_then(|f| project::find(f));
    let Some(root) = root else { return miles_compiler::compile(fs, entries, opts) };
    let mut sources = Sources::default();
    match open_and_build(&root, &Mode::Locked, &mut sources) {
        Ok((_, b)) => miles_compiler::compile_in(fs, entries, opts, &b.map),
        Err(d) => failed(sources, d),
    }
}

fn failed(sources: Sources, d: Diagnostic) -> Compilation {
    Compilation {
        program: Program { sources, ..Program::default() },
        diagnostics: vec![d],
        recipes: Vec::new(),
        references: Vec::new(),
        item_values: Default::default(),
    }
}

// The one diagnostic type is large; it ends the command, so its size does not matter here.
#[allow(clippy::result_large_err)]
pub fn open_and_build(root: &str, mode: &Mode, sources: &mut Sources) -> Result<(Project, Build), Diagnostic> {
    let p = project::open(root, sources)?;
    let b = project::build(&p, &Cache::from_env(), mode, sources)?;
    if b.lock_changed {
        eprintln!("wrote {}", miles_compiler::fs::join(&p.root, miles_package::lock::FILE));
    }
    Ok((p, b))
}

/// The project at or above `dir`, or a message saying there is none.
pub fn project_root(dir: &str) -> Result<String, u8> {
    project::find(&miles_compiler::fs::join(dir, "miles.toml")).ok_or_else(|| {
        eprintln!("error: no miles.toml in {dir} or above it; a package starts with one (docs/packages.md)");
        1
    })
}

/// Opens and builds the project at or above `dir`, rendering a failure.
pub fn build_at(dir: &str, mode: &Mode) -> Result<(Project, Build), u8> {
    let root = project_root(dir)?;
    let mut sources = Sources::default();
    open_and_build(&root, mode, &mut sources).map_err(|d| {
        emit(&sources, &[d], DiagFormat::Auto);
        1
    })
}

/// One line per package: name, version, where from.
pub fn describe(b: &Build) -> Vec<String> {
    b.packages
        .iter()
        .map(|p| {
            let from = p.locked.source.trim_start_matches("git+").trim_start_matches("path+");
            let at = p.locked.reference.as_deref().map(|r| format!(" at {r}")).unwrap_or_default();
            format!("{} {} ({from}{at})", p.name, p.version)
        })
        .collect()
}
