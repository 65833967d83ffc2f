//! Hugging Face model directories, in and out: `config.json`, weights in safetensors (one
//! `model.safetensors` or shards listed by `model.safetensors.index.json`), and the tokenizer and
//! generation files, which are carried through untouched on export.
//!
//! Supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, and the
//! mixtures of experts Qwen3MoeForCausalLM and MixtralForCausalLM (see docs/models.md, docs/moe.md). Weights in bf16, fp16 or fp32 become fp32, the trainer's dtype. Every bad
//! input (unknown architecture, unsupported option, missing or corrupt shard, missing or
//! misshapen tensor) is a `RunError` naming the file and the field or tensor; shapes are checked
//! before a tensor reaches libtorch, whose shape errors panic.

mod config;
mod export;
mod load;
pub(crate) mod moe;

pub(crate) use export::write_weights;

pub use config::{config_json, parse_config, Architecture, HfConfig};
pub use moe::{MIXTRAL_KEYS, QWEN3_MOE_KEYS};

use crate::model::Policy;
use miles_runtime::{ModelConfig, RunError};
use std::path::{Path, PathBuf};

pub use miles_runtime::tokenize::hf::CARRIED_FILES;

/// What a loaded directory says beyond the `ModelConfig`: what the tokenizer and sampler need,
/// and where to copy the tokenizer files from on export.
#[derive(Debug, Clone)]
pub struct HfMeta {
    pub dir: PathBuf,
    pub architecture: Architecture,
    /// config.json as read (export writes it back with only the dtype changed).
    pub config: serde_json::Value,
    /// The model's own limit; `Policy::cfg.max_len` may be smaller if the caller asked.
    pub max_position_embeddings: usize,
    pub bos_token_id: Option<i64>,
    /// End-of-sequence ids of config.json and generation_config.json together (a chat model
    /// usually ends a turn with a token of its own, listed only in generation_config.json).
    pub eos_token_ids: Vec<i64>,
    pub pad_token_id: Option<i64>,
    /// The dtype the weights were stored in (`torch_dtype` or `dtype`), e.g. "bfloat16".
    pub dtype: Option<String>,
    /// The `CARRIED_FILES` present in `dir`.
    pub carried_files: Vec<String>,
}

/// The first size or layout field where a loaded config and the run spec's model disagree (the
/// fields `miles check` reads from config.json); rotary and norm constants come from the
/// directory alone. Of an MoE model: the experts, their width, top-k, which layers have them,
/// the shared expert, the gating and `norm_topk` (the load-balancing coefficient is the
/// directory's `router_aux_loss_coef`, not compared).
pub fn first_difference(loaded: &ModelConfig, spec: &ModelConfig) -> Option<&'static str> {
    let moe = |f: fn(&miles_runtime::MoeConfig) -> Vec<usize>| match (&loaded.moe, &spec.moe) {
        (None, None) => true,
        (Some(a), Some(b)) => f(a) == f(b),
        _ => false,
    };
    let moe_layers =
        |c: &ModelConfig| c.moe.as_ref().map(|m| (0..c.n_layers).filter(|&i| m.is_moe_layer(i)).collect::<Vec<_>>());
    let fields: [(&'static str, bool); 17] = [
        ("vocab_size", loaded.vocab_size == spec.vocab_size),
        ("d_model", loaded.d_model == spec.d_model),
        ("n_layers", loaded.n_layers == spec.n_layers),
        ("n_heads", loaded.n_heads == spec.n_heads),
        ("n_kv_heads", loaded.n_kv_heads == spec.n_kv_heads),
        ("head_dim", loaded.head_dim() == spec.head_dim()),
        ("d_ff", loaded.d_ff == spec.d_ff),
        ("qkv_bias", loaded.qkv_bias == spec.qkv_bias),
        ("o_bias", loaded.o_bias == spec.o_bias),
        ("qk_norm", loaded.qk_norm == spec.qk_norm),
        ("tie_embeddings", loaded.tie_embeddings == spec.tie_embeddings),
        ("experts", moe(|m| vec![m.experts])),
        ("top_k", moe(|m| vec![m.top_k])),
        ("expert_d_ff", moe(|m| vec![m.expert_d_ff, m.shared_expert_d_ff])),
        ("moe layers", moe_layers(loaded) == moe_layers(spec)),
        ("gating", moe(|m| vec![(m.gating == miles_runtime::Gating::Sigmoid) as usize])),
        ("norm_topk", moe(|m| vec![m.norm_topk as usize])),
    ];
    fields.into_iter().find(|(_, same)| !same).map(|(f, _)| f)
}

impl Policy {
    /// Loads a Hugging Face model directory. `max_len` bounds the sequences the policy accepts
    /// (rotary tables and KV caches are sized by it); None = the model's max_position_embeddings.
    pub fn load_hf(dir: &Path, max_len: Option<usize>) -> Result<(Policy, HfMeta), RunError> {
        load::load(dir, max_len)
    }

    /// Writes this policy as a Hugging Face directory at `dir`, atomically (a temp directory
    /// renamed into place, replacing an older one). With `source`, its config.json (dtype set to
    /// float32) and tokenizer/generation files are carried through.
    pub fn export_hf(&self, dir: &Path, source: Option<&HfMeta>) -> Result<(), RunError> {
        export::export(self, dir, source)
    }

    /// Writes this policy as a Hugging Face directory into an existing (temporary) `dir`, with
    /// `source`'s config.json and tokenizer files carried through as `export_hf` does.
    pub fn write_hf(&self, dir: &Path, source: Option<&HfMeta>) -> Result<(), RunError> {
        export::fill(self, dir, source)
    }
}
