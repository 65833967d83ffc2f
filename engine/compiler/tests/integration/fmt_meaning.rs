//! `miles fmt` never changes what a program means: every shipped recipe compiles to the same
//! stage graph, settings and diagnostics before and after formatting, and every constant of
//! every stdlib module evaluates to the same value. (grammar/tests/fmt.rs checks the trees and
//! idempotence; this checks the compiled results.)

use miles_compiler::eval::Eval;
use miles_compiler::fs::MemoryFs;
use miles_compiler::value::ItemRef;
use miles_compiler::{compile, Options};
use miles_grammar::ast::ItemKind;
use miles_grammar::fmt::format;
use std::path::{Path, PathBuf};

fn files_in(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "miles") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Everything a compilation produced that carries meaning, as text.
fn compiled(text: &str) -> String {
    let fs = MemoryFs::with(&[("r.miles", text)]);
    let c = compile(&fs, &["r.miles".to_string()], &Options::default());
    let mut out = String::new();
    for r in &c.recipes {
        out.push_str(&format!("recipe {}\nsettings {}\n", r.name, r.settings));
        out.push_str(&serde_json::to_string_pretty(&r.graph.to_json()).unwrap_or_default());
        out.push('\n');
    }
    for d in &c.diagnostics {
        out.push_str(&format!("{} {}\n", d.code, d.message));
    }
    out
}

/// The value of every constant, model and cluster of a module compiled as a user module.
fn values(text: &str) -> String {
    let fs = MemoryFs::with(&[("m.miles", text)]);
    let c = compile(&fs, &["m.miles".to_string()], &Options::default());
    let m = c.program.entries[0];
    let mut ev = Eval::new(&c.program);
    let mut out = String::new();
    for (index, item) in c.program.module(m).ast.items.iter().enumerate() {
        if matches!(item.kind, ItemKind::Const(_) | ItemKind::Model(_) | ItemKind::Cluster(_)) {
            let v = ev.item_value(ItemRef { module: m, index: index as u32 });
            let name = item.name().map(|n| n.name.clone()).unwrap_or_default();
            out.push_str(&format!("{name} = {}\n", v.map(|v| v.to_string()).unwrap_or_else(|| "<error>".into())));
        }
    }
    out
}

#[test]
fn formatted_recipes_compile_to_the_same_graphs() {
    let recipes = files_in(&root().join("recipes"));
    assert!(!recipes.is_empty());
    for p in recipes {
        let src = std::fs::read_to_string(&p).unwrap_or_default();
        let formatted = format(&src).unwrap_or_else(|d| panic!("{}: {d:?}", p.display()));
        let (before, after) = (compiled(&src), compiled(&formatted));
        assert!(before.contains("recipe "), "{}: compiled to nothing", p.display());
        assert_eq!(before, after, "{}: meaning changed", p.display());
    }
}

#[test]
fn formatted_stdlib_modules_evaluate_to_the_same_values() {
    let modules = files_in(&root().join("stdlib"));
    assert!(modules.len() >= 6);
    for p in modules {
        let src = std::fs::read_to_string(&p).unwrap_or_default();
        let formatted = format(&src).unwrap_or_else(|d| panic!("{}: {d:?}", p.display()));
        assert_eq!(values(&src), values(&formatted), "{}: values changed", p.display());
    }
}
