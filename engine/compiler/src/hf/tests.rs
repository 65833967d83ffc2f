//! config.json readings: the dense fixtures as transformers counts them, the published configs of
//! tests/fixtures/hf-configs against transformers' own counts and the published figures, and the
//! refusals, each naming its key.

use super::*;

fn fixture(name: &str) -> String {
    let path = format!("{}/../../tests/fixtures/hf/{name}/config.json", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// `key = value` for the keys a dense model's reading is about: `KEYS` through `rope_theta` but
/// `loadable`, then `experts` and `params`.
fn show(m: &BTreeMap<String, Value>) -> String {
    let through = KEYS.iter().position(|k| *k == "rope_theta").unwrap();
    KEYS[..=through]
        .iter()
        .filter(|k| **k != "loadable")
        .chain(&["experts", "params"])
        .map(|k| format!("{k} = {}", m.get(*k).map(|v| v.to_string()).unwrap_or("-".into())))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `params` is what transformers counts for the fixture (`sum(p.numel() for p in
/// model.parameters())`: llama 138560, qwen2 94784, qwen3 138144).
#[test]
fn reads_the_three_fixture_architectures() {
    // Llama: untied, no biases, theta from the 4.x top-level key.
    assert_eq!(
        show(&config_map(&fixture("llama")).unwrap()),
        "architecture = \"llama\", layers = 2, d_model = 64, heads = 4, kv_heads = 2, head_dim = 16, d_ff = 96, \
         vocab = 600, max_len = 128, tie_embeddings = false, qkv_bias = false, o_bias = false, qk_norm = false, \
         rope_theta = 500000.0, experts = 0, params = 138560"
    );
    // Qwen2: q/k/v biases and no o bias; tied embeddings; theta from `rope_parameters`.
    assert_eq!(
        show(&config_map(&fixture("qwen2")).unwrap()),
        "architecture = \"qwen2\", layers = 2, d_model = 64, heads = 4, kv_heads = 2, head_dim = 16, d_ff = 96, \
         vocab = 512, max_len = 128, tie_embeddings = true, qkv_bias = true, o_bias = false, qk_norm = false, \
         rope_theta = 1000000.0, experts = 0, params = 94784"
    );
    // Qwen3: q/k norms, head_dim given (24, not 64 / 4), untied.
    assert_eq!(
        show(&config_map(&fixture("qwen3")).unwrap()),
        "architecture = \"qwen3\", layers = 2, d_model = 64, heads = 4, kv_heads = 2, head_dim = 24, d_ff = 96, \
         vocab = 500, max_len = 128, tie_embeddings = false, qkv_bias = false, o_bias = false, qk_norm = true, \
         rope_theta = 1000000.0, experts = 0, params = 138144"
    );
}

#[test]
fn what_the_runtime_would_refuse_is_an_error_naming_the_key() {
    let cases = [
        ("{", "not valid JSON"),
        ("[1]", "not a JSON object"),
        (
            r#"{"model_type": "gpt2", "num_hidden_layers": 2}"#,
            "`model_type` is \"gpt2\": the embedded backend loads llama, mistral, qwen2, qwen3, qwen3_moe, mixtral; \
             `miles plan` also sizes deepseek_v3, kimi_k2, glm4_moe, glm_moe_dsa, gpt_oss (plan only)",
        ),
        (r#"{"architectures": ["BertModel"]}"#, "`architectures` is [\"BertModel\"]"),
        (r#"{"model_type": "llama", "hidden_size": 64}"#, "no `num_hidden_layers`"),
        (
            r#"{"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 8, "vocab_size": 0}"#,
            "`vocab_size` must be at least 1",
        ),
        (
            r#"{"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 8, "vocab_size": 9, "hidden_act": "gelu"}"#,
            "`hidden_act` = \"gelu\" (only \"silu\") is not supported",
        ),
        (
            r#"{"model_type": "llama", "num_hidden_layers": "two"}"#,
            "`num_hidden_layers` must be a non-negative integer, found \"two\"",
        ),
    ];
    for (text, want) in cases {
        let e = config_map(text).unwrap_err();
        assert!(e.starts_with(want), "{text}: {e}");
    }
}

/// tests/fixtures/hf-configs/<dir>/config.json, read.
fn published(dir: &str) -> BTreeMap<String, Value> {
    let path = format!("{}/../../tests/fixtures/hf-configs/{dir}/config.json", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    config_map(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn n(m: &BTreeMap<String, Value>, k: &str) -> i128 {
    m.get(k).and_then(Value::as_i64).unwrap_or_else(|| panic!("no integer `{k}` in {m:?}")) as i128
}

/// One published model: its fixture, transformers' own count of that config.json (printed by
/// scripts/make-hf-config-fixtures.py --count: `sum(p.numel() for p in model.parameters())` on
/// the meta device), the published total and active counts (docs/models.md's table, with sources
/// in tests/fixtures/hf-configs/README.md), and how many of the vocab x d_model matrices the
/// published active count leaves out (0: none; 1: the embedding, as gpt-oss's card counts; 2: the
/// embedding and the LM head, as GLM's do). MTP layers are not in `params`.
pub(super) const PUBLISHED: [(&str, i128, f64, f64, i128); 14] = [
    ("qwen3-8b", 8_190_735_360, 8.2e9, 8.2e9, 0),
    ("qwen3-30b-a3b", 30_532_122_624, 30.5e9, 3.3e9, 0),
    ("qwen3-235b-a22b", 235_093_634_560, 235e9, 22e9, 0),
    ("mixtral-8x7b", 46_702_792_704, 46.7e9, 12.9e9, 0),
    ("llama-3.1-8b", 8_030_261_248, 8.03e9, 8.03e9, 0),
    ("llama-3.1-70b", 70_553_706_496, 70.6e9, 70.6e9, 0),
    ("deepseek-v3", 671_026_404_352, 671e9, 37e9, 0),
    ("kimi-k2-instruct", 1_026_408_209_408, 1.04e12, 32e9, 0),
    ("glm-4.5", 352_797_814_784, 355e9, 32e9, 2),
    ("glm-4.6", 352_797_814_784, 355e9, 32e9, 2),
    ("glm-4.5-air", 106_852_245_504, 106e9, 12e9, 2),
    ("glm-5", 743_911_199_232, 744e9, 40e9, 2),
    ("gpt-oss-20b", 20_914_757_184, 20.91e9, 3.61e9, 1),
    ("gpt-oss-120b", 116_829_156_672, 116.83e9, 5.13e9, 1),
];

/// Every published config.json is sized exactly as transformers builds it, within 1% of the
/// published total (Kimi K2: 1.3% under its technical report's "1.04 trillion", which the
/// released checkpoint does not reach: transformers counts 1.026T for this very config.json; the
/// model card says "1T"), and its active count, counted as its publisher counts it, within 3%.
#[test]
fn published_configs_match_transformers_and_the_published_counts() {
    for (dir, transformers, total, active, left_out) in PUBLISHED {
        let m = published(dir);
        assert_eq!(n(&m, "params"), transformers, "{dir}: transformers counts {transformers}");
        let ours = n(&m, "params") as f64;
        let off = (ours - total) / total;
        let allowed = if dir == "kimi-k2-instruct" { 0.015 } else { 0.01 };
        assert!(off.abs() <= allowed, "{dir}: {ours} is {:.2}% from the published {total}", off * 100.0);
        let ours_active = (n(&m, "active_params") - left_out * n(&m, "vocab") * n(&m, "d_model")) as f64;
        let off = (ours_active - active) / active;
        assert!(off.abs() <= 0.03, "{dir}: active {ours_active} is {:.1}% from the published {active}", off * 100.0);
    }
}

/// What each architecture is: loadable or plan only, its attention and its experts.
#[test]
fn architectures_attention_and_experts() {
    let cases = [
        ("qwen3-8b", "qwen3", true, "gqa", 0, 0, 0),
        ("qwen3-30b-a3b", "qwen3_moe", true, "gqa", 128, 8, 0),
        ("mixtral-8x7b", "mixtral", true, "gqa", 8, 2, 0),
        ("llama-3.1-70b", "llama", true, "gqa", 0, 0, 0),
        ("deepseek-v3", "deepseek_v3", false, "mla", 256, 8, 3),
        ("kimi-k2-instruct", "kimi_k2", false, "mla", 384, 8, 1),
        ("glm-4.5", "glm4_moe", false, "gqa", 160, 8, 3),
        ("glm-4.5-air", "glm4_moe", false, "gqa", 128, 8, 1),
        ("glm-5", "glm_moe_dsa", false, "mla", 256, 8, 3),
        ("gpt-oss-120b", "gpt_oss", false, "gqa", 128, 4, 0),
    ];
    for (dir, arch, loadable, attention, experts, top_k, dense) in cases {
        let m = published(dir);
        let got = (
            m["architecture"].as_str().unwrap().to_string(),
            m["loadable"].as_bool().unwrap(),
            m["attention"].as_str().unwrap().to_string(),
            n(&m, "experts"),
            n(&m, "top_k"),
            n(&m, "dense_layers"),
        );
        assert_eq!(got, (arch.to_string(), loadable, attention.to_string(), experts, top_k, dense), "{dir}");
    }
    // MLA: the cached latent and rotary key; DSA: the indexer's top-k and key width.
    let ds = published("deepseek-v3");
    assert_eq!((n(&ds, "kv_lora_rank"), n(&ds, "qk_rope_head_dim"), n(&ds, "head_dim")), (512, 64, 192));
    assert_eq!(ds["sparse_topk"], Value::None);
    let glm5 = published("glm-5");
    assert_eq!((n(&glm5, "sparse_topk"), n(&glm5, "index_head_dim"), n(&glm5, "head_dim")), (2048, 128, 256));
    // DeepSeek-V3's MTP module (the 14B its card leaves out of 671B) is counted apart.
    let mtp = n(&ds, "mtp_params") as f64;
    assert!((11.0e9..15.0e9).contains(&mtp), "{mtp}");
    // norm_eps from rms_norm_eps: Llama 3.1 says 1e-5, Qwen3 1e-6.
    assert_eq!(published("llama-3.1-8b")["norm_eps"].as_f64(), Some(1e-5));
    assert_eq!(published("qwen3-8b")["norm_eps"].as_f64(), Some(1e-6));
    // Qwen3-MoE renormalises its top-k as its config says; Mixtral always does.
    assert_eq!(published("qwen3-30b-a3b")["norm_topk"], Value::Bool(true));
}

/// `read` lists the keys read in order; `ignored` what is present and was not read (bookkeeping
/// such as transformers_version left out).
#[test]
fn says_which_keys_it_read_and_which_it_did_not() {
    let strs = |v: &Value| match v {
        Value::List(items) => items.iter().map(|s| s.as_str().unwrap().to_string()).collect::<Vec<_>>(),
        other => panic!("{other}"),
    };
    let m = published("deepseek-v3");
    let read = strs(&m["read"]);
    for k in
        ["q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "n_routed_experts", "first_k_dense_replace", "scoring_func"]
    {
        assert!(read.contains(&k.to_string()), "{k} not in {read:?}");
    }
    let ignored = strs(&m["ignored"]);
    // What DeepSeek-V3 routes with but does not size it: groups, scaling, the yarn rope, fp8.
    for k in ["n_group", "topk_group", "routed_scaling_factor", "quantization_config"] {
        assert!(ignored.contains(&k.to_string()), "{k} not in {ignored:?}");
    }
    assert!(!ignored.iter().any(|k| k == "transformers_version" || read.contains(k)), "{ignored:?}");
    let q = published("qwen3-30b-a3b");
    assert_eq!(
        strs(&q["read"])[..6],
        ["model_type", "architectures", "hidden_act", "use_sliding_window", "attention_bias", "num_hidden_layers"]
            .map(String::from)
    );
}

/// An MoE config with a field the embedded backend cannot honour is refused, naming the field.
#[test]
fn moe_fields_the_backend_cannot_honour_are_refused() {
    let qwen = std::fs::read_to_string(format!(
        "{}/../../tests/fixtures/hf-configs/qwen3-30b-a3b/config.json",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    let mixtral = std::fs::read_to_string(format!(
        "{}/../../tests/fixtures/hf-configs/mixtral-8x7b/config.json",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    let with = |text: &str, key: &str, value: &str| text.replacen('{', &format!("{{\"{key}\": {value},"), 1);
    let cases = [
        (with(&mixtral, "router_jitter_noise", "0.01"), "`router_jitter_noise` = 0.01 is not supported"),
        (
            with(&qwen, "shared_expert_intermediate_size", "512"),
            "`shared_expert_intermediate_size` = 512 is not supported",
        ),
        (
            qwen.replace("\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\""),
            "`hidden_act` = \"gelu\" (only \"silu\") is not supported",
        ),
        (qwen.replace("\"mlp_only_layers\": []", "\"mlp_only_layers\": [48]"), "`mlp_only_layers` names layer 48"),
        (with(&mixtral, "mlp_only_layers", "[0]"), "`mlp_only_layers` = [0] is not supported"),
        (with(&mixtral, "norm_topk_prob", "false"), "`norm_topk_prob` = false is not supported"),
        (with(&mixtral, "attention_bias", "true"), "`attention_bias` = true is not supported"),
        (with(&qwen, "scoring_func", "\"sigmoid\""), "`scoring_func` = \"sigmoid\" is not supported"),
        (with(&qwen, "num_local_experts", "64"), "`num_experts` (128) and `num_local_experts` (64) disagree"),
        (qwen.replace("\"num_experts_per_tok\": 8", "\"num_experts_per_tok\": 129"), "`num_experts_per_tok` = 129"),
        (qwen.replace("\"decoder_sparse_step\": 1", "\"decoder_sparse_step\": 0"), "`decoder_sparse_step` must be"),
        (
            qwen.replace("\"rope_scaling\": null", "\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4}"),
            "`rope_scaling`: rope type `yarn`",
        ),
    ];
    for (text, want) in cases {
        let e = config_map(&text).unwrap_err();
        assert!(e.starts_with(want), "want {want}: {e}");
    }
    // A plan-only architecture is sized whatever its activation or rotary: it is not run.
    let oss = published("gpt-oss-20b");
    assert_eq!(oss["loadable"], Value::Bool(false));
}

/// The tiny Qwen3-MoE and Mixtral fixtures the embedded backend loads (tests/fixtures/hf, made
/// with transformers): counted as transformers counts them (92736 and 81824), with the layer set
/// and routing read as engine/tch reads them.
#[test]
fn reads_the_loadable_moe_fixtures() {
    let q = config_map(&fixture("qwen3_moe")).unwrap();
    assert_eq!((n(&q, "params"), n(&q, "experts"), n(&q, "top_k"), n(&q, "expert_d_ff")), (92736, 8, 2, 24));
    assert_eq!((q["loadable"].clone(), q["norm_topk"].clone()), (Value::Bool(true), Value::Bool(false)));
    assert_eq!(q["mlp_only_layers"], Value::List(vec![Value::int(1)]));
    assert_eq!(n(&q, "moe_layers"), 2);
    let m = config_map(&fixture("mixtral")).unwrap();
    assert_eq!((n(&m, "params"), n(&m, "expert_d_ff"), n(&m, "d_ff")), (81824, n(&m, "d_ff"), n(&m, "expert_d_ff")));
    assert_eq!((m["qk_norm"].clone(), m["norm_topk"].clone()), (Value::Bool(false), Value::Bool(true)));
    assert_eq!(m["norm_eps"].as_f64(), Some(1e-5));
}
