//! Editor features over a `Compilation`, with no protocol in sight: plain structs in (a file and
//! a byte offset), plain structs out (spans, text, kinds). The language server (lsp/) converts
//! them to LSP types; tests call them directly.
//!
//! Everything here works on broken files: the parser keeps every item it could read, and the
//! compiler's `references` cover whatever evaluated. What those miss (field names inside a stage
//! block, enum members written bare, recipe settings) is resolved here from the syntax tree, so
//! a syntax error in one item leaves hover and completion working in the rest.

use crate::eval::{Env, Eval, BUILTINS};
use crate::program::{Program, ScopeEntry, STDLIB};
use crate::types::{Iface, Type};
use crate::value::{ItemRef, Value};
use crate::Compilation;
use miles_grammar::ast::{self, Binding, Expr, ExprKind, Ident, Item, ItemKind, TypeExpr};
use miles_grammar::diag::{FileId, Span};
use std::collections::HashMap;

// ---- definitions ------------------------------------------------------------------------

/// What a name declares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum DefKind {
    Module,
    Const,
    Model,
    Cluster,
    Enum,
    EnumMember,
    Interface,
    Schema,
    StageKind,
    Recipe,
    /// A field of a schema or stage kind.
    Field,
    /// A port of a stage kind (`rollout: Trajectories`).
    Port,
    /// A recipe binding that instantiates a stage.
    StageInstance,
    /// A recipe binding that sets a recipe setting (`stop = 100.steps`).
    Setting,
}

/// A declaration found in some module's syntax tree.
#[derive(Clone, Debug)]
pub struct Def {
    pub kind: DefKind,
    pub name: String,
    /// The declared name.
    pub span: Span,
    /// The whole declaration (for document symbols and ranges).
    pub full_span: Span,
    pub doc: Option<String>,
    /// The item that holds a field, port, member or binding.
    pub container: Option<ItemRef>,
    /// The item itself, for item definitions.
    pub item: Option<ItemRef>,
    pub module: u32,
}

/// Every declaration of every loaded module, by the span of its name.
pub struct Defs {
    pub by_span: HashMap<Span, Def>,
}

impl Defs {
    pub fn new(program: &Program) -> Defs {
        let mut by_span = HashMap::new();
        for (m, module) in program.modules.iter().enumerate() {
            let m = m as u32;
            for (index, item) in module.ast.items.iter().enumerate() {
                let r = ItemRef { module: m, index: index as u32 };
                collect_item_defs(item, r, m, &mut by_span);
            }
        }
        Defs { by_span }
    }
    pub fn at(&self, span: Span) -> Option<&Def> {
        self.by_span.get(&span)
    }
}

fn doc_text(d: &Option<ast::Doc>) -> Option<String> {
    d.as_ref().map(|d| d.text.clone())
}

fn collect_item_defs(item: &Item, r: ItemRef, m: u32, out: &mut HashMap<Span, Def>) {
    let mut add =
        |kind, id: &Ident, full: Span, doc: Option<String>, container: Option<ItemRef>, item: Option<ItemRef>| {
            out.insert(
                id.span,
                Def { kind, name: id.name.clone(), span: id.span, full_span: full, doc, container, item, module: m },
            );
        };
    let doc = doc_text(&item.doc);
    match &item.kind {
        ItemKind::Import(imp) => {
            // The name an import binds: its alias, else the path (`arith` of `std/tasks/arith`).
            if imp.names.is_none() {
                let (name, span) = match &imp.alias {
                    Some(al) => (al.name.clone(), al.span),
                    None => (
                        imp.path.trim_end_matches(".miles").rsplit('/').next().unwrap_or("").to_string(),
                        imp.path_span,
                    ),
                };
                add(DefKind::Module, &Ident { name, span }, item.span, None, None, None);
            }
        }
        ItemKind::Const(c) => add(DefKind::Const, &c.name, item.span, doc, None, Some(r)),
        ItemKind::Model(nv) => add(DefKind::Model, &nv.name, item.span, doc, None, Some(r)),
        ItemKind::Cluster(nv) => add(DefKind::Cluster, &nv.name, item.span, doc, None, Some(r)),
        ItemKind::Interface(id) => add(DefKind::Interface, id, item.span, doc, None, Some(r)),
        ItemKind::Enum(e) => {
            add(DefKind::Enum, &e.name, item.span, doc, None, Some(r));
            for mem in &e.members {
                add(DefKind::EnumMember, &mem.name, mem.name.span, doc_text(&mem.doc), Some(r), None);
            }
        }
        ItemKind::Schema(s) => {
            add(DefKind::Schema, &s.name, item.span, doc, None, Some(r));
            for f in &s.fields {
                add(DefKind::Field, &f.name, f.span, doc_text(&f.doc), Some(r), None);
            }
        }
        ItemKind::Stage(s) => {
            add(DefKind::StageKind, &s.name, item.span, doc, None, Some(r));
            for p in &s.ports {
                add(DefKind::Port, &p.name, p.name.span.to(p.ty.span), None, Some(r), None);
            }
            for f in &s.fields {
                add(DefKind::Field, &f.name, f.span, doc_text(&f.doc), Some(r), None);
            }
        }
        ItemKind::Recipe(rc) => {
            add(DefKind::Recipe, &rc.name, item.span, doc, None, Some(r));
            for b in &rc.bindings {
                if b.path.segments.len() != 1 {
                    continue;
                }
                let kind = if stage_call(&b.value).is_some() { DefKind::StageInstance } else { DefKind::Setting };
                add(kind, &b.path.segments[0], b.span, doc_text(&b.doc), Some(r), None);
            }
        }
    }
}

/// `kind(args) { fields }` or `kind(args)`: the callee, arguments and fields.
pub fn stage_call(e: &Expr) -> Option<(&Expr, &[ast::Arg], &[Binding])> {
    match &e.kind {
        ExprKind::Call { callee, args, .. } => Some((callee, args, &[])),
        ExprKind::Record { base, fields, .. } => match &base.kind {
            ExprKind::Call { callee, args, .. } => Some((callee, args, fields)),
            _ => None,
        },
        _ => None,
    }
}

// ---- analysis ----------------------------------------------------------------------------

/// A compilation plus the indexes editor features need. Built once per edit, shared by every
/// request until the next one.
pub struct Analysis {
    pub compilation: Compilation,
    pub defs: Defs,
    /// Use span -> definition name span: the compiler's references plus those resolved here.
    pub refs: Vec<(Span, Span)>,
}

impl Analysis {
    pub fn new(compilation: Compilation) -> Analysis {
        let defs = Defs::new(&compilation.program);
        let mut refs = compilation.references.clone();
        extra_references(&compilation, &defs, &mut refs);
        refs.sort_by_key(|(u, d)| (u.file, u.start, u.end, d.file, d.start));
        refs.dedup();
        Analysis { compilation, defs, refs }
    }

    pub fn program(&self) -> &Program {
        &self.compilation.program
    }

    /// The file a path (module key) was loaded as.
    pub fn file_id(&self, path: &str) -> Option<FileId> {
        self.program().modules.iter().find(|m| m.key == path).map(|m| m.file)
    }

    pub fn module_of_file(&self, file: FileId) -> Option<u32> {
        self.program().modules.iter().position(|m| m.file == file).map(|i| i as u32)
    }

    pub fn text(&self, file: FileId) -> &str {
        self.program().sources.get(file).map(|s| s.text.as_str()).unwrap_or("")
    }

    /// The definition a cursor is on: a use, or a declared name itself.
    pub fn resolve(&self, file: FileId, offset: usize) -> Option<(Span, &Def)> {
        let mut best: Option<(Span, Span)> = None;
        for (u, d) in &self.refs {
            if u.file == file && u.contains(offset) && best.is_none_or(|(b, _)| u.end - u.start < b.end - b.start) {
                best = Some((*u, *d));
            }
        }
        if let Some((u, d)) = best {
            if let Some(def) = self.defs.at(d) {
                return Some((u, def));
            }
        }
        self.defs
            .by_span
            .iter()
            .filter(|(s, _)| s.file == file && s.contains(offset))
            .min_by_key(|(s, _)| s.end - s.start)
            .map(|(s, d)| (*s, d))
    }
}

/// References the compiler does not record: field names in stage blocks and amendments
/// (`train.lr = ...`), recipe settings, enum members written bare or qualified, `extends`
/// parents in other modules.
fn extra_references(c: &Compilation, defs: &Defs, out: &mut Vec<(Span, Span)>) {
    let program = &c.program;
    let known: HashMap<Span, Span> = c.references.iter().copied().collect();
    let settings = settings_schema(program);
    for (m, module) in program.modules.iter().enumerate() {
        let m = m as u32;
        for item in &module.ast.items {
            if let ItemKind::Recipe(r) = &item.kind {
                // Instance name -> stage kind declaration, for amendments.
                let mut instances: HashMap<&str, ItemRef> = HashMap::new();
                for b in &r.bindings {
                    let Some(first) = b.path.segments.first() else { continue };
                    if b.path.segments.len() == 1 {
                        if let Some((callee, _, fields)) = stage_call(&b.value) {
                            if let Some(kind) = stage_kind_of(program, defs, &known, m, callee) {
                                instances.insert(first.name.as_str(), kind);
                                for f in fields {
                                    if let Some(fid) = f.path.segments.first() {
                                        if let Some(d) = field_decl(program, kind, &fid.name) {
                                            out.push((fid.span, d));
                                        }
                                    }
                                }
                            }
                        } else if let Some(s) = settings {
                            if let Some(d) = field_decl(program, s, &first.name) {
                                out.push((first.span, d));
                            }
                        }
                    }
                }
                for b in &r.bindings {
                    if b.path.segments.len() < 2 {
                        continue;
                    }
                    let head = &b.path.segments[0];
                    let target =
                        r.bindings.iter().find(|x| x.path.segments.len() == 1 && x.path.segments[0].name == head.name);
                    if let Some(t) = target {
                        out.push((head.span, t.path.segments[0].span));
                    }
                    if let (Some(kind), Some(field)) = (instances.get(head.name.as_str()), b.path.segments.get(1)) {
                        if let Some(d) = field_decl(program, *kind, &field.name) {
                            out.push((field.span, d));
                        }
                    }
                }
            }
            // Enum members: bare names the compiler resolved by expected type, and `Enum.member`.
            let mut visit = |e: &Expr| match &e.kind {
                ExprKind::Name(id) if !known.contains_key(&id.span) => {
                    if let Some(ScopeEntry::Module(_)) = program.lookup(m, &id.name) {
                        if let Some(d) = import_binding(program, m, &id.name) {
                            out.push((id.span, d));
                        }
                    } else if let Some(d) = enum_member_visible(program, m, &id.name) {
                        out.push((id.span, d));
                    }
                }
                ExprKind::Field(base, field) => {
                    if let ExprKind::Name(b) = &base.kind {
                        let def = known.get(&b.span).and_then(|d| defs.at(*d));
                        if let Some(Def { kind: DefKind::Enum, item: Some(r), .. }) = def {
                            if let ItemKind::Enum(en) = &program.item(*r).kind {
                                if let Some(mem) = en.members.iter().find(|x| x.name.name == field.name) {
                                    out.push((field.span, mem.name.span));
                                }
                            }
                        }
                    }
                }
                _ => {}
            };
            walk_item_exprs(item, &mut visit);
        }
    }
}

/// Where an import binds `name` in module `m`: its alias or its path.
fn import_binding(program: &Program, m: u32, name: &str) -> Option<Span> {
    program.module(m).ast.items.iter().find_map(|i| match &i.kind {
        ItemKind::Import(imp) if imp.names.is_none() => match &imp.alias {
            Some(al) if al.name == name => Some(al.span),
            None if imp.path.trim_end_matches(".miles").rsplit('/').next() == Some(name) => Some(imp.path_span),
            _ => None,
        },
        _ => None,
    })
}

/// The stage kind a callee names (via the compiler's references, else a scope lookup).
fn stage_kind_of(
    program: &Program,
    defs: &Defs,
    known: &HashMap<Span, Span>,
    m: u32,
    callee: &Expr,
) -> Option<ItemRef> {
    let id = match &callee.kind {
        ExprKind::Name(id) => id,
        ExprKind::Field(_, id) => id,
        _ => return None,
    };
    if let Some(Def { kind: DefKind::StageKind, item: Some(r), .. }) = known.get(&id.span).and_then(|d| defs.at(*d)) {
        return Some(*r);
    }
    if let ExprKind::Name(id) = &callee.kind {
        if let Some(ScopeEntry::Item(r)) = program.lookup(m, &id.name) {
            if matches!(program.item(r).kind, ItemKind::Stage(_)) {
                return Some(r);
            }
        }
    }
    None
}

fn field_decl(program: &Program, decl: ItemRef, name: &str) -> Option<Span> {
    decl_fields(program, decl).iter().find(|f| f.name.name == name).map(|f| f.name.span)
}

fn decl_fields(program: &Program, decl: ItemRef) -> &[ast::FieldDecl] {
    match &program.item(decl).kind {
        ItemKind::Schema(s) => &s.fields,
        ItemKind::Stage(s) => &s.fields,
        _ => &[],
    }
}

fn settings_schema(program: &Program) -> Option<ItemRef> {
    crate::program::PRELUDE.iter().find_map(|p| {
        let m = program.module_by_key(p)?;
        program.module(m).own.get("recipe_settings").copied()
    })
}

/// A bare enum member visible in a module, when exactly one visible enum has it.
fn enum_member_visible(program: &Program, module: u32, name: &str) -> Option<Span> {
    let mut mods = vec![module];
    mods.extend(program.module(module).fallbacks.iter().copied());
    for e in program.module(module).scope.values() {
        match e {
            ScopeEntry::Module(t) => mods.push(*t),
            ScopeEntry::Item(r) => mods.push(r.module),
        }
    }
    mods.sort();
    mods.dedup();
    let mut found = None;
    for m in mods {
        for item in &program.module(m).ast.items {
            if let ItemKind::Enum(en) = &item.kind {
                if let Some(mem) = en.members.iter().find(|x| x.name.name == name) {
                    if found.is_some() {
                        return None;
                    }
                    found = Some(mem.name.span);
                }
            }
        }
    }
    found
}

// ---- syntax walking ----------------------------------------------------------------------

pub fn walk_item_exprs<'a>(item: &'a Item, f: &mut impl FnMut(&'a Expr)) {
    let fields_checks = |fields: &'a [ast::FieldDecl], checks: &'a [ast::Check], f: &mut dyn FnMut(&'a Expr)| {
        for fd in fields {
            if let Some(c) = &fd.constraint {
                walk_expr(c, f);
            }
            if let Some(d) = &fd.default {
                walk_expr(d, f);
            }
        }
        for c in checks {
            walk_expr(&c.expr, f);
        }
    };
    match &item.kind {
        ItemKind::Const(c) => walk_expr(&c.value, f),
        ItemKind::Model(nv) | ItemKind::Cluster(nv) => walk_expr(&nv.value, f),
        ItemKind::Schema(s) => fields_checks(&s.fields, &s.checks, f),
        ItemKind::Stage(s) => fields_checks(&s.fields, &s.checks, f),
        ItemKind::Recipe(r) => {
            for b in &r.bindings {
                walk_expr(&b.value, f);
            }
            for c in &r.checks {
                walk_expr(&c.expr, f);
            }
        }
        _ => {}
    }
}

pub fn walk_expr<'a>(e: &'a Expr, f: &mut dyn FnMut(&'a Expr)) {
    f(e);
    match &e.kind {
        ExprKind::List(items) => items.iter().for_each(|x| walk_expr(x, f)),
        ExprKind::Map(entries) => entries.iter().for_each(|(_, x)| walk_expr(x, f)),
        ExprKind::Field(b, _) => walk_expr(b, f),
        ExprKind::Call { callee, args, .. } => {
            walk_expr(callee, f);
            for a in args {
                walk_expr(&a.value, f);
                if let Some(t) = &a.arrow_to {
                    walk_expr(t, f);
                }
            }
        }
        ExprKind::Record { base, fields, .. } => {
            walk_expr(base, f);
            fields.iter().for_each(|b| walk_expr(&b.value, f));
        }
        ExprKind::Binary { lhs, rhs, .. } => {
            walk_expr(lhs, f);
            walk_expr(rhs, f);
        }
        ExprKind::Unary { expr, .. } | ExprKind::Paren(expr) => walk_expr(expr, f),
        ExprKind::If { cond, then, otherwise } => {
            walk_expr(cond, f);
            walk_expr(then, f);
            walk_expr(otherwise, f);
        }
        ExprKind::Range { start, end, .. } => {
            if let Some(s) = start {
                walk_expr(s, f);
            }
            if let Some(x) = end {
                walk_expr(x, f);
            }
        }
        _ => {}
    }
}

fn type_text(program: &Program, t: &TypeExpr) -> String {
    span_text(program, t.span).to_string()
}

/// The source text of a span, without the whitespace the parser counts into some nodes.
fn span_text(program: &Program, s: Span) -> &str {
    program.sources.get(s.file).and_then(|f| f.text.get(s.range())).unwrap_or("").trim()
}

// ---- go to definition, references, rename -------------------------------------------------

/// Where the name under the cursor is declared. For an import path: the module's file.
pub fn definition(a: &Analysis, file: FileId, offset: usize) -> Option<Span> {
    if let Some(target) = import_at(a, file, offset) {
        return Some(Span::new(target, 0, 0));
    }
    let (_, def) = a.resolve(file, offset)?;
    if def.kind == DefKind::Module {
        // A module's name goes to the module, not to the import that binds it.
        if let Some(target) = import_at(a, def.span.file, def.span.start as usize) {
            return Some(Span::new(target, 0, 0));
        }
    }
    Some(def.span)
}

/// The file an import path under the cursor names.
fn import_at(a: &Analysis, file: FileId, offset: usize) -> Option<FileId> {
    let m = a.module_of_file(file)?;
    let module = a.program().module(m);
    for item in &module.ast.items {
        if let ItemKind::Import(imp) = &item.kind {
            if imp.path_span.contains(offset) {
                let key = crate::program::resolve_import(&module.key, &imp.path);
                return a.file_id(&key);
            }
        }
    }
    None
}

/// Every use of the name under the cursor (and its declaration when `include_declaration`).
pub fn references(a: &Analysis, file: FileId, offset: usize, include_declaration: bool) -> Vec<Span> {
    let Some((_, def)) = a.resolve(file, offset) else { return Vec::new() };
    let mut out: Vec<Span> = a.refs.iter().filter(|(_, d)| *d == def.span).map(|(u, _)| *u).collect();
    if include_declaration {
        out.push(def.span);
    }
    out.sort_by_key(|s| (s.file, s.start));
    out.dedup();
    out
}

/// The edits that rename the name under the cursor, or why it cannot be renamed.
pub fn rename(a: &Analysis, file: FileId, offset: usize, new_name: &str) -> Result<Vec<(Span, String)>, String> {
    let Some((_, def)) = a.resolve(file, offset) else { return Err("no name to rename here".into()) };
    if a.program().module(def.module).is_std {
        return Err(format!("`{}` is declared in the standard library, which is read-only", def.name));
    }
    if !is_identifier(new_name) {
        return Err(format!("`{new_name}` is not a valid name"));
    }
    let spans = references(a, file, offset, true);
    Ok(spans.into_iter().map(|s| (s, new_name.to_string())).collect())
}

pub const KEYWORDS: &[&str] = &[
    "import",
    "const",
    "enum",
    "interface",
    "schema",
    "stage",
    "check",
    "else",
    "true",
    "false",
    "none",
    "and",
    "or",
    "not",
    "in",
    "is",
    "if",
    "then",
];

pub fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !KEYWORDS.contains(&s)
}

// ---- hover -------------------------------------------------------------------------------

#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Hover {
    pub span: Span,
    /// Markdown: a `miles` code block with the signature, then docs and values.
    pub markdown: String,
}

pub fn hover(a: &Analysis, file: FileId, offset: usize) -> Option<Hover> {
    if let Some(target) = import_at(a, file, offset) {
        let m = a.module_of_file(file)?;
        let span = a.program().module(m).ast.items.iter().find_map(|i| match &i.kind {
            ItemKind::Import(imp) if imp.path_span.contains(offset) => Some(imp.path_span),
            _ => None,
        })?;
        return Some(Hover { span, markdown: describe_module(a, target) });
    }
    if let Some((span, def)) = a.resolve(file, offset) {
        if def.kind == DefKind::Module {
            let target = import_at(a, def.span.file, def.span.start as usize)?;
            return Some(Hover { span, markdown: describe_module(a, target) });
        }
        return Some(Hover { span, markdown: describe_def(a, def, Some((file, offset))) });
    }
    hover_literal(a, file, offset)
}

/// A module: its key, its leading comment, and what it declares.
fn describe_module(a: &Analysis, target: FileId) -> String {
    let Some(m) = a.module_of_file(target) else { return String::new() };
    let module = a.program().module(m);
    let mut names: Vec<&String> = module.own.keys().collect();
    names.sort();
    let header = leading_comment(a.text(target));
    let mut md = format!("```miles\nmodule {}\n```", module_label(&module.key));
    if !header.is_empty() {
        md.push_str(&format!("\n---\n{header}"));
    }
    md.push_str(&format!("\n\ndeclares: {}", names.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")));
    md
}

/// `std/stages` for the stdlib, the file name for a user module.
fn module_label(key: &str) -> String {
    if key.starts_with("std/") {
        key.to_string()
    } else {
        key.rsplit('/').next().unwrap_or(key).to_string()
    }
}

/// The first comment lines of a file: a module's own description.
fn leading_comment(text: &str) -> String {
    text.lines()
        .take_while(|l| l.trim_start().starts_with("//"))
        .map(|l| l.trim_start().trim_start_matches('/').trim())
        .collect::<Vec<_>>()
        .join("\n")
}

/// A number or quantity literal: its exact value and type.
fn hover_literal(a: &Analysis, file: FileId, offset: usize) -> Option<Hover> {
    let m = a.module_of_file(file)?;
    let mut best: Option<&Expr> = None;
    for item in &a.program().module(m).ast.items {
        walk_item_exprs(item, &mut |e: &Expr| {
            if e.span.file == file
                && e.span.contains(offset)
                && matches!(e.kind, ExprKind::Number(_) | ExprKind::Quantity { .. } | ExprKind::Binary { .. })
                && best.is_none_or(|b| e.span.end - e.span.start < b.span.end - b.span.start)
            {
                best = Some(e);
            }
        });
    }
    let e = best?;
    let mut ev = Eval::new(a.program());
    let v = ev.eval(e, Env::Module(m), None)?;
    let ty = value_type_name(&v);
    Some(Hover {
        span: e.span,
        markdown: format!("```miles\n{}\n```\n---\n{ty} = `{v}`", span_text(a.program(), e.span)),
    })
}

fn value_type_name(v: &Value) -> String {
    match v {
        Value::Record(r) => r.schema_name.clone(),
        other => other.type_name(),
    }
}

/// Markdown for a definition: signature, docs, where it is declared, and values where known.
fn describe_def(a: &Analysis, def: &Def, at: Option<(FileId, usize)>) -> String {
    let p = a.program();
    let module_key = module_label(&p.module(def.module).key);
    let mut sig = String::new();
    let mut extra = Vec::new();
    match def.kind {
        DefKind::Const | DefKind::Model | DefKind::Cluster => {
            let item = def.item.map(|r| p.item(r));
            let kw = match def.kind {
                DefKind::Const => "const",
                DefKind::Model => "model",
                _ => "cluster",
            };
            sig = format!("{kw} {}", def.name);
            if let Some(Item { kind: ItemKind::Const(c), .. }) = item {
                if let Some(t) = &c.ty {
                    sig.push_str(&format!(": {}", type_text(p, t)));
                }
            }
            if let Some(r) = def.item {
                let mut ev = Eval::new(p);
                if let Some(v) = ev.item_value(r) {
                    extra.push(format!("{} = `{}`", value_type_name(&v), v));
                }
            }
        }
        DefKind::Enum => {
            let members = def.item.map(|r| enum_member_names(p, r)).unwrap_or_default();
            sig = format!("enum {} {{ {} }}", def.name, members.join(", "));
        }
        DefKind::EnumMember => {
            let e = def.container.map(|r| item_name(p, r)).unwrap_or_default();
            sig = format!("{e}.{}", def.name);
        }
        DefKind::Interface => {
            sig = format!("interface {}", def.name);
            if let Some(r) = def.item {
                let impls = implementors(p, r);
                if !impls.is_empty() {
                    extra.push(format!(
                        "schemas: {}",
                        impls.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")
                    ));
                }
            }
        }
        DefKind::Schema => {
            if let Some(ItemKind::Schema(s)) = def.item.map(|r| &p.item(r).kind) {
                sig = format!("schema {}", def.name);
                if let Some(i) = &s.interface {
                    sig.push_str(&format!(" is {}", i.name));
                }
                sig.push_str(&fields_block(p, &s.fields));
            }
        }
        DefKind::StageKind => {
            if let Some(ItemKind::Stage(s)) = def.item.map(|r| &p.item(r).kind) {
                sig = stage_signature(p, s);
                sig.push_str(&fields_block(p, &s.fields));
            }
        }
        DefKind::Recipe => {
            sig = format!("recipe {}", def.name);
            if let Some(r) = a.compilation.recipe(&def.name) {
                let stages: Vec<String> = r.graph.nodes().map(|n| format!("`{}` ({})", n.name, n.kind)).collect();
                extra.push(format!("stages: {}", stages.join(", ")));
            }
        }
        DefKind::Field => {
            let decl = def.container.and_then(|r| decl_fields(p, r).iter().find(|f| f.name.span == def.span));
            if let Some(f) = decl {
                sig = field_signature(p, f);
            }
            let owner = def.container.map(|r| item_name(p, r)).unwrap_or_default();
            extra.push(format!("field of `{owner}`"));
            if let Some(f) = decl {
                let mut ev = Eval::new(p);
                if let Some(Type::Quantity(d)) = ev.resolve_type(def.module, &f.ty).as_ref().map(|t| t.strip_optional())
                {
                    extra.push(format!("unit: {} (e.g. `1.{}`)", d.name(), crate::types::suggested_unit(*d)));
                }
            }
            if let Some((file, offset)) = at {
                if let Some((recipe, stage, field)) = recipe_field_at(a, file, offset) {
                    if let Some(v) = param_value(a, &recipe, &stage, &field) {
                        extra.push(v);
                    }
                }
            }
        }
        DefKind::Port => {
            if let Some(ItemKind::Stage(s)) = def.container.map(|r| &p.item(r).kind) {
                if let Some(port) = s.ports.iter().find(|x| x.name.span == def.span) {
                    sig = format!("{}: {}", port.name.name, type_text(p, &port.ty));
                }
                extra.push(format!("input of stage kind `{}`", s.name.name));
            }
        }
        DefKind::StageInstance => {
            let recipe = def.container.map(|r| item_name(p, r)).unwrap_or_default();
            sig = format!("{} = {}", def.name, instance_kind_text(p, def).unwrap_or_default());
            if let Some(node) = recipes_with(a, &recipe).find_map(|r| r.graph.node(&def.name)) {
                sig = format!("{}: {} -> {}", def.name, node.kind, node.output.map(|o| o.name()).unwrap_or("()"));
                extra.push(format!("declared in `{}`", node.kind_path));
                let mut lines = Vec::new();
                for (k, prm) in &node.params {
                    lines.push(format!("{k} = {}{}", prm.value, if prm.defaulted { "   (default)" } else { "" }));
                }
                if !lines.is_empty() {
                    extra.push(format!("```miles\n{}\n```", lines.join("\n")));
                }
            }
        }
        DefKind::Setting => {
            let recipe = def.container.map(|r| item_name(p, r)).unwrap_or_default();
            sig = format!("{} (recipe setting)", def.name);
            if let Some(s) = settings_schema(p) {
                if let Some(f) = decl_fields(p, s).iter().find(|f| f.name.name == def.name) {
                    sig = field_signature(p, f);
                    if let Some(d) = &f.doc {
                        extra.push(d.text.clone());
                    }
                }
            }
            if let Some(r) = recipes_with(a, &recipe).next() {
                if let Some(v) = r.settings.as_record().and_then(|rec| rec.get(&def.name)) {
                    extra.push(format!("value: `{v}`"));
                }
            }
        }
        DefKind::Module => sig = format!("module {}", def.name),
    }
    let mut md = format!("```miles\n{sig}\n```");
    let mut body = Vec::new();
    if let Some(d) = &def.doc {
        body.push(d.clone());
    }
    body.extend(extra);
    body.push(format!("*{module_key}*"));
    md.push_str("\n---\n");
    md.push_str(&body.join("\n\n"));
    md
}

fn recipes_with<'a>(a: &'a Analysis, name: &str) -> std::vec::IntoIter<&'a crate::CompiledRecipe> {
    a.compilation.recipes.iter().filter(|r| r.name == name).collect::<Vec<_>>().into_iter()
}

fn instance_kind_text(p: &Program, def: &Def) -> Option<String> {
    let ItemKind::Recipe(r) = &p.item(def.container?).kind else { return None };
    let b = r.bindings.iter().find(|b| b.path.segments.len() == 1 && b.path.segments[0].span == def.span)?;
    let (callee, _, _) = stage_call(&b.value)?;
    Some(span_text(p, callee.span).to_string())
}

/// The (recipe, stage instance, field) a cursor in a recipe body is on, for values.
fn recipe_field_at(a: &Analysis, file: FileId, offset: usize) -> Option<(String, String, String)> {
    let m = a.module_of_file(file)?;
    for item in &a.program().module(m).ast.items {
        let ItemKind::Recipe(r) = &item.kind else { continue };
        if !item.span.contains(offset) {
            continue;
        }
        for b in &r.bindings {
            if !b.span.contains(offset) {
                continue;
            }
            let segs = &b.path.segments;
            if segs.len() >= 2 && segs[1].span.contains(offset) {
                return Some((r.name.name.clone(), segs[0].name.clone(), segs[1].name.clone()));
            }
            if let (Some(first), Some((_, _, fields))) = (segs.first(), stage_call(&b.value)) {
                for f in fields {
                    if let Some(fid) = f.path.segments.first() {
                        if fid.span.contains(offset) {
                            return Some((r.name.name.clone(), first.name.clone(), fid.name.clone()));
                        }
                    }
                }
            }
        }
    }
    None
}

fn param_value(a: &Analysis, recipe: &str, stage: &str, field: &str) -> Option<String> {
    let r = a.compilation.recipe(recipe)?;
    let prm = r.graph.node(stage)?.params.get(field)?;
    Some(format!("value: `{}`{}", prm.value, if prm.defaulted { " (default)" } else { "" }))
}

fn item_name(p: &Program, r: ItemRef) -> String {
    p.item(r).name().map(|n| n.name.clone()).unwrap_or_default()
}

fn enum_member_names(p: &Program, r: ItemRef) -> Vec<String> {
    match &p.item(r).kind {
        ItemKind::Enum(e) => e.members.iter().map(|m| m.name.name.clone()).collect(),
        _ => Vec::new(),
    }
}

/// Schemas declared `is` this interface, in every loaded module.
fn implementors(p: &Program, iface: ItemRef) -> Vec<String> {
    let name = item_name(p, iface);
    let mut out = Vec::new();
    for module in &p.modules {
        for item in &module.ast.items {
            if let ItemKind::Schema(s) = &item.kind {
                if s.interface.as_ref().is_some_and(|i| i.name == name) {
                    out.push(s.name.name.clone());
                }
            }
        }
    }
    out
}

fn stage_signature(p: &Program, s: &ast::StageDecl) -> String {
    let ports: Vec<String> = s.ports.iter().map(|x| format!("{}: {}", x.name.name, type_text(p, &x.ty))).collect();
    let mut sig = format!("stage {}({})", s.name.name, ports.join(", "));
    if let Some(o) = &s.output {
        sig.push_str(&format!(" -> {}", type_text(p, o)));
    }
    sig
}

fn field_signature(p: &Program, f: &ast::FieldDecl) -> String {
    let mut s = format!("{}: {}", f.name.name, type_text(p, &f.ty));
    if let Some(c) = &f.constraint {
        s.push_str(&format!(" in {}", span_text(p, c.span)));
    }
    if let Some(d) = &f.default {
        s.push_str(&format!(" = {}", span_text(p, d.span)));
    }
    s
}

fn fields_block(p: &Program, fields: &[ast::FieldDecl]) -> String {
    if fields.is_empty() {
        return " {}".into();
    }
    let lines: Vec<String> = fields.iter().map(|f| format!("    {}", field_signature(p, f))).collect();
    format!(" {{\n{}\n}}", lines.join("\n"))
}

// ---- completion --------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum CompletionKind {
    Keyword,
    Module,
    StageKind,
    Schema,
    Enum,
    EnumMember,
    Interface,
    Const,
    Field,
    Setting,
    Builtin,
    StageInstance,
    Type,
    Value,
}

#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Completion {
    pub label: String,
    pub kind: CompletionKind,
    /// One line: a type, a signature, a default.
    pub detail: Option<String>,
    pub documentation: Option<String>,
    /// Text to insert when it differs from the label (`lr = `).
    pub insert_text: Option<String>,
    /// Lower sorts first.
    pub sort: u8,
}

impl Completion {
    fn new(label: impl Into<String>, kind: CompletionKind) -> Completion {
        Completion { label: label.into(), kind, detail: None, documentation: None, insert_text: None, sort: 5 }
    }
    fn detail(mut self, d: impl Into<String>) -> Completion {
        self.detail = Some(d.into());
        self
    }
    fn doc(mut self, d: Option<String>) -> Completion {
        self.documentation = d;
        self
    }
    fn sort(mut self, s: u8) -> Completion {
        self.sort = s;
        self
    }
}

const ITEM_KEYWORDS: &[&str] =
    &["import", "const", "enum", "interface", "schema", "stage", "model", "cluster", "recipe"];
const BUILTIN_TYPES: &[&str] = &[
    "Int",
    "Float",
    "Bool",
    "String",
    "Bytes",
    "Duration",
    "Steps",
    "Tokens",
    "Bandwidth",
    "Compute",
    "Range",
    "List",
    "Map",
    "Prompts",
    "Trajectories",
    "Scores",
    "Policy",
    "Metrics",
    "Any",
];

/// Completions at a cursor. `file` must be a module of the analysis.
pub fn completions(a: &Analysis, file: FileId, offset: usize) -> Vec<Completion> {
    let Some(m) = a.module_of_file(file) else { return Vec::new() };
    let text = a.text(file);
    let offset = offset.min(text.len());
    let line_start = text[..offset].rfind('\n').map(|i| i + 1).unwrap_or(0);
    let prefix = &text[line_start..offset];
    let word_start = prefix.len() - prefix.chars().rev().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').count();
    let before = &prefix[..word_start];
    let trimmed = before.trim();
    let p = a.program();
    let mut out = Vec::new();

    // `import std/ta`: module paths; `import std/hardware { h1`: that module's names.
    if trimmed.starts_with("import ") || trimmed == "import" {
        if let Some(brace) = prefix.find('{') {
            let path = prefix["import".len() + prefix.find("import").unwrap_or(0)..brace].trim();
            let key = crate::program::resolve_import(&p.module(m).key, path);
            if let Some(t) = p.module_by_key(&key) {
                for (name, r) in sorted(&p.module(t).own) {
                    out.push(item_completion(p, name, *r));
                }
            }
            return out;
        }
        for (key, _) in STDLIB {
            if *key != "std/prelude" && *key != "std/stages" {
                out.push(Completion::new(*key, CompletionKind::Module).detail("standard library module"));
            }
        }
        return out;
    }

    // `x.`: members of a module, enum, record, or stage instance.
    if before.ends_with('.') && !before.ends_with("..") {
        let path_text: String = {
            let b = &before[..before.len() - 1];
            let start =
                b.len() - b.chars().rev().take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '.').count();
            b[start..].to_string()
        };
        return member_completions(a, m, file, offset, &path_text);
    }

    let ctx = context_at(a, m, file, offset);
    let at_name = trimmed.is_empty() || trimmed.ends_with(',') || trimmed.ends_with('{');
    match ctx {
        Ctx::Record { decl, set } if at_name => {
            for f in decl_fields(p, decl) {
                if set.contains(&f.name.name) {
                    continue;
                }
                let mut c = Completion::new(f.name.name.clone(), CompletionKind::Field)
                    .detail(field_signature(p, f))
                    .doc(doc_text(&f.doc))
                    .sort(if f.default.is_none() { 0 } else { 1 });
                c.insert_text = Some(format!("{} = ", f.name.name));
                out.push(c);
            }
            return out;
        }
        Ctx::RecipeBody { set } if at_name => {
            if let Some(s) = settings_schema(p) {
                for f in decl_fields(p, s) {
                    if set.contains(&f.name.name) || f.name.name == "cluster" {
                        continue;
                    }
                    let mut c = Completion::new(f.name.name.clone(), CompletionKind::Setting)
                        .detail(field_signature(p, f))
                        .doc(doc_text(&f.doc));
                    c.insert_text = Some(format!("{} = ", f.name.name));
                    out.push(c);
                }
            }
            return out;
        }
        Ctx::DeclBody if at_name => return out,
        Ctx::TopLevel if trimmed.is_empty() => {
            for k in ITEM_KEYWORDS {
                out.push(Completion::new(*k, CompletionKind::Keyword));
            }
            return out;
        }
        _ => {}
    }

    // A type after `name:` in a declaration.
    if matches!(ctx, Ctx::DeclBody | Ctx::TopLevel) && (trimmed.ends_with(':') || trimmed.ends_with('[')) {
        for t in BUILTIN_TYPES {
            out.push(Completion::new(*t, CompletionKind::Type).sort(1));
        }
        for (name, entry) in visible(p, m) {
            if let ScopeEntry::Item(r) = entry {
                if matches!(p.item(r).kind, ItemKind::Schema(_) | ItemKind::Enum(_) | ItemKind::Interface(_)) {
                    out.push(item_completion(p, &name, r));
                }
            }
        }
        return out;
    }

    // A value: what the field expects first, then every visible name.
    let expected = expected_type(a, m, file, offset, &ctx, trimmed);
    if let Some(t) = &expected {
        out.extend(values_of_type(a, t));
    }
    let in_recipe = matches!(ctx, Ctx::RecipeBody { .. } | Ctx::Record { .. });
    if let Some(names) = recipe_instances_at(a, m, offset) {
        for (n, kind) in names {
            out.push(Completion::new(n, CompletionKind::StageInstance).detail(kind).sort(2));
        }
    }
    for (name, entry) in visible(p, m) {
        match entry {
            ScopeEntry::Item(r) => {
                let mut c = item_completion(p, &name, r);
                if matches!(c.kind, CompletionKind::StageKind) && matches!(ctx, Ctx::RecipeBody { .. }) {
                    c.sort = 1;
                } else if matches!(c.kind, CompletionKind::StageKind) && !in_recipe {
                    c.sort = 8;
                }
                out.push(c);
            }
            ScopeEntry::Module(t) => {
                out.push(Completion::new(name, CompletionKind::Module).detail(p.module(t).key.clone()).sort(6))
            }
        }
    }
    for b in BUILTINS {
        out.push(Completion::new(*b, CompletionKind::Builtin).detail(builtin_doc(b)).sort(7));
    }
    for k in ["true", "false", "none", "if", "not"] {
        out.push(Completion::new(k, CompletionKind::Keyword).sort(9));
    }
    dedup_completions(out)
}

fn dedup_completions(mut out: Vec<Completion>) -> Vec<Completion> {
    let mut seen = std::collections::HashSet::new();
    out.retain(|c| seen.insert(c.label.clone()));
    out
}

fn sorted<V>(m: &HashMap<String, V>) -> Vec<(&String, &V)> {
    let mut v: Vec<_> = m.iter().collect();
    v.sort_by(|a, b| a.0.cmp(b.0));
    v
}

/// Names visible in a module (own, imported, prelude), sorted.
fn visible(p: &Program, m: u32) -> Vec<(String, ScopeEntry)> {
    p.visible_names(m).into_iter().filter_map(|n| p.lookup(m, &n).map(|e| (n, e))).collect()
}

fn builtin_doc(name: &str) -> &'static str {
    match name {
        "min" => "min(a, b, ...): the smallest of numbers of one unit",
        "max" => "max(a, b, ...): the largest of numbers of one unit",
        "len" => "len(x): length of a list, map or string",
        "ceil" => "ceil(x): the smallest integer not below x",
        "floor" => "floor(x): the largest integer not above x",
        "has" => "has(record, \"field\"): whether the record has the field",
        "model_of" => "model_of(stage): the model a stage runs, found upstream",
        _ => "builtin",
    }
}

fn item_completion(p: &Program, name: &str, r: ItemRef) -> Completion {
    let item = p.item(r);
    let doc = doc_text(&item.doc);
    let (kind, detail) = match &item.kind {
        ItemKind::Stage(s) => (CompletionKind::StageKind, stage_signature(p, s)),
        ItemKind::Schema(s) => (
            CompletionKind::Schema,
            match &s.interface {
                Some(i) => format!("schema {} is {}", s.name.name, i.name),
                None => format!("schema {}", s.name.name),
            },
        ),
        ItemKind::Enum(e) => (CompletionKind::Enum, format!("enum {}", e.name.name)),
        ItemKind::Interface(i) => (CompletionKind::Interface, format!("interface {}", i.name)),
        ItemKind::Const(c) => (
            CompletionKind::Const,
            match &c.ty {
                Some(t) => format!("const {}: {}", c.name.name, type_text(p, t)),
                None => format!("const {} = {}", c.name.name, short(span_text(p, c.value.span))),
            },
        ),
        ItemKind::Model(_) => (CompletionKind::Const, "model".to_string()),
        ItemKind::Cluster(_) => (CompletionKind::Const, "cluster".to_string()),
        ItemKind::Recipe(_) => (CompletionKind::Const, "recipe".to_string()),
        ItemKind::Import(_) => (CompletionKind::Module, String::new()),
    };
    Completion::new(name, kind).detail(detail).doc(doc)
}

fn short(s: &str) -> String {
    let line = s.lines().next().unwrap_or("");
    if line.len() > 40 || s.contains('\n') {
        format!("{}…", line.chars().take(40).collect::<String>())
    } else {
        line.to_string()
    }
}

fn member_completions(a: &Analysis, m: u32, file: FileId, offset: usize, path_text: &str) -> Vec<Completion> {
    let p = a.program();
    let mut out = Vec::new();
    let segs: Vec<&str> = path_text.split('.').filter(|s| !s.is_empty()).collect();
    let Some(first) = segs.first() else { return out };
    // A stage instance of the enclosing recipe (`rollout.`): its kind's fields.
    if segs.len() == 1 {
        if let Some(instances) = recipe_instances_at(a, m, offset) {
            if let Some((_, kind)) = instances.iter().find(|(n, _)| n == first) {
                if let Some(ScopeEntry::Item(r)) = p.lookup(m, kind) {
                    for f in decl_fields(p, r) {
                        out.push(
                            Completion::new(f.name.name.clone(), CompletionKind::Field)
                                .detail(field_signature(p, f))
                                .doc(doc_text(&f.doc)),
                        );
                    }
                    return out;
                }
            }
        }
        if *first == "recipe" {
            if let Some(s) = settings_schema(p) {
                for f in decl_fields(p, s) {
                    out.push(
                        Completion::new(f.name.name.clone(), CompletionKind::Setting)
                            .detail(field_signature(p, f))
                            .doc(doc_text(&f.doc)),
                    );
                }
                return out;
            }
        }
    }
    // Anything else: evaluate the path at module level.
    let mut e = Expr {
        kind: ExprKind::Name(Ident { name: first.to_string(), span: Span::new(file, 0, 0) }),
        span: Span::new(file, 0, 0),
    };
    for s in &segs[1..] {
        e = Expr {
            kind: ExprKind::Field(Box::new(e), Ident { name: s.to_string(), span: Span::new(file, 0, 0) }),
            span: Span::new(file, 0, 0),
        };
    }
    let mut ev = Eval::new(p);
    match ev.eval(&e, Env::Module(m), None) {
        Some(Value::Module(t)) => {
            for (name, r) in sorted(&p.module(t).own) {
                out.push(item_completion(p, name, *r));
            }
        }
        Some(Value::Decl(r)) => match &p.item(r).kind {
            ItemKind::Enum(en) => {
                for mem in &en.members {
                    out.push(
                        Completion::new(mem.name.name.clone(), CompletionKind::EnumMember)
                            .detail(format!("{}.{}", en.name.name, mem.name.name))
                            .doc(doc_text(&mem.doc)),
                    );
                }
            }
            ItemKind::Schema(_) | ItemKind::Stage(_) => {
                for f in decl_fields(p, r) {
                    out.push(
                        Completion::new(f.name.name.clone(), CompletionKind::Field)
                            .detail(field_signature(p, f))
                            .doc(doc_text(&f.doc)),
                    );
                }
            }
            _ => {}
        },
        Some(Value::Record(rec)) => {
            for f in decl_fields(p, rec.schema) {
                let mut c = Completion::new(f.name.name.clone(), CompletionKind::Field)
                    .detail(field_signature(p, f))
                    .doc(doc_text(&f.doc));
                if let Some(v) = rec.get(&f.name.name) {
                    c.detail = Some(format!("{} = {v}", f.name.name));
                }
                out.push(c);
            }
        }
        _ => {}
    }
    out
}

/// Where a cursor sits, structurally.
#[derive(Debug)]
enum Ctx {
    TopLevel,
    /// Inside a schema or stage kind's declaration block.
    DeclBody,
    /// Inside a recipe body, outside any binding's record; `set` = names bound already.
    RecipeBody {
        set: Vec<String>,
    },
    /// Inside a record or stage block of `decl` (a schema or stage kind); `set` = fields set.
    Record {
        decl: ItemRef,
        set: Vec<String>,
    },
}

fn context_at(a: &Analysis, m: u32, file: FileId, offset: usize) -> Ctx {
    let p = a.program();
    let inside = |s: Span| s.file == file && (s.start as usize) < offset && offset <= s.end as usize;
    for item in &p.module(m).ast.items {
        if !inside(item.span) && item.span.end as usize != offset {
            continue;
        }
        // The innermost record literal around the cursor.
        let mut best: Option<&Expr> = None;
        walk_item_exprs(item, &mut |e: &Expr| {
            if let ExprKind::Record { body_span, .. } = &e.kind {
                if inside(*body_span)
                    && after_open(a.text(file), *body_span, offset)
                    && best.is_none_or(|b| b.span.start <= e.span.start)
                {
                    best = Some(e);
                }
            }
        });
        if let Some(e) = best {
            if let ExprKind::Record { base, fields, .. } = &e.kind {
                let set = fields.iter().filter_map(|f| f.path.segments.first()).map(|s| s.name.clone()).collect();
                let mut ev = Eval::new(p);
                let callee = match &base.kind {
                    ExprKind::Call { callee, .. } => callee,
                    _ => base,
                };
                let decl = match ev.eval(callee, Env::Module(m), None) {
                    Some(Value::Decl(r)) => Some(r),
                    Some(Value::Record(rec)) => Some(rec.schema),
                    _ => None,
                };
                if let Some(decl) = decl {
                    return Ctx::Record { decl, set };
                }
            }
        }
        return match &item.kind {
            ItemKind::Recipe(r) if inside(r.body_span) => Ctx::RecipeBody {
                set: r.bindings.iter().filter_map(|b| b.path.segments.first()).map(|s| s.name.clone()).collect(),
            },
            ItemKind::Schema(s) if inside(s.body_span) => Ctx::DeclBody,
            ItemKind::Stage(s) if inside(s.body_span) => Ctx::DeclBody,
            _ => Ctx::TopLevel,
        };
    }
    Ctx::TopLevel
}

/// Whether `offset` is after the block's `{` (not on the callee or arguments before it).
fn after_open(text: &str, body: Span, offset: usize) -> bool {
    text.get(body.range()).and_then(|t| t.find('{')).is_some_and(|o| offset > body.start as usize + o)
}

/// Stage instances of the recipe around the cursor, with their kinds' names.
fn recipe_instances_at(a: &Analysis, m: u32, offset: usize) -> Option<Vec<(String, String)>> {
    let p = a.program();
    for item in &p.module(m).ast.items {
        let ItemKind::Recipe(r) = &item.kind else { continue };
        if !r.body_span.contains(offset) {
            continue;
        }
        let mut out = Vec::new();
        let mut chain = vec![r];
        // Inherited instances: follow `extends` within the module.
        let mut cur = r;
        while let Some(parent) = &cur.extends {
            let Some(ScopeEntry::Item(pr)) = p.lookup(m, &parent.dotted()) else { break };
            let ItemKind::Recipe(prc) = &p.item(pr).kind else { break };
            if chain.iter().any(|c| std::ptr::eq(*c, prc)) {
                break;
            }
            chain.push(prc);
            cur = prc;
        }
        for rc in chain {
            for b in &rc.bindings {
                if b.path.segments.len() == 1 {
                    if let Some((callee, _, _)) = stage_call(&b.value) {
                        out.push((b.path.segments[0].name.clone(), span_text(p, callee.span).to_string()));
                    }
                }
            }
        }
        return Some(out);
    }
    None
}

/// The declared type of the field whose value the cursor is writing (`name = $0`).
fn expected_type(a: &Analysis, m: u32, _file: FileId, _offset: usize, ctx: &Ctx, trimmed: &str) -> Option<Type> {
    let p = a.program();
    let name = trimmed.strip_suffix('=')?.trim_end();
    let name = name.rsplit(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.')).next()?;
    let decl = match ctx {
        Ctx::Record { decl, .. } => *decl,
        Ctx::RecipeBody { .. } => {
            // `train.lr = ` amends a stage field; `schedule = ` sets a setting.
            if let Some((inst, field)) = name.split_once('.') {
                let kinds = recipe_instances_at(a, m, _offset)?;
                let (_, kind) = kinds.into_iter().find(|(n, _)| n == inst)?;
                let Some(ScopeEntry::Item(r)) = p.lookup(m, &kind) else { return None };
                let f = decl_fields(p, r).iter().find(|f| f.name.name == field)?;
                return Eval::new(p).resolve_type(r.module, &f.ty);
            }
            settings_schema(p)?
        }
        _ => return None,
    };
    let f = decl_fields(p, decl).iter().find(|f| f.name.name == name)?;
    Eval::new(p).resolve_type(decl.module, &f.ty)
}

fn values_of_type(a: &Analysis, t: &Type) -> Vec<Completion> {
    let p = a.program();
    let mut out = Vec::new();
    match t {
        Type::Optional(inner) => {
            out.extend(values_of_type(a, inner));
            out.push(Completion::new("none", CompletionKind::Keyword).sort(0));
        }
        Type::Bool => {
            out.push(Completion::new("true", CompletionKind::Keyword).sort(0));
            out.push(Completion::new("false", CompletionKind::Keyword).sort(0));
        }
        Type::Enum(r, ename) => {
            if let ItemKind::Enum(en) = &p.item(*r).kind {
                for mem in &en.members {
                    out.push(
                        Completion::new(mem.name.name.clone(), CompletionKind::EnumMember)
                            .detail(format!("{ename}.{}", mem.name.name))
                            .doc(doc_text(&mem.doc))
                            .sort(0),
                    );
                }
            }
        }
        Type::Schema(_, name) => out.push(Completion::new(name.clone(), CompletionKind::Schema).sort(0)),
        Type::Interface(Iface::Decl(r, _)) => {
            for (mi, module) in p.modules.iter().enumerate() {
                for (index, item) in module.ast.items.iter().enumerate() {
                    if let ItemKind::Schema(s) = &item.kind {
                        if s.interface.as_ref().is_some_and(|i| i.name == item_name(p, *r)) {
                            let mut c =
                                item_completion(p, &s.name.name, ItemRef { module: mi as u32, index: index as u32 });
                            c.sort = 0;
                            out.push(c);
                        }
                    }
                }
            }
        }
        Type::Quantity(d) => {
            let u = crate::types::suggested_unit(*d);
            if !u.is_empty() {
                out.push(Completion::new(format!("1.{u}"), CompletionKind::Value).detail(d.name()).sort(0));
            }
        }
        _ => {}
    }
    out
}

// ---- document symbols ----------------------------------------------------------------------

#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Symbol {
    pub name: String,
    pub kind: DefKind,
    pub detail: Option<String>,
    pub span: Span,
    pub selection: Span,
    pub children: Vec<Symbol>,
}

/// The outline of a file: items with their fields, members and bindings.
pub fn document_symbols(a: &Analysis, file: FileId) -> Vec<Symbol> {
    let Some(m) = a.module_of_file(file) else { return Vec::new() };
    let p = a.program();
    let mut out = Vec::new();
    for item in &p.module(m).ast.items {
        let Some(name) = item.name() else { continue };
        let Some(def) = a.defs.at(name.span) else { continue };
        let mut children = Vec::new();
        let mut child = |id: &Ident, detail: Option<String>| {
            if let Some(d) = a.defs.at(id.span) {
                children.push(Symbol {
                    name: d.name.clone(),
                    kind: d.kind,
                    detail,
                    span: d.full_span,
                    selection: d.span,
                    children: Vec::new(),
                });
            }
        };
        let detail = match &item.kind {
            ItemKind::Enum(e) => {
                e.members.iter().for_each(|x| child(&x.name, None));
                None
            }
            ItemKind::Schema(s) => {
                s.fields.iter().for_each(|f| child(&f.name, Some(type_text(p, &f.ty))));
                s.interface.as_ref().map(|i| format!("is {}", i.name))
            }
            ItemKind::Stage(s) => {
                s.ports.iter().for_each(|x| child(&x.name, Some(type_text(p, &x.ty))));
                s.fields.iter().for_each(|f| child(&f.name, Some(type_text(p, &f.ty))));
                s.output.as_ref().map(|o| format!("-> {}", type_text(p, o)))
            }
            ItemKind::Recipe(r) => {
                for b in &r.bindings {
                    if b.path.segments.len() == 1 {
                        let d = stage_call(&b.value).map(|(c, _, _)| span_text(p, c.span).to_string());
                        child(&b.path.segments[0], d);
                    }
                }
                r.extends.as_ref().map(|e| format!("extends {}", e.dotted()))
            }
            ItemKind::Const(c) => c.ty.as_ref().map(|t| type_text(p, t)),
            _ => None,
        };
        out.push(Symbol {
            name: def.name.clone(),
            kind: def.kind,
            detail,
            span: item.span,
            selection: name.span,
            children,
        });
    }
    out
}

// ---- semantic tokens -----------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum TokenKind {
    Keyword,
    Comment,
    DocComment,
    String,
    Number,
    /// The unit of a quantity (`GB` in `80.GB`).
    Unit,
    Namespace,
    Type,
    Enum,
    EnumMember,
    Interface,
    /// A stage kind.
    Function,
    Property,
    Parameter,
    Variable,
    Operator,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Token {
    pub start: u32,
    pub len: u32,
    pub kind: TokenKind,
    pub declaration: bool,
    /// Declared in the standard library.
    pub std: bool,
}

/// Tokens of a whole file, in order, never overlapping. A lexical scan, so it works on any
/// text; names are classified by what they resolve to.
pub fn semantic_tokens(a: &Analysis, file: FileId) -> Vec<Token> {
    let text = a.text(file);
    let p = a.program();
    let use_to_def: HashMap<(u32, u32), Span> =
        a.refs.iter().filter(|(u, _)| u.file == file).map(|(u, d)| ((u.start, u.end), *d)).collect();
    let import_names: Vec<Span> = a
        .module_of_file(file)
        .map(|m| {
            p.module(m)
                .ast
                .items
                .iter()
                .filter_map(|i| match &i.kind {
                    ItemKind::Import(imp) => Some(imp.path_span),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0usize;
    let mut push = |start: usize, end: usize, kind: TokenKind, declaration: bool, std: bool| {
        out.push(Token { start: start as u32, len: (end - start) as u32, kind, declaration, std });
    };
    while i < bytes.len() {
        let c = bytes[i];
        if c == b'/' && bytes.get(i + 1) == Some(&b'/') {
            let start = i;
            while i < bytes.len() && bytes[i] != b'\n' {
                i += 1;
            }
            let doc = text[start..i].starts_with("///") && !text[start..i].starts_with("////");
            push(start, i, if doc { TokenKind::DocComment } else { TokenKind::Comment }, false, false);
        } else if c == b'"' {
            let start = i;
            i += 1;
            while i < bytes.len() && bytes[i] != b'"' && bytes[i] != b'\n' {
                i += if bytes[i] == b'\\' { 2 } else { 1 };
            }
            i = (i + 1).min(bytes.len());
            push(start, i, TokenKind::String, false, false);
        } else if import_names.iter().any(|s| s.start as usize == i) {
            let s = import_names.iter().find(|s| s.start as usize == i).copied().unwrap_or_default();
            let end = (s.end as usize).max(i + 1).min(bytes.len());
            push(i, end, TokenKind::Namespace, false, false);
            i = end;
        } else if c.is_ascii_digit() {
            let start = i;
            while i < bytes.len()
                && (bytes[i].is_ascii_alphanumeric()
                    || bytes[i] == b'_'
                    || (bytes[i] == b'.' && bytes.get(i + 1).is_some_and(|b| b.is_ascii_digit())))
            {
                // An exponent sign: `1e-6`.
                if (bytes[i] == b'e' || bytes[i] == b'E') && matches!(bytes.get(i + 1), Some(b'-') | Some(b'+')) {
                    i += 1;
                }
                i += 1;
            }
            push(start, i, TokenKind::Number, false, false);
            // `.unit` right after a number.
            if bytes.get(i) == Some(&b'.') && bytes.get(i + 1).is_some_and(|b| b.is_ascii_alphabetic()) {
                let ustart = i + 1;
                i = ustart;
                while i < bytes.len()
                    && (bytes[i].is_ascii_alphabetic()
                        || (bytes[i] == b'/' && bytes.get(i + 1).is_some_and(|b| b.is_ascii_alphabetic())))
                {
                    i += 1;
                }
                push(ustart, i, TokenKind::Unit, false, false);
            }
        } else if c.is_ascii_alphabetic() || c == b'_' {
            let start = i;
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                i += 1;
            }
            let word = &text[start..i];
            let span = Span::new(file, start, i);
            if let Some(def) = a.defs.at(span) {
                push(start, i, token_kind(def.kind), true, p.module(def.module).is_std);
            } else if let Some(d) = use_to_def.get(&(start as u32, i as u32)).and_then(|d| a.defs.at(*d)) {
                push(start, i, token_kind(d.kind), false, p.module(d.module).is_std);
            } else if KEYWORDS.contains(&word) || is_contextual_keyword(text, start, word) {
                push(start, i, TokenKind::Keyword, false, false);
            } else if BUILTINS.contains(&word) {
                push(start, i, TokenKind::Function, false, true);
            } else if Type::builtin(word).is_some() || word == "List" || word == "Map" {
                push(start, i, TokenKind::Type, false, true);
            }
        } else {
            i += 1;
        }
    }
    out
}

/// `recipe`, `model`, `cluster`, `extends`, `on`, `as`, `help`, `warn`: keywords only where an item or
/// clause starts.
fn is_contextual_keyword(text: &str, start: usize, word: &str) -> bool {
    let line_start = text[..start].rfind('\n').map(|i| i + 1).unwrap_or(0);
    let at_line_start = text[line_start..start].trim().is_empty();
    match word {
        "recipe" | "model" | "cluster" => at_line_start && start == line_start,
        "extends" | "on" => text[line_start..start].trim_start().starts_with("recipe "),
        "as" => text[line_start..start].trim_start().starts_with("import "),
        "help" => text[line_start..start].contains('"') || at_line_start,
        "warn" => at_line_start,
        _ => false,
    }
}

fn token_kind(k: DefKind) -> TokenKind {
    match k {
        DefKind::Module => TokenKind::Namespace,
        DefKind::Const | DefKind::Model | DefKind::Cluster | DefKind::StageInstance => TokenKind::Variable,
        DefKind::Enum => TokenKind::Enum,
        DefKind::EnumMember => TokenKind::EnumMember,
        DefKind::Interface => TokenKind::Interface,
        DefKind::Schema => TokenKind::Type,
        DefKind::StageKind | DefKind::Recipe => TokenKind::Function,
        DefKind::Field | DefKind::Setting => TokenKind::Property,
        DefKind::Port => TokenKind::Parameter,
    }
}

// ---- inlay hints ---------------------------------------------------------------------------

#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct InlayHint {
    /// Where the hint is drawn (after this byte).
    pub offset: u32,
    pub label: String,
    /// The full text when the label is shortened.
    pub tooltip: Option<String>,
}

/// Hints for the parameters a stage instance leaves at their defaults: one hint at the end of
/// the binding's first line, listing them with their values.
pub fn inlay_hints(a: &Analysis, file: FileId) -> Vec<InlayHint> {
    let text = a.text(file);
    let mut out: Vec<InlayHint> = Vec::new();
    for r in &a.compilation.recipes {
        for node in r.graph.nodes() {
            if node.span.file != file {
                continue;
            }
            let defaults: Vec<String> =
                node.params.iter().filter(|(_, p)| p.defaulted).map(|(k, p)| format!("{k} = {}", p.value)).collect();
            if defaults.is_empty() {
                continue;
            }
            let at = hint_offset(text, node.span);
            if out.iter().any(|h| h.offset == at as u32) {
                continue;
            }
            let full = defaults.join(", ");
            let label = if full.chars().count() > 60 {
                format!("defaults: {}…", full.chars().take(60).collect::<String>())
            } else {
                format!("defaults: {full}")
            };
            out.push(InlayHint { offset: at as u32, label, tooltip: Some(defaults.join("\n")) });
        }
    }
    out.sort_by_key(|h| h.offset);
    out
}

/// Where a hint about a binding goes: the end of its first line, before any trailing comment.
pub fn hint_offset(text: &str, span: Span) -> usize {
    let start = (span.start as usize).min(text.len());
    let end = text[start..].find('\n').map(|i| start + i).unwrap_or(text.len()).min(span.end as usize).max(start);
    let line = &text[start..end];
    match line.find("//") {
        Some(c) => start + line[..c].trim_end().len(),
        None => start + line.trim_end().len(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::MemoryFs;

    #[test]
    fn identifiers() {
        assert!(is_identifier("train_2"));
        assert!(!is_identifier("2train"));
        assert!(!is_identifier("check"));
    }

    #[test]
    fn resolves_a_stage_field_in_a_broken_file() {
        let src = "recipe r {\n    train = grpo(x, y) { lr = 1e-4 }\n}\nconst = \n";
        let fs = MemoryFs::with(&[("a.miles", src)]);
        let c = crate::compile(&fs, &["a.miles".into()], &Default::default());
        let a = Analysis::new(c);
        let f = a.file_id("a.miles").unwrap_or_default();
        let at = src.find("lr").unwrap_or(0);
        let (_, def) = a.resolve(f, at).expect("lr resolves");
        assert_eq!(def.kind, DefKind::Field);
    }
}
