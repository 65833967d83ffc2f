//! A training stage: memory per rank (weights, gradients, optimizer state, activations),
//! optimizer offload and its cost, what would make it fit (E0401), and its step time from FLOPs.
//!
//! [`plan_trainer`] runs one module per step: `layout` (the layout against the stage's GPUs),
//! `memory` (the rank's device and bytes, itemised by one `items_for` for each model the rank
//! holds: policy, PPO's critic, OPD's teacher; `host`: the embedded process's own copies),
//! `offload` (optimizer state off the GPU and its cost), `lora` (the adapters' report), `fixes`
//! (what would make it fit, E0401) and `time` (the step time).

use super::placement::Placed;
use super::Ctx;
use crate::input::*;
use crate::output::*;
use host::EmbeddedHost;
use memory::Rank;
use offload::OffloadCost;

pub(super) use layout::tp_domain_warning;

mod fixes;
mod host;
mod layout;
mod lora;
mod memory;
mod offload;
mod time;

#[derive(Clone, Debug)]
pub(super) struct TrainFacts {
    pub(super) stage: String,
    pub(super) gpus: u64,
    pub(super) pp: u64,
    pub(super) params: f64,
    pub(super) precision: Precision,
    pub(super) step: Estimate,
    /// PPO: the critic's share of `step` (its values and value loss), 0 without a critic.
    pub(super) critic_s: f64,
    /// OPD: the teacher's forward's share of `step`, 0 without a teacher.
    pub(super) teacher_s: f64,
    pub(super) offload_s: f64,
    /// What `offload_s` rests on (none without offload).
    pub(super) offload_evidence: Option<crate::evidence::Evidence>,
    pub(super) network_bw: f64,
    pub(super) scaleup_bw: f64,
    /// TP and EP: how one layer is split (what weight sync all-gathers first). FSDP shards every
    /// parameter over its data-parallel ranks, so there the gather spans them (as TP's would).
    pub(super) tp: u64,
    pub(super) ep: u64,
    /// Share of the parameters in routed experts (gathered over EP).
    pub(super) routed_share: f64,
    pub(super) gpus_per_node: u64,
    pub(super) disk_bw: f64,
    /// With LoRA, what a weight update moves: every adapter's parameters (the base is frozen).
    pub(super) lora: Option<LoraReport>,
    /// The embedded backend on a CPU-only host: its rollout and local handoff, which no GPU
    /// engine or transport prices (docs/plan.md, "Step time on a CPU host").
    pub(super) cpu: Option<CpuSide>,
    /// A data-parallel embedded trainer: its ranks and collectives (in `step` already).
    pub(super) data_parallel: Option<DataParallelReport>,
}

#[derive(Clone, Debug)]
pub(super) struct CpuSide {
    pub(super) rollout: Option<Estimate>,
    pub(super) sync: Estimate,
}

pub(super) fn peak_flops(g: &GpuSpec, p: Precision) -> f64 {
    match p {
        Precision::Fp32 => g.bf16 / 2.0,
        Precision::Bf16 | Precision::Fp16 => g.bf16,
        Precision::Fp8Blockwise | Precision::Mxfp8 => g.fp8.unwrap_or(g.bf16),
        Precision::Nvfp4 => g.fp4.or(g.fp8).unwrap_or(g.bf16),
    }
}

pub(super) fn plan_trainer(
    cx: &mut Ctx,
    st: &Stage,
    t: &Trainer,
    pl: &Placed,
    dp: u64,
    batch: Option<&BatchReport>,
    memory: &mut Vec<MemoryReport>,
) -> Option<TrainFacts> {
    let m = st.model.as_ref()?;
    let on_host = pl.placed == Where::Host;
    let gpus = pl.trainer_gpus();
    let l = layout::check_layout(cx, st, t, gpus, dp)?;
    let device = cx.device(&pl.ranges);
    let mut budget = memory::Budget::of(cx, device, on_host, l.backend)?;
    // A data-parallel embedded trainer's ranks are processes of one machine (a `local`
    // cluster's): each may use its share of it.
    let ranks = t.data_parallel.as_ref().map(|d| d.ranks.value.max(1)).filter(|_| on_host);
    if let Some(n) = ranks {
        budget.usable /= n as f64;
    }
    let host = (on_host && l.backend == Backend::Embedded).then(|| {
        // On a CPU-only host every trainer's memory row is the one embedded process's (one
        // rank's when data-parallel).
        let first = !memory.iter().any(|r| r.role.trains());
        EmbeddedHost::new(cx, first, ranks.is_some())
    });
    let rank = Rank {
        l: &l,
        t,
        // PPO (std/stages `ppo`) also trains a learned critic (docs/plan.md, "PPO").
        critic: st.kind == "ppo",
        global: batch.map(|b| b.global_batch),
        recompute: t.recompute.value,
        host: host.as_ref(),
    };
    let mem = rank.mem(m);
    let total = mem.on_gpu(t.optimizer_offload.value);
    let fits = total <= budget.usable;

    let cost = OffloadCost::new(&cx.input.assumptions, device, gpus, l.precision);
    let offload_report = offload::offload_report(cx, st, t, device, &mem, &cost);
    let lora = t.lora.as_ref().map(|lo| lora::lora_report(m, &rank, lo));
    let items = rank.items(m, &mem, lora.as_ref());
    if !fits {
        fixes::report_over(cx, st, m, &rank, &mem, total, &budget, gpus, &cost);
    }
    if let Some(g) = device {
        tp_domain_warning(cx, st, "trainer", l.tp, t.tp.span, g, gpus);
    }
    memory.push(MemoryReport {
        stage: st.name.clone(),
        role: st.role,
        device: budget.device,
        capacity: budget.capacity,
        usable: budget.usable as u64,
        total: total as u64,
        items,
        fits,
        offload: offload_report.clone(),
        lora: lora.clone(),
        ranks: t.data_parallel.as_ref().filter(|_| on_host).map(|d| RanksMemory {
            ranks: d.ranks.value.max(1),
            zero: d.zero.value.as_str().to_string(),
            all_ranks: (total * d.ranks.value.max(1) as f64) as u64,
        }),
    });

    let peak = time::peak(cx, device, on_host, l.precision);
    let step = time::trainer_step(cx, st, m, &rank, peak, gpus, batch, lora.as_ref());
    Some(TrainFacts {
        stage: st.name.clone(),
        gpus,
        pp: l.pp,
        params: m.params as f64,
        precision: l.precision,
        step: step.step,
        critic_s: step.critic_s,
        teacher_s: step.teacher_s,
        offload_s: offload_report.as_ref().map_or(0.0, |o| o.per_step.seconds),
        offload_evidence: offload_report.map(|o| o.per_step.evidence.clone()),
        network_bw: device.map_or(0.0, |g| g.network_bandwidth),
        scaleup_bw: device.map_or(0.0, |g| g.scaleup_bandwidth),
        tp: if l.backend == Backend::Fsdp { l.dp.max(1) } else { l.tp.max(1) },
        ep: l.ep.max(1),
        routed_share: crate::model::div(crate::model::param_split(m).routed, m.params as f64),
        gpus_per_node: device.map_or(1, |g| g.gpus_per_node),
        disk_bw: cost.disk_bw,
        lora,
        cpu: step.cpu,
        data_parallel: step.data_parallel,
    })
}
