//! Recipe packages: a directory with a `miles.toml` manifest and its `.miles` modules.
//! This crate owns everything a package build does with the outside world (reading manifests,
//! git through the `git` CLI, the source cache, `miles.lock`), so the compiler stays pure: it
//! only receives a `miles_compiler::program::Packages` map of package roots.
//!
//! Flow: `project::open` reads the manifest, `resolve::resolve` picks one version per package
//! (semver on tags, preferring what the lock pins), `cache` brings each revision's sources into
//! the cache (write, then rename), `hash` fingerprints them, and `lock` records the result.

// Errors are the project's one `Diagnostic` (large); they end a command, so size does not matter.
#![allow(clippy::result_large_err)]

pub mod cache;
pub mod doc;
pub mod git;
pub mod hash;
pub mod lock;
pub mod manifest;
pub mod project;
pub mod resolve;
pub mod testing;
pub mod url;
pub mod verify;

pub use miles_grammar::diag::Diagnostic;
