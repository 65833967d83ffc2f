//! The documentation is tested like code.
//!
//! - docs/errors.md is generated from the error-code registry (`miles_grammar::codes::CODES`):
//!   `UPDATE_DOCS=1 cargo test --test language docs::` rewrites it; otherwise the test fails when
//!   they differ.
//! - Every ```miles block of docs/language.md must check without a diagnostic; every
//!   ```miles,fails block must report exactly the codes of its `// error: E....` comments, each on
//!   the line of its comment.

use crate::common;

use miles_grammar::codes::CODES;
use std::path::Path;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn errors_md() -> String {
    let mut s = String::from(
        "# Error codes\n\n\
         Every diagnostic miles reports has one of these codes. `miles explain CODE` prints the same \
         text.\n\n\
         <!-- Generated from grammar/src/codes.rs by `UPDATE_DOCS=1 cargo test --test language docs::`; \
         do not edit by hand. -->\n",
    );
    let groups = [
        ('0', "Syntax"),
        ('1', "Modules and names"),
        ('2', "Types, units and evaluation"),
        ('3', "Checks and the stage graph"),
        ('4', "Planning"),
        ('5', "Running and data"),
    ];
    for (digit, title) in groups {
        let mut codes: Vec<_> = CODES.iter().filter(|c| c.code.as_bytes()[2] == digit as u8).collect();
        codes.sort_by_key(|c| c.code);
        if codes.is_empty() {
            continue;
        }
        s.push_str(&format!("\n## E0{digit}xx: {title}\n\n| code | title |\n|---|---|\n"));
        for c in &codes {
            s.push_str(&format!("| [{}](#{}) | {} |\n", c.code, c.code.to_lowercase(), c.title));
        }
        for c in &codes {
            s.push_str(&format!("\n### {}\n\n**{}**\n\n{}\n", c.code, c.title, c.explanation));
        }
    }
    let other: Vec<_> = CODES.iter().filter(|c| !(b'0'..=b'5').contains(&c.code.as_bytes()[2])).collect();
    for c in other {
        s.push_str(&format!("\n### {}\n\n**{}**\n\n{}\n", c.code, c.title, c.explanation));
    }
    s
}

#[test]
fn errors_md_is_generated_from_the_registry() {
    let path = root().join("docs/errors.md");
    let want = errors_md();
    if std::env::var_os("UPDATE_DOCS").is_some() {
        std::fs::write(&path, &want).unwrap();
        return;
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(have == want, "docs/errors.md is out of date: run `UPDATE_DOCS=1 cargo test --test language docs::`");
}

#[test]
fn registry_codes_are_unique() {
    let mut codes: Vec<&str> = CODES.iter().map(|c| c.code).collect();
    codes.sort();
    let n = codes.len();
    codes.dedup();
    assert_eq!(codes.len(), n, "a code is registered twice");
    for c in CODES {
        assert!(c.code.len() == 5 && c.code.starts_with('E'), "{}", c.code);
        assert!(!c.title.is_empty() && !c.explanation.is_empty(), "{}", c.code);
    }
}

pub(crate) struct Block {
    /// 1-based line of the opening fence in its document.
    pub(crate) line: usize,
    pub(crate) fails: bool,
    pub(crate) text: String,
}

pub(crate) fn miles_blocks(md: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut cur: Option<Block> = None;
    for (i, l) in md.lines().enumerate() {
        match &mut cur {
            None => {
                let info = l.trim().strip_prefix("```").map(str::trim);
                if let Some(info @ ("miles" | "miles,fails")) = info {
                    cur = Some(Block { line: i + 1, fails: info.ends_with("fails"), text: String::new() });
                }
            }
            Some(b) if l.trim() == "```" => {
                out.push(std::mem::replace(b, Block { line: 0, fails: false, text: String::new() }));
                cur = None;
            }
            Some(b) => {
                b.text.push_str(l);
                b.text.push('\n');
            }
        }
    }
    out
}

#[test]
fn language_md_examples_check_as_documented() {
    let md = std::fs::read_to_string(root().join("docs/language.md")).unwrap();
    let blocks = miles_blocks(&md);
    assert!(blocks.len() >= 5, "docs/language.md has its examples");
    assert!(blocks.iter().any(|b| b.fails), "docs/language.md has a failing example");
    let problems = check_blocks("docs/language.md", &blocks);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Each block checked as documented: a ```miles block without a diagnostic, a ```miles,fails
/// block with exactly the codes of its `// error: E....` comments, each on its comment's line.
/// One problem (with the rendered diagnostics) per block that differs.
pub(crate) fn check_blocks(doc: &str, blocks: &[Block]) -> Vec<String> {
    let mut problems = Vec::new();
    for b in blocks {
        let c = common::compile_str(&b.text);
        let got: Vec<(usize, &str)> = c
            .diagnostics
            .iter()
            .map(|d| (d.primary.as_ref().map(|p| c.program.sources.line_col(p.span).0).unwrap_or(0), d.code.as_str()))
            .collect();
        let mut want: Vec<(usize, &str)> = Vec::new();
        for (i, l) in b.text.lines().enumerate() {
            if let Some((_, rest)) = l.split_once("// error:") {
                for code in rest.split([',', ' ']).filter(|w| w.starts_with('E')) {
                    want.push((i + 1, code));
                }
            }
        }
        if !b.fails {
            assert!(want.is_empty(), "{doc}:{}: a ```miles block with `// error:`; mark it miles,fails", b.line);
        }
        let mut got_sorted = got.clone();
        got_sorted.sort();
        want.sort();
        if got_sorted != want {
            let rendered = common::render(&c.program.sources, &c.diagnostics);
            problems.push(format!(
                "{doc}:{} (a {} block): expected {want:?}, got {got_sorted:?}\n{rendered}",
                b.line,
                if b.fails { "miles,fails" } else { "miles" }
            ));
        }
    }
    problems
}

/// The workspace crates a `Cargo.toml` depends on (its `[dependencies]`, without the `miles-`
/// prefix), sorted.
fn manifest_deps(manifest: &str) -> Vec<String> {
    let mut deps: Vec<String> = manifest
        .split("\n[")
        .filter(|section| section.starts_with("dependencies]"))
        .flat_map(|section| section.lines().skip(1))
        .filter_map(|line| line.split(['=', ' ', '.']).next()?.strip_prefix("miles-").map(str::to_string))
        .collect();
    deps.sort();
    deps
}

/// docs/architecture.md's crate table states each crate's workspace dependencies (before the `;`
/// of its last column) as its Cargo.toml does.
#[test]
fn architecture_md_names_each_crates_workspace_dependencies() {
    let md = std::fs::read_to_string(root().join("docs/architecture.md")).unwrap();
    let mut rows = 0;
    for line in md.lines().filter(|l| l.starts_with("| `miles-")) {
        let cells: Vec<&str> = line.split(" | ").collect();
        let (name, path) = (cells[0].trim_start_matches("| ").trim_matches('`'), cells[1].trim_matches('`'));
        let last = cells.last().unwrap().trim_end_matches(" |").trim_end_matches('|');
        let mut stated: Vec<String> = last
            .split(';')
            .next()
            .unwrap()
            .split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty() && s != "none")
            .collect();
        stated.sort();
        let manifest = std::fs::read_to_string(root().join(path).join("Cargo.toml")).unwrap();
        assert_eq!(stated, manifest_deps(&manifest), "{name}: docs/architecture.md's `depends on` vs {path}Cargo.toml");
        rows += 1;
    }
    assert_eq!(rows, 11, "a row for every library crate of the workspace");
}
