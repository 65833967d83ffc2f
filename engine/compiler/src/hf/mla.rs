//! Multi-head latent attention with shared and routed experts, plan only: DeepSeek-V3
//! (`deepseek_v3`), Kimi K2 (`kimi_k2`, DeepSeek-V3's architecture under its own model_type) and
//! GLM-5 (`glm_moe_dsa`: the same, plus DeepSeek sparse attention's lightning indexer).

use super::{rope_theta, Attention, Dsa, Fields, Gating, MoeSizes, Sized};
use crate::num::Q;

pub(super) fn read(f: &Fields, arch: &'static str) -> Result<Sized, String> {
    let layers = f.positive("num_hidden_layers")?;
    let d_model = f.positive("hidden_size")?;
    let heads = f.positive("num_attention_heads")?;
    let kv_heads = f.int("num_key_value_heads")?.unwrap_or(heads).max(1);
    let q_lora_rank = f.int("q_lora_rank")?.filter(|&r| r > 0);
    let kv_lora_rank = f.positive("kv_lora_rank")?;
    let qk_nope_head_dim = f.required("qk_nope_head_dim")?;
    let qk_rope_head_dim = f.positive("qk_rope_head_dim")?;
    let v_head_dim = f.positive("v_head_dim")?;
    let moe = experts(f, arch, layers)?;
    let dsa = if arch == "glm_moe_dsa" {
        let head_dim = f.positive("index_head_dim")?;
        let heads = f.positive("index_n_heads")?;
        if q_lora_rank.is_none() {
            return Err("DSA's indexer projects the query latent: `q_lora_rank` must be set".into());
        }
        Some(Dsa { topk: f.positive("index_topk")?, head_dim, heads })
    } else {
        None
    };
    Ok(Sized {
        arch,
        loadable: false,
        layers,
        d_model,
        heads,
        kv_heads,
        head_dim: qk_nope_head_dim + qk_rope_head_dim,
        d_ff: f.positive("intermediate_size")?,
        vocab: f.positive("vocab_size")?,
        max_len: f.int("max_position_embeddings")?.unwrap_or(4096).max(1),
        tie: f.bool("tie_word_embeddings")?.unwrap_or(false),
        qkv_bias: f.bool("attention_bias")?.unwrap_or(false),
        o_bias: false,
        qk_norm: false,
        rope_theta: rope_theta(f, false)?,
        norm_eps: f.number("rms_norm_eps")?.unwrap_or(Q::parse_literal("1e-6").unwrap_or(Q::ZERO)),
        attention: Attention::Mla { q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim },
        dsa,
        moe,
        sinks: false,
        mtp_layers: f.int("num_nextn_predict_layers")?.unwrap_or(0),
    })
}

/// DeepSeek-V3's experts: `n_routed_experts` of `moe_intermediate_size` (none: a dense model),
/// `n_shared_experts` shared ones of the same width, on layers from `first_k_dense_replace` on
/// that `moe_layer_freq` selects (DeepSeek's reference code: `i % freq == 0`); routing by
/// `scoring_func` (sigmoid in V3).
fn experts(f: &Fields, arch: &str, layers: u64) -> Result<Option<MoeSizes>, String> {
    let Some(experts) = f.int("n_routed_experts")?.filter(|&e| e > 0) else { return Ok(None) };
    let k = f.required("num_experts_per_tok")?;
    if k == 0 || k > experts {
        return Err(format!("`num_experts_per_tok` = {k}: each token is routed to 1..={experts} experts"));
    }
    let expert_d_ff = f.positive("moe_intermediate_size")?;
    let gating = match f.str("scoring_func")? {
        None | Some("sigmoid") => Gating::Sigmoid,
        Some("softmax") => Gating::Softmax,
        Some(other) => return Err(format!("`scoring_func` = \"{other}\": DeepSeek routes by sigmoid or softmax")),
    };
    // GLM-5's layers are MoE from `first_k_dense_replace` on, with no frequency.
    let sparse_step = if arch == "glm_moe_dsa" { 1 } else { f.int("moe_layer_freq")?.unwrap_or(1) };
    if sparse_step == 0 {
        return Err("`moe_layer_freq` must be at least 1".into());
    }
    Ok(Some(MoeSizes {
        experts,
        top_k: k,
        expert_d_ff,
        shared_d_ff: f.int("n_shared_experts")?.unwrap_or(0) * expert_d_ff,
        dense_layers: f.int("first_k_dense_replace")?.unwrap_or(0).min(layers),
        mlp_only_layers: Vec::new(),
        sparse_step,
        step_from_zero: true,
        gating,
        norm_topk: f.bool("norm_topk_prob")?.unwrap_or(true),
        aux_loss_coef: f.number("aux_loss_alpha")?.unwrap_or(Q::ZERO),
        biases: false,
    }))
}
