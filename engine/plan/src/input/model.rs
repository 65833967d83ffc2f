//! What a stage runs: a model's sizes (`schema llm`, or a decoder's shape), number formats, LoRA.

use super::stage::one;
use super::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Attention {
    Mha,
    Gqa,
    Mla,
}

/// `schema llm` in stdlib/std/models.miles.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelSpec {
    pub name: String,
    /// Total parameters.
    pub params: u64,
    /// Parameters used per token (equal to `params` for dense models).
    pub active_params: u64,
    pub layers: u64,
    /// Leading layers with a dense MLP in an MoE model.
    #[serde(default)]
    pub dense_layers: u64,
    pub hidden_size: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
    pub vocab: u64,
    /// Routed experts per MoE layer; 0 for a dense model.
    #[serde(default)]
    pub experts: u64,
    /// Routed experts per token.
    #[serde(default)]
    pub top_k: u64,
    /// Tokens.
    pub max_context: u64,
    pub attention: Attention,
    /// MLA: width of the compressed KV latent that the KV cache stores.
    #[serde(default)]
    pub kv_lora_rank: Option<u64>,
    /// MLA: width of the decoupled rotary key, also cached.
    #[serde(default)]
    pub qk_rope_head_dim: Option<u64>,
    /// DSA: tokens each query attends to (`None`: dense attention).
    #[serde(default)]
    pub sparse_topk: Option<u64>,
    /// DSA: width of the indexer key cached per token and layer.
    #[serde(default)]
    pub index_head_dim: Option<u64>,
    /// Seconds of on-GPU requantisation the engines need after each weight update (Kimi K2:
    /// 0.884 s, Miles Tab. 8); `None`: `assumptions.requantize_s`.
    #[serde(default)]
    pub update_requantize_s: Option<f64>,
    /// Width of a dense layer's MLP (`d_ff`, Hugging Face's `intermediate_size`), where the model
    /// record gives it (`transformer`, `hf`; `schema llm` has no such field): LoRA on the MLP.
    /// `None`: derived from the parameter count (docs/plan.md, "LoRA").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intermediate_size: Option<u64>,
    /// Whether the LM head shares the token embedding's matrix (`transformer`: no; `hf`: its
    /// config.json's `tie_word_embeddings`; `schema llm` has no such field). `None`: unknown.
    /// Sizes PPO's critic, which drops the LM head (docs/plan.md, "PPO").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tied_embeddings: Option<bool>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Precision {
    Fp32,
    Bf16,
    Fp16,
    Fp8Blockwise,
    Mxfp8,
    Nvfp4,
}

impl Precision {
    /// Bytes per stored weight (block scales of the 8- and 4-bit formats included).
    pub fn bytes(self) -> f64 {
        match self {
            Precision::Fp32 => 4.0,
            Precision::Bf16 | Precision::Fp16 => 2.0,
            // One FP32 scale per 128x128 block: 4 / 16384 bytes per weight.
            Precision::Fp8Blockwise => 1.0 + 4.0 / 16384.0,
            // One E8M0 scale per 32 weights.
            Precision::Mxfp8 => 1.0 + 1.0 / 32.0,
            // One E4M3 scale per 16 weights (the per-tensor FP32 scale is negligible).
            Precision::Nvfp4 => 0.5 + 1.0 / 16.0,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Bf16 => "bf16",
            Precision::Fp16 => "fp16",
            Precision::Fp8Blockwise => "fp8_blockwise",
            Precision::Mxfp8 => "mxfp8",
            Precision::Nvfp4 => "nvfp4",
        }
    }
}

/// A linear layer LoRA wraps in every transformer layer (std/prelude's `LoraTarget`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LoraTarget {
    QProj,
    KProj,
    VProj,
    OProj,
    GateProj,
    UpProj,
    DownProj,
}

impl LoraTarget {
    pub const ALL: [LoraTarget; 7] = [
        LoraTarget::QProj,
        LoraTarget::KProj,
        LoraTarget::VProj,
        LoraTarget::OProj,
        LoraTarget::GateProj,
        LoraTarget::UpProj,
        LoraTarget::DownProj,
    ];
    /// The module's name (PEFT's `target_modules`).
    pub fn as_str(self) -> &'static str {
        match self {
            LoraTarget::QProj => "q_proj",
            LoraTarget::KProj => "k_proj",
            LoraTarget::VProj => "v_proj",
            LoraTarget::OProj => "o_proj",
            LoraTarget::GateProj => "gate_proj",
            LoraTarget::UpProj => "up_proj",
            LoraTarget::DownProj => "down_proj",
        }
    }
    pub fn from_name(s: &str) -> Option<LoraTarget> {
        LoraTarget::ALL.into_iter().find(|t| t.as_str() == s)
    }
    /// The short name plans print (`q` for `q_proj`).
    pub fn short(self) -> &'static str {
        self.as_str().trim_end_matches("_proj")
    }
    /// An MLP projection (on the routed experts of an MoE model).
    pub fn is_mlp(self) -> bool {
        matches!(self, LoraTarget::GateProj | LoraTarget::UpProj | LoraTarget::DownProj)
    }
}

/// std/prelude's `schema lora`, as far as memory and weight sync depend on it (`alpha` does not),
/// and the PEFT adapter it starts from, which the plan names.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Lora {
    pub rank: Spanned<u64>,
    /// Adapters trained at once on the one frozen base (multi-LoRA).
    #[serde(default = "one")]
    pub adapters: Spanned<u64>,
    /// The wrapped modules; `None` in JSON: the stdlib's default (the attention projections).
    #[serde(default = "default_lora_targets")]
    pub target_modules: Vec<LoraTarget>,
    /// Dropout on each wrapped layer's input to its adapter (PEFT's `lora_dropout`), in 0..1.
    /// Above 0 the backward pass keeps the dropped copy of every wrapped layer's input
    /// (docs/plan.md, "LoRA"). Absent in JSON: 0; not written when 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub dropout: f64,
    /// The PEFT adapter directory training starts from (`init`; `miles check` read it and checked
    /// it fits, so rank and targets are the adapter's). Absent: fresh adapters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init: Option<String>,
    /// Where the recipe wrote `lora { ... }`.
    #[serde(default, serialize_with = "opt_span", deserialize_with = "de_opt_span")]
    pub span: Option<Span>,
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

/// PEFT's common choice for Llama-family models, std/prelude's default: q, k, v, o.
pub fn default_lora_targets() -> Vec<LoraTarget> {
    vec![LoraTarget::QProj, LoraTarget::KProj, LoraTarget::VProj, LoraTarget::OProj]
}
