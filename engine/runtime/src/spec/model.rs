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
    /// `experts` SwiGLU experts of width `expert_d_ff` in every layer, `top_k` per token by a
    /// renormalised softmax (Qwen3-MoE's and Mixtral's routing), no shared expert, no
    /// load-balancing loss: what a caller changes of it, it sets.
    pub fn routed(experts: usize, top_k: usize, expert_d_ff: usize) -> MoeConfig {
        MoeConfig {
            experts,
            top_k,
            expert_d_ff,
            shared_expert_d_ff: 0,
            dense_layers: 0,
            mlp_only_layers: vec![],
            sparse_step: 1,
            gating: Gating::Softmax,
            norm_topk: true,
            aux_loss_coef: 0.0,
        }
    }

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

/// The transformers mixture-of-experts architectures a `ModelConfig` can be written as
/// (engine/tch's `hf` export; docs/moe.md, "Out to transformers").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HfMoeArchitecture {
    /// `qwen3_moe` (Qwen3MoeForCausalLM).
    Qwen3Moe,
    /// `mixtral` (MixtralForCausalLM).
    Mixtral,
}

impl HfMoeArchitecture {
    pub fn model_type(self) -> &'static str {
        match self {
            HfMoeArchitecture::Qwen3Moe => "qwen3_moe",
            HfMoeArchitecture::Mixtral => "mixtral",
        }
    }
}

impl ModelConfig {
    /// The transformers architecture whose layers are exactly this MoE model's; None for a dense
    /// model. The rule, which `miles check` mirrors:
    /// - qwen3_moe: q/k norm; q/k/v and o_proj biases all on or all off (`attention_bias`); no
    ///   shared expert; softmax gating. Any layers may be dense (written as `mlp_only_layers`)
    ///   and `norm_topk` may be either (`norm_topk_prob`).
    /// - mixtral: no q/k norm; no attention biases; no shared expert; softmax gating; `norm_topk`
    ///   true; every layer has experts.
    ///
    /// Otherwise the error lists, per architecture, what this model has that it cannot hold.
    pub fn hf_moe_architecture(&self) -> Result<Option<HfMoeArchitecture>, String> {
        let Some(m) = &self.moe else { return Ok(None) };
        let mut common = Vec::new();
        if m.shared_expert_d_ff > 0 {
            common.push(format!("a shared expert (shared_expert_d_ff = {})", m.shared_expert_d_ff));
        }
        if m.gating == Gating::Sigmoid {
            common.push("sigmoid gating (both route by a softmax)".to_string());
        }
        let mut qwen = Vec::new();
        if !self.qk_norm {
            qwen.push("no q/k norm (Qwen3-MoE normalises every query and key head)".to_string());
        }
        if self.qkv_bias != self.o_bias {
            qwen.push(format!(
                "q/k/v biases {} but an o_proj bias {} (`attention_bias` sets all four)",
                on_off(self.qkv_bias),
                on_off(self.o_bias)
            ));
        }
        let mut mixtral = Vec::new();
        if self.qk_norm {
            mixtral.push("q/k norm".to_string());
        }
        if self.qkv_bias || self.o_bias {
            mixtral.push("attention biases".to_string());
        }
        let dense: Vec<usize> = (0..self.n_layers).filter(|&i| !m.is_moe_layer(i)).collect();
        if !dense.is_empty() {
            mixtral.push(format!("dense layers {dense:?} (Mixtral has experts in every layer)"));
        }
        if !m.norm_topk {
            mixtral.push("norm_topk = false (Mixtral always renormalises the chosen experts' weights)".to_string());
        }
        if common.is_empty() && qwen.is_empty() {
            return Ok(Some(HfMoeArchitecture::Qwen3Moe));
        }
        if common.is_empty() && mixtral.is_empty() {
            return Ok(Some(HfMoeArchitecture::Mixtral));
        }
        let join = |v: &[String]| v.join(", ");
        let mut why = Vec::new();
        if !common.is_empty() {
            why.push(format!("neither qwen3_moe nor mixtral has {}", join(&common)));
        }
        if !qwen.is_empty() {
            why.push(format!("qwen3_moe: {}", join(&qwen)));
        }
        if !mixtral.is_empty() {
            why.push(format!("mixtral: {}", join(&mixtral)));
        }
        Err(format!("no transformers architecture holds this mixture of experts ({})", why.join("; ")))
    }
}

fn on_off(b: bool) -> &'static str {
    if b {
        "on"
    } else {
        "off"
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

#[cfg(test)]
mod tests {
    use super::*;

    fn moe(f: impl FnOnce(&mut ModelConfig, &mut MoeConfig)) -> ModelConfig {
        let sizes =
            DecoderSizes { vocab_size: 8, d_model: 8, n_layers: 3, n_heads: 2, n_kv_heads: 1, d_ff: 16, max_len: 8 };
        let mut c = ModelConfig::decoder(sizes);
        let mut m = MoeConfig::routed(4, 2, 8);
        f(&mut c, &mut m);
        c.moe = Some(m);
        c
    }

    #[test]
    fn the_transformers_moe_architecture_of_a_model() {
        use HfMoeArchitecture::*;
        let dense = ModelConfig { moe: None, ..moe(|_, _| {}) };
        assert_eq!(dense.hf_moe_architecture(), Ok(None));
        assert_eq!(moe(|_, _| {}).hf_moe_architecture(), Ok(Some(Mixtral)));
        let q = |f: fn(&mut MoeConfig)| {
            moe(|c, m| {
                c.qk_norm = true;
                f(m)
            })
            .hf_moe_architecture()
        };
        // Qwen3-MoE: any dense layers (leading, listed or by step), either norm_topk.
        assert_eq!(q(|_| {}), Ok(Some(Qwen3Moe)));
        assert_eq!(q(|m| m.dense_layers = 1), Ok(Some(Qwen3Moe)));
        assert_eq!(q(|m| m.sparse_step = 2), Ok(Some(Qwen3Moe)));
        assert_eq!(q(|m| m.norm_topk = false), Ok(Some(Qwen3Moe)));
        let e = q(|m| m.shared_expert_d_ff = 4).unwrap_err();
        assert!(e.contains("neither qwen3_moe nor mixtral has a shared expert (shared_expert_d_ff = 4)"), "{e}");
        let e = moe(|_, m| m.mlp_only_layers = vec![1]).hf_moe_architecture().unwrap_err();
        assert!(e.contains("qwen3_moe: no q/k norm") && e.contains("mixtral: dense layers [1]"), "{e}");
        let e = moe(|c, _| c.o_bias = true).hf_moe_architecture().unwrap_err();
        assert!(e.contains("an o_proj bias on") && e.contains("mixtral: attention biases"), "{e}");
    }
}
