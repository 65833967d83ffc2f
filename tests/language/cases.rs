//! Data-driven compiler tests: every `tests/cases/NAME.miles` (or `tests/cases/NAME/main.miles`
//! with the modules beside it) is compiled through the real pipeline on an in-memory file
//! system; its diagnostics, rendered as plain text, and the stage graph of each recipe that
//! compiled, as JSON, are compared with `tests/cases/snapshots/NAME.snap`.
//!
//! Directives in the entry file: `// set: key=value` (a `--set` override, repeatable),
//! `// recipe: NAME` (compile only that recipe) and `// hub: DIR` (the Hugging Face cache
//! `hf { repo }` resolves in, a directory of the case).
//!
//! New or changed snapshots: `INSTA_UPDATE=always cargo test --test language cases::`, then
//! review every changed `.snap` with `git diff` before committing. CI (`CI=true`) never writes
//! snapshots.
//!
//! Besides the snapshots, this file asserts coverage: every code of E0001-E0399 in the registry
//! appears in some case, and every `check` of std/stages and std/prelude fails in some case.

use crate::common;

use common::{compile_files, invariant_violations, render};
use miles_compiler::eval::Eval;
use miles_compiler::value::ItemRef;
use miles_compiler::{Compilation, Options};
use miles_grammar::ast::ItemKind;
use miles_grammar::MAX_DEPTH;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

struct Case {
    name: String,
    /// Where the case's source lives (for the snapshot header).
    source: PathBuf,
    files: Vec<(String, Vec<u8>)>,
    entry: String,
}

fn cases_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cases")
}

fn read_tree(root: &Path, dir: &Path, out: &mut Vec<(String, Vec<u8>)>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir).unwrap().flatten().map(|e| e.path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            read_tree(root, &p, out);
        } else {
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().replace('\\', "/");
            out.push((rel, std::fs::read(&p).unwrap()));
        }
    }
}

fn load_cases() -> Vec<Case> {
    let dir = cases_dir();
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.path()).collect();
    paths.sort();
    let mut cases = Vec::new();
    for p in paths {
        let name = p.file_stem().unwrap().to_string_lossy().to_string();
        if name == "snapshots" {
            continue;
        }
        if p.is_dir() {
            let mut files = Vec::new();
            read_tree(&p, &p, &mut files);
            cases.push(Case { name, source: p, files, entry: "main.miles".into() });
        } else if p.extension().is_some_and(|e| e == "miles") {
            let file = p.file_name().unwrap().to_string_lossy().to_string();
            let bytes = std::fs::read(&p).unwrap();
            cases.push(Case { name, source: p, files: vec![(file.clone(), bytes)], entry: file });
        }
    }
    cases.extend(synthetic_cases());
    cases
}

/// Cases too big or too odd to keep as files.
fn synthetic_cases() -> Vec<Case> {
    let one = |name: &str, text: Vec<u8>| Case {
        name: name.into(),
        source: PathBuf::from(format!("tests/language/cases.rs ({name})")),
        files: vec![("main.miles".into(), text)],
        entry: "main.miles".into(),
    };
    // Just over the 8 MiB limit, made of valid constants.
    let mut big = String::new();
    let mut i = 0;
    while big.len() <= miles_grammar::MAX_FILE_BYTES {
        big.push_str(&format!("const c{i} = {i}\n"));
        i += 1;
    }
    let deep = format!("const x = {}1{}\n", "(".repeat(10_000), ")".repeat(10_000));
    let deep_list = format!("const y = {}{}\n", "[".repeat(300), "]".repeat(300));
    let at_limit = format!("const z = {}1{}\n", "(".repeat(MAX_DEPTH), ")".repeat(MAX_DEPTH));
    let over_limit = format!("const z = {}1{}\n", "(".repeat(MAX_DEPTH + 1), ")".repeat(MAX_DEPTH + 1));
    vec![
        one("synthetic_e0006_file_too_large", big.into_bytes()),
        one("synthetic_e0003_parens_10000_deep", deep.into_bytes()),
        one("synthetic_e0003_lists_300_deep", deep_list.into_bytes()),
        one("synthetic_parens_at_depth_limit", at_limit.into_bytes()),
        // An operator chain is not nesting: no E0003, however long (see grammar/src/depth.rs).
        one(
            "synthetic_sum_of_10000_terms",
            format!("const s = 1{}\nconst after = 1\n", " + 1".repeat(10_000)).into_bytes(),
        ),
        one("synthetic_sum_of_999_terms", format!("const s = 1{}\n", " + 1".repeat(999)).into_bytes()),
        one("synthetic_e0003_10000_negations", format!("const n = {}1\n", "- ".repeat(10_000)).into_bytes()),
        one("synthetic_e0003_10000_fields", format!("const f = a{}\n", ".b".repeat(10_000)).into_bytes()),
        one(
            "synthetic_e0003_10000_nested_ifs",
            format!("const i = {}1{}\nconst after = 1\n", "if true then ".repeat(10_000), " else 2".repeat(10_000))
                .into_bytes(),
        ),
        one(
            "synthetic_e0003_records_in_a_recipe",
            format!(
                "schema s {{ a: s? = none }}\nrecipe r {{\n    x = s {}{}\n}}\n",
                "{ a = s ".repeat(200),
                "}".repeat(200)
            )
            .into_bytes(),
        ),
        one("synthetic_e0003_parens_one_over_limit", over_limit.into_bytes()),
    ]
}

fn options(case: &Case) -> Options {
    let mut opts = Options::default();
    let entry = case.files.iter().find(|(p, _)| *p == case.entry).map(|(_, b)| String::from_utf8_lossy(b));
    for line in entry.iter().flat_map(|t| t.lines()) {
        if let Some(kv) = line.trim().strip_prefix("// set:") {
            let (k, v) = kv.trim().split_once('=').expect("`// set: key=value`");
            opts.overrides.push((k.trim().to_string(), v.trim().to_string()));
        } else if let Some(r) = line.trim().strip_prefix("// recipe:") {
            opts.recipe = Some(r.trim().to_string());
        } else if let Some(h) = line.trim().strip_prefix("// hub:") {
            opts.hub_cache = Some(h.trim().to_string());
        }
    }
    opts
}

fn snapshot_text(c: &Compilation, opts: &Options, files: &[(String, Vec<u8>)]) -> String {
    let errors = c.diagnostics.iter().filter(|d| d.is_error()).count();
    let warnings = c.diagnostics.len() - errors;
    let mut s = String::new();
    for (k, v) in &opts.overrides {
        s.push_str(&format!("--set {k}={v}\n"));
    }
    s.push_str(&format!("== {errors} error(s), {warnings} other(s)\n"));
    s.push_str(&render(&c.program.sources, &c.diagnostics));
    // The value of every constant, model and cluster of the entry file (evaluated again on the
    // compiled program; its diagnostics were reported above).
    // The case's files, as it was compiled with them (`hf { path }` reads a config.json).
    let fs = miles_compiler::fs::MemoryFs::new();
    for (p, bytes) in files {
        fs.insert(p, bytes.clone());
    }
    let mut ev = Eval::with_fs(&c.program, &fs);
    ev.hub_cache = opts.hub_cache.clone();
    for &m in &c.program.entries {
        for (index, item) in c.program.module(m).ast.items.iter().enumerate() {
            if let ItemKind::Const(_) | ItemKind::Model(_) | ItemKind::Cluster(_) = &item.kind {
                let name = item.name().map(|n| n.name.as_str()).unwrap_or("?");
                let v = ev.item_value(ItemRef { module: m, index: index as u32 });
                let shown = v.map(|v| v.to_string()).unwrap_or_else(|| "(error)".into());
                s.push_str(&format!("const {name} = {shown}\n"));
            }
        }
    }
    for r in &c.recipes {
        s.push_str(&format!("== recipe `{}`: settings\n", r.name));
        s.push_str(&serde_json::to_string(&r.settings.to_json()).unwrap());
        s.push('\n');
        s.push_str(&format!("== recipe `{}`: stage graph\n", r.name));
        s.push_str(&serde_json::to_string_pretty(&r.graph.to_json()).unwrap());
        s.push('\n');
    }
    s
}

#[test]
fn cases() {
    let cases = load_cases();
    assert!(cases.len() > 50, "tests/cases/ looks empty");
    let mut failures = Vec::new();
    let mut codes_seen = BTreeSet::new();
    let mut rules_seen = BTreeSet::new();
    let mut std_checks = BTreeSet::new();
    for case in &cases {
        let opts = options(case);
        let c = compile_files(&case.files, &case.entry, &opts);
        for v in invariant_violations(&c.program.sources, &c.diagnostics) {
            failures.push(format!("{}: {v}", case.name));
        }
        for d in &c.diagnostics {
            codes_seen.insert(d.code.as_str());
            if let Some(r) = &d.rule {
                rules_seen.insert((c.program.sources.get(r.span.file).unwrap().path.clone(), r.span.start));
            }
        }
        collect_std_checks(&c, &mut std_checks);
        let text = snapshot_text(&c, &opts, &case.files);
        let mut settings = insta::Settings::clone_current();
        settings.set_snapshot_path(cases_dir().join("snapshots"));
        settings.set_prepend_module_to_snapshot(false);
        settings.set_omit_expression(true);
        settings.set_description(
            case.source.strip_prefix(env!("CARGO_MANIFEST_DIR")).unwrap_or(&case.source).display().to_string(),
        );
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            settings.bind(|| insta::assert_snapshot!(case.name.as_str(), text));
        }));
        if result.is_err() {
            failures.push(format!("{}: snapshot differs (see above)", case.name));
        }
    }

    let missing: Vec<&str> = miles_grammar::codes::CODES
        .iter()
        .map(|c| c.code)
        .filter(|c| c.as_bytes()[2] <= b'3' && !codes_seen.contains(c) && !PACKAGE_CODES.contains(c))
        .collect();
    if !missing.is_empty() {
        failures.push(format!("no case reports these registered codes: {}", missing.join(", ")));
    }
    let uncovered: Vec<String> = std_checks
        .iter()
        .filter(|(file, start, _)| !rules_seen.contains(&(file.clone(), *start)))
        .map(|(file, _, line)| format!("{file}:{line}"))
        .collect();
    if !uncovered.is_empty() {
        failures.push(format!("no case makes these stdlib checks fail: {}", uncovered.join(", ")));
    }
    assert!(failures.is_empty(), "{} problem(s):\n{}", failures.len(), failures.join("\n"));
}

/// Codes that need a package build (a manifest, a lock, git): a single-file case cannot raise
/// them. engine/package/tests and tests/language/packages.rs make E0110-E0119 fire (E0119, a
/// library test that fails: `a_failing_library_test_is_e0119`).
const PACKAGE_CODES: &[&str] = &[
    "E0110", "E0111", "E0112", "E0113", "E0114", "E0115", "E0116", "E0117", "E0118", "E0119", "E0120", "E0121", "E0122",
];

/// (file, offset, line) of every `check`/`warn` in std/stages and std/prelude.
fn collect_std_checks(c: &Compilation, out: &mut BTreeSet<(String, u32, usize)>) {
    for m in &c.program.modules {
        if m.key != "std/stages" && m.key != "std/prelude" {
            continue;
        }
        for item in &m.ast.items {
            let checks = match &item.kind {
                ItemKind::Schema(s) => &s.checks,
                ItemKind::Stage(s) => &s.checks,
                _ => continue,
            };
            for ch in checks {
                let (line, _) = c.program.sources.line_col(ch.span);
                out.insert((m.key.clone(), ch.span.start, line));
            }
        }
    }
}
