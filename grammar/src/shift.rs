//! Moving a parsed chunk to where it now sits: every span of its items and diagnostics gets the
//! chunk's file and start offset. Exhaustive destructuring on purpose: a new span field does not
//! compile until it is moved here too.

use crate::ast::*;
use crate::diag::{Diagnostic, FileId, Fix, Label, Rule, Span};

/// Where a chunk parsed at offset 0 of file 0 now is.
#[derive(Clone, Copy)]
pub(crate) struct Shift {
    pub(crate) file: FileId,
    pub(crate) by: u32,
}

impl Shift {
    fn span(self, s: &mut Span) {
        // The tree's placeholder span (`Span::default()`, on nodes that could not be read)
        // stays a placeholder, as a whole-file parse leaves it.
        if *s != Span::default() {
            *s = Span { file: self.file, start: s.start + self.by, end: s.end + self.by };
        }
    }

    fn ident(self, i: &mut Ident) {
        self.span(&mut i.span);
    }

    fn doc(self, d: &mut Option<Doc>) {
        if let Some(Doc { text: _, span }) = d {
            self.span(span);
        }
    }

    fn str_lit(self, s: &mut StrLit) {
        self.span(&mut s.span);
    }

    fn text(self, t: &mut Text) {
        let Text { parts, span } = t;
        for p in parts {
            match p {
                TextPart::Lit(_) => {}
                TextPart::Expr { expr, src: _ } => self.expr(expr),
            }
        }
        self.span(span);
    }

    fn path(self, p: &mut Path) {
        let Path { segments, span } = p;
        segments.iter_mut().for_each(|s| self.ident(s));
        self.span(span);
    }

    fn ty(self, t: &mut TypeExpr) {
        let TypeExpr { kind, span } = t;
        self.span(span);
        match kind {
            TypeExprKind::Named(p) => self.path(p),
            TypeExprKind::Generic(name, args) => {
                self.ident(name);
                args.iter_mut().for_each(|a| self.ty(a));
            }
            TypeExprKind::Optional(inner) => self.ty(inner),
        }
    }

    fn binding(self, b: &mut Binding) {
        let Binding { doc, path, value, span } = b;
        self.doc(doc);
        self.path(path);
        self.expr(value);
        self.span(span);
    }

    fn check(self, c: &mut Check) {
        let Check { doc, warn: _, expr, at, message, help, span } = c;
        self.doc(doc);
        self.expr(expr);
        at.iter_mut().for_each(|e| self.expr(e));
        message.iter_mut().chain(help.iter_mut()).for_each(|t| self.text(t));
        self.span(span);
    }

    fn field(self, f: &mut FieldDecl) {
        let FieldDecl { doc, name, ty, constraint, default, span } = f;
        self.doc(doc);
        self.ident(name);
        self.ty(ty);
        constraint.iter_mut().chain(default.iter_mut()).for_each(|e| self.expr(e));
        self.span(span);
    }

    /// The spans an expression holds itself, not those of its sub-expressions.
    fn own_spans(self, e: &mut Expr) {
        self.span(&mut e.span);
        match &mut e.kind {
            ExprKind::Number(_)
            | ExprKind::Str(_)
            | ExprKind::Bool(_)
            | ExprKind::None
            | ExprKind::List(_)
            | ExprKind::Unary { .. }
            | ExprKind::If { .. }
            | ExprKind::Range { .. }
            | ExprKind::Paren(_)
            | ExprKind::Error => {}
            ExprKind::Quantity { number: _, unit: _, unit_span } => self.span(unit_span),
            ExprKind::Map(entries) => entries.iter_mut().for_each(|(k, _)| self.str_lit(k)),
            ExprKind::Name(id) | ExprKind::Field(_, id) => self.ident(id),
            ExprKind::Call { callee: _, args, args_span } => {
                self.span(args_span);
                args.iter_mut().for_each(|a| self.span(&mut a.span));
            }
            ExprKind::Record { base: _, fields, body_span } => {
                self.span(body_span);
                for Binding { doc, path, value: _, span } in fields {
                    self.doc(doc);
                    self.path(path);
                    self.span(span);
                }
            }
            ExprKind::Binary { op: _, op_span, lhs: _, rhs: _ } => self.span(op_span),
        }
    }

    /// Iterative: an operator chain is as deep as it is long.
    pub(crate) fn expr(self, e: &mut Expr) {
        let mut stack = vec![e];
        while let Some(e) = stack.pop() {
            self.own_spans(e);
            e.kind.for_each_child_mut(|c| stack.push(c));
        }
    }

    pub(crate) fn item(self, item: &mut Item) {
        let Item { doc, kind, span } = item;
        self.doc(doc);
        self.span(span);
        match kind {
            ItemKind::Import(Import { path: _, path_span, alias, names }) => {
                self.span(path_span);
                alias.iter_mut().for_each(|a| self.ident(a));
                names.iter_mut().flatten().for_each(|n| self.ident(n));
            }
            ItemKind::Const(Const { name, ty, value }) => {
                self.ident(name);
                ty.iter_mut().for_each(|t| self.ty(t));
                self.expr(value);
            }
            ItemKind::Enum(Enum { name, members }) => {
                self.ident(name);
                for EnumMember { doc, name } in members {
                    self.doc(doc);
                    self.ident(name);
                }
            }
            ItemKind::Interface(name) => self.ident(name),
            ItemKind::Schema(Schema { name, interface, fields, checks, body_span }) => {
                self.ident(name);
                interface.iter_mut().for_each(|i| self.ident(i));
                fields.iter_mut().for_each(|f| self.field(f));
                checks.iter_mut().for_each(|c| self.check(c));
                self.span(body_span);
            }
            ItemKind::Stage(StageDecl { name, ports, output, fields, checks, body_span }) => {
                self.ident(name);
                for Port { name, ty } in ports {
                    self.ident(name);
                    self.ty(ty);
                }
                output.iter_mut().for_each(|t| self.ty(t));
                fields.iter_mut().for_each(|f| self.field(f));
                checks.iter_mut().for_each(|c| self.check(c));
                self.span(body_span);
            }
            ItemKind::Model(NamedValue { name, value }) | ItemKind::Cluster(NamedValue { name, value }) => {
                self.ident(name);
                self.expr(value);
            }
            ItemKind::Recipe(Recipe { name, extends, on, bindings, checks, body_span }) => {
                self.ident(name);
                extends.iter_mut().chain(on.iter_mut()).for_each(|p| self.path(p));
                bindings.iter_mut().for_each(|b| self.binding(b));
                checks.iter_mut().for_each(|c| self.check(c));
                self.span(body_span);
            }
        }
    }

    pub(crate) fn diagnostic(self, d: &mut Diagnostic) {
        let Diagnostic { code: _, severity: _, message: _, primary, secondary, help: _, rule, fixes } = d;
        for Label { span, message: _ } in primary.iter_mut().chain(secondary.iter_mut()) {
            self.span(span);
        }
        for Fix { message: _, span, replacement: _ } in fixes {
            self.span(span);
        }
        if let Some(Rule { name: _, span }) = rule {
            self.span(span);
        }
    }
}
