//! Colocated placement: rollout and training alternate on the same GPUs. Either both fit in
//! HBM at once (the per-GPU sum), or every phase switch evicts the idle actor to host memory and
//! reloads the other (Miles §3.2), which this module prices.

use super::Ctx;
use crate::evidence::{sources, Evidence};
use crate::input::*;
use crate::model::div;
use crate::output::*;
use crate::units::{gb_fixed, gbs};

/// Share of the GPU-host link an offload (device to host) reaches. Fitted to the one figure we
/// have, Miles §3.2: Qwen3-30B-A3B's actor offload takes 5.2 s with eviction, under our
/// assumption of 8 H100 with the state fully sharded (docs/plan.md, `tests::miles_3_2`).
/// Reloads run at `link_efficiency` (the same test checks §3.2's 1.3 s reload).
pub const OFFLOAD_LINK_EFFICIENCY: f64 = 0.16;

/// Bytes one GPU moves at a switch.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Switch {
    /// Trainer weights + optimizer state on the GPU (gradients are freed, not copied).
    pub train_state: f64,
    /// Engine weights (the KV cache is dropped and reallocated, not copied).
    pub engine_weights: f64,
    pub host_link: f64,
    pub offload_efficiency: f64,
    pub reload_efficiency: f64,
}

/// Per rollout step: the trainer offloads and the engine reloads before generation, the engine
/// offloads and the trainer reloads before training. Returns (offload s, reload s).
pub(crate) fn switch_s(s: &Switch) -> (f64, f64) {
    let bytes = s.train_state + s.engine_weights;
    (div(bytes, s.host_link * s.offload_efficiency), div(bytes, s.host_link * s.reload_efficiency))
}

pub(super) fn plan_colocation(cx: &Ctx, memory: &[MemoryReport]) -> Option<ColocationReport> {
    let input = cx.input;
    if input.placement.mode.value != PlacementMode::Colocated {
        return None;
    }
    let a = &input.assumptions;
    let rollout = input.stages.iter().find(|s| s.role == Role::Rollout && s.engine.is_some())?;
    let train = input.stages.iter().find(|s| s.role.trains() && s.trainer.is_some())?;
    let rm = memory.iter().find(|m| m.stage == rollout.name)?;
    let tm = memory.iter().find(|m| m.stage == train.name)?;
    let item = |m: &MemoryReport, n: &str| m.items.iter().find(|i| i.name == n).map_or(0.0, |i| i.bytes as f64);
    let resident = (rm.total + tm.total) as f64;
    let usable = tm.usable.min(rm.capacity) as f64;
    let gpu = input.cluster.pools.first().map(|p| &p.gpu)?;
    let sw = Switch {
        // PPO's critic and OPD's teacher are evicted with the policy (their items are absent
        // without them).
        train_state: item(tm, "weights")
            + item(tm, "adapters")
            + item(tm, "optimizer")
            + item(tm, "critic_weights")
            + item(tm, "critic_optimizer")
            + item(tm, "teacher_weights"),
        engine_weights: item(rm, "weights"),
        host_link: gpu.host_link_bandwidth,
        offload_efficiency: a.offload_link_efficiency,
        reload_efficiency: a.link_efficiency,
    };
    let (off, on) = switch_s(&sw);
    let fits_resident = resident <= usable;
    let seconds = if fits_resident { 0.0 } else { off + on };
    Some(ColocationReport {
        resident_bytes: resident as u64,
        usable_bytes: usable as u64,
        fits_resident,
        offload_bytes: (sw.train_state + sw.engine_weights) as u64,
        offload_s: off,
        reload_s: on,
        switch: Estimate {
            seconds,
            assumptions: vec![
                format!(
                    "resident together: {} (rollout {} + train {}) per GPU, {} usable: {}",
                    gb_fixed(resident),
                    gb_fixed(rm.total as f64),
                    gb_fixed(tm.total as f64),
                    gb_fixed(usable),
                    if fits_resident { "no eviction needed" } else { "the idle actor is evicted at each switch" }
                ),
                format!(
                    "evicted per GPU: trainer weights + optimizer {} and engine weights {}; KV cache and gradients dropped, not copied",
                    gb_fixed(sw.train_state),
                    gb_fixed(sw.engine_weights)
                ),
                format!(
                    "offload {:.1} s at {} ({:.0}% of the {} host link, fitted to Miles §3.2), reload {:.1} s at {:.0}%",
                    off,
                    gbs(sw.host_link * sw.offload_efficiency),
                    sw.offload_efficiency * 100.0,
                    gbs(sw.host_link),
                    on,
                    sw.reload_efficiency * 100.0
                ),
            ], evidence: Evidence::fitted(sources::OFFLOAD) },
        share_of_step: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Miles §3.2, Qwen3-30B-A3B (30.5B): actor offload 5.2 s and reload 1.3 s with eviction.
    /// Assumed: 8 H100 (64 GB/s PCIe Gen5 each), weights (BF16) and optimizer (12 B/param)
    /// sharded over the 8; the engine's weights are not part of the actor's figure.
    #[test]
    fn miles_3_2() {
        let p = 30.5e9;
        let sw = Switch {
            train_state: (2.0 + 12.0) * p / 8.0,
            engine_weights: 0.0,
            host_link: 64e9,
            offload_efficiency: OFFLOAD_LINK_EFFICIENCY,
            reload_efficiency: 0.8,
        };
        let (off, on) = switch_s(&sw);
        assert!((off - 5.2).abs() / 5.2 < 0.15, "offload {off:.2} s");
        assert!((on - 1.3).abs() / 1.3 < 0.25, "reload {on:.2} s");
    }
}
