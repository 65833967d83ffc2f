//! Stage instances of the recipe being evaluated: their fields and arguments, their ports, and
//! the model each one runs.

use super::fields::Owner;
use super::{Eval, Instance, InstanceInit, RecipeState, R};
use crate::value::{FieldValue, ItemRef, PortKind, Record, Value};
use miles_grammar::ast::{self, ItemKind, TypeExprKind};
use miles_grammar::diag::Span;
use std::sync::Arc;

/// The port kind a port or output type names (`Policy`), if it names one.
fn port_kind(t: &ast::TypeExpr) -> Option<PortKind> {
    match &t.kind {
        TypeExprKind::Named(p) if p.segments.len() == 1 => PortKind::from_name(&p.segments[0].name),
        _ => None,
    }
}

impl<'p> Eval<'p> {
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
            state: Default::default(),
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

    /// A field of stage instance `i`: set in its block (evaluated in the recipe's scope), else
    /// its kind's default (evaluated in the kind's scope).
    pub fn instance_field_value(&mut self, i: usize, name: &str) -> R<FieldValue> {
        // Diagnostics about an instance's field point at the instance, not at a use.
        self.field(Owner::Instance(i), name, Span::default())
    }

    /// `name` read on stage instance `i` (`rollout.engine`, or `engine` inside its kind): one
    /// of its fields, else one of its arguments. `None` when it is neither.
    pub(super) fn instance_member(&mut self, i: usize, name: &str) -> Option<R<Value>> {
        let kind = self.recipe.as_ref()?.instances[i].kind;
        if self.decl_field(kind, name).is_some() {
            return Some(self.instance_field(i, name));
        }
        let args = &self.recipe.as_ref()?.instances[i].args;
        args.iter().find(|(p, _, _)| p == name).map(|(_, v, _)| Some(v.clone()))
    }

    pub(super) fn port_names(&self, kind: ItemRef) -> Vec<String> {
        match &self.program.item(kind).kind {
            ItemKind::Stage(s) => s.ports.iter().map(|p| p.name.name.clone()).collect(),
            _ => Vec::new(),
        }
    }

    /// What a stage kind produces (`-> Policy`).
    pub fn stage_output(&self, kind: ItemRef) -> Option<PortKind> {
        match &self.program.item(kind).kind {
            ItemKind::Stage(s) => port_kind(s.output.as_ref()?),
            _ => None,
        }
    }

    pub(super) fn port_accepts(&self, p: PortKind, v: &Value) -> bool {
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

    pub(super) fn describe_port_value(&self, v: &Value) -> String {
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

    /// Whether every stage upstream of `v` got all its inputs (none failed to resolve).
    pub(super) fn inputs_complete(&self, v: &Value) -> bool {
        let Some(r) = &self.recipe else { return true };
        // Each stage once: inputs that loop (E0303) would otherwise be walked once per path,
        // exponentially many.
        let mut seen = std::collections::HashSet::new();
        let mut stack = vec![v];
        while let Some(Value::Stage(n)) = stack.pop() {
            let Some(&i) = r.by_name.get(n) else { continue };
            if !seen.insert(i) {
                continue;
            }
            if r.instances[i].args.len() < self.port_names(r.instances[i].kind).len() {
                return false;
            }
            stack.extend(r.instances[i].args.iter().map(|(_, a, _)| a));
        }
        true
    }

    /// The model a value runs: a record of a schema that `is Model` is its own model; a stage
    /// of the recipe runs the model behind its `Policy` ports, else behind its `Trajectories`
    /// ports (ports in declaration order). This is the one definition of "a stage's model":
    /// `model_of(stage)` in checks uses it, and lowering stores it on each `StageNode`.
    pub fn model_of(&self, v: &Value) -> Option<Arc<Record>> {
        self.model_of_at(v, 0)
    }

    /// Whether `v`'s Policy and Trajectories inputs lead back to a stage already passed: a
    /// forward cycle, which the stage graph reports (E0303), so `model_of` adds no word of its own.
    pub(super) fn inputs_loop(&self, v: &Value) -> bool {
        let Some(r) = self.recipe.as_ref() else { return false };
        let mut seen = std::collections::HashSet::new();
        let mut stack = vec![v.clone()];
        while let Some(Value::Stage(n)) = stack.pop() {
            if !seen.insert(n.clone()) {
                return true;
            }
            let Some(&i) = r.by_name.get(&n) else { continue };
            let inst = &r.instances[i];
            let ItemKind::Stage(decl) = &self.program.item(inst.kind).kind else { continue };
            for p in &decl.ports {
                if matches!(port_kind(&p.ty), Some(PortKind::Policy | PortKind::Trajectories)) {
                    if let Some((_, arg, _)) = inst.args.iter().find(|(name, _, _)| *name == p.name.name) {
                        stack.push(arg.clone());
                    }
                }
            }
        }
        false
    }

    fn model_of_at(&self, v: &Value, depth: u32) -> Option<Arc<Record>> {
        if depth > 64 {
            return None;
        }
        match v {
            Value::Record(r) if self.schema_is_named_iface(r.schema, "Model") => Some(r.clone()),
            Value::Stage(n) => {
                let r = self.recipe.as_ref()?;
                let inst = &r.instances[*r.by_name.get(n)?];
                let ItemKind::Stage(decl) = &self.program.item(inst.kind).kind else { return None };
                [PortKind::Policy, PortKind::Trajectories].into_iter().find_map(|want| {
                    decl.ports.iter().filter(|p| port_kind(&p.ty) == Some(want)).find_map(|p| {
                        let (_, arg, _) = inst.args.iter().find(|(name, _, _)| *name == p.name.name)?;
                        self.model_of_at(arg, depth + 1)
                    })
                })
            }
            _ => None,
        }
    }
}
