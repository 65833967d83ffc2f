//! The policy's architecture: a Llama-style decoder, its rotary scaling and its mixture-of-experts
//! layers.

use super::{is_false, yes};
use serde::{Deserialize, Serialize};

/// Decoder-only transformer (Llama-style: RMSNorm, rotary positions, grouped KV heads, SwiGLU).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// Output/embedding rows. Must be >= the task tokenizer's vocabulary (checked before training).
    pub vocab_size: usize,
    pub d_model: usize,
    pub n_layers: usize,
    /// Query heads; d_model must be a multiple of n_heads and head_dim even (rotary pairs).
    pub n_heads: usize,
    /// Key/value heads; n_heads must be a multiple of n_kv_heads.
    pub n_kv_heads: usize,
    /// Hidden width of the SwiGLU MLP.
    pub d_ff: usize,
    /// Longest sequence (prompt + response) the model accepts.
    pub max_len: usize,
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
    #[serde(default = "default_norm_eps")]
    pub norm_eps: f64,
    /// Std of the normal init of every matrix (residual output projections are further scaled by
    /// 1/sqrt(2 * n_layers) to keep the residual stream's variance flat with depth).
    #[serde(default = "default_init_std")]
    pub init_std: f64,
    /// Width of one attention head; None = d_model / n_heads (Qwen3 sets it explicitly).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<usize>,
    /// Biases on the query/key/value projections (Qwen2; Llama/Qwen3 `attention_bias`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub qkv_bias: bool,
    /// Bias on the attention output projection (Llama/Qwen3 `attention_bias`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub o_bias: bool,
    /// RMSNorm over each query and key head before rotary (Qwen3).
    #[serde(default, skip_serializing_if = "is_false")]
    pub qk_norm: bool,
    /// The output projection is the embedding matrix (no separate lm_head).
    #[serde(default, skip_serializing_if = "is_false")]
    pub tie_embeddings: bool,
    /// Rescaled rotary frequencies for long contexts; None = plain rotary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_scaling: Option<RopeScaling>,
    /// Mixture-of-experts MLPs (after `dense_layers` dense ones); None: every MLP dense.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe: Option<MoeConfig>,
}

/// How a router turns its logits into the weights of the chosen experts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Gating {
    /// softmax over all experts, top-k of it (Mixtral, Qwen3-MoE).
    #[default]
    Softmax,
    /// an independent sigmoid per expert, top-k of it (DeepSeek-V3).
    Sigmoid,
}

/// std/prelude `transformer`'s MoE fields: every layer from `dense_layers` on has `experts`
/// SwiGLU experts of width `expert_d_ff` and a router choosing `top_k` per token, plus an
/// optional always-on shared expert.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MoeConfig {
    pub experts: usize,
    pub top_k: usize,
    pub expert_d_ff: usize,
    /// Width of the shared expert; 0: none.
    #[serde(default)]
    pub shared_expert_d_ff: usize,
    /// Leading layers with a dense MLP of width `d_ff`.
    #[serde(default)]
    pub dense_layers: usize,
    /// Further layers with a dense MLP, by index (Qwen3-MoE's `mlp_only_layers`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mlp_only_layers: Vec<usize>,
    /// Every `sparse_step`-th layer has experts, the others a dense MLP (Qwen3-MoE's
    /// `decoder_sparse_step`; 1: every layer).
    #[serde(default = "one_layer", skip_serializing_if = "is_one_layer")]
    pub sparse_step: usize,
    #[serde(default)]
    pub gating: Gating,
    /// Renormalise the top-k weights to sum to 1 (Qwen3-MoE's `norm_topk_prob`).
    #[serde(default = "yes")]
    pub norm_topk: bool,
    /// Coefficient of the load-balancing loss (Switch/Qwen3-MoE's `router_aux_loss_coef`).
    #[serde(default)]
    pub aux_loss_coef: f64,
}

impl MoeConfig {
    /// Whether layer `i` has routed experts (the others a dense MLP of `d_ff`): transformers'
    /// Qwen3-MoE rule, with leading `dense_layers` as DeepSeek and GLM have them.
    pub fn is_moe_layer(&self, i: usize) -> bool {
        i >= self.dense_layers && !self.mlp_only_layers.contains(&i) && (i + 1) % self.sparse_step.max(1) == 0
    }

    /// Layers with routed experts.
    pub fn moe_layers(&self, n_layers: usize) -> usize {
        (0..n_layers).filter(|&i| self.is_moe_layer(i)).count()
    }
}

/// The sizes of a Llama-style decoder, as a recipe's `transformer` gives them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecoderSizes {
    pub vocab_size: usize,
    pub d_model: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub d_ff: usize,
    pub max_len: usize,
}

impl ModelConfig {
    /// A plain decoder of these sizes: rotary theta 10000, no biases, no q/k norm, untied,
    /// every later field at its default.
    pub fn decoder(s: DecoderSizes) -> ModelConfig {
        ModelConfig {
            vocab_size: s.vocab_size,
            d_model: s.d_model,
            n_layers: s.n_layers,
            n_heads: s.n_heads,
            n_kv_heads: s.n_kv_heads,
            d_ff: s.d_ff,
            max_len: s.max_len,
            rope_theta: default_rope_theta(),
            norm_eps: default_norm_eps(),
            init_std: default_init_std(),
            head_dim: None,
            qkv_bias: false,
            o_bias: false,
            qk_norm: false,
            tie_embeddings: false,
            rope_scaling: None,
            moe: None,
        }
    }

    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.head_dim.unwrap_or(self.d_model / self.n_heads.max(1))
    }
}

/// Rotary frequency scaling, as in Hugging Face `rope_scaling` (`rope_parameters` since v5).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum RopeScaling {
    /// Every frequency divided by `factor`.
    Linear { factor: f64 },
    /// Llama 3.1: low frequencies divided by `factor`, high ones kept, a smooth blend between.
    Llama3 { factor: f64, low_freq_factor: f64, high_freq_factor: f64, original_max_position_embeddings: usize },
}

fn default_rope_theta() -> f64 {
    10000.0
}
fn default_norm_eps() -> f64 {
    1e-5
}
fn default_init_std() -> f64 {
    0.02
}

fn one_layer() -> usize {
    1
}

fn is_one_layer(n: &usize) -> bool {
    *n == 1
}
