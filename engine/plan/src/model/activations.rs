//! Activation memory of the trainer's layers under tensor, sequence and pipeline parallelism
//! (Korthikanti et al. 2022), the FP32 logits, and the micro-batches a pipeline keeps in flight.

use super::*;

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
    layer_stack_activation_bytes(m, l, seq_len, micro_batch, micro_batches, recompute)
        + logits_bytes(m, l, seq_len, micro_batch)
}

/// `activation_bytes` without the logits: the layers' activations on the busiest rank (and,
/// under full recomputation, the one layer being recomputed).
pub(crate) fn layer_stack_activation_bytes(
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
    let in_flight = in_flight(l, micro_batches);
    let per_layer = layer_activation_bytes(s, b, h, tp, recompute);
    let mut total = per_layer * layers_per_stage * in_flight;
    if recompute == Recompute::Full {
        total += layer_activation_bytes(s, b, h, tp, Recompute::Off);
    }
    total
}

/// The FP32 logits of one micro-batch on the last pipeline stage, split over TP by the
/// vocabulary-parallel head: s b vocab x 4 / TP.
pub(crate) fn logits_bytes(m: &ModelSpec, l: &Layout, seq_len: u64, micro_batch: u64) -> f64 {
    let s = div(seq_len as f64, l.cp as f64);
    div(s * micro_batch as f64 * m.vocab as f64 * 4.0, l.tp as f64)
}

/// Micro-batches whose activations the busiest rank holds at once: `min(pp, micro-batches)`
/// under 1F1B (all `pp` when the micro-batch count is unknown).
pub(crate) fn in_flight(l: &Layout, micro_batches: Option<u64>) -> f64 {
    micro_batches.map_or(l.pp, |n| n.clamp(1, l.pp.max(1))) as f64
}
