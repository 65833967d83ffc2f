//! Hugging Face mixture-of-experts directories through the built binary: a `.miles` recipe over the
//! Qwen3-MoE and Mixtral fixtures (made by transformers, scripts/make-hf-moe-fixtures.py) checks,
//! plans from config.json, trains with R3 (a bf16 engine's routes replayed by the fp32 trainer) and
//! leaves the final model in transformers' own format, with the fixture's tensor names and shapes.
//! A seeded MoE that no transformers class can hold is refused by `miles check` at its field.

use crate::common;

use crate::hf_recipe::{parquet_recipe, PROMPTS};
use common::metrics::{json_file, rows};
use common::process::{run_miles as miles, run_recipe, temp_dir, text};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

/// A safetensors file's tensors: name -> shape, from its header.
fn tensor_shapes(path: &Path) -> BTreeMap<String, Vec<u64>> {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    header
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| *k != "__metadata__")
        .map(|(k, v)| (k.clone(), v["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap()).collect()))
        .collect()
}

/// Two steps over the Parquet prompts with a bf16 engine whose routes the trainer replays.
fn recipe(model: &str) -> String {
    let r3 = ["engine = embedded_engine { precision = bf16 }", "record_routing = true", "routing_replay = true"];
    parquet_recipe(&format!(r#"hf {{ path = "{model}" }}"#), PROMPTS, &r3, "lr = 1e-3", &[], 2)
}

/// Checks, plans and runs the recipe over `fixture`; returns the run's directory.
fn check_plan_run(dir: &Path, fixture: &str, model_type: &str) -> std::path::PathBuf {
    let r = dir.join(format!("{model_type}.miles"));
    std::fs::write(&r, recipe(fixture)).unwrap();
    let r = r.to_str().unwrap();
    let o = miles(&["check", r]);
    assert!(o.status.success(), "{}", text(&o));
    let o = miles(&["plan", r]);
    assert!(o.status.success(), "{}", text(&o));
    let plan = text(&o);
    assert!(plan.contains(model_type), "the plan names the architecture it read: {plan}");
    assert!(plan.contains("read from config.json"), "the plan says which keys it read: {plan}");
    let out = dir.join(model_type);
    let o = run_recipe(Path::new(r), &out, std::time::Duration::from_secs(300));
    assert!(o.status.success(), "{}", text(&o));
    let rows: Vec<Value> = rows(&out).into_iter().filter(|r| r["r3/route_mismatch"].is_number()).collect();
    assert_eq!(rows.len(), 2, "both steps trained with routes recorded");
    for row in &rows {
        // The trainer used exactly the experts the bf16 engine chose.
        assert_eq!(row["r3/route_mismatch"], 0.0, "{row}");
    }
    out
}

#[test]
fn a_qwen3_moe_directory_trains_with_r3_and_is_written_back_as_qwen3_moe() {
    let d = temp_dir("hf-moe-qwen3");
    std::fs::create_dir_all(&d).unwrap();
    let fixture = Path::new("tests/fixtures/hf/qwen3_moe");
    let out = check_plan_run(&d, fixture.to_str().unwrap(), "qwen3_moe");
    let (ours, theirs) = (json_file(&out.join("model/config.json")), json_file(&fixture.join("config.json")));
    assert_eq!(ours["architectures"][0], "Qwen3MoeForCausalLM");
    for key in ["model_type", "mlp_only_layers", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob"] {
        assert_eq!(ours[key], theirs[key], "{key}");
    }
    // The same tensors, named and shaped as transformers wrote them.
    assert_eq!(tensor_shapes(&out.join("model/model.safetensors")), tensor_shapes(&fixture.join("model.safetensors")));
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_mixtral_directory_trains_with_r3_and_keeps_mixtral_names() {
    let d = temp_dir("hf-moe-mixtral");
    std::fs::create_dir_all(&d).unwrap();
    let fixture = Path::new("tests/fixtures/hf/mixtral");
    let out = check_plan_run(&d, fixture.to_str().unwrap(), "mixtral");
    assert_eq!(json_file(&out.join("model/config.json"))["architectures"][0], "MixtralForCausalLM");
    let shapes = tensor_shapes(&out.join("model/model.safetensors"));
    assert!(shapes.contains_key("model.layers.0.block_sparse_moe.experts.3.w2.weight"), "{:?}", shapes.keys());
    assert_eq!(shapes, tensor_shapes(&fixture.join("model.safetensors")));
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_seeded_moe_no_transformers_class_holds_is_refused_at_its_field() {
    let d = temp_dir("hf-moe-refused");
    std::fs::create_dir_all(&d).unwrap();
    let r = d.join("shared.miles");
    let text_of = |extra: &str| {
        common::tiny::tiny_recipe("transport = local", 1, &[])
            .replace("max_len = 12 }", &format!("max_len = 12, experts = 4, top_k = 2{extra} }}"))
    };
    std::fs::write(&r, text_of(", shared_expert_d_ff = 16")).unwrap();
    let o = miles(&["check", r.to_str().unwrap()]);
    assert!(!o.status.success(), "{}", text(&o));
    let t = text(&o);
    assert!(t.contains("E0511") && t.contains("shared_expert_d_ff"), "{t}");
    // Without the shared expert the same model is Qwen3-MoE's and checks.
    std::fs::write(&r, text_of("")).unwrap();
    let o = miles(&["check", r.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let _ = std::fs::remove_dir_all(&d);
}
