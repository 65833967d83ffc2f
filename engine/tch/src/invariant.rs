//! Batch-invariant kernels (the `batch_invariant` mode, docs/moe.md "True on-policy"): every
//! output row is reduced from its own inputs alone, in an order fixed by the reduced length, so a
//! token's numbers do not depend on what else is in the batch, nor on whether it is decoded one
//! token at a time against a cache or recomputed with its whole sequence. libtorch's GEMM and
//! fused attention choose kernels and blockings by shape; these are products summed over the
//! contiguous last dimension (one reduction per output element), with attention over every
//! `max_len` key column (masked ones weigh exactly 0), which the sampler and the trainer both
//! lay out by position. Slower than the fused kernels: a mode for fidelity, not speed.

use tch::{Kind, Tensor};

/// Elements of the [rows, out, in] product computed at once.
const CHUNK: i64 = 1 << 22;

/// `x W^T (+ b)`, x [.., in], w [out, in].
pub fn linear(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Tensor {
    let mut shape = x.size();
    let k = *shape.last().unwrap_or(&1);
    let out = w.size()[0];
    let flat = x.reshape([-1, k]);
    let n = flat.size()[0];
    let rows = (CHUNK / (out * k).max(1)).max(1);
    let parts: Vec<Tensor> = (0..n)
        .step_by(rows as usize)
        .map(|s| {
            (flat.narrow(0, s, rows.min(n - s)).unsqueeze(1) * w.unsqueeze(0)).sum_dim_intlist(-1, false, x.kind())
        })
        .collect();
    let y = if parts.is_empty() { Tensor::zeros([0, out], (x.kind(), x.device())) } else { Tensor::cat(&parts, 0) };
    let y = match b {
        Some(b) => y + b,
        None => y,
    };
    if let Some(l) = shape.last_mut() {
        *l = out;
    }
    y.view(&shape[..])
}

/// softmax(q k^T / sqrt(hd), where `allowed`) v for q [B, H, T, hd], k and v [B, H, S, hd] and
/// `allowed` [B, 1, T, S] (true: may attend).
pub fn attention(q: &Tensor, k: &Tensor, v: &Tensor, allowed: &Tensor) -> Tensor {
    let hd = *q.size().last().unwrap_or(&1);
    let scores = (q.unsqueeze(-2) * k.unsqueeze(-3)).sum_dim_intlist(-1, false, q.kind()) * (1.0 / (hd as f64).sqrt());
    let w = scores.masked_fill(&allowed.logical_not(), f64::NEG_INFINITY).softmax(-1, Kind::Float).to_kind(q.kind());
    (w.unsqueeze(-2) * v.transpose(-1, -2).unsqueeze(-3)).sum_dim_intlist(-1, false, q.kind())
}
