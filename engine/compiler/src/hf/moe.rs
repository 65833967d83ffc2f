//! Mixture-of-experts configs with grouped-query attention: the pair the embedded backend loads
//! (qwen3_moe, mixtral: their experts as engine/tch/src/hf/config.rs reads them, with its
//! refusals) and GLM-4.5/4.6 (glm4_moe, plan only).

use super::{dense, rope_theta, Attention, Fields, Gating, Gqa, MoeSizes, Sized};
use crate::num::Q;

/// qwen3_moe or mixtral: the loadable dense reading plus the experts, read and refused as
/// engine/tch/src/hf/moe.rs `read` does (a Qwen3-MoE with `num_experts = 0` is dense, as
/// transformers builds it).
pub(super) fn read_loadable(f: &Fields, arch: &'static str) -> Result<Sized, String> {
    let mut s = dense::read(f, arch)?;
    refuse_foreign(f, arch)?;
    let aux_loss_coef = f.number("router_aux_loss_coef")?.unwrap_or(Q::new(1, 1000).unwrap_or(Q::ZERO));
    s.moe = if arch == "qwen3_moe" {
        qwen3_moe(f, s.layers, aux_loss_coef)?
    } else {
        Some(mixtral(f, s.d_ff, aux_loss_coef)?)
    };
    Ok(s)
}

/// Keys of MoE designs neither loadable architecture has: a value other than none is refused.
fn refuse_foreign(f: &Fields, arch: &str) -> Result<(), String> {
    for key in ["shared_expert_intermediate_size", "n_shared_experts"] {
        if let Some(n) = f.int(key)?.filter(|&n| n > 0) {
            return Err(format!("`{key}` = {n} is not supported: {arch} has no shared expert"));
        }
    }
    if let Some(s) = f.str("scoring_func")?.filter(|&s| s != "softmax") {
        return Err(format!("`scoring_func` = \"{s}\" is not supported for {arch} (only \"softmax\")"));
    }
    if arch == "mixtral" && f.bool("attention_bias")? == Some(true) {
        return Err("`attention_bias` = true is not supported: Mixtral's attention has no biases".into());
    }
    Ok(())
}

/// The experts' count: `num_experts` (the Hub's Qwen3-MoE key) or `num_local_experts` (Mixtral's,
/// and what transformers 5 writes for both); both present must agree.
fn experts(f: &Fields) -> Result<Option<u64>, String> {
    match (f.int("num_experts")?, f.int("num_local_experts")?) {
        (Some(a), Some(b)) if a != b => Err(format!("`num_experts` ({a}) and `num_local_experts` ({b}) disagree")),
        (a, b) => Ok(a.or(b)),
    }
}

/// Routed experts per token, in 1..=experts.
pub(super) fn top_k(f: &Fields, key: &str, experts: u64) -> Result<u64, String> {
    let k = f.required(key)?;
    if k == 0 || k > experts {
        return Err(format!("`{key}` = {k}: each token is routed to 1..={experts} experts"));
    }
    Ok(k)
}

/// transformers' Qwen3-MoE: `num_experts` SwiGLU experts of `moe_intermediate_size` on every
/// `decoder_sparse_step`-th layer not in `mlp_only_layers` (those have a dense MLP of
/// `intermediate_size`); softmax routing, renormalised when `norm_topk_prob` (transformers'
/// default: false).
fn qwen3_moe(f: &Fields, layers: u64, aux_loss_coef: Q) -> Result<Option<MoeSizes>, String> {
    let experts = experts(f)?.ok_or("no `num_experts`")?;
    if experts == 0 {
        return Ok(None);
    }
    let sparse_step = f.int("decoder_sparse_step")?.unwrap_or(1);
    if sparse_step == 0 {
        return Err("`decoder_sparse_step` must be at least 1".into());
    }
    let mlp_only_layers = f.layer_list("mlp_only_layers", layers)?;
    let expert_d_ff = f.positive("moe_intermediate_size")?;
    // Read here, in the order `read` lists them (the struct below only places them).
    let k = top_k(f, "num_experts_per_tok", experts)?;
    let norm_topk = f.bool("norm_topk_prob")?.unwrap_or(false);
    Ok(Some(MoeSizes {
        mlp_only_layers,
        sparse_step,
        norm_topk,
        ..MoeSizes::every_layer(experts, k, expert_d_ff, aux_loss_coef)
    }))
}

/// transformers' Mixtral: `num_local_experts` experts of `intermediate_size` on every layer,
/// softmax over the top-k, always renormalised. Router jitter noise changes training's routing:
/// the engine does not add it.
fn mixtral(f: &Fields, d_ff: u64, aux_loss_coef: Q) -> Result<MoeSizes, String> {
    if let Some(j) = f.number("router_jitter_noise")?.filter(|&j| j != Q::ZERO) {
        return Err(format!(
            "`router_jitter_noise` = {j} is not supported for mixtral (only 0: the trainer does not jitter router inputs)"
        ));
    }
    let layers = f.layer_list("mlp_only_layers", u64::MAX)?;
    if !layers.is_empty() {
        return Err(format!("`mlp_only_layers` = {layers:?} is not supported: mixtral has experts in every layer"));
    }
    if f.bool("norm_topk_prob")? == Some(false) {
        return Err("`norm_topk_prob` = false is not supported: mixtral always renormalises the top-k weights".into());
    }
    let experts = experts(f)?.ok_or("no `num_local_experts`")?;
    if experts == 0 {
        return Err("`num_local_experts` must be at least 1".into());
    }
    Ok(MoeSizes::every_layer(experts, top_k(f, "num_experts_per_tok", experts)?, d_ff, aux_loss_coef))
}

/// GLM-4.5 / 4.6 / 4.5-Air (`glm4_moe`, plan only): grouped-query attention with `head_dim`, q/k/v
/// biases (`attention_bias`, no o_proj bias), q/k norms (`use_qk_norm`), rotary on a
/// `partial_rotary_factor` of each head (no size); `first_k_dense_replace` dense layers of
/// `intermediate_size`, then `n_routed_experts` of `moe_intermediate_size` with
/// `n_shared_experts` shared ones, sigmoid routing. `num_nextn_predict_layers` MTP layers are
/// counted apart.
pub(super) fn read_glm4_moe(f: &Fields) -> Result<Sized, String> {
    let g = Gqa::read(f)?;
    let layers = g.layers;
    let attention_bias = f.bool("attention_bias")?.unwrap_or(false);
    // Read to say it was seen: a partial rotary changes which dimensions rotate, not any size.
    f.number("partial_rotary_factor")?;
    let experts = f.positive("n_routed_experts")?;
    let moe_ff = f.positive("moe_intermediate_size")?;
    let moe = MoeSizes {
        experts,
        top_k: top_k(f, "num_experts_per_tok", experts)?,
        expert_d_ff: moe_ff,
        shared_d_ff: f.int("n_shared_experts")?.unwrap_or(1) * moe_ff,
        dense_layers: f.int("first_k_dense_replace")?.unwrap_or(1).min(layers),
        mlp_only_layers: Vec::new(),
        sparse_step: 1,
        step_from_zero: true,
        gating: Gating::Sigmoid,
        norm_topk: f.bool("norm_topk_prob")?.unwrap_or(true),
        aux_loss_coef: Q::ZERO,
        biases: false,
    };
    let d_ff = f.positive("intermediate_size")?;
    let mut s = plan_only(f, "glm4_moe", g, d_ff, Some("use_qk_norm"), moe)?;
    s.qkv_bias = attention_bias;
    s.mtp_layers = f.int("num_nextn_predict_layers")?.unwrap_or(0);
    Ok(s)
}

/// A plan-only grouped-query MoE (glm4_moe, gpt_oss) from its attention, dense width and experts:
/// reads, in this order (the order `read` lists), `vocab_size`, `max_position_embeddings`
/// (131072 when absent), `tie_word_embeddings`, the architecture's q/k-norm key if it has one,
/// the rope theta (any rope type: it is not run) and `rms_norm_eps` (1e-5). No biases, sinks or
/// MTP layers: the caller sets those its architecture has.
pub(super) fn plan_only(
    f: &Fields,
    arch: &'static str,
    g: Gqa,
    d_ff: u64,
    qk_norm_key: Option<&str>,
    moe: MoeSizes,
) -> Result<Sized, String> {
    Ok(Sized {
        arch,
        loadable: false,
        layers: g.layers,
        d_model: g.d_model,
        heads: g.heads,
        kv_heads: g.kv_heads,
        head_dim: g.head_dim,
        d_ff,
        vocab: f.positive("vocab_size")?,
        max_len: f.int("max_position_embeddings")?.unwrap_or(131072).max(1),
        tie: f.bool("tie_word_embeddings")?.unwrap_or(false),
        qkv_bias: false,
        o_bias: false,
        qk_norm: qk_norm_key.map(|k| f.bool(k)).transpose()?.flatten().unwrap_or(false),
        rope_theta: rope_theta(f, false)?,
        norm_eps: f.number("rms_norm_eps")?.unwrap_or(Q::new(1, 100_000).unwrap_or(Q::ZERO)),
        attention: Attention::Gqa,
        dsa: None,
        moe: Some(moe),
        sinks: false,
        mtp_layers: 0,
    })
}
