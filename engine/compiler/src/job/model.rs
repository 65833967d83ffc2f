//! What a stage's model is, read once: a seeded `transformer` (dense or a mixture of experts), a
//! Hugging Face directory (`hf`, the sizes and experts `miles check` read from its config.json,
//! whether the embedded backend loads it and which keys were read), a diffusion
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

/// A mixture of experts (`experts > 0`): a `transformer`'s, or an `hf` config.json's.
#[derive(Clone, Debug, PartialEq)]
pub struct Moe {
    pub experts: u64,
    pub top_k: u64,
    pub expert_d_ff: u64,
    pub shared_expert_d_ff: u64,
    pub dense_layers: u64,
    /// Further dense layers by index (Qwen3-MoE's `mlp_only_layers`; a `transformer` has none).
    pub mlp_only_layers: Vec<u64>,
    /// Every `sparse_step`-th layer has experts (Qwen3-MoE's `decoder_sparse_step`; 1: all).
    pub sparse_step: u64,
    pub gating: Gating,
    pub norm_topk: bool,
    pub aux_loss_coef: f64,
}

/// How an `hf` model's attention caches keys and values, for the planner's KV cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HfAttention {
    Mha,
    Gqa,
    /// Multi-head latent attention: `kv_lora_rank` + `qk_rope_head_dim` cached per token.
    Mla,
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
    /// config.json's `rms_norm_eps` (the engine's 1e-6 where it has none).
    pub norm_eps: f64,
    /// The embedded backend loads this architecture (else `miles plan` sizes it, `miles run`
    /// refuses it).
    pub loadable: bool,
    /// The experts, with the set of layers that have them.
    pub moe: Option<Moe>,
    /// Parameters one token uses (equal to `params` for a dense model).
    pub active_params: u64,
    /// Layers with routed experts (0 for a dense model).
    pub moe_layers: u64,
    /// Multi-token-prediction layers' parameters, not in `params`.
    pub mtp_params: u64,
    pub attention: HfAttention,
    /// MLA: the cached latent's width and the decoupled rotary key's.
    pub kv_lora_rank: Option<u64>,
    pub qk_rope_head_dim: Option<u64>,
    /// DSA: tokens each query attends to, and the indexer key cached per token and layer.
    pub sparse_topk: Option<u64>,
    pub index_head_dim: Option<u64>,
    /// config.json's keys `hf_config` read, in order, and the present ones it did not.
    pub read: Vec<String>,
    pub ignored: Vec<String>,
    /// The directory holds tokenizer.json, and the weights (model.safetensors or its index):
    /// what `miles run` needs beyond config.json.
    pub has_tokenizer: bool,
    pub has_weights: bool,
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
        /// RMSNorms on each head's query and key (Qwen3's layer; a seeded MoE's default).
        qk_norm: bool,
    },
    /// Boxed: its config.json's figures and key lists make it the largest model by far.
    Hf(Box<HfModel>),
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
                        mlp_only_layers: Vec::new(),
                        sparse_step: 1,
                        gating: match r.member("gating").map(|g| g.value) {
                            Some("sigmoid") => Gating::Sigmoid,
                            _ => Gating::Softmax,
                        },
                        norm_topk: r.bool("norm_topk").is_none_or(|b| b.value),
                        aux_loss_coef: r.f64("aux_loss_coef").map_or(0.0, |v| v.value),
                    });
                    let qk_norm = r.bool("qk_norm").is_some_and(|b| b.value);
                    ModelJob::Transformer { sizes, moe, qk_norm }
                }
                "hf" => {
                    let config = match r.get("config") {
                        Some(Value::Map(m)) => Some(m),
                        _ => None,
                    };
                    let flag = |name: &str| config.and_then(|m| m.get(name)).and_then(Value::as_bool);
                    let int = |name: &str| {
                        config.and_then(|m| m.get(name)).and_then(Value::as_i64).and_then(|v| u64::try_from(v).ok())
                    };
                    let strs = |name: &str| match config.and_then(|m| m.get(name)) {
                        Some(Value::List(items)) => {
                            items.iter().filter_map(|v| v.as_str().map(str::to_string)).collect()
                        }
                        _ => Vec::new(),
                    };
                    let sizes = decoder(r)?;
                    let params = r.u64("params")?.value;
                    let experts = r.u64("experts").map_or(0, |v| v.value);
                    let moe = (experts > 0).then(|| Moe {
                        experts,
                        top_k: int("top_k").unwrap_or(0),
                        expert_d_ff: int("expert_d_ff").unwrap_or(sizes.d_ff),
                        shared_expert_d_ff: int("shared_expert_d_ff").unwrap_or(0),
                        dense_layers: int("dense_layers").unwrap_or(0),
                        mlp_only_layers: match config.and_then(|m| m.get("mlp_only_layers")) {
                            Some(Value::List(items)) => {
                                items.iter().filter_map(Value::as_i64).filter_map(|v| u64::try_from(v).ok()).collect()
                            }
                            _ => Vec::new(),
                        },
                        sparse_step: int("sparse_step").unwrap_or(1),
                        gating: match config.and_then(|m| m.get("gating")).and_then(|v| v.as_str()) {
                            Some("sigmoid") => Gating::Sigmoid,
                            _ => Gating::Softmax,
                        },
                        norm_topk: flag("norm_topk").unwrap_or(true),
                        aux_loss_coef: config
                            .and_then(|m| m.get("aux_loss_coef"))
                            .and_then(Value::as_f64)
                            .unwrap_or(0.0),
                    });
                    let attention = match config.and_then(|m| m.get("attention")).and_then(|v| v.as_str()) {
                        Some("mla") => HfAttention::Mla,
                        _ if sizes.kv_heads == sizes.heads => HfAttention::Mha,
                        _ => HfAttention::Gqa,
                    };
                    ModelJob::Hf(Box::new(HfModel {
                        // A config.json read before these keys existed is a loadable dense model.
                        loadable: flag("loadable").unwrap_or(true),
                        norm_eps: config.and_then(|m| m.get("norm_eps")).and_then(Value::as_f64).unwrap_or(1e-6),
                        active_params: int("active_params").unwrap_or(params),
                        moe_layers: int("moe_layers").unwrap_or(0),
                        mtp_params: int("mtp_params").unwrap_or(0),
                        moe,
                        attention,
                        kv_lora_rank: int("kv_lora_rank"),
                        qk_rope_head_dim: int("qk_rope_head_dim"),
                        sparse_topk: int("sparse_topk"),
                        index_head_dim: int("index_head_dim"),
                        read: strs("read"),
                        ignored: strs("ignored"),
                        has_tokenizer: r.bool("has_tokenizer").is_none_or(|b| b.value),
                        has_weights: r.bool("has_weights").is_none_or(|b| b.value),
                        path: r.str("path").unwrap_or_default().to_string(),
                        sizes,
                        head_dim: r.u64("head_dim")?.value,
                        params,
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
                    }))
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
        self.moe().map_or(0, |m| m.experts)
    }

    /// The mixture of experts of a seeded `transformer` or an `hf` directory.
    pub fn moe(&self) -> Option<&Moe> {
        match self {
            ModelJob::Transformer { moe, .. } => moe.as_ref(),
            ModelJob::Hf(h) => h.moe.as_ref(),
            _ => None,
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
