//! What the parser says about what it could not read: an unclosed delimiter (E0002), and a
//! skipped line (E0001) with the tokens it expected there, found by re-reading the line with a
//! probe rule of the grammar.

use super::{error_at, Builder, ListKind, MilesParser, Rule};
use crate::codes::ErrorCode;
use crate::diag::{Diagnostic, Span};
use pest::iterators::Pair;
use pest::Parser;

impl Builder<'_> {
    /// Reports a missing closing delimiter (a `close_*` pair that matched `missing_close`).
    pub(super) fn close(&mut self, p: &Pair<'_, Rule>, opened: Span, delim: &str) {
        let missing = p.clone().into_inner().any(|c| c.as_rule() == Rule::missing_close);
        if !missing {
            return;
        }
        let closer = match delim {
            "(" => ")",
            "[" => "]",
            _ => "}",
        };
        // Point at the opening delimiter: it is the one left unclosed.
        let open_at =
            self.src[opened.range()].find(delim).map(|o| opened.start as usize + o).unwrap_or(opened.start as usize);
        let at = self.span(p);
        // Accepted at the end of the text: in a longer one the next line might not begin an
        // item, and the block would go on.
        if at.start as usize >= self.sig_end {
            self.hit_end = true;
        }
        self.diags.push(
            Diagnostic::error(ErrorCode::E0002, format!("unclosed `{delim}`"))
                .with_primary(Span::new(self.file, open_at, open_at + 1), format!("this `{delim}` is never closed"))
                .with_secondary(at, format!("expected `{closer}` before this point"))
                .with_help(format!("add `{closer}`")),
        );
    }

    /// Reports a line the parser skipped, saying what it expected at the first bad character.
    pub(super) fn junk(&mut self, p: &Pair<'_, Rule>, kind: ListKind) {
        let span = self.span(p);
        let start = span.start as usize;
        // Balanced brackets in a skipped line stop before the next item's line, or at the end.
        if p.as_span().end() >= self.src.len() {
            self.hit_end = true;
        }
        let (probe, what) = match kind {
            ListKind::Items => (
                Rule::probe_item,
                "an item (`import`, `const`, `enum`, `schema`, `stage`, `model`, `cluster`, `recipe`)",
            ),
            ListKind::Decls => (Rule::probe_decl, "a field declaration (`name: Type = default`) or `check`"),
            ListKind::Bindings => (Rule::probe_body, "a field (`name = value`), `check` or `}`"),
            ListKind::EnumMembers => (Rule::probe_enum, "an enum member name"),
        };
        pest::set_error_detail(true);
        let rest = &self.src[start..];
        let (at, expected) = match MilesParser::parse(probe, rest) {
            Ok(_) => {
                self.hit_end = true;
                (start, Vec::new())
            }
            Err(e) => {
                let attempts = e.parse_attempts();
                let pos = attempts.as_ref().map_or_else(|| error_at(&e), |a| a.max_position);
                // What the probe expected depends on how far it read: past the last
                // significant text, more text could change it.
                if start + pos >= self.sig_end {
                    self.hit_end = true;
                }
                let mut expected: Vec<String> = attempts
                    .map(|a| {
                        a.expected_tokens()
                            .into_iter()
                            .map(|t| t.to_string())
                            // Whitespace and comments may come anywhere: naming them says nothing.
                            .filter(|t| {
                                !(t.trim().is_empty() || t.starts_with("//") || t.starts_with('\t') || t == "\u{FEFF}")
                            })
                            .map(|t| describe_token(&t))
                            .collect()
                    })
                    .unwrap_or_default();
                expected.sort();
                expected.dedup();
                (start + pos.min(rest.len()), expected)
            }
        };
        let at = at.min(span.end as usize);
        let found = describe_found(&self.src[at..span.end as usize]);
        let end = if at < span.end as usize { next_token_end(self.src, at, span.end as usize) } else { at };
        let message = if expected.is_empty() || expected.len() > 6 {
            format!("expected {what}, found {found}")
        } else {
            format!("expected {}, found {found}", join_or(&expected))
        };
        self.diags.push(
            Diagnostic::error(ErrorCode::E0001, message)
                .with_primary(Span::new(self.file, at, end), "unexpected here")
                .with_secondary(span, "this line was skipped")
                .with_help(format!("the parser expected {what} here")),
        );
    }
}

fn describe_token(t: &str) -> String {
    match t {
        "BUILTIN_RULE" => "a value".to_string(),
        "a..z" | "A..Z" | "_" => "a name".to_string(),
        "0..9" => "a number".to_string(),
        "\"" => "a string".to_string(),
        _ => format!("`{t}`"),
    }
}

fn describe_found(rest: &str) -> String {
    match rest.chars().next() {
        None => "the end of the line".to_string(),
        Some(c) if c.is_alphanumeric() || c == '_' => {
            let word: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').take(40).collect();
            format!("`{word}`")
        }
        Some(c) => format!("`{c}`"),
    }
}

fn next_token_end(src: &str, at: usize, limit: usize) -> usize {
    let rest = &src[at..limit];
    let mut chars = rest.char_indices();
    match chars.next() {
        None => at,
        Some((_, c)) if c.is_alphanumeric() || c == '_' => {
            at + rest
                .char_indices()
                .find(|(_, c)| !(c.is_alphanumeric() || *c == '_'))
                .map(|(i, _)| i)
                .unwrap_or(rest.len())
        }
        Some((_, c)) => at + c.len_utf8(),
    }
}

fn join_or(items: &[String]) -> String {
    match items.len() {
        0 => String::new(),
        1 => items[0].clone(),
        n => format!("{} or {}", items[..n - 1].join(", "), items[n - 1]),
    }
}
