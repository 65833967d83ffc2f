//! The formatter on every shipped `.miles` file (stdlib/ and recipes/): the formatted text
//! parses to the same tree (spans aside) with the same comments, and formatting it again
//! changes nothing. `src/fmt.rs` also checks the compiled graphs and values are unchanged.

use miles_grammar::diag::FileId;
use miles_grammar::fmt::format;
use serde_json::Value;
use std::path::{Path, PathBuf};

fn shipped() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut out = Vec::new();
    let mut stack = vec![root.join("stdlib"), root.join("recipes")];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "miles") {
                out.push(p);
            }
        }
    }
    out.sort();
    assert!(out.len() >= 6, "expected the stdlib and recipes, found {out:?}");
    out
}

/// The tree as JSON without positions: what the program means, not where it was written.
fn strip_spans(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.retain(|_, x| !(x.is_object() && x.get("start").is_some() && x.get("file").is_some()));
            m.values_mut().for_each(strip_spans);
        }
        Value::Array(a) => a.iter_mut().for_each(strip_spans),
        _ => {}
    }
}

fn tree(src: &str) -> (Value, Vec<String>) {
    let (f, diags) = miles_grammar::parse(FileId(0), src);
    assert!(diags.iter().all(|d| !d.is_error()), "{diags:?}");
    let mut items = serde_json::to_value(&f.items).unwrap_or(Value::Null);
    strip_spans(&mut items);
    (items, f.comments.iter().map(|c| c.text.clone()).collect())
}

#[test]
fn formatting_shipped_files_keeps_meaning_and_is_idempotent() {
    for path in shipped() {
        let src = std::fs::read_to_string(&path).unwrap_or_default();
        let once = format(&src).unwrap_or_else(|d| panic!("{}: {d:?}", path.display()));
        let twice = format(&once).unwrap_or_else(|d| panic!("{} formatted: {d:?}", path.display()));
        assert_eq!(twice, once, "{}: formatting twice differs from once", path.display());
        let (before, comments_before) = tree(&src);
        let (after, comments_after) = tree(&once);
        assert!(before == after, "{}: the tree changed", path.display());
        assert_eq!(comments_before, comments_after, "{}: comments changed", path.display());
    }
}
