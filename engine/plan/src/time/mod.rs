//! Time formulas. Each returns seconds with the assumptions it used, as text for the plan.
//! Weight sync has a module of its own (`sync`).

mod sync;
pub(crate) use sync::*;

use crate::model::div;

/// Tokens per second of one engine, decode only: a step reads the GPU's weights (the experts
/// the batch touches) and the batch's KV cache from HBM, or is compute-bound, whichever is slower.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct DecodeShape {
    pub batch: f64,
    pub dense_weight_bytes: f64,
    pub expert_weight_bytes: f64,
    pub experts_touched: f64,
    /// KV bytes the step reads on one GPU.
    pub kv_read_bytes: f64,
    pub hbm_bw: f64,
    pub bw_efficiency: f64,
    /// FLOPs of the step on one GPU.
    pub flops: f64,
    pub peak_flops: f64,
    pub mfu: f64,
}

pub(crate) fn decode_step_s(d: &DecodeShape) -> (f64, bool) {
    let bytes = d.dense_weight_bytes + d.expert_weight_bytes * d.experts_touched + d.kv_read_bytes;
    let mem = div(bytes, d.hbm_bw * d.bw_efficiency);
    let compute = div(d.flops, d.peak_flops * d.mfu);
    (mem.max(compute), compute > mem)
}

/// Training FLOPs per token: 6 x active parameters (forward + backward), 2 more for the
/// recomputed forward under full recomputation, 2 more for the log-probs of the old policy,
/// plus causal attention 6 x layers x seq x heads x head_dim (fwd+bwd).
pub(crate) fn train_flops_per_token(active: f64, layers: f64, seq: f64, attn_width: f64, full_recompute: bool) -> f64 {
    let dense = if full_recompute { 8.0 } else { 6.0 } * active + 2.0 * active;
    dense + 6.0 * layers * seq * attn_width
}

/// PPO's critic per token, in the same FLOP model (docs/plan.md, "PPO"): 2 x its active
/// parameters for the forward pass that computes the values (no grad), 6 x for the value loss's
/// forward + backward (8 x under full recomputation), plus that pass's causal attention
/// 6 x layers x seq x heads x head_dim.
pub(crate) fn critic_flops_per_token(
    critic_active: f64,
    layers: f64,
    seq: f64,
    attn_width: f64,
    full_recompute: bool,
) -> f64 {
    let values = 2.0 * critic_active;
    let value_loss = if full_recompute { 8.0 } else { 6.0 } * critic_active;
    values + value_loss + 6.0 * layers * seq * attn_width
}

/// On-policy distillation's teacher per token (docs/plan.md, "On-policy distillation: the
/// teacher"): one no-grad forward, as the policy's old log-probs: 2 x its active parameters plus
/// the forward's share of causal attention, 2 x layers x seq x heads x head_dim (a third of the
/// 6 x fwd + bwd in `train_flops_per_token`), all of the teacher's own shape.
pub(crate) fn teacher_flops_per_token(teacher_active: f64, layers: f64, seq: f64, attn_width: f64) -> f64 {
    2.0 * teacher_active + 2.0 * layers * seq * attn_width
}

/// Work of the embedded backend (docs/plan.md, "Step time on a CPU host", "Step time on a GPU"):
/// matmul FLOPs, ATen ops ("kernels", each with a fixed dispatch cost) and bytes the non-matmul
/// ops write. Counted once (plan/embedded.rs), priced at a CPU's or a GPU's `Rate`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Work {
    pub flops: f64,
    pub kernels: f64,
    pub bytes: f64,
}

impl Work {
    pub(crate) fn scale(self, k: f64) -> Work {
        Work { flops: self.flops * k, kernels: self.kernels * k, bytes: self.bytes * k }
    }
}

impl std::ops::Add for Work {
    type Output = Work;
    fn add(self, o: Work) -> Work {
        Work { flops: self.flops + o.flops, kernels: self.kernels + o.kernels, bytes: self.bytes + o.bytes }
    }
}

/// The rates `Work` runs at: one libtorch thread of the host (`embedded::rate`), or the GPU the
/// process computes on (`gpu::rate`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Rate {
    /// Effective matmul rate, FLOP/s.
    pub flops_per_s: f64,
    /// Cost of one ATen op, s: dispatch on the CPU; on a GPU the host-side launch, the bound
    /// while kernels are shorter than it.
    pub kernel_s: f64,
    /// Effective rate at which the non-matmul ops write, bytes/s.
    pub bytes_per_s: f64,
    /// A sampled token's device-to-host read of the logits, s (0 on the CPU: nothing to copy).
    pub sync_s: f64,
}

/// FLOPs / effective FLOP/s + kernels x per-kernel cost + bytes / effective bandwidth: libtorch's
/// CPU ops run one after another on one thread, so their costs add; on a GPU eager libtorch
/// launches the same ops one after another, and the sum is taken as the same bound (no overlap
/// of the host's launches with the kernels is credited).
pub(crate) fn work_seconds(w: &Work, r: &Rate) -> f64 {
    div(w.flops, r.flops_per_s) + w.kernels * r.kernel_s + div(w.bytes, r.bytes_per_s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_is_bandwidth_or_compute_bound() {
        let d = DecodeShape {
            batch: 1.0,
            dense_weight_bytes: 10e9,
            expert_weight_bytes: 0.0,
            experts_touched: 1.0,
            kv_read_bytes: 0.0,
            hbm_bw: 2e12,
            bw_efficiency: 0.5,
            flops: 1e9,
            peak_flops: 1e15,
            mfu: 0.5,
        };
        // 10 GB at 1 TB/s = 10 ms.
        assert_eq!(decode_step_s(&d), (0.01, false));
        let d = DecodeShape { flops: 1e14, ..d };
        assert_eq!(decode_step_s(&d), (0.2, true));
    }

    #[test]
    fn cpu_seconds_adds_the_three_terms() {
        let w = Work { flops: 2e9, kernels: 100.0, bytes: 1e8 };
        let r = Rate { flops_per_s: 1e9, kernel_s: 1e-5, bytes_per_s: 1e9, sync_s: 0.0 };
        // 2 s of matmuls + 1 ms of dispatch + 0.1 s of writes.
        assert!((work_seconds(&w, &r) - 2.101).abs() < 1e-12);
        assert_eq!((w + w).scale(0.5), w);
    }

    #[test]
    fn train_flops() {
        // 1B active, no attention: 8 FLOPs per parameter (6 + 2 for old log-probs).
        assert_eq!(train_flops_per_token(1e9, 0.0, 0.0, 0.0, false), 8e9);
        assert_eq!(train_flops_per_token(1e9, 0.0, 0.0, 0.0, true), 10e9);
        assert_eq!(train_flops_per_token(0.0, 2.0, 10.0, 3.0, false), 360.0);
    }

    #[test]
    fn teacher_flops() {
        // 1B-parameter teacher, no attention: one forward, 2 per parameter.
        assert_eq!(teacher_flops_per_token(1e9, 0.0, 0.0, 0.0), 2e9);
        // Attention only: 2 x 2 layers x 10 seq x 3 width.
        assert_eq!(teacher_flops_per_token(0.0, 2.0, 10.0, 3.0), 120.0);
    }

    #[test]
    fn critic_flops() {
        // 1B-parameter critic, no attention: 2 (values) + 6 (value loss fwd + bwd) per parameter.
        assert_eq!(critic_flops_per_token(1e9, 0.0, 0.0, 0.0, false), 8e9);
        // Full recomputation reruns the value loss's forward.
        assert_eq!(critic_flops_per_token(1e9, 0.0, 0.0, 0.0, true), 10e9);
        // Attention of the forward + backward: 6 x 2 layers x seq 10 x width 3.
        assert_eq!(critic_flops_per_token(0.0, 2.0, 10.0, 3.0, false), 360.0);
    }
}
