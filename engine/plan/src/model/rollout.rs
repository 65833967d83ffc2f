//! The rollout side: KV cache and DSA indexer bytes per token, engine weights, experts a batch
//! touches, and R3's routing record.

use super::*;

/// KV-cache bytes of one token on one GPU of an engine whose attention is split over `group`
/// GPUs (tp / dp with data-parallel attention).
pub(crate) fn kv_bytes_per_token(m: &ModelSpec, group: u64, kv: Precision) -> f64 {
    let b = kv.bytes();
    let layers = m.layers as f64;
    match m.attention {
        // MLA caches the compressed latent and the rotary key, shared by all heads, so each
        // GPU of the attention group keeps the whole of it.
        Attention::Mla => {
            let width = m.kv_lora_rank.unwrap_or(0) + m.qk_rope_head_dim.unwrap_or(0);
            layers * width as f64 * b
        }
        // K and V per KV head; heads split over the group, replicated when the group is larger.
        Attention::Mha | Attention::Gqa => {
            let heads_per_gpu = m.kv_heads.div_ceil(group.max(1));
            layers * 2.0 * heads_per_gpu as f64 * m.head_dim as f64 * b
        }
    }
}

/// DSA's indexer cache per token on one GPU: an FP8 key of `index_head_dim` and its FP32 scale
/// per layer (DeepSeek-V3.2's layout, which GLM-5 shares); 0 without sparse attention.
pub(crate) fn indexer_bytes_per_token(m: &ModelSpec) -> f64 {
    m.index_head_dim.filter(|_| m.sparse_topk.is_some()).map_or(0.0, |d| m.layers as f64 * (d as f64 + 4.0))
}

/// Rollout weight bytes on one GPU of an engine: the experts are split over all `tp` GPUs (by
/// EP or TP), the rest over the attention group (`tp / dp`): data-parallel attention
/// replicates it `dp` times.
pub(crate) fn rollout_weight_bytes(m: &ModelSpec, tp: u64, dp: u64, p: Precision) -> f64 {
    let s = param_split(m);
    let group = (tp / dp.max(1)).max(1) as f64;
    (div(s.other, group) + div(s.routed, tp as f64)) * p.bytes()
}

/// Share of an MoE layer's experts that a decode step of `batch` tokens touches, assuming
/// uniform routing: 1 - (1 - k/E)^batch.
pub(crate) fn experts_touched(m: &ModelSpec, batch: u64) -> f64 {
    if m.experts == 0 || m.top_k == 0 {
        return 1.0;
    }
    let miss = 1.0 - (m.top_k as f64 / m.experts as f64).min(1.0);
    1.0 - miss.powf(batch as f64)
}

/// Bytes of one recorded expert id: `routing_dtype`'s, else the smallest integer type that holds
/// ids 0..experts (u8 up to 256 experts, u16 up to 65,536, else i32), as the engine stores them.
pub(crate) fn route_id_bytes(m: &ModelSpec, routing_dtype: Option<u64>) -> u64 {
    routing_dtype.unwrap_or(match m.experts {
        0..=256 => 1,
        257..=65_536 => 2,
        _ => 4,
    })
}

/// R3 bytes per recorded token: an expert id per MoE layer and routed expert.
pub(crate) fn r3_bytes_per_token(m: &ModelSpec, id_bytes: u64) -> f64 {
    (moe_layers(m) * m.top_k * id_bytes) as f64
}

/// R3 data of one trajectory of `tokens` (prompt + response): the engine records every token it
/// forwarded, the prompt and every response token but the last (never fed back).
pub(crate) fn r3_bytes(m: &ModelSpec, tokens: u64, id_bytes: u64) -> f64 {
    tokens.saturating_sub(1) as f64 * r3_bytes_per_token(m, id_bytes)
}
