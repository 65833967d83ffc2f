//! End-to-end tests of the built `miles` binary: real processes, real files, exit codes and
//! output formats. Bad input must never panic, hang or overflow the stack: it exits 1 with
//! diagnostics.

use crate::common;

use common::process::output;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs `miles args...` from the repository root, killed after 60 s.
fn miles(args: &[&str]) -> Run {
    let o =
        output(common::process::miles().args(args).current_dir(env!("CARGO_MANIFEST_DIR")), Duration::from_secs(60));
    Run {
        code: o.status.code(),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

/// A scratch file under cargo's per-test temporary directory.
fn scratch(name: &str, bytes: &[u8]) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli");
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Exit 1 with at least one diagnostic, and no sign of a crash.
fn assert_clean_failure(r: &Run, what: &str) {
    assert_eq!(r.code, Some(1), "{what}: exit code\nstderr:\n{}", r.stderr);
    assert!(
        !r.stderr.contains("panicked") && !r.stderr.contains("overflowed its stack"),
        "{what}: crashed:\n{}",
        r.stderr
    );
    assert!(r.stderr.contains("error[E") || r.stderr.contains("E0"), "{what}: no diagnostic:\n{}", r.stderr);
}

fn json_check(path: &str) -> (Option<i32>, serde_json::Value) {
    let r = miles(&["check", "--format", "json", path]);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap_or_else(|e| panic!("{e}: {}", r.stdout));
    (r.code, v)
}

#[test]
fn shipped_recipes_check_cleanly() {
    let mut n = 0;
    for e in std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("recipes")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "miles") {
            let (code, v) = json_check(s(&p));
            assert_eq!(code, Some(0), "{}: {v:#}", p.display());
            assert_eq!(v["errors"], 0, "{}", p.display());
            n += 1;
        }
    }
    assert!(n >= 2, "recipes/ holds the shipped recipes");
}

#[test]
fn check_exit_codes() {
    assert_eq!(miles(&["check", "recipes/grpo-arith.miles"]).code, Some(0));
    let r = miles(&["check", "tests/cases/e0202_unit_mismatch.miles"]);
    assert_eq!(r.code, Some(1));
    assert!(r.stderr.contains("E0202") && r.stderr.contains("failed:"), "{}", r.stderr);
    // Warnings alone pass, unless denied.
    let warn = "tests/cases/e0305_unused_stage.miles";
    let r = miles(&["check", warn]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.stderr.contains("E0305"), "{}", r.stderr);
    assert_eq!(miles(&["check", "--deny-warnings", warn]).code, Some(1));
    // --set with full type checking; a malformed --set is a usage error.
    assert_eq!(miles(&["check", "recipes/grpo-arith.miles", "--set", "train.lr=1e-4"]).code, Some(0));
    let r = miles(&["check", "recipes/grpo-arith.miles", "--set", "train.lr=fast"]);
    assert_eq!(r.code, Some(1), "{}", r.stderr);
    assert_eq!(miles(&["check", "recipes/grpo-arith.miles", "--set", "novalue"]).code, Some(2));
    // A whole stage replaced by --set is a diagnostic (it once panicked), not a crash.
    let r =
        miles(&["check", "recipes/grpo-arith.miles", "--set", "reward=exact_match(rollout) { partial_credit = true }"]);
    assert_eq!(r.code, Some(1), "{}", r.stderr);
    assert!(r.stderr.contains("E0209") && r.stderr.contains("cannot replace the stage `reward`"), "{}", r.stderr);
}

/// `miles check` says once per run which checked files are not in `miles fmt`'s layout, as a
/// hint that changes neither the exit status nor the diagnostics (issue #42); a formatted file
/// gets no hint.
#[test]
fn check_hints_once_at_files_miles_fmt_would_change() {
    let src = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("recipes/grpo-arith.miles")).unwrap();
    let src = miles_grammar::fmt::format(&src).unwrap();
    let tidy = scratch("fmt_hint_tidy.miles", src.as_bytes());
    let messy = scratch("fmt_hint_messy.miles", src.replace("    rollout = ", "    rollout     =   ").as_bytes());
    let other = scratch("fmt_hint_other.miles", src.replace("    reward = ", "  reward = ").as_bytes());
    let r = miles(&["check", s(&tidy)]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(!r.stderr.contains("miles fmt"), "a formatted file gets no hint:\n{}", r.stderr);
    let r = miles(&["check", s(&messy), s(&other), s(&tidy)]);
    assert_eq!(r.code, Some(0), "a hint is not an error:\n{}", r.stderr);
    let hints: Vec<&str> = r.stderr.lines().filter(|l| l.contains("miles fmt")).collect();
    assert_eq!(hints.len(), 1, "one hint per run:\n{}", r.stderr);
    assert!(hints[0].starts_with("hint: "), "{}", hints[0]);
    assert!(hints[0].contains("fmt_hint_messy.miles") && hints[0].contains("fmt_hint_other.miles"), "{}", hints[0]);
    assert!(!hints[0].contains("fmt_hint_tidy.miles"), "{}", hints[0]);
    // With --deny-warnings too: a layout is not a warning.
    assert_eq!(miles(&["check", "--deny-warnings", s(&messy)]).code, Some(0));
    // JSON output stays one JSON document.
    let (code, v) = json_check(s(&messy));
    assert_eq!((code, v["errors"].as_u64()), (Some(0), Some(0)));
}

#[test]
fn check_json_output() {
    let (code, v) = json_check("tests/cases/multi_five_mistakes.miles");
    assert_eq!(code, Some(1));
    assert_eq!(v["format_version"], 1);
    let diags = v["diagnostics"].as_array().unwrap();
    assert_eq!(v["errors"].as_u64().unwrap() as usize, diags.len());
    // Five mistakes, all reported at once, each at its line (the batch rule fails twice).
    let got: Vec<(String, u64)> = diags
        .iter()
        .map(|d| (d["code"].as_str().unwrap().to_string(), d["primary"]["location"]["line"].as_u64().unwrap()))
        .collect();
    // Line 19 (the stage): the batch identity, and micro_batch (8, its default) not dividing 100;
    // line 21: whole groups, at the `global_batch = 100` that rule blames.
    let want =
        [("E0202", 15), ("E0105", 16), ("E0301", 19), ("E0301", 19), ("E0301", 21), ("E0109", 23), ("E0203", 26)];
    let want: Vec<(String, u64)> = want.iter().map(|(c, l)| (c.to_string(), *l)).collect();
    assert_eq!(got, want);
    for d in diags {
        assert_eq!(d["severity"], "error");
        assert!(d["message"].as_str().is_some_and(|m| !m.is_empty()));
        let loc = &d["primary"]["location"];
        assert!(loc["file"].as_str().unwrap().ends_with("multi_five_mistakes.miles"));
        assert!(loc["column"].as_u64().unwrap() >= 1);
        assert!(loc["start"].as_u64().unwrap() <= loc["end"].as_u64().unwrap());
    }
    let rule = diags.iter().find_map(|d| d["rule"]["name"].as_str()).unwrap();
    assert_eq!(rule, "std/stages.grpo");
}

#[test]
fn graph_formats() {
    let f = "recipes/grpo-arith.miles";
    let r = miles(&["graph", f, "--format", "mermaid"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.stdout.starts_with("flowchart LR"));
    assert!(r.stdout.contains("train -- Policy --> sync") && r.stdout.contains("-. Weights .->"), "{}", r.stdout);
    let r = miles(&["graph", f, "--format", "dot"]);
    assert_eq!(r.code, Some(0));
    assert!(r.stdout.starts_with("digraph") && r.stdout.contains("style=dashed"), "{}", r.stdout);
    let r = miles(&["graph", f, "--format", "json"]);
    assert_eq!(r.code, Some(0));
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["recipe"], "grpo_arith");
    let names: Vec<&str> = v["nodes"].as_array().unwrap().iter().map(|n| n["name"].as_str().unwrap()).collect();
    for want in ["warmup", "rollout", "reward", "train", "sync", "eval"] {
        assert!(names.contains(&want), "{names:?}");
    }
    let back: Vec<_> = v["edges"].as_array().unwrap().iter().filter(|e| e["back"] == true).collect();
    assert_eq!(back.len(), 1);
    assert_eq!((back[0]["from"].as_str(), back[0]["to"].as_str()), (Some("sync"), Some("rollout")));
    // A file with errors prints diagnostics, no graph.
    let r = miles(&["graph", "tests/cases/e0304_no_weight_sync.miles"]);
    assert_eq!(r.code, Some(1));
    assert!(r.stdout.is_empty() && r.stderr.contains("E0304"));
}

#[test]
fn explain() {
    let r = miles(&["explain", "E0301"]);
    assert_eq!(r.code, Some(0));
    assert!(r.stdout.starts_with("E0301: check failed"), "{}", r.stdout);
    assert_eq!(miles(&["explain", "e0202"]).code, Some(0), "codes are case-insensitive");
    let r = miles(&["explain", "E9999"]);
    assert_eq!(r.code, Some(1));
    assert!(r.stderr.contains("no error code `E9999`"));
    let r = miles(&["explain"]);
    assert_eq!(r.code, Some(0));
    for c in miles_grammar::codes::CODES {
        assert!(r.stdout.contains(c.code), "`miles explain` lists {}", c.code);
    }
}

#[test]
fn help_and_version() {
    let r = miles(&["--version"]);
    assert_eq!(r.code, Some(0));
    assert_eq!(r.stdout.trim(), format!("miles {}", env!("CARGO_PKG_VERSION")));
    let r = miles(&["--help"]);
    assert_eq!(r.code, Some(0));
    let verbs: Vec<String> = r
        .stdout
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .filter(|v| v != "help")
        .collect();
    for want in ["check", "graph", "explain"] {
        assert!(verbs.iter().any(|v| v == want), "{verbs:?}");
    }
    for v in &verbs {
        let h = miles(&[v, "--help"]);
        assert_eq!(h.code, Some(0), "miles {v} --help");
        assert!(h.stdout.contains("Usage: miles"), "miles {v} --help:\n{}", h.stdout);
    }
    assert_eq!(miles(&["no-such-verb"]).code, Some(2));
}

/// A binary operator chain is not nesting: a 200,000-term sum checks and is already formatted,
/// where a 10,000-deep parenthesis (in `bad_input_fails_cleanly`) is refused (E0003). Slow in a
/// debug build (about a minute); grammar/src/fmt.rs reformats a long chain in its unit tests.
#[test]
fn long_operator_chains_check_and_format() {
    let sum = format!("const x = 1{}\n", " + 1".repeat(199_999));
    let p = scratch("long_sum.miles", sum.as_bytes());
    let r = miles(&["check", s(&p)]);
    assert_eq!(r.code, Some(0), "check\nstderr:\n{}", r.stderr);
    let r = miles(&["fmt", "--check", s(&p)]);
    assert_eq!(r.code, Some(0), "fmt\nstderr:\n{}", r.stderr);
}

#[test]
fn bad_input_fails_cleanly() {
    // Random bytes (a fixed xorshift stream), invalid UTF-8, deep nesting, a large file.
    let mut x: u64 = 0x9e3779b97f4a7c15;
    let random: Vec<u8> = (0..64 * 1024)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("random.miles", random),
        ("invalid_utf8.miles", b"const a = \"\xff\xfe\"\nconst b: Int = \"x\"\n".to_vec()),
        ("deep_parens.miles", format!("const x = {}1{}\n", "(".repeat(10_000), ")".repeat(10_000)).into_bytes()),
        ("deep_braces.miles", format!("recipe r {}\n", "{ a = b ".repeat(10_000)).into_bytes()),
        ("deep_ifs.miles", format!("const x = {}1{}\n", "if true then ".repeat(10_000), " else 2".repeat(10_000)).into_bytes()),
        ("ten_mb.miles", "const x = 1\n".repeat(10 * 1024 * 1024 / 12 + 1).into_bytes()),
        ("unknown_unit.miles", b"const d = 3.parsecs\n".to_vec()),
        ("overflow.miles", b"const n = 999999999999999999999999999999999999999999\nconst m = 170141183460469231731687303715884105727 + 1\n".to_vec()),
    ];
    for (name, bytes) in &cases {
        let p = scratch(name, bytes);
        let start = Instant::now();
        let r = miles(&["check", s(&p)]);
        assert_clean_failure(&r, name);
        assert!(start.elapsed() < Duration::from_secs(30), "{name} took {:?}", start.elapsed());
        if name.starts_with("deep_parens") {
            assert!(r.stderr.contains("E0003"), "{name}: {}", r.stderr);
        }
        if name.starts_with("random") || name.starts_with("deep_parens") {
            let (code, v) = json_check(s(&p));
            assert_eq!(code, Some(1), "{name}");
            assert!(v["errors"].as_u64().unwrap() >= 1, "{name}");
        }
    }
    // Import cycles, missing files, a directory given as a file.
    assert_clean_failure(&miles(&["check", "tests/cases/e0102_import_cycle/main.miles"]), "import cycle");
    let r = miles(&["check", "no/such/file.miles"]);
    assert_clean_failure(&r, "missing file");
    assert!(r.stderr.contains("E0101"), "{}", r.stderr);
    let r = miles(&["check", "recipes"]);
    assert_clean_failure(&r, "directory");
    assert!(r.stderr.contains("directory"), "{}", r.stderr);
}
