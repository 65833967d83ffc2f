//! The code's shape (issue #34): no non-test source file over 800 lines and no function over
//! 150 lines outside tests, so a module keeps to one concept and a function to one step. Test
//! code (`#[cfg(test)] mod ... {}` blocks, `tests.rs` files, `tests/` directories) is exempt.

use std::path::{Path, PathBuf};

const MAX_FILE_LINES: usize = 800;
const MAX_FN_LINES: usize = 150;

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if p.is_dir() {
            if !matches!(name, "tests" | "target" | "fuzz" | "benches") && !name.starts_with('.') {
                sources(&p, out);
            }
        } else if name.ends_with(".rs") && name != "tests.rs" {
            out.push(p);
        }
    }
}

/// The line where the file's inline test module starts (`#[cfg(test)]` before `mod x {`).
fn test_module_start(lines: &[&str]) -> usize {
    (0..lines.len())
        .find(|&i| {
            lines[i].starts_with("#[cfg(test)]")
                && lines
                    .get(i + 1)
                    .is_some_and(|l| l.trim_start_matches("pub ").starts_with("mod ") && l.ends_with('{'))
        })
        .unwrap_or(lines.len())
}

/// Braces on a line, outside strings, chars and comments (good enough for rustfmt'ed code).
fn brace_delta(line: &str) -> (i64, bool) {
    let (mut depth, mut opened, mut in_str, mut prev) = (0i64, false, false, ' ');
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' if prev != '\\' => in_str = !in_str,
            '/' if !in_str && chars.peek() == Some(&'/') => break,
            '\'' if !in_str => {
                // A char literal such as '{' or '\\'; a lifetime has no closing quote nearby.
                let rest: String = chars.clone().take(3).collect();
                if rest.len() >= 2 && (rest.as_bytes()[1] == b'\'' || rest.starts_with('\\')) {
                    let skip = if rest.starts_with('\\') { 3 } else { 2 };
                    for _ in 0..skip {
                        chars.next();
                    }
                }
            }
            '{' if !in_str => {
                depth += 1;
                opened = true;
            }
            '}' if !in_str => depth -= 1,
            _ => {}
        }
        prev = if prev == '\\' && c == '\\' { ' ' } else { c };
    }
    (depth, opened)
}

fn is_fn_start(line: &str) -> bool {
    let t = line.trim_start();
    let t = t
        .strip_prefix("pub(crate) ")
        .or_else(|| t.strip_prefix("pub(super) "))
        .or_else(|| t.strip_prefix("pub "))
        .unwrap_or(t);
    let t = t.strip_prefix("const ").unwrap_or(t);
    let t = t.strip_prefix("async ").unwrap_or(t);
    let t = t.strip_prefix("unsafe ").unwrap_or(t);
    t.starts_with("fn ")
}

#[test]
fn no_long_files_or_functions_outside_tests() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ["src", "grammar/src", "engine", "lsp/src"] {
        sources(&root.join(dir), &mut files);
    }
    assert!(files.len() > 100, "found only {} sources", files.len());
    let mut over = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let end = test_module_start(&lines);
        let rel = f.strip_prefix(root).unwrap().display();
        if end > MAX_FILE_LINES {
            over.push(format!("{rel}: {end} lines (at most {MAX_FILE_LINES} outside tests)"));
        }
        let mut i = 0;
        while i < end {
            if !is_fn_start(lines[i]) {
                i += 1;
                continue;
            }
            let (mut depth, mut opened, mut j) = (0i64, false, i);
            while j < lines.len() {
                let (d, o) = brace_delta(lines[j]);
                depth += d;
                opened |= o;
                if (opened && depth <= 0) || (!opened && lines[j].trim_end().ends_with(';')) {
                    break;
                }
                j += 1;
            }
            if j + 1 - i > MAX_FN_LINES {
                over.push(format!("{rel}:{}: a function of {} lines (at most {MAX_FN_LINES})", i + 1, j + 1 - i));
            }
            i = if opened { j + 1 } else { i + 1 };
        }
    }
    assert!(over.is_empty(), "split these along their seams:\n{}", over.join("\n"));
}
