//! The syntax tree: plain data with a span on every node. Broken input still gives a tree:
//! what could not be read is left out (and reported), and expressions that could not be read
//! become `ExprKind::Error`.

use crate::diag::Span;
use serde::Serialize;

#[derive(Clone, Debug, PartialEq, Serialize, Default)]
pub struct SourceFile {
    pub items: Vec<Item>,
    /// Every `//` and `///` comment, in order, for the formatter and the language server.
    pub comments: Vec<Comment>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Comment {
    pub span: Span,
    /// The text after `//` (or `///`).
    pub text: String,
    pub doc: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Ident {
    pub name: String,
    pub span: Span,
}

/// A doc comment: consecutive `///` lines joined with newlines.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Doc {
    pub text: String,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Item {
    pub doc: Option<Doc>,
    pub kind: ItemKind,
    pub span: Span,
}

impl Item {
    /// The name the item declares (imports declare none of their own).
    pub fn name(&self) -> Option<&Ident> {
        match &self.kind {
            ItemKind::Import(_) => None,
            ItemKind::Const(c) => Some(&c.name),
            ItemKind::Enum(e) => Some(&e.name),
            ItemKind::Interface(i) => Some(i),
            ItemKind::Schema(s) => Some(&s.name),
            ItemKind::Stage(s) => Some(&s.name),
            ItemKind::Model(b) | ItemKind::Cluster(b) => Some(&b.name),
            ItemKind::Recipe(r) => Some(&r.name),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub enum ItemKind {
    Import(Import),
    Const(Const),
    Enum(Enum),
    Interface(Ident),
    Schema(Schema),
    Stage(StageDecl),
    Model(NamedValue),
    Cluster(NamedValue),
    Recipe(Recipe),
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Import {
    /// As written, without quotes: `std/tasks/arith`, `./lib/common`.
    pub path: String,
    pub path_span: Span,
    pub alias: Option<Ident>,
    /// `import m { a, b }` binds `a` and `b` instead of `m`.
    pub names: Option<Vec<Ident>>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Const {
    pub name: Ident,
    pub ty: Option<TypeExpr>,
    pub value: Expr,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct NamedValue {
    pub name: Ident,
    pub value: Expr,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Enum {
    pub name: Ident,
    pub members: Vec<EnumMember>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EnumMember {
    pub doc: Option<Doc>,
    pub name: Ident,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Schema {
    pub name: Ident,
    /// `schema gpu is Hardware`: the interface the schema belongs to.
    pub interface: Option<Ident>,
    pub fields: Vec<FieldDecl>,
    pub checks: Vec<Check>,
    pub body_span: Span,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StageDecl {
    pub name: Ident,
    pub ports: Vec<Port>,
    pub output: Option<TypeExpr>,
    pub fields: Vec<FieldDecl>,
    pub checks: Vec<Check>,
    pub body_span: Span,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Port {
    pub name: Ident,
    pub ty: TypeExpr,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FieldDecl {
    pub doc: Option<Doc>,
    pub name: Ident,
    pub ty: TypeExpr,
    /// `in 0..=2`: a range (or list) the value must lie in.
    pub constraint: Option<Expr>,
    pub default: Option<Expr>,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Check {
    pub doc: Option<Doc>,
    /// `warn` instead of `check`: a failure is a warning, not an error.
    pub warn: bool,
    pub expr: Expr,
    /// `at FIELD`: the field the rule blames when it fails (a name or a dotted path, read where
    /// the rule is); the diagnostic points where the recipe set it.
    pub at: Option<Expr>,
    pub message: Option<Text>,
    pub help: Option<Text>,
    pub span: Span,
}

impl Check {
    /// The rule's expression, its `at` field and the expressions its texts interpolate.
    pub fn exprs(&self) -> impl Iterator<Item = &Expr> {
        let texts = self.message.iter().chain(self.help.iter()).flat_map(Text::exprs);
        std::iter::once(&self.expr).chain(self.at.iter()).chain(texts)
    }
}

/// A check's `else` or `help` text: a string literal whose `\(expr)` parts are replaced by the
/// expressions' values when the rule fails.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Text {
    pub parts: Vec<TextPart>,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub enum TextPart {
    Lit(String),
    /// `\(expr)`, with the expression's source text as written.
    Expr {
        expr: Expr,
        src: String,
    },
}

impl Text {
    /// A text with no interpolation.
    pub fn plain(value: String, span: Span) -> Text {
        Text { parts: vec![TextPart::Lit(value)], span }
    }

    /// The text as written, each interpolation as `\(source)`.
    pub fn source(&self) -> String {
        let mut out = String::new();
        for p in &self.parts {
            match p {
                TextPart::Lit(s) => out.push_str(s),
                TextPart::Expr { src, .. } => {
                    out.push_str("\\(");
                    out.push_str(src);
                    out.push(')');
                }
            }
        }
        out
    }

    /// The interpolated expressions, in order.
    pub fn exprs(&self) -> impl Iterator<Item = &Expr> {
        self.parts.iter().filter_map(|p| match p {
            TextPart::Expr { expr, .. } => Some(expr),
            TextPart::Lit(_) => None,
        })
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StrLit {
    pub value: String,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Recipe {
    pub name: Ident,
    pub extends: Option<Path>,
    pub on: Option<Path>,
    pub bindings: Vec<Binding>,
    pub checks: Vec<Check>,
    pub body_span: Span,
}

/// `name = value` in a recipe or record body; the left side may be a path (`train.lr = 1e-4`)
/// to amend one field of an inherited binding.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Binding {
    pub doc: Option<Doc>,
    pub path: Path,
    pub value: Expr,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Path {
    pub segments: Vec<Ident>,
    pub span: Span,
}

impl Path {
    pub fn dotted(&self) -> String {
        self.segments.iter().map(|s| s.name.as_str()).collect::<Vec<_>>().join(".")
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TypeExpr {
    pub kind: TypeExprKind,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub enum TypeExprKind {
    /// `Int`, `Bytes`, `hardware.Arch`.
    Named(Path),
    /// `List[Int]`, `Map[String, Float]`.
    Generic(Ident, Vec<TypeExpr>),
    /// `T?`: the value may be `none`.
    Optional(Box<TypeExpr>),
}

/// `Clone` is written out in `depth.rs`: it copies a tree of any depth in a loop.
#[derive(Debug, PartialEq, Serialize)]
pub struct Expr {
    pub kind: ExprKind,
    pub span: Span,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum BinOp {
    Or,
    And,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    In,
    Is,
    Add,
    Sub,
    Mul,
    Div,
    Rem,
}

impl BinOp {
    pub fn symbol(self) -> &'static str {
        match self {
            BinOp::Or => "or",
            BinOp::And => "and",
            BinOp::Eq => "==",
            BinOp::Ne => "!=",
            BinOp::Lt => "<",
            BinOp::Le => "<=",
            BinOp::Gt => ">",
            BinOp::Ge => ">=",
            BinOp::In => "in",
            BinOp::Is => "is",
            BinOp::Add => "+",
            BinOp::Sub => "-",
            BinOp::Mul => "*",
            BinOp::Div => "/",
            BinOp::Rem => "%",
        }
    }
    /// Binding power: higher binds tighter.
    pub fn precedence(self) -> u8 {
        match self {
            BinOp::Or => 1,
            BinOp::And => 2,
            BinOp::Eq | BinOp::Ne | BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge | BinOp::In | BinOp::Is => 3,
            BinOp::Add | BinOp::Sub => 4,
            BinOp::Mul | BinOp::Div | BinOp::Rem => 5,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum UnOp {
    Neg,
    Not,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub enum ExprKind {
    /// A number as written (`32`, `1_000`, `4.02e9`, `8k`); the compiler reads it exactly.
    Number(String),
    /// `512.MB`: the number as written and the unit.
    Quantity {
        number: String,
        unit: String,
        unit_span: Span,
    },
    Str(String),
    Bool(bool),
    None,
    List(Vec<Expr>),
    Map(Vec<(StrLit, Expr)>),
    Name(Ident),
    Field(Box<Expr>, Ident),
    Call {
        callee: Box<Expr>,
        args: Vec<Arg>,
        args_span: Span,
    },
    /// `callee { field = value, ... }`: a record of a schema, or a stage instance's settings.
    Record {
        base: Box<Expr>,
        fields: Vec<Binding>,
        body_span: Span,
    },
    Binary {
        op: BinOp,
        op_span: Span,
        lhs: Box<Expr>,
        rhs: Box<Expr>,
    },
    Unary {
        op: UnOp,
        expr: Box<Expr>,
    },
    If {
        cond: Box<Expr>,
        then: Box<Expr>,
        otherwise: Box<Expr>,
    },
    Range {
        start: Option<Box<Expr>>,
        end: Option<Box<Expr>>,
        inclusive: bool,
    },
    Paren(Box<Expr>),
    /// Something that could not be read; already reported.
    Error,
}

/// The one exhaustive list of an expression's children, in source order (a call's callee, then
/// each argument and its arrow target; a record's base, then its field values), calling `$f` on
/// each. A macro so that shared and mutable borrows share it: the patterns bind by reference or
/// by mutable reference as `$kind` is borrowed. Exhaustive on purpose: a new `ExprKind` does not
/// compile until it says what its children are, so no walker silently skips it.
macro_rules! each_child {
    ($kind:expr, $f:ident) => {
        match $kind {
            ExprKind::Number(_)
            | ExprKind::Quantity { .. }
            | ExprKind::Str(_)
            | ExprKind::Bool(_)
            | ExprKind::None
            | ExprKind::Name(_)
            | ExprKind::Error => {}
            ExprKind::List(items) => {
                for item in items {
                    $f(item);
                }
            }
            ExprKind::Map(entries) => {
                for (_, v) in entries {
                    $f(v);
                }
            }
            ExprKind::Field(base, _) => $f(base),
            ExprKind::Call { callee, args, .. } => {
                $f(callee);
                for Arg { value, arrow_to, .. } in args {
                    $f(value);
                    if let Some(t) = arrow_to {
                        $f(t);
                    }
                }
            }
            ExprKind::Record { base, fields, .. } => {
                $f(base);
                for Binding { value, .. } in fields {
                    $f(value);
                }
            }
            ExprKind::Binary { lhs, rhs, .. } => {
                $f(lhs);
                $f(rhs);
            }
            ExprKind::Unary { expr, .. } | ExprKind::Paren(expr) => $f(expr),
            ExprKind::If { cond, then, otherwise } => {
                $f(cond);
                $f(then);
                $f(otherwise);
            }
            ExprKind::Range { start, end, .. } => {
                if let Some(start) = start {
                    $f(start);
                }
                if let Some(end) = end {
                    $f(end);
                }
            }
        }
    };
}

impl ExprKind {
    /// `Expr::for_each_child` with mutable borrows: how a deep tree is taken apart (`depth.rs`)
    /// and a parsed chunk moved (`shift.rs`).
    pub(crate) fn for_each_child_mut<'a>(&'a mut self, mut f: impl FnMut(&'a mut Expr)) {
        each_child!(self, f)
    }
}

impl Expr {
    /// Calls `f` on each direct sub-expression, in source order (see `each_child!`).
    pub fn for_each_child<'a>(&'a self, mut f: impl FnMut(&'a Expr)) {
        each_child!(&self.kind, f)
    }

    /// The direct sub-expressions, in source order (see `for_each_child`).
    pub fn children(&self) -> Vec<&Expr> {
        let mut out = Vec::new();
        self.for_each_child(|c| out.push(c));
        out
    }

    /// Calls `f` on this expression and every expression inside it, parents first, in source
    /// order. Iterative: a 200,000-term `a + a + ...` chain is that deep and must not overflow
    /// the stack.
    pub fn walk<'a>(&'a self, f: &mut dyn FnMut(&'a Expr)) {
        let mut stack = vec![self];
        while let Some(e) = stack.pop() {
            f(e);
            let at = stack.len();
            e.for_each_child(|c| stack.push(c));
            stack[at..].reverse();
        }
    }
}

/// A call argument; `train -> rollout` (weight sync) is an argument with an arrow target.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Arg {
    pub value: Expr,
    pub arrow_to: Option<Expr>,
    pub span: Span,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diag::FileId;

    /// Every name in `src`, in the order `walk` visits them.
    fn names(src: &str) -> Vec<String> {
        let (e, diags) = crate::parse_expr(FileId(0), src);
        assert!(diags.is_empty(), "{diags:?}");
        let mut out = Vec::new();
        e.expect("parses").walk(&mut |x| {
            if let ExprKind::Name(id) = &x.kind {
                out.push(id.name.clone());
            }
        });
        out
    }

    #[test]
    fn walk_reaches_every_kind_of_child() {
        assert_eq!(names("if a then f(b -> c, d.e) else -g"), ["a", "f", "b", "c", "d", "g"]);
        assert_eq!(names("k { x = [l, (m)], y = n..o } + 1.GB * p"), ["k", "l", "m", "n", "o", "p"]);
        assert_eq!(names("q in {\"r\": s} or not t"), ["q", "s", "t"]);
    }

    #[test]
    fn leaves_have_no_children() {
        for src in ["1", "2.MB", "\"s\"", "true", "none", "x"] {
            let (e, _) = crate::parse_expr(FileId(0), src);
            assert!(e.expect("parses").children().is_empty(), "{src}");
        }
    }
}
