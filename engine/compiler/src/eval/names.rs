//! Names: types written in declarations, scopes (record, stage instance, recipe, module), and
//! enum members written bare.

use super::{Builtin, Env, Eval, R};
use crate::program::{Program, ScopeEntry};
use crate::suggest::did_you_mean;
use crate::types::{Iface, Type};
use crate::value::{ItemRef, Value};
use miles_grammar::ast::{self, ItemKind, TypeExpr, TypeExprKind};
use miles_grammar::diag::Diagnostic;
use miles_grammar::diag::ErrorCode;

/// The enum member a bare name denotes in `module` (`placement = colocated`), when no enum type
/// is expected to say which: the enums declared in the module itself and in the modules every
/// module sees (the prelude and `std/stages`) are searched, and exactly one of them may have the
/// member. Imported modules are not searched: a member of an imported enum is written
/// `Enum.member` (or bare where its enum is the expected type).
pub fn bare_enum_member<'p>(program: &'p Program, module: u32, name: &str) -> Option<(ItemRef, &'p ast::EnumMember)> {
    let mut found = None;
    let mut mods = vec![module];
    mods.extend(program.module(module).fallbacks.iter().copied());
    for m in mods {
        for (index, item) in program.module(m).ast.items.iter().enumerate() {
            let ItemKind::Enum(en) = &item.kind else { continue };
            if let Some(member) = en.members.iter().find(|x| x.name.name == name) {
                if found.is_some() {
                    return None;
                }
                found = Some((ItemRef { module: m, index: index as u32 }, member));
            }
        }
    }
    found
}

impl<'p> Eval<'p> {
    pub fn resolve_type(&mut self, module: u32, t: &TypeExpr) -> R<Type> {
        match &t.kind {
            TypeExprKind::Optional(inner) => Some(Type::Optional(Box::new(self.resolve_type(module, inner)?))),
            TypeExprKind::Generic(name, args) => match (name.name.as_str(), args.len()) {
                ("List", 1) => Some(Type::List(Box::new(self.resolve_type(module, &args[0])?))),
                ("Map", 2) => Some(Type::Map(Box::new(self.resolve_type(module, &args[1])?))),
                _ => {
                    self.report(
                        Diagnostic::error(
                            ErrorCode::E0201,
                            format!("unknown generic type `{}` with {} arguments", name.name, args.len()),
                        )
                        .with_primary(t.span, "here")
                        .with_help("generic types are `List[T]` and `Map[String, T]`"),
                    );
                    None
                }
            },
            TypeExprKind::Named(path) => {
                let segs: Vec<&str> = path.segments.iter().map(|s| s.name.as_str()).collect();
                if segs.len() == 1 {
                    if let Some(b) = Type::builtin(segs[0]) {
                        return Some(b);
                    }
                }
                let target = self.resolve_path_decl(module, path)?;
                let name = self.decl_name(target);
                match &self.program.item(target).kind {
                    ItemKind::Enum(_) => Some(Type::Enum(target, name)),
                    ItemKind::Schema(_) => Some(Type::Schema(target, name)),
                    ItemKind::Interface(_) => Some(Type::Interface(Iface::Decl(target, name))),
                    _ => {
                        self.report(
                            Diagnostic::error(ErrorCode::E0201, format!("`{}` is not a type", path.dotted()))
                                .with_primary(path.span, "a value, not a type"),
                        );
                        None
                    }
                }
            }
        }
    }

    /// Resolves `name` or `module.name` to a declaration.
    fn resolve_path_decl(&mut self, module: u32, path: &ast::Path) -> R<ItemRef> {
        let first = path.segments.first()?;
        let mut entry = match self.program.lookup(module, &first.name) {
            Some(e) => e,
            None => {
                self.unknown_name(module, first, "type");
                return None;
            }
        };
        for seg in &path.segments[1..] {
            match entry {
                ScopeEntry::Module(m) => match self.program.module(m).own.get(&seg.name) {
                    Some(r) => entry = ScopeEntry::Item(*r),
                    None => {
                        self.not_member(m, seg);
                        return None;
                    }
                },
                ScopeEntry::Item(_) => {
                    self.report(
                        Diagnostic::error(ErrorCode::E0201, "not a module")
                            .with_primary(seg.span, "cannot look this up"),
                    );
                    return None;
                }
            }
        }
        match entry {
            ScopeEntry::Item(r) => {
                if let Some(n) = self.program.item(r).name() {
                    self.references.push((path.segments.last().map(|s| s.span).unwrap_or(path.span), n.span));
                }
                Some(r)
            }
            ScopeEntry::Module(_) => {
                self.report(
                    Diagnostic::error(ErrorCode::E0201, "a module is not a type").with_primary(path.span, "here"),
                );
                None
            }
        }
    }

    fn unknown_name(&mut self, module: u32, id: &ast::Ident, what: &str) {
        let mut candidates = self.program.visible_names(module);
        candidates.extend(Builtin::all().map(|b| b.name().to_string()));
        if let Some(r) = &self.recipe {
            candidates.extend(r.by_name.keys().cloned());
            candidates.extend(r.settings_exprs.keys().cloned());
        }
        let mut d = Diagnostic::error(ErrorCode::E0103, format!("unknown {what} `{}`", id.name))
            .with_primary(id.span, "not found in this scope");
        if let Some(s) = did_you_mean(&id.name, candidates.iter().map(|s| s.as_str())) {
            d = d.with_help(format!("did you mean `{s}`?")).with_fix(format!("replace with `{s}`"), id.span, s);
        } else {
            d = d.with_help("declare it, import the module that declares it, or bind it in the recipe");
        }
        self.report(d);
    }

    pub(super) fn not_member(&mut self, m: u32, seg: &ast::Ident) {
        let key = self.program.module(m).key.clone();
        let names: Vec<String> = self.program.module(m).own.keys().cloned().collect();
        let mut d = Diagnostic::error(ErrorCode::E0107, format!("module `{key}` has no `{}`", seg.name))
            .with_primary(seg.span, "not declared there");
        if let Some(s) = did_you_mean(&seg.name, names.iter().map(|s| s.as_str())) {
            d = d.with_help(format!("did you mean `{s}`?")).with_fix(format!("replace with `{s}`"), seg.span, s);
        }
        self.report(d);
    }

    pub(super) fn lookup_name(&mut self, id: &ast::Ident, env: Env, expected: Option<&Type>) -> R<Value> {
        // An enum member named where that enum is expected (`precision = bf16`).
        if let Some(Type::Enum(e, ename)) = expected.map(|t| t.strip_optional()) {
            if self.enum_has(*e, &id.name) {
                return Some(Value::Enum { decl: *e, ty: ename.clone(), member: id.name.clone() });
            }
        }
        match env {
            Env::Record(f) => {
                let schema = self.frames[f].schema;
                if self.decl_field(schema, &id.name).is_some() {
                    return self.frame_field(f, &id.name, id.span);
                }
                self.lookup_name(id, Env::Module(schema.module), expected)
            }
            Env::Instance(i) => {
                let kind = self.recipe.as_ref()?.instances[i].kind;
                if let Some(v) = self.instance_member(i, &id.name) {
                    return v;
                }
                if self.port_names(kind).iter().any(|p| p == &id.name) {
                    // A declared port with no argument (`arrow_to` of weights, say).
                    if let Some((v, _)) = self.recipe.as_ref()?.instances[i].arrow_to.clone() {
                        return Some(v);
                    }
                    // Its argument did not evaluate (already reported): stay silent.
                    return None;
                }
                if id.name == "recipe" {
                    return self.recipe_settings();
                }
                self.lookup_name(id, Env::Module(kind.module), expected)
            }
            Env::Recipe(m) => {
                // A stage binding can only be what a port (or nothing in particular) expects:
                // `schedule = sync` names the schema even when a stage is called `sync`.
                let stage_fits = expected.is_none_or(|t| {
                    matches!(t.strip_optional(), Type::Any | Type::Port(_) | Type::Interface(Iface::Port(_)))
                });
                if let Some(r) = self.recipe.as_ref().filter(|_| stage_fits) {
                    if let Some(&i) = r.by_name.get(&id.name) {
                        let def = r.instances[i].name_span;
                        self.references.push((id.span, def));
                        return Some(Value::Stage(id.name.clone()));
                    }
                    if r.settings_exprs.contains_key(&id.name) {
                        let def = r.settings_exprs[&id.name].2;
                        self.references.push((id.span, def));
                        let settings = self.recipe_settings()?;
                        return settings.as_record().and_then(|rec| rec.get(&id.name).cloned());
                    }
                }
                self.lookup_name(id, Env::Module(m), expected)
            }
            Env::Module(m) => match self.program.lookup(m, &id.name) {
                Some(ScopeEntry::Item(r)) => {
                    if let Some(n) = self.program.item(r).name() {
                        self.references.push((id.span, n.span));
                    }
                    self.item_value(r)
                }
                Some(ScopeEntry::Module(t)) => Some(Value::Module(t)),
                None => {
                    if let Some(b) = Builtin::from_name(&id.name) {
                        return Some(Value::Builtin(b));
                    }
                    if let Some((decl, member)) = bare_enum_member(self.program, m, &id.name) {
                        return Some(Value::Enum { decl, ty: self.decl_name(decl), member: member.name.name.clone() });
                    }
                    if let Some(Type::Enum(e, ename)) = expected.map(|t| t.strip_optional()) {
                        let members = self.enum_members(*e);
                        let mut d = Diagnostic::error(
                            ErrorCode::E0109,
                            format!("`{}` is not a member of enum `{ename}`", id.name),
                        )
                        .with_primary(id.span, "unknown member");
                        if let Some(s) = did_you_mean(&id.name, members.iter().map(|s| s.as_str())) {
                            d = d.with_help(format!("did you mean `{s}`? members: {}", members.join(", "))).with_fix(
                                format!("replace with `{s}`"),
                                id.span,
                                s,
                            );
                        } else {
                            d = d.with_help(format!("members: {}", members.join(", ")));
                        }
                        self.report(d);
                        return None;
                    }
                    self.unknown_name(m, id, "name");
                    None
                }
            },
        }
    }

    /// The head of `NAME { ... }`. A stage never takes a block, so there a stage binding does not
    /// hide a schema of the same name: `schedule = sync { }` names the schema `sync` in a recipe
    /// with a stage bound to `sync` (issue #42). Kinds resolve in their own namespace where the
    /// grammar says a kind is meant; a record-valued setting or field still takes the block (a copy).
    pub(super) fn block_head(&mut self, id: &ast::Ident, env: Env) -> R<Value> {
        if let Env::Recipe(m) = env {
            let is_stage = self.recipe.as_ref().is_some_and(|r| r.by_name.contains_key(&id.name));
            let schema = match self.program.lookup(m, &id.name) {
                Some(ScopeEntry::Item(r)) => self.is_schema(r),
                _ => false,
            };
            if is_stage && schema {
                return self.lookup_name(id, Env::Module(m), None);
            }
        }
        self.lookup_name(id, env, None)
    }

    /// `NAME.field` where `NAME` is both a stage of the recipe and a module imported beside it,
    /// and the stage has no such field while the module has the member: the stage hides the module
    /// here, which is reported with both places (E0105) instead of a bare "no field". True when
    /// reported.
    pub(super) fn stage_hides_module(&mut self, id: &ast::Ident, field: &ast::Ident, env: Env) -> bool {
        let Env::Recipe(m) = env else { return false };
        let Some(r) = self.recipe.as_ref() else { return false };
        let Some(&i) = r.by_name.get(&id.name) else { return false };
        let (stage_span, kind) = (r.instances[i].name_span, r.instances[i].kind);
        let Some(ScopeEntry::Module(t)) = self.program.lookup(m, &id.name) else { return false };
        let stage_has = self.decl_field(kind, &field.name).is_some() || self.port_names(kind).contains(&field.name);
        if stage_has || !self.program.module(t).own.contains_key(&field.name) {
            return false;
        }
        let import = self.program.module(m).ast.items.iter().find_map(|item| match &item.kind {
            ItemKind::Import(imp) => {
                let bound = imp.alias.as_ref().map(|a| a.name.as_str()).or(imp.path.rsplit('/').next());
                (bound == Some(id.name.as_str())).then_some(imp.path_span)
            }
            _ => None,
        });
        let mut d = Diagnostic::error(
            ErrorCode::E0105,
            format!("`{}` here is the stage of that name, which hides the imported module `{}`", id.name, id.name),
        )
        .with_primary(field.span, format!("the stage `{}` has no field `{}`", id.name, field.name))
        .with_secondary(stage_span, format!("the stage `{}` is bound here", id.name));
        if let Some(span) = import {
            d = d.with_secondary(span, format!("the module `{}` is imported here", id.name));
        }
        self.report(d.with_help(format!(
            "rename the stage (`{0}_reward = ...`) or import the module under another name (`import ... as {0}_tasks`)",
            id.name
        )));
        true
    }

    pub fn enum_members(&self, e: ItemRef) -> Vec<String> {
        match &self.program.item(e).kind {
            ItemKind::Enum(en) => en.members.iter().map(|m| m.name.name.clone()).collect(),
            _ => Vec::new(),
        }
    }

    pub(super) fn enum_has(&self, e: ItemRef, member: &str) -> bool {
        match &self.program.item(e).kind {
            ItemKind::Enum(en) => en.members.iter().any(|m| m.name.name == member),
            _ => false,
        }
    }
}
