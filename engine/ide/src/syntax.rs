//! Walking the syntax tree: every expression of an item, and the source text of a node.

use miles_compiler::program::Program;
use miles_grammar::ast::{self, Expr, Item, ItemKind, TypeExpr};
use miles_grammar::diag::Span;

pub fn walk_item_exprs<'a>(item: &'a Item, f: &mut impl FnMut(&'a Expr)) {
    let fields_checks = |fields: &'a [ast::FieldDecl], checks: &'a [ast::Check], f: &mut dyn FnMut(&'a Expr)| {
        for fd in fields {
            if let Some(c) = &fd.constraint {
                walk_expr(c, f);
            }
            if let Some(d) = &fd.default {
                walk_expr(d, f);
            }
        }
        for c in checks {
            c.exprs().for_each(|e| walk_expr(e, f));
        }
    };
    match &item.kind {
        ItemKind::Const(c) => walk_expr(&c.value, f),
        ItemKind::Model(nv) | ItemKind::Cluster(nv) => walk_expr(&nv.value, f),
        ItemKind::Schema(s) => fields_checks(&s.fields, &s.checks, f),
        ItemKind::Stage(s) => fields_checks(&s.fields, &s.checks, f),
        ItemKind::Recipe(r) => {
            for b in &r.bindings {
                walk_expr(&b.value, f);
            }
            for c in &r.checks {
                c.exprs().for_each(|e| walk_expr(e, f));
            }
        }
        _ => {}
    }
}

/// Every expression under `e`, parents first: the AST's one exhaustive walker.
pub fn walk_expr<'a>(e: &'a Expr, f: &mut dyn FnMut(&'a Expr)) {
    e.walk(f);
}

pub(crate) fn type_text(program: &Program, t: &TypeExpr) -> String {
    span_text(program, t.span).to_string()
}

/// The source text of a span, without the whitespace the parser counts into some nodes.
pub(crate) fn span_text(program: &Program, s: Span) -> &str {
    program.sources.get(s.file).and_then(|f| f.text.get(s.range())).unwrap_or("").trim()
}
