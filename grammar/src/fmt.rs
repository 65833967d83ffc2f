//! The `.miles` formatter: one canonical layout, from the syntax tree and the comments alone.
//!
//! The layout:
//! - four spaces of indent; declaration blocks, recipe bodies and multi-line records put one
//!   member per line; at most one blank line is kept where the source had any;
//! - a record, list, map or enum stays on one line when it was written on one line, holds no
//!   comment and fits in `WIDTH` columns; otherwise one element per line (lists and maps with a
//!   trailing comma);
//! - in a run of one-line bindings (no blank line between them) the `=` signs are aligned, and
//!   so are their trailing comments;
//! - a `check` that does not fit puts `else` and `help` on continuation lines;
//! - spacing inside a line is fixed (`a + b`, `f(x, y)`, `x: Int in 1.. = 8`); numbers, units
//!   and parentheses are kept as written, so the tree, and so the meaning, never changes.
//!
//! Every comment is kept. A comment inside an expression that stays on one line moves to the
//! end of that line (nothing in the language is written inside such expressions in practice).
//! A file with syntax errors is not formatted: `format` returns the parser's diagnostics.

use crate::ast::*;
use crate::diag::{Diagnostic, FileId};
use inline::{inline, quote, quote_text};

mod inline;

/// The line width the layout aims for.
pub const WIDTH: usize = 120;
const INDENT: &str = "    ";

/// Formats a whole file, or returns its syntax errors.
pub fn format(src: &str) -> Result<String, Vec<Diagnostic>> {
    let (file, diags) = crate::parse(FileId(0), src);
    let errors: Vec<Diagnostic> = diags.into_iter().filter(|d| d.is_error()).collect();
    if !errors.is_empty() {
        return Err(errors);
    }
    Ok(format_parsed(&file, src))
}

/// `format` of a file already parsed without a syntax error (`miles check` has the tree: a
/// second parse of a large file would double its time).
pub fn format_parsed(file: &SourceFile, src: &str) -> String {
    let mut p = Printer {
        src,
        comments: file.comments.iter().filter(|c| !c.doc).collect(),
        next: 0,
        out: String::with_capacity(src.len() + src.len() / 8),
        indent: 0,
        last: 0,
        fresh: true,
    };
    p.items(&file.items);
    p.comments_before(src.len());
    let mut out = p.out;
    while out.ends_with('\n') {
        out.pop();
    }
    if !out.is_empty() {
        out.push('\n');
    }
    out
}

struct Printer<'s> {
    src: &'s str,
    /// Plain comments, in order; doc comments are part of the tree.
    comments: Vec<&'s Comment>,
    /// The next comment not yet printed.
    next: usize,
    out: String,
    indent: usize,
    /// The source offset up to which everything has been printed (for blank lines).
    last: usize,
    /// At the start of a block or of the file: no blank line before the next member.
    fresh: bool,
}

/// One member of a block, for printing in source order.
enum Member<'a> {
    Field(&'a FieldDecl),
    Check(&'a Check),
    Binding(&'a Binding),
}

impl Member<'_> {
    fn start(&self) -> usize {
        match self {
            Member::Field(f) => f.span.start as usize,
            Member::Check(c) => c.span.start as usize,
            Member::Binding(b) => b.span.start as usize,
        }
    }
    fn end(&self) -> usize {
        match self {
            Member::Field(f) => f.span.end as usize,
            Member::Check(c) => c.span.end as usize,
            Member::Binding(b) => b.span.end as usize,
        }
    }
}

impl<'s> Printer<'s> {
    // ---- low level --------------------------------------------------------------------

    fn column(&self) -> usize {
        self.out.len() - self.out.rfind('\n').map(|i| i + 1).unwrap_or(0)
    }

    fn newline(&mut self) {
        while self.out.ends_with(' ') {
            self.out.pop();
        }
        self.out.push('\n');
    }

    fn start_line(&mut self) {
        for _ in 0..self.indent {
            self.out.push_str(INDENT);
        }
    }

    /// Where a node really ends: the parser counts trailing whitespace and comments into some
    /// spans (an optional part that did not match), so they are trimmed off here.
    fn tight_end(&self, start: usize, end: usize) -> usize {
        let bytes = self.src.as_bytes();
        let mut e = end.min(bytes.len());
        loop {
            while e > start && bytes[e - 1].is_ascii_whitespace() {
                e -= 1;
            }
            match self.comments.iter().find(|c| c.span.end as usize == e && c.span.start as usize >= start) {
                Some(c) => e = c.span.start as usize,
                None => break,
            }
            // Doc comments end spans too (never at a node's end, but be safe).
        }
        e
    }

    fn blank_line_between(&self, a: usize, b: usize) -> bool {
        a < b && self.src.get(a..b).is_some_and(|t| t.matches('\n').count() >= 2)
    }

    /// Prints the comments that start before `pos` on lines of their own.
    fn comments_before(&mut self, pos: usize) {
        while let Some(c) = self.comments.get(self.next).copied() {
            if c.span.start as usize >= pos {
                break;
            }
            self.next += 1;
            if !self.fresh && self.blank_line_between(self.last, c.span.start as usize) {
                self.newline();
            }
            self.start_line();
            self.out.push_str("//");
            self.out.push_str(&c.text);
            self.newline();
            self.last = c.span.end as usize;
            self.fresh = false;
        }
    }

    /// Before a member that starts at `pos`: its leading comments and at most one blank line.
    fn before_member(&mut self, pos: usize) {
        self.comments_before(pos);
        if !self.fresh && self.blank_line_between(self.last, pos) {
            self.newline();
        }
        self.fresh = false;
    }

    /// The trailing comment of a member ending at `end` (plus any comment inside it that a
    /// one-line layout could not place), printed after it on its line.
    fn trailing(&mut self, start: usize, end: usize) -> Option<String> {
        let mut parts = Vec::new();
        while let Some(c) = self.comments.get(self.next).copied() {
            let cs = c.span.start as usize;
            let inside = cs >= start && cs < end;
            let same_line = cs >= end && !self.src[end..cs].contains('\n');
            if !(inside || same_line) {
                break;
            }
            self.next += 1;
            self.last = self.last.max(c.span.end as usize);
            parts.push(format!("//{}", c.text));
        }
        self.last = self.last.max(end);
        if parts.is_empty() {
            None
        } else {
            Some(parts.join(" "))
        }
    }

    fn end_line_with(&mut self, comment: Option<String>) {
        if let Some(c) = comment {
            self.out.push_str("  ");
            self.out.push_str(&c);
        }
        self.newline();
    }

    fn has_comment_in(&self, start: usize, end: usize) -> bool {
        self.comments.iter().any(|c| (c.span.start as usize) >= start && (c.span.start as usize) < end)
    }

    /// Whether the text right after the opening delimiter at or after `open` breaks the line.
    fn opened_on_own_line(&self, open: usize, first: usize) -> bool {
        self.src.get(open..first).is_some_and(|t| t.contains('\n'))
    }

    /// Comments between a doc comment and what it documents stay there, on their own lines.
    fn after_doc(&mut self, d: &Option<Doc>, head: usize) {
        if let Some(d) = d {
            self.last = self.last.max(d.span.end as usize);
            self.fresh = true;
            self.comments_before(head);
            self.fresh = false;
        }
    }

    fn doc(&mut self, d: &Option<Doc>) {
        if let Some(d) = d {
            for line in d.text.split('\n') {
                self.start_line();
                self.out.push_str("///");
                if !line.is_empty() {
                    self.out.push(' ');
                    self.out.push_str(line);
                }
                self.newline();
            }
        }
    }

    // ---- items ------------------------------------------------------------------------

    fn items(&mut self, items: &[Item]) {
        for item in items {
            self.before_member(item.span.start as usize);
            self.doc(&item.doc);
            if let Some(at) = item_head(item) {
                self.after_doc(&item.doc, at);
            }
            self.start_line();
            let end = self.tight_end(item.span.start as usize, item.span.end as usize);
            self.item(item);
            let c = self.trailing(item.span.start as usize, end);
            self.end_line_with(c);
        }
    }

    fn item(&mut self, item: &Item) {
        match &item.kind {
            ItemKind::Import(imp) => {
                let written = self.src.get(imp.path_span.range()).unwrap_or("").trim();
                self.out.push_str("import ");
                if written.starts_with('"') {
                    self.out.push_str(&quote(&imp.path));
                } else {
                    self.out.push_str(written);
                }
                if let Some(a) = &imp.alias {
                    self.out.push_str(" as ");
                    self.out.push_str(&a.name);
                }
                if let Some(names) = &imp.names {
                    let list: Vec<&str> = names.iter().map(|n| n.name.as_str()).collect();
                    if list.is_empty() {
                        self.out.push_str(" {}");
                    } else {
                        self.out.push_str(&format!(" {{ {} }}", list.join(", ")));
                    }
                }
            }
            ItemKind::Const(c) => {
                self.out.push_str("const ");
                self.out.push_str(&c.name.name);
                if let Some(t) = &c.ty {
                    self.out.push_str(": ");
                    self.out.push_str(&ty(t));
                }
                self.out.push_str(" = ");
                self.expr(&c.value);
            }
            ItemKind::Model(nv) | ItemKind::Cluster(nv) => {
                self.out.push_str(if matches!(item.kind, ItemKind::Model(_)) { "model " } else { "cluster " });
                self.out.push_str(&nv.name.name);
                self.out.push_str(" = ");
                self.expr(&nv.value);
            }
            ItemKind::Interface(id) => {
                self.out.push_str("interface ");
                self.out.push_str(&id.name);
            }
            ItemKind::Enum(e) => self.enum_item(e, item),
            ItemKind::Schema(s) => {
                self.out.push_str("schema ");
                self.out.push_str(&s.name.name);
                if let Some(i) = &s.interface {
                    self.out.push_str(" is ");
                    self.out.push_str(&i.name);
                }
                self.out.push(' ');
                let members = decl_members(&s.fields, &s.checks);
                self.block(s.body_span.start as usize, s.body_span.end as usize, &members);
            }
            ItemKind::Stage(s) => {
                self.out.push_str("stage ");
                self.out.push_str(&s.name.name);
                let ports: Vec<String> = s.ports.iter().map(|p| format!("{}: {}", p.name.name, ty(&p.ty))).collect();
                self.out.push_str(&format!("({})", ports.join(", ")));
                if let Some(o) = &s.output {
                    self.out.push_str(" -> ");
                    self.out.push_str(&ty(o));
                }
                self.out.push(' ');
                let members = decl_members(&s.fields, &s.checks);
                self.block(s.body_span.start as usize, s.body_span.end as usize, &members);
            }
            ItemKind::Recipe(r) => {
                self.out.push_str("recipe ");
                self.out.push_str(&r.name.name);
                if let Some(e) = &r.extends {
                    self.out.push_str(" extends ");
                    self.out.push_str(&e.dotted());
                }
                if let Some(o) = &r.on {
                    self.out.push_str(" on ");
                    self.out.push_str(&o.dotted());
                }
                self.out.push(' ');
                let mut members: Vec<Member> = r.bindings.iter().map(Member::Binding).collect();
                members.extend(r.checks.iter().map(Member::Check));
                members.sort_by_key(|m| m.start());
                self.block(r.body_span.start as usize, r.body_span.end as usize, &members);
            }
        }
    }

    fn enum_item(&mut self, e: &Enum, item: &Item) {
        self.out.push_str("enum ");
        self.out.push_str(&e.name.name);
        let open = self.src[item.span.range()]
            .find('{')
            .map(|o| item.span.start as usize + o)
            .unwrap_or(item.span.start as usize);
        let end = self.tight_end(item.span.start as usize, item.span.end as usize);
        let names: Vec<&str> = e.members.iter().map(|m| m.name.name.as_str()).collect();
        let one_line = format!(" {{ {} }}", names.join(", "));
        let first = e.members.first().map(|m| m.name.span.start as usize).unwrap_or(end);
        let inline = e.members.iter().all(|m| m.doc.is_none())
            && !self.has_comment_in(open, end)
            && !self.opened_on_own_line(open, first)
            && self.column() + one_line.len() <= WIDTH;
        if e.members.is_empty() {
            self.out.push_str(" {}");
            self.comments_before(end);
            return;
        }
        if inline {
            self.out.push_str(&one_line);
            return;
        }
        self.out.push_str(" {");
        self.newline();
        self.indent += 1;
        self.fresh = true;
        for m in &e.members {
            let start = m.doc.as_ref().map(|d| d.span.start).unwrap_or(m.name.span.start) as usize;
            self.before_member(start);
            self.doc(&m.doc);
            self.start_line();
            self.out.push_str(&m.name.name);
            let c = self.trailing(start, m.name.span.end as usize);
            self.end_line_with(c);
        }
        self.comments_before(end.saturating_sub(1));
        self.indent -= 1;
        self.start_line();
        self.out.push('}');
    }

    /// `{ members }` of a schema, stage kind or recipe: always one member per line.
    fn block(&mut self, start: usize, end: usize, members: &[Member]) {
        let end = self.tight_end(start, end);
        if members.is_empty() && !self.has_comment_in(start, end) {
            self.out.push_str("{}");
            return;
        }
        self.out.push('{');
        self.newline();
        self.indent += 1;
        self.fresh = true;
        self.members(members);
        self.comments_before(end.saturating_sub(1));
        self.indent -= 1;
        self.start_line();
        self.out.push('}');
        self.last = end;
    }

    fn members(&mut self, members: &[Member]) {
        // Runs of one-line bindings, for aligning `=` and trailing comments.
        let widths = self.run_widths(members);
        for (i, m) in members.iter().enumerate() {
            let start = m.start();
            let end = self.tight_end(start, m.end());
            self.before_member(start);
            match m {
                Member::Field(f) => {
                    self.doc(&f.doc);
                    self.after_doc(&f.doc, f.name.span.start as usize);
                    self.start_line();
                    self.out.push_str(&f.name.name);
                    self.out.push_str(": ");
                    self.out.push_str(&ty(&f.ty));
                    if let Some(c) = &f.constraint {
                        self.out.push_str(" in ");
                        self.expr(c);
                    }
                    if let Some(d) = &f.default {
                        self.out.push_str(" = ");
                        self.expr(d);
                    }
                }
                Member::Check(c) => {
                    self.doc(&c.doc);
                    let expr_at = c.expr.span.start as usize;
                    let from = c.doc.as_ref().map(|d| d.span.end as usize).unwrap_or(expr_at).min(expr_at);
                    let between = &self.src[from..expr_at];
                    let kw = between.rfind("check").or_else(|| between.rfind("warn")).map(|i| from + i);
                    self.after_doc(&c.doc, kw.unwrap_or(expr_at));
                    self.start_line();
                    self.check(c);
                }
                Member::Binding(b) => {
                    self.doc(&b.doc);
                    self.after_doc(&b.doc, b.path.span.start as usize);
                    self.start_line();
                    let name = b.path.dotted();
                    self.out.push_str(&name);
                    if let Some((pad, _)) = widths[i] {
                        for _ in name.len()..pad {
                            self.out.push(' ');
                        }
                    }
                    self.out.push_str(" = ");
                    self.expr(&b.value);
                }
            }
            let c = self.trailing(start, end);
            if let (Some(c), Some((_, Some(col)))) = (&c, widths[i]) {
                let at = self.column();
                for _ in at..col {
                    self.out.push(' ');
                }
                self.out.push_str(if at >= col { "  " } else { "" });
                self.out.push_str(c);
                self.newline();
            } else {
                self.end_line_with(c);
            }
        }
    }

    /// For each member: `Some((name width, trailing comment column))` when it is a one-line
    /// binding in a run of them, else `None`.
    fn run_widths(&self, members: &[Member]) -> Vec<Option<(usize, Option<usize>)>> {
        let mut out = vec![None; members.len()];
        let mut i = 0;
        while i < members.len() {
            let mut j = i;
            let mut prev_end: Option<usize> = None;
            while j < members.len() {
                let Member::Binding(b) = &members[j] else { break };
                if !self.one_line(b) {
                    break;
                }
                if let Some(pe) = prev_end {
                    if self.blank_line_between(pe, members[j].start()) {
                        break;
                    }
                }
                prev_end = Some(self.tight_end(members[j].start(), members[j].end()));
                j += 1;
            }
            if j > i {
                let names: Vec<usize> = (i..j)
                    .map(|k| match &members[k] {
                        Member::Binding(b) => b.path.dotted().len(),
                        _ => 0,
                    })
                    .collect();
                let pad = names.iter().copied().max().unwrap_or(0);
                // Trailing comments line up after the longest line of the run that has one.
                let mut col: Option<usize> = None;
                for m in &members[i..j] {
                    if let Member::Binding(b) = m {
                        if self.has_trailing_comment(m.start(), m.end()) {
                            let len = self.indent * INDENT.len() + pad + 3 + inline(self.src, &b.value).len();
                            col = Some(col.map_or(len, |c: usize| c.max(len)));
                        }
                    }
                }
                let col = col.map(|c| c + 2);
                for slot in out.iter_mut().take(j).skip(i) {
                    *slot = Some((pad, col));
                }
                i = j;
            } else {
                i += 1;
            }
        }
        out
    }

    fn has_trailing_comment(&self, start: usize, end: usize) -> bool {
        let end = self.tight_end(start, end);
        self.comments.iter().any(|c| {
            let cs = c.span.start as usize;
            cs >= end && !self.src[end..cs].contains('\n')
        })
    }

    /// Whether a binding prints on one line.
    fn one_line(&self, b: &Binding) -> bool {
        b.doc.is_none()
            && !self.forced_multiline(&b.value)
            && self.indent * INDENT.len() + b.path.dotted().len() + 3 + inline(self.src, &b.value).len() <= WIDTH
    }

    fn check(&mut self, c: &Check) {
        self.out.push_str(if c.warn { "warn " } else { "check " });
        self.expr(&c.expr);
        let mut tail = Vec::new();
        if let Some(at) = &c.at {
            tail.push(format!("at {}", inline(self.src, at)));
        }
        if let Some(m) = &c.message {
            tail.push(format!("else {}", quote_text(m)));
        }
        if let Some(h) = &c.help {
            tail.push(format!("help {}", quote_text(h)));
        }
        let one = tail.iter().map(|t| t.len() + 1).sum::<usize>();
        if self.column() + one <= WIDTH {
            for t in tail {
                self.out.push(' ');
                self.out.push_str(&t);
            }
        } else {
            for t in tail {
                self.newline();
                self.start_line();
                self.out.push_str(INDENT);
                self.out.push_str(&t);
            }
        }
    }

    // ---- expressions ------------------------------------------------------------------

    /// Records, lists and maps written over several lines, or holding comments, keep one
    /// element per line; so does anything holding such an expression.
    fn forced_multiline(&self, e: &Expr) -> bool {
        match &e.kind {
            ExprKind::Record { base, fields, body_span } => {
                let (s, end) = (body_span.start as usize, body_span.end as usize);
                let first = fields.first().map(|f| f.span.start as usize).unwrap_or(end);
                (!fields.is_empty() && self.opened_on_own_line(s, first))
                    || self.has_comment_in(s, self.tight_end(s, end))
                    || fields.iter().any(|f| f.doc.is_some() || self.forced_multiline(&f.value))
                    || self.forced_multiline(base)
            }
            ExprKind::List(items) => {
                let (s, end) = (e.span.start as usize, e.span.end as usize);
                let first = items.first().map(|x| x.span.start as usize).unwrap_or(end);
                (!items.is_empty() && self.opened_on_own_line(s, first))
                    || self.has_comment_in(s, self.tight_end(s, end))
                    || items.iter().any(|x| self.forced_multiline(x))
            }
            ExprKind::Map(entries) => {
                let (s, end) = (e.span.start as usize, e.span.end as usize);
                let first = entries.first().map(|x| x.0.span.start as usize).unwrap_or(end);
                (!entries.is_empty() && self.opened_on_own_line(s, first))
                    || self.has_comment_in(s, self.tight_end(s, end))
                    || entries.iter().any(|x| self.forced_multiline(&x.1))
            }
            ExprKind::Call { callee, .. } => self.forced_multiline(callee),
            _ => false,
        }
    }

    fn expr(&mut self, e: &Expr) {
        let fits = self.column() + inline(self.src, e).len() <= WIDTH;
        if !self.forced_multiline(e) && fits {
            self.out.push_str(&inline(self.src, e));
            return;
        }
        match &e.kind {
            ExprKind::Record { base, fields, body_span } if !fields.is_empty() => {
                self.expr(base);
                self.out.push_str(" {");
                self.newline();
                self.indent += 1;
                self.fresh = true;
                let members: Vec<Member> = fields.iter().map(Member::Binding).collect();
                self.members(&members);
                let end = self.tight_end(body_span.start as usize, body_span.end as usize);
                self.comments_before(end.saturating_sub(1));
                self.indent -= 1;
                self.start_line();
                self.out.push('}');
                self.last = end;
            }
            ExprKind::List(items) if !items.is_empty() => {
                self.out.push('[');
                self.elements(e, items.iter().map(|x| (x.span.start as usize, x.span.end as usize, None, x)).collect());
                self.out.push(']');
            }
            ExprKind::Map(entries) if !entries.is_empty() => {
                self.out.push('{');
                self.elements(
                    e,
                    entries
                        .iter()
                        .map(|(k, v)| (k.span.start as usize, v.span.end as usize, Some(quote(&k.value)), v))
                        .collect(),
                );
                self.out.push('}');
            }
            _ => self.out.push_str(&inline(self.src, e)),
        }
    }

    /// Elements of a multi-line list or map, one per line with a trailing comma.
    fn elements(&mut self, whole: &Expr, items: Vec<(usize, usize, Option<String>, &Expr)>) {
        self.newline();
        self.indent += 1;
        self.fresh = true;
        for (start, end, key, value) in items {
            self.before_member(start);
            self.start_line();
            if let Some(k) = key {
                self.out.push_str(&k);
                self.out.push_str(": ");
            }
            self.expr(value);
            self.out.push(',');
            let end = self.tight_end(start, end);
            let c = self.trailing(start, end);
            self.end_line_with(c);
        }
        let end = self.tight_end(whole.span.start as usize, whole.span.end as usize);
        self.comments_before(end.saturating_sub(1));
        self.indent -= 1;
        self.start_line();
        self.last = end;
    }
}

/// Where an item's own text starts, after its doc comment: its keyword's line.
fn item_head(item: &Item) -> Option<usize> {
    let at = match &item.kind {
        ItemKind::Import(i) => i.path_span.start,
        other => match other {
            ItemKind::Const(c) => c.name.span.start,
            ItemKind::Enum(e) => e.name.span.start,
            ItemKind::Interface(i) => i.span.start,
            ItemKind::Schema(s) => s.name.span.start,
            ItemKind::Stage(s) => s.name.span.start,
            ItemKind::Model(n) | ItemKind::Cluster(n) => n.name.span.start,
            ItemKind::Recipe(r) => r.name.span.start,
            ItemKind::Import(_) => return None,
        },
    };
    Some(at as usize)
}

fn decl_members<'a>(fields: &'a [FieldDecl], checks: &'a [Check]) -> Vec<Member<'a>> {
    let mut members: Vec<Member> = fields.iter().map(Member::Field).collect();
    members.extend(checks.iter().map(Member::Check));
    members.sort_by_key(|m| m.start());
    members
}

fn ty(t: &TypeExpr) -> String {
    match &t.kind {
        TypeExprKind::Named(p) => p.dotted(),
        TypeExprKind::Generic(name, args) => {
            format!("{}[{}]", name.name, args.iter().map(ty).collect::<Vec<_>>().join(", "))
        }
        TypeExprKind::Optional(inner) => format!("{}?", ty(inner)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(input: &str, expect: &str) {
        let out = format(input).unwrap_or_else(|d| panic!("syntax errors: {d:?}"));
        assert_eq!(out, expect, "\n--- got ---\n{out}");
        let again = format(&out).unwrap_or_default();
        assert_eq!(again, out, "not idempotent");
    }

    #[test]
    fn items_and_spacing() {
        check(
            "import   std/tasks/arith\nconst  x:Int=1+2*3\n\n\n\nenum Mode{fast,slow}\n",
            "import std/tasks/arith\nconst x: Int = 1 + 2 * 3\n\nenum Mode { fast, slow }\n",
        );
    }

    #[test]
    fn aligns_runs_and_keeps_comments() {
        check(
            r#"// head
recipe r on laptop {
  rollout = generate(policy) {
     prompts = arith.addition { digits = 2 }
     samples_per_prompt = 8   // group size
     temperature = 1.0 // hot
  }
  stop=10.steps

  // the end
  seed = 1 // why
}
"#,
            r#"// head
recipe r on laptop {
    rollout = generate(policy) {
        prompts            = arith.addition { digits = 2 }
        samples_per_prompt = 8    // group size
        temperature        = 1.0  // hot
    }
    stop = 10.steps

    // the end
    seed = 1  // why
}
"#,
        );
    }

    #[test]
    fn long_checks_break_before_else() {
        check(
            "stage s(policy: Policy) -> Trajectories {\n    /// Doc.\n    temperature: Float in 0..=2 = 1.0\n    n: Int in 1.. = 8\n    check temperature <= 1.2 else \"team policy: temperature above 1.2 is not allowed here, ever, on any cluster\" help \"lower it\"\n}\n",
            "stage s(policy: Policy) -> Trajectories {\n    /// Doc.\n    temperature: Float in 0..=2 = 1.0\n    n: Int in 1.. = 8\n    check temperature <= 1.2\n        else \"team policy: temperature above 1.2 is not allowed here, ever, on any cluster\"\n        help \"lower it\"\n}\n",
        );
    }

    #[test]
    fn multi_line_lists_and_strings() {
        check(
            "const xs = [\n  1, // one\n  2\n]\nconst s = \"a\\\"b\\\\c\"\nconst m = {\"a\": 1}\nschema e {}\n",
            "const xs = [\n    1,  // one\n    2,\n]\nconst s = \"a\\\"b\\\\c\"\nconst m = {\"a\": 1}\nschema e {}\n",
        );
    }

    #[test]
    fn comments_between_a_doc_and_its_item_stay_there() {
        check(
            "/// The A100.\n// Source: a datasheet.\nconst a = gpu {\n    name = \"A100\"\n    /// Doc.\n    // note\n    hbm = 80.GB\n}\n",
            "/// The A100.\n// Source: a datasheet.\nconst a = gpu {\n    name = \"A100\"\n    /// Doc.\n    // note\n    hbm = 80.GB\n}\n",
        );
    }

    #[test]
    fn long_operator_chains_stay_on_one_line() {
        let sum = format!("const x = 1{}\n", " + 1".repeat(20_000));
        check(&sum.replace(" + ", "+"), &sum);
    }

    #[test]
    fn refuses_syntax_errors() {
        let e = format("const x = (1 +\n").err().unwrap_or_default();
        assert!(e.iter().any(|d| d.code == "E0001" || d.code == "E0002"), "{e:?}");
    }
}
