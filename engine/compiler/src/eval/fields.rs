//! The one field-resolution algorithm, shared by schema records and stage instances: a field is
//! the value set for it, else its default (evaluated lazily, in its owner's scope), else `none`
//! for an optional field; it is computed once, checked against its `in` constraint, and a
//! default that comes back to itself is a cycle (E0206).

use super::checks::out_of_range;
use super::{Env, Eval, R};
use crate::value::{FieldValue, ItemRef, Value};
use miles_grammar::ast::{Expr, ExprKind, FieldDecl};
use miles_grammar::diag::ErrorCode;
use miles_grammar::diag::{Diagnostic, Span};
use std::collections::BTreeMap;

/// The memo of one owner's fields.
#[derive(Default)]
pub(super) struct FieldState {
    computed: BTreeMap<String, Option<FieldValue>>,
    in_progress: Vec<String>,
}

/// Whose fields: the record under construction in frame `usize`, or stage instance `usize`.
#[derive(Clone, Copy)]
pub(super) enum Owner {
    Record(usize),
    Instance(usize),
}

impl Owner {
    /// The scope defaults and constraints are evaluated in.
    fn env(self) -> Env {
        match self {
            Owner::Record(f) => Env::Record(f),
            Owner::Instance(i) => Env::Instance(i),
        }
    }
}

/// A field set by the user: a record's fields arrive evaluated, a stage block's as expressions
/// of the recipe (with the module whose scope they use).
enum Given {
    Evaluated(FieldValue),
    Expr(Expr, u32),
}

impl<'p> Eval<'p> {
    /// The field `name` of `owner`, resolved once. `use_span` is where a record field is read
    /// (a stage instance's diagnostics point at the instance instead).
    pub(super) fn field(&mut self, owner: Owner, name: &str, use_span: Span) -> R<FieldValue> {
        let decl_ref = self.owner_decl(owner)?;
        let state = self.field_state(owner)?;
        if let Some(c) = state.computed.get(name) {
            return c.clone();
        }
        if state.in_progress.iter().any(|n| n == name) {
            self.report_field_cycle(owner, name, use_span);
            return None;
        }
        let decl = self.decl_field(decl_ref, name)?;
        let ty = self.resolve_type(decl_ref.module, &decl.ty);
        self.field_state(owner)?.in_progress.push(name.to_string());
        let result = match self.given(owner, name) {
            Some(Given::Evaluated(fv)) => Some(fv),
            Some(Given::Expr(expr, module)) => self
                .eval_as(&expr, Env::Recipe(module), ty.as_ref())
                .map(|value| FieldValue { value, span: expr.span, defaulted: false }),
            None => match &decl.default {
                Some(def) => self.eval_as(def, owner.env(), ty.as_ref()).map(|value| FieldValue {
                    value,
                    span: def.span,
                    defaulted: true,
                }),
                None if ty.as_ref().is_some_and(|t| t.is_optional()) => {
                    Some(FieldValue { value: Value::None, span: decl.span, defaulted: true })
                }
                None => {
                    self.report_missing_field(owner, decl, use_span);
                    None
                }
            },
        };
        if let (Some(fv), Some(c)) = (&result, &decl.constraint) {
            if self.in_constraint(&fv.value, c, owner.env()) == Some(false) {
                let cons = self.quiet_eval(c, owner.env());
                self.report(out_of_range(name, &fv.value, cons.as_ref(), fv.span, c.span));
            }
        }
        if let Some(state) = self.field_state(owner) {
            state.in_progress.pop();
            state.computed.insert(name.to_string(), result.clone());
        }
        result
    }

    /// The schema or stage kind declaring the owner's fields.
    fn owner_decl(&self, owner: Owner) -> Option<ItemRef> {
        match owner {
            Owner::Record(f) => Some(self.frames[f].schema),
            Owner::Instance(i) => Some(self.recipe.as_ref()?.instances[i].kind),
        }
    }

    fn field_state(&mut self, owner: Owner) -> Option<&mut FieldState> {
        match owner {
            Owner::Record(f) => Some(&mut self.frames[f].state),
            Owner::Instance(i) => Some(&mut self.recipe.as_mut()?.instances[i].state),
        }
    }

    /// Where the value of `e` was written: for a bare name of a field the user set on the record
    /// or stage being evaluated, the user's value (so a builtin's error points into the recipe,
    /// not at the stdlib default that passed the field on); else `e` itself.
    pub(super) fn origin_span(&self, e: &Expr, env: Env) -> Span {
        let ExprKind::Name(id) = &e.kind else { return e.span };
        let owner = match env {
            Env::Record(f) => Owner::Record(f),
            Env::Instance(i) => Owner::Instance(i),
            _ => return e.span,
        };
        match self.computed_field(owner, &id.name) {
            Some(fv) if !fv.defaulted => fv.span,
            _ => e.span,
        }
    }

    /// The field as resolved so far (`None` before `field` ran for it, or when it failed).
    pub(super) fn computed_field(&self, owner: Owner, name: &str) -> Option<&FieldValue> {
        let state = match owner {
            Owner::Record(f) => &self.frames[f].state,
            Owner::Instance(i) => &self.recipe.as_ref()?.instances[i].state,
        };
        state.computed.get(name)?.as_ref()
    }

    fn given(&self, owner: Owner, name: &str) -> Option<Given> {
        match owner {
            Owner::Record(f) => self.frames[f].provided.get(name).cloned().map(Given::Evaluated),
            Owner::Instance(i) => {
                let (expr, module, _) = self.recipe.as_ref()?.instances[i].provided.get(name)?;
                Some(Given::Expr(expr.clone(), *module))
            }
        }
    }

    fn report_field_cycle(&mut self, owner: Owner, name: &str, use_span: Span) {
        let d = match owner {
            Owner::Record(f) => {
                let mut path = self.frames[f].state.in_progress.clone();
                path.push(name.to_string());
                Diagnostic::error(
                    ErrorCode::E0206,
                    format!("field defaults refer to each other: {}", path.join(" -> ")),
                )
                .with_primary(use_span, "while building this record")
            }
            Owner::Instance(i) => {
                let Some(r) = self.recipe.as_ref() else { return };
                let inst = &r.instances[i];
                let mut path: Vec<String> =
                    inst.state.in_progress.iter().map(|n| format!("{}.{}", inst.name, n)).collect();
                path.push(format!("{}.{name}", inst.name));
                let span = inst.provided.get(name).map(|p| p.2).unwrap_or(inst.binding_span);
                Diagnostic::error(ErrorCode::E0206, format!("fields refer to each other: {}", path.join(" -> ")))
                    .with_primary(span, "part of the cycle")
            }
        };
        self.report(d);
    }

    fn report_missing_field(&mut self, owner: Owner, decl: &FieldDecl, use_span: Span) {
        let name = &decl.name.name;
        let d = match owner {
            Owner::Record(f) => {
                let schema_name = self.decl_name(self.frames[f].schema);
                Diagnostic::error(ErrorCode::E0106, format!("`{schema_name}` needs `{name}`"))
                    .with_primary(use_span, format!("`{name}` is not set"))
                    .with_secondary(decl.span, "declared here without a default")
                    .with_help(format!("add `{name} = ...`"))
            }
            Owner::Instance(i) => {
                let Some(r) = self.recipe.as_ref() else { return };
                let inst = &r.instances[i];
                let (iname, kname) = (inst.name.clone(), self.decl_name(inst.kind));
                Diagnostic::error(ErrorCode::E0106, format!("stage `{iname}` ({kname}) needs `{name}`"))
                    .with_primary(inst.binding_span, format!("`{name}` is not set"))
                    .with_secondary(decl.span, "declared here without a default")
                    .with_help(format!("add `{name} = ...` to the block of `{iname}`"))
            }
        };
        self.report(d);
    }
}
