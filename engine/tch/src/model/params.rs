//! The model's parameters by name: the Hugging Face names a config implies, in their fixed
//! order, and each one's shape.

use miles_runtime::ModelConfig;
use tch::{Kind, Tensor};

/// The shape `cfg` implies for parameter `name` (empty for a name it does not have).
pub(crate) fn param_shape(cfg: &ModelConfig, name: &str) -> Vec<i64> {
    let d = cfg.d_model as i64;
    let hd = cfg.head_dim() as i64;
    let q = cfg.n_heads as i64 * hd;
    let kv = cfg.n_kv_heads as i64 * hd;
    let v = cfg.vocab_size as i64;
    let (stem, kind) = name.rsplit_once('.').unwrap_or((name, ""));
    let leaf = stem.rsplit('.').next().unwrap_or("");
    let ff = crate::moe::mlp_width(cfg.moe.as_ref(), stem).unwrap_or(cfg.d_ff) as i64;
    match (leaf, kind) {
        ("gate", "weight") if stem.ends_with(".mlp.gate") => match &cfg.moe {
            Some(m) => vec![m.experts as i64, d],
            None => vec![],
        },
        ("embed_tokens" | "lm_head", "weight") => vec![v, d],
        ("input_layernorm" | "post_attention_layernorm" | "norm", "weight") => vec![d],
        ("q_norm" | "k_norm", "weight") => vec![hd],
        ("q_proj", "weight") => vec![q, d],
        ("q_proj", "bias") => vec![q],
        ("k_proj" | "v_proj", "weight") => vec![kv, d],
        ("k_proj" | "v_proj", "bias") => vec![kv],
        ("o_proj", "weight") => vec![d, q],
        ("o_proj", "bias") => vec![d],
        ("gate_proj" | "up_proj", "weight") => vec![ff, d],
        ("down_proj", "weight") => vec![d, ff],
        _ => vec![],
    }
}

/// Parameter names in the order they are created, saved and synced. The optional ones come
/// right after the weight they belong to, and only when `cfg` enables them, so a plain Llama
/// config keeps its names, order and seeded init.
pub fn param_names(cfg: &ModelConfig) -> Vec<String> {
    let mut v = vec!["model.embed_tokens.weight".to_string()];
    for i in 0..cfg.n_layers {
        let mut push = |s: &str| v.push(format!("model.layers.{i}.{s}"));
        push("input_layernorm.weight");
        for p in ["q_proj", "k_proj", "v_proj"] {
            push(&format!("self_attn.{p}.weight"));
            if cfg.qkv_bias {
                push(&format!("self_attn.{p}.bias"));
            }
        }
        push("self_attn.o_proj.weight");
        if cfg.o_bias {
            push("self_attn.o_proj.bias");
        }
        if cfg.qk_norm {
            push("self_attn.q_norm.weight");
            push("self_attn.k_norm.weight");
        }
        push("post_attention_layernorm.weight");
        match cfg.moe.as_ref().filter(|m| m.is_moe_layer(i)) {
            Some(m) => v.extend(crate::moe::mlp_param_names(m, i)),
            None => {
                for s in ["mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"] {
                    v.push(format!("model.layers.{i}.{s}.weight"));
                }
            }
        }
    }
    v.push("model.norm.weight".into());
    if !cfg.tie_embeddings {
        v.push("lm_head.weight".into());
    }
    v
}

/// A shallow handle on the parameter `name` of `params`, or an empty tensor that fails at the
/// first forward (callers check names and shapes before building a model from them).
pub(crate) fn param_by_name(params: &[(String, Tensor)], name: &str) -> Tensor {
    params
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, t)| t.shallow_clone())
        .unwrap_or_else(|| Tensor::zeros([0], (Kind::Float, crate::device::current())))
}
