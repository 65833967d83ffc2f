//! How deep a file may nest, and dropping a deep tree without recursion.
//!
//! Two bounds, both E0003. Brackets (`(`, `[`, `{`) nest at most [`MAX_DEPTH`] levels: pest
//! recurses once per level, so they are counted on the raw text before parsing. Expressions
//! nest at most [`MAX_EXPR_DEPTH`] levels, counted on the tree: parentheses, lists, maps, records,
//! calls, `if`, prefix operators and `.field` each add a level; a chain of binary operators
//! (`1 + 1 + ... + 1`) does not, however long, because every pass takes such a chain without
//! recursing once per operator (the tree builder and the formatter walk it in a loop, the
//! compiler's evaluator grows its stack on the heap, and [`Drop`] below takes it apart in a loop).

use crate::ast::{Expr, ExprKind};
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

#[cfg(test)]
mod tests {
    use crate::diag::FileId;

    fn codes(src: &str) -> Vec<&'static str> {
        crate::parse(FileId(0), src).1.iter().map(|d| d.code).collect()
    }

    // 20 times MAX_EXPR_DEPTH; tests/cli.rs checks and formats a 200,000-term sum end to end.
    #[test]
    fn a_long_operator_chain_is_not_deep() {
        let sum = format!("const x = 1{}\n", " + 1".repeat(20_000));
        assert_eq!(codes(&sum), Vec::<&str>::new());
        let mixed = format!("const x = 1{}\n", " - 2 * 3 == 4 or 5 < 6".repeat(4_000));
        assert_eq!(codes(&mixed), Vec::<&str>::new());
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
