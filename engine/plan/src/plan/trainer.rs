//! A training stage: memory per rank (weights, gradients, optimizer state, activations),
//! optimizer offload and its cost, what would make it fit (E0401), and its step time from FLOPs.

use super::placement::{trainer_unit, Placed};
use super::Ctx;
use crate::input::*;
use crate::model::{self, div, Layout};
use crate::output::*;
use crate::time;
use crate::units::{gb_fixed, params as param_count};
use miles_grammar::diag::{Diagnostic, Span};

#[derive(Clone, Debug)]
pub(super) struct TrainFacts {
    pub(super) stage: String,
    pub(super) gpus: u64,
    pub(super) pp: u64,
    pub(super) params: f64,
    pub(super) layers: u64,
    pub(super) precision: Precision,
    pub(super) step: Estimate,
    pub(super) offload_s: f64,
    pub(super) network_bw: f64,
    pub(super) scaleup_bw: f64,
    /// TP x EP: the ways one layer is split (what a broadcast source gathers).
    pub(super) shards: u64,
    pub(super) gpus_per_node: u64,
    pub(super) disk_bw: f64,
    /// With LoRA, what a weight update moves: every adapter's parameters (the base is frozen).
    pub(super) lora: Option<LoraReport>,
}

pub(super) fn peak_flops(g: &GpuSpec, p: Precision) -> f64 {
    match p {
        Precision::Fp32 => g.bf16 / 2.0,
        Precision::Bf16 | Precision::Fp16 => g.bf16,
        Precision::Fp8Blockwise | Precision::Mxfp8 => g.fp8.unwrap_or(g.bf16),
        Precision::Nvfp4 => g.fp4.or(g.fp8).unwrap_or(g.bf16),
    }
}

pub(super) struct TrainMem {
    weights: f64,
    adapters: f64,
    gradients: f64,
    optimizer: f64,
    activations: f64,
    stream_buffer: f64,
}

impl TrainMem {
    fn on_gpu(&self, offload: OptimizerOffload) -> f64 {
        let opt = if offload == OptimizerOffload::OnGpu { self.optimizer } else { 0.0 };
        let buf = if offload == OptimizerOffload::StreamFromDisk { self.stream_buffer } else { 0.0 };
        self.weights + self.adapters + self.gradients + opt + self.activations + buf
    }
}

pub(super) fn train_mem(
    m: &ModelSpec,
    l: &Layout,
    t: &Trainer,
    global_batch: Option<u64>,
    recompute: Recompute,
) -> TrainMem {
    let s = model::state_bytes(m, l, t.lora.as_ref());
    let micro = global_batch.map(|g| g / (l.dp * t.micro_batch.value).max(1));
    let act = model::activation_bytes(m, l, t.seq_len.value, t.micro_batch.value, micro, recompute);
    let layers_per_stage = m.layers.div_ceil(l.pp.max(1)).max(1) as f64;
    TrainMem {
        weights: s.weights,
        adapters: s.adapters,
        gradients: s.gradients,
        optimizer: s.optimizer,
        activations: act,
        stream_buffer: 2.0 * s.optimizer / layers_per_stage,
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
    let a = &cx.input.assumptions;
    let on_host = pl.placed == Where::Host;
    let gpus = pl.trainer_gpus();
    if dp == 0 || trainer_unit(t).saturating_mul(dp) != gpus {
        cx.error(
            "E0404",
            format!(
                "{}: TP{} x PP{} x CP{} x DP{} = {} but the stage has {gpus} GPUs",
                st.name,
                t.tp.value,
                t.pp.value,
                t.cp.value,
                dp,
                trainer_unit(t).saturating_mul(dp)
            ),
            t.dp.and_then(|d| d.span).or(st.gpus.and_then(|g| g.span)).or(st.span),
            "layout does not match the GPUs",
            Some(format!("the GPU count must be a multiple of tp x pp x cp = {}", trainer_unit(t))),
        );
        return None;
    }
    let l = Layout {
        backend: t.backend.value,
        tp: t.tp.value,
        pp: t.pp.value,
        cp: t.cp.value,
        ep: t.ep.value,
        dp,
        precision: t.precision.value,
    };
    if l.backend == Backend::Megatron && !(l.tp * l.cp * l.dp).is_multiple_of(l.etp() * l.ep) {
        cx.error(
            "E0404",
            format!("{}: EP{} does not divide TP x CP x DP = {}", st.name, l.ep, l.tp * l.cp * l.dp),
            t.ep.span.or(st.span),
            "experts cannot be placed",
            None,
        );
        return None;
    }
    let device = cx.device(&pl.ranges);
    let (dev_name, capacity, usable_share) = match (device, &cx.input.cluster.host) {
        (Some(g), _) if !on_host => (g.name.clone(), g.hbm, a.usable_hbm),
        (_, Some(h)) => (h.name.clone(), h.memory, a.usable_hbm),
        _ => return None,
    };
    let usable = capacity as f64 * usable_share;
    let global = batch.map(|b| b.global_batch);
    let recompute = t.recompute.value;
    let offload = t.optimizer_offload.value;
    let mem = train_mem(m, &l, t, global, recompute);
    let total = mem.on_gpu(offload);
    let fits = total <= usable;

    // Offload cost per optimizer step.
    let gpn = device.map_or(1, |g| g.gpus_per_node.max(1)).min(gpus);
    let eff = a.link_efficiency;
    let host_link = device.map_or(0.0, |g| g.host_link_bandwidth);
    let disk_bw = device.and_then(|g| g.disk_bandwidth).unwrap_or(a.disk_bandwidth);
    let stream_cost = |opt: f64| -> Estimate {
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
        }
    };
    let cpu_cost = |opt: f64| -> Estimate {
        let params = opt / model::optimizer_bytes_per_param(l.precision);
        let bytes = params * (4.0 + l.precision.bytes());
        Estimate {
            seconds: div(bytes, host_link * eff),
            assumptions: vec![
                format!("FP32 gradients down and updated weights up: {} per GPU per step", gb_fixed(bytes)),
                format!("GPU-host link {:.0} GB/s x {:.0}%; CPU Adam time not counted", host_link / 1e9, eff * 100.0),
            ],
        }
    };
    let offload_report = match offload {
        OptimizerOffload::OnGpu => None,
        OptimizerOffload::StreamFromDisk => Some(OffloadReport {
            mode: "stream_from_disk".into(),
            bytes_per_gpu: mem.optimizer as u64,
            host_bytes_per_node: 0,
            per_step: stream_cost(mem.optimizer),
        }),
        OptimizerOffload::Cpu => {
            let host = mem.optimizer * gpn as f64;
            if let Some(hm) = device.and_then(|g| g.host_memory) {
                if host > hm as f64 {
                    cx.warning(
                        "E0408",
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
                bytes_per_gpu: mem.optimizer as u64,
                host_bytes_per_node: host as u64,
                per_step: cpu_cost(mem.optimizer),
            })
        }
    };

    let lora = t.lora.as_ref().map(|lo| lora_report(m, &l, t, lo, global, recompute));
    let only = if lora.is_some() { ", adapters only" } else { "" };
    let opt_note = match offload {
        OptimizerOffload::OnGpu => format!(
            "FP32 master + 2 Adam moments, {} B/param{only}, sharded over {} ranks",
            model::optimizer_bytes_per_param(l.precision),
            optimizer_shards(&l)
        ),
        OptimizerOffload::Cpu => format!("{} kept in host memory", gb_fixed(mem.optimizer)),
        OptimizerOffload::StreamFromDisk => format!("{} streamed from disk", gb_fixed(mem.optimizer)),
    };
    let weights_note = format!("{} x {} B", l.precision.as_str(), l.precision.bytes());
    let mut items = vec![MemItem {
        name: "weights".into(),
        bytes: mem.weights as u64,
        note: if lora.is_some() {
            format!("frozen base, {weights_note}: no gradients, no optimizer state")
        } else {
            weights_note
        },
    }];
    if let Some(r) = &lora {
        items.push(MemItem {
            name: "adapters".into(),
            bytes: mem.adapters as u64,
            note: format!("{}, {}", r.summary, l.precision.as_str()),
        });
    }
    items.extend([
        MemItem {
            name: "gradients".into(),
            bytes: mem.gradients as u64,
            note: if lora.is_some() { "FP32, adapters only".into() } else { "FP32 accumulation buffer".into() },
        },
        MemItem {
            name: "optimizer".into(),
            bytes: if offload == OptimizerOffload::OnGpu { mem.optimizer as u64 } else { 0 },
            note: opt_note,
        },
        MemItem {
            name: "activations".into(),
            bytes: mem.activations as u64,
            note: format!(
                "seq {} / CP{}, micro-batch {}, recompute {}",
                t.seq_len.value,
                l.cp,
                t.micro_batch.value,
                recompute_name(recompute)
            ),
        },
    ]);
    if offload == OptimizerOffload::StreamFromDisk {
        items.push(MemItem {
            name: "stream_buffer".into(),
            bytes: mem.stream_buffer as u64,
            note: "two layers of optimizer state in flight".into(),
        });
    }
    if !fits {
        let over = total - usable;
        let fixes = train_fixes(cx, m, &l, t, global, &mem, usable, gpus, &stream_cost, &cpu_cost);
        let mut d = Diagnostic::error(
            "E0401",
            format!(
                "{} does not fit in GPU memory: {} per GPU, {} has {} usable ({} x {:.0}%); over by {}",
                st.name,
                gb_fixed(total),
                dev_name,
                gb_fixed(usable),
                gb_fixed(capacity as f64),
                usable_share * 100.0,
                gb_fixed(over)
            ),
        )
        .with_help(format!("fixes: {}", fixes.join("; ")));
        if let Some(sp) = st.span {
            d = d.with_primary(sp, format!("needs {} per GPU", gb_fixed(total)));
        }
        if offload == OptimizerOffload::OnGpu {
            if let Some(sp) = t.optimizer_offload.span {
                d = d.with_secondary(sp, format!("optimizer state ({}) stays in HBM", gb_fixed(mem.optimizer)));
            }
        }
        cx.diags.push(d);
    }
    if let Some(g) = device {
        tp_domain_warning(cx, st, "trainer", l.tp, t.tp.span, g, gpus);
    }
    memory.push(MemoryReport {
        stage: st.name.clone(),
        role: st.role,
        device: dev_name,
        capacity,
        usable: usable as u64,
        total: total as u64,
        items,
        fits,
        offload: offload_report.clone(),
        lora: lora.clone(),
    });

    // Step time from FLOPs and MFU.
    let seq = t.seq_len.value as f64;
    let flops_tok = time::train_flops_per_token(
        m.active_params as f64,
        m.layers as f64,
        seq,
        (m.heads * m.head_dim) as f64,
        recompute == Recompute::Full,
    );
    let peak = match device {
        Some(g) if !on_host => peak_flops(g, l.precision),
        _ => cx.input.cluster.host.as_ref().and_then(|h| h.fp32).unwrap_or(0.0),
    };
    let tokens = global.map_or(0.0, |g| g as f64 * seq);
    let step_s = div(tokens * flops_tok, gpus as f64 * peak * a.train_mfu);
    let step = Estimate {
        seconds: step_s,
        assumptions: vec![
            format!("{:.3e} tokens per optimizer step (global batch x seq {})", tokens, t.seq_len.value),
            format!(
                "{:.3e} FLOPs per token: 6 x active + 2 x active (old log-probs){} + attention",
                flops_tok,
                if recompute == Recompute::Full { " + 2 x active (recompute)" } else { "" }
            ),
            format!(
                "{} GPUs x {:.0} TFLOP/s {} x MFU {:.0}%",
                gpus,
                peak / 1e12,
                l.precision.as_str(),
                a.train_mfu * 100.0
            ),
        ],
    };
    Some(TrainFacts {
        stage: st.name.clone(),
        gpus,
        pp: l.pp,
        params: m.params as f64,
        layers: m.layers,
        precision: l.precision,
        step,
        offload_s: offload_report.map_or(0.0, |o| o.per_step.seconds),
        network_bw: device.map_or(0.0, |g| g.network_bandwidth),
        scaleup_bw: device.map_or(0.0, |g| g.scaleup_bandwidth),
        shards: l.tp.max(1) * l.ep.max(1),
        gpus_per_node: device.map_or(1, |g| g.gpus_per_node),
        disk_bw,
        lora,
    })
}

/// The adapters by name and size, and the full fine-tune this rank would hold without them.
fn lora_report(
    m: &ModelSpec,
    l: &Layout,
    t: &Trainer,
    lo: &Lora,
    global: Option<u64>,
    recompute: Recompute,
) -> LoraReport {
    let rank = lo.rank.value;
    let adapters = lo.adapters.value.max(1);
    let targets: Vec<TargetParams> = lo
        .target_modules
        .iter()
        .map(|&tm| {
            let p = model::lora_target_params(m, tm, rank);
            let wrapped: f64 = model::lora_instances(m, tm).iter().map(|i| i.0).sum();
            TargetParams {
                module: tm.as_str().into(),
                params: (p.routed + p.other) as u64,
                wrapped_layers: wrapped as u64,
                on_experts: p.routed > 0.0,
            }
        })
        .collect();
    let per_adapter: u64 = targets.iter().map(|x| x.params).sum();
    let params = per_adapter.saturating_mul(adapters);
    let names: Vec<&str> = lo.target_modules.iter().map(|x| x.short()).collect();
    let experts = if targets.iter().any(|x| x.on_experts) {
        format!(" (MLP on all {} routed experts)", m.experts)
    } else {
        String::new()
    };
    let summary = format!(
        "{adapters} adapter{} x {} rank {rank} x {} layers{experts}: {} params{}",
        if adapters == 1 { "" } else { "s" },
        names.join(","),
        m.layers,
        param_count(params),
        if adapters > 1 { format!(" ({} each)", param_count(per_adapter)) } else { String::new() }
    );
    let full = Trainer { lora: None, ..t.clone() };
    let f = train_mem(m, l, &full, global, recompute);
    LoraReport {
        rank,
        adapters,
        target_modules: lo.target_modules.iter().map(|x| x.as_str().to_string()).collect(),
        targets,
        params_per_adapter: per_adapter,
        params,
        sync_bytes: (params as f64 * l.precision.bytes()) as u64,
        summary,
        full_finetune: FullFinetune {
            weights: f.weights as u64,
            gradients: f.gradients as u64,
            optimizer: f.optimizer as u64,
            total: f.on_gpu(t.optimizer_offload.value) as u64,
        },
    }
}

pub(super) fn optimizer_shards(l: &Layout) -> u64 {
    match l.backend {
        Backend::Megatron => l.tp * l.pp * l.cp * l.dp,
        Backend::Fsdp => l.dp * l.tp * l.pp * l.cp,
        Backend::Embedded => 1,
    }
}

pub(super) fn recompute_name(r: Recompute) -> &'static str {
    match r {
        Recompute::Full => "full",
        Recompute::Selective => "selective",
        Recompute::Off => "off",
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn train_fixes(
    cx: &Ctx,
    m: &ModelSpec,
    l: &Layout,
    t: &Trainer,
    global: Option<u64>,
    mem: &TrainMem,
    usable: f64,
    gpus: u64,
    stream_cost: &dyn Fn(f64) -> Estimate,
    cpu_cost: &dyn Fn(f64) -> Estimate,
) -> Vec<String> {
    let mut fixes = Vec::new();
    let offload = t.optimizer_offload.value;
    let verdict = |x: f64| {
        if x <= usable {
            "fits".to_string()
        } else {
            format!("still {} over", gb_fixed(x - usable))
        }
    };
    if offload != OptimizerOffload::StreamFromDisk {
        let x = mem.on_gpu(OptimizerOffload::StreamFromDisk);
        fixes.push(format!(
            "`optimizer = adam {{ state = stream_from_disk }}`: {} per GPU ({}), est. +{:.1} s per step",
            gb_fixed(x),
            verdict(x),
            stream_cost(mem.optimizer).seconds
        ));
    }
    if offload != OptimizerOffload::Cpu {
        let x = mem.on_gpu(OptimizerOffload::Cpu);
        fixes.push(format!(
            "`optimizer = adam {{ state = cpu }}`: {} per GPU ({}), needs {} host memory per GPU, est. +{:.1} s per step",
             gb_fixed(x),
            verdict(x),
             gb_fixed(mem.optimizer),
            cpu_cost(mem.optimizer).seconds
        ));
    }
    if l.backend != Backend::Embedded && (offload == OptimizerOffload::OnGpu || l.backend == Backend::Fsdp) {
        // More data-parallel replicas shard the optimizer state (and, under FSDP, everything).
        // Only layouts the cluster can hold.
        for k in [2u64, 4, 8, 16].into_iter().filter(|k| gpus.saturating_mul(*k) <= cx.total_gpus) {
            let l2 = Layout { dp: l.dp * k, ..*l };
            let x = train_mem(m, &l2, t, global, t.recompute.value).on_gpu(offload);
            if x <= usable {
                fixes.push(format!("{} GPUs for this stage (DP{}): {} per GPU", gpus * k, l2.dp, gb_fixed(x)));
                break;
            }
        }
    }
    // `recompute` is a field of `megatron` only (std/prelude): offer it to no other backend.
    if l.backend == Backend::Megatron && t.recompute.value != Recompute::Full {
        let x = train_mem(m, l, t, global, Recompute::Full).on_gpu(offload);
        fixes.push(format!("`recompute = full`: {} per GPU ({})", gb_fixed(x), verdict(x)));
    }
    if l.backend == Backend::Megatron && m.layers >= 2 * l.pp && l.dp.is_multiple_of(2) {
        let l2 = Layout { pp: l.pp * 2, dp: l.dp / 2, ..*l };
        let x = train_mem(m, &l2, t, global, t.recompute.value).on_gpu(offload);
        fixes.push(format!("PP{} DP{} on the same GPUs: {} per GPU ({})", l2.pp, l2.dp, gb_fixed(x), verdict(x)));
    }
    fixes
}

/// E0406 when a TP group's all-reduces would cross the scale-out network: TP larger than the
/// NVLink domain, or a TP that does not divide it on a stage wider than one domain (groups laid
/// out in order then straddle domains). Within one domain a non-dividing TP only idles GPUs.
pub(super) fn tp_domain_warning(
    cx: &mut Ctx,
    st: &Stage,
    what: &str,
    tp: u64,
    span: Option<Span>,
    g: &GpuSpec,
    stage_gpus: u64,
) {
    let domain = g.scaleup_domain.max(1);
    if tp > domain || (!domain.is_multiple_of(tp.max(1)) && stage_gpus > domain) {
        cx.warning(
            "E0406",
            format!("{}: {what} TP{tp} spans NVLink domains of {domain} {} GPUs", st.name, g.name),
            span.or(st.span),
            "tensor-parallel traffic crosses the scale-out network",
            Some(format!("keep TP a divisor of {domain}; use PP, EP or more engines for the rest")),
        );
    }
}
