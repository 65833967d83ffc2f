//! Shared by the integration tests: compiling in memory, rendering diagnostics as plain text
//! (stable, no terminal art) and checking the invariants every diagnostic must hold.
#![allow(dead_code)]

pub mod metrics;
pub mod process;
pub mod tiny;
pub mod workers;

use miles_compiler::fs::MemoryFs;
use miles_compiler::{compile, Compilation, Diagnostic, Options, Sources, Span};
use miles_grammar::codes;
use std::fmt::Write;

/// Compiles `entry` and everything it imports from `files` (path, bytes).
pub fn compile_files(files: &[(String, Vec<u8>)], entry: &str, opts: &Options) -> Compilation {
    let fs = MemoryFs::new();
    for (p, bytes) in files {
        fs.insert(p, bytes.clone());
    }
    compile(&fs, &[entry.to_string()], opts)
}

/// Compiles one in-memory file named `main.miles`.
pub fn compile_str(src: &str) -> Compilation {
    compile_files(&[("main.miles".into(), src.as_bytes().to_vec())], "main.miles", &Options::default())
}

pub fn codes_of(c: &Compilation) -> Vec<&'static str> {
    c.diagnostics.iter().map(|d| d.code.as_str()).collect()
}

/// `file:line:col`, 1-based. In the standard library, which others edit, just the file: the
/// excerpt printed beside it says where, and snapshots do not churn when a line moves.
pub fn loc(sources: &Sources, span: Span) -> String {
    let file = sources.get(span.file).map(|f| f.path.as_str()).unwrap_or("?");
    if file.starts_with("std/") {
        return file.to_string();
    }
    let (line, col) = sources.line_col(span);
    format!("{file}:{line}:{col}")
}

/// The source text a span covers, first line only, shortened.
fn excerpt(sources: &Sources, span: Span) -> String {
    let Some(f) = sources.get(span.file) else { return String::new() };
    let text = f.text.get(span.range()).unwrap_or("");
    let first = text.lines().next().unwrap_or("");
    let short: String = first.chars().take(48).collect();
    if short.is_empty() {
        String::new()
    } else if short.len() < text.len() {
        format!("  `{short}…`")
    } else {
        format!("  `{short}`")
    }
}

/// One diagnostic per paragraph: code, message, every label with file:line:col, help, rule, fixes.
pub fn render(sources: &Sources, diags: &[Diagnostic]) -> String {
    let mut s = String::new();
    for d in diags {
        let sev = format!("{:?}", d.severity).to_lowercase();
        let _ = writeln!(s, "{sev}[{}]: {}", d.code, d.message);
        if let Some(p) = &d.primary {
            let _ = writeln!(s, "  --> {}: {}{}", loc(sources, p.span), p.message, excerpt(sources, p.span));
        }
        for l in &d.secondary {
            let _ = writeln!(s, "  ... {}: {}{}", loc(sources, l.span), l.message, excerpt(sources, l.span));
        }
        if let Some(h) = &d.help {
            for (i, line) in h.lines().enumerate() {
                let _ = writeln!(s, "  {} {line}", if i == 0 { "help:" } else { "     " });
            }
        }
        if let Some(r) = &d.rule {
            let _ = writeln!(s, "  rule: `{}` ({}){}", r.name, loc(sources, r.span), excerpt(sources, r.span));
        }
        for f in &d.fixes {
            let _ = writeln!(s, "  fix: {} -> {:?} at {}", f.message, f.replacement, loc(sources, f.span));
        }
    }
    s
}

/// Problems with the diagnostics themselves: unregistered codes, spans outside their file or
/// off a character boundary, empty messages.
pub fn invariant_violations(sources: &Sources, diags: &[Diagnostic]) -> Vec<String> {
    let mut bad = Vec::new();
    let check_span = |what: &str, span: Span, bad: &mut Vec<String>| {
        let Some(f) = sources.get(span.file) else {
            bad.push(format!("{what}: span in unknown file {:?}", span.file));
            return;
        };
        let (a, b) = (span.start as usize, span.end as usize);
        if a > b || b > f.text.len() || !f.text.is_char_boundary(a) || !f.text.is_char_boundary(b) {
            bad.push(format!("{what}: span {a}..{b} is not inside {} ({} bytes)", f.path, f.text.len()));
        }
    };
    for d in diags {
        let what = format!("{} `{}`", d.code, d.message);
        if codes::lookup(&d.code).is_none() {
            bad.push(format!("{what}: code not in the registry"));
        }
        if d.message.trim().is_empty() {
            bad.push(format!("{what}: empty message"));
        }
        if let Some(p) = &d.primary {
            check_span(&what, p.span, &mut bad);
        }
        for l in &d.secondary {
            check_span(&what, l.span, &mut bad);
        }
        if let Some(r) = &d.rule {
            check_span(&what, r.span, &mut bad);
        }
        for f in &d.fixes {
            check_span(&what, f.span, &mut bad);
        }
    }
    bad
}
