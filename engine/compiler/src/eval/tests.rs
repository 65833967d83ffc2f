//! The shared queries of evaluation, called directly: a stage's model, bare enum members, the
//! shape of a stage call, and diagnostics that mark a bug in miles.

use super::*;
use crate::fs::MemoryFs;
use crate::recipe::stage_call;
use crate::{compile, Compilation, Options};

fn check(src: &str) -> Compilation {
    let fs = MemoryFs::with(&[("a.miles", src)]);
    compile(&fs, &["a.miles".to_string()], &Options::default())
}

fn errors(c: &Compilation) -> Vec<String> {
    c.diagnostics.iter().filter(|d| d.is_error()).map(|d| format!("{}: {}", d.code, d.message)).collect()
}

const RECIPE: &str = r#"
import std/tasks/arith
model policy = transformer { layers = 2, d_model = 64, heads = 4, vocab = arith.vocab, max_len = 16 }
recipe r {
    warmup = sft(policy) { data = arith.addition { digits = 2 } }
    rollout = generate(warmup) { prompts = arith.addition { digits = 2 } }
    reward = exact_match(rollout)
    train = grpo(rollout, reward) { rollout_batch = 16, global_batch = 128 }
    sync = weights(train -> rollout)
    stop = 10.steps
}
"#;

#[test]
fn every_stage_node_carries_the_model_found_upstream() {
    let c = check(RECIPE);
    assert_eq!(errors(&c), Vec::<String>::new());
    let g = &c.recipe("r").expect("compiles").graph;
    for n in g.nodes() {
        let m = n.model.as_ref().unwrap_or_else(|| panic!("`{}` has no model", n.name));
        assert_eq!((m.schema_name.as_str(), m.get("layers").map(|v| v.to_string())), ("transformer", Some("2".into())));
    }
}

#[test]
fn a_stage_with_no_model_upstream_has_none() {
    let src = r#"
stage source() -> Trajectories {}
recipe r {
    rollout = source()
    reward = exact_match(rollout)
}
"#;
    let c = check(src);
    let g = &c.recipe("r").expect("compiles").graph;
    assert!(g.nodes().all(|n| n.model.is_none()));
}

#[test]
fn bare_enum_member_is_found_in_the_module_and_the_prelude_only() {
    let fs = MemoryFs::with(&[
        ("a.miles", "import b\nenum mine { alpha, beta }\n"),
        ("b.miles", "enum theirs { gamma }\nenum twice { alpha }\n"),
    ]);
    let c = compile(&fs, &["a.miles".to_string()], &Options::default());
    let a = c.program.module_by_key("a.miles").or_else(|| c.program.module_by_key("a")).expect("module a");
    let found = |name: &str| bare_enum_member(&c.program, a, name).map(|(r, m)| (r, m.name.name.clone()));
    assert_eq!(found("beta").map(|(_, m)| m), Some("beta".into()));
    // `colocated` is a prelude enum member, visible everywhere.
    assert!(found("colocated").is_some());
    // An imported module's enum is not searched, so `alpha` stays unambiguous.
    assert_eq!(found("alpha").map(|(_, m)| m), Some("alpha".into()));
    assert_eq!(found("gamma"), None);
    assert_eq!(found("nothing"), None);
}

#[test]
fn stage_call_splits_kind_arguments_and_fields() {
    let parse = |s: &str| miles_grammar::parse_expr(miles_grammar::diag::FileId(0), s).0.expect("parses");
    let e = parse("grpo(rollout, reward) { lr = 1e-4 }");
    let (callee, args, fields) = stage_call(&e).expect("a stage call");
    assert_eq!((expr_text(callee), args.len(), fields.len()), ("grpo".to_string(), 2, 1));
    let e = parse("weights(train -> rollout)");
    assert_eq!(stage_call(&e).map(|(_, a, f)| (a.len(), f.len())), Some((1, 0)));
    for setting in ["10.steps", "adam { lr = 1 }", "sync"] {
        assert!(stage_call(&parse(setting)).is_none(), "{setting}");
    }
}

#[test]
fn builtins_resolve_and_unknown_calls_list_them() {
    let c = check("const a = max(1, 3)\nconst b = maxx(1)\n");
    assert_eq!(errors(&c).len(), 1, "{:?}", errors(&c));
    let d = c.diagnostics.iter().find(|d| d.is_error()).expect("one error");
    assert_eq!(d.code, "E0103");
    assert!(d.help.as_deref().is_some_and(|h| h.contains("`max`")), "{:?}", d.help);
}

#[test]
fn a_field_cycle_through_a_constraint_is_reported_not_followed() {
    let src = "schema s {\n    x: Int in 0..y = 1\n    y: Int = x\n}\nconst v: s = s\n";
    let c = check(src);
    assert_eq!(errors(&c), ["E0206: field defaults refer to each other: x -> y -> x"]);
}

#[test]
fn internal_errors_say_they_are_bugs_in_miles() {
    let fs = MemoryFs::with(&[("a.miles", "const a = 1\n")]);
    let c = compile(&fs, &["a.miles".to_string()], &Options::default());
    let mut ev = Eval::new(&c.program);
    ev.internal_error(
        miles_grammar::diag::ErrorCode::E0103,
        Span::default(),
        "the prelude declares no `x` schema".into(),
    );
    let d = &ev.diags[0];
    assert_eq!(d.message, "internal error: the prelude declares no `x` schema");
    assert!(d.help.as_deref().is_some_and(|h| h.contains("bug in miles")));
}

/// A recipe over an `hf` model whose files live in `files` (path -> text).
fn check_hf(files: &[(&str, &str)], model_dir: &str) -> Compilation {
    let src = format!(
        r#"
model policy = hf {{ path = "{model_dir}" }}
recipe r {{
    rollout = generate(policy) {{ prompts = jsonl {{ path = "d.jsonl" }} }}
    reward = command_reward(rollout) {{ command = ["python3", "v.py"] }}
    train = grpo(rollout, reward) {{ rollout_batch = 16, global_batch = 128 }}
    sync = weights(train -> rollout)
    stop = 10.steps
}}
"#
    );
    let mut all = vec![("a.miles", src.as_str())];
    all.extend_from_slice(files);
    let fs = MemoryFs::with(&all);
    compile(&fs, &["a.miles".to_string()], &Options::default())
}

const QWEN3_CONFIG: &str = include_str!("../../../../tests/fixtures/hf/qwen3/config.json");

#[test]
fn an_hf_model_is_read_from_its_config_at_check_time() {
    let files =
        [("m/config.json", QWEN3_CONFIG), ("m/tokenizer.json", "{}"), ("m/model.safetensors", ""), ("d.jsonl", "")];
    let c = check_hf(&files, "m");
    assert_eq!(errors(&c), Vec::<String>::new());
    let g = &c.recipe("r").expect("compiles").graph;
    let m = g.nodes().find(|n| n.name == "train").and_then(|n| n.model.clone()).expect("a model");
    let field = |k: &str| m.get(k).map(|v| v.to_string()).unwrap_or_default();
    assert_eq!(
        ["layers", "d_model", "heads", "kv_heads", "head_dim", "d_ff", "vocab", "max_len", "params"].map(field),
        ["2", "64", "4", "2", "24", "96", "500", "128", "138144"]
    );
}

#[test]
fn what_an_hf_directory_lacks_is_an_error_at_the_users_line() {
    // No directory at all: one E0210 on the path the user wrote (not in the stdlib).
    let c = check_hf(&[("d.jsonl", "")], "models/nope");
    let errs: Vec<&Diagnostic> = c.diagnostics.iter().filter(|d| d.is_error()).collect();
    assert_eq!(errs.len(), 1, "{:?}", errors(&c));
    assert_eq!(errs[0].code, "E0210");
    assert!(errs[0].message.contains("models/nope/config.json"), "{}", errs[0].message);
    let at = errs[0].primary.as_ref().expect("a primary label").span;
    let text = &c.program.sources.get(at.file).expect("a source").text[at.start as usize..at.end as usize];
    assert_eq!(text, "\"models/nope\"");

    // A directory holding only config.json checks (and plans): the missing tokenizer and weights
    // are flags `miles run` refuses (capability/shape.rs); the missing prompt file is a check.
    let c = check_hf(&[("m/config.json", QWEN3_CONFIG)], "m");
    let msgs = errors(&c);
    assert_eq!(msgs.len(), 1, "{msgs:?}");
    assert!(msgs[0].contains("the prompt file is not there"), "{msgs:?}");
    let g = &c.recipe("r").expect("compiles").graph;
    let m = g.nodes().find(|n| n.name == "train").and_then(|n| n.model.clone()).expect("a model");
    for flag in ["has_tokenizer", "has_weights"] {
        assert_eq!(m.get(flag).map(|v| v.to_string()), Some("false".into()), "{flag}");
    }
}

#[test]
fn set_overrides_a_models_field() {
    let files = [("a.miles", RECIPE), ("m/config.json", QWEN3_CONFIG)];
    let fs = MemoryFs::with(&files);
    let opts = Options { overrides: vec![("policy.layers".into(), "3".into())], ..Options::default() };
    let c = compile(&fs, &["a.miles".to_string()], &opts);
    assert_eq!(errors(&c), Vec::<String>::new());
    let g = &c.recipe("r").expect("compiles").graph;
    let m = g.nodes().find(|n| n.name == "train").and_then(|n| n.model.clone()).expect("a model");
    assert_eq!(m.get("layers").map(|v| v.to_string()), Some("3".into()));
    // A model's name alone is not a field path.
    let opts = Options { overrides: vec![("policy".into(), "3".into())], ..Options::default() };
    let c = compile(&fs, &["a.miles".to_string()], &opts);
    assert_eq!(errors(&c), vec!["E0209: `policy` is a model or cluster: set one of its fields".to_string()]);
}
