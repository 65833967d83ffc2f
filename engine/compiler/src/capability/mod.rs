//! The run contract: every field a recipe sets is executed by the backend the recipe runs on, or
//! refused here with E0511 naming the field and its line. What each backend executes is data
//! (`table.rs`), checked against the compiled recipe; docs/capabilities.md is generated from the
//! same table, and a test fails when a stdlib field is missing from it.

mod rules;
pub mod shape;
mod table;

pub use table::{Entry, Support, Unproven, TABLE, UNPROVEN};

use crate::graph::StageNode;
use crate::recipe::CompiledRecipe;
use crate::value::{FieldValue, Record, Value};
use miles_grammar::diag::ErrorCode;
use miles_grammar::diag::{Diagnostic, Span};

/// Where a recipe's stages execute. `Cluster` recipes (GPU engines and trainers, GPU clusters)
/// are planned but not run: `miles run` refuses them, so no field is refused at check time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Target {
    /// The embedded libtorch backend inside `miles run` (the `in_process` launcher).
    Embedded,
    /// The same backend as worker processes (`local_processes`, `slurm`, `ray` launchers).
    Workers,
    /// Rollout on SGLang-compatible servers given by URL; the trainer in `miles run`.
    Http,
    /// GPU engines and trainers: planned by `miles plan`, not executed by `miles run`.
    Cluster,
}

impl Target {
    /// The targets `miles run` executes: the columns of the capability matrix.
    pub const RUNNABLE: [Target; 3] = [Target::Embedded, Target::Workers, Target::Http];

    pub fn name(self) -> &'static str {
        match self {
            Target::Embedded => "embedded",
            Target::Workers => "workers",
            Target::Http => "http",
            Target::Cluster => "cluster",
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            Target::Embedded => "the embedded backend",
            Target::Workers => "the embedded backend in worker processes",
            Target::Http => "a run whose rollout is served by URL",
            Target::Cluster => "a GPU cluster (plan only)",
        }
    }

    fn from_name(n: &str) -> Option<Target> {
        Self::RUNNABLE.into_iter().chain([Target::Cluster]).find(|t| t.name() == n)
    }
}

/// Schemas that exist only on GPU clusters: a recipe using one is planned, not run here.
const CLUSTER_SCHEMAS: &[&str] = &["gpu_cluster", "megatron", "fsdp"];

/// The target a recipe runs on: its `runs_on` setting, else what its stages and settings imply
/// (the one `miles run` would use).
pub fn target_of(recipe: &CompiledRecipe) -> Target {
    let settings = recipe.settings.as_record();
    if let Some(t) = settings.and_then(|s| s.get("runs_on")).and_then(Value::as_enum).and_then(Target::from_name) {
        return t;
    }
    let mut records = Vec::new();
    for node in recipe.graph.nodes() {
        for p in node.params.values() {
            collect_records(&p.value, &mut records);
        }
        for v in node.inputs.values() {
            collect_records(v, &mut records);
        }
    }
    if let Some(s) = settings {
        for f in s.fields.values() {
            collect_records(&f.value, &mut records);
        }
    }
    let mut http = false;
    for r in &records {
        match r.schema_name.as_str() {
            n if CLUSTER_SCHEMAS.contains(&n) => return Target::Cluster,
            "sglang" if r.get("url").is_none_or(|u| *u == Value::None) => return Target::Cluster,
            "sglang" => http = true,
            _ => {}
        }
    }
    if http {
        return Target::Http;
    }
    match settings.and_then(|s| s.get("launcher")).and_then(Value::as_record) {
        Some(l) if l.schema_name != "in_process" => Target::Workers,
        _ => Target::Embedded,
    }
}

fn collect_records<'v>(v: &'v Value, out: &mut Vec<&'v Record>) {
    match v {
        Value::Record(r) => {
            out.push(r);
            for f in r.fields.values() {
                collect_records(&f.value, out);
            }
        }
        Value::List(l) => l.iter().for_each(|x| collect_records(x, out)),
        _ => {}
    }
}

/// What a rule sees: the recipe and the target it runs on.
pub struct Ctx<'r> {
    pub recipe: &'r CompiledRecipe,
    pub target: Target,
    /// The record whose fields are being judged (None for a stage's parameters and the recipe's
    /// settings): a rule may read the field's siblings.
    pub record: Option<&'r Record>,
}

impl Ctx<'_> {
    pub fn stages(&self, kind: &str) -> Vec<&StageNode> {
        self.recipe.graph.nodes().filter(|n| n.kind == kind).collect()
    }
}

/// E0511 for every field of `recipe` its target does not execute.
pub fn check(recipe: &CompiledRecipe) -> Vec<Diagnostic> {
    let target = target_of(recipe);
    if target == Target::Cluster {
        return Vec::new();
    }
    let cx = Ctx { recipe, target, record: None };
    let mut out = Vec::new();
    for node in recipe.graph.nodes() {
        if !node.kind_path.starts_with("std/") {
            out.push(refusal(
                node.name_span,
                target,
                &format!("`{}` (a stage kind of its own module)", node.kind),
                "the embedded backend runs the stage kinds of std/stages",
            ));
            continue;
        }
        if check_owner(&cx, &node.kind, node.name_span, &mut out) {
            continue;
        }
        for (name, p) in &node.params {
            let fv = FieldValue { value: p.value.clone(), span: p.span, defaulted: p.defaulted };
            check_field(&cx, &node.kind, name, &fv, &mut out);
        }
        for v in node.inputs.values() {
            if let Value::Record(r) = v {
                check_record(&cx, r, &mut out);
            }
        }
    }
    if let Some(s) = recipe.settings.as_record() {
        for (name, f) in &s.fields {
            check_field(&cx, "recipe_settings", name, f, &mut out);
        }
    }
    out.sort_by_key(|d| d.primary.as_ref().map(|l| (l.span.file, l.span.start)));
    out.dedup_by(|a, b| a.primary == b.primary && a.message == b.message);
    out
}

fn check_record(cx: &Ctx, r: &Record, out: &mut Vec<Diagnostic>) {
    if check_owner(cx, &r.schema_name, r.span, out) {
        return;
    }
    let cx = Ctx { record: Some(r), ..*cx };
    for (name, f) in &r.fields {
        check_field(&cx, &r.schema_name, name, f, out);
    }
}

/// A schema or stage kind itself (`engine = sglang {...}`, `ppo(...)`); true when refused, so
/// its fields need no word of their own.
fn check_owner(cx: &Ctx, owner: &str, span: Span, out: &mut Vec<Diagnostic>) -> bool {
    let why = table::lookup(owner, "").and_then(|e| e.refuses(cx, None));
    if let Some(why) = &why {
        out.push(refusal(span, cx.target, &format!("`{owner}`"), why));
    }
    why.is_some()
}

fn check_field(cx: &Ctx, owner: &str, name: &str, f: &FieldValue, out: &mut Vec<Diagnostic>) {
    // A schema outside the table (a team's own) is data the backend does not read.
    if let Some(why) = table::lookup(owner, name).and_then(|e| e.refuses(cx, Some(f))) {
        out.push(refusal(f.span, cx.target, &format!("`{owner}.{name}` = {}", short(&f.value)), &why));
        // The field as a whole is refused: what its value holds needs no second word.
        return;
    }
    if let Some(u) = Unproven::of(owner, name, f) {
        out.push(
            Diagnostic::warning(ErrorCode::E0519, format!("`{owner}.{name} = {}` is built but has never run", u.value))
                .with_primary(f.span, "built, never run on the hardware it needs")
                .with_help(u.note),
        );
    }
    match &f.value {
        Value::Record(r) => check_record(cx, r, out),
        Value::List(items) => items.iter().filter_map(Value::as_record).for_each(|r| check_record(cx, r, out)),
        _ => {}
    }
}

fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 40 {
        format!("{}...", s.chars().take(37).collect::<String>())
    } else {
        s
    }
}

fn refusal(span: Span, target: Target, what: &str, why: &str) -> Diagnostic {
    Diagnostic::error(ErrorCode::E0511, format!("{} does not execute {what}", target.describe()))
        .with_primary(span, format!("not executed by `miles run` on the {} target", target.name()))
        .with_help(why.to_string())
}

/// docs/capabilities.md, generated from the table (a test keeps the file equal to this).
pub fn matrix_markdown() -> String {
    let mut s = String::from(
        "# Capabilities\n\n\
         <!-- Generated from engine/compiler/src/capability/table.rs; \
         regenerate with `MILES_BLESS=1 cargo test -p miles-compiler capabilities_md`. -->\n\n\
         What `miles run` executes, field by field, on each target. A recipe's target is its \
         `runs_on` setting, or what its stages imply: `embedded` (the `in_process` launcher, the \
         default), `workers` (the `local_processes`, `slurm` and `ray` launchers), `http` (a \
         rollout engine `sglang { url = ... }`). A recipe naming GPU engines or trainers \
         (`sglang` without `url`, `megatron`, `fsdp`) or a `gpu_cluster` targets `cluster`: \
         `miles check` and `miles plan` accept it and `miles run` refuses it.\n\n\
         A field set to a value its target does not execute is error E0511 at `miles check`, \
         naming the field and its line. Legend: **yes** executed; **no** refused unless left at \
         its default (shown); **rule** executed for the values the note names; **describes** \
         read by the planner only (hardware, catalogs), with no effect on what a run does; \
         **built, never run** after a value: its code is built and its tests ran only where the \
         hardware it needs is absent (the refusal half), so `miles check` warns E0519 where a \
         recipe sets it, until a run on that hardware is recorded.\n\n\
         | owner | field | embedded | workers | http | note | behaviour tests |\n\
         |---|---|---|---|---|---|---|\n",
    );
    for e in TABLE {
        let cells: Vec<String> = Target::RUNNABLE
            .iter()
            .map(|t| {
                let cell = e.support.cell(*t);
                // A value built but never run qualifies the targets that would execute it.
                let unproven: Vec<String> = UNPROVEN
                    .iter()
                    .filter(|u| u.owner == e.owner && u.field == e.field && !cell.starts_with("no"))
                    .map(|u| format!("`{}`: built, never run", u.value))
                    .collect();
                if unproven.is_empty() {
                    cell
                } else {
                    format!("{cell} ({})", unproven.join(", "))
                }
            })
            .collect();
        let field = if e.field.is_empty() { "(itself)".to_string() } else { format!("`{}`", e.field) };
        s.push_str(&format!(
            "| `{}` | {} | {} | {} | {} | {} | {} |\n",
            e.owner,
            field,
            cells[0],
            cells[1],
            cells[2],
            e.note.replace('|', "\\|"),
            e.tested_by.iter().map(|t| format!("`{t}`")).collect::<Vec<_>>().join(", ")
        ));
    }
    s
}

#[cfg(test)]
mod tests;
