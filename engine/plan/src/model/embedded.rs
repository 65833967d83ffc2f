//! The embedded libtorch trainer's activation memory, counted from its forward pass.

use super::*;

/// FP32 elements the embedded libtorch trainer (engine/tch) keeps for the backward pass per token
/// of one transformer layer, counted from its forward (`Policy::forward`), with d = d_model,
/// q = heads x head_dim, kv = kv_heads x head_dim, f = the MLP width, H heads and S keys
/// (the sequence):
/// - two RMSNorms, 2d each (x x rsqrt and the output);
/// - the fused q|k|v GEMM's output, q + 2kv (its views stay alive through rotary);
/// - rotary on q and k together, 2(q + kv) (the rotated half and the result);
/// - grouped-query keys and values repeated to every head, 2q (0 when kv_heads = heads);
/// - attention scores and their softmax, 2 H S (libtorch's CPU attention with a mask);
/// - the attention output and its contiguous copy, 2q;
/// - the two residual sums, 2d;
/// - the fused gate|up output 2f, SiLU f and the gated product f (in an MoE layer f is the
///   token's top_k experts' widths, `embedded_mlp_width`);
/// - in an MoE layer, the router's logits and gates, 2 x experts.
///
/// Total 6d + 5q + 4kv (+ 2q) + 4f + 2 H S (+ 2 experts), averaged over the layers.
pub(crate) fn embedded_layer_elements(m: &ModelSpec, seq_len: u64) -> f64 {
    let d = m.hidden_size as f64;
    let q = (m.heads * m.head_dim) as f64;
    let kv = (m.kv_heads * m.head_dim) as f64;
    let f = embedded_mlp_width(m);
    let repeat = if m.kv_heads < m.heads { 2.0 * q } else { 0.0 };
    // An MoE layer's router writes its logits and their gate (softmax or sigmoid): 2 x experts.
    let router = div(2.0 * (moe_layers(m) * m.experts) as f64, m.layers as f64);
    6.0 * d + 5.0 * q + 4.0 * kv + repeat + 4.0 * f + router + 2.0 * (m.heads * seq_len) as f64
}

/// The MLP width a token passes through, averaged over the layers: a dense layer's `d_ff`; in an
/// MoE layer its top_k experts' widths (the shared expert, which a `transformer` may add, is not
/// counted: the planner's input has no width for it).
pub(crate) fn embedded_mlp_width(m: &ModelSpec) -> f64 {
    let moe = moe_layers(m) as f64;
    if moe == 0.0 {
        return dense_mlp_width(m);
    }
    let dense = (m.layers as f64 - moe).max(0.0);
    div(dense * dense_mlp_width(m) + moe * m.top_k as f64 * expert_width(m), m.layers as f64)
}

/// The MLP weights of a layer, averaged over the layers, whose concatenated gate|up copy a GEMM
/// keeps for its input gradient: d_ff of a dense layer, every expert's width in an MoE layer.
pub(super) fn embedded_concat_mlp_width(m: &ModelSpec) -> f64 {
    let moe = moe_layers(m) as f64;
    if moe == 0.0 {
        return dense_mlp_width(m);
    }
    let dense = (m.layers as f64 - moe).max(0.0);
    div(dense * dense_mlp_width(m) + moe * m.experts as f64 * expert_width(m), m.layers as f64)
}

/// FP32 elements per token above the layers: the embedding's output d, the final RMSNorm 2d, and
/// three [tokens, vocab] tensors at the peak (the log-softmax autograd keeps, then the entropy's
/// exp and product in the forward, or the two vocabulary-wide gradients in the backward), one
/// more when the entropy is in the loss (its exp is then kept too).
pub(crate) fn embedded_head_elements(m: &ModelSpec, entropy_in_loss: bool) -> f64 {
    let vocab_tensors = if entropy_in_loss { 4.0 } else { 3.0 };
    3.0 * m.hidden_size as f64 + vocab_tensors * m.vocab as f64
}

/// The embedded trainer's activation bytes for one micro-batch (it runs one at a time), before
/// `Assumptions::embedded_autograd_scale`: tokens = micro-batch x seq, every layer's
/// `embedded_layer_elements` plus the head's, 4 B each (FP32), plus the per-call concatenated
/// q|k|v and gate|up weights each layer's GEMMs keep for their input gradient
/// ((q + 2kv) d + 2 f d per layer).
/// With LoRA each wrapped layer's adapter also keeps its A output (rank elements per token and
/// adapter) for B's gradient.
pub(crate) fn embedded_activation_bytes(
    m: &ModelSpec,
    seq_len: u64,
    micro_batch: u64,
    entropy_in_loss: bool,
    lora: Option<&Lora>,
) -> f64 {
    let layers = m.layers as f64;
    let adapters = lora
        .map_or(0.0, |lo| (lo.target_modules.len() as u64 * lo.rank.value * lo.adapters.value.max(1)) as f64 * layers);
    embedded_bytes(m, seq_len, micro_batch, embedded_head_elements(m, entropy_in_loss), adapters)
}

/// The embedded layers' activations for one micro-batch plus `head` and `adapters` FP32
/// elements per token, with the concatenated weights; see `embedded_activation_bytes`.
pub(super) fn embedded_bytes(m: &ModelSpec, seq_len: u64, micro_batch: u64, head: f64, adapters: f64) -> f64 {
    let tokens = (seq_len * micro_batch) as f64;
    let layers = m.layers as f64;
    let d = m.hidden_size as f64;
    let (q, kv) = ((m.heads * m.head_dim) as f64, (m.kv_heads * m.head_dim) as f64);
    let concat = layers * ((q + 2.0 * kv) * d + 2.0 * embedded_concat_mlp_width(m) * d);
    let per_token = layers * embedded_layer_elements(m, seq_len) + head + adapters;
    (tokens * per_token + concat) * 4.0
}
