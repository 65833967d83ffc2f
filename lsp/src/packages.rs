//! Package builds for the editor: a document under a `miles.toml` compiles with its project's
//! package map, as `miles check` does, so `import platform/grpo/base` resolves, and go to
//! definition lands in the dependency's files (the cache, `vendor/` or a path dependency).
//!
//! The editor never writes `miles.lock` nor fetches (`Mode::Frozen`). A build is kept per project
//! root until `miles.toml` or `miles.lock` changes (`Projects::clear`). A failed build (a missing
//! cache entry, a broken manifest) becomes one diagnostic on the document's first import of a
//! dependency (or its first line), in place of the errors that follow from it.

use miles_compiler::fs::FileSystem;
use miles_compiler::program::{PackageRoot, Packages};
use miles_compiler::{compile_with, Compilation, Diagnostic, Options, ParseCache, Sources, Span};
use miles_grammar::ast::ItemKind;
use miles_package::cache::Cache;
use miles_package::project::{self, Mode};
use std::collections::HashMap;
use std::path::Path;

/// The names of the files whose change invalidates a project's build.
pub const PROJECT_FILES: &[&str] = &[miles_package::manifest::FILE, miles_package::lock::FILE];

enum Built {
    Ok(Packages),
    Failed {
        /// What still applies: the project's own root and declared dependencies, when its
        /// manifest could be read (relative imports stay inside the package).
        fallback: Packages,
        /// The names `import NAME/...` may use; `None` when the manifest could not be read.
        dependencies: Option<Vec<String>>,
        /// The build's error, its location in `miles.toml` or `miles.lock` folded into the message.
        error: Box<Diagnostic>,
    },
}

/// Every project the session has built, by root (a module-key directory).
pub struct Projects {
    cache: Cache,
    builds: HashMap<String, Built>,
}

impl Projects {
    pub fn new(cache: Cache) -> Projects {
        Projects { cache, builds: HashMap::new() }
    }

    /// Forgets every build: `miles.toml` or `miles.lock` changed.
    pub fn clear(&mut self) {
        self.builds.clear();
    }

    /// The roots built so far (watched for changes to their manifest and lock).
    pub fn roots(&self) -> impl Iterator<Item = &str> {
        self.builds.keys().map(String::as_str)
    }

    /// The project module `key` compiles in: the one whose build reads it as a dependency's
    /// file, else the nearest `miles.toml` above it; `None` outside any package (and for the
    /// stdlib and documents that are not files).
    fn root_of(&self, key: &str) -> Option<String> {
        if key.starts_with("std/") || !Path::new(key).is_absolute() {
            return None;
        }
        let in_dependency = self.builds.iter().find(|(_, b)| match b {
            Built::Ok(map) => map.owner(key).is_some_and(|o| map.roots.first().is_some_and(|r| r.root != o.root)),
            Built::Failed { .. } => false,
        });
        if let Some((root, _)) = in_dependency {
            return Some(root.clone());
        }
        project::find(key)
    }

    fn build(&mut self, root: &str) -> &Built {
        self.builds.entry(root.to_string()).or_insert_with(|| build(root, &self.cache))
    }
}

fn build(root: &str, cache: &Cache) -> Built {
    let mut sources = Sources::default();
    let p = match project::open(root, &mut sources) {
        Ok(p) => p,
        Err(d) => {
            let error = Box::new(located(&sources, d));
            return Built::Failed { fallback: Packages::default(), dependencies: None, error };
        }
    };
    match project::build(&p, cache, &Mode::Frozen, &mut sources) {
        Ok(mut b) => {
            project::list_modules(&mut b.map);
            Built::Ok(b.map)
        }
        Err(d) => {
            let dependencies: Vec<String> = p.manifest.dependencies.keys().cloned().collect();
            let own = PackageRoot {
                name: p.manifest.name.clone(),
                root: p.root.clone(),
                dependencies: dependencies.clone(),
                ..Default::default()
            };
            let error = Box::new(located(&sources, d));
            Built::Failed {
                fallback: Packages { roots: vec![own], ..Default::default() },
                dependencies: Some(dependencies),
                error,
            }
        }
    }
}

/// The error without its labels (their files are not the document's), `(miles.toml:4)` added.
fn located(sources: &Sources, mut d: Diagnostic) -> Diagnostic {
    if let Some(l) = d.primary.take() {
        let (line, _) = sources.line_col(l.span);
        let path = sources.get(l.span.file).map(|f| f.path.as_str()).unwrap_or("");
        d.message = format!("{} ({path}:{line}: {})", d.message, l.message);
    }
    d.secondary.clear();
    d.fixes.clear();
    d
}

/// Compiles the document `key` in its package, if it is in one.
pub fn compile(projects: &mut Projects, fs: &dyn FileSystem, key: &str, cache: &ParseCache) -> Compilation {
    let entries = [key.to_string()];
    // The Hub cache from the server's environment, read once at its first compilation, as the
    // CLI reads it: `hf { repo }` resolves alike in the editor and in `miles check`.
    static HUB: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    let hub_cache = HUB.get_or_init(|| miles_compiler::hub::cache_root(&|k| std::env::var(k).ok())).clone();
    let opts = Options { hub_cache, ..Options::default() };
    let Some(root) = projects.root_of(key) else {
        return compile_with(fs, &entries, &opts, &Packages::default(), cache);
    };
    match projects.build(&root) {
        Built::Ok(map) => compile_with(fs, &entries, &opts, map, cache),
        Built::Failed { fallback, dependencies, error } => {
            let mut c = compile_with(fs, &entries, &opts, fallback, cache);
            replace_import_errors(&mut c, dependencies.as_deref(), error);
            c
        }
    }
}

/// Whether `import path` names a package: a declared dependency, or (manifest unreadable) any
/// path that is neither relative nor the stdlib's.
fn names_package(path: &str, dependencies: Option<&[String]>) -> bool {
    let first = path.split('/').next().unwrap_or("");
    match dependencies {
        Some(deps) => deps.iter().any(|d| d == first),
        None => !path.starts_with('.') && !path.starts_with('/') && !path.starts_with("std/"),
    }
}

/// Reports the build's error once, on the entry's first package import (or its first line). When
/// modules import packages, what the compiler found besides syntax errors (E00xx) is dropped: it
/// follows from imports that could not resolve, and `miles check` stops at the build's error too.
fn replace_import_errors(c: &mut Compilation, dependencies: Option<&[String]>, error: &Diagnostic) {
    let p = &c.program;
    let spans: Vec<Span> = p
        .modules
        .iter()
        .filter(|m| !m.is_std)
        .flat_map(|m| m.ast.items.iter())
        .filter_map(|i| match &i.kind {
            ItemKind::Import(imp) if names_package(&imp.path, dependencies) => Some(imp.path_span),
            _ => None,
        })
        .collect();
    if !spans.is_empty() {
        c.diagnostics.retain(|d| d.code.starts_with("E00"));
    }
    let Some(entry) = p.entries.first().map(|&m| p.module(m).file) else { return };
    let at = spans.iter().find(|s| s.file == entry).copied().unwrap_or(Span::new(entry, 0, 0));
    c.diagnostics.insert(0, error.clone().with_primary(at, "the package build failed"));
}
