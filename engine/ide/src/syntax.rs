//! Walking the syntax tree: every expression of an item, and the source text of a node.

use miles_compiler::program::Program;
use miles_grammar::ast::{self, Expr, ExprKind, Item, ItemKind, TypeExpr};
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
            walk_expr(&c.expr, f);
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
                walk_expr(&c.expr, f);
            }
        }
        _ => {}
    }
}

pub fn walk_expr<'a>(e: &'a Expr, f: &mut dyn FnMut(&'a Expr)) {
    f(e);
    match &e.kind {
        ExprKind::List(items) => items.iter().for_each(|x| walk_expr(x, f)),
        ExprKind::Map(entries) => entries.iter().for_each(|(_, x)| walk_expr(x, f)),
        ExprKind::Field(b, _) => walk_expr(b, f),
        ExprKind::Call { callee, args, .. } => {
            walk_expr(callee, f);
            for a in args {
                walk_expr(&a.value, f);
                if let Some(t) = &a.arrow_to {
                    walk_expr(t, f);
                }
            }
        }
        ExprKind::Record { base, fields, .. } => {
            walk_expr(base, f);
            fields.iter().for_each(|b| walk_expr(&b.value, f));
        }
        ExprKind::Binary { lhs, rhs, .. } => {
            walk_expr(lhs, f);
            walk_expr(rhs, f);
        }
        ExprKind::Unary { expr, .. } | ExprKind::Paren(expr) => walk_expr(expr, f),
        ExprKind::If { cond, then, otherwise } => {
            walk_expr(cond, f);
            walk_expr(then, f);
            walk_expr(otherwise, f);
        }
        ExprKind::Range { start, end, .. } => {
            if let Some(s) = start {
                walk_expr(s, f);
            }
            if let Some(x) = end {
                walk_expr(x, f);
            }
        }
        _ => {}
    }
}

pub(crate) fn type_text(program: &Program, t: &TypeExpr) -> String {
    span_text(program, t.span).to_string()
}

/// The source text of a span, without the whitespace the parser counts into some nodes.
pub(crate) fn span_text(program: &Program, s: Span) -> &str {
    program.sources.get(s.file).and_then(|f| f.text.get(s.range())).unwrap_or("").trim()
}
