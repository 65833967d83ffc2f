//! `miles doc`: a package's reference from its doc comments (`///`): schemas and stage kinds
//! with their fields (type with units, constraint, default), checks with their messages, enums,
//! constants and recipes, as Markdown and as one self-contained HTML page. The standard
//! library's reference (docs/stdlib.md, docs/stdlib.html) is generated the same way.

use miles_grammar::ast::{Check, Doc, FieldDecl, ItemKind};
use miles_grammar::diag::{FileId, Span};

/// One module's reference.
struct Entry {
    kind: &'static str,
    name: String,
    doc: String,
    /// (field, type, constraint, default, doc)
    fields: Vec<[String; 5]>,
    /// (kind `check`/`warn`, condition, message, doc)
    checks: Vec<[String; 4]>,
    extra: Vec<String>,
}

impl Entry {
    /// An item with its kind, name and doc only; each kind adds what it has.
    fn new(kind: &'static str, name: &str, doc: String) -> Entry {
        Entry { kind, name: name.to_string(), doc, fields: vec![], checks: vec![], extra: vec![] }
    }
}

fn slice(text: &str, span: Span) -> String {
    text.get(span.start as usize..span.end as usize).unwrap_or("").trim().to_string()
}

fn doc(d: &Option<Doc>) -> String {
    d.as_ref().map(|d| d.text.trim().to_string()).unwrap_or_default()
}

fn fields(text: &str, fs: &[FieldDecl]) -> Vec<[String; 5]> {
    fs.iter()
        .map(|f| {
            [
                f.name.name.clone(),
                slice(text, f.ty.span),
                f.constraint.as_ref().map(|c| slice(text, c.span)).unwrap_or_default(),
                f.default.as_ref().map(|d| slice(text, d.span)).unwrap_or_default(),
                doc(&f.doc),
            ]
        })
        .collect()
}

fn checks(text: &str, cs: &[Check]) -> Vec<[String; 4]> {
    cs.iter()
        .map(|c| {
            [
                if c.warn { "warn" } else { "check" }.to_string(),
                slice(text, c.expr.span),
                c.message.as_ref().map(|m| m.source()).unwrap_or_default(),
                doc(&c.doc),
            ]
        })
        .collect()
}

fn entries(text: &str) -> (String, Vec<Entry>) {
    let (ast, _) = miles_grammar::parse(FileId(0), text);
    // The module's own doc: the `///` lines at the very top, when the first item has none.
    let mut out = Vec::new();
    for item in &ast.items {
        let d = doc(&item.doc);
        let e = match &item.kind {
            ItemKind::Import(_) => continue,
            ItemKind::Const(c) => Entry {
                extra: vec![format!(
                    "`{}{} = {}`",
                    c.name.name,
                    c.ty.as_ref().map(|t| format!(": {}", slice(text, t.span))).unwrap_or_default(),
                    slice(text, c.value.span)
                )],
                ..Entry::new("const", &c.name.name, d)
            },
            ItemKind::Enum(e) => Entry {
                extra: e
                    .members
                    .iter()
                    .map(|m| {
                        let md = doc(&m.doc);
                        if md.is_empty() {
                            format!("`{}`", m.name.name)
                        } else {
                            format!("`{}`: {md}", m.name.name)
                        }
                    })
                    .collect(),
                ..Entry::new("enum", &e.name.name, d)
            },
            ItemKind::Interface(i) => Entry::new("interface", &i.name, d),
            ItemKind::Schema(s) => Entry {
                fields: fields(text, &s.fields),
                checks: checks(text, &s.checks),
                extra: s.interface.iter().map(|i| format!("is `{}`", i.name)).collect(),
                ..Entry::new("schema", &s.name.name, d)
            },
            ItemKind::Stage(s) => Entry {
                fields: fields(text, &s.fields),
                checks: checks(text, &s.checks),
                extra: s
                    .ports
                    .iter()
                    .map(|p| format!("input `{}: {}`", p.name.name, slice(text, p.ty.span)))
                    .chain(s.output.iter().map(|o| format!("output `{}`", slice(text, o.span))))
                    .collect(),
                ..Entry::new("stage", &s.name.name, d)
            },
            ItemKind::Model(b) | ItemKind::Cluster(b) => {
                Entry::new(if matches!(item.kind, ItemKind::Model(_)) { "model" } else { "cluster" }, &b.name.name, d)
            }
            ItemKind::Recipe(r) => Entry {
                checks: checks(text, &r.checks),
                extra: r
                    .extends
                    .iter()
                    .map(|p| format!("extends `{}`", p.dotted()))
                    .chain(r.bindings.iter().map(|b| {
                        let bd = doc(&b.doc);
                        format!(
                            "`{}`{}",
                            b.path.dotted(),
                            if bd.is_empty() { String::new() } else { format!(": {bd}") }
                        )
                    }))
                    .collect(),
                ..Entry::new("recipe", &r.name.name, d)
            },
        };
        out.push(e);
    }
    let head: Vec<&str> = text
        .lines()
        .take_while(|l| l.trim_start().starts_with("//"))
        .filter_map(|l| l.trim_start().strip_prefix("//!"))
        .map(|l| l.strip_prefix(' ').unwrap_or(l))
        .collect();
    (head.join("\n"), out)
}

/// Markdown for the modules `(key, source)` of a package.
pub fn markdown(title: &str, summary: &str, modules: &[(String, String)]) -> String {
    let mut md = format!("# {title}\n\n");
    if !summary.is_empty() {
        md.push_str(&format!("{summary}\n\n"));
    }
    md.push_str("Generated by `miles doc` from the modules' `///` comments.\n\n");
    for (key, text) in modules {
        let (head, items) = entries(text);
        md.push_str(&format!("## `{key}`\n\n"));
        if !head.is_empty() {
            md.push_str(&format!("{head}\n\n"));
        }
        for e in items {
            md.push_str(&format!("### {} `{}`\n\n", e.kind, e.name));
            if !e.doc.is_empty() {
                md.push_str(&format!("{}\n\n", e.doc));
            }
            for x in &e.extra {
                md.push_str(&format!("- {x}\n"));
            }
            if !e.extra.is_empty() {
                md.push('\n');
            }
            if !e.fields.is_empty() {
                md.push_str("| field | type | in | default | |\n|---|---|---|---|---|\n");
                for f in &e.fields {
                    let cell = |s: &str| {
                        if s.is_empty() {
                            String::new()
                        } else {
                            format!("`{}`", s.replace('|', "\\|").replace('\n', " "))
                        }
                    };
                    md.push_str(&format!(
                        "| `{}` | {} | {} | {} | {} |\n",
                        f[0],
                        cell(&f[1]),
                        cell(&f[2]),
                        cell(&f[3]),
                        f[4].replace('|', "\\|").replace('\n', " ")
                    ));
                }
                md.push('\n');
            }
            for c in &e.checks {
                let msg = if c[2].is_empty() { String::new() } else { format!(": \"{}\"", c[2]) };
                let cond = c[1].replace('\n', " ");
                md.push_str(&format!(
                    "- {} `{}`{msg}{}\n",
                    c[0],
                    cond,
                    if c[3].is_empty() { String::new() } else { format!(" ({})", c[3].replace('\n', " ")) }
                ));
            }
            if !e.checks.is_empty() {
                md.push('\n');
            }
        }
    }
    md
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// A static, self-contained page (no scripts, no external resources).
pub fn html(title: &str, summary: &str, modules: &[(String, String)]) -> String {
    let mut h = format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{t}</title><style>\
body{{font:15px/1.5 system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;color:#222}}\
code{{background:#f3f3f3;padding:0 .2em;border-radius:3px}}table{{border-collapse:collapse;margin:.5rem 0}}\
td,th{{border:1px solid #ccc;padding:.2rem .5rem;text-align:left;vertical-align:top}}\
h2{{border-bottom:2px solid #336;margin-top:2.5rem}}h3 small{{color:#666;font-weight:normal}}\
nav ul{{columns:3}}.check{{color:#933}}.warn{{color:#963}}</style></head><body>\n<h1>{t}</h1>\n",
        t = esc(title)
    );
    if !summary.is_empty() {
        h.push_str(&format!("<p>{}</p>\n", esc(summary)));
    }
    h.push_str("<nav><ul>");
    for (key, _) in modules {
        h.push_str(&format!("<li><a href=\"#{}\">{}</a></li>", esc(&key.replace('/', "-")), esc(key)));
    }
    h.push_str("</ul></nav>\n");
    for (key, text) in modules {
        let (head, items) = entries(text);
        h.push_str(&format!("<h2 id=\"{}\"><code>{}</code></h2>\n", esc(&key.replace('/', "-")), esc(key)));
        if !head.is_empty() {
            h.push_str(&format!("<p>{}</p>\n", esc(&head)));
        }
        for e in items {
            h.push_str(&format!("<h3><small>{}</small> <code>{}</code></h3>\n", e.kind, esc(&e.name)));
            if !e.doc.is_empty() {
                h.push_str(&format!("<p>{}</p>\n", esc(&e.doc)));
            }
            if !e.extra.is_empty() {
                h.push_str("<ul>");
                for x in &e.extra {
                    h.push_str(&format!("<li>{}</li>", esc(&x.replace('`', ""))));
                }
                h.push_str("</ul>\n");
            }
            if !e.fields.is_empty() {
                h.push_str("<table><tr><th>field</th><th>type</th><th>in</th><th>default</th><th></th></tr>");
                for f in &e.fields {
                    h.push_str("<tr>");
                    for (i, cell) in f.iter().enumerate() {
                        if i < 4 && !cell.is_empty() {
                            h.push_str(&format!("<td><code>{}</code></td>", esc(cell)));
                        } else {
                            h.push_str(&format!("<td>{}</td>", esc(cell)));
                        }
                    }
                    h.push_str("</tr>");
                }
                h.push_str("</table>\n");
            }
            if !e.checks.is_empty() {
                h.push_str("<ul>");
                for c in &e.checks {
                    h.push_str(&format!(
                        "<li class=\"{k}\">{k} <code>{}</code>{}{}</li>",
                        esc(&c[1]),
                        if c[2].is_empty() { String::new() } else { format!(": \u{201c}{}\u{201d}", esc(&c[2])) },
                        if c[3].is_empty() { String::new() } else { format!(" ({})", esc(&c[3])) },
                        k = c[0]
                    ));
                }
                h.push_str("</ul>\n");
            }
        }
    }
    h.push_str("</body></html>\n");
    h
}

/// The standard library's modules, in the order the compiler embeds them.
pub fn stdlib_modules() -> Vec<(String, String)> {
    miles_compiler::program::STDLIB.iter().map(|(k, s)| (k.to_string(), s.to_string())).collect()
}

pub const STDLIB_TITLE: &str = "The miles standard library";
pub const STDLIB_SUMMARY: &str = "Interfaces, schemas, stage kinds and their rules, hardware and model catalogs, and the embedded backend's tasks. Every module here is available to every recipe (`std/prelude` and `std/stages` without an import).";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_fields_checks_and_recipes() {
        let src = "//! House rules.\n/// A batch.\nschema batch {\n  /// Prompts per step.\n  size: Int in 1..=4096 = 64\n  check size % 8 == 0 else \"size must be a multiple of 8\"\n}\n/// The base.\nrecipe base {\n  /// The model.\n  x = 1\n}\n";
        let md = markdown("t", "", &[("lib/house".into(), src.into())]);
        assert!(md.contains("House rules."), "{md}");
        assert!(md.contains("### schema `batch`"), "{md}");
        assert!(md.contains("| `size` | `Int` | `1..=4096` | `64` | Prompts per step. |"), "{md}");
        assert!(md.contains("size must be a multiple of 8"), "{md}");
        assert!(md.contains("### recipe `base`") && md.contains("`x`: The model."), "{md}");
        let page = html("t", "", &[("lib/house".into(), src.into())]);
        assert!(page.starts_with("<!DOCTYPE html>") && !page.contains("<script"));
    }
}
