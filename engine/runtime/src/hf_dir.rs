//! The pure parts of a Hugging Face model directory written from a `ModelConfig`: which
//! transformers architecture holds the model, its config.json, and the tensor names transformers
//! gives the model's parameters (Mixtral's differ). No tensors and no IO, so the two writers share
//! it: engine/tch's exporter and checkpoints (`miles_tch::hf`, which also reads config.json back)
//! and the workers' weight updates through disk (`miles_workers::http::write_hf_checkpoint`, what
//! SGLang's `/update_weights_from_disk` and `miles serve` load), which cannot depend on tch.

use crate::error::{RunError, E_CHECKPOINT};
use crate::spec::{HfMoeArchitecture, ModelConfig, MoeConfig, RopeScaling};
use serde_json::{json, Map, Value};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
    /// Qwen3's attention with routed experts (`qwen3_moe`).
    Qwen3Moe,
    /// Mistral's attention with routed experts in every layer (`mixtral`).
    Mixtral,
}

impl Architecture {
    pub const ALL: [Architecture; 6] = [
        Architecture::Llama,
        Architecture::Mistral,
        Architecture::Qwen2,
        Architecture::Qwen3,
        Architecture::Qwen3Moe,
        Architecture::Mixtral,
    ];

    /// The `architectures` entry of config.json.
    pub fn class_name(self) -> &'static str {
        match self {
            Architecture::Llama => "LlamaForCausalLM",
            Architecture::Mistral => "MistralForCausalLM",
            Architecture::Qwen2 => "Qwen2ForCausalLM",
            Architecture::Qwen3 => "Qwen3ForCausalLM",
            Architecture::Qwen3Moe => "Qwen3MoeForCausalLM",
            Architecture::Mixtral => "MixtralForCausalLM",
        }
    }

    pub fn model_type(self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Mistral => "mistral",
            Architecture::Qwen2 => "qwen2",
            Architecture::Qwen3 => "qwen3",
            Architecture::Qwen3Moe => "qwen3_moe",
            Architecture::Mixtral => "mixtral",
        }
    }

    /// transformers' default when config.json omits max_position_embeddings.
    pub fn default_max_position(self) -> usize {
        match self {
            Architecture::Llama => 2048,
            Architecture::Mistral | Architecture::Mixtral => 4096 * 32,
            Architecture::Qwen2 | Architecture::Qwen3 | Architecture::Qwen3Moe => 32768,
        }
    }

    /// The architecture whose layers match `cfg` exactly, or why none does. Dense: Llama
    /// (biases on all four attention projections or none), Qwen2 (biases on q/k/v only), Qwen3
    /// (q/k norm; biases on all four or none). MoE: `ModelConfig::hf_moe_architecture`'s rule.
    /// A Mistral directory's model comes out as Llama: the same layers under the same names.
    pub fn of(cfg: &ModelConfig) -> Result<Architecture, String> {
        if cfg.moe.is_some() {
            return match cfg.hf_moe_architecture()? {
                Some(a) => Ok(a.into()),
                None => Err("internal: an MoE config without an MoE architecture".into()),
            };
        }
        match (cfg.qk_norm, cfg.qkv_bias, cfg.o_bias) {
            (false, b, o) if b == o => Ok(Architecture::Llama),
            (false, true, false) => Ok(Architecture::Qwen2),
            (true, b, o) if b == o => Ok(Architecture::Qwen3),
            (q, b, o) => Err(format!("no Hugging Face architecture has qk_norm = {q}, qkv_bias = {b}, o_bias = {o}")),
        }
    }

    /// Has routed experts.
    pub fn is_moe(self) -> bool {
        matches!(self, Architecture::Qwen3Moe | Architecture::Mixtral)
    }
}

impl From<HfMoeArchitecture> for Architecture {
    fn from(a: HfMoeArchitecture) -> Architecture {
        match a {
            HfMoeArchitecture::Qwen3Moe => Architecture::Qwen3Moe,
            HfMoeArchitecture::Mixtral => Architecture::Mixtral,
        }
    }
}

/// config.json for a model built from `cfg` (checkpoints, weight updates, and exports of a
/// policy that did not come from a Hugging Face directory), with the architecture it is written
/// as: an MoE model as qwen3_moe or mixtral (`ModelConfig::hf_moe_architecture`), or an error
/// naming what no transformers class holds. Written in the transformers 4.x form, which 4.x and
/// 5.x both read.
pub fn config_json(cfg: &ModelConfig) -> Result<(Value, Architecture), RunError> {
    let arch = Architecture::of(cfg).map_err(|why| {
        RunError::new(E_CHECKPOINT, format!("cannot write this model as a Hugging Face directory: {why}"))
            .with_help("docs/moe.md, \"Out to transformers\", says which models transformers can load")
    })?;
    let rope_scaling = match &cfg.rope_scaling {
        None => Value::Null,
        Some(RopeScaling::Linear { factor }) => json!({"rope_type": "linear", "factor": factor}),
        Some(RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings }) => {
            json!({
                "rope_type": "llama3",
                "factor": factor,
                "low_freq_factor": low_freq_factor,
                "high_freq_factor": high_freq_factor,
                "original_max_position_embeddings": original_max_position_embeddings,
            })
        }
    };
    let mut c = json!({
        "architectures": [arch.class_name()],
        "model_type": arch.model_type(),
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.d_ff,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim(),
        "max_position_embeddings": cfg.max_len,
        "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": rope_scaling,
        "hidden_act": "silu",
        "tie_word_embeddings": cfg.tie_embeddings,
        "torch_dtype": "float32",
        "pad_token_id": 0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "initializer_range": cfg.init_std,
    });
    let extra = match arch {
        Architecture::Llama | Architecture::Mistral => json!({"attention_bias": cfg.qkv_bias, "mlp_bias": false}),
        Architecture::Qwen2 => json!({"use_sliding_window": false}),
        Architecture::Qwen3 | Architecture::Qwen3Moe => {
            json!({"attention_bias": cfg.qkv_bias, "use_sliding_window": false})
        }
        Architecture::Mixtral => json!({}),
    };
    if let (Some(c), Value::Object(e)) = (c.as_object_mut(), extra) {
        c.extend(e);
    }
    if let (Some(c), Some(m)) = (c.as_object_mut(), &cfg.moe) {
        c.extend(moe_config_keys(arch, cfg, m));
    }
    Ok((c, arch))
}

/// A source directory's own config.json as a directory of fp32 weights says it: every field kept
/// (those transformers knows and we do not survive), only the dtype set to float32, under the key
/// the source used (`dtype` in transformers 5's form, `torch_dtype` otherwise).
pub fn float32_config(source: &Value) -> Value {
    let mut config = source.clone();
    if let Value::Object(m) = &mut config {
        let key = if m.contains_key("dtype") && !m.contains_key("torch_dtype") { "dtype" } else { "torch_dtype" };
        m.insert(key.into(), Value::from("float32"));
    }
    config
}

/// The MoE keys of config.json for `m` as `arch` (which `ModelConfig::hf_moe_architecture`
/// chose, so `m` fits it).
fn moe_config_keys(arch: Architecture, cfg: &ModelConfig, m: &MoeConfig) -> Map<String, Value> {
    let v = match arch {
        Architecture::Mixtral => json!({
            "num_local_experts": m.experts,
            "num_experts_per_tok": m.top_k,
            // Mixtral's MLPs are all experts: intermediate_size is their width.
            "intermediate_size": m.expert_d_ff,
            "router_jitter_noise": 0.0,
            "router_aux_loss_coef": m.aux_loss_coef,
            "sliding_window": null,
        }),
        _ => {
            // Every dense layer listed: transformers' rule (not in mlp_only_layers and (i + 1) %
            // decoder_sparse_step == 0) then picks exactly our MoE layers, leading dense ones too.
            let dense: Vec<usize> = (0..cfg.n_layers).filter(|&i| !m.is_moe_layer(i)).collect();
            json!({
                "num_experts": m.experts,
                "num_experts_per_tok": m.top_k,
                "moe_intermediate_size": m.expert_d_ff,
                "norm_topk_prob": m.norm_topk,
                "decoder_sparse_step": 1,
                "mlp_only_layers": dense,
                "router_aux_loss_coef": m.aux_loss_coef,
            })
        }
    };
    match v {
        Value::Object(o) => o,
        _ => Map::new(),
    }
}

/// `arch`'s name of one of the model's parameters. Only Mixtral's differ: `mlp.gate` is
/// `block_sparse_moe.gate`, expert j's gate/up/down_proj are its w1/w3/w2. Names that are no
/// parameter of a decoder layer's MLP (embeddings, attention, PEFT adapters) pass unchanged.
pub fn hf_name(arch: Architecture, name: &str) -> String {
    if arch != Architecture::Mixtral {
        return name.to_string();
    }
    let Some(rest) = name.strip_prefix("model.layers.") else { return name.to_string() };
    let Some((layer, tail)) = rest.split_once(".mlp.") else { return name.to_string() };
    let tail = match tail.strip_prefix("experts.").and_then(|t| t.split_once('.')) {
        Some((j, proj)) => {
            let w = match proj {
                "gate_proj.weight" => "w1.weight",
                "down_proj.weight" => "w2.weight",
                "up_proj.weight" => "w3.weight",
                other => other,
            };
            format!("experts.{j}.{w}")
        }
        None => tail.to_string(),
    };
    format!("model.layers.{layer}.block_sparse_moe.{tail}")
}

/// The model's own name of a tensor named `name` in a Mixtral directory or checkpoint (names
/// without `block_sparse_moe` are returned as they are): `hf_name`'s inverse.
pub fn own_name(name: &str) -> String {
    let Some((head, tail)) = name.split_once(".block_sparse_moe.") else { return name.to_string() };
    let tail = match tail.strip_prefix("experts.").and_then(|t| t.split_once('.')) {
        Some((j, w)) => {
            let p = match w {
                "w1.weight" => "gate_proj.weight",
                "w2.weight" => "down_proj.weight",
                "w3.weight" => "up_proj.weight",
                other => other,
            };
            format!("experts.{j}.{p}")
        }
        None => tail.to_string(),
    };
    format!("{head}.mlp.{tail}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::DecoderSizes;

    #[test]
    fn mixtral_names_map_both_ways() {
        let cases = [
            ("model.layers.3.mlp.gate.weight", "model.layers.3.block_sparse_moe.gate.weight"),
            ("model.layers.0.mlp.experts.7.gate_proj.weight", "model.layers.0.block_sparse_moe.experts.7.w1.weight"),
            ("model.layers.0.mlp.experts.7.up_proj.weight", "model.layers.0.block_sparse_moe.experts.7.w3.weight"),
            ("model.layers.12.mlp.experts.0.down_proj.weight", "model.layers.12.block_sparse_moe.experts.0.w2.weight"),
            ("model.layers.1.self_attn.q_proj.weight", "model.layers.1.self_attn.q_proj.weight"),
            ("model.embed_tokens.weight", "model.embed_tokens.weight"),
        ];
        for (own, hf) in cases {
            assert_eq!(hf_name(Architecture::Mixtral, own), hf);
            assert_eq!(own_name(hf), own);
            assert_eq!(hf_name(Architecture::Qwen3Moe, own), own, "Qwen3-MoE's names are ours");
        }
    }

    fn dense() -> ModelConfig {
        let sizes = DecoderSizes {
            vocab_size: 64,
            d_model: 32,
            n_layers: 3,
            n_heads: 4,
            n_kv_heads: 2,
            d_ff: 48,
            max_len: 128,
        };
        ModelConfig { rope_theta: 1e6, norm_eps: 1e-6, ..ModelConfig::decoder(sizes) }
    }

    fn moe() -> MoeConfig {
        MoeConfig { aux_loss_coef: 0.01, ..MoeConfig::routed(4, 2, 24) }
    }

    #[test]
    fn each_layout_is_written_as_the_class_that_holds_it() {
        let qwen2 = ModelConfig { qkv_bias: true, ..dense() };
        let qwen3 = ModelConfig { qk_norm: true, head_dim: Some(16), tie_embeddings: true, ..dense() };
        let qwen3_moe = ModelConfig { qk_norm: true, moe: Some(MoeConfig { dense_layers: 1, ..moe() }), ..dense() };
        let mixtral = ModelConfig { moe: Some(moe()), ..dense() };
        for (cfg, class) in [
            (dense(), "LlamaForCausalLM"),
            (qwen2, "Qwen2ForCausalLM"),
            (qwen3.clone(), "Qwen3ForCausalLM"),
            (qwen3_moe, "Qwen3MoeForCausalLM"),
            (mixtral, "MixtralForCausalLM"),
        ] {
            let (c, arch) = config_json(&cfg).unwrap();
            assert_eq!((c["architectures"][0].as_str(), arch.class_name()), (Some(class), class));
            assert_eq!(c["model_type"], arch.model_type());
        }
        let (c, _) = config_json(&qwen3).unwrap();
        assert_eq!((c["head_dim"].as_u64(), c["tie_word_embeddings"].as_bool()), (Some(16), Some(true)));
        let (c, _) = config_json(&ModelConfig { qk_norm: true, moe: Some(moe()), ..dense() }).unwrap();
        assert_eq!(c["mlp_only_layers"], json!([]));
        let (c, _) =
            config_json(&ModelConfig { qk_norm: true, moe: Some(MoeConfig { dense_layers: 1, ..moe() }), ..dense() })
                .unwrap();
        assert_eq!((c["mlp_only_layers"].clone(), c["moe_intermediate_size"].clone()), (json!([0]), json!(24)));
    }

    #[test]
    fn what_no_class_holds_is_refused_with_the_reason() {
        let shared = ModelConfig { moe: Some(MoeConfig { shared_expert_d_ff: 8, ..moe() }), ..dense() };
        let e = config_json(&shared).unwrap_err().to_string();
        assert!(e.contains("shared expert") && e.contains("cannot write this model"), "{e}");
        let e = config_json(&ModelConfig { qkv_bias: false, o_bias: true, ..dense() }).unwrap_err().to_string();
        assert!(e.contains("o_bias = true"), "{e}");
    }

    #[test]
    fn a_source_config_keeps_its_fields_and_dtype_key() {
        let v4 = float32_config(&json!({"model_type": "llama", "torch_dtype": "bfloat16", "rope_scaling": {"x": 1}}));
        assert_eq!(v4, json!({"model_type": "llama", "torch_dtype": "float32", "rope_scaling": {"x": 1}}));
        let v5 = float32_config(&json!({"dtype": "bfloat16"}));
        assert_eq!(v5, json!({"dtype": "float32"}));
    }
}
