//! The `.miles` syntax: a pest grammar (`miles.pest`) and a parser that never fails.
//!
//! `parse(file, text)` returns a syntax tree with spans and a list of diagnostics. It has no IO
//! and no dependencies on the rest of miles; the diagnostic type and the error-code registry live
//! here because every other crate depends on this one.

pub mod ast;
pub mod codes;
pub mod diag;
pub mod fmt;
mod parse;

pub use parse::{collect_comments, parse, parse_expr, unescape, MAX_DEPTH, MAX_FILE_BYTES};
