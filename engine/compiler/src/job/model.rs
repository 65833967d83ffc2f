//! What a stage's model is, read once: a seeded `transformer` (dense or a mixture of experts), a
//! Hugging Face directory (`hf`, the sizes `miles check` read from its config.json), a diffusion
//! `denoiser`, or a catalog entry (`schema llm` in std/models) the planner sizes from its record.

use super::read::Fields;
use crate::value::{Record, Value};

/// The sizes the `transformer` and `hf` schemas name alike.
#[derive(Clone, Debug, PartialEq)]
pub struct Decoder {
    pub vocab: u64,
    pub d_model: u64,
    pub layers: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub d_ff: u64,
    pub max_len: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gating {
    Softmax,
    Sigmoid,
}

/// A `transformer`'s mixture of experts (`experts > 0`).
#[derive(Clone, Debug, PartialEq)]
pub struct Moe {
    pub experts: u64,
    pub top_k: u64,
    pub expert_d_ff: u64,
    pub shared_expert_d_ff: u64,
    pub dense_layers: u64,
    pub gating: Gating,
    pub norm_topk: bool,
    pub aux_loss_coef: f64,
}

/// An `hf { path }` model: its config.json as `hf_config` read it.
#[derive(Clone, Debug, PartialEq)]
pub struct HfModel {
    pub path: String,
    pub sizes: Decoder,
    pub head_dim: u64,
    pub params: u64,
    /// config.json's architecture (`LlamaForCausalLM`, ...), `hf` when it names none.
    pub architecture: String,
    pub tie_embeddings: Option<bool>,
    pub rope_theta: Option<f64>,
    pub qkv_bias: bool,
    pub o_bias: bool,
    pub qk_norm: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub struct DenoiserModel {
    pub side: u64,
    pub conditions: u64,
    pub hidden: u64,
    pub layers: u64,
    pub params: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub enum ModelJob {
    Transformer {
        sizes: Decoder,
        moe: Option<Moe>,
    },
    Hf(HfModel),
    Denoiser(DenoiserModel),
    /// A catalog model (`schema llm`): figures only the planner reads, from the record itself.
    Catalog(Record),
    /// A model of another schema, or one missing a size (an error the checker reported).
    Other {
        schema: String,
    },
}

impl ModelJob {
    pub fn of(r: &Record) -> ModelJob {
        let read = || -> Option<ModelJob> {
            Some(match r.schema_name.as_str() {
                "transformer" => {
                    let sizes = decoder(r)?;
                    let n = |name: &str| r.u64(name).map(|v| v.value);
                    let experts = n("experts").unwrap_or(0);
                    let moe = (experts > 0).then(|| Moe {
                        experts,
                        top_k: n("top_k").unwrap_or(0),
                        expert_d_ff: n("expert_d_ff").unwrap_or(sizes.d_ff),
                        shared_expert_d_ff: n("shared_expert_d_ff").unwrap_or(0),
                        dense_layers: n("dense_layers").unwrap_or(0),
                        gating: match r.member("gating").map(|g| g.value) {
                            Some("sigmoid") => Gating::Sigmoid,
                            _ => Gating::Softmax,
                        },
                        norm_topk: r.bool("norm_topk").is_none_or(|b| b.value),
                        aux_loss_coef: r.f64("aux_loss_coef").map_or(0.0, |v| v.value),
                    });
                    ModelJob::Transformer { sizes, moe }
                }
                "hf" => {
                    let config = match r.get("config") {
                        Some(Value::Map(m)) => Some(m),
                        _ => None,
                    };
                    let flag = |name: &str| config.and_then(|m| m.get(name)).and_then(Value::as_bool);
                    ModelJob::Hf(HfModel {
                        path: r.str("path").unwrap_or_default().to_string(),
                        sizes: decoder(r)?,
                        head_dim: r.u64("head_dim")?.value,
                        params: r.u64("params")?.value,
                        architecture: config
                            .and_then(|m| m.get("architecture"))
                            .and_then(|v| v.as_str())
                            .unwrap_or("hf")
                            .to_string(),
                        tie_embeddings: flag("tie_embeddings"),
                        rope_theta: config.and_then(|m| m.get("rope_theta")).and_then(Value::as_f64),
                        qkv_bias: flag("qkv_bias").unwrap_or(false),
                        o_bias: flag("o_bias").unwrap_or(false),
                        qk_norm: flag("qk_norm").unwrap_or(false),
                    })
                }
                "denoiser" => {
                    let n = |name: &str| r.u64(name).map(|v| v.value);
                    ModelJob::Denoiser(DenoiserModel {
                        side: n("side")?,
                        conditions: n("conditions")?,
                        hidden: n("hidden")?,
                        layers: n("layers")?,
                        params: n("params")?,
                    })
                }
                "llm" => ModelJob::Catalog(r.clone()),
                _ => return None,
            })
        };
        read().unwrap_or_else(|| ModelJob::Other { schema: r.schema_name.clone() })
    }

    /// Routed experts per MoE layer (0 for a dense model).
    pub fn experts(&self) -> u64 {
        match self {
            ModelJob::Transformer { moe: Some(m), .. } => m.experts,
            _ => 0,
        }
    }
}

fn decoder(r: &Record) -> Option<Decoder> {
    let n = |name: &str| r.u64(name).map(|v| v.value);
    Some(Decoder {
        vocab: n("vocab")?,
        d_model: n("d_model")?,
        layers: n("layers")?,
        heads: n("heads")?,
        kv_heads: n("kv_heads")?,
        d_ff: n("d_ff")?,
        max_len: n("max_len")?,
    })
}
