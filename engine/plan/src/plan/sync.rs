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
        let ri = input.stages.iter().position(|x| x.name == s.to);
        let ti = input.stages.iter().position(|x| x.name == s.from);
        let rollout_gpu = ri.and_then(|i| cx.device(&placed[i].ranges));
        let hbm_bw = rollout_gpu.map_or(0.0, |g| g.hbm_bandwidth);
        let network_bw = rollout_gpu.map_or(t.network_bw, |g| g.network_bandwidth.min(t.network_bw));
        let scaleup_bw = rollout_gpu.map_or(t.scaleup_bw, |g| g.scaleup_bandwidth.min(t.scaleup_bw));
        // The ring stays on NVLink only when every trainer and rollout GPU is in one node.
        let nodes: Vec<u64> = [ti, ri]
            .into_iter()
            .flatten()
            .flat_map(|i| placed[i].ranges.iter().flat_map(|r| [cx.node_of(r.first), cx.node_of(r.last)]))
            .collect();
        let one_domain = !nodes.is_empty() && nodes.iter().all(|&n| n == nodes[0]);
        // An FP8 (or FP4) engine receives its own format: the trainer quantises before sending.
        let engine_precision = ri.and_then(|i| input.stages[i].engine.as_ref()).map(|e| e.precision.value);
        let bytes_per_param = engine_precision.map_or(t.precision.bytes(), |p| p.bytes().min(t.precision.bytes()));
        let requantize_s = ti
            .and_then(|i| input.stages[i].model.as_ref())
            .and_then(|m| m.update_requantize_s)
            .unwrap_or(a.requantize_s);
        // With LoRA only the adapters move, unquantised and ungathered (the frozen base is never
        // re-sent, so the engines have nothing to requantise); else the whole model, gathered in
        // the trainer's precision before the conversion to the engines'.
        let (bytes, gather_bytes, routed_share, what, requantize_s) = match &t.lora {
            Some(lo) => (lo.sync_bytes as f64, lo.sync_bytes as f64, 0.0, "adapter weights", 0.0),
            None => {
                (t.params * bytes_per_param, t.params * t.precision.bytes(), t.routed_share, "weights", requantize_s)
            }
        };
        let shape = SyncShape {
            bytes,
            gather_bytes,
            routed_share,
            what,
            bucket: s.bucket.value.max(1) as f64,
            train_gpus: t.gpus,
            train_pp: t.pp,
            train_tp: t.tp,
            train_ep: t.ep,
            engines: r.engines,
            gpus_per_engine: r.gpus_per_engine,
            one_domain,
            network_bw,
            scaleup_bw,
            gpus_per_node: t.gpus_per_node,
            disk_bw: t.disk_bw,
            hbm_bw,
            link_efficiency: a.sync_link_efficiency,
            bucket_prep_s: a.bucket_prep_s,
            ring_step_bytes: a.ring_step_bytes,
            replica_bytes_per_s: a.replica_bytes_per_s,
            rdma_write_latency_s: a.rdma_write_latency_s,
            gather_nics: a.gather_nics,
            requantize_s,
        };
        let colocated = input.placement.mode.value == PlacementMode::Colocated;
        let est = |tr: Transport| {
            let mut e = match tr {
                Transport::Broadcast => time::broadcast(&shape),
                Transport::P2p => time::p2p(&shape),
                Transport::DiskDelta => time::disk_delta(&shape),
                Transport::Local => time::local(&shape),
            };
            if let Some(lo) = &t.lora {
                e.assumptions.insert(
                    0,
                    format!(
                        "LoRA: only the adapters move ({}), in {}; the frozen base stays on the engines",
                        lo.summary,
                        t.precision.as_str()
                    ),
                );
            }
            e
        };
        let chosen = if colocated { Transport::Local } else { s.transport.value };
        let others: &[Transport] =
            if colocated { &[] } else { &[Transport::Broadcast, Transport::P2p, Transport::DiskDelta] };
        out.push(SyncReport {
            name: s.name.clone(),
            from: s.from.clone(),
            to: s.to.clone(),
            transport: chosen,
            channel: s.channel,
            bucket: s.bucket.value,
            bytes: shape.bytes as u64,
            lora: t.lora.is_some(),
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
