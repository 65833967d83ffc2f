//! Weight sync: the chosen transport's estimate and the alternatives', from the trainer and
//! rollout facts.

use super::placement::Placed;
use super::trainer::TrainFacts;
use super::Ctx;
use crate::input::*;
use crate::output::*;
use crate::time::{self, SyncShape};

pub(super) fn plan_syncs(
    cx: &mut Ctx,
    placed: &[Placed],
    trains: &[TrainFacts],
    rollouts: &[RolloutReport],
) -> Vec<SyncReport> {
    let input = cx.input;
    let a = &input.assumptions;
    let mut out = Vec::new();
    for s in &input.syncs {
        let (Some(t), Some(r)) = (trains.iter().find(|t| t.stage == s.from), rollouts.iter().find(|r| r.stage == s.to))
        else {
            continue; // the stage graph checks name the missing end; nothing to estimate
        };
        let rollout_gpu = input.stages.iter().position(|x| x.name == s.to).and_then(|i| cx.device(&placed[i].ranges));
        let hbm_bw = rollout_gpu.map_or(0.0, |g| g.hbm_bandwidth);
        let network_bw = rollout_gpu.map_or(t.network_bw, |g| g.network_bandwidth.min(t.network_bw));
        let shape = SyncShape {
            bytes: t.params * t.precision.bytes(),
            layers: t.layers,
            bucket: s.bucket.value.max(1) as f64,
            train_gpus: t.gpus,
            train_pp: t.pp,
            engines: r.engines,
            gpus_per_engine: r.gpus_per_engine,
            network_bw,
            gpus_per_node: t.gpus_per_node,
            disk_bw: t.disk_bw,
            hbm_bw,
            link_efficiency: a.link_efficiency,
            broadcast_layer_s: a.broadcast_layer_s,
            p2p_layer_s: a.p2p_layer_s,
            requantize_s: a.requantize_s,
        };
        let colocated = input.placement.mode.value == PlacementMode::Colocated;
        let est = |tr: Transport| match tr {
            Transport::Broadcast => time::broadcast(&shape),
            Transport::P2p => time::p2p(&shape),
            Transport::DiskDelta => time::disk_delta(&shape),
            Transport::Local => time::local(&shape),
        };
        let chosen = if colocated { Transport::Local } else { s.transport.value };
        let others: &[Transport] =
            if colocated { &[] } else { &[Transport::Broadcast, Transport::P2p, Transport::DiskDelta] };
        out.push(SyncReport {
            name: s.name.clone(),
            from: s.from.clone(),
            to: s.to.clone(),
            transport: chosen,
            bucket: s.bucket.value,
            bytes: shape.bytes as u64,
            estimate: est(chosen),
            alternatives: others
                .iter()
                .filter(|&&x| x != chosen)
                .map(|&x| TransportEstimate { transport: x, seconds: est(x).seconds })
                .collect(),
        });
    }
    out
}
