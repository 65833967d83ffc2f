//! Compile-time evaluation: names, types, units, records, stage instances and checks.
//!
//! Evaluation is lazy and memoised (a default may refer to another field, a check to a field of
//! another stage), and total: there are no user functions, loops or recursion, and reference
//! cycles are reported (E0206) instead of followed.

use crate::num::{unit, Dim, Q, UNIT_NAMES};
use crate::program::{Program, ScopeEntry};
use crate::suggest::did_you_mean;
use crate::types::{suggested_unit, Iface, Type};
use crate::value::{FieldValue, ItemRef, PortKind, Record, Value};
use miles_grammar::ast::{self, BinOp, Expr, ExprKind, FieldDecl, ItemKind, TypeExpr, TypeExprKind, UnOp};
use miles_grammar::diag::{Diagnostic, Span};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

pub const BUILTINS: &[&str] = &["min", "max", "len", "ceil", "floor", "model_of", "has"];

/// Where names are looked up.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Env {
    /// Top level of a module.
    Module(u32),
    /// Inside a schema: defaults and checks of the record being built (frame index).
    Record(usize),
    /// Inside a recipe body (the module whose text is being evaluated).
    Recipe(u32),
    /// Inside a stage kind: defaults and checks of stage instance `usize` of the recipe.
    Instance(usize),
}

/// A record under construction: provided fields are evaluated, defaults on demand.
struct Frame {
    schema: ItemRef,
    provided: BTreeMap<String, FieldValue>,
    computed: BTreeMap<String, Option<FieldValue>>,
    in_progress: Vec<String>,
}

/// A stage instance of the recipe being evaluated.
pub struct Instance {
    pub name: String,
    pub kind: ItemRef,
    pub binding_span: Span,
    pub name_span: Span,
    /// Port name -> argument value, with the argument's span.
    pub args: Vec<(String, Value, Span)>,
    /// `weights(train -> rollout)`: the back-edge target.
    pub arrow_to: Option<(Value, Span)>,
    /// Fields set in the recipe, still unevaluated: (expr, module whose scope it uses).
    pub provided: BTreeMap<String, (Expr, u32, Span)>,
    computed: BTreeMap<String, Option<FieldValue>>,
    in_progress: Vec<String>,
    missing_reported: bool,
}

/// The recipe being evaluated.
#[derive(Default)]
pub struct RecipeState {
    pub instances: Vec<Instance>,
    pub by_name: HashMap<String, usize>,
    /// Non-stage bindings: settings (`schedule`, `stop`, ...), unevaluated.
    pub settings_exprs: BTreeMap<String, (Expr, u32, Span)>,
    pub settings: Option<Value>,
    pub(crate) settings_in_progress: bool,
    pub module: u32,
    pub cluster: Option<Value>,
    /// The recipe's name: where recipe-level check failures point.
    pub name_span: Span,
}

pub struct Eval<'p> {
    pub program: &'p Program,
    pub diags: Vec<Diagnostic>,
    consts: HashMap<ItemRef, Option<Value>>,
    consts_in_progress: Vec<ItemRef>,
    frames: Vec<Frame>,
    pub recipe: Option<RecipeState>,
    /// While set, diagnostics are dropped (used to show values in check failures).
    quiet: u32,
    /// Every named reference resolved, for the language server (use span -> definition span).
    pub references: Vec<(Span, Span)>,
}

type R<T> = Option<T>;

impl<'p> Eval<'p> {
    pub fn is_port_name(n: &str) -> bool {
        PortKind::from_name(n).is_some()
    }

    pub fn new(program: &'p Program) -> Eval<'p> {
        Eval {
            program,
            diags: Vec::new(),
            consts: HashMap::new(),
            consts_in_progress: Vec::new(),
            frames: Vec::new(),
            recipe: None,
            quiet: 0,
            references: Vec::new(),
        }
    }

    pub fn report(&mut self, d: Diagnostic) {
        if self.quiet == 0 {
            self.diags.push(d);
        }
    }

    // ---- declarations -------------------------------------------------------------------

    pub fn decl_fields(&self, r: ItemRef) -> &'p [FieldDecl] {
        match &self.program.item(r).kind {
            ItemKind::Schema(s) => &s.fields,
            ItemKind::Stage(s) => &s.fields,
            _ => &[],
        }
    }

    fn decl_checks(&self, r: ItemRef) -> &'p [ast::Check] {
        match &self.program.item(r).kind {
            ItemKind::Schema(s) => &s.checks,
            ItemKind::Stage(s) => &s.checks,
            _ => &[],
        }
    }

    pub fn decl_name(&self, r: ItemRef) -> String {
        self.program.item(r).name().map(|n| n.name.clone()).unwrap_or_default()
    }

    /// `std/stages.grpo`: how a rule's home is named in diagnostics.
    pub fn decl_path(&self, r: ItemRef) -> String {
        let m = self.program.module(r.module);
        format!("{}.{}", m.key.trim_end_matches(".miles"), self.decl_name(r))
    }

    pub fn resolve_type(&mut self, module: u32, t: &TypeExpr) -> R<Type> {
        match &t.kind {
            TypeExprKind::Optional(inner) => Some(Type::Optional(Box::new(self.resolve_type(module, inner)?))),
            TypeExprKind::Generic(name, args) => match (name.name.as_str(), args.len()) {
                ("List", 1) => Some(Type::List(Box::new(self.resolve_type(module, &args[0])?))),
                ("Map", 2) => Some(Type::Map(Box::new(self.resolve_type(module, &args[1])?))),
                _ => {
                    self.report(
                        Diagnostic::error(
                            "E0201",
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
                            Diagnostic::error("E0201", format!("`{}` is not a type", path.dotted()))
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
                        Diagnostic::error("E0201", "not a module").with_primary(seg.span, "cannot look this up"),
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
                self.report(Diagnostic::error("E0201", "a module is not a type").with_primary(path.span, "here"));
                None
            }
        }
    }

    fn unknown_name(&mut self, module: u32, id: &ast::Ident, what: &str) {
        let mut candidates = self.program.visible_names(module);
        candidates.extend(BUILTINS.iter().map(|s| s.to_string()));
        if let Some(r) = &self.recipe {
            candidates.extend(r.by_name.keys().cloned());
            candidates.extend(r.settings_exprs.keys().cloned());
        }
        let mut d = Diagnostic::error("E0103", format!("unknown {what} `{}`", id.name))
            .with_primary(id.span, "not found in this scope");
        if let Some(s) = did_you_mean(&id.name, candidates.iter().map(|s| s.as_str())) {
            d = d.with_help(format!("did you mean `{s}`?")).with_fix(format!("replace with `{s}`"), id.span, s);
        } else {
            d = d.with_help("declare it, import the module that declares it, or bind it in the recipe");
        }
        self.report(d);
    }

    fn not_member(&mut self, m: u32, seg: &ast::Ident) {
        let key = self.program.module(m).key.clone();
        let names: Vec<String> = self.program.module(m).own.keys().cloned().collect();
        let mut d = Diagnostic::error("E0107", format!("module `{key}` has no `{}`", seg.name))
            .with_primary(seg.span, "not declared there");
        if let Some(s) = did_you_mean(&seg.name, names.iter().map(|s| s.as_str())) {
            d = d.with_help(format!("did you mean `{s}`?")).with_fix(format!("replace with `{s}`"), seg.span, s);
        }
        self.report(d);
    }

    // ---- items ---------------------------------------------------------------------------

    /// The value of a module-level item: constants, models and clusters are evaluated (once),
    /// other declarations are values that name them.
    pub fn item_value(&mut self, r: ItemRef) -> R<Value> {
        let item = self.program.item(r);
        let (value_expr, ty) = match &item.kind {
            ItemKind::Const(c) => (&c.value, c.ty.as_ref()),
            ItemKind::Model(nv) | ItemKind::Cluster(nv) => (&nv.value, None),
            _ => return Some(Value::Decl(r)),
        };
        if let Some(v) = self.consts.get(&r) {
            return v.clone();
        }
        if let Some(pos) = self.consts_in_progress.iter().position(|x| *x == r) {
            let mut names: Vec<String> = self.consts_in_progress[pos..].iter().map(|x| self.decl_name(*x)).collect();
            names.push(self.decl_name(r));
            let span = item.name().map(|n| n.span).unwrap_or(item.span);
            self.report(
                Diagnostic::error(
                    "E0206",
                    format!("`{}` is defined in terms of itself: {}", self.decl_name(r), names.join(" -> ")),
                )
                .with_primary(span, "recursive definition")
                .with_help("break the cycle: one of these must be given a value directly"),
            );
            return None;
        }
        self.consts_in_progress.push(r);
        let expected = match (&item.kind, ty) {
            (_, Some(t)) => self.resolve_type(r.module, t),
            (ItemKind::Model(_), _) => self.named_interface("Model"),
            (ItemKind::Cluster(_), _) => self.named_interface("Cluster"),
            _ => None,
        };
        let v = self.eval(value_expr, Env::Module(r.module), expected.as_ref());
        let v = match (v, expected) {
            (Some(v), Some(t)) => self.coerce(v, &t, value_expr.span),
            (v, _) => v,
        };
        self.consts_in_progress.pop();
        self.consts.insert(r, v.clone());
        v
    }

    /// A prelude interface by name (`Model`, `Cluster`), if the prelude declares it.
    pub fn named_interface(&self, name: &str) -> Option<Type> {
        for p in crate::program::PRELUDE {
            if let Some(m) = self.program.module_by_key(p) {
                if let Some(r) = self.program.module(m).own.get(name) {
                    if matches!(self.program.item(*r).kind, ItemKind::Interface(_)) {
                        return Some(Type::Interface(Iface::Decl(*r, name.to_string())));
                    }
                }
            }
        }
        None
    }

    pub fn prelude_decl(&self, name: &str) -> Option<ItemRef> {
        for p in crate::program::PRELUDE {
            if let Some(m) = self.program.module_by_key(p) {
                if let Some(r) = self.program.module(m).own.get(name) {
                    return Some(*r);
                }
            }
        }
        None
    }

    // ---- names ---------------------------------------------------------------------------

    fn lookup_name(&mut self, id: &ast::Ident, env: Env, expected: Option<&Type>) -> R<Value> {
        // An enum member named where that enum is expected (`precision = bf16`).
        if let Some(Type::Enum(e, ename)) = expected.map(|t| t.strip_optional()) {
            if self.enum_has(*e, &id.name) {
                return Some(Value::Enum { decl: *e, ty: ename.clone(), member: id.name.clone() });
            }
        }
        match env {
            Env::Record(f) => {
                let schema = self.frames[f].schema;
                if self.decl_fields(schema).iter().any(|d| d.name.name == id.name) {
                    return self.frame_field(f, &id.name, id.span);
                }
                self.lookup_name(id, Env::Module(schema.module), expected)
            }
            Env::Instance(i) => {
                let (kind, module) = {
                    let inst = &self.recipe.as_ref()?.instances[i];
                    (inst.kind, inst.kind.module)
                };
                if self.decl_fields(kind).iter().any(|d| d.name.name == id.name) {
                    return self.instance_field(i, &id.name);
                }
                let arg = self.recipe.as_ref()?.instances[i]
                    .args
                    .iter()
                    .find(|(p, _, _)| *p == id.name)
                    .map(|(_, v, _)| v.clone());
                if let Some(v) = arg {
                    return Some(v);
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
                self.lookup_name(id, Env::Module(module), expected)
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
            Env::Module(m) => {
                match self.program.lookup(m, &id.name) {
                    Some(ScopeEntry::Item(r)) => {
                        if let Some(n) = self.program.item(r).name() {
                            self.references.push((id.span, n.span));
                        }
                        self.item_value(r)
                    }
                    Some(ScopeEntry::Module(t)) => Some(Value::Module(t)),
                    None => {
                        if let Some(b) = BUILTINS.iter().find(|b| **b == id.name) {
                            return Some(Value::Builtin(b));
                        }
                        if let Some(v) = self.enum_member_anywhere(m, &id.name) {
                            return Some(v);
                        }
                        if let Some(Type::Enum(e, ename)) = expected.map(|t| t.strip_optional()) {
                            let members = self.enum_members(*e);
                            let mut d =
                                Diagnostic::error("E0109", format!("`{}` is not a member of enum `{ename}`", id.name))
                                    .with_primary(id.span, "unknown member");
                            if let Some(s) = did_you_mean(&id.name, members.iter().map(|s| s.as_str())) {
                                d = d
                                    .with_help(format!("did you mean `{s}`? members: {}", members.join(", ")))
                                    .with_fix(format!("replace with `{s}`"), id.span, s);
                            } else {
                                d = d.with_help(format!("members: {}", members.join(", ")));
                            }
                            self.report(d);
                            return None;
                        }
                        self.unknown_name(m, id, "name");
                        None
                    }
                }
            }
        }
    }

    pub fn enum_members(&self, e: ItemRef) -> Vec<String> {
        match &self.program.item(e).kind {
            ItemKind::Enum(en) => en.members.iter().map(|m| m.name.name.clone()).collect(),
            _ => Vec::new(),
        }
    }

    fn enum_has(&self, e: ItemRef, member: &str) -> bool {
        match &self.program.item(e).kind {
            ItemKind::Enum(en) => en.members.iter().any(|m| m.name.name == member),
            _ => false,
        }
    }

    /// A bare enum member whose enum is visible in the module, if exactly one enum has it.
    fn enum_member_anywhere(&self, module: u32, name: &str) -> Option<Value> {
        let mut found = None;
        let mut mods = vec![module];
        mods.extend(self.program.module(module).fallbacks.iter().copied());
        for m in mods {
            for (index, item) in self.program.module(m).ast.items.iter().enumerate() {
                if let ItemKind::Enum(en) = &item.kind {
                    if en.members.iter().any(|x| x.name.name == name) {
                        if found.is_some() {
                            return None;
                        }
                        found = Some(Value::Enum {
                            decl: ItemRef { module: m, index: index as u32 },
                            ty: en.name.name.clone(),
                            member: name.to_string(),
                        });
                    }
                }
            }
        }
        found
    }

    fn port_names(&self, kind: ItemRef) -> Vec<String> {
        match &self.program.item(kind).kind {
            ItemKind::Stage(s) => s.ports.iter().map(|p| p.name.name.clone()).collect(),
            _ => Vec::new(),
        }
    }

    // ---- records -------------------------------------------------------------------------

    /// Builds a record of `schema` from fields already evaluated (`provided`), computing the
    /// defaults and running the schema's checks.
    pub fn build_record(&mut self, schema: ItemRef, provided: BTreeMap<String, FieldValue>, span: Span) -> R<Value> {
        self.frames.push(Frame { schema, provided, computed: BTreeMap::new(), in_progress: Vec::new() });
        let f = self.frames.len() - 1;
        let mut fields = BTreeMap::new();
        let mut ok = true;
        for decl in self.decl_fields(schema) {
            match self.frame_field(f, &decl.name.name, span) {
                Some(_) => {}
                None => ok = false,
            }
        }
        for decl in self.decl_fields(schema) {
            if let Some(Some(fv)) = self.frames[f].computed.get(&decl.name.name) {
                fields.insert(decl.name.name.clone(), fv.clone());
            }
        }
        if ok {
            for check in self.decl_checks(schema) {
                self.run_check(check, Env::Record(f), span, schema, &[]);
            }
        }
        self.frames.pop();
        if !ok {
            return None;
        }
        Some(Value::Record(Arc::new(Record { schema, schema_name: self.decl_name(schema), fields, span })))
    }

    fn frame_field(&mut self, f: usize, name: &str, use_span: Span) -> R<Value> {
        if let Some(v) = self.frames[f].computed.get(name) {
            return v.as_ref().map(|fv| fv.value.clone());
        }
        if self.frames[f].in_progress.iter().any(|n| n == name) {
            let mut path = self.frames[f].in_progress.clone();
            path.push(name.to_string());
            self.report(
                Diagnostic::error("E0206", format!("field defaults refer to each other: {}", path.join(" -> ")))
                    .with_primary(use_span, "while building this record"),
            );
            return None;
        }
        let schema = self.frames[f].schema;
        let decl = self.decl_fields(schema).iter().find(|d| d.name.name == name)?;
        let ty = self.resolve_type(schema.module, &decl.ty);
        let result = if let Some(fv) = self.frames[f].provided.get(name).cloned() {
            Some(fv)
        } else if let Some(def) = &decl.default {
            self.frames[f].in_progress.push(name.to_string());
            let v = self.eval(def, Env::Record(f), ty.as_ref());
            self.frames[f].in_progress.pop();
            let v = match (v, &ty) {
                (Some(v), Some(t)) => self.coerce(v, t, def.span),
                (v, _) => v,
            };
            v.map(|value| FieldValue { value, span: def.span, defaulted: true })
        } else if ty.as_ref().is_some_and(|t| t.is_optional()) {
            Some(FieldValue { value: Value::None, span: decl.span, defaulted: true })
        } else {
            let schema_name = self.decl_name(schema);
            self.report(
                Diagnostic::error("E0106", format!("`{schema_name}` needs `{name}`"))
                    .with_primary(use_span, format!("`{name}` is not set"))
                    .with_secondary(decl.span, "declared here without a default")
                    .with_help(format!("add `{name} = ...`")),
            );
            None
        };
        if let (Some(fv), Some(c)) = (&result, &decl.constraint) {
            {
                let ok = self.in_constraint(&fv.value, c, Env::Record(f));
                if ok == Some(false) {
                    let shown = fv.value.clone();
                    let cons = self.quiet_eval(c, Env::Record(f));
                    self.report(out_of_range(name, &shown, cons.as_ref(), fv.span, c.span));
                }
            }
        }
        self.frames[f].computed.insert(name.to_string(), result.clone());
        result.map(|fv| fv.value)
    }

    /// Evaluates `schema { field = expr, ... }` in `env`.
    fn construct(
        &mut self,
        schema: ItemRef,
        fields: &[ast::Binding],
        env: Env,
        span: Span,
        base: Option<&Record>,
    ) -> R<Value> {
        let mut provided = BTreeMap::new();
        if let Some(b) = base {
            for (k, v) in &b.fields {
                if !v.defaulted {
                    provided.insert(k.clone(), v.clone());
                }
            }
        }
        let decls = self.decl_fields(schema);
        let mut ok = true;
        let mut seen: HashMap<String, Span> = HashMap::new();
        for b in fields {
            let Some(first) = b.path.segments.first() else { continue };
            if b.path.segments.len() > 1 {
                self.report(
                    Diagnostic::error("E0209", "a dotted field path is only allowed in a recipe body")
                        .with_primary(b.path.span, "write the nested record instead"),
                );
                ok = false;
                continue;
            }
            if let Some(prev) = seen.get(&first.name) {
                self.report(
                    Diagnostic::error("E0104", format!("`{}` is set twice", first.name))
                        .with_primary(first.span, "set again here")
                        .with_secondary(*prev, "first set here"),
                );
                continue;
            }
            seen.insert(first.name.clone(), first.span);
            let Some(decl) = decls.iter().find(|d| d.name.name == first.name) else {
                self.unknown_field(schema, first);
                ok = false;
                continue;
            };
            self.references.push((first.span, decl.name.span));
            let ty = self.resolve_type(schema.module, &decl.ty);
            let v = self.eval(&b.value, env, ty.as_ref());
            let v = match (v, &ty) {
                (Some(v), Some(t)) => self.coerce(v, t, b.value.span),
                (v, _) => v,
            };
            match v {
                Some(value) => {
                    provided.insert(first.name.clone(), FieldValue { value, span: b.value.span, defaulted: false });
                }
                None => ok = false,
            }
        }
        if !ok {
            return None;
        }
        self.build_record(schema, provided, span)
    }

    pub fn unknown_field(&mut self, decl: ItemRef, id: &ast::Ident) {
        let decl_name = self.decl_name(decl);
        let names: Vec<String> = self.decl_fields(decl).iter().map(|d| d.name.name.clone()).collect();
        let mut d = Diagnostic::error("E0105", format!("`{decl_name}` has no field `{}`", id.name))
            .with_primary(id.span, "unknown field");
        if let Some(s) = did_you_mean(&id.name, names.iter().map(|s| s.as_str())) {
            d = d.with_help(format!("did you mean `{s}`?")).with_fix(format!("replace with `{s}`"), id.span, s);
        } else if names.is_empty() {
            d = d.with_help(format!("`{decl_name}` has no fields"));
        } else {
            d = d.with_help(format!("fields of `{decl_name}`: {}", names.join(", ")));
        }
        self.report(d);
    }

    // ---- stage instances -----------------------------------------------------------------

    pub fn add_instance(&mut self, inst: InstanceInit) -> usize {
        let r = self.recipe.get_or_insert_with(RecipeState::default);
        let i = r.instances.len();
        r.by_name.insert(inst.name.clone(), i);
        r.instances.push(Instance {
            name: inst.name,
            kind: inst.kind,
            binding_span: inst.binding_span,
            name_span: inst.name_span,
            args: Vec::new(),
            arrow_to: None,
            provided: inst.provided,
            computed: BTreeMap::new(),
            in_progress: Vec::new(),
            missing_reported: false,
        });
        i
    }

    pub fn set_instance_args(&mut self, i: usize, args: Vec<(String, Value, Span)>, arrow_to: Option<(Value, Span)>) {
        if let Some(r) = &mut self.recipe {
            r.instances[i].args = args;
            r.instances[i].arrow_to = arrow_to;
        }
    }

    pub fn instance_field(&mut self, i: usize, name: &str) -> R<Value> {
        self.instance_field_value(i, name).map(|fv| fv.value)
    }

    pub fn instance_field_value(&mut self, i: usize, name: &str) -> R<FieldValue> {
        let (kind, in_progress, cached) = {
            let inst = &self.recipe.as_ref()?.instances[i];
            (inst.kind, inst.in_progress.iter().any(|n| n == name), inst.computed.get(name).cloned())
        };
        if let Some(c) = cached {
            return c;
        }
        if in_progress {
            let inst = &self.recipe.as_ref()?.instances[i];
            let mut path: Vec<String> = inst.in_progress.iter().map(|n| format!("{}.{}", inst.name, n)).collect();
            path.push(format!("{}.{name}", inst.name));
            let span = inst.provided.get(name).map(|p| p.2).unwrap_or(inst.binding_span);
            self.report(
                Diagnostic::error("E0206", format!("fields refer to each other: {}", path.join(" -> ")))
                    .with_primary(span, "part of the cycle"),
            );
            return None;
        }
        let decl = self.decl_fields(kind).iter().find(|d| d.name.name == name)?;
        let ty = self.resolve_type(kind.module, &decl.ty);
        self.recipe.as_mut()?.instances[i].in_progress.push(name.to_string());
        let provided = self.recipe.as_ref()?.instances[i].provided.get(name).cloned();
        let result = if let Some((expr, module, _)) = provided {
            let v = self.eval(&expr, Env::Recipe(module), ty.as_ref());
            let v = match (v, &ty) {
                (Some(v), Some(t)) => self.coerce(v, t, expr.span),
                (v, _) => v,
            };
            v.map(|value| FieldValue { value, span: expr.span, defaulted: false })
        } else if let Some(def) = &decl.default {
            let v = self.eval(def, Env::Instance(i), ty.as_ref());
            let v = match (v, &ty) {
                (Some(v), Some(t)) => self.coerce(v, t, def.span),
                (v, _) => v,
            };
            v.map(|value| FieldValue { value, span: def.span, defaulted: true })
        } else if ty.as_ref().is_some_and(|t| t.is_optional()) {
            Some(FieldValue { value: Value::None, span: decl.span, defaulted: true })
        } else {
            let inst = &self.recipe.as_ref()?.instances[i];
            let (iname, span, kname) = (inst.name.clone(), inst.binding_span, self.decl_name(kind));
            self.report(
                Diagnostic::error("E0106", format!("stage `{iname}` ({kname}) needs `{name}`"))
                    .with_primary(span, format!("`{name}` is not set"))
                    .with_secondary(decl.span, "declared here without a default")
                    .with_help(format!("add `{name} = ...` to the block of `{iname}`")),
            );
            None
        };
        if let (Some(fv), Some(c)) = (&result, &decl.constraint) {
            if self.in_constraint(&fv.value, c, Env::Instance(i)) == Some(false) {
                let cons = self.quiet_eval(c, Env::Instance(i));
                self.report(out_of_range(name, &fv.value, cons.as_ref(), fv.span, c.span));
            }
        }
        if let Some(r) = self.recipe.as_mut() {
            r.instances[i].in_progress.pop();
            r.instances[i].computed.insert(name.to_string(), result.clone());
        }
        result
    }

    pub fn instance_missing_reported(&mut self, i: usize) -> bool {
        self.recipe.as_mut().map(|r| std::mem::replace(&mut r.instances[i].missing_reported, true)).unwrap_or(true)
    }

    /// The recipe's settings record (`recipe.schedule`, `recipe.cluster`, ...).
    pub fn recipe_settings(&mut self) -> R<Value> {
        let r = self.recipe.as_ref()?;
        if let Some(s) = &r.settings {
            return Some(s.clone());
        }
        if r.settings_in_progress {
            return None;
        }
        let schema = self.prelude_decl("recipe_settings")?;
        self.recipe.as_mut()?.settings_in_progress = true;
        let exprs: Vec<(String, (Expr, u32, Span))> =
            self.recipe.as_ref()?.settings_exprs.clone().into_iter().collect();
        let mut provided = BTreeMap::new();
        let decls = self.decl_fields(schema);
        let mut ok = true;
        for (name, (expr, module, name_span)) in exprs {
            let Some(decl) = decls.iter().find(|d| d.name.name == name) else {
                let id = ast::Ident { name: name.clone(), span: name_span };
                let mut d = Diagnostic::error("E0105", format!("`{name}` is neither a stage nor a recipe setting"))
                    .with_primary(name_span, "unknown recipe field");
                let names: Vec<String> = decls.iter().map(|d| d.name.name.clone()).collect();
                if let Some(s) = did_you_mean(&id.name, names.iter().map(|s| s.as_str())) {
                    d = d.with_help(format!("did you mean `{s}`?")).with_fix(
                        format!("replace with `{s}`"),
                        name_span,
                        s,
                    );
                } else {
                    d = d.with_help(format!(
                        "a recipe binding is a stage (`name = kind(inputs) {{ ... }}`) or one of the settings: {}",
                        names.join(", ")
                    ));
                }
                self.report(d);
                ok = false;
                continue;
            };
            let ty = self.resolve_type(schema.module, &decl.ty);
            let v = self.eval(&expr, Env::Recipe(module), ty.as_ref());
            let v = match (v, &ty) {
                (Some(v), Some(t)) => self.coerce(v, t, expr.span),
                (v, _) => v,
            };
            match v {
                Some(value) => {
                    provided.insert(name, FieldValue { value, span: expr.span, defaulted: false });
                }
                None => ok = false,
            }
        }
        if let Some(c) = self.recipe.as_ref()?.cluster.clone() {
            provided.insert("cluster".into(), FieldValue { value: c, span: Span::default(), defaulted: false });
        }
        let span = self.recipe.as_ref().map(|r| r.name_span).unwrap_or_default();
        let rec = if ok { self.build_record(schema, provided, span) } else { None };
        let r = self.recipe.as_mut()?;
        r.settings_in_progress = false;
        r.settings = rec.clone();
        rec
    }

    // ---- checks --------------------------------------------------------------------------

    /// Runs one `check`; on failure reports E0301 at `primary` naming the rule and showing
    /// the values the check relates. `labels` adds where related fields were set.
    pub fn run_check(
        &mut self,
        check: &ast::Check,
        env: Env,
        primary: Span,
        owner: ItemRef,
        labels: &[(Span, String)],
    ) -> bool {
        let v = self.eval(&check.expr, env, Some(&Type::Bool));
        match v {
            Some(Value::Bool(true)) => true,
            Some(Value::Bool(false)) => {
                let message =
                    check.message.as_ref().map(|m| m.value.clone()).unwrap_or_else(|| "check failed".to_string());
                let shown = self.explain_values(&check.expr, env);
                let mut d = if check.warn {
                    Diagnostic::warning("E0309", message).with_primary(primary, "this rule warns here")
                } else {
                    Diagnostic::error("E0301", message).with_primary(primary, "this check fails here")
                };
                for (sp, msg) in labels {
                    d = d.with_secondary(*sp, msg.clone());
                }
                for (sp, text) in &shown.1 {
                    if sp.file == primary.file && *sp != primary {
                        d = d.with_secondary(*sp, text.clone());
                    }
                }
                let mut help = String::new();
                if !shown.0.is_empty() {
                    help.push_str(&format!("values: {}", shown.0.join(", ")));
                }
                if let Some(h) = &check.help {
                    if !help.is_empty() {
                        help.push('\n');
                    }
                    help.push_str(&h.value);
                }
                if !help.is_empty() {
                    d = d.with_help(help);
                }
                d = d.with_rule(self.decl_path(owner), check.span);
                self.report(d);
                false
            }
            Some(other) => {
                self.report(
                    Diagnostic::error("E0302", format!("a check must be true or false, found {}", other.type_name()))
                        .with_primary(check.expr.span, "not a Bool"),
                );
                false
            }
            None => false,
        }
    }

    fn quiet_eval(&mut self, e: &Expr, env: Env) -> Option<Value> {
        self.quiet += 1;
        let refs = self.references.len();
        let v = self.eval(e, env, None);
        self.references.truncate(refs);
        self.quiet -= 1;
        v
    }

    /// `name = value` for every name and field path in a check, power-assert style, plus the
    /// spans where fields the check reads were set.
    fn explain_values(&mut self, e: &Expr, env: Env) -> (Vec<String>, Vec<(Span, String)>) {
        let mut paths: Vec<&Expr> = Vec::new();
        collect_paths(e, &mut paths);
        let mut out = Vec::new();
        let mut spans = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for p in paths {
            let text = expr_text(p);
            if !seen.insert(text.clone()) {
                continue;
            }
            if let Some(v) = self.quiet_eval(p, env) {
                if matches!(
                    v,
                    Value::Stage(_) | Value::Decl(_) | Value::Module(_) | Value::Builtin(_) | Value::Record(_)
                ) {
                    continue;
                }
                // A bare enum member (`disaggregated`) says nothing new.
                if matches!(&v, Value::Enum { member, .. } if *member == text) {
                    continue;
                }
                if let Some(sp) = self.set_span(p, env) {
                    spans.push((sp, format!("`{text}` = {v}")));
                }
                out.push(format!("{text} = {v}"));
            }
        }
        (out, spans)
    }

    /// Where the field a path names was set in the recipe (not where it was defaulted).
    fn set_span(&mut self, p: &Expr, env: Env) -> Option<Span> {
        if let (Env::Record(f), ExprKind::Name(id)) = (env, &p.kind) {
            return self
                .frames
                .get(f)?
                .provided
                .get(&id.name)
                .filter(|fv| !fv.defaulted && fv.span != Span::default())
                .map(|fv| fv.span);
        }
        let Env::Instance(i) = env else { return None };
        match &p.kind {
            ExprKind::Name(id) => {
                let inst = &self.recipe.as_ref()?.instances[i];
                inst.provided.get(&id.name).map(|x| x.0.span)
            }
            ExprKind::Field(base, field) => {
                if let ExprKind::Name(b) = &base.kind {
                    let r = self.recipe.as_ref()?;
                    let inst = &r.instances[i];
                    let target = inst.args.iter().find(|(p, _, _)| *p == b.name).map(|(_, v, _)| v.clone());
                    if let Some(Value::Stage(n)) = target {
                        let j = *r.by_name.get(&n)?;
                        return r.instances[j].provided.get(&field.name).map(|x| x.0.span);
                    }
                }
                None
            }
            _ => None,
        }
    }

    fn in_constraint(&mut self, v: &Value, c: &Expr, env: Env) -> Option<bool> {
        if matches!(v, Value::None) {
            return Some(true);
        }
        let cons = self.eval(c, env, None)?;
        self.contains(&cons, v, c.span)
    }

    // ---- coercion ------------------------------------------------------------------------

    /// Checks `v` against `t`, applying the language's coercions: an integral number is an
    /// Int, an Int is a Float, a schema named alone is its record of defaults.
    pub fn coerce(&mut self, v: Value, t: &Type, span: Span) -> R<Value> {
        match (t, &v) {
            (Type::Any, _) => Some(v),
            (Type::Optional(_), Value::None) => Some(v),
            (Type::Optional(inner), _) => self.coerce(v, inner, span),
            (Type::Int, Value::Num { q, .. }) if q.is_integer() => Some(Value::Num { q: *q, float: false }),
            (Type::Int, Value::Num { q, .. }) => {
                self.report(
                    Diagnostic::error("E0201", format!("expected an Int, found {q}"))
                        .with_primary(span, "not a whole number")
                        .with_help("this field counts things; give a whole number"),
                );
                None
            }
            (Type::Float, Value::Num { q, .. }) => Some(Value::Num { q: *q, float: true }),
            (Type::Quantity(d), Value::Quantity { dim, .. }) if d == dim => Some(v),
            (Type::Quantity(d), Value::Quantity { dim, .. }) => {
                self.report(
                    Diagnostic::error("E0202", format!("expected {}, found {}", d.name(), dim.name()))
                        .with_primary(span, format!("this is {}", dim.name()))
                        .with_help(format!("give a value in {} units, e.g. `1.{}`", d.name(), suggested_unit(*d))),
                );
                None
            }
            (Type::Quantity(d), Value::Num { q, .. }) => {
                let u = suggested_unit(*d);
                let mut diag = Diagnostic::error("E0202", format!("expected {}, found a plain number", d.name()))
                    .with_primary(span, format!("a number without a unit; {} needs one", d.name()))
                    .with_help(format!("write the unit: `{q}.{u}`"));
                diag = diag.with_fix(format!("write `{q}.{u}`"), Span { start: span.end, ..span }, format!(".{u}"));
                self.report(diag);
                None
            }
            (Type::Bool, Value::Bool(_)) | (Type::Str, Value::Str(_)) | (Type::Range, Value::Range { .. }) => Some(v),
            (Type::List(inner), Value::List(items)) => {
                let mut out = Vec::with_capacity(items.len());
                for it in items.clone() {
                    out.push(self.coerce(it, inner, span)?);
                }
                Some(Value::List(out))
            }
            (Type::Map(inner), Value::Map(m)) => {
                let mut out = BTreeMap::new();
                for (k, it) in m.clone() {
                    out.insert(k, self.coerce(it, inner, span)?);
                }
                Some(Value::Map(out))
            }
            (Type::Enum(e, _), Value::Enum { decl, .. }) if decl == e => Some(v),
            (Type::Schema(s, _), Value::Record(r)) if r.schema == *s => Some(v),
            (Type::Schema(s, _), Value::Decl(d)) if d == s => self.build_record(*s, BTreeMap::new(), span),
            (Type::Interface(i), Value::Record(r)) if self.satisfies(r.schema, i) => Some(v),
            (Type::Interface(i), Value::Decl(d)) if self.is_schema(*d) && self.satisfies(*d, i) => {
                self.build_record(*d, BTreeMap::new(), span)
            }
            (Type::Port(p), _) | (Type::Interface(Iface::Port(p)), _) => {
                if self.port_accepts(*p, &v) {
                    return Some(v);
                }
                let found = self.describe_port_value(&v);
                self.report(
                    Diagnostic::error("E0306", format!("expected {}, found {found}", p.name()))
                        .with_primary(span, format!("this gives {found}"))
                        .with_help(port_help(*p)),
                );
                None
            }
            _ => {
                let code = match (&v, t.strip_optional()) {
                    (Value::Quantity { .. }, Type::Int | Type::Float) => "E0202",
                    _ => "E0201",
                };
                let mut d = Diagnostic::error(code, format!("expected {t}, found {}", v.type_name()))
                    .with_primary(span, format!("this is {}", v.type_name()));
                if let (Type::Enum(e, _), Value::Str(s)) = (t.strip_optional(), &v) {
                    if self.enum_has(*e, s) {
                        d = d.with_help(format!("enum members are written without quotes: `{s}`"));
                    }
                } else if let Type::Enum(e, _) = t.strip_optional() {
                    d = d.with_help(format!("members: {}", self.enum_members(*e).join(", ")));
                } else if code == "E0202" {
                    d = d.with_help("this field is a plain number; remove the unit");
                }
                self.report(d);
                None
            }
        }
    }

    fn is_schema(&self, r: ItemRef) -> bool {
        matches!(self.program.item(r).kind, ItemKind::Schema(_))
    }

    /// Whether schema `s` declares `is I`.
    pub fn satisfies(&self, s: ItemRef, i: &Iface) -> bool {
        let ItemKind::Schema(schema) = &self.program.item(s).kind else { return false };
        let Some(iname) = &schema.interface else { return false };
        match i {
            Iface::Port(p) => PortKind::from_name(&iname.name) == Some(*p),
            Iface::Decl(r, _) => match self.program.lookup(s.module, &iname.name) {
                Some(ScopeEntry::Item(x)) => x == *r,
                _ => false,
            },
        }
    }

    fn schema_is_named_iface(&self, s: ItemRef, name: &str) -> bool {
        match &self.program.item(s).kind {
            ItemKind::Schema(schema) => schema.interface.as_ref().is_some_and(|i| i.name == name),
            _ => false,
        }
    }

    pub fn stage_output(&self, kind: ItemRef) -> Option<PortKind> {
        match &self.program.item(kind).kind {
            ItemKind::Stage(s) => match &s.output.as_ref()?.kind {
                TypeExprKind::Named(p) if p.segments.len() == 1 => PortKind::from_name(&p.segments[0].name),
                _ => None,
            },
            _ => None,
        }
    }

    fn port_accepts(&self, p: PortKind, v: &Value) -> bool {
        match v {
            Value::Stage(n) => {
                let Some(r) = &self.recipe else { return false };
                let Some(&i) = r.by_name.get(n) else { return false };
                self.stage_output(r.instances[i].kind) == Some(p)
            }
            Value::Record(rec) => match p {
                PortKind::Policy => self.schema_is_named_iface(rec.schema, "Model"),
                PortKind::Prompts => self.schema_is_named_iface(rec.schema, "Prompts"),
                _ => false,
            },
            _ => false,
        }
    }

    fn describe_port_value(&self, v: &Value) -> String {
        if let Value::Stage(n) = v {
            if let Some(r) = &self.recipe {
                if let Some(&i) = r.by_name.get(n) {
                    let kind = r.instances[i].kind;
                    let out = self.stage_output(kind).map(|p| p.name()).unwrap_or("nothing");
                    return format!("stage `{n}` ({}) which produces {out}", self.decl_name(kind));
                }
            }
        }
        v.type_name()
    }

    // ---- expressions ---------------------------------------------------------------------

    pub fn eval(&mut self, e: &Expr, env: Env, expected: Option<&Type>) -> R<Value> {
        // Expressions nest up to miles_grammar::MAX_EXPR_DEPTH deep and a debug build's frames
        // here are large: grow the stack rather than overflow it.
        stacker::maybe_grow(64 << 10, 1 << 20, || self.eval_inner(e, env, expected))
    }

    fn eval_inner(&mut self, e: &Expr, env: Env, expected: Option<&Type>) -> R<Value> {
        match &e.kind {
            ExprKind::Error => None,
            ExprKind::Number(text) => match Q::parse_literal(text) {
                Some(q) => Some(Value::Num { q, float: text.contains(['.', 'e', 'E']) }),
                None => {
                    self.report(
                        Diagnostic::error("E0005", format!("`{text}` is not a number miles can hold exactly"))
                            .with_primary(e.span, "too large or malformed")
                            .with_help("numbers are exact 128-bit rationals; use a unit or a smaller magnitude"),
                    );
                    None
                }
            },
            ExprKind::Quantity { number, unit: u, unit_span } => {
                let Some((dim, size)) = unit(u) else {
                    let mut d = Diagnostic::error("E0203", format!("unknown unit `{u}`"))
                        .with_primary(*unit_span, "not a unit");
                    if let Some(s) = did_you_mean(u, UNIT_NAMES.iter().copied()) {
                        d = d.with_help(format!("did you mean `{s}`?")).with_fix(
                            format!("replace with `{s}`"),
                            *unit_span,
                            s,
                        );
                    } else {
                        d = d.with_help(format!("units: {}", UNIT_NAMES.join(" ")));
                    }
                    self.report(d);
                    return None;
                };
                let Some(n) = Q::parse_literal(number) else {
                    self.report(
                        Diagnostic::error("E0005", format!("`{number}` is not a number miles can hold exactly"))
                            .with_primary(e.span, "here"),
                    );
                    return None;
                };
                match n.checked_mul(size) {
                    Some(q) => Some(Value::Quantity { q, dim }),
                    None => {
                        self.report(
                            Diagnostic::error("E0205", "this quantity overflows 128 bits")
                                .with_primary(e.span, "too large"),
                        );
                        None
                    }
                }
            }
            ExprKind::Str(s) => Some(Value::Str(s.clone())),
            ExprKind::Bool(b) => Some(Value::Bool(*b)),
            ExprKind::None => Some(Value::None),
            ExprKind::List(items) => {
                let inner = match expected.map(|t| t.strip_optional()) {
                    Some(Type::List(t)) => Some((**t).clone()),
                    _ => None,
                };
                let mut out = Vec::with_capacity(items.len());
                for it in items {
                    out.push(self.eval(it, env, inner.as_ref())?);
                }
                Some(Value::List(out))
            }
            ExprKind::Map(entries) => {
                let inner = match expected.map(|t| t.strip_optional()) {
                    Some(Type::Map(t)) => Some((**t).clone()),
                    _ => None,
                };
                let mut out = BTreeMap::new();
                for (k, v) in entries {
                    let val = self.eval(v, env, inner.as_ref())?;
                    if out.insert(k.value.clone(), val).is_some() {
                        self.report(
                            Diagnostic::error("E0104", format!("key {:?} appears twice", k.value))
                                .with_primary(k.span, "duplicate key"),
                        );
                    }
                }
                Some(Value::Map(out))
            }
            ExprKind::Name(id) => self.lookup_name(id, env, expected),
            ExprKind::Paren(inner) => self.eval(inner, env, expected),
            ExprKind::Field(base, field) => {
                // `Enum.member` where an enum is expected, or anywhere.
                let b = self.eval(base, env, None)?;
                self.field_of(b, field)
            }
            ExprKind::Call { callee, args, .. } => {
                let c = self.eval(callee, env, None)?;
                match c {
                    Value::Builtin(name) => {
                        let mut vals = Vec::with_capacity(args.len());
                        for a in args {
                            vals.push((self.eval(&a.value, env, None)?, a.value.span));
                        }
                        self.builtin(name, vals, e.span)
                    }
                    Value::Decl(r) if matches!(self.program.item(r).kind, ItemKind::Stage(_)) => {
                        self.report(
                            Diagnostic::error(
                                "E0208",
                                format!(
                                    "stage kind `{}` can only be instantiated as a recipe binding",
                                    self.decl_name(r)
                                ),
                            )
                            .with_primary(e.span, "not in a recipe binding")
                            .with_help(format!("bind it in a recipe: `name = {}(...)`", self.decl_name(r))),
                        );
                        None
                    }
                    other => {
                        self.report(
                            Diagnostic::error("E0208", format!("{} cannot be called", other.type_name()))
                                .with_primary(callee.span, "not a function or stage kind")
                                .with_help(format!("builtin functions: {}", BUILTINS.join(", "))),
                        );
                        None
                    }
                }
            }
            ExprKind::Record { base, fields, .. } => {
                let b = self.eval(base, env, None)?;
                match b {
                    Value::Decl(r) if self.is_schema(r) => self.construct(r, fields, env, e.span, None),
                    Value::Record(rec) => {
                        let schema = rec.schema;
                        self.construct(schema, fields, env, e.span, Some(&rec))
                    }
                    other => {
                        self.report(
                            Diagnostic::error(
                                "E0201",
                                format!("{} cannot take a `{{ ... }}` block", other.type_name()),
                            )
                            .with_primary(base.span, "not a schema")
                            .with_help(
                                "a block follows a schema name (`adam { ... }`) or a stage kind in a recipe binding",
                            ),
                        );
                        None
                    }
                }
            }
            ExprKind::Unary { op, expr } => {
                let v = self.eval(expr, env, None)?;
                match (op, v) {
                    (UnOp::Not, Value::Bool(b)) => Some(Value::Bool(!b)),
                    (UnOp::Neg, Value::Num { q, float }) => {
                        Some(Value::Num { q: self.arith(q.checked_neg(), e.span)?, float })
                    }
                    (UnOp::Neg, Value::Quantity { q, dim }) => {
                        Some(Value::Quantity { q: self.arith(q.checked_neg(), e.span)?, dim })
                    }
                    (op, v) => {
                        self.report(
                            Diagnostic::error(
                                "E0205",
                                format!(
                                    "cannot apply `{}` to {}",
                                    if *op == UnOp::Not { "not" } else { "-" },
                                    v.type_name()
                                ),
                            )
                            .with_primary(e.span, "here"),
                        );
                        None
                    }
                }
            }
            ExprKind::If { cond, then, otherwise } => match self.eval(cond, env, Some(&Type::Bool))? {
                Value::Bool(true) => self.eval(then, env, expected),
                Value::Bool(false) => self.eval(otherwise, env, expected),
                v => {
                    self.report(
                        Diagnostic::error("E0201", format!("`if` needs a Bool, found {}", v.type_name()))
                            .with_primary(cond.span, "not a Bool"),
                    );
                    None
                }
            },
            ExprKind::Range { start, end, inclusive } => {
                let s = match start {
                    Some(x) => Some(Box::new(self.eval(x, env, None)?)),
                    None => None,
                };
                let en = match end {
                    Some(x) => Some(Box::new(self.eval(x, env, None)?)),
                    None => None,
                };
                Some(Value::Range { start: s, end: en, inclusive: *inclusive })
            }
            ExprKind::Binary { op, op_span, lhs, rhs } => self.binary(*op, *op_span, lhs, rhs, env, e.span),
        }
    }

    fn arith(&mut self, r: Option<Q>, span: Span) -> R<Q> {
        if r.is_none() {
            self.report(
                Diagnostic::error("E0205", "arithmetic overflow or division by zero")
                    .with_primary(span, "cannot be computed exactly")
                    .with_help("numbers are exact 128-bit rationals"),
            );
        }
        r
    }

    pub fn field_of(&mut self, b: Value, field: &ast::Ident) -> R<Value> {
        match b {
            Value::Module(m) => match self.program.module(m).own.get(&field.name).copied() {
                Some(r) => {
                    if let Some(n) = self.program.item(r).name() {
                        self.references.push((field.span, n.span));
                    }
                    self.item_value(r)
                }
                None => {
                    self.not_member(m, field);
                    None
                }
            },
            Value::Record(rec) => match rec.fields.get(&field.name) {
                Some(fv) => Some(fv.value.clone()),
                None => {
                    self.unknown_field(rec.schema, field);
                    None
                }
            },
            Value::Stage(n) => {
                let i = *self.recipe.as_ref()?.by_name.get(&n)?;
                let kind = self.recipe.as_ref()?.instances[i].kind;
                if self.decl_fields(kind).iter().any(|d| d.name.name == field.name) {
                    return self.instance_field(i, &field.name);
                }
                if let Some((_, v, _)) =
                    self.recipe.as_ref()?.instances[i].args.iter().find(|(p, _, _)| *p == field.name)
                {
                    return Some(v.clone());
                }
                self.unknown_field(kind, field);
                None
            }
            Value::Decl(r) if matches!(self.program.item(r).kind, ItemKind::Enum(_)) => {
                if self.enum_has(r, &field.name) {
                    Some(Value::Enum { decl: r, ty: self.decl_name(r), member: field.name.clone() })
                } else {
                    let members = self.enum_members(r);
                    let mut d = Diagnostic::error(
                        "E0109",
                        format!("`{}` is not a member of enum `{}`", field.name, self.decl_name(r)),
                    )
                    .with_primary(field.span, "unknown member");
                    if let Some(s) = did_you_mean(&field.name, members.iter().map(|s| s.as_str())) {
                        d = d
                            .with_fix(format!("replace with `{s}`"), field.span, s.clone())
                            .with_help(format!("did you mean `{s}`?"));
                    } else {
                        d = d.with_help(format!("members: {}", members.join(", ")));
                    }
                    self.report(d);
                    None
                }
            }
            Value::None => {
                self.report(
                    Diagnostic::error("E0201", format!("cannot read `{}` of none", field.name))
                        .with_primary(field.span, "the value is none here")
                        .with_help("guard it: `x == none or x.field ...`"),
                );
                None
            }
            other => {
                self.report(
                    Diagnostic::error("E0201", format!("{} has no fields", other.type_name()))
                        .with_primary(field.span, format!("cannot read `{}`", field.name)),
                );
                None
            }
        }
    }

    fn binary(&mut self, op: BinOp, op_span: Span, lhs: &Expr, rhs: &Expr, env: Env, span: Span) -> R<Value> {
        // Short-circuit logic.
        if matches!(op, BinOp::And | BinOp::Or) {
            let l = self.eval(lhs, env, Some(&Type::Bool))?;
            let Value::Bool(lb) = l else {
                self.report(
                    Diagnostic::error("E0201", format!("`{}` needs Bools, found {}", op.symbol(), l.type_name()))
                        .with_primary(lhs.span, "not a Bool"),
                );
                return None;
            };
            if (op == BinOp::And && !lb) || (op == BinOp::Or && lb) {
                return Some(Value::Bool(lb));
            }
            let r = self.eval(rhs, env, Some(&Type::Bool))?;
            return match r {
                Value::Bool(rb) => Some(Value::Bool(rb)),
                other => {
                    self.report(
                        Diagnostic::error(
                            "E0201",
                            format!("`{}` needs Bools, found {}", op.symbol(), other.type_name()),
                        )
                        .with_primary(rhs.span, "not a Bool"),
                    );
                    None
                }
            };
        }
        let l = self.eval(lhs, env, None)?;
        if op == BinOp::Is {
            let r = self.eval(rhs, env, None)?;
            return match (&l, r) {
                (Value::Record(rec), Value::Decl(d)) => {
                    let yes = rec.schema == d || {
                        let name = self.decl_name(d);
                        matches!(self.program.item(d).kind, ItemKind::Interface(_))
                            && self.satisfies(rec.schema, &Iface::Decl(d, name))
                    };
                    Some(Value::Bool(yes))
                }
                (_, Value::Decl(_)) => Some(Value::Bool(false)),
                (_, other) => {
                    self.report(
                        Diagnostic::error(
                            "E0201",
                            format!("`is` takes a schema or interface on the right, found {}", other.type_name()),
                        )
                        .with_primary(rhs.span, "not a schema"),
                    );
                    None
                }
            };
        }
        // The left side's enum lets the right side name its members bare (`transport == p2p`).
        let hint = match &l {
            Value::Enum { decl, ty, .. } => Some(match op {
                BinOp::In => Type::List(Box::new(Type::Enum(*decl, ty.clone()))),
                _ => Type::Enum(*decl, ty.clone()),
            }),
            _ => None,
        };
        let r = self.eval(rhs, env, hint.as_ref())?;
        let bad = |this: &mut Self, l: &Value, r: &Value| {
            let code = match (l, r) {
                (Value::Quantity { .. }, _) | (_, Value::Quantity { .. }) => "E0202",
                _ => "E0205",
            };
            this.report(
                Diagnostic::error(
                    code,
                    format!("cannot apply `{}` to {} and {}", op.symbol(), l.type_name(), r.type_name()),
                )
                .with_primary(op_span, "here")
                .with_secondary(lhs.span, l.type_name())
                .with_secondary(rhs.span, r.type_name()),
            );
            None
        };
        match op {
            BinOp::Eq | BinOp::Ne => {
                if let (Value::Quantity { dim: a, .. }, Value::Quantity { dim: b, .. }) = (&l, &r) {
                    if a != b {
                        return bad(self, &l, &r);
                    }
                }
                let eq = values_equal(&l, &r);
                Some(Value::Bool(if op == BinOp::Eq { eq } else { !eq }))
            }
            BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge => {
                let ord = match (&l, &r) {
                    (Value::Num { q: a, .. }, Value::Num { q: b, .. }) => a.cmp(b),
                    (Value::Quantity { q: a, dim: da }, Value::Quantity { q: b, dim: db }) if da == db => a.cmp(b),
                    (Value::Str(a), Value::Str(b)) => a.cmp(b),
                    _ => return bad(self, &l, &r),
                };
                use std::cmp::Ordering::*;
                Some(Value::Bool(match op {
                    BinOp::Lt => ord == Less,
                    BinOp::Le => ord != Greater,
                    BinOp::Gt => ord == Greater,
                    _ => ord != Less,
                }))
            }
            BinOp::In => Some(Value::Bool(self.contains(&r, &l, rhs.span)?)),
            BinOp::Add | BinOp::Sub => match (&l, &r) {
                (Value::Num { q: a, float: fa }, Value::Num { q: b, float: fb }) => {
                    let q = self.arith(if op == BinOp::Add { a.checked_add(*b) } else { a.checked_sub(*b) }, span)?;
                    Some(Value::Num { q, float: *fa || *fb })
                }
                (Value::Quantity { q: a, dim: da }, Value::Quantity { q: b, dim: db }) if da == db => {
                    let q = self.arith(if op == BinOp::Add { a.checked_add(*b) } else { a.checked_sub(*b) }, span)?;
                    Some(Value::Quantity { q, dim: *da })
                }
                (Value::Str(a), Value::Str(b)) if op == BinOp::Add => Some(Value::Str(format!("{a}{b}"))),
                (Value::List(a), Value::List(b)) if op == BinOp::Add => {
                    Some(Value::List(a.iter().chain(b.iter()).cloned().collect()))
                }
                _ => bad(self, &l, &r),
            },
            BinOp::Mul | BinOp::Div | BinOp::Rem => {
                // Sugar: `gb300 * 64` is a cluster of 64 such GPUs.
                if op == BinOp::Mul {
                    if let (Value::Record(rec), Value::Num { q, .. }) = (&l, &r) {
                        if self.schema_is_named_iface(rec.schema, "Hardware") {
                            return self.gpu_cluster(l.clone(), *q, span);
                        }
                    }
                }
                let (qa, da, fa) = num_parts(&l)?;
                let (qb, db, fb) = match num_parts(&r) {
                    Some(x) => x,
                    None => return bad(self, &l, &r),
                };
                let _ = fa;
                let (q, dim) = match op {
                    BinOp::Mul => (self.arith(qa.checked_mul(qb), span)?, da.times(db)),
                    BinOp::Div => (self.arith(qa.checked_div(qb), span)?, da.per(db)),
                    _ => {
                        if da != db && !db.is_none() {
                            return bad(self, &l, &r);
                        }
                        (self.arith(qa.checked_rem(qb), span)?, da)
                    }
                };
                if dim.is_none() {
                    let float = op == BinOp::Div && !q.is_integer() || fa || fb;
                    Some(Value::Num { q, float })
                } else {
                    Some(Value::Quantity { q, dim })
                }
            }
            BinOp::And | BinOp::Or | BinOp::Is => None,
        }
    }

    fn gpu_cluster(&mut self, gpu: Value, count: Q, span: Span) -> R<Value> {
        let Some(schema) = self.prelude_decl("gpu_cluster") else {
            self.report(
                Diagnostic::error("E0103", "the prelude declares no `gpu_cluster` schema").with_primary(span, "here"),
            );
            return None;
        };
        let mut provided = BTreeMap::new();
        provided.insert("gpu".to_string(), FieldValue { value: gpu, span, defaulted: false });
        provided.insert(
            "gpus".to_string(),
            FieldValue { value: Value::Num { q: count, float: false }, span, defaulted: false },
        );
        self.build_record(schema, provided, span)
    }

    fn contains(&mut self, container: &Value, v: &Value, span: Span) -> R<bool> {
        match container {
            Value::List(items) => Some(items.iter().any(|x| values_equal(x, v))),
            Value::Map(m) => Some(v.as_str().is_some_and(|k| m.contains_key(k))),
            Value::Range { start, end, inclusive } => {
                let key = |x: &Value| -> Option<(Q, Dim)> {
                    match x {
                        Value::Num { q, .. } => Some((*q, Dim::NONE)),
                        Value::Quantity { q, dim } => Some((*q, *dim)),
                        _ => None,
                    }
                };
                let Some((q, d)) = key(v) else {
                    self.report(
                        Diagnostic::error("E0201", format!("a range holds numbers, not {}", v.type_name()))
                            .with_primary(span, "here"),
                    );
                    return None;
                };
                // Each present bound: its value, and whether `q` is on the right side of it.
                let mut ok = true;
                let bounds = [(start, true), (end, false)];
                for (bound, is_start) in bounds.iter().filter_map(|(b, s)| b.as_ref().map(|b| (b, *s))) {
                    let Some((bq, bd)) = key(bound) else { return Some(false) };
                    if bd != d {
                        self.report(
                            Diagnostic::error(
                                "E0202",
                                format!("range bounds are {} but the value is {}", bd.name(), d.name()),
                            )
                            .with_primary(span, "here"),
                        );
                        return None;
                    }
                    ok &= match (is_start, *inclusive) {
                        (true, _) => q >= bq,
                        (false, true) => q <= bq,
                        (false, false) => q < bq,
                    };
                }
                Some(ok)
            }
            Value::Str(s) => Some(v.as_str().is_some_and(|x| s.contains(x))),
            other => {
                self.report(
                    Diagnostic::error("E0201", format!("`in` needs a list, map or range, found {}", other.type_name()))
                        .with_primary(span, "here"),
                );
                None
            }
        }
    }

    fn builtin(&mut self, name: &str, args: Vec<(Value, Span)>, span: Span) -> R<Value> {
        let arity_err = |this: &mut Self, want: &str| {
            this.report(
                Diagnostic::error("E0207", format!("`{name}` takes {want}, given {}", args.len()))
                    .with_primary(span, "wrong number of arguments"),
            );
            None
        };
        match name {
            "min" | "max" => {
                if args.is_empty() {
                    return arity_err(self, "one or more arguments");
                }
                let mut best = args[0].0.clone();
                for (v, sp) in &args[1..] {
                    let ord = match (&best, v) {
                        (Value::Num { q: a, .. }, Value::Num { q: b, .. }) => b.cmp(a),
                        (Value::Quantity { q: a, dim: da }, Value::Quantity { q: b, dim: db }) if da == db => b.cmp(a),
                        _ => {
                            self.report(
                                Diagnostic::error("E0202", format!("`{name}` needs numbers of one unit"))
                                    .with_primary(*sp, v.type_name()),
                            );
                            return None;
                        }
                    };
                    if (name == "min" && ord.is_lt()) || (name == "max" && ord.is_gt()) {
                        best = v.clone();
                    }
                }
                Some(best)
            }
            "len" => {
                if args.len() != 1 {
                    return arity_err(self, "one argument");
                }
                match &args[0].0 {
                    Value::List(l) => Some(Value::int(l.len() as i128)),
                    Value::Map(m) => Some(Value::int(m.len() as i128)),
                    Value::Str(s) => Some(Value::int(s.chars().count() as i128)),
                    other => {
                        self.report(
                            Diagnostic::error(
                                "E0201",
                                format!("`len` needs a list, map or string, found {}", other.type_name()),
                            )
                            .with_primary(args[0].1, "here"),
                        );
                        None
                    }
                }
            }
            "ceil" | "floor" => {
                if args.len() != 1 {
                    return arity_err(self, "one argument");
                }
                match &args[0].0 {
                    Value::Num { q, .. } => {
                        Some(Value::Num { q: if name == "ceil" { q.ceil() } else { q.floor() }, float: false })
                    }
                    other => {
                        self.report(
                            Diagnostic::error("E0201", format!("`{name}` needs a number, found {}", other.type_name()))
                                .with_primary(args[0].1, "here"),
                        );
                        None
                    }
                }
            }
            "has" => {
                if args.len() != 2 {
                    return arity_err(self, "two arguments (a record and a field name)");
                }
                let yes = match (&args[0].0, &args[1].0) {
                    (Value::Record(r), Value::Str(f)) => r.fields.contains_key(f),
                    (Value::Map(m), Value::Str(f)) => m.contains_key(f),
                    _ => false,
                };
                Some(Value::Bool(yes))
            }
            "model_of" => {
                if args.len() != 1 {
                    return arity_err(self, "one argument");
                }
                if !self.inputs_complete(&args[0].0, 0) {
                    // An input upstream failed to resolve and was reported already.
                    return None;
                }
                self.model_of(args[0].0.clone(), 0).or_else(|| {
                    self.report(
                        Diagnostic::error("E0201", "cannot tell which model this stage runs")
                            .with_primary(args[0].1, "no model upstream")
                            .with_help("`model_of` follows Policy and Trajectories inputs up to a `model`"),
                    );
                    None
                })
            }
            _ => None,
        }
    }

    /// Whether every stage upstream of `v` got all its inputs (none failed to resolve).
    fn inputs_complete(&self, v: &Value, depth: u32) -> bool {
        let Value::Stage(n) = v else { return true };
        let Some(r) = &self.recipe else { return true };
        let Some(&i) = r.by_name.get(n) else { return true };
        if depth > 64 || r.instances[i].args.len() < self.port_names(r.instances[i].kind).len() {
            return depth > 64;
        }
        r.instances[i].args.iter().all(|(_, a, _)| self.inputs_complete(a, depth + 1))
    }

    /// The model a stage ultimately runs: follows Policy / Trajectories inputs upstream.
    pub fn model_of(&mut self, v: Value, depth: u32) -> Option<Value> {
        if depth > 64 {
            return None;
        }
        match v {
            Value::Record(ref r) if self.schema_is_named_iface(r.schema, "Model") => Some(v),
            Value::Stage(n) => {
                let (args, kind) = {
                    let r = self.recipe.as_ref()?;
                    let i = *r.by_name.get(&n)?;
                    (r.instances[i].args.clone(), r.instances[i].kind)
                };
                let ports: Vec<(String, Option<PortKind>)> = match &self.program.item(kind).kind {
                    ItemKind::Stage(s) => s
                        .ports
                        .iter()
                        .map(|p| {
                            let k = match &p.ty.kind {
                                TypeExprKind::Named(path) if path.segments.len() == 1 => {
                                    PortKind::from_name(&path.segments[0].name)
                                }
                                _ => None,
                            };
                            (p.name.name.clone(), k)
                        })
                        .collect(),
                    _ => Vec::new(),
                };
                for want in [PortKind::Policy, PortKind::Trajectories] {
                    for (pname, k) in &ports {
                        if *k == Some(want) {
                            if let Some((_, a, _)) = args.iter().find(|(p, _, _)| p == pname) {
                                if let Some(m) = self.model_of(a.clone(), depth + 1) {
                                    return Some(m);
                                }
                            }
                        }
                    }
                }
                None
            }
            _ => None,
        }
    }
}

pub struct InstanceInit {
    pub name: String,
    pub kind: ItemRef,
    pub binding_span: Span,
    pub name_span: Span,
    pub provided: BTreeMap<String, (Expr, u32, Span)>,
}

fn num_parts(v: &Value) -> Option<(Q, Dim, bool)> {
    match v {
        Value::Num { q, float } => Some((*q, Dim::NONE, *float)),
        Value::Quantity { q, dim } => Some((*q, *dim, false)),
        _ => None,
    }
}

pub fn values_equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Num { q: x, .. }, Value::Num { q: y, .. }) => x == y,
        (Value::Quantity { q: x, dim: dx }, Value::Quantity { q: y, dim: dy }) => x == y && dx == dy,
        (Value::Enum { decl: d1, member: m1, .. }, Value::Enum { decl: d2, member: m2, .. }) => d1 == d2 && m1 == m2,
        (Value::Record(x), Value::Record(y)) => {
            x.schema == y.schema
                && x.fields.len() == y.fields.len()
                && x.fields.iter().all(|(k, v)| y.fields.get(k).is_some_and(|w| values_equal(&v.value, &w.value)))
        }
        (Value::List(x), Value::List(y)) => x.len() == y.len() && x.iter().zip(y).all(|(a, b)| values_equal(a, b)),
        _ => a == b,
    }
}

fn out_of_range(name: &str, v: &Value, cons: Option<&Value>, span: Span, cons_span: Span) -> Diagnostic {
    let allowed = cons.map(|c| c.to_string()).unwrap_or_else(|| "the declared range".into());
    Diagnostic::error("E0204", format!("`{name}` = {v} is outside {allowed}"))
        .with_primary(span, format!("must be in {allowed}"))
        .with_secondary(cons_span, "range declared here")
        .with_help(format!("choose a value in {allowed}"))
}

fn port_help(p: PortKind) -> String {
    match p {
        PortKind::Policy => "give a `model` or a stage that produces a Policy (sft, grpo, ppo)".into(),
        PortKind::Trajectories => "give a rollout stage (`generate`)".into(),
        PortKind::Scores => "give a reward stage (a verifier such as `arith.exact_match(rollout)`)".into(),
        PortKind::Prompts => "give a prompt source (a task such as `arith.addition { ... }` or `jsonl { ... }`)".into(),
        PortKind::Metrics => "give a stage that produces Metrics".into(),
    }
}

/// Names and field paths (`rollout_batch`, `rollout.samples_per_prompt`) inside an expression.
fn collect_paths<'e>(e: &'e Expr, out: &mut Vec<&'e Expr>) {
    match &e.kind {
        ExprKind::Name(_) => out.push(e),
        ExprKind::Field(base, _) => {
            if is_path(base) {
                out.push(e);
            } else {
                collect_paths(base, out);
            }
        }
        ExprKind::Binary { lhs, rhs, .. } => {
            collect_paths(lhs, out);
            collect_paths(rhs, out);
        }
        ExprKind::Unary { expr, .. } | ExprKind::Paren(expr) => collect_paths(expr, out),
        ExprKind::If { cond, then, otherwise } => {
            collect_paths(cond, out);
            collect_paths(then, out);
            collect_paths(otherwise, out);
        }
        ExprKind::Call { args, .. } => {
            for a in args {
                collect_paths(&a.value, out);
            }
        }
        ExprKind::List(items) => {
            for i in items {
                collect_paths(i, out);
            }
        }
        _ => {}
    }
}

fn is_path(e: &Expr) -> bool {
    match &e.kind {
        ExprKind::Name(_) => true,
        ExprKind::Field(b, _) => is_path(b),
        // `model_of(rollout).layers`: a builtin applied to paths reads like a path.
        ExprKind::Call { callee, args, .. } => {
            matches!(&callee.kind, ExprKind::Name(_))
                && args.iter().all(|a| is_path(&a.value) || matches!(a.value.kind, ExprKind::Str(_)))
        }
        _ => false,
    }
}

pub fn expr_text(e: &Expr) -> String {
    match &e.kind {
        ExprKind::Name(id) => id.name.clone(),
        ExprKind::Field(b, f) => format!("{}.{}", expr_text(b), f.name),
        ExprKind::Call { callee, args, .. } => {
            let args: Vec<String> = args.iter().map(|a| expr_text(&a.value)).collect();
            format!("{}({})", expr_text(callee), args.join(", "))
        }
        ExprKind::Str(s) => format!("{s:?}"),
        _ => "…".into(),
    }
}
