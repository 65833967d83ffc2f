//! The one accessor set over a lowered recipe: a stage's parameters and a record's fields, read
//! as typed values with the span the recipe set them at. The typed `Job` is built with these and
//! nothing else reads a stage or a record by field name for `miles plan` or `miles run`.
//!
//! A span is `Some` only where the recipe wrote the value: a default (the stdlib's expression) has
//! none, so a plan or a refusal points at the user's line or at nothing.

use crate::graph::{StageGraph, StageNode};
use crate::num::Q;
use crate::value::{PortKind, Record, Value};
use miles_grammar::diag::{Span, Spanned};

/// Something with named values: a stage's parameters or a record's fields.
pub trait Fields {
    fn value(&self, name: &str) -> Option<&Value>;
    /// Where the recipe set `name`; `None` for a default.
    fn set_span(&self, name: &str) -> Option<Span>;

    /// A non-negative count or size, rounded (`Int`s, and quantities such as `4.tokens`).
    fn u64(&self, name: &str) -> Option<Spanned<u64>> {
        let v = self.value(name)?.as_q().and_then(q_to_u64)?;
        Some(Spanned { value: v, span: self.set_span(name) })
    }
    fn f64(&self, name: &str) -> Option<Spanned<f64>> {
        let v = self.value(name)?.as_f64()?;
        Some(Spanned { value: v, span: self.set_span(name) })
    }
    fn bool(&self, name: &str) -> Option<Spanned<bool>> {
        let v = self.value(name)?.as_bool()?;
        Some(Spanned { value: v, span: self.set_span(name) })
    }
    /// An enum member's name (`bf16`, `fully_async`'s `per_group`, ...).
    fn member(&self, name: &str) -> Option<Spanned<&str>> {
        let v = self.value(name)?.as_enum()?;
        Some(Spanned { value: v, span: self.set_span(name) })
    }
    fn str(&self, name: &str) -> Option<&str> {
        self.value(name)?.as_str()
    }
    fn record(&self, name: &str) -> Option<&Record> {
        self.value(name)?.as_record()
    }
    /// A list's items; empty when the field is absent or not a list.
    fn list(&self, name: &str) -> &[Value] {
        match self.value(name) {
            Some(Value::List(items)) => items,
            _ => &[],
        }
    }
    /// The strings of a list of strings (a command's argv).
    fn strings(&self, name: &str) -> Vec<String> {
        self.list(name).iter().filter_map(|v| v.as_str().map(str::to_string)).collect()
    }
    /// The value, unless it is absent or `none` (an optional field left unset).
    fn some(&self, name: &str) -> Option<&Value> {
        self.value(name).filter(|v| **v != Value::None)
    }
}

impl Fields for StageNode {
    fn value(&self, name: &str) -> Option<&Value> {
        self.param(name)
    }
    fn set_span(&self, name: &str) -> Option<Span> {
        self.params.get(name).filter(|p| !p.defaulted).map(|p| p.span)
    }
}

impl Fields for Record {
    fn value(&self, name: &str) -> Option<&Value> {
        self.get(name)
    }
    fn set_span(&self, name: &str) -> Option<Span> {
        // A field filled by a builtin (`hf_config`) has no span of its own.
        self.fields.get(name).filter(|f| !f.defaulted && f.span != Span::default()).map(|f| f.span)
    }
}

/// A finite, non-negative number rounded to a count.
pub fn q_to_u64(q: Q) -> Option<u64> {
    let f = q.to_f64();
    (f.is_finite() && f >= 0.0).then(|| f.round() as u64)
}

/// Where a refusal about `name` of `node` points: the recipe's line, else the stage's name.
pub fn refusal_span(node: &StageNode, name: &str) -> Span {
    node.params.get(name).map(|p| p.span).unwrap_or(node.name_span)
}

/// The stage feeding `node` through a port of kind `port` (its rollout, its reward).
pub fn upstream<'g>(g: &'g StageGraph, node: &StageNode, port: PortKind) -> Option<&'g StageNode> {
    node.inputs.values().find_map(|v| match v {
        Value::Stage(n) => g.node(n).filter(|up| up.output == Some(port)),
        _ => None,
    })
}

/// The stage a parameter or field names (`opd { teacher = scorer }`).
pub fn stage_named<'g>(g: &'g StageGraph, v: Option<&Value>) -> Option<&'g StageNode> {
    match v {
        Some(Value::Stage(n)) => g.node(n),
        _ => None,
    }
}
