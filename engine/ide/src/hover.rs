//! Hover: a signature, docs, where a name is declared, and values where the compilation knows
//! them (a constant's value, a stage parameter as resolved, a literal's exact value).

use crate::analysis::{decl_fields, settings_schema, Analysis};
use crate::defs::{stage_call, Def, DefKind};
use crate::goto_definition::import_at;
use crate::syntax::{span_text, type_text, walk_item_exprs};
use miles_compiler::eval::{Env, Eval};
use miles_compiler::program::Program;
use miles_compiler::types::Type;
use miles_compiler::value::{ItemRef, Value};
use miles_grammar::ast::{self, Expr, ExprKind, Item, ItemKind};
use miles_grammar::diag::{FileId, Span};

#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Hover {
    pub span: Span,
    /// Markdown: a `miles` code block with the signature, then docs and values.
    pub markdown: String,
}

pub fn hover(a: &Analysis, file: FileId, offset: usize) -> Option<Hover> {
    if let Some(target) = import_at(a, file, offset) {
        let m = a.module_of_file(file)?;
        let span = a.program().module(m).ast.items.iter().find_map(|i| match &i.kind {
            ItemKind::Import(imp) if imp.path_span.contains(offset) => Some(imp.path_span),
            _ => None,
        })?;
        return Some(Hover { span, markdown: describe_module(a, target) });
    }
    if let Some((span, def)) = a.resolve(file, offset) {
        if def.kind == DefKind::Module {
            let target = import_at(a, def.span.file, def.span.start as usize)?;
            return Some(Hover { span, markdown: describe_module(a, target) });
        }
        return Some(Hover { span, markdown: describe_def(a, def, Some((file, offset))) });
    }
    hover_literal(a, file, offset)
}

/// A module: its key, its leading comment, and what it declares.
fn describe_module(a: &Analysis, target: FileId) -> String {
    let Some(m) = a.module_of_file(target) else { return String::new() };
    let module = a.program().module(m);
    let mut names: Vec<&String> = module.own.keys().collect();
    names.sort();
    let header = leading_comment(a.text(target));
    let mut md = format!("```miles\nmodule {}\n```", module_label(&module.key));
    if !header.is_empty() {
        md.push_str(&format!("\n---\n{header}"));
    }
    md.push_str(&format!("\n\ndeclares: {}", names.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")));
    md
}

/// `std/stages` for the stdlib, the file name for a user module.
fn module_label(key: &str) -> String {
    if key.starts_with("std/") {
        key.to_string()
    } else {
        key.rsplit('/').next().unwrap_or(key).to_string()
    }
}

/// The first comment lines of a file: a module's own description.
fn leading_comment(text: &str) -> String {
    text.lines()
        .take_while(|l| l.trim_start().starts_with("//"))
        .map(|l| l.trim_start().trim_start_matches('/').trim())
        .collect::<Vec<_>>()
        .join("\n")
}

/// A number or quantity literal: its exact value and type.
fn hover_literal(a: &Analysis, file: FileId, offset: usize) -> Option<Hover> {
    let m = a.module_of_file(file)?;
    let mut best: Option<&Expr> = None;
    for item in &a.program().module(m).ast.items {
        walk_item_exprs(item, &mut |e: &Expr| {
            if e.span.file == file
                && e.span.contains(offset)
                && matches!(e.kind, ExprKind::Number(_) | ExprKind::Quantity { .. } | ExprKind::Binary { .. })
                && best.is_none_or(|b| e.span.end - e.span.start < b.span.end - b.span.start)
            {
                best = Some(e);
            }
        });
    }
    let e = best?;
    let mut ev = Eval::new(a.program());
    let v = ev.eval(e, Env::Module(m), None)?;
    let ty = value_type_name(&v);
    Some(Hover {
        span: e.span,
        markdown: format!("```miles\n{}\n```\n---\n{ty} = `{v}`", span_text(a.program(), e.span)),
    })
}

fn value_type_name(v: &Value) -> String {
    match v {
        Value::Record(r) => r.schema_name.clone(),
        other => other.type_name(),
    }
}

/// Markdown for a definition: signature, docs, where it is declared, and values where known.
fn describe_def(a: &Analysis, def: &Def, at: Option<(FileId, usize)>) -> String {
    let p = a.program();
    let module_key = module_label(&p.module(def.module).key);
    let (sig, extra) = match def.kind {
        DefKind::Const | DefKind::Model | DefKind::Cluster => describe_valued_item(a, def),
        DefKind::Enum => {
            let members = def.item.map(|r| enum_member_names(p, r)).unwrap_or_default();
            (format!("enum {} {{ {} }}", def.name, members.join(", ")), Vec::new())
        }
        DefKind::EnumMember => {
            let e = def.container.map(|r| item_name(p, r)).unwrap_or_default();
            (format!("{e}.{}", def.name), Vec::new())
        }
        DefKind::Interface => describe_interface(p, def),
        DefKind::Schema => (schema_signature(p, def), Vec::new()),
        DefKind::StageKind => {
            let mut sig = String::new();
            if let Some(ItemKind::Stage(s)) = def.item.map(|r| &p.item(r).kind) {
                sig = stage_signature(p, s);
                sig.push_str(&fields_block(p, &s.fields));
            }
            (sig, Vec::new())
        }
        DefKind::Recipe => {
            let mut extra = Vec::new();
            if let Some(r) = a.compilation.recipe(&def.name) {
                let stages: Vec<String> = r.graph.nodes().map(|n| format!("`{}` ({})", n.name, n.kind)).collect();
                extra.push(format!("stages: {}", stages.join(", ")));
            }
            (format!("recipe {}", def.name), extra)
        }
        DefKind::Field => describe_field(a, def, at),
        DefKind::Port => describe_port(p, def),
        DefKind::StageInstance => describe_stage_instance(a, def),
        DefKind::Setting => describe_setting(a, def),
        DefKind::Module => (format!("module {}", def.name), Vec::new()),
    };
    let mut md = format!("```miles\n{sig}\n```");
    let mut body = Vec::new();
    if let Some(d) = &def.doc {
        body.push(d.clone());
    }
    body.extend(extra);
    body.push(format!("*{module_key}*"));
    md.push_str("\n---\n");
    md.push_str(&body.join("\n\n"));
    md
}

/// A signature and the lines that follow the docs: what `describe_def` shows for one kind.
type Described = (String, Vec<String>);

/// A constant, model or cluster: its declared type and its value, a record's every field.
fn describe_valued_item(a: &Analysis, def: &Def) -> Described {
    let p = a.program();
    let mut extra = Vec::new();
    let item = def.item.map(|r| p.item(r));
    let kw = match def.kind {
        DefKind::Const => "const",
        DefKind::Model => "model",
        _ => "cluster",
    };
    let mut sig = format!("{kw} {}", def.name);
    if let Some(Item { kind: ItemKind::Const(c), .. }) = item {
        if let Some(t) = &c.ty {
            sig.push_str(&format!(": {}", type_text(p, t)));
        }
    }
    if let Some(r) = def.item {
        // The compilation's value first: it read the files an `hf` model names.
        let v = a.compilation.item_values.get(&r).cloned().or_else(|| Eval::new(p).item_value(r));
        if let Some(v) = v {
            extra.push(format!("{} = `{}`", value_type_name(&v), v));
            // An `hf` model: what its config.json says, in words, before the fields.
            if let Some(summary) = v.as_record().and_then(hf_summary) {
                extra.push(summary);
            }
            // A record's every field, defaults and derived ones included (an `hf`
            // model's sizes come from its config.json); a map shows its size only.
            if let Value::Record(rec) = &v {
                let lines: Vec<String> = rec
                    .fields
                    .iter()
                    .map(|(k, fv)| {
                        let shown = match &fv.value {
                            Value::Map(m) => format!("{{ {} keys }}", m.len()),
                            x => x.to_string(),
                        };
                        format!("{k} = {shown}{}", if fv.defaulted { "   (default)" } else { "" })
                    })
                    .collect();
                if lines.len() > 1 {
                    extra.push(format!("```miles\n{}\n```", lines.join("\n")));
                }
            }
        }
    }
    (sig, extra)
}

/// An `hf` model's config.json as `hf_config` read it: the architecture and whether `miles run`
/// loads it, the parameters (active ones for an MoE), the experts, and the keys read and not.
fn hf_summary(rec: &miles_compiler::value::Record) -> Option<String> {
    let Some(Value::Map(c)) = rec.get("config").filter(|_| rec.schema_name == "hf") else { return None };
    let int = |k: &str| c.get(k).and_then(Value::as_i64).unwrap_or(0);
    let billions = |n: i64| {
        if n >= 1_000_000_000 {
            format!("{:.2}B", n as f64 / 1e9)
        } else if n >= 1_000_000 {
            format!("{:.1}M", n as f64 / 1e6)
        } else {
            n.to_string()
        }
    };
    let keys = |k: &str| match c.get(k) {
        Some(Value::List(items)) if !items.is_empty() => {
            items.iter().filter_map(Value::as_str).map(|s| format!("`{s}`")).collect::<Vec<_>>().join(", ")
        }
        _ => "none".to_string(),
    };
    let arch = c.get("architecture").and_then(Value::as_str).unwrap_or("?");
    let runs = if c.get("loadable").and_then(Value::as_bool) == Some(false) {
        "plan only: `miles run` loads llama, mistral, qwen2, qwen3, qwen3_moe and mixtral"
    } else {
        "`miles run` loads it"
    };
    let mut size = format!("{} parameters", billions(int("params")));
    if int("experts") > 0 {
        size.push_str(&format!(
            ", {} active; {} experts, {} per token",
            billions(int("active_params")),
            int("experts"),
            int("top_k")
        ));
        if int("shared_expert_d_ff") > 0 {
            size.push_str(" and a shared expert");
        }
    }
    let attention = c.get("attention").and_then(Value::as_str).unwrap_or("gqa");
    Some(format!(
        "**{arch}** ({runs})\n\n{size}; {attention} attention\n\nread from config.json: {}\n\nnot read: {}",
        keys("read"),
        keys("ignored")
    ))
}

/// An interface: the schemas that implement it.
fn describe_interface(p: &Program, def: &Def) -> Described {
    let mut extra = Vec::new();
    if let Some(r) = def.item {
        let impls = implementors(p, r);
        if !impls.is_empty() {
            extra.push(format!("schemas: {}", impls.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")));
        }
    }
    (format!("interface {}", def.name), extra)
}

/// `schema name is Interface { fields }`; empty when the definition is no schema.
fn schema_signature(p: &Program, def: &Def) -> String {
    let mut sig = String::new();
    if let Some(ItemKind::Schema(s)) = def.item.map(|r| &p.item(r).kind) {
        sig = format!("schema {}", def.name);
        if let Some(i) = &s.interface {
            sig.push_str(&format!(" is {}", i.name));
        }
        sig.push_str(&fields_block(p, &s.fields));
    }
    sig
}

/// A field of a schema or stage kind: its declaration, owner and unit, and, on a field set in
/// a recipe (`at`), its value there.
fn describe_field(a: &Analysis, def: &Def, at: Option<(FileId, usize)>) -> Described {
    let p = a.program();
    let mut sig = String::new();
    let mut extra = Vec::new();
    let decl = def.container.and_then(|r| decl_fields(p, r).iter().find(|f| f.name.span == def.span));
    if let Some(f) = decl {
        sig = field_signature(p, f);
    }
    let owner = def.container.map(|r| item_name(p, r)).unwrap_or_default();
    extra.push(format!("field of `{owner}`"));
    if let Some(f) = decl {
        let mut ev = Eval::new(p);
        if let Some(Type::Quantity(d)) = ev.resolve_type(def.module, &f.ty).as_ref().map(|t| t.strip_optional()) {
            extra.push(format!("unit: {} (e.g. `1.{}`)", d.name(), miles_compiler::types::suggested_unit(*d)));
        }
    }
    if let Some((file, offset)) = at {
        if let Some((recipe, stage, field)) = recipe_field_at(a, file, offset) {
            if let Some(v) = param_value(a, &recipe, &stage, &field) {
                extra.push(v);
            }
        }
    }
    (sig, extra)
}

/// An input port of a stage kind: its type and its stage kind.
fn describe_port(p: &Program, def: &Def) -> Described {
    let mut sig = String::new();
    let mut extra = Vec::new();
    if let Some(ItemKind::Stage(s)) = def.container.map(|r| &p.item(r).kind) {
        if let Some(port) = s.ports.iter().find(|x| x.name.span == def.span) {
            sig = format!("{}: {}", port.name.name, type_text(p, &port.ty));
        }
        extra.push(format!("input of stage kind `{}`", s.name.name));
    }
    (sig, extra)
}

/// A stage instance of a recipe: its kind and output and, once compiled, every parameter.
fn describe_stage_instance(a: &Analysis, def: &Def) -> Described {
    let p = a.program();
    let mut extra = Vec::new();
    let recipe = def.container.map(|r| item_name(p, r)).unwrap_or_default();
    let mut sig = format!("{} = {}", def.name, instance_kind_text(p, def).unwrap_or_default());
    if let Some(node) = recipes_with(a, &recipe).find_map(|r| r.graph.node(&def.name)) {
        sig = format!("{}: {} -> {}", def.name, node.kind, node.output.map(|o| o.name()).unwrap_or("()"));
        extra.push(format!("declared in `{}`", node.kind_path));
        let mut lines = Vec::new();
        for (k, prm) in &node.params {
            lines.push(format!("{k} = {}{}", prm.value, if prm.defaulted { "   (default)" } else { "" }));
        }
        if !lines.is_empty() {
            extra.push(format!("```miles\n{}\n```", lines.join("\n")));
        }
    }
    (sig, extra)
}

/// A recipe setting: its declaration in the settings schema, its docs, and its value.
fn describe_setting(a: &Analysis, def: &Def) -> Described {
    let p = a.program();
    let mut extra = Vec::new();
    let recipe = def.container.map(|r| item_name(p, r)).unwrap_or_default();
    let mut sig = format!("{} (recipe setting)", def.name);
    if let Some(s) = settings_schema(p) {
        if let Some(f) = decl_fields(p, s).iter().find(|f| f.name.name == def.name) {
            sig = field_signature(p, f);
            if let Some(d) = &f.doc {
                extra.push(d.text.clone());
            }
        }
    }
    if let Some(r) = recipes_with(a, &recipe).next() {
        if let Some(v) = r.settings.as_record().and_then(|rec| rec.get(&def.name)) {
            extra.push(format!("value: `{v}`"));
        }
    }
    (sig, extra)
}

fn recipes_with<'a>(a: &'a Analysis, name: &str) -> std::vec::IntoIter<&'a miles_compiler::CompiledRecipe> {
    a.compilation.recipes.iter().filter(|r| r.name == name).collect::<Vec<_>>().into_iter()
}

fn instance_kind_text(p: &Program, def: &Def) -> Option<String> {
    let ItemKind::Recipe(r) = &p.item(def.container?).kind else { return None };
    let b = r.bindings.iter().find(|b| b.path.segments.len() == 1 && b.path.segments[0].span == def.span)?;
    let (callee, _, _) = stage_call(&b.value)?;
    Some(span_text(p, callee.span).to_string())
}

/// The (recipe, stage instance, field) a cursor in a recipe body is on, for values.
fn recipe_field_at(a: &Analysis, file: FileId, offset: usize) -> Option<(String, String, String)> {
    let m = a.module_of_file(file)?;
    for item in &a.program().module(m).ast.items {
        let ItemKind::Recipe(r) = &item.kind else { continue };
        if !item.span.contains(offset) {
            continue;
        }
        for b in &r.bindings {
            if !b.span.contains(offset) {
                continue;
            }
            let segs = &b.path.segments;
            if segs.len() >= 2 && segs[1].span.contains(offset) {
                return Some((r.name.name.clone(), segs[0].name.clone(), segs[1].name.clone()));
            }
            if let (Some(first), Some((_, _, fields))) = (segs.first(), stage_call(&b.value)) {
                for f in fields {
                    if let Some(fid) = f.path.segments.first() {
                        if fid.span.contains(offset) {
                            return Some((r.name.name.clone(), first.name.clone(), fid.name.clone()));
                        }
                    }
                }
            }
        }
    }
    None
}

fn param_value(a: &Analysis, recipe: &str, stage: &str, field: &str) -> Option<String> {
    let r = a.compilation.recipe(recipe)?;
    let prm = r.graph.node(stage)?.params.get(field)?;
    Some(format!("value: `{}`{}", prm.value, if prm.defaulted { " (default)" } else { "" }))
}

pub(crate) fn item_name(p: &Program, r: ItemRef) -> String {
    p.item(r).name().map(|n| n.name.clone()).unwrap_or_default()
}

fn enum_member_names(p: &Program, r: ItemRef) -> Vec<String> {
    match &p.item(r).kind {
        ItemKind::Enum(e) => e.members.iter().map(|m| m.name.name.clone()).collect(),
        _ => Vec::new(),
    }
}

/// Schemas declared `is` this interface, in every loaded module.
fn implementors(p: &Program, iface: ItemRef) -> Vec<String> {
    let name = item_name(p, iface);
    let mut out = Vec::new();
    for module in &p.modules {
        for item in &module.ast.items {
            if let ItemKind::Schema(s) = &item.kind {
                if s.interface.as_ref().is_some_and(|i| i.name == name) {
                    out.push(s.name.name.clone());
                }
            }
        }
    }
    out
}

pub(crate) fn stage_signature(p: &Program, s: &ast::StageDecl) -> String {
    let ports: Vec<String> = s.ports.iter().map(|x| format!("{}: {}", x.name.name, type_text(p, &x.ty))).collect();
    let mut sig = format!("stage {}({})", s.name.name, ports.join(", "));
    if let Some(o) = &s.output {
        sig.push_str(&format!(" -> {}", type_text(p, o)));
    }
    sig
}

pub(crate) fn field_signature(p: &Program, f: &ast::FieldDecl) -> String {
    let mut s = format!("{}: {}", f.name.name, type_text(p, &f.ty));
    if let Some(c) = &f.constraint {
        s.push_str(&format!(" in {}", span_text(p, c.span)));
    }
    if let Some(d) = &f.default {
        s.push_str(&format!(" = {}", span_text(p, d.span)));
    }
    s
}

fn fields_block(p: &Program, fields: &[ast::FieldDecl]) -> String {
    if fields.is_empty() {
        return " {}".into();
    }
    let lines: Vec<String> = fields.iter().map(|f| format!("    {}", field_signature(p, f))).collect();
    format!(" {{\n{}\n}}", lines.join("\n"))
}

#[cfg(test)]
mod tests {
    use crate::fixture::{after_a_syntax_error, at_cursor, loc, recipe};
    use insta::assert_snapshot;

    fn check(fixture: &str) -> String {
        let (a, file, offset) = at_cursor(fixture);
        match super::hover(&a, file, offset) {
            Some(h) => format!("{}\n{}", loc(&a, h.span), h.markdown),
            None => "(no hover)".into(),
        }
    }

    #[test]
    fn on_a_stage_kind() {
        assert_snapshot!(check(&recipe("").replace("train  = grpo(", "train  = gr$0po(")));
    }

    #[test]
    fn on_a_field_shows_declaration_and_value() {
        assert_snapshot!(check(&recipe("").replace("rollout_batch = 16", "rollout_b$0atch = 16")));
    }

    #[test]
    fn on_an_imported_constant_shows_its_value() {
        assert_snapshot!(check(&recipe("").replace("common.answer_tokens", "common.answer_to$0kens")));
    }

    /// The MoE fields of a `transformer` and R3's switch are documented where they are written.
    #[test]
    fn on_moe_and_r3_fields_shows_their_docs() {
        let src = "import std/tasks/arith\nmodel p = transformer { layers = 2, d_model = 32, heads = 2, vocab = arith.vocab, exp$0erts = 4, top_k = 2 }\n";
        let h = check(src);
        assert!(h.contains("experts: Int in 0.. = 0") && h.contains("Routed experts per MoE layer"), "{h}");
        let r = recipe("").replace(
            "max_new_tokens = common.answer_tokens",
            "max_new_tokens = common.answer_tokens\n        routing_re$0play = false",
        );
        let h = check(&r);
        assert!(h.contains("R3 (rollout routing replay)"), "{h}");
    }

    /// A diffusion recipe's fields are documented where they are written, and the denoiser's
    /// derived parameter count is shown.
    #[test]
    fn on_diffusion_fields_shows_their_docs_and_the_derived_params() {
        let src = "model p = denoiser { side = 16, hid$0den = 256 }\nrecipe d {\n    rollout = denoise(p) { micro_group = 4 }\n}\n";
        let h = check(src);
        assert!(h.contains("hidden: Int in 2..=16384 = 256") && h.contains("half the timestep sinusoid"), "{h}");
        let h = check(&src.replace("hid$0den", "hidden").replace("micro_group = 4", "micro_gr$0oup = 4"));
        assert!(h.contains("a micro-group holds one condition's images"), "{h}");
        let h = check(&src.replace("hid$0den", "hidden").replace("model p =", "model p$0 ="));
        assert!(h.contains("params") && h.contains("464384"), "{h}");
    }

    #[test]
    fn on_a_stage_instance_lists_parameters() {
        assert_snapshot!(check(&recipe("").replace("exact_match(rollout)", "exact_match(roll$0out)")));
    }

    /// An `hf` model's sizes come from its config.json, read at check time: the editor shows them.
    #[test]
    fn on_an_hf_model_shows_what_its_config_says() {
        let config = include_str!("../../../tests/fixtures/hf/qwen3/config.json");
        assert_snapshot!(check(&format!(
            "//- main.miles\nmodel pol$0icy = hf {{ path = \"m\" }}\n//- m/config.json\n{config}\n//- m/tokenizer.json\n{{}}\n//- m/model.safetensors\n\n"
        )));
    }

    /// A directory holding only config.json: the hover says the architecture, whether `miles run`
    /// loads it, the parameters (active ones), the experts and the keys read and not read.
    #[test]
    fn on_an_hf_moe_model_shows_its_architecture_experts_and_keys_read() {
        let config = include_str!("../../../tests/fixtures/hf-configs/qwen3-30b-a3b/config.json");
        let h =
            check(&format!("//- main.miles\nmodel pol$0icy = hf {{ path = \"m\" }}\n//- m/config.json\n{config}\n"));
        for want in [
            "**qwen3_moe** (`miles run` loads it)",
            "30.53B parameters, 3.35B active; 128 experts, 8 per token; gqa attention",
            "read from config.json: `model_type`, `architectures`, `hidden_act`",
            "`num_experts`",
            "`moe_intermediate_size`",
            "not read: `max_window_layers`, `sliding_window`",
        ] {
            assert!(h.contains(want), "want {want:?} in\n{h}");
        }
        let config = include_str!("../../../tests/fixtures/hf-configs/deepseek-v3/config.json");
        let h =
            check(&format!("//- main.miles\nmodel pol$0icy = hf {{ path = \"m\" }}\n//- m/config.json\n{config}\n"));
        assert!(h.contains("**deepseek_v3** (plan only: `miles run` loads llama"), "{h}");
        assert!(
            h.contains(
                "671.03B parameters, 37.55B active; 256 experts, 8 per token and a shared expert; mla attention"
            ),
            "{h}"
        );
    }

    #[test]
    fn on_a_quantity() {
        assert_snapshot!(check("const x = 1.G$0iB / 4\n"));
    }

    #[test]
    fn on_a_setting() {
        assert_snapshot!(check(&recipe("").replace("stop = 100.steps", "st$0op = 100.steps")));
    }

    #[test]
    fn on_an_import_path() {
        assert_snapshot!(check(&recipe("").replace("import std/tasks/arith", "import std/tasks/ar$0ith")));
    }

    #[test]
    fn survives_a_syntax_error_elsewhere() {
        assert_snapshot!(check(&after_a_syntax_error("const s = lr_s$0chedule {  }")));
    }
}
