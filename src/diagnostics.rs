//! Rendering diagnostics: miette's graphical report on a terminal, plain text otherwise, JSON
//! for tools. The diagnostic type itself is the project's one (`miles_grammar::diag`).

use crate::DiagFormat;
use miette::{GraphicalReportHandler, GraphicalTheme, LabeledSpan, MietteDiagnostic, NamedSource, Report};
use miles_compiler::{Diagnostic, Severity, Sources};
use std::io::IsTerminal;

pub fn resolve_format(f: DiagFormat) -> DiagFormat {
    match f {
        DiagFormat::Auto if std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none() => {
            DiagFormat::Graphical
        }
        DiagFormat::Auto => DiagFormat::Plain,
        other => other,
    }
}

/// Renders every diagnostic to stderr (or, for JSON, stdout) and a summary line.
pub fn emit(sources: &Sources, diags: &[Diagnostic], format: DiagFormat) {
    let format = resolve_format(format);
    if format == DiagFormat::Json {
        println!("{}", serde_json::to_string_pretty(&to_json(sources, diags)).unwrap_or_default());
        return;
    }
    let mut out = String::new();
    for d in diags {
        out.push_str(&render(sources, d, format == DiagFormat::Graphical));
    }
    eprint!("{out}");
}

pub fn summary(diags: &[Diagnostic]) -> (usize, usize) {
    let errors = diags.iter().filter(|d| d.severity == Severity::Error).count();
    let warnings = diags.iter().filter(|d| d.severity == Severity::Warning).count();
    (errors, warnings)
}

pub fn render(sources: &Sources, d: &Diagnostic, color: bool) -> String {
    let severity = match d.severity {
        Severity::Error => miette::Severity::Error,
        Severity::Warning => miette::Severity::Warning,
        Severity::Note => miette::Severity::Advice,
    };
    let mut md = MietteDiagnostic::new(d.message.clone()).with_code(d.code.as_str()).with_severity(severity);
    let mut help = d.help.clone().unwrap_or_default();
    if let Some(rule) = &d.rule {
        let (line, _) = sources.line_col(rule.span);
        let file = sources.get(rule.span.file).map(|f| f.path.clone()).unwrap_or_default();
        if !help.is_empty() {
            help.push('\n');
        }
        help.push_str(&format!("rule `{}` ({}:{})", rule.name, file, line));
    }
    if !help.is_empty() {
        md = md.with_help(help);
    }
    let mut notes = Vec::new();
    let primary_file = d.primary.as_ref().map(|l| l.span.file);
    let mut labels = Vec::new();
    if let Some(p) = &d.primary {
        labels.push(LabeledSpan::new_primary_with_span(
            Some(p.message.clone()),
            (p.span.start as usize, (p.span.end - p.span.start) as usize),
        ));
    }
    for s in &d.secondary {
        if Some(s.span.file) == primary_file {
            labels.push(LabeledSpan::new_with_span(
                Some(s.message.clone()),
                (s.span.start as usize, (s.span.end - s.span.start) as usize),
            ));
        } else {
            let (line, col) = sources.line_col(s.span);
            let file = sources.get(s.span.file).map(|f| f.path.clone()).unwrap_or_default();
            notes.push(format!("  note: {} ({}:{}:{})", s.message, file, line, col));
        }
    }
    md = md.with_labels(labels);
    let report = match primary_file.and_then(|f| sources.get(f)) {
        Some(src) => Report::new(md).with_source_code(NamedSource::new(src.path.clone(), src.text.clone())),
        None => Report::new(md),
    };
    let theme = if color { GraphicalTheme::unicode() } else { GraphicalTheme::unicode_nocolor() };
    let handler = GraphicalReportHandler::new_themed(theme).with_width(100).with_context_lines(1);
    let mut s = String::new();
    if handler.render_report(&mut s, report.as_ref()).is_err() {
        s = format!("{}: {}\n", d.code, d.message);
    }
    for n in notes {
        s.push_str(&n);
        s.push('\n');
    }
    s.push('\n');
    s
}

pub fn to_json(sources: &Sources, diags: &[Diagnostic]) -> serde_json::Value {
    use serde_json::json;
    let loc = |sp: miles_compiler::Span| {
        let (line, col) = sources.line_col(sp);
        let (eline, ecol) = sources.line_col(miles_compiler::Span { start: sp.end, ..sp });
        json!({
            "file": sources.get(sp.file).map(|f| f.path.clone()),
            "start": sp.start, "end": sp.end,
            "line": line, "column": col, "end_line": eline, "end_column": ecol,
        })
    };
    let items: Vec<_> = diags
        .iter()
        .map(|d| {
            json!({
                "code": d.code,
                "severity": d.severity,
                "message": d.message,
                "primary": d.primary.as_ref().map(|l| json!({ "message": l.message, "location": loc(l.span) })),
                "secondary": d.secondary.iter().map(|l| json!({ "message": l.message, "location": loc(l.span) })).collect::<Vec<_>>(),
                "help": d.help,
                "rule": d.rule.as_ref().map(|r| json!({ "name": r.name, "location": loc(r.span) })),
                "fixes": d.fixes.iter().map(|f| json!({ "message": f.message, "replacement": f.replacement, "location": loc(f.span) })).collect::<Vec<_>>(),
            })
        })
        .collect();
    let (errors, warnings) = summary(diags);
    json!({ "format_version": 1, "errors": errors, "warnings": warnings, "diagnostics": items })
}
