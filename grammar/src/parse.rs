//! The parser: `parse(file, text) -> (SourceFile, Vec<Diagnostic>)`. It never fails and never
//! panics; what it cannot read becomes a diagnostic and is left out of the tree.

use crate::ast::*;
use crate::diag::{Diagnostic, FileId, Span};
use pest::iterators::Pair;
use pest::Parser;
use pest_derive::Parser;

#[derive(Parser)]
#[grammar = "miles.pest"]
struct MilesParser;

/// Files above this size are refused (E0006) rather than parsed.
pub const MAX_FILE_BYTES: usize = 8 << 20;
/// Bracket nesting above this depth is refused (E0003): the PEG parser recurses per level.
pub const MAX_DEPTH: usize = 256;
/// Expression trees deeper than this (a chain of thousands of `+`, thousands of `-` or `.x`)
/// are refused (E0003): every later stage walks expressions recursively.
pub const MAX_EXPR_DEPTH: usize = 1000;
/// Stack the parser makes sure it has before parsing (pest recurses per nesting level; in a
/// debug build a level of brackets takes a few kilobytes): callers on small thread stacks (test
/// threads, the language server) get a temporary larger one instead of an overflow.
const PARSE_STACK: usize = 16 << 20;

pub fn parse(file: FileId, src: &str) -> (SourceFile, Vec<Diagnostic>) {
    let mut b = Builder { file, src, diags: Vec::new() };
    let comments = collect_comments(file, src);
    if src.len() > MAX_FILE_BYTES {
        b.diags.push(
            Diagnostic::error("E0006", format!("file is {} bytes; the limit is {} bytes", src.len(), MAX_FILE_BYTES))
                .with_primary(Span::new(file, 0, 0), "file too large")
                .with_help("split it into modules and `import` them"),
        );
        return (SourceFile { items: Vec::new(), comments }, b.diags);
    }
    if let Some(at) = too_deep(src) {
        b.diags.push(
            Diagnostic::error("E0003", format!("brackets nest more than {MAX_DEPTH} levels deep"))
                .with_primary(Span::new(file, at, at + 1), "this bracket is too deep")
                .with_help("flatten the expression; no recipe needs this much nesting"),
        );
        return (SourceFile { items: Vec::new(), comments }, b.diags);
    }
    let items = stacker::maybe_grow(PARSE_STACK, PARSE_STACK, || parse_items(&mut b));
    (SourceFile { items, comments }, b.diags)
}

/// Parses a whole file with the grammar and builds its items.
fn parse_items(b: &mut Builder<'_>) -> Vec<Item> {
    match MilesParser::parse(Rule::file, b.src) {
        Ok(mut pairs) => match pairs.next() {
            Some(file_pair) => b.file(file_pair),
            None => Vec::new(),
        },
        // The grammar has a catch-all at every level, so this is a bug (or pest's own stack
        // guard); report it, don't panic.
        Err(e) => {
            let at = match e.location {
                pest::error::InputLocation::Pos(p) => p,
                pest::error::InputLocation::Span((s, _)) => s,
            };
            let message = e.variant.message();
            let d = if message.contains("stack limit") {
                // Where the stack ran out depends on frame sizes: point at the line instead.
                let line = b.src[..at.min(b.src.len())].rfind('\n').map(|i| i + 1).unwrap_or(0);
                Diagnostic::error("E0003", "this file nests too deeply to parse")
                    .with_primary(Span::new(b.file, line, line), "the parser ran out of stack on this line")
                    .with_help("flatten the nesting (`if` inside `if`, ...) into named constants")
            } else {
                Diagnostic::error("E0001", format!("could not parse this file: {message}"))
                    .with_primary(Span::new(b.file, at, at), "here")
            };
            b.diags.push(d);
            Vec::new()
        }
    }
}

/// Parses one expression (used for `--set key=value` and by tools).
pub fn parse_expr(file: FileId, src: &str) -> (Option<Expr>, Vec<Diagnostic>) {
    let mut b = Builder { file, src, diags: Vec::new() };
    if too_deep(src).is_some() || src.len() > MAX_FILE_BYTES {
        b.diags.push(
            Diagnostic::error("E0003", "expression too deep or too long").with_primary(Span::new(file, 0, 0), "here"),
        );
        return (None, b.diags);
    }
    match stacker::maybe_grow(PARSE_STACK, PARSE_STACK, || MilesParser::parse(Rule::probe_expr, src)) {
        Ok(mut pairs) => {
            let mut expr =
                pairs.next().and_then(|p| p.into_inner().find(|p| p.as_rule() == Rule::expr)).map(|p| b.expr(p));
            if let Some(e) = &mut expr {
                b.limit_depth(e);
            }
            (expr, b.diags)
        }
        Err(e) => {
            let at = match e.location {
                pest::error::InputLocation::Pos(p) => p,
                pest::error::InputLocation::Span((s, _)) => s,
            };
            let end = next_char_boundary(src, at);
            b.diags.push(
                Diagnostic::error("E0001", "expected an expression").with_primary(Span::new(file, at, end), "here"),
            );
            (None, b.diags)
        }
    }
}

/// The end of `src[start..end]` without the whitespace and `//` comments pest lets a
/// non-atomic rule swallow after its last token (`path` in `extends base {`, a range at the end
/// of a line), so a span underlines only what was written.
fn trim_trivia(src: &str, start: usize, mut end: usize) -> usize {
    loop {
        let Some(text) = src.get(start..end) else { return end };
        let kept = text.trim_end_matches([' ', '\t', '\r', '\n', '\u{FEFF}']).len();
        end = start + kept;
        let line = text[..kept].rfind('\n').map(|i| i + 1).unwrap_or(0);
        if !text[line..kept].contains("//") {
            return end;
        }
        match line_comment(&text[line..kept]) {
            Some(c) if line + c > 0 => end = start + line + c,
            _ => return end,
        }
    }
}

/// Where a `//` comment (not a `///` doc comment) starts in one line, outside strings.
fn line_comment(line: &str) -> Option<usize> {
    let b = line.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'"' => {
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
            }
            b'/' if b.get(i + 1) == Some(&b'/') => {
                let doc = b.get(i + 2) == Some(&b'/') && b.get(i + 3) != Some(&b'/');
                return (!doc).then_some(i);
            }
            _ => {}
        }
        i += 1;
    }
    None
}

fn next_char_boundary(src: &str, at: usize) -> usize {
    src[at.min(src.len())..].chars().next().map(|c| at + c.len_utf8()).unwrap_or(at)
}

/// The offset of the first bracket nested deeper than `MAX_DEPTH`, skipping strings and comments.
fn too_deep(src: &str) -> Option<usize> {
    let bytes = src.as_bytes();
    let (mut depth, mut i) = (0usize, 0usize);
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' && bytes[i] != b'\n' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
            }
            b'/' if bytes.get(i + 1) == Some(&b'/') => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
            }
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

/// Every `//` comment outside strings, in order.
pub fn collect_comments(file: FileId, src: &str) -> Vec<Comment> {
    let bytes = src.as_bytes();
    let mut out = Vec::new();
    let mut i = 0usize;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' && bytes[i] != b'\n' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
            }
            b'/' if bytes.get(i + 1) == Some(&b'/') => {
                let start = i;
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
                let raw = &src[start..i];
                let doc = raw.starts_with("///") && !raw.starts_with("////");
                let text = if doc { &raw[3..] } else { &raw[2..] };
                out.push(Comment { span: Span::new(file, start, i), text: text.trim_end().to_string(), doc });
            }
            _ => i += 1,
        }
    }
    out
}

struct Builder<'s> {
    file: FileId,
    src: &'s str,
    diags: Vec<Diagnostic>,
}

/// Which list a junk line sat in: decides what the parser expected there.
#[derive(Clone, Copy)]
enum ListKind {
    Items,
    Decls,
    Bindings,
    EnumMembers,
}

impl<'s> Builder<'s> {
    fn span(&self, p: &Pair<'_, Rule>) -> Span {
        let s = p.as_span();
        Span::new(self.file, s.start(), trim_trivia(self.src, s.start(), s.end()))
    }

    fn ident(&self, p: Pair<'_, Rule>) -> Ident {
        Ident { name: p.as_str().to_string(), span: self.span(&p) }
    }

    fn file(&mut self, p: Pair<'_, Rule>) -> Vec<Item> {
        let mut items = Vec::new();
        for child in p.into_inner() {
            match child.as_rule() {
                Rule::item => {
                    if let Some(mut item) = self.item(child) {
                        self.limit_item_depth(&mut item);
                        items.push(item);
                    }
                }
                Rule::junk_item => self.junk(&child, ListKind::Items),
                _ => {}
            }
        }
        items
    }

    fn docs(&self, docs: &[Pair<'_, Rule>]) -> Option<Doc> {
        let first = docs.first()?;
        let last = docs.last()?;
        let text = docs
            .iter()
            .map(|d| {
                let t = d.as_str().trim_start_matches("///");
                t.strip_prefix(' ').unwrap_or(t).trim_end().to_string()
            })
            .collect::<Vec<_>>()
            .join("\n");
        Some(Doc { text, span: self.span(first).to(self.span(last)) })
    }

    /// Splits leading `doc` pairs from the rest.
    fn split_docs<'p>(&self, p: Pair<'p, Rule>) -> (Option<Doc>, Vec<Pair<'p, Rule>>) {
        let mut docs = Vec::new();
        let mut rest = Vec::new();
        for c in p.into_inner() {
            if c.as_rule() == Rule::doc && rest.is_empty() {
                docs.push(c);
            } else {
                rest.push(c);
            }
        }
        (self.docs(&docs), rest)
    }

    fn item(&mut self, p: Pair<'_, Rule>) -> Option<Item> {
        let span = self.span(&p);
        let (doc, rest) = self.split_docs(p);
        let body = rest.into_iter().next()?;
        let kind = match body.as_rule() {
            Rule::import_item => ItemKind::Import(self.import(body)),
            Rule::const_item => {
                let mut name = None;
                let mut ty = None;
                let mut value = None;
                for c in body.into_inner() {
                    match c.as_rule() {
                        Rule::ident => name = Some(self.ident(c)),
                        Rule::type_expr => ty = Some(self.type_expr(c)),
                        Rule::expr => value = Some(self.expr(c)),
                        _ => {}
                    }
                }
                ItemKind::Const(Const { name: name?, ty, value: value? })
            }
            Rule::interface_item => {
                ItemKind::Interface(self.ident(body.into_inner().find(|c| c.as_rule() == Rule::ident)?))
            }
            Rule::enum_item => {
                let mut name = None;
                let mut members = Vec::new();
                for c in body.into_inner() {
                    match c.as_rule() {
                        Rule::ident => name = Some(self.ident(c)),
                        Rule::enum_member => {
                            let (doc, rest) = self.split_docs(c);
                            if let Some(id) = rest.into_iter().find(|c| c.as_rule() == Rule::ident) {
                                members.push(EnumMember { doc, name: self.ident(id) });
                            }
                        }
                        Rule::junk_member => self.junk(&c, ListKind::EnumMembers),
                        Rule::close_brace => self.close(&c, span, "{"),
                        _ => {}
                    }
                }
                ItemKind::Enum(Enum { name: name?, members })
            }
            Rule::schema_item => {
                let mut name = None;
                let mut interface = None;
                let mut block = None;
                for c in body.into_inner() {
                    match c.as_rule() {
                        Rule::ident if name.is_none() => name = Some(self.ident(c)),
                        Rule::ident => interface = Some(self.ident(c)),
                        Rule::decl_block => block = Some(self.decl_block(c)),
                        _ => {}
                    }
                }
                let (fields, checks, body_span) = block?;
                ItemKind::Schema(Schema { name: name?, interface, fields, checks, body_span })
            }
            Rule::stage_item => {
                let mut name = None;
                let mut ports = Vec::new();
                let mut output = None;
                let mut block = None;
                for c in body.into_inner() {
                    match c.as_rule() {
                        Rule::ident => name = Some(self.ident(c)),
                        Rule::port => {
                            let mut it = c.into_inner();
                            if let (Some(n), Some(t)) = (it.next(), it.next()) {
                                ports.push(Port { name: self.ident(n), ty: self.type_expr(t) });
                            }
                        }
                        Rule::close_paren => self.close(&c, span, "("),
                        Rule::type_expr => output = Some(self.type_expr(c)),
                        Rule::decl_block => block = Some(self.decl_block(c)),
                        _ => {}
                    }
                }
                let (fields, checks, body_span) = block?;
                ItemKind::Stage(StageDecl { name: name?, ports, output, fields, checks, body_span })
            }
            Rule::model_item | Rule::cluster_item => {
                let is_model = body.as_rule() == Rule::model_item;
                let mut name = None;
                let mut value = None;
                for c in body.into_inner() {
                    match c.as_rule() {
                        Rule::ident => name = Some(self.ident(c)),
                        Rule::expr => value = Some(self.expr(c)),
                        _ => {}
                    }
                }
                let nv = NamedValue { name: name?, value: value? };
                if is_model {
                    ItemKind::Model(nv)
                } else {
                    ItemKind::Cluster(nv)
                }
            }
            Rule::recipe_item => {
                let mut name = None;
                let mut extends = None;
                let mut on = None;
                let mut last_kw = Rule::kw_recipe;
                let mut bindings = Vec::new();
                let mut checks = Vec::new();
                let mut body_span = span;
                for c in body.into_inner() {
                    match c.as_rule() {
                        Rule::ident => name = Some(self.ident(c)),
                        Rule::kw_extends | Rule::kw_on => last_kw = c.as_rule(),
                        Rule::path if last_kw == Rule::kw_extends => extends = Some(self.path(c)),
                        Rule::path => on = Some(self.path(c)),
                        Rule::body_block => {
                            body_span = self.span(&c);
                            (bindings, checks) = self.body_block(c);
                        }
                        _ => {}
                    }
                }
                ItemKind::Recipe(Recipe { name: name?, extends, on, bindings, checks, body_span })
            }
            _ => return None,
        };
        Some(Item { doc, kind, span })
    }

    fn import(&mut self, p: Pair<'_, Rule>) -> Import {
        let mut path = String::new();
        let mut path_span = self.span(&p);
        let mut alias = None;
        let mut names = None;
        for c in p.into_inner() {
            match c.as_rule() {
                Rule::import_path => {
                    path_span = self.span(&c);
                    path = c.as_str().trim_matches('"').to_string();
                }
                Rule::ident => alias = Some(self.ident(c)),
                Rule::import_names => {
                    let mut list = Vec::new();
                    for n in c.into_inner() {
                        match n.as_rule() {
                            Rule::ident => list.push(self.ident(n)),
                            Rule::close_brace => {
                                let sp = self.span(&n);
                                self.close(&n, sp, "{")
                            }
                            _ => {}
                        }
                    }
                    names = Some(list);
                }
                _ => {}
            }
        }
        Import { path, path_span, alias, names }
    }

    fn decl_block(&mut self, p: Pair<'_, Rule>) -> (Vec<FieldDecl>, Vec<Check>, Span) {
        let block_span = self.span(&p);
        let mut fields = Vec::new();
        let mut checks = Vec::new();
        for c in p.into_inner() {
            match c.as_rule() {
                Rule::field_decl => {
                    let span = self.span(&c);
                    let (doc, rest) = self.split_docs(c);
                    let mut name = None;
                    let mut ty = None;
                    let mut constraint = None;
                    let mut default = None;
                    let mut after_in = false;
                    for r in rest {
                        match r.as_rule() {
                            Rule::ident => name = Some(self.ident(r)),
                            Rule::type_expr => ty = Some(self.type_expr(r)),
                            Rule::kw_in => after_in = true,
                            Rule::expr if after_in && constraint.is_none() => constraint = Some(self.expr(r)),
                            Rule::expr => default = Some(self.expr(r)),
                            _ => {}
                        }
                    }
                    if let (Some(name), Some(ty)) = (name, ty) {
                        fields.push(FieldDecl { doc, name, ty, constraint, default, span });
                    }
                }
                Rule::check_member => checks.push(self.check(c)),
                Rule::junk_member => self.junk(&c, ListKind::Decls),
                Rule::close_brace => self.close(&c, block_span, "{"),
                _ => {}
            }
        }
        (fields, checks, block_span)
    }

    fn body_block(&mut self, p: Pair<'_, Rule>) -> (Vec<Binding>, Vec<Check>) {
        let block_span = self.span(&p);
        let mut bindings = Vec::new();
        let mut checks = Vec::new();
        for c in p.into_inner() {
            match c.as_rule() {
                Rule::binding => bindings.push(self.binding(c)),
                Rule::check_member => checks.push(self.check(c)),
                Rule::junk_member => self.junk(&c, ListKind::Bindings),
                Rule::close_brace => self.close(&c, block_span, "{"),
                _ => {}
            }
        }
        (bindings, checks)
    }

    fn binding(&mut self, p: Pair<'_, Rule>) -> Binding {
        let span = self.span(&p);
        let (doc, rest) = self.split_docs(p);
        let mut path = None;
        let mut value = None;
        for r in rest {
            match r.as_rule() {
                Rule::path => path = Some(self.path(r)),
                Rule::expr => value = Some(self.expr(r)),
                _ => {}
            }
        }
        let path = path.unwrap_or(Path { segments: Vec::new(), span });
        let value = value.unwrap_or(Expr { kind: ExprKind::Error, span });
        Binding { doc, path, value, span }
    }

    fn check(&mut self, p: Pair<'_, Rule>) -> Check {
        let span = self.span(&p);
        let (doc, rest) = self.split_docs(p);
        let mut expr = Expr { kind: ExprKind::Error, span };
        let mut message = None;
        let mut help = None;
        let mut last = Rule::kw_check;
        let mut warn = false;
        for r in rest {
            match r.as_rule() {
                Rule::kw_warn => warn = true,
                Rule::kw_else | Rule::kw_help => last = r.as_rule(),
                Rule::expr => expr = self.expr(r),
                Rule::string => {
                    let lit = StrLit { value: unescape(r.as_str()), span: self.span(&r) };
                    if last == Rule::kw_help {
                        help = Some(lit);
                    } else {
                        message = Some(lit);
                    }
                }
                _ => {}
            }
        }
        Check { doc, warn, expr, message, help, span }
    }

    fn path(&self, p: Pair<'_, Rule>) -> Path {
        let span = self.span(&p);
        Path { segments: p.into_inner().filter(|c| c.as_rule() == Rule::ident).map(|c| self.ident(c)).collect(), span }
    }

    fn type_expr(&mut self, p: Pair<'_, Rule>) -> TypeExpr {
        let span = self.span(&p);
        let mut inner = p.into_inner();
        let atom = match inner.next() {
            Some(a) => a,
            None => return TypeExpr { kind: TypeExprKind::Named(Path { segments: Vec::new(), span }), span },
        };
        let atom_span = self.span(&atom);
        let base = match atom.as_rule() {
            Rule::generic_type => {
                let mut it = atom.into_inner();
                let name = it.next().map(|n| self.ident(n));
                let mut args = Vec::new();
                for a in it {
                    match a.as_rule() {
                        Rule::type_expr => args.push(self.type_expr(a)),
                        Rule::close_bracket => self.close(&a, atom_span, "["),
                        _ => {}
                    }
                }
                match name {
                    Some(n) => TypeExprKind::Generic(n, args),
                    None => TypeExprKind::Named(Path { segments: Vec::new(), span }),
                }
            }
            _ => TypeExprKind::Named(self.path(atom)),
        };
        let base = TypeExpr { kind: base, span: atom_span };
        if inner.next().is_some() {
            TypeExpr { kind: TypeExprKind::Optional(Box::new(base)), span }
        } else {
            base
        }
    }

    /// Refuses (E0003) every expression of `item` deeper than `MAX_EXPR_DEPTH`.
    fn limit_item_depth(&mut self, item: &mut Item) {
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

    fn limit_depth(&mut self, e: &mut Expr) {
        if !too_deep_expr(e) {
            return;
        }
        let span = e.span;
        self.diags.push(
            Diagnostic::error("E0003", format!("this expression nests more than {MAX_EXPR_DEPTH} levels deep"))
                .with_primary(Span { end: span.start, ..span }, "this expression is too deep")
                .with_help("split it into named constants; no recipe needs this much nesting"),
        );
        dispose(std::mem::replace(e, Expr { kind: ExprKind::Error, span }));
    }

    fn expr(&mut self, p: Pair<'_, Rule>) -> Expr {
        // Brackets nest at most MAX_DEPTH deep, but a debug build's frames are large: grow the
        // stack rather than overflow it.
        stacker::maybe_grow(64 << 10, 1 << 20, || self.expr_inner(p))
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

    /// Reports a missing closing delimiter (a `close_*` pair that matched `missing_close`).
    fn close(&mut self, p: &Pair<'_, Rule>, opened: Span, delim: &str) {
        let missing = p.clone().into_inner().any(|c| c.as_rule() == Rule::missing_close);
        if !missing {
            return;
        }
        let closer = match delim {
            "(" => ")",
            "[" => "]",
            _ => "}",
        };
        // Point at the opening delimiter: it is the one left unclosed.
        let open_at =
            self.src[opened.range()].find(delim).map(|o| opened.start as usize + o).unwrap_or(opened.start as usize);
        let at = self.span(p);
        self.diags.push(
            Diagnostic::error("E0002", format!("unclosed `{delim}`"))
                .with_primary(Span::new(self.file, open_at, open_at + 1), format!("this `{delim}` is never closed"))
                .with_secondary(at, format!("expected `{closer}` before this point"))
                .with_help(format!("add `{closer}`")),
        );
    }

    /// Reports a line the parser skipped, saying what it expected at the first bad character.
    fn junk(&mut self, p: &Pair<'_, Rule>, kind: ListKind) {
        let span = self.span(p);
        let start = span.start as usize;
        let (probe, what) = match kind {
            ListKind::Items => (
                Rule::probe_item,
                "an item (`import`, `const`, `enum`, `schema`, `stage`, `model`, `cluster`, `recipe`)",
            ),
            ListKind::Decls => (Rule::probe_decl, "a field declaration (`name: Type = default`) or `check`"),
            ListKind::Bindings => (Rule::probe_body, "a field (`name = value`), `check` or `}`"),
            ListKind::EnumMembers => (Rule::probe_enum, "an enum member name"),
        };
        pest::set_error_detail(true);
        let rest = &self.src[start..];
        let (at, expected) = match MilesParser::parse(probe, rest) {
            Ok(_) => (start, Vec::new()),
            Err(e) => {
                let attempts = e.parse_attempts();
                let pos = match (&attempts, e.location) {
                    (Some(a), _) => a.max_position,
                    (None, pest::error::InputLocation::Pos(p)) => p,
                    (None, pest::error::InputLocation::Span((s, _))) => s,
                };
                let mut expected: Vec<String> = attempts
                    .map(|a| {
                        a.expected_tokens()
                            .into_iter()
                            .map(|t| t.to_string())
                            // Whitespace and comments may come anywhere: naming them says nothing.
                            .filter(|t| {
                                !(t.trim().is_empty() || t.starts_with("//") || t.starts_with('\t') || t == "\u{FEFF}")
                            })
                            .map(|t| describe_token(&t))
                            .collect()
                    })
                    .unwrap_or_default();
                expected.sort();
                expected.dedup();
                (start + pos.min(rest.len()), expected)
            }
        };
        let at = at.min(span.end as usize);
        let found = describe_found(&self.src[at..span.end as usize]);
        let end = if at < span.end as usize { next_token_end(self.src, at, span.end as usize) } else { at };
        let message = if expected.is_empty() || expected.len() > 6 {
            format!("expected {what}, found {found}")
        } else {
            format!("expected {}, found {found}", join_or(&expected))
        };
        self.diags.push(
            Diagnostic::error("E0001", message)
                .with_primary(Span::new(self.file, at, end), "unexpected here")
                .with_secondary(span, "this line was skipped")
                .with_help(format!("the parser expected {what} here")),
        );
    }
}

/// The direct sub-expressions of `e`.
fn children(e: &Expr) -> Vec<&Expr> {
    match &e.kind {
        ExprKind::List(items) => items.iter().collect(),
        ExprKind::Map(entries) => entries.iter().map(|(_, v)| v).collect(),
        ExprKind::Field(b, _) | ExprKind::Paren(b) | ExprKind::Unary { expr: b, .. } => vec![b],
        ExprKind::Call { callee, args, .. } => std::iter::once(&**callee)
            .chain(args.iter().flat_map(|a| std::iter::once(&a.value).chain(&a.arrow_to)))
            .collect(),
        ExprKind::Record { base, fields, .. } => {
            std::iter::once(&**base).chain(fields.iter().map(|b| &b.value)).collect()
        }
        ExprKind::Binary { lhs, rhs, .. } => vec![lhs, rhs],
        ExprKind::If { cond, then, otherwise } => vec![cond, then, otherwise],
        ExprKind::Range { start, end, .. } => start.iter().chain(end.iter()).map(|b| &**b).collect(),
        ExprKind::Number(_)
        | ExprKind::Quantity { .. }
        | ExprKind::Str(_)
        | ExprKind::Bool(_)
        | ExprKind::None
        | ExprKind::Name(_)
        | ExprKind::Error => Vec::new(),
    }
}

/// Whether the tree is deeper than `MAX_EXPR_DEPTH`, found without recursion.
fn too_deep_expr(e: &Expr) -> bool {
    let mut stack = vec![(e, 1usize)];
    while let Some((e, depth)) = stack.pop() {
        if depth > MAX_EXPR_DEPTH {
            return true;
        }
        stack.extend(children(e).into_iter().map(|c| (c, depth + 1)));
    }
    false
}

/// Drops a tree of any depth without recursion.
fn dispose(e: Expr) {
    let mut stack = vec![e];
    while let Some(mut e) = stack.pop() {
        let take =
            |b: &mut Box<Expr>| std::mem::replace(&mut **b, Expr { kind: ExprKind::Error, span: Span::default() });
        match &mut e.kind {
            ExprKind::List(items) => stack.append(items),
            ExprKind::Map(entries) => stack.extend(entries.drain(..).map(|(_, v)| v)),
            ExprKind::Field(b, _) | ExprKind::Paren(b) | ExprKind::Unary { expr: b, .. } => stack.push(take(b)),
            ExprKind::Call { callee, args, .. } => {
                stack.push(take(callee));
                for a in args.drain(..) {
                    stack.push(a.value);
                    stack.extend(a.arrow_to);
                }
            }
            ExprKind::Record { base, fields, .. } => {
                stack.push(take(base));
                stack.extend(fields.drain(..).map(|b| b.value));
            }
            ExprKind::Binary { lhs, rhs, .. } => stack.extend([take(lhs), take(rhs)]),
            ExprKind::If { cond, then, otherwise } => stack.extend([take(cond), take(then), take(otherwise)]),
            ExprKind::Range { start, end, .. } => stack.extend(start.take().into_iter().chain(end.take()).map(|b| *b)),
            _ => {}
        }
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

fn describe_token(t: &str) -> String {
    match t {
        "BUILTIN_RULE" => "a value".to_string(),
        "a..z" | "A..Z" | "_" => "a name".to_string(),
        "0..9" => "a number".to_string(),
        "\"" => "a string".to_string(),
        _ => format!("`{t}`"),
    }
}

fn describe_found(rest: &str) -> String {
    match rest.chars().next() {
        None => "the end of the line".to_string(),
        Some(c) if c.is_alphanumeric() || c == '_' => {
            let word: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').take(40).collect();
            format!("`{word}`")
        }
        Some(c) => format!("`{c}`"),
    }
}

fn next_token_end(src: &str, at: usize, limit: usize) -> usize {
    let rest = &src[at..limit];
    let mut chars = rest.char_indices();
    match chars.next() {
        None => at,
        Some((_, c)) if c.is_alphanumeric() || c == '_' => {
            at + rest
                .char_indices()
                .find(|(_, c)| !(c.is_alphanumeric() || *c == '_'))
                .map(|(i, _)| i)
                .unwrap_or(rest.len())
        }
        Some((_, c)) => at + c.len_utf8(),
    }
}

fn join_or(items: &[String]) -> String {
    match items.len() {
        0 => String::new(),
        1 => items[0].clone(),
        n => format!("{} or {}", items[..n - 1].join(", "), items[n - 1]),
    }
}

/// The value of a string literal (with its quotes).
pub fn unescape(lit: &str) -> String {
    let inner = lit.strip_prefix('"').and_then(|s| s.strip_suffix('"')).unwrap_or(lit);
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some('n') => out.push('\n'),
                Some('t') => out.push('\t'),
                Some(other) => out.push(other),
                None => {}
            }
        } else {
            out.push(c);
        }
    }
    out
}
