//! How deep a file may nest, and dropping and copying a deep tree without recursion.
//!
//! Two bounds, both E0003. Brackets (`(`, `[`, `{`) nest at most [`MAX_DEPTH`] levels: pest
//! recurses once per level, so they are counted on the raw text before parsing. Expressions
//! nest at most [`MAX_EXPR_DEPTH`] levels, counted on the tree: parentheses, lists, maps, records,
//! calls, `if`, prefix operators and `.field` each add a level; a chain of binary operators
//! (`1 + 1 + ... + 1`) does not, however long, because every pass takes such a chain without
//! recursing once per operator (the tree builder and the formatter walk it in a loop, the
//! compiler's evaluator grows its stack on the heap, and [`Drop`] below takes it apart in a loop).

use crate::ast::{Arg, Binding, Expr, ExprKind};
use crate::diag::Span;
use crate::lex::{line_end, string_end};

/// Bracket nesting above this depth is refused (E0003): the PEG parser recurses per level.
pub const MAX_DEPTH: usize = 256;
/// Expressions nesting deeper than this (thousands of `-` or `.x` in a row, `if` inside `if`)
/// are refused (E0003): every later stage walks nested expressions recursively. Binary operator
/// chains do not count (see the module comment).
pub const MAX_EXPR_DEPTH: usize = 1000;

/// The offset of the first bracket nested deeper than `MAX_DEPTH`, skipping strings and comments.
pub(crate) fn too_deep_brackets(src: &str) -> Option<usize> {
    let bytes = src.as_bytes();
    let (mut depth, mut i) = (0usize, 0usize);
    while i < bytes.len() {
        match bytes[i] {
            b'"' => i = string_end(bytes, i),
            b'/' if bytes.get(i + 1) == Some(&b'/') => i = line_end(bytes, i),
            b'(' | b'[' | b'{' => {
                depth += 1;
                if depth > MAX_DEPTH {
                    return Some(i);
                }
            }
            b')' | b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
        i += 1;
    }
    None
}

/// Whether `e` nests deeper than `MAX_EXPR_DEPTH`, found without recursion. The operands of a
/// binary operator sit at the operator's own level, so an operator chain is flat.
pub(crate) fn too_deep_expr(e: &Expr) -> bool {
    let mut stack = vec![(e, 1usize)];
    while let Some((e, depth)) = stack.pop() {
        if depth > MAX_EXPR_DEPTH {
            return true;
        }
        let below = if matches!(e.kind, ExprKind::Binary { .. }) { depth } else { depth + 1 };
        stack.extend(e.children().into_iter().map(|c| (c, below)));
    }
    false
}

/// Moves the sub-expressions of `kind` into `out`, leaving `Error` leaves in their place.
fn take_children(kind: &mut ExprKind, out: &mut Vec<Expr>) {
    kind.for_each_child_mut(|c| out.push(std::mem::replace(c, Expr { kind: ExprKind::Error, span: Span::default() })));
}

/// A tree of any depth drops in a loop: the derived drop recursed once per level, and a
/// 200,000-term sum is a left spine 200,000 levels deep. (On `ExprKind`, not `Expr`, so code
/// may still move `kind` out of an `Expr`.)
impl Drop for ExprKind {
    fn drop(&mut self) {
        let mut stack = Vec::new();
        take_children(self, &mut stack);
        while let Some(mut e) = stack.pop() {
            take_children(&mut e.kind, &mut stack);
        }
    }
}

/// A tree of any depth copies without overflowing, as it drops: the derived clone recursed once
/// per level (the parse cache copies the trees of unchanged chunks). Recursion is fastest, so
/// the top `CLONE_RECURSION` levels recurse and deeper subtrees are copied in a loop.
impl Clone for Expr {
    fn clone(&self) -> Expr {
        clone_at(self, 0)
    }
}

const CLONE_RECURSION: u32 = 64;

fn clone_at(e: &Expr, depth: u32) -> Expr {
    if depth < CLONE_RECURSION {
        e.with_children(|c| clone_at(c, depth + 1))
    } else {
        clone_in_a_loop(e)
    }
}

fn clone_in_a_loop(e: &Expr) -> Expr {
    let hole = |_: &Expr| Expr { kind: ExprKind::Error, span: Span::default() };
    let mut root = e.with_children(hole);
    let mut todo: Vec<(&Expr, &mut Expr)> = Vec::new();
    let (mut sources, mut slots) = (Vec::new(), Vec::new());
    let mut next = Some((e, &mut root));
    while let Some((from, to)) = next.take().or_else(|| todo.pop()) {
        if !std::ptr::eq(from, e) {
            *to = from.with_children(hole);
        }
        // Pair each child of `from` with its placeholder in `to`.
        from.for_each_child(|c| sources.push(c));
        to.kind.for_each_child_mut(|c| slots.push(c));
        todo.extend(sources.drain(..).zip(slots.drain(..)));
    }
    root
}

impl Expr {
    /// A copy of this node whose sub-expressions are `child` of the originals, called in the
    /// order `for_each_child` lists them.
    fn with_children(&self, mut child: impl FnMut(&Expr) -> Expr) -> Expr {
        let mut boxed = |e: &Expr| Box::new(child(e));
        let kind = match &self.kind {
            ExprKind::Number(n) => ExprKind::Number(n.clone()),
            ExprKind::Quantity { number, unit, unit_span } => {
                ExprKind::Quantity { number: number.clone(), unit: unit.clone(), unit_span: *unit_span }
            }
            ExprKind::Str(s) => ExprKind::Str(s.clone()),
            ExprKind::Bool(b) => ExprKind::Bool(*b),
            ExprKind::None => ExprKind::None,
            ExprKind::List(items) => ExprKind::List(items.iter().map(|e| *boxed(e)).collect()),
            ExprKind::Map(entries) => ExprKind::Map(entries.iter().map(|(k, v)| (k.clone(), *boxed(v))).collect()),
            ExprKind::Name(id) => ExprKind::Name(id.clone()),
            ExprKind::Field(base, id) => ExprKind::Field(boxed(base), id.clone()),
            ExprKind::Call { callee, args, args_span } => ExprKind::Call {
                callee: boxed(callee),
                args: args
                    .iter()
                    .map(|a| Arg {
                        value: *boxed(&a.value),
                        arrow_to: a.arrow_to.as_ref().map(|t| *boxed(t)),
                        span: a.span,
                    })
                    .collect(),
                args_span: *args_span,
            },
            ExprKind::Record { base, fields, body_span } => ExprKind::Record {
                base: boxed(base),
                fields: fields
                    .iter()
                    .map(|b| Binding {
                        doc: b.doc.clone(),
                        path: b.path.clone(),
                        value: *boxed(&b.value),
                        span: b.span,
                    })
                    .collect(),
                body_span: *body_span,
            },
            ExprKind::Binary { op, op_span, lhs, rhs } => {
                let lhs = boxed(lhs);
                ExprKind::Binary { op: *op, op_span: *op_span, lhs, rhs: boxed(rhs) }
            }
            ExprKind::Unary { op, expr } => ExprKind::Unary { op: *op, expr: boxed(expr) },
            ExprKind::If { cond, then, otherwise } => {
                let cond = boxed(cond);
                let then = boxed(then);
                ExprKind::If { cond, then, otherwise: boxed(otherwise) }
            }
            ExprKind::Range { start, end, inclusive } => {
                let start = start.as_deref().map(&mut boxed);
                ExprKind::Range { start, end: end.as_deref().map(&mut boxed), inclusive: *inclusive }
            }
            ExprKind::Paren(inner) => ExprKind::Paren(boxed(inner)),
            ExprKind::Error => ExprKind::Error,
        };
        Expr { kind, span: self.span }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ast::ItemKind;
    use crate::diag::FileId;

    fn codes(src: &str) -> Vec<&'static str> {
        crate::parse(FileId(0), src).1.iter().map(|d| d.code.as_str()).collect()
    }

    // 20 times MAX_EXPR_DEPTH; tests/language/cli.rs checks and formats a 200,000-term sum end to end.
    #[test]
    fn a_long_operator_chain_is_not_deep() {
        let sum = format!("const x = 1{}\n", " + 1".repeat(20_000));
        assert_eq!(codes(&sum), Vec::<&str>::new());
        let mixed = format!("const x = 1{}\n", " - 2 * 3 == 4 or 5 < 6".repeat(4_000));
        assert_eq!(codes(&mixed), Vec::<&str>::new());
    }

    /// Every node of `e`, each without its children, in `walk` order: a comparison of two
    /// trees that does not recurse (the derived `==` does).
    fn nodes(e: &Expr) -> Vec<Expr> {
        let mut out = Vec::new();
        e.walk(&mut |x| out.push(x.with_children(|_| Expr { kind: ExprKind::Error, span: Span::default() })));
        out
    }

    #[test]
    fn a_deep_tree_copies_whole() {
        let term = " + -(1..=2) * {\"k\": 3}";
        let src = format!("const x = f(a.b {{ y = [1, 2.MB] }}, c -> d){}\n", term.repeat(20_000));
        let (file, diags) = crate::parse(FileId(0), &src);
        assert!(diags.is_empty(), "{diags:?}");
        let Some(ItemKind::Const(c)) = file.items.first().map(|i| &i.kind) else { panic!("no const") };
        let copy = c.value.clone();
        let (copied, original) = (nodes(&copy), nodes(&c.value));
        assert!(copied.len() > 20_000 * 9 && copied == original);
    }

    #[test]
    fn real_nesting_is_still_bounded() {
        let parens = format!("const x = {}1{}\n", "(".repeat(10_000), ")".repeat(10_000));
        assert_eq!(codes(&parens), ["E0003"]);
        let negs = format!("const x = {}1\n", "-".repeat(10_000));
        assert_eq!(codes(&negs), ["E0003"]);
        let fields = format!("const x = a{}\n", ".b".repeat(10_000));
        assert_eq!(codes(&fields), ["E0003"]);
        // Brackets inside a chain still count.
        let at_limit = format!("const x = 1 + {}1\n", "-".repeat(999));
        assert_eq!(codes(&at_limit), Vec::<&str>::new());
        let over = format!("const x = 1 + {}1\n", "-".repeat(1000));
        assert_eq!(codes(&over), ["E0003"]);
    }
}
