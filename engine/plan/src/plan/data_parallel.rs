//! A data-parallel embedded trainer (`embedded_trainer { dp > 1 }`; docs/plan.md, "Data-parallel
//! embedded trainers"): N trainer processes, rank r training the micro-batches k with k % N == r
//! of every optimizer step, the gradients summed by c10d all-reduces in buckets, every rank then
//! taking the same optimizer step (under ZeRO-1 each its own share of the parameters, broadcast
//! to the others after). Here: the ranks' share of the micro-batches and what they exchange. The
//! compute of a rank is `embedded::train_step`'s, its memory `trainer/memory.rs`'s.

use crate::evidence::{sources, Evidence};
use crate::input::*;
use crate::model::div;
use crate::output::{DataParallelReport, Estimate};
use crate::units::gb;

/// Seconds of an all-reduce of `bytes` over `ranks` at bus bandwidth `bw` (nccl-tests'
/// convention, which Gloo's ring follows: each rank sends and receives 2 (N - 1) / N of the
/// buffer). One rank exchanges nothing.
pub(crate) fn all_reduce_seconds(bytes: f64, ranks: u64, bw: f64) -> f64 {
    if ranks <= 1 {
        return 0.0;
    }
    let n = ranks as f64;
    div(bytes * 2.0 * (n - 1.0) / n, bw)
}

/// Seconds to broadcast `bytes` from one rank to the others at bus bandwidth `bw` (nccl-tests'
/// convention: the buffer crosses each link once).
pub(crate) fn broadcast_seconds(bytes: f64, ranks: u64, bw: f64) -> f64 {
    if ranks <= 1 {
        return 0.0;
    }
    div(bytes, bw)
}

/// Micro-batches the busiest of `ranks` trains out of `micros`: rank r takes those with
/// k % N == r, so ceil(micros / N).
pub(crate) fn micro_batches_per_rank(micros: u64, ranks: u64) -> u64 {
    micros.div_ceil(ranks.max(1))
}

/// What the ranks exchange per optimizer step: the FP32 gradients of `trained_params` (the
/// trainable parameters: the adapters under LoRA, PPO's critic's too) all-reduced in buckets of
/// `dp.bucket_bytes`, and under ZeRO-1 the same parameters' updated FP32 values, each owner's
/// share broadcast to the others (all the shares: the whole of them). `steps_per_rollout`
/// optimizer steps make a rollout step (`collective_s`).
pub(super) fn exchange(
    a: &Assumptions,
    dp: &DataParallel,
    trained_params: f64,
    micros: u64,
    steps_per_rollout: u64,
) -> DataParallelReport {
    let ranks = dp.ranks.value.max(1);
    let bw = a.collective_bytes_per_s;
    let gradient_bytes = 4.0 * trained_params;
    let buckets = (gradient_bytes as u64).div_ceil(dp.bucket_bytes.max(1)).max(1);
    let all_reduce_s = all_reduce_seconds(gradient_bytes, ranks, bw);
    let zero = dp.zero.value == Zero::Optimizer;
    let broadcast_bytes = if zero { 4.0 * trained_params } else { 0.0 };
    let broadcast_s = broadcast_seconds(broadcast_bytes, ranks, bw);
    let mut assumptions = vec![format!(
        "all-reduce of the FP32 gradients: {} in {buckets} bucket{} of at most {}: 2 x ({ranks} - 1) / {ranks} x {} / {:.1} GB/s = {:.1} ms, after the backward passes (not overlapped)",
        gb(gradient_bytes as u64),
        if buckets == 1 { "" } else { "s" },
        gb(dp.bucket_bytes),
        gb(gradient_bytes as u64),
        bw / 1e9,
        all_reduce_s * 1e3
    )];
    if zero {
        assumptions.push(format!(
            "ZeRO-1: each rank updates the parameters it owns, then broadcasts them: {} / {:.1} GB/s = {:.1} ms",
            gb(broadcast_bytes as u64),
            bw / 1e9,
            broadcast_s * 1e3
        ));
    }
    assumptions.push(format!(
        "c10d (Gloo) between the trainer processes at {:.1} GB/s bus bandwidth (measured over loopback: bench/RESULTS.md, \"Data-parallel trainers\"); per-call latency and the ranks' skew not counted",
        bw / 1e9
    ));
    let seconds = all_reduce_s + broadcast_s;
    DataParallelReport {
        ranks,
        zero: dp.zero.value.as_str().to_string(),
        micro_batches: micros,
        micro_batches_per_rank: micro_batches_per_rank(micros, ranks),
        gradient_bytes: gradient_bytes as u64,
        bucket_bytes: dp.bucket_bytes,
        buckets,
        all_reduce_s,
        broadcast_bytes: broadcast_bytes as u64,
        broadcast_s,
        collective: Estimate { seconds, assumptions, evidence: Evidence::measured(sources::COLLECTIVE) },
        collective_s: seconds * steps_per_rollout as f64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dp(ranks: u64, zero: Zero) -> DataParallel {
        DataParallel { ranks: Spanned::new(ranks), zero: Spanned::new(zero), bucket_bytes: 25_000_000, timeout_s: 120 }
    }

    /// The ring all-reduce moves 2 (N - 1) / N of the buffer: 1 GB over 2 ranks at 1 GB/s is 1 s,
    /// over 4 ranks 1.5 s, and tends to 2 s; one rank moves nothing.
    #[test]
    fn all_reduce_time_by_hand() {
        assert_eq!(all_reduce_seconds(1e9, 1, 1e9), 0.0);
        assert!((all_reduce_seconds(1e9, 2, 1e9) - 1.0).abs() < 1e-12);
        assert!((all_reduce_seconds(1e9, 4, 1e9) - 1.5).abs() < 1e-12);
        assert!((all_reduce_seconds(1e9, 8, 2e9) - 0.875).abs() < 1e-12);
        assert!((all_reduce_seconds(1e9, 1000, 1e9) - 1.998).abs() < 1e-12);
        // A bandwidth of 0 (unknown) prices nothing rather than dividing by it.
        assert_eq!(all_reduce_seconds(1e9, 2, 0.0), 0.0);
        assert!((broadcast_seconds(5e8, 2, 1e9) - 0.5).abs() < 1e-12);
        assert_eq!(broadcast_seconds(5e8, 1, 1e9), 0.0);
    }

    #[test]
    fn the_busiest_rank_takes_the_ceiling() {
        assert_eq!(micro_batches_per_rank(1, 2), 1);
        assert_eq!(micro_batches_per_rank(2, 2), 1);
        assert_eq!(micro_batches_per_rank(5, 2), 3);
        assert_eq!(micro_batches_per_rank(8, 4), 2);
        assert_eq!(micro_batches_per_rank(3, 0), 3);
    }

    /// 100M trainable parameters: 400 MB of FP32 gradients in 16 buckets of 25 MB, all-reduced over
    /// 2 ranks at 1 GB/s in 0.4 s; ZeRO-1 broadcasts the same 400 MB of parameters in 0.4 s more;
    /// two optimizer steps a rollout step double it.
    #[test]
    fn exchange_sums_the_all_reduce_and_zeros_broadcast() {
        let a = Assumptions { collective_bytes_per_s: 1e9, ..Assumptions::default() };
        let plain = exchange(&a, &dp(2, Zero::None), 1e8, 5, 2);
        assert_eq!((plain.gradient_bytes, plain.buckets), (400_000_000, 16));
        assert_eq!((plain.micro_batches, plain.micro_batches_per_rank), (5, 3));
        assert!((plain.all_reduce_s - 0.4).abs() < 1e-12);
        assert_eq!((plain.broadcast_bytes, plain.broadcast_s), (0, 0.0));
        assert!((plain.collective.seconds - 0.4).abs() < 1e-12);
        assert!((plain.collective_s - 0.8).abs() < 1e-12);
        let zero = exchange(&a, &dp(2, Zero::Optimizer), 1e8, 5, 2);
        assert_eq!(zero.zero, "optimizer");
        assert!((zero.broadcast_s - 0.4).abs() < 1e-12);
        assert!((zero.collective.seconds - 0.8).abs() < 1e-12);
        assert!(zero.collective.assumptions.iter().any(|n| n.contains("ZeRO-1")), "{:?}", zero.collective.assumptions);
        // The bandwidth is the one assumption named: its placeholder default is in the note.
        let d = exchange(&Assumptions::default(), &dp(2, Zero::None), 1e8, 5, 1);
        assert!((d.all_reduce_s - 0.4 * 1e9 / LOCAL_COLLECTIVE_BYTES_PER_S).abs() < 1e-12);
        assert!(d.collective.assumptions.iter().any(|n| n.contains("bench/RESULTS.md")));
    }
}
