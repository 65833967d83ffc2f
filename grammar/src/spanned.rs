//! A value and where the recipe set it. The compiler's typed reading of a recipe
//! (`miles_compiler::job`) returns these, and the planner's input carries them, so a plan error
//! or a refusal can point at the line.

use crate::diag::{FileId, Span};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A user-settable figure and where the recipe set it (`None`: a default, or not from a recipe).
///
/// In JSON a value without a span is written bare (`8`), one with a span as
/// `{"value": 8, "span": {"file": 0, "start": 10, "end": 11}}`; both forms are read back.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct Spanned<T> {
    pub value: T,
    pub span: Option<Span>,
}

impl<T> Spanned<T> {
    pub fn new(value: T) -> Spanned<T> {
        Spanned { value, span: None }
    }
    pub fn at(value: T, span: Span) -> Spanned<T> {
        Spanned { value, span: Some(span) }
    }
    /// The same span on another value.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Spanned<U> {
        Spanned { value: f(self.value), span: self.span }
    }
}

impl<T> From<T> for Spanned<T> {
    fn from(value: T) -> Spanned<T> {
        Spanned::new(value)
    }
}

// `Span` only derives `Serialize`; this mirror lets spanned values be read back from JSON (saved
// plans, fixtures) without giving `Span` a `Deserialize` every crate would see.
#[derive(Serialize, Deserialize)]
struct SpanRepr {
    file: u32,
    start: u32,
    end: u32,
}

#[derive(Serialize, Deserialize)]
struct SpannedRepr<T> {
    value: T,
    span: SpanRepr,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum SpannedIn<T> {
    WithSpan(SpannedRepr<T>),
    Bare(T),
}

impl<T: Serialize> Serialize for Spanned<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.span {
            None => self.value.serialize(s),
            Some(sp) => {
                SpannedRepr { value: &self.value, span: SpanRepr { file: sp.file.0, start: sp.start, end: sp.end } }
                    .serialize(s)
            }
        }
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Spanned<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(match SpannedIn::deserialize(d)? {
            SpannedIn::Bare(value) => Spanned::new(value),
            SpannedIn::WithSpan(r) => Spanned {
                value: r.value,
                span: Some(Span { file: FileId(r.span.file), start: r.span.start, end: r.span.end }),
            },
        })
    }
}

/// `#[serde(serialize_with)]` for an `Option<Span>` field, in the same form as a spanned value's.
pub fn serialize_opt_span<S: Serializer>(span: &Option<Span>, s: S) -> Result<S::Ok, S::Error> {
    span.map(|sp| SpanRepr { file: sp.file.0, start: sp.start, end: sp.end }).serialize(s)
}

/// `#[serde(deserialize_with)]` for an `Option<Span>` field written by [`serialize_opt_span`].
pub fn deserialize_opt_span<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Span>, D::Error> {
    Ok(Option::<SpanRepr>::deserialize(d)?.map(|r| Span { file: FileId(r.file), start: r.start, end: r.end }))
}
