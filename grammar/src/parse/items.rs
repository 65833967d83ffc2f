//! Building items, blocks, declarations, bindings, checks and types from pest pairs.

use super::{Builder, ListKind, Rule};
use crate::ast::*;
use crate::codes::ErrorCode;
use crate::diag::{Diagnostic, Span};
use crate::shift::Shift;
use pest::iterators::Pair;

impl Builder<'_> {
    pub(super) fn file(&mut self, p: Pair<'_, Rule>) -> Vec<Item> {
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

    pub(super) fn binding(&mut self, p: Pair<'_, Rule>) -> Binding {
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
        let mut at = None;
        let mut message = None;
        let mut help = None;
        let mut last = Rule::kw_check;
        let mut warn = false;
        for r in rest {
            match r.as_rule() {
                Rule::kw_warn => warn = true,
                Rule::kw_else | Rule::kw_help => last = r.as_rule(),
                Rule::expr => expr = self.expr(r),
                Rule::path => at = Some(path_as_expr(self.path(r))),
                Rule::string => {
                    let text = self.text(&r);
                    if last == Rule::kw_help {
                        help = Some(text);
                    } else {
                        message = Some(text);
                    }
                }
                _ => {}
            }
        }
        Check { doc, warn, expr, at, message, help, span }
    }

    /// A check's `else` or `help` string: its text with each `\(expr)` parsed as an expression
    /// (one without string literals: the string ends at the first `"`).
    fn text(&mut self, r: &Pair<'_, Rule>) -> Text {
        let span = self.span(r);
        let lit = r.as_str();
        let inner = lit.strip_prefix('"').and_then(|s| s.strip_suffix('"')).unwrap_or(lit);
        let base = r.as_span().start() + 1;
        let mut parts = Vec::new();
        let mut buf = String::new();
        let mut chars = inner.char_indices().peekable();
        while let Some((i, c)) = chars.next() {
            if c != '\\' {
                buf.push(c);
                continue;
            }
            match chars.next() {
                Some((_, '(')) => {
                    let open = i + 2;
                    let Some(close) = closing_paren(inner, open) else {
                        self.diags.push(
                            Diagnostic::error(ErrorCode::E0001, "`\\(` opens an interpolation that is never closed")
                                .with_primary(Span::new(self.file, base + i, base + open), "no `)` closes this")
                                .with_help("close it with `)`, or write `(` without the backslash"),
                        );
                        buf.push('(');
                        continue;
                    };
                    let src = &inner[open..close];
                    let (e, diags) = crate::parse_expr(self.file, src);
                    let shift = Shift { file: self.file, by: (base + open) as u32 };
                    for mut d in diags {
                        shift.diagnostic(&mut d);
                        self.diags.push(d);
                    }
                    if let Some(mut e) = e {
                        shift.expr(&mut e);
                        if !buf.is_empty() {
                            parts.push(TextPart::Lit(std::mem::take(&mut buf)));
                        }
                        parts.push(TextPart::Expr { expr: e, src: src.trim().to_string() });
                    }
                    while chars.peek().is_some_and(|(j, _)| *j <= close) {
                        chars.next();
                    }
                }
                Some((_, 'n')) => buf.push('\n'),
                Some((_, 't')) => buf.push('\t'),
                Some((_, other)) => buf.push(other),
                None => {}
            }
        }
        if !buf.is_empty() || parts.is_empty() {
            parts.push(TextPart::Lit(buf));
        }
        Text { parts, span }
    }

    pub(super) fn path(&self, p: Pair<'_, Rule>) -> Path {
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
}

/// `tp`, `engine.tp`: a path as the expression that reads it.
fn path_as_expr(p: Path) -> Expr {
    let span = p.span;
    let mut segs = p.segments.into_iter();
    let Some(first) = segs.next() else { return Expr { kind: ExprKind::Error, span } };
    let mut e = Expr { span: first.span, kind: ExprKind::Name(first) };
    for s in segs {
        let sp = e.span.to(s.span);
        e = Expr { kind: ExprKind::Field(Box::new(e), s), span: sp };
    }
    e
}

/// The index of the `)` that closes the parenthesis opened just before `from`, if any.
fn closing_paren(s: &str, from: usize) -> Option<usize> {
    let mut depth = 0usize;
    for (i, c) in s[from..].char_indices() {
        match c {
            '(' => depth += 1,
            ')' if depth == 0 => return Some(from + i),
            ')' => depth -= 1,
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use crate::ast::*;
    use crate::diag::FileId;

    fn check_of(src: &str) -> (Check, Vec<String>) {
        let (file, diags) = crate::parse(FileId(0), src);
        let ItemKind::Stage(s) = &file.items[0].kind else { panic!("a stage") };
        (s.checks[0].clone(), diags.iter().map(|d| d.message.clone()).collect())
    }

    #[test]
    fn at_names_a_field_and_texts_interpolate() {
        let src = "stage s(p: Policy) -> Trajectories {\n    tp: Int = 3\n    check 32 % tp == 0\n        at engine.tp\n        else \"tp = \\(tp) does not divide \\(32)\"\n        help \"choose tp among \\(divisors(32, (8)))\\nor \\\"not\\\" \\\\(this)\"\n}\n";
        let (c, diags) = check_of(src);
        assert!(diags.is_empty(), "{diags:?}");
        let Some(Expr { kind: ExprKind::Field(base, field), span }) = &c.at else { panic!("{:?}", c.at) };
        assert!(matches!(&base.kind, ExprKind::Name(n) if n.name == "engine") && field.name == "tp");
        assert_eq!(&src[span.start as usize..span.end as usize], "engine.tp");
        let m = c.message.as_ref().unwrap();
        let exprs: Vec<_> = m.exprs().map(|e| &src[e.span.start as usize..e.span.end as usize]).collect();
        assert_eq!(exprs, ["tp", "32"]);
        assert_eq!(m.source(), "tp = \\(tp) does not divide \\(32)");
        let h = c.help.as_ref().unwrap();
        assert_eq!(
            h.exprs().map(|e| &src[e.span.start as usize..e.span.end as usize]).collect::<Vec<_>>(),
            ["divisors(32, (8))"]
        );
        // `\\(` is an escaped backslash followed by a plain `(`: no interpolation.
        assert!(matches!(h.parts.last(), Some(TextPart::Lit(s)) if s == "\nor \"not\" \\(this)"));
        assert_eq!(c.exprs().count(), 5);
    }

    #[test]
    fn an_unclosed_interpolation_is_an_error() {
        let (c, diags) = check_of("stage s(p: Policy) -> Trajectories {\n    check true else \"a \\(b\"\n}\n");
        assert_eq!(diags, ["`\\(` opens an interpolation that is never closed"]);
        assert!(matches!(&c.message.unwrap().parts[..], [TextPart::Lit(s)] if s == "a (b"));
    }
}
