//! `model_config`: an `hf` directory's norm epsilon and experts reach the run spec as config.json
//! says them.

use miles_compiler::fs::MemoryFs;

/// The run spec of a GRPO recipe on the `hf` directory `m` holding `config` (a tokenizer and
/// weights beside it, so the run contract accepts it).
fn spec_of(config: &str) -> miles_runtime::spec::RunSpec {
    let src = "import std/tasks/strings\nmodel policy = hf { path = \"m\" }\nrecipe r {\n\
        rollout = generate(policy) { prompts = strings.reverse {}, samples_per_prompt = 4 }\n\
        reward = exact_match(rollout)\ntrain = grpo(rollout, reward) { rollout_batch = 4, global_batch = 16 }\n\
        sync = weights(train -> rollout) { transport = local }\n}\n";
    let fs = MemoryFs::with(&[
        ("r.miles", src),
        ("m/config.json", config),
        ("m/tokenizer.json", "{}"),
        ("m/model.safetensors", ""),
    ]);
    let c = miles_compiler::compile(&fs, &["r.miles".to_string()], &miles_compiler::Options::default());
    assert!(!c.has_errors(), "{:#?}", c.diagnostics);
    super::run_spec(&c.recipes[0]).unwrap_or_else(|d| panic!("{d:#?}"))
}

fn fixture(name: &str) -> String {
    let path = format!("{}/tests/fixtures/hf/{name}/config.json", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// `norm_eps` is config.json's `rms_norm_eps` (Llama's 1e-5 here), not a constant; an MoE
/// directory's experts reach the spec with its layer set, as the engine reads them.
#[test]
fn an_hf_model_maps_its_norm_eps_and_experts() {
    let llama = spec_of(&fixture("llama"));
    assert_eq!(llama.model.norm_eps, 1e-5);
    assert!(llama.model.moe.is_none());
    assert_eq!(spec_of(&fixture("qwen3")).model.norm_eps, 1e-6);
    let q = spec_of(&fixture("qwen3_moe")).model;
    let moe = q.moe.as_ref().expect("experts");
    assert_eq!((moe.experts, moe.top_k, moe.expert_d_ff, moe.mlp_only_layers.clone()), (8, 2, 24, vec![1]));
    assert_eq!((moe.sparse_step, moe.norm_topk, moe.dense_layers), (1, false, 0));
    assert!(q.qk_norm);
    let m = spec_of(&fixture("mixtral")).model;
    assert!(m.moe.as_ref().is_some_and(|x| x.norm_topk && x.expert_d_ff == m.d_ff) && !m.qk_norm);
}
