//! Writing an expression on one line: what the layout measures to decide whether something
//! fits, and what it prints when it does.

use crate::ast::*;

/// A check's text as a string literal, its interpolations as written.
pub(super) fn quote_text(t: &Text) -> String {
    let mut out = String::from("\"");
    for p in &t.parts {
        match p {
            TextPart::Lit(s) => {
                let q = quote(s);
                out.push_str(&q[1..q.len() - 1]);
            }
            TextPart::Expr { src, .. } => {
                out.push_str("\\(");
                out.push_str(src);
                out.push(')');
            }
        }
    }
    out.push('"');
    out
}

/// A string literal for `s`, escaped so that the parser reads `s` back.
pub(super) fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// An expression on one line.
pub(super) fn inline(src: &str, e: &Expr) -> String {
    let mut out = String::new();
    write_inline(src, e, &mut out);
    out
}

/// Writes `e` on one line. A chain of binary operators is walked in a loop, not recursed, and
/// written into one buffer, so a 200,000-term sum costs neither stack nor quadratic copying.
fn write_inline(src: &str, e: &Expr, out: &mut String) {
    let mut spine = Vec::new();
    let mut head = e;
    while let ExprKind::Binary { op, lhs, rhs, .. } = &head.kind {
        spine.push((*op, &**rhs));
        head = lhs;
    }
    write_operand(src, head, out);
    for (op, rhs) in spine.into_iter().rev() {
        out.push(' ');
        out.push_str(op.symbol());
        out.push(' ');
        write_inline(src, rhs, out);
    }
}

/// Writes `items` separated by `, `.
fn write_list<T>(src: &str, items: &[T], out: &mut String, mut each: impl FnMut(&str, &T, &mut String)) {
    for (i, x) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        each(src, x, out);
    }
}

/// Writes an expression that is not a binary operator on one line.
fn write_operand(src: &str, e: &Expr, out: &mut String) {
    match &e.kind {
        ExprKind::Number(n) => out.push_str(n),
        ExprKind::Quantity { number, unit, .. } => {
            out.push_str(number);
            out.push('.');
            out.push_str(unit);
        }
        ExprKind::Str(s) => out.push_str(&quote(s)),
        ExprKind::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        ExprKind::None => out.push_str("none"),
        ExprKind::List(items) => {
            out.push('[');
            write_list(src, items, out, write_inline);
            out.push(']');
        }
        ExprKind::Map(entries) => {
            out.push('{');
            write_list(src, entries, out, |src, (k, v), out| {
                out.push_str(&quote(&k.value));
                out.push_str(": ");
                write_inline(src, v, out);
            });
            out.push('}');
        }
        ExprKind::Name(id) => out.push_str(&id.name),
        ExprKind::Field(b, f) => {
            write_inline(src, b, out);
            out.push('.');
            out.push_str(&f.name);
        }
        ExprKind::Call { callee, args, .. } => {
            write_inline(src, callee, out);
            out.push('(');
            write_list(src, args, out, |src, a, out| {
                write_inline(src, &a.value, out);
                if let Some(t) = &a.arrow_to {
                    out.push_str(" -> ");
                    write_inline(src, t, out);
                }
            });
            out.push(')');
        }
        ExprKind::Record { base, fields, .. } => {
            write_inline(src, base, out);
            if fields.is_empty() {
                out.push_str(" {}");
            } else {
                out.push_str(" { ");
                write_list(src, fields, out, |src, f, out| {
                    out.push_str(&f.path.dotted());
                    out.push_str(" = ");
                    write_inline(src, &f.value, out);
                });
                out.push_str(" }");
            }
        }
        ExprKind::Binary { .. } => write_inline(src, e, out),
        ExprKind::Unary { op, expr } => {
            out.push_str(match op {
                UnOp::Neg => "-",
                UnOp::Not => "not ",
            });
            write_inline(src, expr, out);
        }
        ExprKind::If { cond, then, otherwise } => {
            out.push_str("if ");
            write_inline(src, cond, out);
            out.push_str(" then ");
            write_inline(src, then, out);
            out.push_str(" else ");
            write_inline(src, otherwise, out);
        }
        ExprKind::Range { start, end, inclusive } => {
            if let Some(s) = start {
                write_inline(src, s, out);
            }
            out.push_str(if *inclusive { "..=" } else { ".." });
            if let Some(s) = end {
                write_inline(src, s, out);
            }
        }
        ExprKind::Paren(inner) => {
            out.push('(');
            write_inline(src, inner, out);
            out.push(')');
        }
        // Not produced without a syntax error (and those files are refused); keep the text.
        ExprKind::Error => out.push_str(src.get(e.span.range()).unwrap_or("").trim()),
    }
}
