//! The `.miles` compiler: modules, names, types, units, constant evaluation, checks, and
//! lowering to the `StageGraph`. Pure: it reads files only through a `FileSystem` and returns
//! values and diagnostics.

pub mod capability;
mod combine;
pub mod eval;
pub mod fs;
pub mod graph;
pub mod hf;
pub mod hub;
pub mod job;
pub mod num;
mod pass_env;
pub mod peer_names;
pub mod peft;
pub mod program;
pub mod recipe;
pub mod suggest;
pub mod types;
pub mod value;

pub use miles_grammar::diag::{Diagnostic, FileId, Severity, Span, Spanned};
pub use program::{ParseCache, Program, Sources};
pub use recipe::{CompiledRecipe, Override};

use eval::Eval;
use miles_grammar::ast::{self, ExprKind, Ident, ItemKind};
use miles_grammar::diag::ErrorCode;
use value::ItemRef;

#[derive(Clone, Debug, Default)]
pub struct Options {
    /// `--set key=value`, applied to every recipe compiled.
    pub overrides: Vec<(String, String)>,
    /// Compile only this recipe (by name) instead of every recipe in the entry files.
    pub recipe: Option<String>,
    /// The local Hugging Face Hub cache (`hub::cache_root` of the environment), where
    /// `hf { repo }` resolves. The CLI and the language server compute it once, so every verb
    /// and the editor agree; None: `repo` cannot resolve here (the compiler reads no
    /// environment).
    pub hub_cache: Option<String>,
}

pub struct Compilation {
    pub program: Program,
    pub diagnostics: Vec<Diagnostic>,
    pub recipes: Vec<CompiledRecipe>,
    /// Every resolved reference: (use span, definition span), for go-to-definition.
    pub references: Vec<(Span, Span)>,
    /// The values of the user modules' constants, models and clusters, as evaluated here (with
    /// the files builtins read, which an editor's later evaluations do not have).
    pub item_values: std::collections::HashMap<ItemRef, value::Value>,
}

impl Compilation {
    pub fn has_errors(&self) -> bool {
        self.diagnostics.iter().any(|d| d.is_error())
    }
    pub fn recipe(&self, name: &str) -> Option<&CompiledRecipe> {
        self.recipes.iter().find(|r| r.name == name)
    }
}

/// Compiles the entry files and everything they import.
pub fn compile(fs: &dyn fs::FileSystem, entries: &[String], opts: &Options) -> Compilation {
    compile_with(fs, entries, opts, &program::Packages::default(), &ParseCache::new())
}

/// `compile`, reusing the parsed modules `cache` holds from earlier compilations (an editor's
/// session keeps one: the stdlib is parsed once, each other file when its text changes).
pub fn compile_cached(fs: &dyn fs::FileSystem, entries: &[String], opts: &Options, cache: &ParseCache) -> Compilation {
    compile_with(fs, entries, opts, &program::Packages::default(), cache)
}

/// `compile` in a package build: imports resolve through `packages` (see `program::load_in`).
pub fn compile_in(
    fs: &dyn fs::FileSystem,
    entries: &[String],
    opts: &Options,
    packages: &program::Packages,
) -> Compilation {
    compile_with(fs, entries, opts, packages, &ParseCache::new())
}

/// The one compilation: package imports through `packages`, parsed modules reused from `cache`.
pub fn compile_with(
    fs: &dyn fs::FileSystem,
    entries: &[String],
    opts: &Options,
    packages: &program::Packages,
    cache: &ParseCache,
) -> Compilation {
    let mut diags = Vec::new();
    let mut program = program::load_with(fs, entries, packages, cache, &mut diags);
    let overrides = parse_overrides(&mut program, &opts.overrides, &mut diags);
    let overrides = override_items(&mut program, overrides, &mut diags);
    program.house_rules = parse_house_rules(&mut program, &mut diags);
    let mut item_values = std::collections::HashMap::new();
    let (recipes, references) = {
        let mut ev = Eval::with_fs(&program, fs);
        ev.hub_cache = opts.hub_cache.clone();
        let mut recipes = Vec::new();
        // Every item of the user's modules is checked; the standard library is checked where used.
        let user_modules: Vec<u32> = (0..program.modules.len() as u32).filter(|m| !program.module(*m).is_std).collect();
        for &m in &user_modules {
            for (index, item) in program.module(m).ast.items.iter().enumerate() {
                let r = ItemRef { module: m, index: index as u32 };
                match &item.kind {
                    ItemKind::Const(_) | ItemKind::Model(_) | ItemKind::Cluster(_) => {
                        if let Some(v) = ev.item_value(r) {
                            item_values.insert(r, v);
                        }
                    }
                    ItemKind::Schema(_) | ItemKind::Stage(_) => {
                        for f in ev.decl_fields(r) {
                            ev.resolve_type(m, &f.ty);
                        }
                        if let ItemKind::Stage(s) = &item.kind {
                            for p in &s.ports {
                                ev.resolve_type(m, &p.ty);
                            }
                        }
                        if let ItemKind::Schema(s) = &item.kind {
                            if let Some(i) = &s.interface {
                                if eval::Eval::is_port_name(&i.name) {
                                    continue;
                                }
                                let path = miles_grammar::ast::Path { segments: vec![i.clone()], span: i.span };
                                let t = miles_grammar::ast::TypeExpr {
                                    kind: miles_grammar::ast::TypeExprKind::Named(path),
                                    span: i.span,
                                };
                                ev.resolve_type(m, &t);
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
        let mut found = false;
        for &m in &program.entries {
            for (index, item) in program.module(m).ast.items.iter().enumerate() {
                let ItemKind::Recipe(r) = &item.kind else { continue };
                if opts.recipe.as_ref().is_some_and(|want| *want != r.name.name) {
                    continue;
                }
                found = true;
                if let Some(c) = recipe::compile_recipe(&mut ev, ItemRef { module: m, index: index as u32 }, &overrides)
                {
                    recipes.push(c);
                }
            }
        }
        if let (Some(want), false) = (&opts.recipe, found) {
            let names: Vec<String> = program
                .entries
                .iter()
                .flat_map(|m| program.module(*m).ast.items.iter())
                .filter_map(|i| match &i.kind {
                    ItemKind::Recipe(r) => Some(r.name.name.clone()),
                    _ => None,
                })
                .collect();
            let mut d = Diagnostic::error(ErrorCode::E0308, format!("no recipe `{want}` in the given files"));
            d = match suggest::did_you_mean(want, names.iter().map(|s| s.as_str())) {
                Some(s) => d.with_help(format!("did you mean `{s}`?")),
                None => {
                    d.with_help(format!("recipes: {}", if names.is_empty() { "none".into() } else { names.join(", ") }))
                }
            };
            ev.report(d);
        }
        diags.extend(ev.diags);
        // The run contract: what the recipe's target does not execute (docs/capabilities.md).
        for r in &recipes {
            diags.extend(capability::check(r));
        }
        (recipes, ev.references)
    };
    sort_diagnostics(&mut diags);
    Compilation { program, diagnostics: diags, recipes, references, item_values }
}

/// Source order, so reports read top to bottom; duplicates (same code and span) dropped.
fn sort_diagnostics(diags: &mut Vec<Diagnostic>) {
    diags.sort_by_key(|d| {
        let s = d.primary.as_ref().map(|l| l.span).unwrap_or_default();
        (s.file, s.start, s.end, d.code)
    });
    diags.dedup_by(|a, b| a.code == b.code && a.primary == b.primary && a.message == b.message);
}

/// `--set policy.path="..."`: an override whose head names a `model` or `cluster` of the user's
/// modules sets that field of the item's record literal (replacing the field or adding it) before
/// anything is evaluated. The others are the recipe's (stages and settings).
fn override_items(program: &mut Program, overrides: Vec<Override>, diags: &mut Vec<Diagnostic>) -> Vec<Override> {
    let mut rest = Vec::new();
    for o in overrides {
        let target = program.modules.iter().position(|m| {
            !m.is_std
                && m.ast.items.iter().any(
                    |it| matches!(&it.kind, ItemKind::Model(b) | ItemKind::Cluster(b) if b.name.name == o.path[0].name),
                )
        });
        let Some(m) = target else {
            rest.push(o);
            continue;
        };
        if o.path.len() != 2 {
            diags.push(
                Diagnostic::error(
                    ErrorCode::E0209,
                    format!("`{}` is a model or cluster: set one of its fields", o.path[0].name),
                )
                .with_primary(o.span, "expected `name.field`")
                .with_help(format!("example: --set {}.path=\"...\"", o.path[0].name)),
            );
            continue;
        }
        let ast = std::sync::Arc::make_mut(&mut program.modules[m].ast);
        for it in &mut ast.items {
            let (ItemKind::Model(b) | ItemKind::Cluster(b)) = &mut it.kind else { continue };
            if b.name.name != o.path[0].name {
                continue;
            }
            let ExprKind::Record { fields, .. } = &mut b.value.kind else {
                diags.push(
                    Diagnostic::error(
                        ErrorCode::E0209,
                        format!("`{}` is not written as a record: its fields cannot be set", b.name.name),
                    )
                    .with_primary(o.span, "this override")
                    .with_secondary(b.value.span, "defined here"),
                );
                break;
            };
            let field = &o.path[1];
            let binding = ast::Binding {
                doc: None,
                path: ast::Path { segments: vec![field.clone()], span: o.span },
                value: o.value.clone(),
                span: o.span,
            };
            match fields.iter_mut().find(|f| f.path.segments.len() == 1 && f.path.segments[0].name == field.name) {
                Some(existing) => *existing = binding,
                None => fields.push(binding),
            }
            break;
        }
    }
    rest
}

/// The build's house rules (`[[rule]]` in a manifest) as checks: each check's text becomes a source
/// named by where it is declared, so its diagnostics render like any other. A rule naming no
/// stdlib stage kind is an error at the manifest's rule.
fn parse_house_rules(program: &mut Program, diags: &mut Vec<Diagnostic>) -> Vec<program::HouseCheck> {
    let kinds: Vec<String> = program
        .modules
        .iter()
        .filter(|m| m.is_std)
        .flat_map(|m| m.ast.items.iter())
        .filter_map(|it| match &it.kind {
            ItemKind::Stage(s) => Some(s.name.name.clone()),
            _ => None,
        })
        .collect();
    let mut out = Vec::new();
    for rule in program.packages.rules.clone() {
        let file = program.sources.add(rule.origin.clone(), rule.check.clone());
        let whole = Span::new(file, 0, rule.check.len());
        if !kinds.contains(&rule.stage) {
            let mut d = Diagnostic::error(
                ErrorCode::E0112,
                format!("invalid miles.toml: house rule {} names no stage kind `{}`", rule.origin, rule.stage),
            )
            .with_primary(whole, "this rule's check")
            .with_help(format!("`stage` is a stdlib stage kind: {}", kinds.join(", ")));
            if let Some(s) = suggest::did_you_mean(&rule.stage, kinds.iter().map(String::as_str)) {
                d = d.with_help(format!("did you mean `{s}`?"));
            }
            diags.push(d);
            continue;
        }
        let (expr, ds) = miles_grammar::parse_expr(file, &rule.check);
        diags.extend(ds);
        let Some(expr) = expr else { continue };
        let lit = |t: Option<String>| t.map(|value| ast::Text::plain(value, whole));
        let check = ast::Check {
            doc: None,
            warn: rule.warn,
            expr,
            at: None,
            message: lit(rule.message),
            help: lit(rule.help),
            span: whole,
        };
        out.push(program::HouseCheck { stage: rule.stage, check, origin: rule.origin });
    }
    out
}

fn parse_overrides(program: &mut Program, raw: &[(String, String)], diags: &mut Vec<Diagnostic>) -> Vec<Override> {
    let mut out = Vec::new();
    for (key, value) in raw {
        // The value becomes a source file of its own, named after the key, so diagnostics
        // about it render like any other.
        let file = program.sources.add(format!("--set {key}"), value.clone());
        let whole = Span::new(file, 0, value.len());
        let (expr, ds) = miles_grammar::parse_expr(file, value);
        diags.extend(ds);
        let Some(expr) = expr else { continue };
        let segments: Vec<&str> = key.split('.').collect();
        let valid = segments.iter().all(|seg| {
            !seg.is_empty()
                && seg.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && seg.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        });
        if !valid {
            diags.push(
                Diagnostic::error(ErrorCode::E0209, format!("`{key}` is not a field path"))
                    .with_primary(whole, "expected `stage.field` or `setting`")
                    .with_help("example: --set train.lr=1e-4"),
            );
            continue;
        }
        let path = segments.iter().map(|s| Ident { name: s.to_string(), span: whole }).collect();
        out.push(Override { path, value: expr, span: whole });
    }
    out
}
