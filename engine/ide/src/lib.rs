//! Editor features over a `Compilation`, with no protocol in sight: plain structs in (a file and
//! a byte offset), plain structs out (spans, text, kinds). The language server (lsp/) converts
//! them to LSP types; the tests at the end of each module call them directly.
//!
//! Everything here works on broken files: the parser keeps every item it could read, and the
//! compiler's `references` cover whatever evaluated. What those miss (field names inside a stage
//! block, enum members written bare, recipe settings) is resolved here from the syntax tree
//! (`analysis.rs`), so a syntax error in one item leaves hover and completion working in the rest.
//!
//! One module per feature, as in rust-analyzer's `ide` crate. This crate depends on the
//! compiler, the grammar and the planner; never on libtorch, LSP types or JSON-RPC.

mod analysis;
mod completion;
mod defs;
mod document_symbols;
mod goto_definition;
mod hover;
mod inlay_hints;
mod references;
mod rename;
mod semantic_tokens;
mod syntax;

#[cfg(test)]
mod fixture;

pub use analysis::Analysis;
pub use completion::{completions, Completion, CompletionKind};
pub use defs::{Def, DefKind, Defs};
pub use document_symbols::{document_symbols, Symbol};
pub use goto_definition::definition;
pub use hover::{hover, Hover};
pub use inlay_hints::{inlay_hints, plan_hints, InlayHint};
pub use references::{references, Found};
pub use rename::{is_identifier, prepare_rename, rename, KEYWORDS};
pub use semantic_tokens::{semantic_tokens, Token, TokenKind};
