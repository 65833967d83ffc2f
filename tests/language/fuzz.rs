//! Property tests: arbitrary bytes and mutated valid recipes go through the parser and the whole
//! check pipeline without a panic, and every diagnostic is well formed (a registered code, spans
//! inside their file on character boundaries).
//!
//! A bounded run is part of the normal suite; for a longer one:
//! `PROPTEST_CASES=20000 cargo test --release --test language fuzz::`. The cargo-fuzz target
//! under fuzz/ runs the same pipeline with coverage guidance (see fuzz/README.md).

use crate::common;

use common::{compile_files, invariant_violations};
use miles_compiler::Options;
use proptest::prelude::*;
use proptest::test_runner::Config;
use std::path::Path;

/// Valid sources to mutate: the shipped recipes, the valid cases and the standard library.
fn corpus() -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut out = Vec::new();
    for dir in ["recipes", "tests/cases", "stdlib/std"] {
        let mut paths: Vec<_> = std::fs::read_dir(root.join(dir)).unwrap().flatten().map(|e| e.path()).collect();
        paths.sort();
        for p in paths {
            let name = p.file_name().unwrap().to_string_lossy().to_string();
            let wanted = dir != "tests/cases" || name.starts_with("ok_") || name.starts_with("std_");
            if wanted && p.extension().is_some_and(|e| e == "miles") {
                out.push(std::fs::read_to_string(&p).unwrap());
            }
        }
    }
    assert!(out.len() >= 10);
    out
}

/// Fragments an edit may insert: tokens of the language and a few hostile ones.
const FRAGMENTS: &[&str] = &[
    "{",
    "}",
    "(",
    ")",
    "[",
    "]",
    ",",
    ".",
    "..",
    "..=",
    "->",
    "=",
    ":",
    "?",
    "\"",
    "\\",
    "//",
    "///",
    "\n",
    " ",
    "+",
    "-",
    "*",
    "/",
    "%",
    "==",
    "<=",
    "in",
    "is",
    "not",
    "and",
    "or",
    "if",
    "then",
    "else",
    "check",
    "warn",
    "recipe",
    "extends",
    "on",
    "stage",
    "schema",
    "const",
    "enum",
    "import",
    "std/",
    "./",
    "none",
    "true",
    "1",
    "0",
    "1e99",
    "99999999999999999999999999999999999999999",
    "8k",
    "1.5M",
    "4.tokens",
    "1.GiB",
    "3.parsecs",
    "é",
    "\u{FEFF}",
    "\u{0}",
    "rollout",
    "train",
    "sync",
    "generate(policy)",
    "weights(train -> rollout)",
    "x.y.z",
];

#[derive(Clone, Debug)]
enum Edit {
    Delete { at: usize, len: usize },
    Insert { at: usize, fragment: usize },
    Duplicate { at: usize, len: usize, to: usize },
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<usize>(), 1usize..40).prop_map(|(at, len)| Edit::Delete { at, len }),
        (any::<usize>(), 0..FRAGMENTS.len()).prop_map(|(at, fragment)| Edit::Insert { at, fragment }),
        (any::<usize>(), 1usize..80, any::<usize>()).prop_map(|(at, len, to)| Edit::Duplicate { at, len, to }),
    ]
}

fn floor_boundary(s: &str, mut i: usize) -> usize {
    i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn apply(src: &str, edits: &[Edit]) -> String {
    let mut s = src.to_string();
    for e in edits {
        let n = s.len().max(1);
        match *e {
            Edit::Delete { at, len } => {
                let a = floor_boundary(&s, at % n);
                let b = floor_boundary(&s, a + len);
                s.replace_range(a..b, "");
            }
            Edit::Insert { at, fragment } => {
                let a = floor_boundary(&s, at % n);
                s.insert_str(a, FRAGMENTS[fragment]);
            }
            Edit::Duplicate { at, len, to } => {
                let a = floor_boundary(&s, at % n);
                let b = floor_boundary(&s, a + len);
                let piece = s[a..b].to_string();
                let t = floor_boundary(&s, to % n);
                s.insert_str(t, &piece);
            }
        }
    }
    s
}

/// Compiles `bytes` as `main.miles` (with a helper module it may import) and checks the
/// diagnostics; `Err` describes what is wrong.
fn check_bytes(bytes: &[u8], recipe: Option<&str>) -> Result<(), String> {
    let files = vec![
        ("main.miles".to_string(), bytes.to_vec()),
        ("lib/helper.miles".to_string(), b"import ../main\nconst h = 1\n".to_vec()),
    ];
    let opts = Options {
        overrides: vec![("train.lr".into(), "1e-4".into()), ("stop".into(), "5.steps".into())],
        recipe: recipe.map(str::to_string),
        hub_cache: None,
    };
    let c = compile_files(&files, "main.miles", &opts);
    let bad = invariant_violations(&c.program.sources, &c.diagnostics);
    if bad.is_empty() {
        Ok(())
    } else {
        Err(bad.join("\n"))
    }
}

fn config(cases: u32) -> Config {
    Config { cases, failure_persistence: None, ..Config::default() }
}

proptest! {
    #![proptest_config(config(32))]

    #[test]
    fn arbitrary_bytes_never_break_the_checker(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let r = check_bytes(&bytes, None);
        prop_assert!(r.is_ok(), "{}", r.unwrap_err());
    }

    #[test]
    fn arbitrary_text_never_breaks_the_parser(text in "\\PC{0,400}") {
        let (_, diags) = miles_grammar::parse(miles_grammar::diag::FileId(0), &text);
        for d in diags {
            if let Some(p) = d.primary {
                prop_assert!(p.span.start <= p.span.end && p.span.end as usize <= text.len());
                prop_assert!(text.is_char_boundary(p.span.start as usize) && text.is_char_boundary(p.span.end as usize));
            }
        }
    }
}

proptest! {
    #![proptest_config(config(48))]

    #[test]
    fn mutated_recipes_never_break_the_checker(
        which in any::<prop::sample::Index>(),
        edits in proptest::collection::vec(edit(), 1..6),
    ) {
        let corpus = corpus();
        let src = apply(&corpus[which.index(corpus.len())], &edits);
        let r = check_bytes(src.as_bytes(), None);
        prop_assert!(r.is_ok(), "{}\n--- source ---\n{src}", r.unwrap_err());
    }
}

/// Edits that once broke the checker, replayed on every run.
#[test]
fn regressions() {
    let cases: &[&str] = &[
        "const x = -170141183460469231731687303715884105727 - 1\n",
        "const x = 1 in 0..=2\nconst y = 1 in 0..\n",
        "recipe r { x = a.b.c\n",
        "\u{FEFF}const é = 1\n",
    ];
    for src in cases {
        check_bytes(src.as_bytes(), None).unwrap();
        check_bytes(src.as_bytes(), Some("r")).unwrap();
    }
}
