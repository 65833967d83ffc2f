//! Semantic tokens: a lexical scan of the whole file, names classified by what they resolve to.

use crate::analysis::Analysis;
use crate::defs::DefKind;
use crate::rename::KEYWORDS;
use miles_compiler::eval::Builtin;
use miles_compiler::types::Type;
use miles_grammar::ast::ItemKind;
use miles_grammar::diag::{FileId, Span};
use std::collections::HashMap;

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum TokenKind {
    Keyword,
    Comment,
    DocComment,
    String,
    Number,
    /// The unit of a quantity (`GB` in `80.GB`).
    Unit,
    Namespace,
    Type,
    Enum,
    EnumMember,
    Interface,
    /// A stage kind.
    Function,
    Property,
    Parameter,
    Variable,
    Operator,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Token {
    pub start: u32,
    pub len: u32,
    pub kind: TokenKind,
    pub declaration: bool,
    /// Declared in the standard library.
    pub std: bool,
}

/// Tokens of a whole file, in order, never overlapping. A lexical scan, so it works on any
/// text; names are classified by what they resolve to.
pub fn semantic_tokens(a: &Analysis, file: FileId) -> Vec<Token> {
    let text = a.text(file);
    let p = a.program();
    let use_to_def: HashMap<(u32, u32), Span> =
        a.refs.iter().filter(|(u, _)| u.file == file).map(|(u, d)| ((u.start, u.end), *d)).collect();
    let import_names: Vec<Span> = a
        .module_of_file(file)
        .map(|m| {
            p.module(m)
                .ast
                .items
                .iter()
                .filter_map(|i| match &i.kind {
                    ItemKind::Import(imp) => Some(imp.path_span),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0usize;
    let mut push = |start: usize, end: usize, kind: TokenKind, declaration: bool, std: bool| {
        out.push(Token { start: start as u32, len: (end - start) as u32, kind, declaration, std });
    };
    while i < bytes.len() {
        let c = bytes[i];
        if c == b'/' && bytes.get(i + 1) == Some(&b'/') {
            let start = i;
            while i < bytes.len() && bytes[i] != b'\n' {
                i += 1;
            }
            let doc = text[start..i].starts_with("///") && !text[start..i].starts_with("////");
            push(start, i, if doc { TokenKind::DocComment } else { TokenKind::Comment }, false, false);
        } else if c == b'"' {
            let start = i;
            i += 1;
            while i < bytes.len() && bytes[i] != b'"' && bytes[i] != b'\n' {
                i += if bytes[i] == b'\\' { 2 } else { 1 };
            }
            i = (i + 1).min(bytes.len());
            push(start, i, TokenKind::String, false, false);
        } else if import_names.iter().any(|s| s.start as usize == i) {
            let s = import_names.iter().find(|s| s.start as usize == i).copied().unwrap_or_default();
            let end = (s.end as usize).max(i + 1).min(bytes.len());
            push(i, end, TokenKind::Namespace, false, false);
            i = end;
        } else if c.is_ascii_digit() {
            let start = i;
            while i < bytes.len()
                && (bytes[i].is_ascii_alphanumeric()
                    || bytes[i] == b'_'
                    || (bytes[i] == b'.' && bytes.get(i + 1).is_some_and(|b| b.is_ascii_digit())))
            {
                // An exponent sign: `1e-6`.
                if (bytes[i] == b'e' || bytes[i] == b'E') && matches!(bytes.get(i + 1), Some(b'-') | Some(b'+')) {
                    i += 1;
                }
                i += 1;
            }
            push(start, i, TokenKind::Number, false, false);
            // `.unit` right after a number.
            if bytes.get(i) == Some(&b'.') && bytes.get(i + 1).is_some_and(|b| b.is_ascii_alphabetic()) {
                let ustart = i + 1;
                i = ustart;
                while i < bytes.len()
                    && (bytes[i].is_ascii_alphabetic()
                        || (bytes[i] == b'/' && bytes.get(i + 1).is_some_and(|b| b.is_ascii_alphabetic())))
                {
                    i += 1;
                }
                push(ustart, i, TokenKind::Unit, false, false);
            }
        } else if c.is_ascii_alphabetic() || c == b'_' {
            let start = i;
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                i += 1;
            }
            let word = &text[start..i];
            let span = Span::new(file, start, i);
            if let Some(def) = a.defs.at(span) {
                push(start, i, token_kind(def.kind), true, p.module(def.module).is_std);
            } else if let Some(d) = use_to_def.get(&(start as u32, i as u32)).and_then(|d| a.defs.at(*d)) {
                push(start, i, token_kind(d.kind), false, p.module(d.module).is_std);
            } else if KEYWORDS.contains(&word) || is_contextual_keyword(text, start, word) {
                push(start, i, TokenKind::Keyword, false, false);
            } else if Builtin::from_name(word).is_some() {
                push(start, i, TokenKind::Function, false, true);
            } else if Type::builtin(word).is_some() || word == "List" || word == "Map" {
                push(start, i, TokenKind::Type, false, true);
            }
        } else {
            i += 1;
        }
    }
    out
}

/// `recipe`, `model`, `cluster`, `extends`, `on`, `as`, `help`, `warn`: keywords only where an item or
/// clause starts.
fn is_contextual_keyword(text: &str, start: usize, word: &str) -> bool {
    let line_start = text[..start].rfind('\n').map(|i| i + 1).unwrap_or(0);
    let at_line_start = text[line_start..start].trim().is_empty();
    match word {
        "recipe" | "model" | "cluster" => at_line_start && start == line_start,
        "extends" | "on" => text[line_start..start].trim_start().starts_with("recipe "),
        "as" => text[line_start..start].trim_start().starts_with("import "),
        "help" => text[line_start..start].contains('"') || at_line_start,
        "warn" => at_line_start,
        // A check's `at FIELD`, not a field named `at` (`at = 3`, `at: Int`).
        "at" => {
            let line = text[line_start..start].trim_start();
            let next = text[start + 2..].trim_start_matches([' ', '\t']).chars().next();
            (at_line_start || line.starts_with("check ") || line.starts_with("warn "))
                && !matches!(next, Some('=' | ':' | '\n') | None)
        }
        _ => false,
    }
}

fn token_kind(k: DefKind) -> TokenKind {
    match k {
        DefKind::Module => TokenKind::Namespace,
        DefKind::Const | DefKind::Model | DefKind::Cluster | DefKind::StageInstance => TokenKind::Variable,
        DefKind::Enum => TokenKind::Enum,
        DefKind::EnumMember => TokenKind::EnumMember,
        DefKind::Interface => TokenKind::Interface,
        DefKind::Schema => TokenKind::Type,
        DefKind::StageKind | DefKind::Recipe => TokenKind::Function,
        DefKind::Field | DefKind::Setting => TokenKind::Property,
        DefKind::Port => TokenKind::Parameter,
    }
}

#[cfg(test)]
mod tests {
    use crate::fixture::{at_cursor, line_col};
    use insta::assert_snapshot;

    #[test]
    fn names_by_what_they_resolve_to() {
        let src = r#"import std/tasks/arith
/// Doc.
enum Mode { fast, slow }
schema opts { mode: Mode = fast, size: Bytes = 1.GB }
const o = opts { mode = Mode.slow }   // a comment
recipe r {
    rollout = generate(arith.addition {}) { prompts = arith.addition {} }
}
"#;
        let (a, file, _) = at_cursor(src);
        let mut out = String::new();
        for t in super::semantic_tokens(&a, file) {
            let (line, col) = line_col(src, t.start as usize);
            let text = &src[t.start as usize..(t.start + t.len) as usize];
            let mods = [(t.declaration, "declaration"), (t.std, "std")]
                .iter()
                .filter(|(on, _)| *on)
                .map(|(_, m)| *m)
                .collect::<Vec<_>>()
                .join(",");
            out.push_str(&format!("{line}:{col} {text:?} {:?} {mods}\n", t.kind));
        }
        assert_snapshot!(out);
    }
}
