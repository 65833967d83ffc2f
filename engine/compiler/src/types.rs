//! Declared types and whether a value fits one (with the few coercions the language makes).

use crate::num::{Dim, QUANTITY_TYPES};
use crate::value::{ItemRef, PortKind};
use std::fmt;

#[derive(Clone, Debug, PartialEq)]
pub enum Type {
    Any,
    Int,
    Float,
    Bool,
    Str,
    Quantity(Dim),
    Optional(Box<Type>),
    List(Box<Type>),
    Map(Box<Type>),
    Enum(ItemRef, String),
    Schema(ItemRef, String),
    Interface(Iface),
    Port(PortKind),
    Range,
}

/// An interface: declared in a module, or one of the builtin port kinds (`schema x is Prompts`).
#[derive(Clone, Debug, PartialEq)]
pub enum Iface {
    Decl(ItemRef, String),
    Port(PortKind),
}

impl Type {
    pub fn builtin(name: &str) -> Option<Type> {
        Some(match name {
            "Any" => Type::Any,
            "Int" => Type::Int,
            "Float" => Type::Float,
            "Bool" => Type::Bool,
            "String" => Type::Str,
            "Range" => Type::Range,
            n => {
                if let Some((_, d)) = QUANTITY_TYPES.iter().find(|(q, _)| *q == n) {
                    Type::Quantity(*d)
                } else if let Some(p) = PortKind::from_name(n) {
                    Type::Port(p)
                } else {
                    return None;
                }
            }
        })
    }
    pub fn strip_optional(&self) -> &Type {
        match self {
            Type::Optional(t) => t.strip_optional(),
            t => t,
        }
    }
    pub fn is_optional(&self) -> bool {
        matches!(self, Type::Optional(_))
    }
}

impl fmt::Display for Type {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Type::Any => write!(f, "Any"),
            Type::Int => write!(f, "Int"),
            Type::Float => write!(f, "Float"),
            Type::Bool => write!(f, "Bool"),
            Type::Str => write!(f, "String"),
            Type::Range => write!(f, "Range"),
            Type::Quantity(d) => write!(f, "{}", d.name()),
            Type::Optional(t) => write!(f, "{t}?"),
            Type::List(t) => write!(f, "List[{t}]"),
            Type::Map(t) => write!(f, "Map[String, {t}]"),
            Type::Enum(_, n) | Type::Schema(_, n) => write!(f, "{n}"),
            Type::Interface(Iface::Decl(_, n)) => write!(f, "{n}"),
            Type::Interface(Iface::Port(p)) | Type::Port(p) => write!(f, "{}", p.name()),
        }
    }
}

/// The unit a user most likely meant for a bare number given where a quantity is expected.
pub fn suggested_unit(d: Dim) -> &'static str {
    match d {
        d if d == Dim::BYTES => "GB",
        d if d == Dim::TIME => "s",
        d if d == Dim::STEPS => "steps",
        d if d == Dim::TOKENS => "tokens",
        d if d == Dim::BANDWIDTH => "GB/s",
        d if d == Dim::COMPUTE => "TFLOP/s",
        _ => "",
    }
}
