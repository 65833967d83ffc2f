//! Parameter counts of a config.json's model, as transformers lays each architecture out (the
//! figure `sum(p.numel() for p in model.parameters())` gives; scripts/make-hf-config-fixtures.py
//! prints it for every fixture). Buffers are not parameters (DeepSeek's and GLM's
//! `e_score_correction_bias`). Multi-token-prediction layers are counted apart (`mtp`), as
//! DeepSeek's published 671B leaves out its 14B MTP module.

use super::{Attention, Sized};

pub(crate) struct Counts {
    /// Every parameter of the model (embeddings and LM head included), MTP layers excluded.
    pub params: i128,
    /// Parameters one token uses: every dense part, the router and shared experts, and `top_k`
    /// routed experts of each MoE layer.
    pub active: i128,
    /// The multi-token-prediction layers (each a decoder layer plus its two norms, the
    /// projection of the concatenated states and the head's norm; embedding and LM head shared).
    pub mtp: i128,
}

/// The attention of one layer: projections with their biases, q/k norms, sinks, MLA's low-rank
/// projections and norms, DSA's indexer.
fn attention(s: &Sized) -> Option<i128> {
    let [d, h, kv, hd] = [s.d_model, s.heads, s.kv_heads, s.head_dim].map(i128::from);
    match &s.attention {
        Attention::Gqa => {
            let proj = d.checked_mul(h * hd)?.checked_mul(2)?.checked_add(d.checked_mul(2 * kv * hd)?)?;
            let biases = if s.qkv_bias { h * hd + 2 * kv * hd } else { 0 } + if s.o_bias { d } else { 0 };
            let norms = if s.qk_norm { 2 * hd } else { 0 };
            let sinks = if s.sinks { h } else { 0 };
            proj.checked_add(biases + norms + sinks)
        }
        Attention::Mla { q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim } => {
            let [kvr, nope, rope, v] =
                [*kv_lora_rank, *qk_nope_head_dim, *qk_rope_head_dim, *v_head_dim].map(i128::from);
            let q_out = h * (nope + rope);
            // q: a low-rank pair with an RMSNorm between (q_a_proj may have a bias), or one matrix.
            let q = match q_lora_rank.map(i128::from) {
                Some(r) => d.checked_mul(r)? + if s.qkv_bias { r } else { 0 } + r + r.checked_mul(q_out)?,
                None => d.checked_mul(q_out)?,
            };
            // kv: the latent and the rotary key from the hidden state, the latent's norm, then the
            // latent up to every head's no-rope key and value.
            let kv_a = d.checked_mul(kvr + rope)? + if s.qkv_bias { kvr + rope } else { 0 };
            let kv_b = kvr.checked_mul(h * (nope + v))?;
            let o = (h * v).checked_mul(d)?;
            let indexer = match (&s.dsa, q_lora_rank) {
                // wq_b from the query latent, wk and the per-head weights from the hidden state,
                // and the key's LayerNorm (weight and bias).
                (Some(x), Some(r)) => {
                    let [ih, ihd] = [x.heads, x.head_dim].map(i128::from);
                    i128::from(*r) * ih * ihd + d * ihd + 2 * ihd + d * ih
                }
                _ => 0,
            };
            q.checked_add(kv_a)?.checked_add(kvr)?.checked_add(kv_b)?.checked_add(o)?.checked_add(indexer)
        }
    }
}

/// One SwiGLU MLP of width `ff`: gate, up and down.
fn mlp(d: i128, ff: u64) -> Option<i128> {
    d.checked_mul(3)?.checked_mul(i128::from(ff))
}

/// (all of an MoE layer's MLP, what one token uses of it).
fn moe_mlp(s: &Sized) -> Option<(i128, i128)> {
    let m = s.moe.as_ref()?;
    let d = i128::from(s.d_model);
    let [e, k, ff] = [m.experts, m.top_k, m.expert_d_ff].map(i128::from);
    // gpt-oss: a bias on the router and on the fused gate/up and the down projections.
    let router = e * d + if m.biases { e } else { 0 };
    let expert = mlp(d, m.expert_d_ff)? + if m.biases { 2 * ff + d } else { 0 };
    let shared = mlp(d, m.shared_d_ff)?;
    let fixed = router + shared;
    Some((fixed.checked_add(e.checked_mul(expert)?)?, fixed.checked_add(k.checked_mul(expert)?)?))
}

pub(crate) fn count(s: &Sized) -> Option<Counts> {
    let d = i128::from(s.d_model);
    let attn = attention(s)?;
    let dense = mlp(d, s.d_ff)?;
    let (moe_all, moe_active) = moe_mlp(s).unwrap_or((0, 0));
    let moe_layers = s.moe.as_ref().map_or(0, |m| m.moe_layers(s.layers));
    let dense_layers = i128::from(s.layers - moe_layers);
    let moe_layers = i128::from(moe_layers);
    // Two RMSNorms per layer (before attention, before the MLP).
    let per_layer = attn.checked_add(2 * d)?;
    let layers = i128::from(s.layers).checked_mul(per_layer)?;
    let embed = i128::from(s.vocab).checked_mul(d)?;
    let head = if s.tie { 0 } else { embed };
    let common =
        layers.checked_add(dense_layers.checked_mul(dense)?)?.checked_add(embed)?.checked_add(head)?.checked_add(d)?;
    let params = common.checked_add(moe_layers.checked_mul(moe_all)?)?;
    let active = common.checked_add(moe_layers.checked_mul(moe_active)?)?;
    // An MTP layer is an MoE layer where the model has experts.
    let mtp_mlp = if s.moe.is_some() { moe_all } else { dense };
    let mtp_layer = per_layer.checked_add(mtp_mlp)?.checked_add(3 * d)?.checked_add(2 * d * d)?;
    let mtp = i128::from(s.mtp_layers).checked_mul(mtp_layer)?;
    Some(Counts { params, active, mtp })
}
