//! Recipes: gathering bindings through `extends` and overrides, evaluating stage instances and
//! settings, running checks, and lowering to the `StageGraph` with its graph checks.

use crate::eval::{set_twice, Env, Eval, InstanceInit};
use crate::graph::{Channel, ChannelKind, Param, StageGraph, StageNode};
use crate::program::ScopeEntry;
use crate::value::{ItemRef, PortKind, Value};
use miles_grammar::ast::{self, Binding, Expr, ExprKind, Ident, ItemKind};
use miles_grammar::diag::ErrorCode;
use miles_grammar::diag::{Diagnostic, Span};
use petgraph::graph::NodeIndex;
use std::collections::{BTreeMap, HashMap};

/// A recipe compiled to its stage graph.
#[derive(Clone, Debug)]
pub struct CompiledRecipe {
    pub name: String,
    pub span: Span,
    pub item: ItemRef,
    /// The `recipe_settings` record: schedule, placement, stop, seed, cluster, ...
    pub settings: Value,
    /// The cluster's name as the recipe gives it (`on fleet`); `local` when absent.
    pub cluster_name: String,
    pub graph: StageGraph,
    /// The recipe read once as typed values, for `miles plan` and `miles run` (`job/`).
    pub job: crate::job::Job,
}

/// `--set key=value`: a dotted path into the recipe and a parsed expression.
#[derive(Clone, Debug)]
pub struct Override {
    pub path: Vec<Ident>,
    pub value: Expr,
    pub span: Span,
}

#[derive(Clone)]
struct BindingSrc {
    name: Ident,
    expr: Expr,
    module: u32,
    span: Span,
}

#[derive(Clone)]
struct Amend {
    path: Vec<Ident>,
    value: Expr,
    module: u32,
    span: Span,
}

struct Gathered {
    bindings: Vec<BindingSrc>,
    amends: Vec<Amend>,
    checks: Vec<(ast::Check, u32, ItemRef)>,
    on: Option<(ast::Path, u32)>,
}

fn gather(ev: &mut Eval, r: ItemRef, chain: &mut Vec<ItemRef>) -> Option<Gathered> {
    let ItemKind::Recipe(recipe) = &ev.program.item(r).kind else { return None };
    if chain.contains(&r) {
        let names: Vec<String> = chain.iter().chain(std::iter::once(&r)).map(|x| ev.decl_name(*x)).collect();
        ev.report(
            Diagnostic::error(
                ErrorCode::E0206,
                format!("recipes extend each other in a cycle: {}", names.join(" -> ")),
            )
            .with_primary(recipe.name.span, "part of the cycle"),
        );
        return None;
    }
    chain.push(r);
    let mut g = match &recipe.extends {
        Some(path) => {
            let parent = resolve_recipe(ev, r.module, path)?;
            gather(ev, parent, chain)?
        }
        None => Gathered { bindings: Vec::new(), amends: Vec::new(), checks: Vec::new(), on: None },
    };
    chain.pop();
    if let Some(on) = &recipe.on {
        g.on = Some((on.clone(), r.module));
    }
    let mut seen: HashMap<String, Span> = HashMap::new();
    for b in &recipe.bindings {
        let Some(first) = b.path.segments.first() else { continue };
        if b.path.segments.len() == 1 {
            if let Some(prev) = seen.get(&first.name) {
                ev.report(
                    Diagnostic::error(ErrorCode::E0104, format!("`{}` is bound twice in this recipe", first.name))
                        .with_primary(first.span, "bound again here")
                        .with_secondary(*prev, "first bound here")
                        .with_help("rename one of them"),
                );
                continue;
            }
            seen.insert(first.name.clone(), first.span);
            let src = BindingSrc { name: first.clone(), expr: b.value.clone(), module: r.module, span: b.span };
            // A child's whole binding replaces the parent's (and the parent's amendments to it).
            g.amends.retain(|a| a.path[0].name != first.name);
            match g.bindings.iter_mut().find(|x| x.name.name == first.name) {
                Some(slot) => *slot = src,
                None => g.bindings.push(src),
            }
        } else {
            g.amends.push(Amend {
                path: b.path.segments.clone(),
                value: b.value.clone(),
                module: r.module,
                span: b.span,
            });
        }
    }
    for c in &recipe.checks {
        g.checks.push((c.clone(), r.module, r));
    }
    Some(g)
}

fn resolve_recipe(ev: &mut Eval, module: u32, path: &ast::Path) -> Option<ItemRef> {
    let mut entry = ev.program.lookup(module, &path.segments.first()?.name);
    for seg in &path.segments[1..] {
        entry = match entry {
            Some(ScopeEntry::Module(m)) => ev.program.module(m).own.get(&seg.name).map(|r| ScopeEntry::Item(*r)),
            _ => None,
        };
    }
    match entry {
        Some(ScopeEntry::Item(r)) if matches!(ev.program.item(r).kind, ItemKind::Recipe(_)) => {
            if let Some(n) = ev.program.item(r).name() {
                ev.references.push((path.span, n.span));
            }
            Some(r)
        }
        _ => {
            let recipes: Vec<String> = ev
                .program
                .module(module)
                .own
                .iter()
                .filter(|(_, r)| matches!(ev.program.item(**r).kind, ItemKind::Recipe(_)))
                .map(|(n, _)| n.clone())
                .collect();
            let mut d = Diagnostic::error(ErrorCode::E0108, format!("no recipe `{}` to extend", path.dotted()))
                .with_primary(path.span, "not a recipe");
            if let Some(s) = crate::suggest::did_you_mean(&path.dotted(), recipes.iter().map(|s| s.as_str())) {
                d = d.with_help(format!("did you mean `{s}`?")).with_fix(format!("replace with `{s}`"), path.span, s);
            }
            ev.report(d);
            None
        }
    }
}

/// The shape of a stage instantiation, `kind(args) { fields }` or `kind(args)`: the callee,
/// the arguments and the block's fields. Any other expression is `None` (a recipe setting).
/// This is syntax only: whether the callee names a stage kind is for evaluation to say.
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

/// Amends a nested record expression at `path` (AST level): `backend.tp = 4` edits the `tp`
/// binding inside `backend = megatron { ... }`.
fn amend_expr(e: &mut Expr, path: &[Ident], value: &Expr, span: Span) -> bool {
    let ExprKind::Record { fields, .. } = &mut e.kind else { return false };
    let Some(first) = path.first() else { return false };
    if let Some(b) = fields.iter_mut().find(|b| b.path.segments.len() == 1 && b.path.segments[0].name == first.name) {
        if path.len() == 1 {
            b.value = value.clone();
            return true;
        }
        return amend_expr(&mut b.value, &path[1..], value, span);
    }
    if path.len() == 1 {
        fields.push(Binding {
            doc: None,
            path: ast::Path { segments: vec![first.clone()], span: first.span },
            value: value.clone(),
            span,
        });
        return true;
    }
    false
}

pub fn compile_recipe(ev: &mut Eval, r: ItemRef, overrides: &[Override]) -> Option<CompiledRecipe> {
    let ItemKind::Recipe(recipe) = &ev.program.item(r).kind else { return None };
    let recipe_name = recipe.name.clone();
    let recipe_span = ev.program.item(r).span;
    let mut g = gather(ev, r, &mut Vec::new())?;
    for o in overrides {
        g.amends.push(Amend { path: o.path.clone(), value: o.value.clone(), module: r.module, span: o.span });
    }

    ev.recipe = Some(crate::eval::RecipeState { module: r.module, name_span: recipe.name.span, ..Default::default() });

    let mut bindings = classify_bindings(ev, &g.bindings);
    apply_amendments(ev, &g.amends, &mut bindings);
    let pending = add_instances(ev, bindings);
    evaluate_cluster(ev, g.on.as_ref(), recipe_span);
    bind_arguments(ev, &pending)?;

    // Every field of every stage, then their checks.
    let field_ok = evaluate_fields(ev, &recipe_name)?;
    let settings = ev.recipe_settings();
    run_checks(ev, r, &g, &recipe_name, field_ok.len())?;

    let graph = lower(ev)?;
    graph_checks(ev, &graph);
    crate::pass_env::check(ev, &graph);
    crate::combine::check(ev, &graph);
    let settings = settings?;
    ev.recipe = None;
    let cluster_name = g.on.as_ref().map(|(p, _)| p.dotted()).unwrap_or_else(|| "local".to_string());
    let job = crate::job::Job::read(&graph, &settings);
    Some(CompiledRecipe { name: recipe_name.name, span: recipe_span, item: r, settings, cluster_name, graph, job })
}

/// An expression bound in a recipe, the module its names resolve in, and the span of its name.
type Bound = (Expr, u32, Span);

/// A stage binding's kind and arguments.
type StageCall = (ItemRef, Vec<ast::Arg>);

/// The recipe's bindings sorted into stage instances and settings.
struct Classified {
    /// Per stage instance, the fields its block sets.
    stage_fields: BTreeMap<String, BTreeMap<String, Bound>>,
    /// Non-stage bindings: the recipe's settings.
    setting_exprs: BTreeMap<String, Bound>,
    /// Per stage instance, its stage kind.
    kinds: BTreeMap<String, ItemRef>,
    /// Every binding kept, in order, with its kind and arguments when it is a stage.
    order: Vec<(BindingSrc, Option<StageCall>)>,
}

/// A stage instance whose arguments are still to be evaluated against its kind's ports.
struct Pending {
    index: usize,
    args: Vec<ast::Arg>,
    module: u32,
    args_span: Span,
}

/// Classifies bindings into stage instances and settings.
fn classify_bindings(ev: &mut Eval, bindings: &[BindingSrc]) -> Classified {
    let mut c = Classified {
        stage_fields: BTreeMap::new(),
        setting_exprs: BTreeMap::new(),
        kinds: BTreeMap::new(),
        order: Vec::new(),
    };
    for b in bindings {
        let mut stage = None;
        if let Some((callee, args, fields)) = stage_call(&b.expr) {
            // Stage kinds live at module level, so the callee is resolved there.
            let quiet_callee = ev.eval(callee, Env::Module(b.module), None);
            if let Some(Value::Decl(k)) = quiet_callee {
                if matches!(ev.program.item(k).kind, ItemKind::Stage(_)) {
                    let fmap = stage_block_fields(ev, fields, b.module);
                    c.stage_fields.insert(b.name.name.clone(), fmap);
                    c.kinds.insert(b.name.name.clone(), k);
                    stage = Some((k, args.to_vec()));
                }
            } else if quiet_callee.is_none() {
                // The callee did not resolve (already reported); skip this binding.
                continue;
            }
        }
        if stage.is_none() {
            c.setting_exprs.insert(b.name.name.clone(), (b.expr.clone(), b.module, b.name.span));
        }
        c.order.push((b.clone(), stage));
    }
    c
}

/// The fields a stage block sets, each once and undotted.
fn stage_block_fields(ev: &mut Eval, fields: &[Binding], module: u32) -> BTreeMap<String, Bound> {
    let mut fmap = BTreeMap::new();
    for f in fields {
        let Some(first) = f.path.segments.first() else { continue };
        if f.path.segments.len() > 1 {
            ev.report(
                Diagnostic::error(ErrorCode::E0209, "a dotted path cannot be set inside a stage block")
                    .with_primary(f.path.span, "write the nested record instead"),
            );
            continue;
        }
        if let Some((_, _, prev)) = fmap.get(&first.name) {
            ev.report(set_twice(first, *prev));
            continue;
        }
        fmap.insert(first.name.clone(), (f.value.clone(), module, first.span));
    }
    fmap
}

/// Amendments: `train.lr = ...`, `--set schedule.max_staleness=4`.
fn apply_amendments(ev: &mut Eval, amends: &[Amend], c: &mut Classified) {
    for a in amends {
        let head = &a.path[0];
        if let Some(fields) = c.stage_fields.get_mut(&head.name) {
            amend_stage(ev, a, fields, c.kinds[&head.name]);
        } else if let Some(slot) = c.setting_exprs.get_mut(&head.name).filter(|_| a.path.len() == 1) {
            // `--set seed=3` where the recipe says `seed = 1`: the new value replaces it.
            *slot = (a.value.clone(), a.module, head.span);
        } else if let Some((e, _, _)) = c.setting_exprs.get_mut(&head.name) {
            if !amend_expr(e, &a.path[1..], &a.value, a.span) {
                ev.report(
                    Diagnostic::error(ErrorCode::E0209, format!("cannot amend `{}`", dotted(&a.path)))
                        .with_primary(a.span, "no record literal to amend at this path")
                        .with_help(format!("set the whole setting instead: `{} = ...`", head.name)),
                );
            }
        } else if a.path.len() == 1 {
            // `--set stop=500.steps` for a setting the recipe leaves at its default.
            c.setting_exprs.insert(head.name.clone(), (a.value.clone(), a.module, head.span));
        } else {
            let mut names: Vec<String> = c.stage_fields.keys().cloned().collect();
            names.extend(c.setting_exprs.keys().cloned());
            let mut d =
                Diagnostic::error(ErrorCode::E0209, format!("the recipe has no stage or setting `{}`", head.name))
                    .with_primary(head.span, "not found");
            if let Some(s) = crate::suggest::did_you_mean(&head.name, names.iter().map(|s| s.as_str())) {
                d = d.with_help(format!("did you mean `{s}`?"));
            }
            ev.report(d);
        }
    }
}

/// An amendment to a stage instance (`train.lr = ...`): one declared field of its `kind` is
/// set, or a record literal inside one amended.
fn amend_stage(ev: &mut Eval, a: &Amend, fields: &mut BTreeMap<String, Bound>, kind: ItemRef) {
    let head = &a.path[0];
    let Some(field) = a.path.get(1) else {
        // `reward = ...` as an amendment or `--set`: a stage is amended field by field.
        ev.report(
            Diagnostic::error(ErrorCode::E0209, format!("cannot replace the stage `{}` with an amendment", head.name))
                .with_primary(a.span, "a stage is amended one field at a time")
                .with_help(format!(
                    "set one of its fields (`{}.FIELD = ...`), or write a recipe that `extends` this one and binds `{}` anew",
                    head.name, head.name
                )),
        );
        return;
    };
    if ev.decl_field(kind, &field.name).is_none() {
        ev.unknown_field(kind, field);
        return;
    }
    if a.path.len() == 2 {
        fields.insert(field.name.clone(), (a.value.clone(), a.module, field.span));
    } else {
        let ok = match fields.get_mut(&field.name) {
            Some((e, _, _)) => amend_expr(e, &a.path[2..], &a.value, a.span),
            None => false,
        };
        if !ok {
            ev.report(
                Diagnostic::error(ErrorCode::E0209, format!("cannot amend `{}`", dotted(&a.path)))
                    .with_primary(a.span, "no record literal to amend at this path")
                    .with_help(format!("set the whole field instead: `{}.{} = ...`", head.name, field.name)),
            );
        }
    }
}

/// Adds the stage instances, in binding order, and hands the settings to the recipe state;
/// returns each instance's arguments, still to be evaluated.
fn add_instances(ev: &mut Eval, c: Classified) -> Vec<Pending> {
    let Classified { mut stage_fields, setting_exprs, order, .. } = c;
    let mut pending = Vec::new();
    for (b, stage) in order {
        if let Some((kind, args)) = stage {
            let provided = stage_fields.remove(&b.name.name).unwrap_or_default();
            let index = ev.add_instance(InstanceInit {
                name: b.name.name.clone(),
                kind,
                binding_span: b.span,
                name_span: b.name.span,
                provided,
            });
            let args_span = match &b.expr.kind {
                ExprKind::Call { args_span, .. } => *args_span,
                ExprKind::Record { base, .. } => match &base.kind {
                    ExprKind::Call { args_span, .. } => *args_span,
                    _ => b.span,
                },
                _ => b.span,
            };
            pending.push(Pending { index, args, module: b.module, args_span });
        }
    }
    if let Some(state) = ev.recipe.as_mut() {
        state.settings_exprs = setting_exprs;
    }
    pending
}

/// The cluster: `on laptop`, else a local machine.
fn evaluate_cluster(ev: &mut Eval, on: Option<&(ast::Path, u32)>, recipe_span: Span) {
    let cluster = match on {
        Some((path, module)) => {
            let e = Expr { kind: path_expr(path), span: path.span };
            let want = ev.named_interface("Cluster");
            ev.eval_as(&e, Env::Module(*module), want.as_ref())
        }
        None => ev.prelude_decl("local").and_then(|l| ev.build_record(l, BTreeMap::new(), recipe_span)),
    };
    if let Some(state) = ev.recipe.as_mut() {
        state.cluster_failed = cluster.is_none();
        state.cluster = cluster;
    }
}

/// Arguments, checked against the ports.
fn bind_arguments(ev: &mut Eval, pending: &[Pending]) -> Option<()> {
    for p in pending {
        let kind = ev.recipe.as_ref()?.instances[p.index].kind;
        let ItemKind::Stage(decl) = &ev.program.item(kind).kind else { continue };
        let ports: Vec<(String, ast::TypeExpr)> =
            decl.ports.iter().map(|x| (x.name.name.clone(), x.ty.clone())).collect();
        let flat: Vec<(&Expr, bool)> = p
            .args
            .iter()
            .flat_map(|a| std::iter::once((&a.value, false)).chain(a.arrow_to.as_ref().map(|t| (t, true))))
            .collect();
        if flat.len() != ports.len() {
            let want: Vec<String> = ports.iter().map(|(n, _)| n.clone()).collect();
            let name = ev.decl_name(kind);
            ev.report(
                Diagnostic::error(
                    ErrorCode::E0207,
                    format!("`{name}` takes {} input(s) ({}), given {}", ports.len(), want.join(", "), flat.len()),
                )
                .with_primary(p.args_span, "wrong number of inputs")
                .with_secondary(decl.name.span, "declared here"),
            );
        }
        let mut args = Vec::new();
        let mut arrow = None;
        for ((e, is_arrow), (pname, pty)) in flat.iter().zip(ports.iter()) {
            let t = ev.resolve_type(kind.module, pty);
            if let Some(v) = ev.eval_as(e, Env::Recipe(p.module), t.as_ref()) {
                if *is_arrow {
                    arrow = Some((v.clone(), e.span));
                }
                args.push((pname.clone(), v, e.span));
            }
        }
        ev.set_instance_args(p.index, args, arrow);
    }
    Some(())
}

/// Evaluates every field of every stage instance, reporting fields their kind does not declare
/// (and a recipe with no stages); one flag per instance, whether all its fields are sound.
fn evaluate_fields(ev: &mut Eval, recipe_name: &Ident) -> Option<Vec<bool>> {
    let n = ev.recipe.as_ref()?.instances.len();
    if n == 0 {
        ev.report(
            Diagnostic::error(ErrorCode::E0307, format!("recipe `{}` has no stages", recipe_name.name))
                .with_primary(recipe_name.span, "nothing to run")
                .with_help("bind at least one stage: `rollout = generate(policy) { ... }`"),
        );
    }
    let mut field_ok = vec![true; n];
    for (i, ok) in field_ok.iter_mut().enumerate() {
        let kind = ev.recipe.as_ref()?.instances[i].kind;
        // Fields set that the kind does not declare.
        let provided: Vec<(String, Span)> =
            ev.recipe.as_ref()?.instances[i].provided.iter().map(|(k, v)| (k.clone(), v.2)).collect();
        for (name, span) in provided {
            match ev.decl_field(kind, &name) {
                Some(d) => ev.references.push((span, d.name.span)),
                None => {
                    ev.unknown_field(kind, &Ident { name, span });
                    *ok = false;
                }
            }
        }
        for d in ev.decl_fields(kind) {
            if ev.instance_field_value(i, &d.name.name).is_none() {
                *ok = false;
            }
        }
    }
    Some(field_ok)
}

/// The checks of the first `n` stage instances' kinds (and the build's house rules on stdlib
/// kinds), then the recipe's own and inherited checks.
fn run_checks(ev: &mut Eval, r: ItemRef, g: &Gathered, recipe_name: &Ident, n: usize) -> Option<()> {
    // Checks run even when some field is broken: a check that reads a broken field evaluates
    // to nothing and stays silent, the others still report, so every mistake shows at once.
    for i in 0..n {
        let (kind, span) = {
            let inst = &ev.recipe.as_ref()?.instances[i];
            (inst.kind, inst.name_span)
        };
        let checks = match &ev.program.item(kind).kind {
            ItemKind::Stage(s) => s.checks.clone(),
            _ => Vec::new(),
        };
        for c in &checks {
            ev.run_check(c, Env::Instance(i), span, kind, &[]);
        }
        // House rules of the build's manifests, on instances of the stdlib kind they name.
        if ev.program.module(kind.module).is_std {
            let name = ev.decl_name(kind);
            let house: Vec<_> = ev.program.house_rules.iter().filter(|h| h.stage == name).cloned().collect();
            for h in &house {
                ev.run_check_as(&h.check, Env::Instance(i), span, h.origin.clone(), &[]);
            }
        }
    }
    for (c, module, owner) in &g.checks {
        let labels = if *owner != r { inherited_rule_labels(ev, g, c, *owner, recipe_name) } else { Vec::new() };
        ev.run_check(c, Env::Recipe(*module), c.span, *owner, &labels);
    }
    Some(())
}

fn dotted(path: &[Ident]) -> String {
    path.iter().map(|s| s.name.as_str()).collect::<Vec<_>>().join(".")
}

fn path_expr(path: &ast::Path) -> ExprKind {
    let mut segs = path.segments.iter();
    let Some(first) = segs.next() else { return ExprKind::Error };
    let mut e = Expr { kind: ExprKind::Name(first.clone()), span: first.span };
    for s in segs {
        let span = e.span.to(s.span);
        e = Expr { kind: ExprKind::Field(Box::new(e), s.clone()), span };
    }
    e.kind
}

fn channel_of(p: PortKind) -> ChannelKind {
    match p {
        PortKind::Prompts => ChannelKind::Prompts,
        PortKind::Trajectories => ChannelKind::Trajectories,
        PortKind::Scores => ChannelKind::Scores,
        PortKind::TokenScores => ChannelKind::TokenScores,
        PortKind::Policy => ChannelKind::Policy,
        PortKind::Metrics => ChannelKind::Metrics,
    }
}

/// (field path, stage) for every stage named in `v`, through records and lists.
fn stage_refs(path: &str, v: &Value, out: &mut Vec<(String, String)>) {
    match v {
        Value::Stage(n) => out.push((path.to_string(), n.clone())),
        Value::Record(r) => {
            for (k, f) in &r.fields {
                stage_refs(&format!("{path}.{k}"), &f.value, out);
            }
        }
        Value::List(items) => items.iter().for_each(|i| stage_refs(path, i, out)),
        _ => {}
    }
}

/// Builds the graph from the evaluated instances.
fn lower(ev: &mut Eval) -> Option<StageGraph> {
    let mut graph = StageGraph::default();
    let mut index: HashMap<String, NodeIndex> = HashMap::new();
    let n = ev.recipe.as_ref()?.instances.len();
    for i in 0..n {
        let (name, kind, span, name_span) = {
            let inst = &ev.recipe.as_ref()?.instances[i];
            (inst.name.clone(), inst.kind, inst.binding_span, inst.name_span)
        };
        let mut params = BTreeMap::new();
        for d in ev.decl_fields(kind) {
            if let Some(fv) = ev.instance_field_value(i, &d.name.name) {
                params.insert(d.name.name.clone(), Param { value: fv.value, span: fv.span, defaulted: fv.defaulted });
            }
        }
        let inputs = ev.recipe.as_ref()?.instances[i].args.iter().map(|(p, v, _)| (p.clone(), v.clone())).collect();
        let model = ev.model_of(&Value::Stage(name.clone()));
        let node = StageNode {
            name: name.clone(),
            kind: ev.decl_name(kind),
            kind_path: ev.decl_path(kind),
            span,
            name_span,
            output: ev.stage_output(kind),
            params,
            inputs,
            model,
        };
        index.insert(name, graph.graph.add_node(node));
    }
    for i in 0..n {
        let (name, args, arrow) = {
            let inst = &ev.recipe.as_ref()?.instances[i];
            (inst.name.clone(), inst.args.clone(), inst.arrow_to.clone())
        };
        let to = index[&name];
        for (port, v, span) in &args {
            let is_arrow_target = arrow.as_ref().is_some_and(|(a, s)| a == v && s == span);
            if let Value::Stage(src) = v {
                let Some(&from) = index.get(src) else { continue };
                if is_arrow_target {
                    graph.graph.add_edge(
                        to,
                        from,
                        Channel { kind: ChannelKind::Weights, port: port.clone(), back: true },
                    );
                } else {
                    let out = graph.graph[from].output.map(channel_of).unwrap_or(ChannelKind::Metrics);
                    graph.graph.add_edge(from, to, Channel { kind: out, port: port.clone(), back: false });
                }
            }
        }
        // Stage references inside fields are edges too, also inside a field's record
        // (`train.opd = opd { teacher = teacher }`): the port is the field's path (`opd.teacher`).
        let mut refs = Vec::new();
        for (k, p) in &graph.graph[to].params {
            stage_refs(k, &p.value, &mut refs);
        }
        for (port, src) in refs {
            if let Some(&from) = index.get(&src) {
                let out = graph.graph[from].output.map(channel_of).unwrap_or(ChannelKind::Metrics);
                graph.graph.add_edge(from, to, Channel { kind: out, port, back: false });
            }
        }
    }
    Some(graph)
}

fn graph_checks(ev: &mut Eval, g: &StageGraph) {
    use petgraph::visit::EdgeRef;
    let gr = &g.graph;
    // Cycles that do not go through a weight-sync back edge.
    let forward = petgraph::visit::EdgeFiltered::from_fn(gr, |e| !e.weight().back);
    for scc in petgraph::algo::kosaraju_scc(&forward) {
        let cyclic = scc.len() > 1 || scc.iter().any(|&n| gr.edges_connecting(n, n).any(|e| !e.weight().back));
        if !cyclic {
            continue;
        }
        let mut names: Vec<String> = scc.iter().map(|&n| gr[n].name.clone()).collect();
        names.reverse();
        names.push(names[0].clone());
        let first = scc[scc.len() - 1];
        let mut d = Diagnostic::error(
            ErrorCode::E0303,
            format!("stages consume each other in a cycle: {}", names.join(" -> ")),
        )
        .with_primary(gr[first].name_span, "part of the cycle")
        .with_help("only weight sync may point back: `sync = weights(train -> rollout)`");
        for &n in scc.iter().rev().skip(1) {
            d = d.with_secondary(gr[n].name_span, "part of the cycle");
        }
        ev.report(d);
    }
    // A train stage consuming a rollout's trajectories must send weights back to it.
    for t in gr.node_indices() {
        if gr[t].output != Some(PortKind::Policy) {
            continue;
        }
        for e in gr.edges_directed(t, petgraph::Direction::Incoming) {
            if e.weight().kind != ChannelKind::Trajectories || e.weight().back {
                continue;
            }
            let rollout = e.source();
            // The rollout must be generating with the policy this stage trains: it is, when
            // trajectories flow from it into the trainer.
            let synced = gr.node_indices().any(|s| {
                let from_train = gr.edges_connecting(t, s).any(|e| !e.weight().back);
                let to_rollout = gr.edges_connecting(s, rollout).any(|e| e.weight().back);
                from_train && to_rollout
            });
            if !synced {
                let (tn, rn) = (gr[t].name.clone(), gr[rollout].name.clone());
                ev.report(
                    Diagnostic::error(
                        ErrorCode::E0304,
                        format!("`{tn}` trains the policy that `{rn}` samples from, but no weights go back to `{rn}`"),
                    )
                    .with_primary(gr[t].name_span, "updates the policy")
                    .with_secondary(gr[rollout].name_span, "keeps sampling from the initial weights")
                    .with_help(format!("add `sync = weights({tn} -> {rn})`"))
                    .with_fix(
                        format!("add `sync = weights({tn} -> {rn})`"),
                        Span { start: gr[t].span.end, end: gr[t].span.end, file: gr[t].span.file },
                        format!("\n    sync = weights({tn} -> {rn})"),
                    ),
                );
            }
        }
    }
    // Outputs nobody consumes.
    for n in gr.node_indices() {
        let Some(out) = gr[n].output else { continue };
        if !matches!(out, PortKind::Trajectories | PortKind::Scores | PortKind::TokenScores | PortKind::Prompts) {
            continue;
        }
        if gr.edges_directed(n, petgraph::Direction::Outgoing).next().is_none() {
            ev.report(
                Diagnostic::warning(
                    ErrorCode::E0305,
                    format!("stage `{}` produces {} that no stage consumes", gr[n].name, out.name()),
                )
                .with_primary(gr[n].name_span, "unused output")
                .with_help("pass it to a stage (e.g. a reward or train stage) or remove it"),
            );
        }
    }
}

/// For a rule a recipe inherits through `extends`: the recipe that is checked, and each binding
/// from outside the rule's own recipe that sets a name the rule reads (the override that may
/// have broken it). Otherwise a failure names only the rule, in a base shared by many recipes.
fn inherited_rule_labels(
    ev: &Eval,
    g: &Gathered,
    c: &ast::Check,
    owner: ItemRef,
    recipe: &Ident,
) -> Vec<(Span, String)> {
    let home = ev.program.item(owner).span;
    let text = ev
        .program
        .sources
        .get(c.expr.span.file)
        .and_then(|f| f.text.get(c.expr.span.start as usize..c.expr.span.end as usize))
        .unwrap_or("");
    let reads = |name: &str| text.split(|ch: char| !(ch.is_alphanumeric() || ch == '_')).any(|w| w == name);
    let outside = |sp: Span| sp.file != home.file || sp.start < home.start || sp.end > home.end;
    let mut labels = vec![(
        recipe.span,
        format!("checked in recipe `{}`, which inherits this rule from `{}`", recipe.name, ev.decl_name(owner)),
    )];
    for b in g.bindings.iter().filter(|b| outside(b.span) && reads(&b.name.name)) {
        labels.push((b.span, format!("`{}` is overridden here", b.name.name)));
    }
    for a in g.amends.iter().filter(|a| outside(a.span) && reads(&a.path[0].name)) {
        labels.push((a.span, format!("`{}` is set here", dotted(&a.path))));
    }
    labels
}
