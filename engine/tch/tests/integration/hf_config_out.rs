//! config.json written from a model config (`miles_runtime::hf_dir::config_json`, which the
//! exporter and the workers' weight updates through disk both write) read back by the loader's
//! `parse_config`: the same model config, for the layouts the old weight-update writer got wrong
//! (it wrote every model as a plain LlamaForCausalLM).

use miles_runtime::{DecoderSizes, ModelConfig, MoeConfig, RopeScaling};
use miles_tch::hf::{config_json, parse_config, Architecture};
use std::path::Path;

fn base() -> ModelConfig {
    let sizes =
        DecoderSizes { vocab_size: 96, d_model: 32, n_layers: 4, n_heads: 4, n_kv_heads: 2, d_ff: 40, max_len: 256 };
    ModelConfig { rope_theta: 1e6, norm_eps: 1e-6, ..ModelConfig::decoder(sizes) }
}

fn experts() -> MoeConfig {
    MoeConfig { aux_loss_coef: 0.01, ..MoeConfig::routed(4, 2, 40) }
}

#[test]
fn hf_config_json_of_a_model_config_reads_back_the_same() {
    let qwen3 = ModelConfig {
        qk_norm: true,
        head_dim: Some(12),
        tie_embeddings: true,
        rope_scaling: Some(RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 64,
        }),
        ..base()
    };
    // Dense layers 0 and 2 (leading and listed), norm_topk off: what `mlp_only_layers` and
    // `norm_topk_prob` must carry.
    let qwen3_moe = ModelConfig {
        qk_norm: true,
        qkv_bias: true,
        o_bias: true,
        moe: Some(MoeConfig { dense_layers: 1, mlp_only_layers: vec![2], norm_topk: false, ..experts() }),
        ..base()
    };
    let mixtral =
        ModelConfig { moe: Some(experts()), rope_scaling: Some(RopeScaling::Linear { factor: 2.0 }), ..base() };
    let qwen2 = ModelConfig { qkv_bias: true, ..base() };
    for (cfg, arch) in [
        (qwen3, Architecture::Qwen3),
        (qwen3_moe, Architecture::Qwen3Moe),
        (mixtral, Architecture::Mixtral),
        (qwen2, Architecture::Qwen2),
        (base(), Architecture::Llama),
    ] {
        let (json, written_as) = config_json(&cfg).unwrap();
        assert_eq!(written_as, arch);
        let back = parse_config(Path::new("config.json"), &json.to_string()).unwrap();
        assert_eq!(back.architecture, arch);
        // The MoE layer sets compare by the layers they pick (transformers' form lists every
        // dense layer in `mlp_only_layers`; ours may say leading ones as `dense_layers`).
        let layers = |c: &ModelConfig| {
            c.moe.as_ref().map(|m| (0..c.n_layers).filter(|&i| m.is_moe_layer(i)).collect::<Vec<_>>())
        };
        assert_eq!(layers(&back.model), layers(&cfg), "{arch:?}");
        let same_layers = |c: &ModelConfig| ModelConfig {
            moe: c.moe.clone().map(|m| MoeConfig { dense_layers: 0, mlp_only_layers: vec![], sparse_step: 1, ..m }),
            ..c.clone()
        };
        assert_eq!(same_layers(&back.model), same_layers(&cfg), "{arch:?}");
    }
}
