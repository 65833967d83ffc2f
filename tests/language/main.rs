//! The language tools' integration tests, one test binary (`cargo test --test language`; link
//! time dominates a test build, issue #34): the compiler on `tests/cases/`, the documentation,
//! property tests, the shipped recipes' plans, the code's size limits, and the `miles` binary's check, graph, explain,
//! fmt and package verbs. Nothing here trains; the whole binary runs in seconds to a minute.
//! Each module was a test binary of its own. Snapshots are in `snapshots/`, named
//! `language__MODULE__NAME.snap`, except `cases`', which are in `tests/cases/snapshots/`.

#[path = "../common/mod.rs"]
mod common;

mod cases;
mod cli;
mod docs;
mod error_snippets;
mod fuzz;
mod hf_plans;
mod packages;
mod plans;
mod shape;
mod sync_plans;
