//! `miles plan` from a Hugging Face config.json alone (issue #36): tests/plans/hf-*.miles name
//! directories of tests/fixtures/hf-configs that hold only config.json, for the architectures the
//! planner sizes (MLA, DSA, gpt-oss's experts, Qwen3-MoE). Each plans cleanly, says which keys of
//! config.json it read and which it did not, and sizes memory per rank from the file's figures.

use miles_compiler::fs::FileSystem;
use miles_compiler::{compile, Options};

struct Disk;
impl FileSystem for Disk {
    fn read(&self, path: &str) -> Result<Vec<u8>, String> {
        std::fs::read(path).map_err(|e| e.to_string())
    }
}

fn plan(file: &str) -> miles_plan::Plan {
    let c = compile(&Disk, &[file.to_string()], &Options::default());
    assert!(!c.has_errors(), "{file} has errors: {:#?}", c.diagnostics);
    assert_eq!(c.recipes.len(), 1, "{file}");
    miles_plan::plan(&miles_plan::plan_input(&c.recipes[0]))
}

/// Plans `tests/plans/hf-NAME.miles` without a finding and returns it with its text.
fn clean(name: &str) -> (miles_plan::Plan, String) {
    let p = plan(&format!("tests/plans/hf-{name}.miles"));
    let text = miles_plan::render_text(&p);
    assert_eq!((p.summary.errors, p.summary.warnings), (0, 0), "{text}");
    assert_eq!(p.models.len(), 1, "{text}");
    assert!(text.contains("    read from config.json: model_type, architectures, "), "{text}");
    assert!(text.contains("    not read: "), "{text}");
    assert!(p.memory.iter().any(|m| m.stage == "train") && p.memory.iter().any(|m| m.stage == "rollout"), "{text}");
    (p, text)
}

fn kv_per_token(p: &miles_plan::Plan) -> String {
    let text = miles_plan::render_text(p);
    text.lines().find(|l| l.contains("kv_cache")).unwrap_or_default().to_string()
}

/// DeepSeek-V3: plan only, MLA's latent cache, its MTP module said apart, 671B as published.
#[test]
fn deepseek_v3_from_config_json() {
    let (p, text) = clean("deepseek-v3");
    let m = &p.models[0];
    assert!(!m.loadable);
    assert_eq!((m.params, m.architecture.as_str()), (671_026_404_352, "deepseek_v3"));
    assert!(m.ignored.iter().any(|k| k == "quantization_config"), "{:?}", m.ignored);
    // MLA caches (kv_lora_rank 512 + qk_rope_head_dim 64) x 61 layers x 2 B per token, whatever
    // the TP: 70272 B, not the 128 heads' full keys and values.
    assert!(kv_per_token(&p).contains("70272 B/token/GPU"), "{text}");
    assert!(text.contains("(multi-token prediction: 11.61B more, not counted)"), "{text}");
    insta::assert_snapshot!("hf_deepseek_v3.txt", text);
    insta::assert_snapshot!("hf_deepseek_v3.json", miles_plan::render_json(&p));
}

/// GLM-5: MLA with DSA's indexer keys in the KV cache.
#[test]
fn glm5_from_config_json() {
    let (p, text) = clean("glm-5");
    assert_eq!(p.models[0].params, 743_911_199_232);
    // (512 + 64) x 2 B for the latent plus the indexer's 128-wide FP8 key and its FP32 scale, per
    // layer: more per token than DeepSeek-V3's MLA alone.
    assert!(kv_per_token(&p).contains("100152 B/token/GPU"), "{text}");
    insta::assert_snapshot!("hf_glm5.txt", text);
}

/// gpt-oss-120b: biased experts and router, attention sinks; 116.83B as published.
#[test]
fn gpt_oss_120b_from_config_json() {
    let (p, text) = clean("gpt-oss-120b");
    assert_eq!((p.models[0].params, p.models[0].active_params), (116_829_156_672, 5_711_982_912));
    insta::assert_snapshot!("hf_gpt_oss_120b.txt", text);
}

/// Qwen3-30B-A3B from its config.json plans as the catalog's entry does, and the embedded backend
/// loads the architecture.
#[test]
fn qwen3_30b_a3b_from_config_json() {
    let (p, text) = clean("qwen3-30b-a3b");
    assert!(p.models[0].loadable);
    assert!(text.contains("(qwen3_moe; the embedded backend loads it)"), "{text}");
    assert!(p.models[0].read.iter().any(|k| k == "mlp_only_layers"), "{:?}", p.models[0].read);
    insta::assert_snapshot!("hf_qwen3_30b_a3b.txt", text);
    let html = miles_plan::render_html(&p);
    assert!(html.contains("<h2>Models from config.json</h2>") && html.contains("not read"), "{html}");
    let json = miles_plan::render_json(&p);
    assert!(json.contains("\"models\"") && json.contains("\"moe_intermediate_size\""), "{json}");
}
