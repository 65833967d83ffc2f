use super::*;
use crate::fs::MemoryFs;
use crate::program::STDLIB;
use miles_grammar::ast::ItemKind;
use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every field of every stage kind and schema the stdlib declares (owner, field).
fn stdlib_fields() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (i, (_, src)) in STDLIB.iter().enumerate() {
        let (file, _) = miles_grammar::parse(miles_grammar::diag::FileId(i as u32), src);
        for item in &file.items {
            let (name, fields) = match &item.kind {
                ItemKind::Schema(s) => (&s.name.name, &s.fields),
                ItemKind::Stage(s) => (&s.name.name, &s.fields),
                _ => continue,
            };
            out.push((name.clone(), String::new()));
            out.extend(fields.iter().map(|f| (name.clone(), f.name.name.clone())));
        }
    }
    out
}

#[test]
fn every_stdlib_field_has_a_row() {
    let missing: Vec<String> = stdlib_fields()
        .into_iter()
        .filter(|(o, f)| table::lookup(o, f).is_none() && !(f.is_empty() && is_plain_data(o)))
        .map(|(o, f)| format!("{o}.{f}"))
        .collect();
    assert!(missing.is_empty(), "stdlib fields without a row in capability/table.rs: {missing:?}");
    // No stale rows either.
    let fields = stdlib_fields();
    let stale: Vec<String> = TABLE
        .iter()
        .filter(|e| e.field != "*" && !fields.iter().any(|(o, f)| o == e.owner && f == e.field))
        .map(|e| format!("{}.{}", e.owner, e.field))
        .collect();
    assert!(stale.is_empty(), "rows for fields the stdlib no longer has: {stale:?}");
}

/// Prompt sets and catalog entries need no row for themselves: their fields say it all.
fn is_plain_data(owner: &str) -> bool {
    ["addition", "multiplication", "reverse", "sort", "gpu", "host", "recipe_settings"].contains(&owner)
}

/// The text of every Rust source of the repository (where behaviour tests live).
fn rust_sources() -> String {
    let mut sources = String::new();
    let mut stack = vec![root()];
    while let Some(dir) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&dir) else { continue };
        for e in rd.flatten() {
            let p = e.path();
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if p.is_dir() && !name.starts_with('.') && name != "target" && name != "fuzz" {
                stack.push(p);
            } else if name.ends_with(".rs") {
                sources.push_str(&std::fs::read_to_string(&p).unwrap_or_default());
            }
        }
    }
    sources
}

#[test]
fn every_executed_field_names_a_behaviour_test_that_exists() {
    let sources = rust_sources();
    let mut problems = Vec::new();
    for e in TABLE {
        let executes = matches!(e.support, Support::All | Support::Only(..) | Support::Rule(_));
        if executes && e.tested_by.is_empty() {
            problems.push(format!("{}.{} is executed but names no behaviour test", e.owner, e.field));
        }
        for t in e.tested_by {
            if !sources.contains(&format!("fn {t}(")) {
                problems.push(format!("{}.{} names `{t}`, which no test defines", e.owner, e.field));
            }
        }
    }
    assert!(problems.is_empty(), "{problems:#?}");
}

#[test]
fn capabilities_md_is_generated_from_the_table() {
    let path = root().join("docs/capabilities.md");
    let want = matrix_markdown();
    if std::env::var_os("MILES_BLESS").is_some() {
        std::fs::write(&path, &want).expect("write docs/capabilities.md");
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(have == want, "docs/capabilities.md is stale: MILES_BLESS=1 cargo test -p miles-compiler capabilities_md");
}

const BASE: &str = r#"
import std/tasks/strings
model policy = transformer { layers = 1, d_model = 16, heads = 2, vocab = strings.vocab, max_len = 16 }
recipe r {
    rollout = generate(policy) {
        prompts = strings.reverse {}
        samples_per_prompt = 4
        SESSION
    }
    reward = exact_match(rollout)
    train = grpo(rollout, reward) { rollout_batch = 4, global_batch = 16 }
    sync = weights(train -> rollout) { transport = TRANSPORT }
    SETTINGS
}
"#;

fn e0511(session: &str, settings: &str) -> Vec<String> {
    let transport = if settings.contains("launcher") { "broadcast" } else { "local" };
    let src = BASE.replace("SESSION", session).replace("SETTINGS", settings).replace("TRANSPORT", transport);
    let fs = MemoryFs::with(&[("r.miles", &src)]);
    let c = crate::compile(&fs, &["r.miles".to_string()], &crate::Options::default());
    let others: Vec<_> = c.diagnostics.iter().filter(|d| d.is_error() && d.code != "E0511").collect();
    assert!(others.is_empty(), "{others:#?}");
    c.diagnostics.iter().filter(|d| d.code == "E0511").map(|d| d.message.clone()).collect()
}

#[test]
fn a_sound_laptop_recipe_is_clean() {
    assert_eq!(e0511("", ""), Vec::<String>::new());
}

#[test]
fn fields_the_embedded_backend_ignores_are_refused_each_by_name() {
    let got = e0511("session = tito {}\n top_k = 5", "placement = colocated");
    assert_eq!(got.len(), 2, "{got:#?}");
    assert!(got.iter().any(|m| m.contains("`generate.session`")), "{got:#?}");
    assert!(got.iter().any(|m| m.contains("`recipe_settings.placement` = colocated")), "{got:#?}");
}

#[test]
fn asynchronous_schedules_with_worker_processes_pass_check() {
    for schedule in ["fully_async {}", "one_step_off"] {
        let got = e0511("", &format!("launcher = local_processes {{}}\n schedule = {schedule}"));
        assert_eq!(got, Vec::<String>::new(), "{schedule}");
    }
}

#[test]
fn runs_on_selects_the_target() {
    // Held to the cluster, the same fields are planned and nothing is refused.
    assert_eq!(e0511("session = tito {}", "runs_on = cluster"), Vec::<String>::new());
    let got = e0511("", "runs_on = workers");
    assert!(got.iter().any(|m| m.contains("`weights.transport` = local")), "{got:#?}");
}

/// Data-parallel ranks are worker processes (#37): `dp = 2` and the fields only ranks read are
/// refused in `miles run`'s process, each by name; with a launcher the same trainer passes, and
/// `dp = 1` (the default) passes everywhere.
#[test]
fn data_parallel_ranks_are_refused_outside_worker_processes() {
    let with = |backend: &str, settings: &str| {
        let trainer = format!("global_batch = 16, micro_batch = 8, backend = embedded_trainer {{ {backend} }} }}");
        let mut src = BASE.replace("global_batch = 16 }", &trainer);
        if let Some(device) = settings.strip_prefix("device = ") {
            let cluster = format!("cluster box = local {{ device = {device} }}\nrecipe r on box {{");
            src = src.replace("recipe r {", &cluster);
        }
        let settings = if settings.starts_with("device") { "launcher = local_processes {}" } else { settings };
        let transport = if settings.contains("launcher") { "broadcast" } else { "local" };
        let src = src.replace("SESSION", "").replace("SETTINGS", settings).replace("TRANSPORT", transport);
        let fs = MemoryFs::with(&[("r.miles", &src)]);
        let c = crate::compile(&fs, &["r.miles".to_string()], &crate::Options::default());
        let others: Vec<_> = c.diagnostics.iter().filter(|d| d.is_error() && d.code != "E0511").collect();
        assert!(others.is_empty(), "{others:#?}");
        c.diagnostics.iter().filter(|d| d.code == "E0511").map(|d| d.message.clone()).collect::<Vec<_>>()
    };
    let all = "dp = 2, zero = optimizer, dp_bucket = 4.MB, collective_timeout = 30";
    let got = with(all, "");
    for field in ["dp` = 2", "zero` = optimizer", "dp_bucket` = ", "collective_timeout` = 30"] {
        assert!(got.iter().any(|m| m.contains(&format!("`embedded_trainer.{field}"))), "{field}: {got:#?}");
    }
    assert_eq!(got.len(), 4, "{got:#?}");
    assert_eq!(with(all, "launcher = local_processes {}"), Vec::<String>::new());
    assert_eq!(with("dp = 1", ""), Vec::<String>::new());
    // One rank has no collectives: their settings are refused rather than ignored.
    let one = with("dp = 1, dp_bucket = 4.MB, collective_timeout = 30", "launcher = local_processes {}");
    assert_eq!(one.len(), 2, "{one:#?}");
    assert!(
        one.iter()
            .all(|m| m.contains("`embedded_trainer.dp_bucket") || m.contains("`embedded_trainer.collective_timeout")),
        "{one:#?}"
    );
    // A launcher on the GPU: only Gloo on the CPU is built.
    let cuda = with("dp = 2", "device = cuda");
    assert!(cuda.len() == 1 && cuda[0].contains("`embedded_trainer.dp` = 2"), "{cuda:#?}");
    assert_eq!(with("dp = 2", "device = cpu"), Vec::<String>::new());
}

/// The warnings (code, message) of the recipe `src` compiles to.
fn warnings(src: &str) -> Vec<(String, String)> {
    let fs = MemoryFs::with(&[("r.miles", src)]);
    let c = crate::compile(&fs, &["r.miles".to_string()], &crate::Options::default());
    let errors: Vec<_> = c.diagnostics.iter().filter(|d| d.is_error()).collect();
    assert!(errors.is_empty(), "{errors:#?}");
    c.diagnostics.iter().map(|d| (d.code.to_string(), d.message.clone())).collect()
}

/// A recipe relying on a value built but never run on its hardware is warned (E0519), once per
/// value it sets; the same recipe on the CPU is clean (issue #42).
#[test]
fn values_built_but_never_run_are_warned_where_a_recipe_sets_them() {
    let cpu = BASE.replace("SESSION", "").replace("SETTINGS", "").replace("TRANSPORT", "local");
    assert_eq!(warnings(&cpu), Vec::<(String, String)>::new());
    let cuda = cpu.replace("recipe r {", "cluster gpu_box = local { device = cuda }\nrecipe r on gpu_box {");
    let got = warnings(&cuda);
    assert_eq!(got.len(), 1, "{got:#?}");
    assert_eq!(got[0].0, "E0519");
    assert!(got[0].1.contains("`local.device = cuda`"), "{got:#?}");
    let nccl = BASE
        .replace("SESSION", "")
        .replace("SETTINGS", "launcher = local_processes {}")
        .replace("TRANSPORT", "broadcast, channel = nccl");
    let got = warnings(&nccl);
    assert!(got.iter().any(|(c, m)| c == "E0519" && m.contains("`weights.channel = nccl`")), "{got:#?}");
}

/// Every "built, never run" value qualifies a row of the table and names the test that records
/// it once run on its hardware.
#[test]
fn every_value_built_but_never_run_names_a_row_and_its_proving_test() {
    let sources = rust_sources();
    for u in UNPROVEN {
        assert!(table::lookup(u.owner, u.field).is_some(), "{}.{} has no row", u.owner, u.field);
        assert!(!u.proven_by.is_empty(), "{}.{} = {} names no test", u.owner, u.field, u.value);
        for t in u.proven_by {
            assert!(
                sources.contains(&format!("fn {t}(")),
                "{}.{} names `{t}`, which no test defines",
                u.owner,
                u.field
            );
        }
    }
    assert!(matrix_markdown().contains("`cuda`: built, never run"));
}

/// E0511 messages of BASE with `model` as the policy, and the compilation.
fn e0511_with_model(model: &str, files: &[(&str, &str)]) -> (Vec<String>, crate::Compilation) {
    let src = BASE
        .replace("transformer { layers = 1, d_model = 16, heads = 2, vocab = strings.vocab, max_len = 16 }", model)
        .replace("SESSION", "")
        .replace("SETTINGS", "")
        .replace("TRANSPORT", "local");
    let mut all = vec![("r.miles", src.as_str())];
    all.extend_from_slice(files);
    let fs = MemoryFs::with(&all);
    let c = crate::compile(&fs, &["r.miles".to_string()], &crate::Options::default());
    let others: Vec<_> = c.diagnostics.iter().filter(|d| d.is_error() && d.code != "E0511").collect();
    assert!(others.is_empty(), "{others:#?}");
    (c.diagnostics.iter().filter(|d| d.code == "E0511").map(|d| d.message.clone()).collect(), c)
}

/// A seeded MoE's final model is exported as transformers' qwen3_moe (q/k norms, the default)
/// or mixtral (`qk_norm = false`); one neither architecture holds is refused at check, naming
/// the field, as engine/tch's export refuses it (`export_refuses_what_no_transformers_class_holds`).
#[test]
fn a_seeded_moe_transformers_cannot_hold_is_refused_at_check() {
    let moe = |extra: &str| {
        let model = format!(
            "transformer {{ layers = 3, d_model = 16, heads = 2, vocab = strings.vocab, max_len = 16, experts = 4, top_k = 2{extra} }}"
        );
        e0511_with_model(&model, &[]).0
    };
    // Representable: Qwen3-MoE's layer (dense layers are its mlp_only_layers), or Mixtral's.
    for ok in ["", ", dense_layers = 1, norm_topk = false", ", qk_norm = false"] {
        assert_eq!(moe(ok), Vec::<String>::new(), "{ok}");
    }
    for (bad, field, why) in [
        (
            ", shared_expert_d_ff = 32",
            "`transformer.shared_expert_d_ff` = 32",
            "no transformers architecture has a shared expert",
        ),
        (", gating = sigmoid", "`transformer.gating` = sigmoid", "route by a softmax"),
        (", qk_norm = false, dense_layers = 1", "`transformer.qk_norm` = false", "with dense_layers = 1"),
        (", qk_norm = false, norm_topk = false", "`transformer.qk_norm` = false", "with norm_topk = false"),
    ] {
        let got = moe(bad);
        assert_eq!(got.len(), 1, "{bad}: {got:#?}");
        assert!(got[0].contains(field), "{bad}: {got:#?}");
        let (_, c) = e0511_with_model(
            &format!("transformer {{ layers = 3, d_model = 16, heads = 2, vocab = strings.vocab, max_len = 16, experts = 4, top_k = 2{bad} }}"),
            &[],
        );
        let help = c.diagnostics.iter().find(|d| d.code == "E0511").and_then(|d| d.help.clone()).unwrap_or_default();
        assert!(help.contains(why) && help.contains("could not be exported"), "{bad}: {help}");
    }
    // A dense model without q/k norms is Llama's layer: nothing to refuse.
    assert_eq!(
        e0511_with_model(
            "transformer { layers = 1, d_model = 16, heads = 2, vocab = strings.vocab, max_len = 16, qk_norm = false }",
            &[]
        )
        .0,
        Vec::<String>::new()
    );
}

fn fixture(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// A directory holding only config.json checks (and plans); `miles run` refuses it before loading
/// anything, naming what is missing, and refuses a plan-only architecture at the model's line.
#[test]
fn a_config_only_directory_checks_and_the_run_refuses_it() {
    let qwen3 = fixture("tests/fixtures/hf/qwen3/config.json");
    let model = "hf { path = \"m\" }";
    let (check, c) = e0511_with_model(model, &[("m/config.json", &qwen3)]);
    assert_eq!(check, Vec::<String>::new());
    let refused = shape::lm_run(&c.recipes[0]).expect_err("refused");
    let msgs: Vec<&str> = refused.iter().map(|d| d.message.as_str()).collect();
    assert_eq!(msgs.len(), 2, "{msgs:#?}");
    assert!(msgs[0].contains("without weights (m: no model.safetensors"), "{msgs:#?}");
    assert!(msgs[1].contains("without tokenizer.json (m)"), "{msgs:#?}");
    assert!(refused[1].help.as_deref().is_some_and(|h| h.contains("save_pretrained")), "{refused:#?}");
    // With its tokenizer and weights the shape is accepted.
    let (_, c) =
        e0511_with_model(model, &[("m/config.json", &qwen3), ("m/tokenizer.json", "{}"), ("m/model.safetensors", "")]);
    assert!(shape::lm_run(&c.recipes[0]).is_ok());
    // DeepSeek-V3 is sized, not run.
    let ds = fixture("tests/fixtures/hf-configs/deepseek-v3/config.json");
    let (check, c) =
        e0511_with_model(model, &[("m/config.json", &ds), ("m/tokenizer.json", "{}"), ("m/model.safetensors", "")]);
    assert_eq!(check, Vec::<String>::new());
    let refused = shape::lm_run(&c.recipes[0]).expect_err("refused");
    assert_eq!(refused.len(), 1, "{refused:#?}");
    assert!(refused[0].message.contains("a `deepseek_v3` model (m/config.json)"), "{refused:#?}");
    let help = refused[0].help.as_deref().unwrap_or_default();
    assert!(
        help.contains("loads llama, mistral, qwen2, qwen3, qwen3_moe and mixtral; plan it with `miles plan`"),
        "{help}"
    );
    let line = refused[0].primary.as_ref().map(|l| l.span.start);
    let src_model = c.recipes[0].graph.nodes().find_map(|n| n.model.as_deref()).map(|m| m.span.start);
    assert_eq!(line, src_model, "at the model's line");
}
