//! Test fixtures: files separated by `//- path` lines (the first file, or the one holding the
//! `$0` cursor, is the entry), compiled from memory; and renderers that turn spans into short
//! text (`path:line:col-line:col`, 1-based; a stdlib span shows its module only, since stdlib
//! lines move whenever the stdlib grows).
//!
//! ```text
//! //- main.miles
//! import ./lib
//! const x = lib.y$0
//! //- lib.miles
//! const y = 1
//! ```

use crate::Analysis;
use miles_compiler::fs::MemoryFs;
use miles_compiler::program::{PackageRoot, Packages};
use miles_grammar::diag::{FileId, Span};

pub struct Fixture {
    pub fs: MemoryFs,
    /// The file holding `$0` (or the first file) and the cursor's byte offset in it.
    pub main: String,
    pub offset: usize,
}

impl Fixture {
    pub fn parse(text: &str) -> Fixture {
        let mut files: Vec<(String, String)> = Vec::new();
        for line in text.split_inclusive('\n') {
            if let Some(name) = line.strip_prefix("//- ") {
                files.push((name.trim().to_string(), String::new()));
            } else if let Some((_, t)) = files.last_mut() {
                t.push_str(line);
            } else {
                files.push(("main.miles".to_string(), line.to_string()));
            }
        }
        let mut main = files.first().map(|f| f.0.clone()).unwrap_or_default();
        let mut offset = 0;
        for (name, t) in files.iter_mut() {
            if let Some(at) = t.find("$0") {
                t.replace_range(at..at + 2, "");
                offset = at;
                main = name.clone();
            }
        }
        let fs = MemoryFs::new();
        for (name, t) in &files {
            fs.insert(name, t.as_bytes().to_vec());
        }
        Fixture { fs, main, offset }
    }

    /// The analysis of one document, as the language server compiles it.
    pub fn analysis(&self, entry: &str) -> Analysis {
        let c = miles_compiler::compile(&self.fs, &[entry.to_string()], &Default::default());
        Analysis::new(c)
    }

    /// One analysis per open document, as the language server keeps them: the cursor's document
    /// first, then `open`; and the cursor's file id in the first.
    pub fn open_documents(&self, open: &[&str]) -> (Vec<Analysis>, FileId) {
        let docs = std::iter::once(self.main.as_str()).chain(open.iter().copied());
        let analyses: Vec<Analysis> = docs.map(|d| self.analysis(d)).collect();
        let file = analyses[0].file_id(&self.main).unwrap_or_default();
        (analyses, file)
    }
}

/// A package build for fixtures: `team` (root `team/`) depends on `platform` (root
/// `deps/platform/`, modules listed as the language server lists them).
pub fn packages(platform_modules: &[&str]) -> Packages {
    Packages {
        roots: vec![
            PackageRoot {
                name: "team".into(),
                root: "team".into(),
                dependencies: vec!["platform".into()],
                ..Default::default()
            },
            PackageRoot {
                name: "platform".into(),
                root: "deps/platform".into(),
                modules: platform_modules.iter().map(|m| m.to_string()).collect(),
                ..Default::default()
            },
        ],
        ..Default::default()
    }
}

/// `at_cursor` in a package build.
pub fn at_cursor_in(text: &str, packages: &Packages) -> (Analysis, FileId, usize) {
    let fx = Fixture::parse(text);
    let c = miles_compiler::compile_in(&fx.fs, std::slice::from_ref(&fx.main), &Default::default(), packages);
    let a = Analysis::new(c);
    let file = a.file_id(&fx.main).unwrap_or_default();
    (a, file, fx.offset)
}

/// The entry file's analysis, the cursor's file and offset.
pub fn at_cursor(text: &str) -> (Analysis, FileId, usize) {
    let fx = Fixture::parse(text);
    let a = fx.analysis(&fx.main);
    let file = a.file_id(&fx.main).unwrap_or_default();
    (a, file, fx.offset)
}

/// `main.miles:3:7-3:14`, or `std/stages` for the stdlib.
pub fn loc(a: &Analysis, span: Span) -> String {
    let Some(src) = a.program().sources.get(span.file) else { return "?".into() };
    if src.path.starts_with("std/") {
        return src.path.clone();
    }
    let (l, c) = line_col(&src.text, span.start as usize);
    let (el, ec) = line_col(&src.text, span.end as usize);
    format!("{}:{l}:{c}-{el}:{ec}", src.path)
}

/// 1-based line and column (in bytes: fixtures are ASCII).
pub fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = offset - before.rfind('\n').map(|i| i + 1).unwrap_or(0) + 1;
    (line, col)
}

/// The text a span covers.
pub fn text_of(a: &Analysis, span: Span) -> &str {
    a.text(span.file).get(span.range()).unwrap_or("")
}

/// A recipe that imports a library module and the stdlib task; the text `$0` stands in for goes
/// in the training stage's block, or the caller moves the cursor with `replace`.
pub fn recipe(body_marker: &str) -> String {
    format!(
        r#"//- main.miles
import std/tasks/arith
import ./lib/common

/// The policy.
model policy = transformer {{ layers = 2, d_model = 64, heads = 4, vocab = arith.vocab }}

recipe tiny {{
    rollout = generate(policy) {{
        prompts        = arith.addition {{ digits = 2 }}
        max_new_tokens = common.answer_tokens
    }}
    reward = exact_match(rollout)
    train  = grpo(rollout, reward) {{
        rollout_batch = 16
        global_batch  = 128
        lr            = common.peak_lr
        {body_marker}
    }}
    sync = weights(train -> rollout)
    stop = 100.steps
}}
//- lib/common.miles
/// Peak learning rate of every recipe of the team.
const peak_lr = 3e-4
/// Answer length in tokens.
const answer_tokens = 2.tokens * 2
"#
    )
}

/// A file whose first item does not parse, then a schema and `last_line` (holding `$0`) that uses
/// it: a feature must still answer in the items that parse.
pub fn after_a_syntax_error(last_line: &str) -> String {
    format!(
        r#"const broken = [1, 2
schema lr_schedule {{
    /// Peak learning rate.
    peak: Float in 0..1 = 1e-4
    warmup: Steps = 100.steps
}}
{last_line}
"#
    )
}
