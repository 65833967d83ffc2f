//! The parser: `parse(file, text) -> (SourceFile, Vec<Diagnostic>)`. It never fails and never
//! panics; what it cannot read becomes a diagnostic and is left out of the tree.

use crate::ast::*;
use crate::codes::ErrorCode;
use crate::depth::{too_deep_brackets, MAX_DEPTH};
use crate::diag::{Diagnostic, FileId, Span};
use crate::lex::{next_char_boundary, trim_trivia};
use pest::iterators::Pair;
use pest::Parser;
use pest_derive::Parser;

pub(crate) mod chunks;
mod exprs;
mod items;
mod recover;

#[derive(Parser)]
#[grammar = "miles.pest"]
pub(crate) struct MilesParser;

/// Files above this size are refused (E0006) rather than parsed.
pub const MAX_FILE_BYTES: usize = 8 << 20;
/// Stack the parser makes sure it has before parsing (pest recurses per nesting level; in a
/// debug build a level of brackets takes a few kilobytes): callers on small thread stacks (test
/// threads, the language server) get a temporary larger one instead of an overflow.
const PARSE_STACK: usize = 16 << 20;

/// Parses a file, chunk by chunk (`parse/chunks.rs`; the result is that of parsing it whole).
pub fn parse(file: FileId, src: &str) -> (SourceFile, Vec<Diagnostic>) {
    chunks::parse_chunked(file, src, None)
}

/// The checks every parse makes on the whole text first: size (E0006) and bracket depth
/// (E0003). `Some` is the refusal, a tree with no items.
fn refuse(file: FileId, src: &str) -> Option<Vec<Diagnostic>> {
    if src.len() > MAX_FILE_BYTES {
        return Some(vec![Diagnostic::error(
            ErrorCode::E0006,
            format!("file is {} bytes; the limit is {} bytes", src.len(), MAX_FILE_BYTES),
        )
        .with_primary(Span::new(file, 0, 0), "file too large")
        .with_help("split it into modules and `import` them")]);
    }
    if let Some(at) = too_deep_brackets(src) {
        return Some(vec![Diagnostic::error(
            ErrorCode::E0003,
            format!("brackets nest more than {MAX_DEPTH} levels deep"),
        )
        .with_primary(Span::new(file, at, at + 1), "this bracket is too deep")
        .with_help("flatten the expression; no recipe needs this much nesting")]);
    }
    None
}

/// `parse` without cutting the text into chunks: the reference the chunked parse must equal.
#[cfg(test)]
pub(crate) fn parse_whole(file: FileId, src: &str) -> (SourceFile, Vec<Diagnostic>) {
    let comments = crate::collect_comments(file, src);
    if let Some(diags) = refuse(file, src) {
        return (SourceFile { items: Vec::new(), comments }, diags);
    }
    let parsed = parse_text(file, src, usize::MAX);
    (SourceFile { items: parsed.items, comments }, parsed.diags)
}

/// What parsing one text (a whole file or one chunk of it) gives.
pub(crate) struct TextParse {
    pub(crate) items: Vec<Item>,
    pub(crate) diags: Vec<Diagnostic>,
    /// The parse looked at the end of the text (see `Builder::sig_end`): text after it could
    /// change the result, so the text is not a chunk of its own.
    pub(crate) hit_end: bool,
    /// pest itself failed (a bug, or its stack guard): the text's items are all dropped.
    pub(crate) failed: bool,
}

/// Parses `src` with the grammar and builds its items; spans are offsets into `src`.
/// `sig_end` is where the last significant (non-trivia) text of `src` ends.
pub(crate) fn parse_text(file: FileId, src: &str, sig_end: usize) -> TextParse {
    let mut b = Builder { file, src, diags: Vec::new(), sig_end, hit_end: false, depth: 0 };
    let (items, failed) = stacker::maybe_grow(PARSE_STACK, PARSE_STACK, || parse_items(&mut b));
    TextParse { items, diags: b.diags, hit_end: b.hit_end, failed }
}

/// Parses a whole text with the grammar and builds its items; `true` if pest failed.
fn parse_items(b: &mut Builder<'_>) -> (Vec<Item>, bool) {
    match MilesParser::parse(Rule::file, b.src) {
        Ok(mut pairs) => match pairs.next() {
            Some(file_pair) => (b.file(file_pair), false),
            None => (Vec::new(), false),
        },
        // The grammar has a catch-all at every level, so this is a bug (or pest's own stack
        // guard); report it, don't panic.
        Err(e) => {
            let at = error_at(&e);
            let message = e.variant.message();
            let d = if message.contains("stack limit") {
                // Where the stack ran out depends on frame sizes: point at the line instead.
                let line = b.src[..at.min(b.src.len())].rfind('\n').map(|i| i + 1).unwrap_or(0);
                Diagnostic::error(ErrorCode::E0003, "this file nests too deeply to parse")
                    .with_primary(Span::new(b.file, line, line), "the parser ran out of stack on this line")
                    .with_help("flatten the nesting (`if` inside `if`, ...) into named constants")
            } else {
                Diagnostic::error(ErrorCode::E0001, format!("could not parse this file: {message}"))
                    .with_primary(Span::new(b.file, at, at), "here")
            };
            b.diags.push(d);
            (Vec::new(), true)
        }
    }
}

/// Parses one expression (used for `--set key=value` and by tools).
pub fn parse_expr(file: FileId, src: &str) -> (Option<Expr>, Vec<Diagnostic>) {
    let mut b = Builder { file, src, diags: Vec::new(), sig_end: usize::MAX, hit_end: false, depth: 0 };
    if too_deep_brackets(src).is_some() || src.len() > MAX_FILE_BYTES {
        b.diags.push(
            Diagnostic::error(ErrorCode::E0003, "expression too deep or too long")
                .with_primary(Span::new(file, 0, 0), "here"),
        );
        return (None, b.diags);
    }
    match stacker::maybe_grow(PARSE_STACK, PARSE_STACK, || MilesParser::parse(Rule::probe_expr, src)) {
        Ok(mut pairs) => {
            let mut expr =
                pairs.next().and_then(|p| p.into_inner().find(|p| p.as_rule() == Rule::expr)).map(|p| b.expr(p));
            if let Some(e) = &mut expr {
                b.limit_depth(e);
            }
            (expr, b.diags)
        }
        Err(e) => {
            let at = error_at(&e);
            let end = next_char_boundary(src, at);
            b.diags.push(
                Diagnostic::error(ErrorCode::E0001, "expected an expression")
                    .with_primary(Span::new(file, at, end), "here"),
            );
            (None, b.diags)
        }
    }
}

struct Builder<'s> {
    file: FileId,
    src: &'s str,
    diags: Vec<Diagnostic>,
    /// Where the last significant text of `src` ends. Recovery that reaches it (a `}` accepted
    /// as missing at the end, a skipped line running to the end, a probe that read that far)
    /// sets `hit_end`: in a longer text the same place could read differently.
    sig_end: usize,
    hit_end: bool,
    /// How deep `expr` is nested, so the stack is checked only every few levels.
    depth: u32,
}

/// Which list a junk line sat in: decides what the parser expected there.
#[derive(Clone, Copy)]
enum ListKind {
    Items,
    Decls,
    Bindings,
    EnumMembers,
}

impl<'s> Builder<'s> {
    fn span(&self, p: &Pair<'_, Rule>) -> Span {
        let s = p.as_span();
        Span::new(self.file, s.start(), trim_trivia(self.src, s.start(), s.end()))
    }

    fn ident(&self, p: Pair<'_, Rule>) -> Ident {
        Ident { name: p.as_str().to_string(), span: self.span(&p) }
    }
}

/// Where a pest error starts.
fn error_at(e: &pest::error::Error<Rule>) -> usize {
    match e.location {
        pest::error::InputLocation::Pos(p) => p,
        pest::error::InputLocation::Span((s, _)) => s,
    }
}
