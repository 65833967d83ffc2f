//! Records: building a record of a schema (`adam { lr = 1e-4 }`, a schema named alone, `gb300 *
//! 64`), and the recipe's settings record, which is built the same way.

use super::fields::Owner;
use super::{Env, Eval, Frame, R};
use crate::suggest::did_you_mean;
use crate::value::{FieldValue, ItemRef, Record, Value};
use miles_grammar::ast::{self, Expr};
use miles_grammar::diag::ErrorCode;
use miles_grammar::diag::{Diagnostic, Span};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// E0104 for a field set twice in one block (a record literal or a stage block).
pub fn set_twice(again: &ast::Ident, first: Span) -> Diagnostic {
    Diagnostic::error(ErrorCode::E0104, format!("`{}` is set twice", again.name))
        .with_primary(again.span, "set again here")
        .with_secondary(first, "first set here")
}

impl<'p> Eval<'p> {
    /// Builds a record of `schema` from fields already evaluated (`provided`), computing the
    /// defaults and running the schema's checks.
    pub fn build_record(&mut self, schema: ItemRef, provided: BTreeMap<String, FieldValue>, span: Span) -> R<Value> {
        self.frames.push(Frame { schema, span, provided, state: Default::default() });
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
            if let Some(fv) = self.computed_field(Owner::Record(f), &decl.name.name) {
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

    /// A field of the record under construction in frame `f`, read at `use_span`.
    pub(super) fn frame_field(&mut self, f: usize, name: &str, use_span: Span) -> R<Value> {
        self.field(Owner::Record(f), name, use_span).map(|fv| fv.value)
    }

    /// Evaluates `schema { field = expr, ... }` in `env`.
    pub(super) fn construct(
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
                    Diagnostic::error(ErrorCode::E0209, "a dotted field path is only allowed in a recipe body")
                        .with_primary(b.path.span, "write the nested record instead"),
                );
                ok = false;
                continue;
            }
            if let Some(prev) = seen.get(&first.name) {
                self.report(set_twice(first, *prev));
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
            match self.eval_as(&b.value, env, ty.as_ref()) {
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
        let mut d = Diagnostic::error(ErrorCode::E0105, format!("`{decl_name}` has no field `{}`", id.name))
            .with_primary(id.span, "unknown field");
        if let Some((help, rename)) = self.peer_name_help(decl, &decl_name, id) {
            d = d.with_help(help);
            if let Some(f) = rename.filter(|_| self.spells(id)) {
                d = d.with_fix(format!("rename to `{f}`"), id.span, f);
            }
        } else if let Some(s) = did_you_mean(&id.name, names.iter().map(|s| s.as_str())) {
            d = d.with_help(format!("did you mean `{s}`?"));
            if self.spells(id) {
                d = d.with_fix(format!("replace with `{s}`"), id.span, s);
            }
        } else if names.is_empty() {
            d = d.with_help(format!("`{decl_name}` has no fields"));
        } else {
            d = d.with_help(format!("fields of `{decl_name}`: {}", names.join(", ")));
        }
        self.report(d);
    }

    /// Another framework's name for a field of ours (`epsilon_high` for `clip_high`): the help
    /// saying so and the field a rename fix may write (`peer_names.rs`). Only on the stdlib's own
    /// declarations: a user's schema with a stdlib name is not ours to explain.
    fn peer_name_help(
        &self,
        decl: ItemRef,
        decl_name: &str,
        id: &ast::Ident,
    ) -> Option<(String, Option<&'static str>)> {
        if !self.program.module(decl.module).is_std {
            return None;
        }
        let rows = crate::peer_names::lookup(decl_name, &id.name, |f| self.decl_field(decl, f).is_some());
        crate::peer_names::help(decl_name, &id.name, &rows)
    }

    /// Whether `id`'s span holds its name, so a fix may replace it there: a `--set train.X=...`
    /// override's path has no span of its own (it points at the value).
    fn spells(&self, id: &ast::Ident) -> bool {
        let text = self.program.sources.get(id.span.file).map(|s| s.text.as_str()).unwrap_or("");
        text.get(id.span.start as usize..id.span.end as usize) == Some(id.name.as_str())
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
        let Some(schema) = self.prelude_decl("recipe_settings") else {
            let span = r.name_span;
            self.internal_error(ErrorCode::E0103, span, "the prelude declares no `recipe_settings` schema".into());
            return None;
        };
        self.recipe.as_mut()?.settings_in_progress = true;
        let exprs: Vec<(String, (Expr, u32, Span))> =
            self.recipe.as_ref()?.settings_exprs.clone().into_iter().collect();
        let mut provided = BTreeMap::new();
        let decls = self.decl_fields(schema);
        let mut ok = !self.recipe.as_ref()?.cluster_failed;
        for (name, (expr, module, name_span)) in exprs {
            let Some(decl) = decls.iter().find(|d| d.name.name == name) else {
                let id = ast::Ident { name: name.clone(), span: name_span };
                let mut d =
                    Diagnostic::error(ErrorCode::E0105, format!("`{name}` is neither a stage nor a recipe setting"))
                        .with_primary(name_span, "unknown recipe field");
                let names: Vec<String> = decls.iter().map(|d| d.name.name.clone()).collect();
                if let Some((help, rename)) = self.peer_name_help(schema, "recipe_settings", &id) {
                    d = d.with_help(help);
                    if let Some(f) = rename.filter(|_| self.spells(&id)) {
                        d = d.with_fix(format!("rename to `{f}`"), name_span, f);
                    }
                } else if let Some(s) = did_you_mean(&id.name, names.iter().map(|s| s.as_str())) {
                    d = d.with_help(format!("did you mean `{s}`?"));
                    if self.spells(&id) {
                        d = d.with_fix(format!("replace with `{s}`"), name_span, s);
                    }
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
            match self.eval_as(&expr, Env::Recipe(module), ty.as_ref()) {
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
}
