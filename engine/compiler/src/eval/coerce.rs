//! Coercion: checking a value against a declared type, with the language's few conversions,
//! and what it takes for a schema to satisfy an interface.

use super::{Eval, R};
use crate::program::ScopeEntry;
use crate::types::{suggested_unit, Iface, Type};
use crate::value::{ItemRef, PortKind, Value};
use miles_grammar::ast::ItemKind;
use miles_grammar::diag::ErrorCode;
use miles_grammar::diag::{Diagnostic, Span};
use std::collections::BTreeMap;

impl<'p> Eval<'p> {
    /// Checks `v` against `t`, applying the language's coercions: an integral number is an
    /// Int, an Int is a Float, a schema named alone is its record of defaults.
    pub fn coerce(&mut self, v: Value, t: &Type, span: Span) -> R<Value> {
        match (t, &v) {
            (Type::Any, _) => Some(v),
            (Type::Optional(_), Value::None) => Some(v),
            (Type::Optional(inner), _) => self.coerce(v, inner, span),
            (Type::Int, Value::Num { q, .. }) if q.is_integer() => Some(Value::Num { q: *q, float: false }),
            (Type::Int, Value::Num { q, .. }) => {
                self.report(
                    Diagnostic::error(ErrorCode::E0201, format!("expected an Int, found {q}"))
                        .with_primary(span, "not a whole number")
                        .with_help("this field counts things; give a whole number"),
                );
                None
            }
            (Type::Float, Value::Num { q, .. }) => Some(Value::Num { q: *q, float: true }),
            (Type::Quantity(d), Value::Quantity { dim, .. }) if d == dim => Some(v),
            (Type::Quantity(d), Value::Quantity { dim, .. }) => {
                self.report(
                    Diagnostic::error(ErrorCode::E0202, format!("expected {}, found {}", d.name(), dim.name()))
                        .with_primary(span, format!("this is {}", dim.name()))
                        .with_help(format!("give a value in {} units, e.g. `1.{}`", d.name(), suggested_unit(*d))),
                );
                None
            }
            (Type::Quantity(d), Value::Num { q, .. }) => {
                let u = suggested_unit(*d);
                let mut diag =
                    Diagnostic::error(ErrorCode::E0202, format!("expected {}, found a plain number", d.name()))
                        .with_primary(span, format!("a number without a unit; {} needs one", d.name()))
                        .with_help(format!("write the unit: `{q}.{u}`"));
                diag = diag.with_fix(format!("write `{q}.{u}`"), Span { start: span.end, ..span }, format!(".{u}"));
                self.report(diag);
                None
            }
            (Type::Bool, Value::Bool(_)) | (Type::Str, Value::Str(_)) | (Type::Range, Value::Range { .. }) => Some(v),
            (Type::List(inner), Value::List(items)) => {
                let mut out = Vec::with_capacity(items.len());
                for it in items.clone() {
                    out.push(self.coerce(it, inner, span)?);
                }
                Some(Value::List(out))
            }
            (Type::Map(inner), Value::Map(m)) => {
                let mut out = BTreeMap::new();
                for (k, it) in m.clone() {
                    out.insert(k, self.coerce(it, inner, span)?);
                }
                Some(Value::Map(out))
            }
            (Type::Enum(e, _), Value::Enum { decl, .. }) if decl == e => Some(v),
            (Type::Schema(s, _), Value::Record(r)) if r.schema == *s => Some(v),
            (Type::Schema(s, _), Value::Decl(d)) if d == s => self.build_record(*s, BTreeMap::new(), span),
            (Type::Interface(i), Value::Record(r)) if self.satisfies(r.schema, i) => Some(v),
            (Type::Interface(i), Value::Decl(d)) if self.is_schema(*d) && self.satisfies(*d, i) => {
                self.build_record(*d, BTreeMap::new(), span)
            }
            (Type::Port(p), _) | (Type::Interface(Iface::Port(p)), _) => {
                if self.port_accepts(*p, &v) {
                    return Some(v);
                }
                let found = self.describe_port_value(&v);
                self.report(
                    Diagnostic::error(ErrorCode::E0306, format!("expected {}, found {found}", p.name()))
                        .with_primary(span, format!("this gives {found}"))
                        .with_help(port_help(*p)),
                );
                None
            }
            _ => {
                let code = match (&v, t.strip_optional()) {
                    (Value::Quantity { .. }, Type::Int | Type::Float) => ErrorCode::E0202,
                    _ => ErrorCode::E0201,
                };
                let mut d = Diagnostic::error(code, format!("expected {t}, found {}", v.type_name()))
                    .with_primary(span, format!("this is {}", v.type_name()));
                if let (Type::Enum(e, _), Value::Str(s)) = (t.strip_optional(), &v) {
                    if self.enum_has(*e, s) {
                        d = d.with_help(format!("enum members are written without quotes: `{s}`"));
                    }
                } else if let Type::Enum(e, _) = t.strip_optional() {
                    d = d.with_help(format!("members: {}", self.enum_members(*e).join(", ")));
                } else if code == ErrorCode::E0202 {
                    d = d.with_help("this field is a plain number; remove the unit");
                }
                self.report(d);
                None
            }
        }
    }

    pub(super) fn is_schema(&self, r: ItemRef) -> bool {
        matches!(self.program.item(r).kind, ItemKind::Schema(_))
    }

    /// Whether schema `s` declares `is I`.
    pub fn satisfies(&self, s: ItemRef, i: &Iface) -> bool {
        let ItemKind::Schema(schema) = &self.program.item(s).kind else { return false };
        let Some(iname) = &schema.interface else { return false };
        match i {
            Iface::Port(p) => PortKind::from_name(&iname.name) == Some(*p),
            Iface::Decl(r, _) => match self.program.lookup(s.module, &iname.name) {
                Some(ScopeEntry::Item(x)) => x == *r,
                _ => false,
            },
        }
    }

    pub(super) fn schema_is_named_iface(&self, s: ItemRef, name: &str) -> bool {
        match &self.program.item(s).kind {
            ItemKind::Schema(schema) => schema.interface.as_ref().is_some_and(|i| i.name == name),
            _ => false,
        }
    }
}

fn port_help(p: PortKind) -> String {
    match p {
        PortKind::Policy => "give a `model` or a stage that produces a Policy (sft, grpo, ppo)".into(),
        PortKind::Trajectories => "give a rollout stage (`generate`)".into(),
        PortKind::Scores => "give a reward stage (a verifier such as `arith.exact_match(rollout)`)".into(),
        PortKind::Prompts => "give a prompt source (a task such as `arith.addition { ... }` or `jsonl { ... }`)".into(),
        PortKind::TokenScores => "give a teacher stage (`teacher_logprobs(teacher, rollout)`)".into(),
        PortKind::Metrics => "give a stage that produces Metrics".into(),
    }
}
