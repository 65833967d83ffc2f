//! Parsing a file chunk by chunk: the text is cut before top-level items by a raw-text scan,
//! each chunk is parsed on its own (spans moved to where it sits), and a `ChunkCache` keeps the
//! chunks of the last text so that an edit reparses only the chunks whose text changed.
//!
//! The result must be exactly that of parsing the whole text at once (tests below and every
//! snapshot test check it). PEG parsing never looks back, so a chunk parses alone as it does in
//! the file unless something in it reads past its end. A cut is made only where nothing should:
//! - before a line whose column 0 begins an item (`item_head` in the grammar: a keyword, blanks,
//!   a name), or before the `///` block documenting such a line, with no bracket open
//!   (counted outside strings and comments; a closer of the wrong kind closes nothing, so a
//!   typo keeps the rest of the file in one chunk and the missing-`}` recovery is unchanged);
//! - after a token that ends an expression or a clause (a name that is not a keyword, a number,
//!   a string, a closing bracket): after `=`, `+`, `import`, `.`, ... the next word (`model` is
//!   a name) would continue the item across the line.
//!
//! The recovery rules, which read raw text where the scan sees strings and comments, can still
//! read past the cut: the builder notes it (`TextParse::hit_end`) and the chunk is then parsed
//! together with the rest of the file. A pest failure (a bug, or its stack guard) drops every
//! item of a whole-file parse, so it falls back to one.

use super::{parse_text, refuse, TextParse};
use crate::ast::SourceFile;
use crate::diag::{Diagnostic, FileId};
use crate::lex::{line_end, string_end};
use crate::shift::Shift;
use std::collections::HashMap;
use std::sync::Arc;

/// The chunks of the last text one file was parsed from, by text (spans relative to the
/// chunk, file 0). Each parse replaces them with the new text's, so memory follows the file.
#[derive(Default)]
pub struct ChunkCache {
    chunks: HashMap<String, Arc<TextParse>>,
    parses: usize,
}

impl ChunkCache {
    pub fn new() -> ChunkCache {
        ChunkCache::default()
    }

    /// How many chunk texts this cache has parsed (reuse shows as a count that does not grow).
    pub fn parses(&self) -> usize {
        self.parses
    }

    /// How many chunks the last text had.
    pub fn len(&self) -> usize {
        self.chunks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }
}

/// `parse`, reusing the chunks of `cache` whose text is unchanged and leaving the new text's
/// chunks in it.
pub fn parse_cached(file: FileId, src: &str, cache: &mut ChunkCache) -> (SourceFile, Vec<Diagnostic>) {
    parse_chunked(file, src, Some(cache))
}

/// One chunk: `src[start..end]`; its last significant text ends at `start + sig_end`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Chunk {
    pub(crate) start: usize,
    pub(crate) end: usize,
    pub(crate) sig_end: usize,
}

/// `parse`: chunk by chunk, through `cache` when there is one (see the module comment).
pub(crate) fn parse_chunked(
    file: FileId,
    src: &str,
    mut cache: Option<&mut ChunkCache>,
) -> (SourceFile, Vec<Diagnostic>) {
    let comments = crate::collect_comments(file, src);
    if let Some(diags) = refuse(file, src) {
        if let Some(c) = cache {
            c.chunks.clear();
        }
        return (SourceFile { items: Vec::new(), comments }, diags);
    }
    let chunks = split(src);
    let mut old = cache.as_deref_mut().map(|c| std::mem::take(&mut c.chunks));
    let mut kept: HashMap<String, Arc<TextParse>> = HashMap::new();
    let mut items = Vec::new();
    let mut diags = Vec::new();
    let mut k = 0;
    while k < chunks.len() {
        let c = chunks[k];
        let mut text = &src[c.start..c.end];
        let mut parsed = chunk_parse(text, c.sig_end, old.as_mut(), cache.as_deref_mut());
        k += 1;
        if parsed.hit_end() && k < chunks.len() {
            // The chunk read past its end: parse it with the rest of the file. (Kept, so that
            // the next text finds at once that it must.)
            if let Parsed::Shared(p) = parsed {
                kept.insert(text.to_string(), p);
            }
            let last = chunks[chunks.len() - 1];
            text = &src[c.start..];
            parsed = chunk_parse(text, last.start - c.start + last.sig_end, old.as_mut(), cache.as_deref_mut());
            k = chunks.len();
        }
        if parsed.failed() {
            let whole = parse_text(file, src, usize::MAX);
            if let Some(c) = cache {
                c.chunks.clear();
            }
            return (SourceFile { items: whole.items, comments }, whole.diags);
        }
        let shift = Shift { file, by: c.start as u32 };
        let moved = |(mut new_items, mut new_diags): (Vec<_>, Vec<Diagnostic>)| {
            if shift.by != 0 || file != FileId::default() {
                new_items.iter_mut().for_each(|i| shift.item(i));
                new_diags.iter_mut().for_each(|d| shift.diagnostic(d));
            }
            (new_items, new_diags)
        };
        let (new_items, new_diags) = match parsed {
            Parsed::Owned(p) => moved((p.items, p.diags)),
            Parsed::Shared(p) => {
                let out = moved((p.items.clone(), p.diags.clone()));
                kept.insert(text.to_string(), p);
                out
            }
        };
        items.extend(new_items);
        diags.extend(new_diags);
    }
    if let Some(c) = cache {
        c.chunks = kept;
    }
    (SourceFile { items, comments }, diags)
}

enum Parsed {
    Owned(TextParse),
    Shared(Arc<TextParse>),
}

impl Parsed {
    fn hit_end(&self) -> bool {
        match self {
            Parsed::Owned(p) => p.hit_end,
            Parsed::Shared(p) => p.hit_end,
        }
    }
    fn failed(&self) -> bool {
        match self {
            Parsed::Owned(p) => p.failed,
            Parsed::Shared(p) => p.failed,
        }
    }
}

/// The parse of one chunk's text: from the old chunks when there is a cache and it holds the
/// text, else parsed now.
fn chunk_parse(
    text: &str,
    sig_end: usize,
    old: Option<&mut HashMap<String, Arc<TextParse>>>,
    cache: Option<&mut ChunkCache>,
) -> Parsed {
    let Some(cache) = cache else { return Parsed::Owned(parse_text(FileId::default(), text, sig_end)) };
    if let Some(p) = old.and_then(|old| old.get(text)) {
        return Parsed::Shared(p.clone());
    }
    cache.parses += 1;
    Parsed::Shared(Arc::new(parse_text(FileId::default(), text, sig_end)))
}

/// Words after which the next line's first word would continue the item: keywords that take
/// something after them. (A name, a number or a closing bracket ends an expression.)
const CONTINUES: &[&str] = &[
    "import",
    "as",
    "extends",
    "on",
    "is",
    "in",
    "not",
    "and",
    "or",
    "if",
    "then",
    "else",
    "check",
    "warn",
    "help",
    "const",
    "enum",
    "interface",
    "schema",
    "stage",
    "model",
    "cluster",
    "recipe",
];

/// The item keywords (`item_head` in the grammar).
const ITEM_WORDS: &[&str] = &["import", "const", "enum", "interface", "schema", "stage", "recipe", "model", "cluster"];

/// Whether an item begins at `i` as the grammar's `item_head` reads it: a keyword, spaces or
/// tabs, then a letter, `_`, `.` or `"`.
fn item_head_at(b: &[u8], i: usize) -> bool {
    ITEM_WORDS.iter().any(|w| {
        if !b[i..].starts_with(w.as_bytes()) {
            return false;
        }
        let blanks = i + w.len();
        let mut j = blanks;
        while j < b.len() && matches!(b[j], b' ' | b'\t') {
            j += 1;
        }
        j > blanks && j < b.len() && (b[j].is_ascii_alphabetic() || matches!(b[j], b'_' | b'.' | b'"'))
    })
}

enum Line {
    /// A `///` doc comment line.
    Doc,
    /// Blank, or only a `//` comment.
    Trivia,
    Other,
}

fn line_kind(b: &[u8], mut i: usize) -> Line {
    while i < b.len() && matches!(b[i], b' ' | b'\t' | b'\r') {
        i += 1;
    }
    if i >= b.len() || b[i] == b'\n' {
        Line::Trivia
    } else if b[i..].starts_with(b"///") && b.get(i + 3) != Some(&b'/') {
        Line::Doc
    } else if b[i..].starts_with(b"//") {
        Line::Trivia
    } else {
        Line::Other
    }
}

/// Cuts `src` into chunks (see the module comment). Always at least one chunk.
pub(crate) fn split(src: &str) -> Vec<Chunk> {
    let b = src.as_bytes();
    // (where a chunk starts, where the significant text before it ends)
    let mut cuts: Vec<(usize, usize)> = Vec::new();
    let mut open: Vec<u8> = Vec::new();
    // Whether the last significant token lets the next line start a chunk, and its end.
    let (mut ends, mut sig_end) = (true, 0usize);
    // The first line of the `///` block above the coming line, and the state before it.
    let mut doc: Option<(usize, bool, usize)> = None;
    let mut line_start = true;
    let mut i = 0;
    while i < b.len() {
        if line_start {
            line_start = false;
            match line_kind(b, i) {
                Line::Doc => {
                    doc.get_or_insert((i, ends, sig_end));
                }
                Line::Trivia => {}
                Line::Other => {
                    if open.is_empty() && item_head_at(b, i) {
                        let (at, ok, end) = doc.unwrap_or((i, ends, sig_end));
                        if ok && at > 0 {
                            cuts.push((at, end));
                        }
                    }
                    doc = None;
                }
            }
        }
        match b[i] {
            b'\n' => {
                i += 1;
                line_start = true;
                continue;
            }
            b' ' | b'\t' | b'\r' => {
                i += 1;
                continue;
            }
            b'"' => {
                let e = string_end(b, i);
                // An unclosed string is no string to the grammar: read on after the quote.
                let closed = b.get(e) == Some(&b'"');
                i = if closed { e + 1 } else { i + 1 };
                ends = closed;
            }
            b'/' if b.get(i + 1) == Some(&b'/') => {
                let doc_comment = b.get(i + 2) == Some(&b'/') && b.get(i + 3) != Some(&b'/');
                let e = line_end(b, i);
                if !doc_comment {
                    // A comment is trivia: the state before it stands.
                    i = e;
                    continue;
                }
                i = e;
                ends = false;
            }
            c @ (b'(' | b'[' | b'{') => {
                open.push(c);
                i += 1;
                ends = false;
            }
            c @ (b')' | b']' | b'}') => {
                let opener = match c {
                    b')' => b'(',
                    b']' => b'[',
                    _ => b'{',
                };
                ends = open.last() == Some(&opener);
                if ends {
                    open.pop();
                }
                i += 1;
            }
            c if c.is_ascii_alphanumeric() || c == b'_' => {
                let s = i;
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                    i += 1;
                }
                ends = !CONTINUES.contains(&&src[s..i]);
            }
            _ => {
                i += 1;
                ends = false;
            }
        }
        sig_end = i;
    }
    let mut chunks = Vec::with_capacity(cuts.len() + 1);
    let mut start = 0;
    for (at, end) in cuts {
        chunks.push(Chunk { start, end: at, sig_end: end - start });
        start = at;
    }
    chunks.push(Chunk { start, end: src.len(), sig_end: sig_end.max(start) - start });
    chunks
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::parse_whole;

    /// The chunked parse of `src`, with and without a cache (the cache first holding `before`'s
    /// chunks), must equal the parse of the whole text at once.
    fn same(before: &str, src: &str, what: &str) {
        let file = FileId(3);
        let whole = parse_whole(file, src);
        let chunked = parse_chunked(file, src, None);
        if chunked != whole {
            let cuts: Vec<usize> = split(src).iter().map(|c| c.start).collect();
            panic!("{what}: chunked parse differs (cuts at {cuts:?})\n--- text\n{src}\n--- whole\n{whole:#?}\n--- chunked\n{chunked:#?}");
        }
        let mut cache = ChunkCache::new();
        let _ = parse_cached(file, before, &mut cache);
        assert!(parse_cached(file, src, &mut cache) == whole, "{what}: cached parse differs\n{src}");
    }

    /// Every `.miles` file under the repository's recipes, stdlib, test cases and examples.
    fn corpus() -> Vec<(String, String)> {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut dirs: Vec<_> = ["recipes", "stdlib", "tests/cases", "examples"].iter().map(|d| root.join(d)).collect();
        let mut out = Vec::new();
        while let Some(dir) = dirs.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else { continue };
            for e in entries.flatten() {
                let path = e.path();
                if path.is_dir() {
                    dirs.push(path);
                } else if path.extension().is_some_and(|x| x == "miles") {
                    if let Ok(bytes) = std::fs::read(&path) {
                        out.push((path.display().to_string(), String::from_utf8_lossy(&bytes).into_owned()));
                    }
                }
            }
        }
        out.sort();
        out
    }

    /// A small seeded generator (xorshift), so a failure reproduces.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n.max(1) as u64) as usize
        }
    }

    /// What random edits insert: brackets, quotes, comment and doc markers, operators, line
    /// breaks and the words that start items, the characters the chunk scan reads.
    /// (`|`-separated.)
    const INSERTS: &str =
        "{|}|(|)|[|]|\"|\n|/|//|///| |=|+|.|,|x|1|\\|model |const |import |recipe |\nmodel m = |\nconst \
                           |\n/// d\n|\nimport | if | in |..";

    fn edit(rng: &mut Rng, text: &str) -> String {
        let mut at = rng.below(text.len() + 1);
        while !text.is_char_boundary(at) {
            at -= 1;
        }
        let mut out = text[..at].to_string();
        if rng.below(2) == 0 {
            let inserts: Vec<&str> = INSERTS.split('|').collect();
            out.push_str(inserts[rng.below(inserts.len())]);
            out.push_str(&text[at..]);
        } else {
            let mut end = (at + 1 + rng.below(4)).min(text.len());
            while !text.is_char_boundary(end) {
                end += 1;
            }
            out.push_str(&text[end..]);
        }
        out
    }

    #[test]
    fn every_repository_file_parses_the_same_in_chunks() {
        let files = corpus();
        assert!(files.len() > 50, "found only {} .miles files", files.len());
        let mut cut = 0;
        for (path, text) in &files {
            cut += split(text).len() - 1;
            same("", text, path);
        }
        // The scan does cut real files.
        assert!(cut > files.len(), "only {cut} cuts in {} files", files.len());
    }

    #[test]
    fn random_edits_parse_the_same_in_chunks() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for (path, text) in corpus() {
            // A few chains of edits per file, each edit parsed after the one before.
            for chain in 0..3 {
                let mut current = text.clone();
                for step in 0..6 {
                    let next = edit(&mut rng, &current);
                    same(&current, &next, &format!("{path}, chain {chain}, edit {step}"));
                    current = next;
                }
            }
        }
    }

    #[test]
    fn recovery_that_reads_past_a_cut_is_the_same() {
        let cases = [
            "const x = 1 +\nmodel m = 1\n",
            "const x = 1 +\nconst y = 2\n",
            "import\nconst x = 1\n",
            "import a as\nmodel m = 1\n",
            "const x = a.\nmodel m = 1\n",
            "const x = not\ncluster c = 1\n",
            "recipe r {\n  a = 1 )\n/// doc\nconst y = 1\n",
            "recipe r {\n  a = \"x {\n  }\n/// doc\nconst y = 1\n",
            "recipe r {\n  foo \"{\" bar\n  a = 1\n}\n/// doc\nconst y = 1\n",
            "foo // {\nconst y = 1\n",
            "foo \"{\" x\nconst y = 1\n",
            "foo \"[\" x\n/// d\nconst y = 1\n",
            "const x = if a\ninterface I\n",
            "const x = if a then b\nenum E { a }\n",
            "const x = [a)\nconst y = 1\n",
            "const x = 1\n/// doc\nfoo\nconst y = 2\n",
            "const x = 1\n/// doc\n\n// note\n/// more\nconst y = 2\n",
            "recipe r {\n  a = 1\nconst y = 2\n",
            "schema s {\n  a: Int = 1\n}\n}\nconst y = 2\n",
            "const s = \"a\\\nconst y = 1\"\nconst z = 2\n",
            "const x = 1..\nconst y = 2..=3\nconst z = ..4\n",
            "stage s(a: Int) -> Out {\n}\nstage t(\nconst y = 1\n",
            "/// only a doc\n",
            "const x = 1",
        ];
        for src in cases {
            same("", src, src);
        }
    }

    #[test]
    fn cuts_fall_before_items_and_their_docs() {
        let src =
            "import std/a\n\n/// The answer.\n/// Twice.\nconst x = 42\nconst y = f(\n  1)\nmodel m = t { a = 1 }\n";
        let starts: Vec<usize> = split(src).iter().map(|c| c.start).collect();
        let doc = src.find("/// The").unwrap_or(0);
        let y = src.find("const y").unwrap_or(0);
        let m = src.find("model m").unwrap_or(0);
        assert_eq!(starts, [0, doc, y, m]);
        // No cut while a bracket is open, nor after a word that takes more.
        assert_eq!(split("recipe r {\nconst y = 1\n").len(), 1);
        assert_eq!(split("const x = a and\nconst y = 1\n").len(), 1);
    }

    #[test]
    fn a_cache_reparses_only_changed_chunks() {
        let a = "const a = 1\nconst b = 2\nconst c = 3\n";
        let mut cache = ChunkCache::new();
        let _ = parse_cached(FileId(1), a, &mut cache);
        assert_eq!((cache.parses(), cache.len()), (3, 3));
        // Longer before `c`: `a` is reused in place, `c` moved.
        let b = "const a = 1\nconst b = 2000\nconst c = 3\n";
        assert!(parse_cached(FileId(1), b, &mut cache) == parse_whole(FileId(1), b));
        assert_eq!(cache.parses(), 4);
        // Shorter before `b` and `c`, and a different file id.
        let c = "const a = 0\nconst b = 2000\nconst c = 3\n";
        assert!(parse_cached(FileId(2), c, &mut cache) == parse_whole(FileId(2), c));
        assert_eq!((cache.parses(), cache.len()), (5, 3));
    }
}
