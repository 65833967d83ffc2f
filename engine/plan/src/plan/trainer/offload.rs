//! Optimizer state off the GPU: streamed from the node's disk each step, or kept in host memory
//! with the update on the CPU, and what either costs per optimizer step (E0408 when the host
//! memory of a node cannot hold it).

use super::memory::TrainMem;
use crate::evidence::{sources, Evidence};
use crate::input::*;
use crate::model::{self, div};
use crate::output::*;
use crate::plan::Ctx;
use crate::units::gb_fixed;
use miles_grammar::diag::ErrorCode;

/// The links an offload moves optimizer state over, for one trainer stage.
pub(super) struct OffloadCost {
    /// GPUs of the stage on one node (sharing its disk).
    gpn: u64,
    eff: f64,
    host_link: f64,
    pub(super) disk_bw: f64,
    precision: Precision,
}

impl OffloadCost {
    pub(super) fn new(a: &Assumptions, device: Option<&GpuSpec>, gpus: u64, precision: Precision) -> OffloadCost {
        OffloadCost {
            gpn: device.map_or(1, |g| g.gpus_per_node.max(1)).min(gpus),
            eff: a.link_efficiency,
            host_link: device.map_or(0.0, |g| g.host_link_bandwidth),
            disk_bw: device.and_then(|g| g.disk_bandwidth).unwrap_or(a.disk_bandwidth),
            precision,
        }
    }

    /// `opt` bytes of optimizer state per GPU read from and written back to disk each step.
    pub(super) fn stream(&self, opt: f64) -> Estimate {
        let (gpn, eff, host_link, disk_bw) = (self.gpn, self.eff, self.host_link, self.disk_bw);
        let per_node = 2.0 * opt * gpn as f64;
        let disk = div(per_node, disk_bw);
        let link = div(2.0 * opt, host_link * eff);
        Estimate {
            seconds: disk.max(link),
            assumptions: vec![
                format!("read + write {} of optimizer state per GPU each step, {} GPUs per node", gb_fixed(opt), gpn),
                format!(
                    "node disk {:.0} GB/s; GPU-host link {:.0} GB/s x {:.0}%",
                    disk_bw / 1e9,
                    host_link / 1e9,
                    eff * 100.0
                ),
                "transfers not overlapped with compute (upper bound)".into(),
            ],
            evidence: Evidence::assumed(sources::DISK),
        }
    }

    /// `opt` bytes of optimizer state per GPU kept in host memory: gradients go down and updated
    /// weights come up each step.
    pub(super) fn cpu(&self, opt: f64) -> Estimate {
        let (eff, host_link) = (self.eff, self.host_link);
        let params = opt / model::optimizer_bytes_per_param(self.precision);
        let bytes = params * (4.0 + self.precision.bytes());
        Estimate {
            seconds: div(bytes, host_link * eff),
            assumptions: vec![
                format!("FP32 gradients down and updated weights up: {} per GPU per step", gb_fixed(bytes)),
                format!("GPU-host link {:.0} GB/s x {:.0}%; CPU Adam time not counted", host_link / 1e9, eff * 100.0),
            ],
            evidence: Evidence::fitted(sources::OFFLOAD),
        }
    }
}

/// The trainer's offload and its cost per optimizer step; `None` with the state on the GPU.
pub(super) fn offload_report(
    cx: &mut Ctx,
    st: &Stage,
    t: &Trainer,
    device: Option<&GpuSpec>,
    mem: &TrainMem,
    cost: &OffloadCost,
) -> Option<OffloadReport> {
    match t.optimizer_offload.value {
        OptimizerOffload::OnGpu => None,
        OptimizerOffload::StreamFromDisk => Some(OffloadReport {
            mode: "stream_from_disk".into(),
            bytes_per_gpu: mem.all_optimizer() as u64,
            host_bytes_per_node: 0,
            per_step: cost.stream(mem.all_optimizer()),
        }),
        OptimizerOffload::Cpu => {
            let host = mem.all_optimizer() * cost.gpn as f64;
            if let Some(hm) = device.and_then(|g| g.host_memory) {
                if host > hm as f64 {
                    cx.warning(
                        ErrorCode::E0408,
                        format!(
                            "{}: CPU-offloaded optimizer state needs {} of host memory per node, nodes have {}",
                            st.name,
                            gb_fixed(host),
                            gb_fixed(hm as f64)
                        ),
                        t.optimizer_offload.span.or(st.span),
                        "offloaded here",
                        Some(
                            "use `optimizer = adam { state = stream_from_disk }`, or more GPUs to shard the state further"
                                .into(),
                        ),
                    );
                }
            }
            Some(OffloadReport {
                mode: "cpu".into(),
                bytes_per_gpu: mem.all_optimizer() as u64,
                host_bytes_per_node: host as u64,
                per_step: cost.cpu(mem.all_optimizer()),
            })
        }
    }
}
