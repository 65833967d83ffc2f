//! Building expressions from pest pairs: ranges, binary operators by precedence climbing
//! (in a loop, so an operator chain of any length costs no stack), prefixes, postfixes and
//! primaries; and refusing expressions that nest too deep (E0003).

use super::{Builder, ListKind, Rule};
use crate::ast::*;
use crate::codes::ErrorCode;
use crate::depth::{too_deep_expr, MAX_EXPR_DEPTH};
use crate::diag::{Diagnostic, Span};
use crate::lex::unescape;
use pest::iterators::Pair;

/// How often (in levels of `expr`) the stack is checked, and what each check makes sure is
/// left: room for that many levels.
const STACK_CHECK_EVERY: u32 = 8;
const STACK_RED_ZONE: usize = STACK_CHECK_EVERY as usize * (64 << 10);
const STACK_GROW: usize = 4 << 20;

impl Builder<'_> {
    /// Refuses (E0003) every expression of `item` deeper than `MAX_EXPR_DEPTH`.
    pub(super) fn limit_item_depth(&mut self, item: &mut Item) {
        let mut slots: Vec<&mut Expr> = Vec::new();
        match &mut item.kind {
            ItemKind::Const(c) => slots.push(&mut c.value),
            ItemKind::Model(nv) | ItemKind::Cluster(nv) => slots.push(&mut nv.value),
            ItemKind::Schema(Schema { fields, checks, .. }) | ItemKind::Stage(StageDecl { fields, checks, .. }) => {
                for f in fields {
                    slots.extend(f.constraint.as_mut());
                    slots.extend(f.default.as_mut());
                }
                slots.extend(checks.iter_mut().map(|c| &mut c.expr));
            }
            ItemKind::Recipe(r) => {
                slots.extend(r.bindings.iter_mut().map(|b| &mut b.value));
                slots.extend(r.checks.iter_mut().map(|c| &mut c.expr));
            }
            ItemKind::Import(_) | ItemKind::Enum(_) | ItemKind::Interface(_) => {}
        }
        for e in slots {
            self.limit_depth(e);
        }
    }

    pub(super) fn limit_depth(&mut self, e: &mut Expr) {
        if !too_deep_expr(e) {
            return;
        }
        let span = e.span;
        self.diags.push(
            Diagnostic::error(
                ErrorCode::E0003,
                format!("this expression nests more than {MAX_EXPR_DEPTH} levels deep"),
            )
            .with_primary(Span { end: span.start, ..span }, "this expression is too deep")
            .with_help("split it into named constants; no recipe needs this much nesting"),
        );
        *e = Expr { kind: ExprKind::Error, span };
    }

    pub(super) fn expr(&mut self, p: Pair<'_, Rule>) -> Expr {
        // Expressions nest up to MAX_EXPR_DEPTH deep and a debug build's frames are large: grow
        // the stack rather than overflow it. Checking costs a call, so it is done every
        // STACK_CHECK_EVERY levels (the outermost included), with a red zone for that many
        // levels (64 KiB each).
        self.depth += 1;
        let e = if (self.depth - 1).is_multiple_of(STACK_CHECK_EVERY) {
            stacker::maybe_grow(STACK_RED_ZONE, STACK_GROW, || self.expr_inner(p))
        } else {
            self.expr_inner(p)
        };
        self.depth -= 1;
        e
    }

    fn expr_inner(&mut self, p: Pair<'_, Rule>) -> Expr {
        match p.as_rule() {
            Rule::expr => match p.into_inner().next() {
                Some(inner) => self.expr(inner),
                None => Expr { kind: ExprKind::Error, span: Span::default() },
            },
            Rule::range_expr | Rule::in_range => {
                let span = self.span(&p);
                let children: Vec<_> = p.into_inner().collect();
                if children.len() == 1 {
                    let only = children.into_iter().next();
                    return match only {
                        Some(c) => self.expr(c),
                        None => Expr { kind: ExprKind::Error, span },
                    };
                }
                let mut start = None;
                let mut end = None;
                let mut inclusive = false;
                let mut seen_op = false;
                for c in children {
                    match c.as_rule() {
                        Rule::range_op | Rule::range_open => {
                            seen_op = true;
                            inclusive = c.as_str() == "..=";
                        }
                        _ if seen_op => end = Some(Box::new(self.expr(c))),
                        _ => start = Some(Box::new(self.expr(c))),
                    }
                }
                Expr { kind: ExprKind::Range { start, end, inclusive }, span }
            }
            Rule::bin_expr => self.bin_expr(p),
            Rule::unary => self.unary(p),
            _ => self.primary(p),
        }
    }

    /// Precedence climbing over the flat `unary (op unary)*` list pest gives.
    fn bin_expr(&mut self, p: Pair<'_, Rule>) -> Expr {
        let mut operands: Vec<Expr> = Vec::new();
        let mut ops: Vec<(BinOp, Span)> = Vec::new();
        let mut stack_ops: Vec<(BinOp, Span)> = Vec::new();
        let mut out: Vec<Expr> = Vec::new();
        for c in p.into_inner() {
            if let Some(op) = bin_op(c.as_rule()) {
                ops.push((op, self.span(&c)));
            } else {
                operands.push(self.unary(c));
            }
        }
        // Shunting-yard: all operators are left-associative.
        let mut operands = operands.into_iter();
        if let Some(first) = operands.next() {
            out.push(first);
        }
        fn reduce(out: &mut Vec<Expr>, op: BinOp, op_span: Span) {
            let rhs = out.pop();
            let lhs = out.pop();
            if let (Some(lhs), Some(rhs)) = (lhs, rhs) {
                let span = lhs.span.to(rhs.span);
                out.push(Expr { kind: ExprKind::Binary { op, op_span, lhs: Box::new(lhs), rhs: Box::new(rhs) }, span });
            }
        }
        for (op, op_span) in ops {
            while let Some(&(top, top_span)) = stack_ops.last() {
                if top.precedence() >= op.precedence() {
                    stack_ops.pop();
                    reduce(&mut out, top, top_span);
                } else {
                    break;
                }
            }
            stack_ops.push((op, op_span));
            if let Some(next) = operands.next() {
                out.push(next);
            }
        }
        while let Some((op, sp)) = stack_ops.pop() {
            reduce(&mut out, op, sp);
        }
        out.pop().unwrap_or(Expr { kind: ExprKind::Error, span: Span::default() })
    }

    fn unary(&mut self, p: Pair<'_, Rule>) -> Expr {
        if p.as_rule() != Rule::unary {
            return self.primary(p);
        }
        let span = self.span(&p);
        let mut prefixes = Vec::new();
        let mut operand = None;
        for c in p.into_inner() {
            match c.as_rule() {
                Rule::op_neg => prefixes.push((UnOp::Neg, self.span(&c))),
                Rule::op_not => prefixes.push((UnOp::Not, self.span(&c))),
                _ => operand = Some(self.postfix(c)),
            }
        }
        let mut e = operand.unwrap_or(Expr { kind: ExprKind::Error, span });
        for (op, sp) in prefixes.into_iter().rev() {
            let span = sp.to(e.span);
            e = Expr { kind: ExprKind::Unary { op, expr: Box::new(e) }, span };
        }
        e
    }

    fn postfix(&mut self, p: Pair<'_, Rule>) -> Expr {
        let mut inner = p.into_inner();
        let mut e = match inner.next() {
            Some(prim) => self.primary(prim),
            None => return Expr { kind: ExprKind::Error, span: Span::default() },
        };
        for post in inner {
            let post_span = self.span(&post);
            let span = e.span.to(post_span);
            match post.as_rule() {
                Rule::field_access => {
                    if let Some(id) = post.into_inner().next() {
                        e = Expr { kind: ExprKind::Field(Box::new(e), self.ident(id)), span };
                    }
                }
                Rule::call_args => {
                    let mut args = Vec::new();
                    for a in post.into_inner() {
                        match a.as_rule() {
                            Rule::arg => {
                                let arg_span = self.span(&a);
                                let mut it = a.into_inner();
                                let value = it.next().map(|v| self.expr(v));
                                let arrow_to = it.next().map(|v| self.expr(v));
                                if let Some(value) = value {
                                    args.push(Arg { value, arrow_to, span: arg_span });
                                }
                            }
                            Rule::close_paren => self.close(&a, post_span, "("),
                            _ => {}
                        }
                    }
                    e = Expr { kind: ExprKind::Call { callee: Box::new(e), args, args_span: post_span }, span };
                }
                Rule::record_body => {
                    let mut fields = Vec::new();
                    for f in post.into_inner() {
                        match f.as_rule() {
                            Rule::binding => fields.push(self.binding(f)),
                            Rule::junk_member => self.junk(&f, ListKind::Bindings),
                            Rule::close_brace => self.close(&f, post_span, "{"),
                            _ => {}
                        }
                    }
                    e = Expr { kind: ExprKind::Record { base: Box::new(e), fields, body_span: post_span }, span };
                }
                _ => {}
            }
        }
        e
    }

    fn primary(&mut self, p: Pair<'_, Rule>) -> Expr {
        let span = self.span(&p);
        let kind = match p.as_rule() {
            Rule::postfix_expr => return self.postfix(p),
            Rule::number => ExprKind::Number(p.as_str().to_string()),
            Rule::quantity => {
                let mut it = p.into_inner();
                let number = it.next().map(|n| n.as_str().to_string()).unwrap_or_default();
                match it.next() {
                    Some(u) => ExprKind::Quantity { number, unit: u.as_str().to_string(), unit_span: self.span(&u) },
                    None => ExprKind::Number(number),
                }
            }
            Rule::string => ExprKind::Str(unescape(p.as_str())),
            Rule::kw_true => ExprKind::Bool(true),
            Rule::kw_false => ExprKind::Bool(false),
            Rule::kw_none => ExprKind::None,
            Rule::ident => ExprKind::Name(self.ident(p)),
            Rule::list => {
                let mut items = Vec::new();
                for c in p.into_inner() {
                    match c.as_rule() {
                        Rule::expr => items.push(self.expr(c)),
                        Rule::close_bracket => self.close(&c, span, "["),
                        _ => {}
                    }
                }
                ExprKind::List(items)
            }
            Rule::map => {
                let mut entries = Vec::new();
                for c in p.into_inner() {
                    match c.as_rule() {
                        Rule::map_entry => {
                            let mut it = c.into_inner();
                            if let (Some(k), Some(v)) = (it.next(), it.next()) {
                                let key = StrLit { value: unescape(k.as_str()), span: self.span(&k) };
                                entries.push((key, self.expr(v)));
                            }
                        }
                        Rule::close_brace => self.close(&c, span, "{"),
                        _ => {}
                    }
                }
                ExprKind::Map(entries)
            }
            Rule::paren => {
                let mut inner = None;
                for c in p.into_inner() {
                    match c.as_rule() {
                        Rule::expr => inner = Some(self.expr(c)),
                        Rule::close_paren => self.close(&c, span, "("),
                        _ => {}
                    }
                }
                match inner {
                    Some(e) => ExprKind::Paren(Box::new(e)),
                    None => ExprKind::Error,
                }
            }
            Rule::if_expr => {
                let mut parts =
                    p.into_inner().filter(|c| c.as_rule() == Rule::expr).map(|c| self.expr(c)).collect::<Vec<_>>();
                if parts.len() == 3 {
                    let otherwise = parts.pop().map(Box::new);
                    let then = parts.pop().map(Box::new);
                    let cond = parts.pop().map(Box::new);
                    match (cond, then, otherwise) {
                        (Some(cond), Some(then), Some(otherwise)) => ExprKind::If { cond, then, otherwise },
                        _ => ExprKind::Error,
                    }
                } else {
                    ExprKind::Error
                }
            }
            Rule::expr | Rule::range_expr | Rule::in_range | Rule::bin_expr | Rule::unary => return self.expr(p),
            _ => ExprKind::Error,
        };
        Expr { kind, span }
    }
}

fn bin_op(rule: Rule) -> Option<BinOp> {
    Some(match rule {
        Rule::op_or => BinOp::Or,
        Rule::op_and => BinOp::And,
        Rule::op_eq => BinOp::Eq,
        Rule::op_ne => BinOp::Ne,
        Rule::op_le => BinOp::Le,
        Rule::op_ge => BinOp::Ge,
        Rule::op_lt => BinOp::Lt,
        Rule::op_gt => BinOp::Gt,
        Rule::op_in => BinOp::In,
        Rule::op_is => BinOp::Is,
        Rule::op_add => BinOp::Add,
        Rule::op_sub => BinOp::Sub,
        Rule::op_mul => BinOp::Mul,
        Rule::op_div => BinOp::Div,
        Rule::op_rem => BinOp::Rem,
        _ => return None,
    })
}
