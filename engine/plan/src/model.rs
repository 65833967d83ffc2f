//! Memory formulas. Every function is total: sizes are checked to be non-zero by the caller,
//! and divisions go through `div` so a zero that slips through gives 0, never a panic or NaN.
//! docs/plan.md derives each formula.

use crate::input::{Attention, Backend, ModelSpec, Precision, Recompute};

/// `a / b`, 0 when `b` is 0.
pub(crate) fn div(a: f64, b: f64) -> f64 {
    if b == 0.0 || !b.is_finite() {
        0.0
    } else {
        a / b
    }
}

/// Parameters split into the routed experts and everything else (attention, embeddings,
/// dense MLPs, shared experts, norms).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct ParamSplit {
    pub routed: f64,
    pub other: f64,
}

/// Total minus active parameters are the experts a token does not use: (E - k) of the E routed
/// experts of every MoE layer. So one expert (summed over layers) is (total - active) / (E - k)
/// and all routed experts are E times that. Needs no per-expert figure from the model card.
pub(crate) fn param_split(m: &ModelSpec) -> ParamSplit {
    let total = m.params as f64;
    if m.experts > m.top_k && m.top_k > 0 && m.params > m.active_params {
        let per_expert = (total - m.active_params as f64) / (m.experts - m.top_k) as f64;
        let routed = (per_expert * m.experts as f64).min(total);
        ParamSplit { routed, other: total - routed }
    } else {
        ParamSplit { routed: 0.0, other: total }
    }
}

/// Layers with routed experts (R3 records one routing decision per such layer).
pub(crate) fn moe_layers(m: &ModelSpec) -> u64 {
    if m.experts == 0 {
        0
    } else {
        m.layers.saturating_sub(m.dense_layers)
    }
}

/// The trainer layout with every size at least 1 (checked by the caller).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Layout {
    pub backend: Backend,
    pub tp: u64,
    pub pp: u64,
    pub cp: u64,
    pub ep: u64,
    pub dp: u64,
    pub precision: Precision,
}

impl Layout {
    /// Expert tensor parallelism: Megatron's MoE recipes run experts without TP once EP > 1
    /// (`--expert-tensor-parallel-size 1`); with EP = 1 experts are split like dense layers.
    pub fn etp(&self) -> u64 {
        if self.ep > 1 {
            1
        } else {
            self.tp
        }
    }
    /// Expert data parallelism: the ranks left over once the experts are placed
    /// (tp x cp x dp = etp x ep x edp, Megatron's "parallel folding").
    pub fn edp(&self) -> u64 {
        (self.tp * self.cp * self.dp) / (self.etp() * self.ep).max(1)
    }
}

/// Parameters held by one rank, and the share of optimizer state it owns.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct RankParams {
    /// Parameters whose weights (and gradients) live on the rank.
    pub local: f64,
    /// Parameters whose optimizer state lives on the rank.
    pub optimizer: f64,
}

pub(crate) fn rank_params(m: &ModelSpec, l: &Layout) -> RankParams {
    let s = param_split(m);
    match l.backend {
        Backend::Megatron => {
            let (tp, pp, cp, dp, ep) = (l.tp as f64, l.pp as f64, l.cp as f64, l.dp as f64, l.ep as f64);
            let (etp, edp) = (l.etp() as f64, l.edp() as f64);
            let other_local = div(s.other, tp * pp);
            let routed_local = div(s.routed, ep * etp * pp);
            // The distributed optimizer shards each parameter's state over its data-parallel
            // group: dp x cp for dense parameters, the expert data-parallel group for experts.
            RankParams {
                local: other_local + routed_local,
                optimizer: div(other_local, dp * cp) + div(routed_local, edp),
            }
        }
        Backend::Fsdp => {
            // FSDP shards parameters, gradients and optimizer state over all data-parallel ranks.
            let world = (l.dp * l.tp * l.pp * l.cp) as f64;
            let shard = div(m.params as f64, world);
            RankParams { local: shard, optimizer: shard }
        }
        Backend::Embedded => RankParams { local: m.params as f64, optimizer: m.params as f64 },
    }
}

/// Bytes per parameter of optimizer state: FP32 master weights plus two Adam moments (12), or
/// only the moments (8) when the model already trains in FP32 and is its own master copy.
pub(crate) fn optimizer_bytes_per_param(p: Precision) -> f64 {
    if p == Precision::Fp32 {
        8.0
    } else {
        12.0
    }
}

/// Weight, gradient and optimizer bytes on one rank.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct StateBytes {
    pub weights: f64,
    pub gradients: f64,
    pub optimizer: f64,
}

pub(crate) fn state_bytes(m: &ModelSpec, l: &Layout) -> StateBytes {
    let rp = rank_params(m, l);
    let wb = l.precision.bytes();
    let mut weights = rp.local * wb;
    if l.backend == Backend::Fsdp {
        // FSDP gathers one layer's full weights for compute and prefetches the next.
        weights += 2.0 * div(m.params as f64, m.layers as f64) * wb;
    }
    StateBytes {
        weights,
        // Gradients accumulate in FP32 (Megatron's main_grad buffer; FSDP's reduce dtype).
        gradients: rp.local * 4.0,
        optimizer: rp.optimizer * optimizer_bytes_per_param(l.precision),
    }
}

/// Activation bytes of one transformer layer for one micro-batch on one rank
/// (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
/// with tensor and sequence parallelism; `s` is the rank's share of the sequence after CP).
/// The s^2 attention-score term is left out: flash attention never stores the scores, which
/// also makes `selective` (the paper's recomputation of exactly that term) equal to `none`.
pub(crate) fn layer_activation_bytes(s: f64, b: f64, h: f64, tp: f64, recompute: Recompute) -> f64 {
    match recompute {
        Recompute::Off | Recompute::Selective => div(34.0 * s * b * h, tp),
        // Only the layer's input is kept (2 bytes per element, split by sequence parallelism).
        Recompute::Full => div(2.0 * s * b * h, tp),
    }
}

/// Activation bytes on the busiest rank (the first pipeline stage under 1F1B, which holds
/// `min(pp, micro-batches)` micro-batches in flight), plus the FP32 logits on the last stage
/// and, under full recomputation, one layer's full activations while it is recomputed.
pub(crate) fn activation_bytes(
    m: &ModelSpec,
    l: &Layout,
    seq_len: u64,
    micro_batch: u64,
    micro_batches: Option<u64>,
    recompute: Recompute,
) -> f64 {
    let s = div(seq_len as f64, l.cp as f64);
    let (b, h, tp) = (micro_batch as f64, m.hidden_size as f64, l.tp as f64);
    let layers_per_stage = m.layers.div_ceil(l.pp.max(1)) as f64;
    let in_flight = micro_batches.map_or(l.pp, |n| n.clamp(1, l.pp.max(1))) as f64;
    let per_layer = layer_activation_bytes(s, b, h, tp, recompute);
    let mut total = per_layer * layers_per_stage * in_flight;
    if recompute == Recompute::Full {
        total += layer_activation_bytes(s, b, h, tp, Recompute::Off);
    }
    let logits = div(s * b * m.vocab as f64 * 4.0, tp);
    total + logits
}

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

/// R3 data of one trajectory: an int32 expert id per token, MoE layer and routed expert.
pub(crate) fn r3_bytes(m: &ModelSpec, tokens: u64) -> f64 {
    tokens as f64 * moe_layers(m) as f64 * m.top_k as f64 * 4.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::glm5;
    use crate::input::Attention;

    fn llama8b() -> ModelSpec {
        ModelSpec {
            name: "Llama-3.1-8B".into(),
            params: 8_030_000_000,
            active_params: 8_030_000_000,
            layers: 32,
            dense_layers: 0,
            hidden_size: 4096,
            heads: 32,
            kv_heads: 8,
            head_dim: 128,
            vocab: 128_256,
            experts: 0,
            top_k: 0,
            max_context: 131_072,
            attention: Attention::Gqa,
            kv_lora_rank: None,
            qk_rope_head_dim: None,
            sparse_topk: None,
            index_head_dim: None,
            update_requantize_s: None,
        }
    }

    fn layout(backend: Backend, tp: u64, pp: u64, cp: u64, ep: u64, dp: u64) -> Layout {
        Layout { backend, tp, pp, cp, ep, dp, precision: Precision::Bf16 }
    }

    fn close(a: f64, b: f64, rel: f64) -> bool {
        (a - b).abs() <= rel * b.abs()
    }

    #[test]
    fn glm5_split_from_total_and_active() {
        // (744 - 40) / (256 - 8) = 2.8387 B per expert; x 256 = 726.7 B routed.
        let s = param_split(&glm5());
        assert!(close(s.routed, 726.71e9, 1e-4), "{}", s.routed);
        assert!(close(s.other, 17.29e9, 1e-3), "{}", s.other);
        assert_eq!(param_split(&llama8b()).routed, 0.0);
    }

    #[test]
    fn glm5_reference_optimizer_is_279_gb_per_rank() {
        // domain.md §9: 32 training GPUs, TP2 PP4 CP4 EP8 -> 744e9 x 12 / 32 = 279 GB.
        let l = layout(Backend::Megatron, 2, 4, 4, 8, 1);
        assert_eq!((l.etp(), l.edp()), (1, 1));
        let b = state_bytes(&glm5(), &l);
        assert!(close(b.optimizer, 279.0e9, 1e-9), "{}", b.optimizer);
        // Weights: 17.29e9 / 8 + 726.71e9 / 32 = 24.87e9 params, 2 bytes each.
        assert!(close(b.weights, 49.74e9, 1e-3), "{}", b.weights);
        assert!(close(b.gradients, 99.48e9, 1e-3), "{}", b.gradients);
    }

    #[test]
    fn dense_megatron_distributed_optimizer_is_6_plus_12_over_d() {
        // Megatron docs: 6 + 12/d bytes per parameter with the distributed optimizer.
        let l = layout(Backend::Megatron, 1, 1, 1, 1, 8);
        let b = state_bytes(&llama8b(), &l);
        let p = 8.03e9;
        assert!(close(b.weights + b.gradients + b.optimizer, p * (6.0 + 12.0 / 8.0), 1e-12));
    }

    #[test]
    fn fsdp_and_embedded() {
        let m = llama8b();
        let b = state_bytes(&m, &layout(Backend::Fsdp, 1, 1, 1, 1, 8));
        assert!(close(b.optimizer, 8.03e9 * 12.0 / 8.0, 1e-12));
        assert!(close(b.weights, 8.03e9 * 2.0 / 8.0 + 2.0 * 8.03e9 / 32.0 * 2.0, 1e-12));
        let l = Layout { precision: Precision::Fp32, ..layout(Backend::Embedded, 1, 1, 1, 1, 1) };
        let b = state_bytes(&m, &l);
        assert_eq!((b.weights, b.gradients, b.optimizer), (8.03e9 * 4.0, 8.03e9 * 4.0, 8.03e9 * 8.0));
    }

    #[test]
    fn activations_by_recompute() {
        // s = 8192 / 2 (CP2), b = 1, h = 4096, t = 2: 34 s b h / t = 34 x 4096 x 4096 / 2.
        assert_eq!(layer_activation_bytes(4096.0, 1.0, 4096.0, 2.0, Recompute::Off), 285_212_672.0);
        assert_eq!(layer_activation_bytes(4096.0, 1.0, 4096.0, 2.0, Recompute::Full), 16_777_216.0);
        let m = llama8b();
        let l = layout(Backend::Megatron, 2, 4, 2, 1, 1);
        // Full: 8 layers/stage x 4 in flight x 16.78 MB + one layer at 285.2 MB + logits
        // 4096 x 128256 x 4 / 2 = 1050.7 MB.
        let a = activation_bytes(&m, &l, 8192, 1, None, Recompute::Full);
        assert_eq!(a, 8.0 * 4.0 * 16_777_216.0 + 285_212_672.0 + 1_050_673_152.0);
        // Two micro-batches only: two in flight.
        let a2 = activation_bytes(&m, &l, 8192, 1, Some(2), Recompute::Full);
        assert_eq!(a2, 8.0 * 2.0 * 16_777_216.0 + 285_212_672.0 + 1_050_673_152.0);
    }

    #[test]
    fn kv_cache_per_token() {
        // MLA: 78 layers x (512 + 64) x 2 bytes = 89,856 bytes, whatever the TP.
        assert_eq!(kv_bytes_per_token(&glm5(), 8, Precision::Bf16), 89_856.0);
        // DSA's indexer: an FP8 key of 128 and a 4-byte scale per layer, only for a sparse model.
        assert_eq!(indexer_bytes_per_token(&glm5()), 0.0);
        let dsa = ModelSpec { sparse_topk: Some(2048), index_head_dim: Some(128), ..glm5() };
        assert_eq!(indexer_bytes_per_token(&dsa), 78.0 * 132.0);
        // GQA: 32 layers x 2 x (8 heads / TP2 = 4) x 128 x 2 bytes = 65,536.
        assert_eq!(kv_bytes_per_token(&llama8b(), 2, Precision::Bf16), 65_536.0);
        // TP16 > 8 KV heads: one head per GPU (replicated).
        assert_eq!(kv_bytes_per_token(&llama8b(), 16, Precision::Bf16), 16_384.0);
    }

    #[test]
    fn r3_matches_domain_example() {
        // domain.md: 32K tokens x 60 layers x k=8 x 4 bytes ~ 60 MB.
        let m = ModelSpec { layers: 60, dense_layers: 0, ..glm5() };
        assert_eq!(r3_bytes(&m, 32_768), 62_914_560.0);
        assert_eq!(r3_bytes(&llama8b(), 32_768), 0.0);
    }

    #[test]
    fn rollout_weights() {
        // GLM-5 fp8 on TP8: (17.29e9 + 726.71e9) / 8 x (1 + 4/16384) bytes.
        let w = rollout_weight_bytes(&glm5(), 8, 1, Precision::Fp8Blockwise);
        assert!(close(w, 93.0e9 * (1.0 + 4.0 / 16384.0), 1e-3), "{w}");
        // DP attention 8: the non-expert part is whole on every GPU.
        let w = rollout_weight_bytes(&glm5(), 8, 8, Precision::Bf16);
        assert!(close(w, (17.29e9 + 726.71e9 / 8.0) * 2.0, 1e-3), "{w}");
    }

    #[test]
    fn experts_touched_saturates() {
        let m = glm5();
        assert!(close(experts_touched(&m, 1), 8.0 / 256.0, 1e-12));
        assert!(experts_touched(&m, 1000) > 0.999);
        assert_eq!(experts_touched(&llama8b(), 3), 1.0);
    }

    #[test]
    fn div_by_zero_is_zero() {
        assert_eq!(div(1.0, 0.0), 0.0);
        let l = layout(Backend::Megatron, 1, 1, 1, 1, 1);
        let m = ModelSpec { layers: 0, hidden_size: 0, ..llama8b() };
        assert!(activation_bytes(&m, &Layout { pp: 0, cp: 0, ..l }, 0, 0, Some(0), Recompute::Full).is_finite());
    }
}
