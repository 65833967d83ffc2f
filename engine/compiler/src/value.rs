//! Compile-time values. Everything a recipe says evaluates to one of these, exactly.

use crate::num::{format_quantity, Dim, Q};
use miles_grammar::diag::Span;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

/// A declaration: item `index` of module `module`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ItemRef {
    pub module: u32,
    pub index: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum PortKind {
    Prompts,
    Trajectories,
    Scores,
    /// One number per sampled token (on-policy distillation's teacher log-probs).
    TokenScores,
    Policy,
    Metrics,
}

impl PortKind {
    pub fn from_name(n: &str) -> Option<PortKind> {
        Some(match n {
            "Prompts" => PortKind::Prompts,
            "Trajectories" => PortKind::Trajectories,
            "Scores" => PortKind::Scores,
            "TokenScores" => PortKind::TokenScores,
            "Policy" => PortKind::Policy,
            "Metrics" => PortKind::Metrics,
            _ => return None,
        })
    }
    pub fn name(self) -> &'static str {
        match self {
            PortKind::Prompts => "Prompts",
            PortKind::Trajectories => "Trajectories",
            PortKind::Scores => "Scores",
            PortKind::TokenScores => "TokenScores",
            PortKind::Policy => "Policy",
            PortKind::Metrics => "Metrics",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct FieldValue {
    pub value: Value,
    /// Where the value was set; for a defaulted field, the default in the declaration.
    pub span: Span,
    pub defaulted: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    pub schema: ItemRef,
    pub schema_name: String,
    pub fields: BTreeMap<String, FieldValue>,
    pub span: Span,
}

impl Record {
    pub fn get(&self, name: &str) -> Option<&Value> {
        self.fields.get(name).map(|f| &f.value)
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// A plain number; `float` records whether it was written or computed as a Float.
    Num {
        q: Q,
        float: bool,
    },
    Quantity {
        q: Q,
        dim: Dim,
    },
    Bool(bool),
    Str(String),
    None,
    List(Vec<Value>),
    Map(BTreeMap<String, Value>),
    Range {
        start: Option<Box<Value>>,
        end: Option<Box<Value>>,
        inclusive: bool,
    },
    Enum {
        decl: ItemRef,
        ty: String,
        member: String,
    },
    Record(Arc<Record>),
    /// A stage instance of the recipe being evaluated, by binding name.
    Stage(String),
    /// A declaration used as a value: a stage kind (callable), a schema (constructible, or a
    /// record with all defaults), an enum (for `Enum.member`), an interface (for `is`).
    Decl(ItemRef),
    Module(u32),
    /// A builtin function (`min`, `max`, `len`, `model_of`, ...).
    Builtin(crate::eval::Builtin),
}

impl Value {
    pub fn int(n: i128) -> Value {
        Value::Num { q: Q::int(n), float: false }
    }
    pub fn as_q(&self) -> Option<Q> {
        match self {
            Value::Num { q, .. } | Value::Quantity { q, .. } => Some(*q),
            _ => None,
        }
    }
    pub fn as_i64(&self) -> Option<i64> {
        self.as_q().and_then(|q| q.to_i128()).and_then(|i| i64::try_from(i).ok())
    }
    pub fn as_f64(&self) -> Option<f64> {
        self.as_q().map(|q| q.to_f64())
    }
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Value::Bool(b) => Some(*b),
            _ => None,
        }
    }
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }
    pub fn as_enum(&self) -> Option<&str> {
        match self {
            Value::Enum { member, .. } => Some(member),
            _ => None,
        }
    }
    pub fn as_record(&self) -> Option<&Record> {
        match self {
            Value::Record(r) => Some(r),
            _ => None,
        }
    }

    /// What the value is, for messages: `Int`, `Bytes`, `record of megatron`, ...
    pub fn type_name(&self) -> String {
        match self {
            Value::Num { q, float } => {
                if *float || !q.is_integer() {
                    "Float".into()
                } else {
                    "Int".into()
                }
            }
            Value::Quantity { dim, .. } => dim.name(),
            Value::Bool(_) => "Bool".into(),
            Value::Str(_) => "String".into(),
            Value::None => "none".into(),
            Value::List(_) => "List".into(),
            Value::Map(_) => "Map".into(),
            Value::Range { .. } => "Range".into(),
            Value::Enum { ty, .. } => ty.clone(),
            Value::Record(r) => format!("`{}` record", r.schema_name),
            Value::Stage(n) => format!("stage `{n}`"),
            Value::Decl(_) => "declaration".into(),
            Value::Module(_) => "module".into(),
            Value::Builtin(b) => format!("builtin `{}`", b.name()),
        }
    }

    /// Plain JSON for tools (`miles graph --format json`, plans): numbers as numbers, quantities
    /// as `{"value": .., "unit": ..}` in base units, records as objects with a `kind` field.
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::json;
        match self {
            Value::Num { q, .. } => serde_json::to_value(q).unwrap_or(serde_json::Value::Null),
            Value::Quantity { q, dim } => {
                let base = match *dim {
                    d if d == Dim::BYTES => "B",
                    d if d == Dim::TIME => "s",
                    d if d == Dim::STEPS => "steps",
                    d if d == Dim::TOKENS => "tokens",
                    d if d == Dim::BANDWIDTH => "B/s",
                    d if d == Dim::COMPUTE => "FLOP/s",
                    _ => "",
                };
                json!({ "value": serde_json::to_value(q).unwrap_or(serde_json::Value::Null), "unit": base })
            }
            Value::Bool(b) => json!(b),
            Value::Str(s) => json!(s),
            Value::None => serde_json::Value::Null,
            Value::List(l) => serde_json::Value::Array(l.iter().map(Value::to_json).collect()),
            Value::Map(m) => serde_json::Value::Object(m.iter().map(|(k, v)| (k.clone(), v.to_json())).collect()),
            Value::Range { start, end, inclusive } => json!({
                "start": start.as_ref().map(|v| v.to_json()),
                "end": end.as_ref().map(|v| v.to_json()),
                "inclusive": inclusive,
            }),
            Value::Enum { member, .. } => json!(member),
            Value::Record(r) => {
                let mut obj = serde_json::Map::new();
                obj.insert("kind".into(), json!(r.schema_name));
                for (k, f) in &r.fields {
                    obj.insert(k.clone(), f.value.to_json());
                }
                serde_json::Value::Object(obj)
            }
            Value::Stage(n) => json!({ "stage": n }),
            Value::Decl(_) | Value::Module(_) | Value::Builtin(_) => serde_json::Value::Null,
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Num { q, float } => {
                if *float && q.is_integer() {
                    write!(f, "{q}.0")
                } else {
                    write!(f, "{q}")
                }
            }
            Value::Quantity { q, dim } => write!(f, "{}", format_quantity(*q, *dim)),
            Value::Bool(b) => write!(f, "{b}"),
            Value::Str(s) => write!(f, "{s:?}"),
            Value::None => write!(f, "none"),
            Value::List(l) => {
                write!(f, "[")?;
                for (i, v) in l.iter().enumerate() {
                    if i > 0 {
                        write!(f, ", ")?;
                    }
                    write!(f, "{v}")?;
                }
                write!(f, "]")
            }
            Value::Map(m) => {
                write!(f, "{{")?;
                for (i, (k, v)) in m.iter().enumerate() {
                    if i > 0 {
                        write!(f, ", ")?;
                    }
                    write!(f, "{k:?}: {v}")?;
                }
                write!(f, "}}")
            }
            Value::Range { start, end, inclusive } => {
                if let Some(s) = start {
                    write!(f, "{s}")?;
                }
                write!(f, "{}", if *inclusive { "..=" } else { ".." })?;
                if let Some(e) = end {
                    write!(f, "{e}")?;
                }
                Ok(())
            }
            Value::Enum { member, .. } => write!(f, "{member}"),
            Value::Record(r) => {
                write!(f, "{} {{ ", r.schema_name)?;
                for (i, (k, v)) in r.fields.iter().filter(|(_, v)| !v.defaulted).enumerate() {
                    if i > 0 {
                        write!(f, ", ")?;
                    }
                    write!(f, "{k} = {}", v.value)?;
                }
                write!(f, " }}")
            }
            Value::Stage(n) => write!(f, "{n}"),
            Value::Decl(_) => write!(f, "<declaration>"),
            Value::Module(_) => write!(f, "<module>"),
            Value::Builtin(b) => write!(f, "{}", b.name()),
        }
    }
}
