//! The `.miles` syntax: a pest grammar (`miles.pest`) and a parser that never fails.
//!
//! `parse(file, text)` returns a syntax tree with spans and a list of diagnostics. It has no IO
//! and no dependencies on the rest of miles; the diagnostic type and the error-code registry live
//! here because every other crate depends on this one.

pub mod ast;
pub mod codes;
mod depth;
pub mod diag;
pub mod fmt;
mod keywords;
mod lex;
mod parse;
mod shift;
pub mod spanned;

pub use depth::{MAX_DEPTH, MAX_EXPR_DEPTH};
pub use keywords::{CONTEXTUAL_KEYWORDS, ITEM_KEYWORDS, KEYWORDS};
pub use lex::{collect_comments, unescape};
pub use parse::chunks::{parse_cached, ChunkCache};
pub use parse::{parse, parse_expr, MAX_FILE_BYTES};
