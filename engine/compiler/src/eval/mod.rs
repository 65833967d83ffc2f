//! Compile-time evaluation: names, types, units, records, stage instances and checks.
//!
//! Evaluation is lazy and memoised (a default may refer to another field, a check to a field of
//! another stage), and total: there are no user functions, loops or recursion, and reference
//! cycles are reported (E0206) instead of followed.
//!
//! One `impl Eval` spread over concept files: `names` (types, scopes, enum members), `fields`
//! (the one lazy field-resolution algorithm, for records and stage instances alike), `records`
//! (schema records and the recipe's settings), `stages` (stage instances, ports, the model a
//! stage runs), `checks`, `coerce`, `expr` and `builtins`.

mod builtins;
mod checks;
mod coerce;
mod expr;
mod fields;
mod names;
mod records;
mod stages;

pub use builtins::Builtin;
pub use checks::expr_text;
pub use expr::values_equal;
pub use names::bare_enum_member;
pub use records::set_twice;

use crate::program::Program;
use crate::types::{Iface, Type};
use crate::value::{FieldValue, ItemRef, PortKind, Value};
use fields::FieldState;
use miles_grammar::ast::{self, Expr, FieldDecl, ItemKind};
use miles_grammar::diag::ErrorCode;
use miles_grammar::diag::{Diagnostic, Span};
use std::collections::{BTreeMap, HashMap};

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
    /// Where the record is written: what a builtin reading the whole record points at.
    span: Span,
    provided: BTreeMap<String, FieldValue>,
    state: FieldState,
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
    state: FieldState,
}

/// What a recipe binding that instantiates a stage kind gives `Eval::add_instance`.
pub struct InstanceInit {
    pub name: String,
    pub kind: ItemRef,
    pub binding_span: Span,
    pub name_span: Span,
    pub provided: BTreeMap<String, (Expr, u32, Span)>,
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
    /// The cluster's expression failed (its error is reported): the settings are not built, so
    /// no second error says the cluster is missing.
    pub cluster_failed: bool,
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
    /// Files builtins read (`hf_config`, `exists`); none: those builtins report they cannot.
    fs: Option<&'p dyn crate::fs::FileSystem>,
    /// `hf_config` results by directory, so a model used by several stages is read once.
    hf_configs: HashMap<String, Result<BTreeMap<String, Value>, String>>,
    /// The Hugging Face Hub cache `hf_snapshot` resolves in (`Options::hub_cache`).
    pub hub_cache: Option<String>,
    /// `peft_adapter` reads by directory, so the schema's defaults and checks read one file once.
    peft_adapters: HashMap<String, Result<crate::peft::Adapter, String>>,
}

/// `None` means "failed, and already reported" (or, while quiet, would have been).
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
            fs: None,
            hf_configs: HashMap::new(),
            hub_cache: None,
            peft_adapters: HashMap::new(),
        }
    }

    /// An evaluator whose builtins may read files through `fs` (a model's config.json).
    pub fn with_fs(program: &'p Program, fs: &'p dyn crate::fs::FileSystem) -> Eval<'p> {
        Eval { fs: Some(fs), ..Eval::new(program) }
    }

    pub fn report(&mut self, d: Diagnostic) {
        if self.quiet == 0 {
            self.diags.push(d);
        }
    }

    /// Reports a failure that no recipe can cause: the embedded standard library lacks a
    /// declaration the compiler relies on. It says so, so a user does not hunt for a mistake
    /// in their recipe. `code` stays the code the same failure had before it was marked.
    fn internal_error(&mut self, code: ErrorCode, span: Span, what: String) {
        self.report(
            Diagnostic::error(code, format!("internal error: {what}"))
                .with_primary(span, "while compiling this")
                .with_help("this is a bug in miles, not in the recipe; please report it"),
        );
    }

    /// Evaluates `e` with `ty` as the expected type and checks the result against it (the
    /// pattern behind every typed field, argument and constant).
    pub(crate) fn eval_as(&mut self, e: &Expr, env: Env, ty: Option<&Type>) -> R<Value> {
        let v = self.eval(e, env, ty)?;
        match ty {
            Some(t) => self.coerce(v, t, e.span),
            None => Some(v),
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

    /// The field `name` that schema or stage kind `r` declares.
    pub fn decl_field(&self, r: ItemRef, name: &str) -> Option<&'p FieldDecl> {
        self.decl_fields(r).iter().find(|d| d.name.name == name)
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
                    ErrorCode::E0206,
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
        let v = self.eval_as(value_expr, Env::Module(r.module), expected.as_ref());
        self.consts_in_progress.pop();
        self.consts.insert(r, v.clone());
        v
    }

    /// A prelude interface by name (`Model`, `Cluster`), if the prelude declares it.
    pub fn named_interface(&self, name: &str) -> Option<Type> {
        crate::program::PRELUDE
            .iter()
            .filter_map(|p| self.program.module_by_key(p))
            .filter_map(|m| self.program.module(m).own.get(name).copied())
            .find(|r| matches!(self.program.item(*r).kind, ItemKind::Interface(_)))
            .map(|r| Type::Interface(Iface::Decl(r, name.to_string())))
    }

    /// A declaration of the prelude modules by name (`recipe_settings`, `local`).
    pub fn prelude_decl(&self, name: &str) -> Option<ItemRef> {
        crate::program::PRELUDE
            .iter()
            .filter_map(|p| self.program.module_by_key(p))
            .find_map(|m| self.program.module(m).own.get(name).copied())
    }
}

#[cfg(test)]
mod tests;
