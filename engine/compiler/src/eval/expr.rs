//! Expressions: literals, units, names, fields, calls, records, operators, `if` and `in`.

use super::{Builtin, Env, Eval, R};
use crate::num::{unit, Dim, Q, UNIT_NAMES};
use crate::suggest::did_you_mean;
use crate::types::{Iface, Type};
use crate::value::{FieldValue, Value};
use miles_grammar::ast::{self, BinOp, Expr, ExprKind, ItemKind, UnOp};
use miles_grammar::diag::ErrorCode;
use miles_grammar::diag::{Diagnostic, Span};
use std::cell::Cell;
use std::collections::BTreeMap;

/// How often (in levels of `eval`) the stack is checked, and what each check makes sure is
/// left: room for that many levels.
const STACK_CHECK_EVERY: u32 = 8;
const STACK_RED_ZONE: usize = STACK_CHECK_EVERY as usize * (64 << 10);
const STACK_GROW: usize = 4 << 20;

thread_local! {
    /// How deep `eval` is nested on this thread (see `Eval::eval`).
    static EVAL_DEPTH: Cell<u32> = const { Cell::new(0) };
}

impl<'p> Eval<'p> {
    pub fn eval(&mut self, e: &Expr, env: Env, expected: Option<&Type>) -> R<Value> {
        // Expressions nest up to miles_grammar::MAX_EXPR_DEPTH deep and a debug build's frames
        // here are large: grow the stack rather than overflow it. Checking costs a call, so it
        // is done every STACK_CHECK_EVERY levels (the outermost included), with a red zone for
        // that many levels (64 KiB each). The count is per thread; a panic that skips the
        // decrement only moves which levels are checked, never how often.
        let depth = EVAL_DEPTH.with(|d| {
            let n = d.get().wrapping_add(1);
            d.set(n);
            n
        });
        let v = if depth.wrapping_sub(1).is_multiple_of(STACK_CHECK_EVERY) {
            stacker::maybe_grow(STACK_RED_ZONE, STACK_GROW, || self.eval_inner(e, env, expected))
        } else {
            self.eval_inner(e, env, expected)
        };
        EVAL_DEPTH.with(|d| d.set(d.get().wrapping_sub(1)));
        v
    }

    fn eval_inner(&mut self, e: &Expr, env: Env, expected: Option<&Type>) -> R<Value> {
        match &e.kind {
            ExprKind::Error => None,
            ExprKind::Number(text) => self.number_literal(text, e.span),
            ExprKind::Quantity { number, unit: u, unit_span } => self.quantity_literal(number, u, *unit_span, e.span),
            ExprKind::Str(s) => Some(Value::Str(s.clone())),
            ExprKind::Bool(b) => Some(Value::Bool(*b)),
            ExprKind::None => Some(Value::None),
            ExprKind::List(items) => self.list_literal(items, env, expected),
            ExprKind::Map(entries) => self.map_literal(entries, env, expected),
            ExprKind::Name(id) => self.lookup_name(id, env, expected),
            ExprKind::Paren(inner) => self.eval(inner, env, expected),
            ExprKind::Field(base, field) => {
                // `Enum.member` where an enum is expected, or anywhere.
                let b = self.eval(base, env, None)?;
                if let (ExprKind::Name(id), Value::Stage(_)) = (&base.kind, &b) {
                    if self.stage_hides_module(id, field, env) {
                        return None;
                    }
                }
                self.field_of(b, field)
            }
            ExprKind::Call { callee, args, .. } => self.call(callee, args, env, e.span),
            ExprKind::Record { base, fields, .. } => self.record_block(base, fields, env, e.span),
            ExprKind::Unary { op, expr } => self.unary(*op, expr, env, e.span),
            ExprKind::If { cond, then, otherwise } => self.if_else(cond, then, otherwise, env, expected),
            ExprKind::Range { start, end, inclusive } => self.range(start.as_deref(), end.as_deref(), *inclusive, env),
            ExprKind::Binary { op, op_span, lhs, rhs } => self.binary(*op, *op_span, lhs, rhs, env, e.span),
        }
    }

    /// `32`, `4.02e9`: the number exactly, or E0005.
    fn number_literal(&mut self, text: &str, span: Span) -> R<Value> {
        match Q::parse_literal(text) {
            Some(q) => Some(Value::Num { q, float: text.contains(['.', 'e', 'E']) }),
            None => {
                self.report(
                    Diagnostic::error(ErrorCode::E0005, format!("`{text}` is not a number miles can hold exactly"))
                        .with_primary(span, "too large or malformed")
                        .with_help("numbers are exact 128-bit rationals; use a unit or a smaller magnitude"),
                );
                None
            }
        }
    }

    /// `512.MB`: a known unit (E0203 with a suggestion otherwise), scaled without overflow.
    fn quantity_literal(&mut self, number: &str, u: &str, unit_span: Span, span: Span) -> R<Value> {
        let Some((dim, size)) = unit(u) else {
            let mut d = Diagnostic::error(ErrorCode::E0203, format!("unknown unit `{u}`"))
                .with_primary(unit_span, "not a unit");
            if let Some(s) = did_you_mean(u, UNIT_NAMES.iter().copied()) {
                d = d.with_help(format!("did you mean `{s}`?")).with_fix(format!("replace with `{s}`"), unit_span, s);
            } else {
                d = d.with_help(format!("units: {}", UNIT_NAMES.join(" ")));
            }
            self.report(d);
            return None;
        };
        let Some(n) = Q::parse_literal(number) else {
            self.report(
                Diagnostic::error(ErrorCode::E0005, format!("`{number}` is not a number miles can hold exactly"))
                    .with_primary(span, "here"),
            );
            return None;
        };
        match n.checked_mul(size) {
            Some(q) => Some(Value::Quantity { q, dim }),
            None => {
                self.report(
                    Diagnostic::error(ErrorCode::E0205, "this quantity overflows 128 bits")
                        .with_primary(span, "too large"),
                );
                None
            }
        }
    }

    /// `[a, b]`: each item evaluated as the expected list's element type.
    fn list_literal(&mut self, items: &[Expr], env: Env, expected: Option<&Type>) -> R<Value> {
        let inner = match expected.map(|t| t.strip_optional()) {
            Some(Type::List(t)) => Some((**t).clone()),
            _ => None,
        };
        let mut out = Vec::with_capacity(items.len());
        for it in items {
            out.push(self.eval(it, env, inner.as_ref())?);
        }
        Some(Value::List(out))
    }

    /// `{"k": v}`: each value evaluated as the expected map's value type; a repeated key is E0104.
    fn map_literal(&mut self, entries: &[(ast::StrLit, Expr)], env: Env, expected: Option<&Type>) -> R<Value> {
        let inner = match expected.map(|t| t.strip_optional()) {
            Some(Type::Map(t)) => Some((**t).clone()),
            _ => None,
        };
        let mut out = BTreeMap::new();
        for (k, v) in entries {
            let val = self.eval(v, env, inner.as_ref())?;
            if out.insert(k.value.clone(), val).is_some() {
                self.report(
                    Diagnostic::error(ErrorCode::E0104, format!("key {:?} appears twice", k.value))
                        .with_primary(k.span, "duplicate key"),
                );
            }
        }
        Some(Value::Map(out))
    }

    /// `f(args)`: a builtin is applied; a stage kind outside a recipe binding, or anything else,
    /// cannot be called (E0208).
    fn call(&mut self, callee: &Expr, args: &[ast::Arg], env: Env, span: Span) -> R<Value> {
        let c = self.eval(callee, env, None)?;
        match c {
            Value::Builtin(b) => {
                let mut vals = Vec::with_capacity(args.len());
                for a in args {
                    let v = self.eval(&a.value, env, None)?;
                    vals.push((v, self.origin_span(&a.value, env)));
                }
                self.builtin(b, vals, span)
            }
            Value::Decl(r) if matches!(self.program.item(r).kind, ItemKind::Stage(_)) => {
                self.report(
                    Diagnostic::error(
                        ErrorCode::E0208,
                        format!("stage kind `{}` can only be instantiated as a recipe binding", self.decl_name(r)),
                    )
                    .with_primary(span, "not in a recipe binding")
                    .with_help(format!("bind it in a recipe: `name = {}(...)`", self.decl_name(r))),
                );
                None
            }
            other => {
                self.report(
                    Diagnostic::error(ErrorCode::E0208, format!("{} cannot be called", other.type_name()))
                        .with_primary(callee.span, "not a function or stage kind")
                        .with_help(format!("builtin functions: {}", Builtin::names().join(", "))),
                );
                None
            }
        }
    }

    /// `base { fields }`: a record of the schema `base` names, or a copy of the record `base`
    /// with fields replaced; anything else cannot take a block (E0201).
    fn record_block(&mut self, base: &Expr, fields: &[ast::Binding], env: Env, span: Span) -> R<Value> {
        let b = match &base.kind {
            ExprKind::Name(id) => self.block_head(id, env)?,
            _ => self.eval(base, env, None)?,
        };
        match b {
            Value::Decl(r) if self.is_schema(r) => self.construct(r, fields, env, span, None),
            Value::Record(rec) => {
                let schema = rec.schema;
                self.construct(schema, fields, env, span, Some(&rec))
            }
            other => {
                self.report(
                    Diagnostic::error(
                        ErrorCode::E0201,
                        format!("{} cannot take a `{{ ... }}` block", other.type_name()),
                    )
                    .with_primary(base.span, "not a schema")
                    .with_help("a block follows a schema name (`adam { ... }`) or a stage kind in a recipe binding"),
                );
                None
            }
        }
    }

    /// `not x`, `-x`.
    fn unary(&mut self, op: UnOp, expr: &Expr, env: Env, span: Span) -> R<Value> {
        let v = self.eval(expr, env, None)?;
        match (op, v) {
            (UnOp::Not, Value::Bool(b)) => Some(Value::Bool(!b)),
            (UnOp::Neg, Value::Num { q, float }) => Some(Value::Num { q: self.arith(q.checked_neg(), span)?, float }),
            (UnOp::Neg, Value::Quantity { q, dim }) => {
                Some(Value::Quantity { q: self.arith(q.checked_neg(), span)?, dim })
            }
            (op, v) => {
                self.report(
                    Diagnostic::error(
                        ErrorCode::E0205,
                        format!("cannot apply `{}` to {}", if op == UnOp::Not { "not" } else { "-" }, v.type_name()),
                    )
                    .with_primary(span, "here"),
                );
                None
            }
        }
    }

    /// `if cond then a else b`: only the chosen branch is evaluated.
    fn if_else(&mut self, cond: &Expr, then: &Expr, otherwise: &Expr, env: Env, expected: Option<&Type>) -> R<Value> {
        match self.eval(cond, env, Some(&Type::Bool))? {
            Value::Bool(true) => self.eval(then, env, expected),
            Value::Bool(false) => self.eval(otherwise, env, expected),
            v => {
                self.report(
                    Diagnostic::error(ErrorCode::E0201, format!("`if` needs a Bool, found {}", v.type_name()))
                        .with_primary(cond.span, "not a Bool"),
                );
                None
            }
        }
    }

    /// `a..b`, `a..=b`, `a..`, `..b`: the bounds as values.
    fn range(&mut self, start: Option<&Expr>, end: Option<&Expr>, inclusive: bool, env: Env) -> R<Value> {
        let s = match start {
            Some(x) => Some(Box::new(self.eval(x, env, None)?)),
            None => None,
        };
        let en = match end {
            Some(x) => Some(Box::new(self.eval(x, env, None)?)),
            None => None,
        };
        Some(Value::Range { start: s, end: en, inclusive })
    }

    fn arith(&mut self, r: Option<Q>, span: Span) -> R<Q> {
        if r.is_none() {
            self.report(
                Diagnostic::error(ErrorCode::E0205, "arithmetic overflow or division by zero")
                    .with_primary(span, "cannot be computed exactly")
                    .with_help("numbers are exact 128-bit rationals"),
            );
        }
        r
    }

    pub fn field_of(&mut self, b: Value, field: &ast::Ident) -> R<Value> {
        match b {
            Value::Module(m) => match self.program.module(m).own.get(&field.name).copied() {
                Some(r) => {
                    if let Some(n) = self.program.item(r).name() {
                        self.references.push((field.span, n.span));
                    }
                    self.item_value(r)
                }
                None => {
                    self.not_member(m, field);
                    None
                }
            },
            Value::Record(rec) => match rec.fields.get(&field.name) {
                Some(fv) => Some(fv.value.clone()),
                None => {
                    self.unknown_field(rec.schema, field);
                    None
                }
            },
            Value::Map(m) => match m.get(&field.name) {
                Some(v) => Some(v.clone()),
                None => {
                    let keys: Vec<&str> = m.keys().map(String::as_str).collect();
                    self.report(
                        Diagnostic::error(ErrorCode::E0105, format!("the map has no key `{}`", field.name))
                            .with_primary(field.span, "no such key")
                            .with_help(format!("its keys: {}", keys.join(", "))),
                    );
                    None
                }
            },
            Value::Stage(n) => {
                let i = *self.recipe.as_ref()?.by_name.get(&n)?;
                if let Some(v) = self.instance_member(i, &field.name) {
                    return v;
                }
                let kind = self.recipe.as_ref()?.instances[i].kind;
                self.unknown_field(kind, field);
                None
            }
            Value::Decl(r) if matches!(self.program.item(r).kind, ItemKind::Enum(_)) => {
                if self.enum_has(r, &field.name) {
                    Some(Value::Enum { decl: r, ty: self.decl_name(r), member: field.name.clone() })
                } else {
                    let members = self.enum_members(r);
                    let mut d = Diagnostic::error(
                        ErrorCode::E0109,
                        format!("`{}` is not a member of enum `{}`", field.name, self.decl_name(r)),
                    )
                    .with_primary(field.span, "unknown member");
                    if let Some(s) = did_you_mean(&field.name, members.iter().map(|s| s.as_str())) {
                        d = d
                            .with_fix(format!("replace with `{s}`"), field.span, s.clone())
                            .with_help(format!("did you mean `{s}`?"));
                    } else {
                        d = d.with_help(format!("members: {}", members.join(", ")));
                    }
                    self.report(d);
                    None
                }
            }
            Value::None => {
                self.report(
                    Diagnostic::error(ErrorCode::E0201, format!("cannot read `{}` of none", field.name))
                        .with_primary(field.span, "the value is none here")
                        .with_help("guard it: `x == none or x.field ...`"),
                );
                None
            }
            other => {
                self.report(
                    Diagnostic::error(ErrorCode::E0201, format!("{} has no fields", other.type_name()))
                        .with_primary(field.span, format!("cannot read `{}`", field.name)),
                );
                None
            }
        }
    }

    fn binary(&mut self, op: BinOp, op_span: Span, lhs: &Expr, rhs: &Expr, env: Env, span: Span) -> R<Value> {
        if matches!(op, BinOp::And | BinOp::Or) {
            return self.short_circuit(op, lhs, rhs, env);
        }
        let l = self.eval(lhs, env, None)?;
        if op == BinOp::Is {
            return self.is_test(&l, rhs, env);
        }
        // The left side's enum lets the right side name its members bare (`transport == p2p`).
        let hint = match &l {
            Value::Enum { decl, ty, .. } => Some(match op {
                BinOp::In => Type::List(Box::new(Type::Enum(*decl, ty.clone()))),
                _ => Type::Enum(*decl, ty.clone()),
            }),
            _ => None,
        };
        let r = self.eval(rhs, env, hint.as_ref())?;
        self.apply_binary(op, OpSpans { op: op_span, lhs: lhs.span, rhs: rhs.span, whole: span }, &l, &r)
    }

    /// `and`, `or`: Bools on both sides, the right one evaluated only when it decides.
    fn short_circuit(&mut self, op: BinOp, lhs: &Expr, rhs: &Expr, env: Env) -> R<Value> {
        let l = self.eval(lhs, env, Some(&Type::Bool))?;
        let Value::Bool(lb) = l else {
            self.report(
                Diagnostic::error(ErrorCode::E0201, format!("`{}` needs Bools, found {}", op.symbol(), l.type_name()))
                    .with_primary(lhs.span, "not a Bool"),
            );
            return None;
        };
        if (op == BinOp::And && !lb) || (op == BinOp::Or && lb) {
            return Some(Value::Bool(lb));
        }
        let r = self.eval(rhs, env, Some(&Type::Bool))?;
        match r {
            Value::Bool(rb) => Some(Value::Bool(rb)),
            other => {
                self.report(
                    Diagnostic::error(
                        ErrorCode::E0201,
                        format!("`{}` needs Bools, found {}", op.symbol(), other.type_name()),
                    )
                    .with_primary(rhs.span, "not a Bool"),
                );
                None
            }
        }
    }

    /// `x is kind`: whether a record is of a schema (or one that satisfies an interface), or an
    /// upstream stage of a stage kind.
    fn is_test(&mut self, l: &Value, rhs: &Expr, env: Env) -> R<Value> {
        let r = self.eval(rhs, env, None)?;
        match (l, r) {
            (Value::Record(rec), Value::Decl(d)) => {
                let yes = rec.schema == d || {
                    let name = self.decl_name(d);
                    matches!(self.program.item(d).kind, ItemKind::Interface(_))
                        && self.satisfies(rec.schema, &Iface::Decl(d, name))
                };
                Some(Value::Bool(yes))
            }
            // `reward is image_reward`: whether an upstream stage is of that kind.
            (Value::Stage(n), Value::Decl(d)) => {
                let r = self.recipe.as_ref()?;
                Some(Value::Bool(r.by_name.get(n).is_some_and(|&i| r.instances[i].kind == d)))
            }
            (_, Value::Decl(_)) => Some(Value::Bool(false)),
            (_, other) => {
                self.report(
                    Diagnostic::error(
                        ErrorCode::E0201,
                        format!(
                            "`is` takes a schema, interface or stage kind on the right, found {}",
                            other.type_name()
                        ),
                    )
                    .with_primary(rhs.span, "not a schema"),
                );
                None
            }
        }
    }

    /// A strict operator applied to both evaluated sides: equality, ordering, `in`, arithmetic.
    fn apply_binary(&mut self, op: BinOp, at: OpSpans, l: &Value, r: &Value) -> R<Value> {
        match op {
            BinOp::Eq | BinOp::Ne => {
                if let (Value::Quantity { dim: a, .. }, Value::Quantity { dim: b, .. }) = (l, r) {
                    if a != b {
                        return self.bad_operands(op, at, l, r);
                    }
                }
                let eq = values_equal(l, r);
                Some(Value::Bool(if op == BinOp::Eq { eq } else { !eq }))
            }
            BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge => {
                let ord = match (l, r) {
                    (Value::Num { q: a, .. }, Value::Num { q: b, .. }) => a.cmp(b),
                    (Value::Quantity { q: a, dim: da }, Value::Quantity { q: b, dim: db }) if da == db => a.cmp(b),
                    (Value::Str(a), Value::Str(b)) => a.cmp(b),
                    _ => return self.bad_operands(op, at, l, r),
                };
                use std::cmp::Ordering::*;
                Some(Value::Bool(match op {
                    BinOp::Lt => ord == Less,
                    BinOp::Le => ord != Greater,
                    BinOp::Gt => ord == Greater,
                    _ => ord != Less,
                }))
            }
            BinOp::In => Some(Value::Bool(self.contains(r, l, at.rhs)?)),
            BinOp::Add | BinOp::Sub => self.add_sub(op, at, l, r),
            BinOp::Mul | BinOp::Div | BinOp::Rem => self.mul_div_rem(op, at, l, r),
            BinOp::And | BinOp::Or | BinOp::Is => None,
        }
    }

    /// `+`, `-`: numbers, quantities of one dimension; `+` also joins strings and lists.
    fn add_sub(&mut self, op: BinOp, at: OpSpans, l: &Value, r: &Value) -> R<Value> {
        let span = at.whole;
        match (l, r) {
            (Value::Num { q: a, float: fa }, Value::Num { q: b, float: fb }) => {
                let q = self.arith(if op == BinOp::Add { a.checked_add(*b) } else { a.checked_sub(*b) }, span)?;
                Some(Value::Num { q, float: *fa || *fb })
            }
            (Value::Quantity { q: a, dim: da }, Value::Quantity { q: b, dim: db }) if da == db => {
                let q = self.arith(if op == BinOp::Add { a.checked_add(*b) } else { a.checked_sub(*b) }, span)?;
                Some(Value::Quantity { q, dim: *da })
            }
            (Value::Str(a), Value::Str(b)) if op == BinOp::Add => Some(Value::Str(format!("{a}{b}"))),
            (Value::List(a), Value::List(b)) if op == BinOp::Add => {
                Some(Value::List(a.iter().chain(b.iter()).cloned().collect()))
            }
            _ => self.bad_operands(op, at, l, r),
        }
    }

    /// `*`, `/`, `%`: numbers and quantities, dimensions multiplied or divided; `gpu * n` is a
    /// cluster of n such GPUs.
    fn mul_div_rem(&mut self, op: BinOp, at: OpSpans, l: &Value, r: &Value) -> R<Value> {
        let span = at.whole;
        // Sugar: `gb300 * 64` is a cluster of 64 such GPUs.
        if op == BinOp::Mul {
            if let (Value::Record(rec), Value::Num { q, .. }) = (l, r) {
                if self.schema_is_named_iface(rec.schema, "Hardware") {
                    return self.gpu_cluster(l.clone(), *q, span);
                }
            }
        }
        let (qa, da, fa) = num_parts(l)?;
        let (qb, db, fb) = match num_parts(r) {
            Some(x) => x,
            None => return self.bad_operands(op, at, l, r),
        };
        let _ = fa;
        let (q, dim) = match op {
            BinOp::Mul => (self.arith(qa.checked_mul(qb), span)?, da.times(db)),
            BinOp::Div => (self.arith(qa.checked_div(qb), span)?, da.per(db)),
            _ => {
                if da != db && !db.is_none() {
                    return self.bad_operands(op, at, l, r);
                }
                (self.arith(qa.checked_rem(qb), span)?, da)
            }
        };
        if dim.is_none() {
            let float = op == BinOp::Div && !q.is_integer() || fa || fb;
            Some(Value::Num { q, float })
        } else {
            Some(Value::Quantity { q, dim })
        }
    }

    /// `cannot apply`: E0202 when a quantity is involved (a unit mismatch), E0205 otherwise.
    fn bad_operands(&mut self, op: BinOp, at: OpSpans, l: &Value, r: &Value) -> R<Value> {
        let code = match (l, r) {
            (Value::Quantity { .. }, _) | (_, Value::Quantity { .. }) => ErrorCode::E0202,
            _ => ErrorCode::E0205,
        };
        self.report(
            Diagnostic::error(
                code,
                format!("cannot apply `{}` to {} and {}", op.symbol(), l.type_name(), r.type_name()),
            )
            .with_primary(at.op, "here")
            .with_secondary(at.lhs, l.type_name())
            .with_secondary(at.rhs, r.type_name()),
        );
        None
    }

    fn gpu_cluster(&mut self, gpu: Value, count: Q, span: Span) -> R<Value> {
        let Some(schema) = self.prelude_decl("gpu_cluster") else {
            self.internal_error(ErrorCode::E0103, span, "the prelude declares no `gpu_cluster` schema".into());
            return None;
        };
        let mut provided = BTreeMap::new();
        provided.insert("gpu".to_string(), FieldValue { value: gpu, span, defaulted: false });
        provided.insert(
            "gpus".to_string(),
            FieldValue { value: Value::Num { q: count, float: false }, span, defaulted: false },
        );
        self.build_record(schema, provided, span)
    }

    pub(super) fn contains(&mut self, container: &Value, v: &Value, span: Span) -> R<bool> {
        match container {
            Value::List(items) => Some(items.iter().any(|x| values_equal(x, v))),
            Value::Map(m) => Some(v.as_str().is_some_and(|k| m.contains_key(k))),
            Value::Range { start, end, inclusive } => {
                let key = |x: &Value| -> Option<(Q, Dim)> {
                    match x {
                        Value::Num { q, .. } => Some((*q, Dim::NONE)),
                        Value::Quantity { q, dim } => Some((*q, *dim)),
                        _ => None,
                    }
                };
                let Some((q, d)) = key(v) else {
                    self.report(
                        Diagnostic::error(ErrorCode::E0201, format!("a range holds numbers, not {}", v.type_name()))
                            .with_primary(span, "here"),
                    );
                    return None;
                };
                // Each present bound: its value, and whether `q` is on the right side of it.
                let mut ok = true;
                let bounds = [(start, true), (end, false)];
                for (bound, is_start) in bounds.iter().filter_map(|(b, s)| b.as_ref().map(|b| (b, *s))) {
                    let Some((bq, bd)) = key(bound) else { return Some(false) };
                    if bd != d {
                        self.report(
                            Diagnostic::error(
                                ErrorCode::E0202,
                                format!("range bounds are {} but the value is {}", bd.name(), d.name()),
                            )
                            .with_primary(span, "here"),
                        );
                        return None;
                    }
                    ok &= match (is_start, *inclusive) {
                        (true, _) => q >= bq,
                        (false, true) => q <= bq,
                        (false, false) => q < bq,
                    };
                }
                Some(ok)
            }
            Value::Str(s) => Some(v.as_str().is_some_and(|x| s.contains(x))),
            other => {
                self.report(
                    Diagnostic::error(
                        ErrorCode::E0201,
                        format!("`in` needs a list, map or range, found {}", other.type_name()),
                    )
                    .with_primary(span, "here"),
                );
                None
            }
        }
    }
}

/// Where a binary operation is written: the operator, each side, and the whole expression.
#[derive(Clone, Copy)]
struct OpSpans {
    op: Span,
    lhs: Span,
    rhs: Span,
    whole: Span,
}

fn num_parts(v: &Value) -> Option<(Q, Dim, bool)> {
    match v {
        Value::Num { q, float } => Some((*q, Dim::NONE, *float)),
        Value::Quantity { q, dim } => Some((*q, *dim, false)),
        _ => None,
    }
}

pub fn values_equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Num { q: x, .. }, Value::Num { q: y, .. }) => x == y,
        (Value::Quantity { q: x, dim: dx }, Value::Quantity { q: y, dim: dy }) => x == y && dx == dy,
        (Value::Enum { decl: d1, member: m1, .. }, Value::Enum { decl: d2, member: m2, .. }) => d1 == d2 && m1 == m2,
        (Value::Record(x), Value::Record(y)) => {
            x.schema == y.schema
                && x.fields.len() == y.fields.len()
                && x.fields.iter().all(|(k, v)| y.fields.get(k).is_some_and(|w| values_equal(&v.value, &w.value)))
        }
        (Value::List(x), Value::List(y)) => x.len() == y.len() && x.iter().zip(y).all(|(a, b)| values_equal(a, b)),
        _ => a == b,
    }
}
