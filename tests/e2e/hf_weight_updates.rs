//! Weight updates through disk (`miles_workers::http::write_hf_checkpoint`, what SGLang's
//! `/update_weights_from_disk` and `miles serve` load) for every architecture the embedded backend
//! runs: a policy loaded from each Hugging Face fixture (tests/fixtures/hf, made with
//! transformers) is written as an update and read back by `miles serve`'s own loader
//! (`Policy::load`) with the same model config and the same weights, under the fixture's own
//! tensor names (Mixtral's `block_sparse_moe` ones included).

use crate::common::process::temp_dir;
use miles_runtime::{ModelConfig, RopeScaling, WeightSnapshot};
use miles_tch::model::Policy;
use miles_workers::http::{write_hf_checkpoint, write_hf_checkpoint_from};
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf").join(name)
}

/// The tensor names of a directory's weights: one model.safetensors, or the shards its index
/// lists (the llama fixture is sharded).
fn tensor_names(dir: &Path) -> BTreeSet<String> {
    let one = dir.join("model.safetensors");
    if one.exists() {
        let h = miles_runtime::safetensors::read_file_header(&one).unwrap();
        return h.entries.into_iter().map(|e| e.name).collect();
    }
    let index: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("model.safetensors.index.json")).unwrap()).unwrap();
    index["weight_map"].as_object().unwrap().keys().cloned().collect()
}

fn config(dir: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap()
}

/// The update in `dir` as `miles serve` loads it: the same model and the same weights.
fn assert_loads_back(dir: &Path, cfg: &ModelConfig, snap: &WeightSnapshot, what: &str) {
    let back = Policy::load(dir).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(&back.cfg, cfg, "{what}: the model config read back");
    assert_eq!(back.snapshot(snap.version).unwrap(), *snap, "{what}: the weights read back");
}

#[test]
fn an_update_of_each_architecture_loads_back_under_transformers_names() {
    let root = temp_dir("hf-weight-updates");
    for name in ["llama", "qwen2", "qwen3", "qwen3_moe", "mixtral"] {
        let (policy, meta) = Policy::load_hf(&fixture(name), None).unwrap();
        let snap = policy.snapshot(3).unwrap();
        // From the model config alone (a policy seeded, or one whose source is unknown).
        let dir = root.join(name).join("v3");
        write_hf_checkpoint(&dir, &snap, &policy.cfg).unwrap();
        let written = config(&dir);
        assert_eq!(written["model_type"], meta.config["model_type"], "{name}");
        assert_eq!(written["architectures"], meta.config["architectures"], "{name}");
        assert_eq!(
            tensor_names(&dir),
            tensor_names(&fixture(name)),
            "{name}: the update's tensor names are the fixture's (transformers' own)"
        );
        assert_loads_back(&dir, &policy.cfg, &snap, name);
        // From the source directory's config.json, as a run from an `hf` model writes it.
        let dir = root.join(name).join("v4");
        write_hf_checkpoint_from(&dir, &snap, &policy.cfg, Some(&meta.config)).unwrap();
        let mut want = meta.config.clone();
        let key =
            if want.get("torch_dtype").is_some() || want.get("dtype").is_none() { "torch_dtype" } else { "dtype" };
        want[key] = Value::from("float32");
        assert_eq!(config(&dir), want, "{name}: the source's config.json, dtype float32");
        assert_loads_back(&dir, &policy.cfg, &snap, name);
    }
    let _ = std::fs::remove_dir_all(root);
}

/// What the old writer lost (it wrote every model as a plain LlamaForCausalLM): rope scaling and
/// tied embeddings reach the server as the trainer holds them.
#[test]
fn rope_scaling_and_tied_embeddings_survive_an_update() {
    let root = temp_dir("hf-weight-updates-rope");
    let src = root.join("llama3");
    std::fs::create_dir_all(&src).unwrap();
    for e in std::fs::read_dir(fixture("llama")).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_file() {
            std::fs::copy(e.path(), src.join(e.file_name())).unwrap();
        }
    }
    let mut c = config(&fixture("llama"));
    c["rope_scaling"] = serde_json::json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 32});
    std::fs::write(src.join("config.json"), c.to_string()).unwrap();
    let (policy, _) = Policy::load_hf(&src, None).unwrap();
    assert!(matches!(policy.cfg.rope_scaling, Some(RopeScaling::Llama3 { .. })));
    let snap = policy.snapshot(1).unwrap();
    let dir = root.join("v1");
    write_hf_checkpoint(&dir, &snap, &policy.cfg).unwrap();
    assert_eq!(config(&dir)["rope_scaling"]["rope_type"], "llama3");
    assert_loads_back(&dir, &policy.cfg, &snap, "llama3 rope scaling");

    let (qwen3, _) = Policy::load_hf(&fixture("qwen3"), None).unwrap();
    let tied = ModelConfig { tie_embeddings: true, ..qwen3.cfg.clone() };
    let policy = Policy::init(&tied, 5);
    let snap = policy.snapshot(2).unwrap();
    let dir = root.join("v2");
    write_hf_checkpoint(&dir, &snap, &tied).unwrap();
    assert_eq!(config(&dir)["tie_word_embeddings"], true);
    assert_loads_back(&dir, &tied, &snap, "qwen3 tied");
    let _ = std::fs::remove_dir_all(root);
}
