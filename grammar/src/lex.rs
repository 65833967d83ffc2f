//! Passes over the raw text that need no grammar: comments, string literals and the trivia a
//! span should not underline.

use crate::ast::Comment;
use crate::diag::{FileId, Span};

/// Given `i` at an opening `"`, the index of its closing `"` (or of the end of the line or text
/// where a string is left open), stepping over `\` escapes.
pub(crate) fn string_end(bytes: &[u8], mut i: usize) -> usize {
    i += 1;
    while i < bytes.len() && bytes[i] != b'"' && bytes[i] != b'\n' {
        i += if bytes[i] == b'\\' { 2 } else { 1 };
    }
    i
}

/// Given `i` at `//`, the index of the end of that line.
pub(crate) fn line_end(bytes: &[u8], i: usize) -> usize {
    bytes[i..].iter().position(|&c| c == b'\n').map_or(bytes.len(), |n| i + n)
}

/// The end of `src[start..end]` without the whitespace and `//` comments pest lets a
/// non-atomic rule swallow after its last token (`path` in `extends base {`, a range at the end
/// of a line), so a span underlines only what was written.
pub(crate) fn trim_trivia(src: &str, start: usize, mut end: usize) -> usize {
    loop {
        let Some(text) = src.get(start..end) else { return end };
        let kept = text.trim_end_matches([' ', '\t', '\r', '\n', '\u{FEFF}']).len();
        end = start + kept;
        let line = text[..kept].rfind('\n').map(|i| i + 1).unwrap_or(0);
        if !text[line..kept].contains("//") {
            return end;
        }
        match line_comment(&text[line..kept]) {
            Some(c) if line + c > 0 => end = start + line + c,
            _ => return end,
        }
    }
}

/// Where a `//` comment (not a `///` doc comment) starts in one line, outside strings.
fn line_comment(line: &str) -> Option<usize> {
    let b = line.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'"' => i = string_end(b, i),
            b'/' if b.get(i + 1) == Some(&b'/') => {
                let doc = b.get(i + 2) == Some(&b'/') && b.get(i + 3) != Some(&b'/');
                return (!doc).then_some(i);
            }
            _ => {}
        }
        i += 1;
    }
    None
}

/// The offset just after the character at `at`.
pub(crate) fn next_char_boundary(src: &str, at: usize) -> usize {
    src[at.min(src.len())..].chars().next().map(|c| at + c.len_utf8()).unwrap_or(at)
}

/// Every `//` comment outside strings, in order.
pub fn collect_comments(file: FileId, src: &str) -> Vec<Comment> {
    let bytes = src.as_bytes();
    let mut out = Vec::new();
    let mut i = 0usize;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => i = string_end(bytes, i) + 1,
            b'/' if bytes.get(i + 1) == Some(&b'/') => {
                let start = i;
                i = line_end(bytes, i);
                let raw = &src[start..i];
                let doc = raw.starts_with("///") && !raw.starts_with("////");
                let text = if doc { &raw[3..] } else { &raw[2..] };
                out.push(Comment { span: Span::new(file, start, i), text: text.trim_end().to_string(), doc });
            }
            _ => i += 1,
        }
    }
    out
}

/// The value of a string literal (with its quotes).
pub fn unescape(lit: &str) -> String {
    let inner = lit.strip_prefix('"').and_then(|s| s.strip_suffix('"')).unwrap_or(lit);
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some('n') => out.push('\n'),
                Some('t') => out.push('\t'),
                Some(other) => out.push(other),
                None => {}
            }
        } else {
            out.push(c);
        }
    }
    out
}
