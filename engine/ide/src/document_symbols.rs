//! The outline of a file: items with their fields, members and bindings.

use crate::analysis::Analysis;
use crate::defs::{stage_call, DefKind};
use crate::syntax::{span_text, type_text};
use miles_grammar::ast::{Ident, ItemKind};
use miles_grammar::diag::{FileId, Span};

#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Symbol {
    pub name: String,
    pub kind: DefKind,
    pub detail: Option<String>,
    pub span: Span,
    pub selection: Span,
    pub children: Vec<Symbol>,
}

/// The outline of a file: items with their fields, members and bindings.
pub fn document_symbols(a: &Analysis, file: FileId) -> Vec<Symbol> {
    let Some(m) = a.module_of_file(file) else { return Vec::new() };
    let p = a.program();
    let mut out = Vec::new();
    for item in &p.module(m).ast.items {
        let Some(name) = item.name() else { continue };
        let Some(def) = a.defs.at(name.span) else { continue };
        let mut children = Vec::new();
        let mut child = |id: &Ident, detail: Option<String>| {
            if let Some(d) = a.defs.at(id.span) {
                children.push(Symbol {
                    name: d.name.clone(),
                    kind: d.kind,
                    detail,
                    span: d.full_span,
                    selection: d.span,
                    children: Vec::new(),
                });
            }
        };
        let detail = match &item.kind {
            ItemKind::Enum(e) => {
                e.members.iter().for_each(|x| child(&x.name, None));
                None
            }
            ItemKind::Schema(s) => {
                s.fields.iter().for_each(|f| child(&f.name, Some(type_text(p, &f.ty))));
                s.interface.as_ref().map(|i| format!("is {}", i.name))
            }
            ItemKind::Stage(s) => {
                s.ports.iter().for_each(|x| child(&x.name, Some(type_text(p, &x.ty))));
                s.fields.iter().for_each(|f| child(&f.name, Some(type_text(p, &f.ty))));
                s.output.as_ref().map(|o| format!("-> {}", type_text(p, o)))
            }
            ItemKind::Recipe(r) => {
                for b in &r.bindings {
                    if b.path.segments.len() == 1 {
                        let d = stage_call(&b.value).map(|(c, _, _)| span_text(p, c.span).to_string());
                        child(&b.path.segments[0], d);
                    }
                }
                r.extends.as_ref().map(|e| format!("extends {}", e.dotted()))
            }
            ItemKind::Const(c) => c.ty.as_ref().map(|t| type_text(p, t)),
            _ => None,
        };
        out.push(Symbol {
            name: def.name.clone(),
            kind: def.kind,
            detail,
            span: item.span,
            selection: name.span,
            children,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use crate::fixture::{at_cursor, line_col, recipe};
    use insta::assert_snapshot;

    fn render(a: &crate::Analysis, syms: &[super::Symbol], depth: usize, out: &mut String) {
        for s in syms {
            let (line, _) = line_col(a.text(s.span.file), s.span.start as usize);
            let detail = s.detail.clone().unwrap_or_default();
            out.push_str(&format!("{}{} ({:?}) {detail} @{line}\n", "  ".repeat(depth), s.name, s.kind));
            render(a, &s.children, depth + 1, out);
        }
    }

    #[test]
    fn items_and_their_bindings() {
        let (a, file, _) = at_cursor(&recipe(""));
        let mut out = String::new();
        render(&a, &super::document_symbols(&a, file), 0, &mut out);
        assert_snapshot!(out, @r"
        policy (Model)  @4
        tiny (Recipe)  @7
          rollout (StageInstance) generate @8
          reward (StageInstance) exact_match @12
          train (StageInstance) grpo @13
          sync (StageInstance) weights @19
          stop (Setting)  @20
        ");
    }
}
