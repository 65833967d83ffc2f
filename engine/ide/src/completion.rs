//! Completion: what fits at the cursor, from the structure around it (a record's unset fields,
//! recipe settings, a module's or enum's members, values of the expected type) and every
//! visible name.

use crate::analysis::{decl_fields, settings_schema, Analysis};
use crate::defs::{doc_text, stage_call};
use crate::hover::{field_signature, item_name, stage_signature};
use crate::syntax::{span_text, type_text, walk_item_exprs};
use miles_compiler::eval::{Builtin, Env, Eval};
use miles_compiler::program::{Program, ScopeEntry, STDLIB};
use miles_compiler::types::{Iface, Type};
use miles_compiler::value::{ItemRef, Value};
use miles_grammar::ast::{Expr, ExprKind, Ident, ItemKind};
use miles_grammar::diag::{FileId, Span};
use std::collections::HashMap;

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

use miles_grammar::ITEM_KEYWORDS;
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
            if let Some(t) = p.import_key(&p.module(m).key, path).and_then(|k| p.module_by_key(&k)) {
                for (name, r) in sorted(&p.module(t).own) {
                    out.push(item_completion(p, name, *r));
                }
            }
            return out;
        }
        // In a package: the modules of the packages this one declares (`platform/grpo/base`).
        if let Some(owner) = p.packages.owner(&p.module(m).key) {
            for dep in owner.dependencies.iter().filter_map(|d| p.packages.get(d)) {
                for module in &dep.modules {
                    out.push(
                        Completion::new(format!("{}/{module}", dep.name), CompletionKind::Module)
                            .detail(format!("module of package `{}`", dep.name))
                            .sort(4),
                    );
                }
            }
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
    for b in Builtin::all() {
        out.push(Completion::new(b.name(), CompletionKind::Builtin).detail(b.detail()).sort(7));
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
            let u = miles_compiler::types::suggested_unit(*d);
            if !u.is_empty() {
                out.push(Completion::new(format!("1.{u}"), CompletionKind::Value).detail(d.name()).sort(0));
            }
        }
        _ => {}
    }
    out
}

#[cfg(test)]
mod tests {
    use crate::fixture::{after_a_syntax_error, at_cursor, recipe};
    use insta::assert_snapshot;

    /// One line per item, in the order an editor shows them: `label (kind sort)  detail`.
    fn check(fixture: &str) -> String {
        let (a, file, offset) = at_cursor(fixture);
        let mut items = super::completions(&a, file, offset);
        items.sort_by(|x, y| (x.sort, &x.label).cmp(&(y.sort, &y.label)));
        items
            .iter()
            .map(|c| {
                format!(
                    "{} ({:?} {}){}\n",
                    c.label,
                    c.kind,
                    c.sort,
                    c.detail.as_ref().map(|d| format!("  {d}")).unwrap_or_default()
                )
            })
            .collect()
    }

    #[test]
    fn stage_parameters() {
        assert_snapshot!(check(&recipe("$0")));
    }

    #[test]
    fn enum_members_for_a_field_come_first() {
        let text = check(&recipe("aggregation = $0"));
        // The enum's four members, then the rest.
        let head: String = text.lines().take(5).map(|l| format!("{l}\n")).collect();
        assert_snapshot!(head, @r"
        constant (EnumMember 0)  Aggregation.constant
        micro_token (EnumMember 0)  Aggregation.micro_token
        sequence (EnumMember 0)  Aggregation.sequence
        token (EnumMember 0)  Aggregation.token
        reward (StageInstance 2)  exact_match
        ");
    }

    #[test]
    fn import_paths() {
        assert_snapshot!(check("import std/$0\n"));
    }

    /// In a package, `import ` offers the declared dependencies' modules; `{` their names.
    #[test]
    fn package_module_paths() {
        let deps = crate::fixture::packages(&["clusters", "grpo/base"]);
        let fixture = "//- team/main.miles\nimport platform/$0\n//- deps/platform/grpo/base.miles\nconst lr = 1e-4\n";
        let (a, file, offset) = crate::fixture::at_cursor_in(fixture, &deps);
        let mut items = super::completions(&a, file, offset);
        items.retain(|c| c.sort == 4);
        let shown: Vec<String> = items.iter().map(|c| format!("{} {:?}", c.label, c.detail)).collect();
        assert_eq!(
            shown,
            [
                "platform/clusters Some(\"module of package `platform`\")",
                "platform/grpo/base Some(\"module of package `platform`\")"
            ]
        );
        let fixture = "//- team/main.miles\nimport platform/grpo/base { $0 }\n//- deps/platform/grpo/base.miles\nconst lr = 1e-4\n";
        let (a, file, offset) = crate::fixture::at_cursor_in(fixture, &deps);
        let labels: Vec<String> = super::completions(&a, file, offset).into_iter().map(|c| c.label).collect();
        assert_eq!(labels, ["lr"]);
    }

    #[test]
    fn module_members() {
        assert_snapshot!(check(&recipe("").replace("vocab = arith.vocab", "vocab = arith.$0")));
    }

    #[test]
    fn recipe_settings() {
        assert_snapshot!(check(&recipe("").replace("    stop = 100.steps\n", "    $0\n")));
    }

    #[test]
    fn stage_kinds_in_a_recipe_body() {
        let text = check(&recipe("").replace("    stop = 100.steps\n", "    eval = ev$0\n"));
        assert!(text.lines().any(|l| l.starts_with("evaluate (StageKind 1)")), "stage kinds offered:\n{text}");
    }

    #[test]
    fn survives_a_syntax_error_elsewhere() {
        assert_snapshot!(check(&after_a_syntax_error("const s = lr_schedule { $0 }")));
    }
}
