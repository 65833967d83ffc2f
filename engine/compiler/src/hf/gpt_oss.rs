//! gpt-oss (`gpt_oss`, plan only): grouped-query attention with biases on all four projections
//! and a learned sink per head, alternating sliding-window and full layers (`layer_types`,
//! `sliding_window`); every layer a mixture of `num_local_experts` experts of
//! `intermediate_size`, with a biased router and biased expert projections.

use super::{head_dim, rope_theta, Attention, Fields, Gating, MoeSizes, Sized};
use crate::num::Q;

pub(super) fn read(f: &Fields) -> Result<Sized, String> {
    let layers = f.positive("num_hidden_layers")?;
    let d_model = f.positive("hidden_size")?;
    let heads = f.positive("num_attention_heads")?;
    let kv_heads = f.int("num_key_value_heads")?.unwrap_or(heads).max(1);
    let head_dim = head_dim(f, d_model, heads)?;
    let experts = f.positive("num_local_experts")?;
    // The published config.json has both names; transformers reads `num_experts_per_tok`.
    let key = if f.int("num_experts_per_tok")?.is_some() { "num_experts_per_tok" } else { "experts_per_token" };
    let top_k = f.required(key)?;
    if top_k == 0 || top_k > experts {
        return Err(format!("`{key}` = {top_k}: each token is routed to 1..={experts} experts"));
    }
    if let Some(other) = f.int("experts_per_token")?.filter(|&k| k != top_k) {
        return Err(format!("`experts_per_token` = {other} and `num_experts_per_tok` = {top_k} disagree"));
    }
    let d_ff = f.positive("intermediate_size")?;
    // Read so the plan says they were seen: a sliding-window layer caches at most the window, and
    // the planner sizes every layer's KV cache as full attention (an upper bound, docs/models.md).
    f.int("sliding_window")?;
    if let Some(v) = f.get("layer_types") {
        let n = v.as_array().map(|a| a.len() as u64);
        if n != Some(layers) {
            return Err(format!("`layer_types` must list one type per layer ({layers}), found {v}"));
        }
    }
    let attention_bias = f.bool("attention_bias")?.unwrap_or(true);
    let moe = MoeSizes {
        experts,
        top_k,
        expert_d_ff: d_ff,
        shared_d_ff: 0,
        dense_layers: 0,
        mlp_only_layers: Vec::new(),
        sparse_step: 1,
        step_from_zero: false,
        gating: Gating::Softmax,
        norm_topk: true,
        aux_loss_coef: f.number("router_aux_loss_coef")?.unwrap_or(Q::ZERO),
        biases: true,
    };
    Ok(Sized {
        arch: "gpt_oss",
        loadable: false,
        layers,
        d_model,
        heads,
        kv_heads,
        head_dim,
        d_ff,
        vocab: f.positive("vocab_size")?,
        max_len: f.int("max_position_embeddings")?.unwrap_or(131072).max(1),
        tie: f.bool("tie_word_embeddings")?.unwrap_or(false),
        qkv_bias: attention_bias,
        o_bias: attention_bias,
        qk_norm: false,
        rope_theta: rope_theta(f, false)?,
        norm_eps: f.number("rms_norm_eps")?.unwrap_or(Q::new(1, 100_000).unwrap_or(Q::ZERO)),
        attention: Attention::Gqa,
        dsa: None,
        moe: Some(moe),
        sinks: true,
        mtp_layers: 0,
    })
}
