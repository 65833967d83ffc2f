//! A trainer rank that does not fit (E0401): by how much, and the changes that would make it fit,
//! each priced as the same rank with that one change.

use super::memory::{Budget, Rank, TrainMem};
use super::offload::OffloadCost;
use crate::input::*;
use crate::model::Layout;
use crate::plan::Ctx;
use crate::units::{bytes_fixed, gb_fixed};
use miles_grammar::diag::Diagnostic;
use miles_grammar::diag::ErrorCode;

/// E0401 for a rank of `total` bytes over its budget, with the fixes in its help.
#[allow(clippy::too_many_arguments)]
pub(super) fn report_over(
    cx: &mut Ctx,
    st: &Stage,
    m: &ModelSpec,
    rank: &Rank,
    mem: &TrainMem,
    total: f64,
    budget: &Budget,
    gpus: u64,
    cost: &OffloadCost,
) {
    let t = rank.t;
    let over = total - budget.usable;
    let mut fixes = train_fixes(cx, m, rank, mem, budget.usable, gpus, cost);
    if let (true, Some(h)) = (budget.local_gpu, &cx.input.cluster.host) {
        // On the GPU of a `local` cluster: the host's memory is the other place it can run.
        let host_usable = h.memory as f64 * budget.share;
        fixes.push(format!(
            "`device = cpu` (the host, slower): {} usable ({})",
            gb_fixed(host_usable),
            if total <= host_usable {
                "fits".to_string()
            } else {
                format!("still {} over", gb_fixed(total - host_usable))
            }
        ));
    }
    let ranks = rank.ranks();
    let message = if ranks > 1 {
        // A data-parallel embedded trainer: its ranks share the machine (`budget.usable` is one
        // rank's share).
        format!(
            "{} does not fit: {} per trainer rank, and its {ranks} ranks share {}'s {} usable ({} x {:.0}%), {} each; over by {}",
            st.name,
            bytes_fixed(total),
            budget.device,
            bytes_fixed(budget.usable * ranks as f64),
            gb_fixed(budget.capacity as f64),
            budget.share * 100.0,
            bytes_fixed(budget.usable),
            bytes_fixed(over)
        )
    } else {
        format!(
            "{} does not fit in GPU memory: {} per GPU, {} has {} usable ({} x {:.0}%); over by {}",
            st.name,
            gb_fixed(total),
            budget.device,
            gb_fixed(budget.usable),
            gb_fixed(budget.capacity as f64),
            budget.share * 100.0,
            gb_fixed(over)
        )
    };
    let mut d = Diagnostic::error(ErrorCode::E0401, message).with_help(format!("fixes: {}", fixes.join("; ")));
    if let Some(sp) = st.span {
        let unit = if ranks > 1 { "trainer rank" } else { "GPU" };
        d = d.with_primary(sp, format!("needs {} per {unit}", gb_fixed(total)));
    }
    if t.optimizer_offload.value == OptimizerOffload::OnGpu {
        if let Some(sp) = t.optimizer_offload.span {
            d = d.with_secondary(sp, format!("optimizer state ({}) stays in HBM", gb_fixed(mem.all_optimizer())));
        }
    }
    cx.diags.push(d);
}

/// The changes that would make the rank fit in `usable` bytes, in the order a practitioner tries
/// them: full recomputation, optimizer offload (either way), ZeRO-1 or more data-parallel GPUs,
/// twice the pipeline stages.
pub(super) fn train_fixes(
    cx: &Ctx,
    m: &ModelSpec,
    rank: &Rank,
    mem: &TrainMem,
    usable: f64,
    gpus: u64,
    cost: &OffloadCost,
) -> Vec<String> {
    let (l, t) = (rank.l, rank.t);
    let mut fixes = Vec::new();
    let offload = t.optimizer_offload.value;
    let verdict = |x: f64| {
        if x <= usable {
            "fits".to_string()
        } else {
            format!("still {} over", gb_fixed(x - usable))
        }
    };
    // The same rank with another layout or recomputation, priced as a GPU rank.
    let what_if = |l: &Layout, recompute: Recompute| Rank { l, recompute, host: None, ..*rank }.mem(m).on_gpu(offload);
    // First what a practitioner reaches for first: recomputing activations costs compute, not
    // memory traffic. `recompute` is a field of `megatron` and `fsdp` only (std/prelude).
    if matches!(l.backend, Backend::Megatron | Backend::Fsdp) && t.recompute.value != Recompute::Full {
        let full = Rank { l, recompute: Recompute::Full, host: None, ..*rank }.mem(m);
        let x = full.on_gpu(offload);
        fixes.push(format!(
            "`recompute = full`: activations {} -> {}, {} per GPU ({})",
            gb_fixed(mem.policy.activations),
            gb_fixed(full.policy.activations),
            gb_fixed(x),
            verdict(x)
        ));
    }
    if offload != OptimizerOffload::StreamFromDisk {
        let x = mem.on_gpu(OptimizerOffload::StreamFromDisk);
        fixes.push(format!(
            "`optimizer = adam {{ state = stream_from_disk }}`: {} per GPU ({}), est. +{:.1} s per step",
            gb_fixed(x),
            verdict(x),
            cost.stream(mem.all_optimizer()).seconds
        ));
    }
    if offload != OptimizerOffload::Cpu {
        let x = mem.on_gpu(OptimizerOffload::Cpu);
        fixes.push(format!(
            "`optimizer = adam {{ state = cpu }}`: {} per GPU ({}), needs {} host memory per GPU, est. +{:.1} s per step",
            gb_fixed(x),
            verdict(x),
            gb_fixed(mem.all_optimizer()),
            cost.cpu(mem.all_optimizer()).seconds
        ));
    }
    // A data-parallel embedded trainer: ZeRO-1 keeps 1/N of the Adam moments on each rank.
    let plain_dp = t.data_parallel.as_ref().filter(|d| d.zero.value == Zero::None && d.ranks.value > 1);
    if let Some(d) = plain_dp.filter(|_| offload == OptimizerOffload::OnGpu) {
        let n = d.ranks.value as f64;
        let x = mem.on_gpu(offload) - mem.all_optimizer() * (1.0 - 1.0 / n);
        // A laptop's rank is megabytes: `bytes_fixed` shows them.
        let left = if x <= usable { "fits".to_string() } else { format!("still {} over", bytes_fixed(x - usable)) };
        fixes.push(format!(
            "`zero = optimizer` (ZeRO-1 over the {} ranks): {} per rank ({left})",
            d.ranks.value,
            bytes_fixed(x)
        ));
    }
    if l.backend != Backend::Embedded && (offload == OptimizerOffload::OnGpu || l.backend == Backend::Fsdp) {
        // More data-parallel replicas shard the optimizer state (and, under FSDP, everything).
        // Only layouts the cluster can hold.
        for k in [2u64, 4, 8, 16].into_iter().filter(|k| gpus.saturating_mul(*k) <= cx.total_gpus) {
            let l2 = Layout { dp: l.dp * k, ..*l };
            let x = what_if(&l2, t.recompute.value);
            if x <= usable {
                fixes.push(format!("{} GPUs for this stage (DP{}): {} per GPU", gpus * k, l2.dp, gb_fixed(x)));
                break;
            }
        }
    }
    if l.backend == Backend::Megatron && m.layers >= 2 * l.pp && l.dp.is_multiple_of(2) {
        let l2 = Layout { pp: l.pp * 2, dp: l.dp / 2, ..*l };
        let x = what_if(&l2, t.recompute.value);
        fixes.push(format!("PP{} DP{} on the same GPUs: {} per GPU ({})", l2.pp, l2.dp, gb_fixed(x), verdict(x)));
    }
    fixes
}
