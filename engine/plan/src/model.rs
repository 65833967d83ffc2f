//! Memory formulas. Every function is total: sizes are checked to be non-zero by the caller,
//! and divisions go through `div` so a zero that slips through gives 0, never a panic or NaN.
//! docs/plan.md derives each formula.

use crate::input::{Attention, Backend, Lora, LoraTarget, ModelSpec, Precision, Recompute};

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
    shard_params(param_split(m), l)
}

/// The rank's share of parameters split into routed experts and the rest: the base model's, or
/// LoRA adapters', which are laid out like the layers they wrap.
pub(crate) fn shard_params(s: ParamSplit, l: &Layout) -> RankParams {
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
            let shard = div(s.routed + s.other, world);
            RankParams { local: shard, optimizer: shard }
        }
        Backend::Embedded => RankParams { local: s.routed + s.other, optimizer: s.routed + s.other },
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
    /// The model's weights (with LoRA: the frozen base).
    pub weights: f64,
    /// LoRA adapter weights, all adapters (0 for a full fine-tune).
    pub adapters: f64,
    pub gradients: f64,
    pub optimizer: f64,
}

/// The base model's weight bytes on one rank.
fn base_weight_bytes(m: &ModelSpec, l: &Layout) -> f64 {
    let wb = l.precision.bytes();
    let mut weights = rank_params(m, l).local * wb;
    if l.backend == Backend::Fsdp {
        // FSDP gathers one layer's full weights for compute and prefetches the next.
        weights += 2.0 * div(m.params as f64, m.layers as f64) * wb;
    }
    weights
}

/// Full fine-tuning, or with `lora` a frozen base (weights only) plus the adapters, whose
/// gradients and optimizer state are the only ones (all `adapters` of them, laid out like the
/// layers they wrap).
pub(crate) fn state_bytes(m: &ModelSpec, l: &Layout, lora: Option<&Lora>) -> StateBytes {
    let trained = match lora {
        None => rank_params(m, l),
        Some(lo) => {
            let a = lora_params(m, lo);
            let n = lo.adapters.value.max(1) as f64;
            shard_params(ParamSplit { routed: a.routed * n, other: a.other * n }, l)
        }
    };
    StateBytes {
        weights: base_weight_bytes(m, l),
        adapters: if lora.is_some() { trained.local * l.precision.bytes() } else { 0.0 },
        // Gradients accumulate in FP32 (Megatron's main_grad buffer; FSDP's reduce dtype).
        gradients: trained.local * 4.0,
        optimizer: trained.optimizer * optimizer_bytes_per_param(l.precision),
    }
}

/// Width of one routed expert's MLP in an MoE model: one expert in one MoE layer is
/// (P - A) / (E - k) / MoE layers parameters, 3 x d_model x width of them (SwiGLU gate, up, down).
pub(crate) fn expert_width(m: &ModelSpec) -> f64 {
    let per_expert = div(param_split(m).routed, m.experts as f64);
    div(per_expert, moe_layers(m) as f64 * 3.0 * m.hidden_size as f64)
}

/// Width of a dense layer's MLP: the model's `intermediate_size` when given, else what is left
/// of a layer's parameters after attention, once one vocab x d_model embedding is set aside:
/// ((P - vocab d) / layers - attention) / 3 d (an overestimate when the embeddings are untied).
pub(crate) fn dense_mlp_width(m: &ModelSpec) -> f64 {
    if let Some(f) = m.intermediate_size {
        return f as f64;
    }
    let (h, layers) = (m.hidden_size as f64, m.layers as f64);
    let attention = 2.0 * h * (m.heads * m.head_dim) as f64 + 2.0 * h * (m.kv_heads * m.head_dim) as f64;
    let per_layer = div(m.params as f64 - m.vocab as f64 * h, layers);
    div(per_layer - attention, 3.0 * h).max(0.0)
}

/// (in, out) features of a wrapped linear layer; `mlp` is the MLP width it belongs to.
pub(crate) fn lora_shape(m: &ModelSpec, t: LoraTarget, mlp: f64) -> (f64, f64) {
    let h = m.hidden_size as f64;
    let (q, kv) = ((m.heads * m.head_dim) as f64, (m.kv_heads * m.head_dim) as f64);
    match t {
        LoraTarget::QProj => (h, q),
        LoraTarget::KProj | LoraTarget::VProj => (h, kv),
        LoraTarget::OProj => (q, h),
        LoraTarget::GateProj | LoraTarget::UpProj => (h, mlp),
        LoraTarget::DownProj => (mlp, h),
    }
}

/// Linear layers one target wraps in the whole model, and their MLP width: one per layer for an
/// attention projection; for an MLP projection one per dense layer, and in an MoE model one per
/// routed expert of each MoE layer (PEFT wraps every expert's own linear layer). The dense layers
/// of an MoE model count only when the model gives their width (`intermediate_size`).
pub(crate) fn lora_instances(m: &ModelSpec, t: LoraTarget) -> Vec<(f64, f64, bool)> {
    if !t.is_mlp() {
        return vec![(m.layers as f64, 0.0, false)];
    }
    if param_split(m).routed > 0.0 {
        let mut v = vec![((moe_layers(m) * m.experts) as f64, expert_width(m), true)];
        if let Some(f) = m.intermediate_size.filter(|_| m.dense_layers > 0) {
            v.push((m.dense_layers as f64, f as f64, false));
        }
        v
    } else {
        vec![(m.layers as f64, dense_mlp_width(m), false)]
    }
}

/// One adapter's parameters on one target: rank x (in + out) per wrapped linear layer (A is
/// rank x in, B out x rank), split into those on routed experts and the rest.
pub(crate) fn lora_target_params(m: &ModelSpec, t: LoraTarget, rank: u64) -> ParamSplit {
    let mut s = ParamSplit { routed: 0.0, other: 0.0 };
    for (n, mlp, expert) in lora_instances(m, t) {
        let (i, o) = lora_shape(m, t, mlp);
        let p = n * rank as f64 * (i + o);
        if expert {
            s.routed += p;
        } else {
            s.other += p;
        }
    }
    s
}

/// One adapter's parameters over its target modules.
pub(crate) fn lora_params(m: &ModelSpec, lora: &Lora) -> ParamSplit {
    let mut s = ParamSplit { routed: 0.0, other: 0.0 };
    for &t in &lora.target_modules {
        let p = lora_target_params(m, t, lora.rank.value);
        s.routed += p.routed;
        s.other += p.other;
    }
    s
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
            intermediate_size: None,
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
        let b = state_bytes(&glm5(), &l, None);
        assert!(close(b.optimizer, 279.0e9, 1e-9), "{}", b.optimizer);
        // Weights: 17.29e9 / 8 + 726.71e9 / 32 = 24.87e9 params, 2 bytes each.
        assert!(close(b.weights, 49.74e9, 1e-3), "{}", b.weights);
        assert!(close(b.gradients, 99.48e9, 1e-3), "{}", b.gradients);
    }

    #[test]
    fn dense_megatron_distributed_optimizer_is_6_plus_12_over_d() {
        // Megatron docs: 6 + 12/d bytes per parameter with the distributed optimizer.
        let l = layout(Backend::Megatron, 1, 1, 1, 1, 8);
        let b = state_bytes(&llama8b(), &l, None);
        let p = 8.03e9;
        assert!(close(b.weights + b.gradients + b.optimizer, p * (6.0 + 12.0 / 8.0), 1e-12));
    }

    #[test]
    fn fsdp_and_embedded() {
        let m = llama8b();
        let b = state_bytes(&m, &layout(Backend::Fsdp, 1, 1, 1, 1, 8), None);
        assert!(close(b.optimizer, 8.03e9 * 12.0 / 8.0, 1e-12));
        assert!(close(b.weights, 8.03e9 * 2.0 / 8.0 + 2.0 * 8.03e9 / 32.0 * 2.0, 1e-12));
        let l = Layout { precision: Precision::Fp32, ..layout(Backend::Embedded, 1, 1, 1, 1, 1) };
        let b = state_bytes(&m, &l, None);
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

    /// Qwen3-30B-A3B as std/models has it (config.json: 48 layers, hidden 2048, 32 Q / 4 KV heads
    /// of 128, 128 experts of width 768, top 8).
    fn qwen3_30b() -> ModelSpec {
        ModelSpec {
            name: "Qwen3-30B-A3B".into(),
            params: 30_500_000_000,
            active_params: 3_300_000_000,
            layers: 48,
            hidden_size: 2048,
            heads: 32,
            kv_heads: 4,
            vocab: 151_936,
            experts: 128,
            top_k: 8,
            max_context: 40_960,
            ..llama8b()
        }
    }

    fn lora(rank: u64, adapters: u64, targets: &[LoraTarget]) -> Lora {
        Lora { rank: rank.into(), adapters: adapters.into(), target_modules: targets.to_vec(), span: None }
    }

    const QKVO: &[LoraTarget] = &[LoraTarget::QProj, LoraTarget::KProj, LoraTarget::VProj, LoraTarget::OProj];
    const MLP: &[LoraTarget] = &[LoraTarget::GateProj, LoraTarget::UpProj, LoraTarget::DownProj];

    #[test]
    fn lora_attention_adapters_are_rank_times_in_plus_out_per_layer() {
        // q 2048 -> 4096, k and v 2048 -> 512, o 4096 -> 2048: 17,408 x rank 16 x 48 layers.
        let a = lora_params(&qwen3_30b(), &lora(16, 1, QKVO));
        assert_eq!((a.other, a.routed), (13_369_344.0, 0.0));
        let q = lora_target_params(&qwen3_30b(), LoraTarget::QProj, 16);
        assert_eq!(q.other, 48.0 * 16.0 * (2048.0 + 4096.0));
    }

    #[test]
    fn lora_on_moe_mlp_wraps_every_routed_expert() {
        // One expert of one layer: (30.5e9 - 3.3e9) / 120 / 48 = 4.72M = 3 x 2048 x width, so
        // width 768.6 (config.json: moe_intermediate_size 768).
        let m = qwen3_30b();
        assert!(close(expert_width(&m), 768.0, 1e-3), "{}", expert_width(&m));
        let a = lora_params(&m, &lora(16, 1, MLP));
        assert_eq!(a.other, 0.0);
        assert!(close(a.routed, 3.0 * 16.0 * (2048.0 + 768.6) * 128.0 * 48.0, 1e-4), "{}", a.routed);
        // A dense model wraps one MLP per layer, of the width the record gives or the params leave.
        let dense = lora_params(&llama8b(), &lora(8, 1, &[LoraTarget::DownProj]));
        assert_eq!(dense.routed, 0.0);
        let given = ModelSpec { intermediate_size: Some(14_336), ..llama8b() };
        assert_eq!(lora_params(&given, &lora(8, 1, &[LoraTarget::DownProj])).other, 32.0 * 8.0 * (14_336.0 + 4096.0));
        // Qwen3-4B (tied embeddings): the width left by its parameters is within 0.2% of 9728.
        let qwen3_4b = ModelSpec {
            params: 4_020_000_000,
            active_params: 4_020_000_000,
            layers: 36,
            hidden_size: 2560,
            heads: 32,
            kv_heads: 8,
            vocab: 151_936,
            ..llama8b()
        };
        assert!(close(dense_mlp_width(&qwen3_4b), 9728.0, 2e-3), "{}", dense_mlp_width(&qwen3_4b));
    }

    #[test]
    fn lora_freezes_the_base_same_weights_no_base_gradients_or_optimizer() {
        // Megatron TP2 EP8 DP4 on 8 GPUs: the same model with and without LoRA.
        let (m, l) = (qwen3_30b(), layout(Backend::Megatron, 2, 1, 1, 8, 4));
        let full = state_bytes(&m, &l, None);
        let lo = state_bytes(&m, &l, Some(&lora(16, 1, QKVO)));
        assert_eq!(lo.weights, full.weights);
        assert_eq!(full.adapters, 0.0);
        // Attention adapters split like attention: by TP2; their optimizer state also by DP4.
        let local = 13_369_344.0 / 2.0;
        assert_eq!((lo.adapters, lo.gradients, lo.optimizer), (local * 2.0, local * 4.0, local / 4.0 * 12.0));
        assert!(full.gradients > 17e9 && full.optimizer > 45e9, "{full:?}");
        // Expert adapters split like the experts: by EP8.
        let e = state_bytes(&m, &l, Some(&lora(16, 1, &[LoraTarget::UpProj])));
        let up = lora_target_params(&m, LoraTarget::UpProj, 16).routed;
        assert!(close(e.gradients, up / 8.0 * 4.0, 1e-12), "{e:?}");
    }

    #[test]
    fn two_adapters_double_adapter_state_not_the_base() {
        let (m, l) = (qwen3_30b(), layout(Backend::Fsdp, 1, 1, 1, 1, 8));
        let one = state_bytes(&m, &l, Some(&lora(16, 1, QKVO)));
        let two = state_bytes(&m, &l, Some(&lora(16, 2, QKVO)));
        assert_eq!(two.weights, one.weights);
        assert_eq!(
            (two.adapters, two.gradients, two.optimizer),
            (2.0 * one.adapters, 2.0 * one.gradients, 2.0 * one.optimizer)
        );
    }

    #[test]
    fn div_by_zero_is_zero() {
        assert_eq!(div(1.0, 0.0), 0.0);
        let l = layout(Backend::Megatron, 1, 1, 1, 1, 1);
        let m = ModelSpec { layers: 0, hidden_size: 0, ..llama8b() };
        assert!(activation_bytes(&m, &Layout { pp: 0, cp: 0, ..l }, 0, 0, Some(0), Recompute::Full).is_finite());
        let all = lora(16, 1, &LoraTarget::ALL);
        let moe = ModelSpec { layers: 0, hidden_size: 0, ..qwen3_30b() };
        for m in [&m, &moe] {
            let a = lora_params(m, &all);
            assert!(a.routed.is_finite() && a.other.is_finite() && a.other >= 0.0, "{a:?}");
        }
    }
}
