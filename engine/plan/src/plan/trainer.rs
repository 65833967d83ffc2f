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
    /// PPO: the critic's share of `step` (its values and value loss), 0 without a critic.
    pub(super) critic_s: f64,
    /// OPD: the teacher's forward's share of `step`, 0 without a teacher.
    pub(super) teacher_s: f64,
    pub(super) offload_s: f64,
    pub(super) network_bw: f64,
    pub(super) scaleup_bw: f64,
    /// TP x EP: the ways one layer is split (what a broadcast source gathers).
    pub(super) shards: u64,
    pub(super) gpus_per_node: u64,
    pub(super) disk_bw: f64,
    /// With LoRA, what a weight update moves: every adapter's parameters (the base is frozen).
    pub(super) lora: Option<LoraReport>,
    /// The embedded backend on a CPU-only host: its rollout and local handoff, which no GPU
    /// engine or transport prices (docs/plan.md, "Step time on a CPU host").
    pub(super) cpu: Option<CpuSide>,
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

pub(super) struct TrainMem {
    weights: f64,
    adapters: f64,
    gradients: f64,
    optimizer: f64,
    activations: f64,
    /// LoRA dropout's kept copies of the wrapped layers' inputs (0 without dropout).
    lora_dropout: f64,
    stream_buffer: f64,
    /// The embedded process on a CPU-only host (0 elsewhere): its other copies of the weights
    /// and its fixed resident base.
    weight_copies: f64,
    process: f64,
    /// PPO's critic (0 without one): a full fine-tune of `model::critic_spec` under the policy's
    /// layout, its optimizer state kept where the policy's is.
    critic_weights: f64,
    critic_gradients: f64,
    critic_optimizer: f64,
    critic_activations: f64,
    /// On-policy distillation's teacher (0 without one): frozen weights, and the live tensors of
    /// its no-grad forward over one micro-batch.
    teacher_weights: f64,
    teacher_activations: f64,
    /// The embedded trainer's bf16 GEMMs (`precision = bf16`): bf16 copies of the weights, made
    /// per forward and kept for backward (0 in fp32).
    gemm_casts: f64,
}

impl TrainMem {
    fn on_gpu(&self, offload: OptimizerOffload) -> f64 {
        let on_gpu = offload == OptimizerOffload::OnGpu;
        let opt = if on_gpu { self.optimizer } else { 0.0 };
        let buf = if offload == OptimizerOffload::StreamFromDisk { self.stream_buffer } else { 0.0 };
        let critic_opt = if on_gpu { self.critic_optimizer } else { 0.0 };
        self.weights
            + self.adapters
            + self.gradients
            + opt
            // The critic trains after the policy's passes have freed their graphs (the embedded
            // trainer does; PPO trainers generally run the two losses as separate phases), and
            // the teacher's forward runs before the policy's passes: the peak holds one of the
            // activation sets, not their sum.
            + self.activations.max(self.critic_activations).max(self.teacher_activations)
            + self.lora_dropout
            + buf
            + self.weight_copies
            + self.process
            + self.critic_weights
            + self.critic_gradients
            + critic_opt
            + self.teacher_weights
            + self.gemm_casts
    }

    /// Optimizer state of the policy and the critic together: what an offload moves.
    fn all_optimizer(&self) -> f64 {
        self.optimizer + self.critic_optimizer
    }
}

/// The embedded backend on a CPU-only host: the trainer shares one process with the rollout
/// engine (and a snapshot evaluation's engine, and a KL reference), and its activations are
/// libtorch's, not Megatron's (docs/plan.md, "The embedded process").
#[derive(Clone, Copy, Debug)]
pub(super) struct EmbeddedHost {
    /// Other copies of the weights in the process, each named; like the process's fixed base,
    /// counted on the first embedded trainer only (an SFT warm-up and the RL trainer that follows
    /// it are one trainer in one process).
    copies: [Option<&'static str>; 3],
    /// The engines' copies' precision (the rollout and snapshot-eval engines sample in their own:
    /// an embedded engine in bf16 holds half of an fp32 copy); None: the trainer's.
    engine_precision: Option<Precision>,
    entropy_in_loss: bool,
    autograd_scale: f64,
    process_bytes: f64,
}

impl EmbeddedHost {
    fn new(cx: &Ctx, first: bool) -> EmbeddedHost {
        let input = cx.input;
        let e = input.placement.embedded;
        let rollout = input.stages.iter().any(|s| s.role == Role::Rollout);
        // An async schedule runs evaluation on an engine of its own when `mode = snapshot`; a
        // sync one evaluates on the rollout engine.
        let eval_engine = e.eval_snapshot && input.schedule.mode.value != ScheduleMode::Sync;
        let engine_precision = input
            .stages
            .iter()
            .filter(|s| s.role == Role::Rollout)
            .find_map(|s| s.engine.as_ref())
            .map(|e| e.precision.value);
        EmbeddedHost {
            engine_precision,
            copies: if first {
                [
                    rollout.then_some("rollout engine"),
                    eval_engine.then_some("snapshot eval engine"),
                    e.kl_reference.then_some("KL reference"),
                ]
            } else {
                [None; 3]
            },
            entropy_in_loss: e.entropy_in_loss,
            autograd_scale: input.assumptions.embedded_autograd_scale,
            process_bytes: if first { input.assumptions.embedded_process_bytes } else { 0.0 },
        }
    }

    fn copy_names(&self) -> Vec<&'static str> {
        self.copies.iter().flatten().copied().collect()
    }

    /// Bytes of the copies of `weights` (held in `trainer`'s precision), each in its own.
    fn copy_bytes(&self, weights: f64, trainer: Precision) -> f64 {
        let engine = self.engine_precision.unwrap_or(trainer);
        let engines = self.copies[..2].iter().flatten().count() as f64;
        let others = self.copies[2..].iter().flatten().count() as f64;
        weights * (engines * engine.bytes() / trainer.bytes() + others)
    }

    /// The copies as the plan names them: `1 x fp32: rollout engine`, with the engines' own
    /// precision where it is not the trainer's.
    fn copy_note(&self, trainer: Precision) -> String {
        let names = self.copy_names();
        match self.engine_precision.filter(|p| *p != trainer) {
            None => format!("{} x {}: {}", names.len(), trainer.as_str(), names.join(", ")),
            Some(e) => {
                let label = |(i, c): (usize, &Option<&'static str>)| {
                    c.map(|n| format!("{n} ({})", if i < 2 { e.as_str() } else { trainer.as_str() }))
                };
                let labels: Vec<String> = self.copies.iter().enumerate().filter_map(label).collect();
                format!("{} copies: {}", names.len(), labels.join(", "))
            }
        }
    }
}

pub(super) fn train_mem(
    m: &ModelSpec,
    l: &Layout,
    t: &Trainer,
    critic: bool,
    global_batch: Option<u64>,
    recompute: Recompute,
    host: Option<&EmbeddedHost>,
) -> TrainMem {
    let s = model::state_bytes(m, l, t.lora.as_ref());
    let micro = global_batch.map(|g| g / (l.dp * t.micro_batch.value).max(1));
    let act = match host {
        Some(h) => {
            h.autograd_scale
                * model::embedded_activation_bytes(
                    m,
                    t.seq_len.value,
                    t.micro_batch.value,
                    h.entropy_in_loss,
                    t.lora.as_ref(),
                )
        }
        None => model::activation_bytes(m, l, t.seq_len.value, t.micro_batch.value, micro, recompute),
    };
    let lora_dropout = t
        .lora
        .as_ref()
        .map_or(0.0, |lo| model::lora_dropout_bytes(m, l, lo, t.seq_len.value, t.micro_batch.value, micro, recompute));
    let layers_per_stage = m.layers.div_ceil(l.pp.max(1)).max(1) as f64;
    let critic_activations = match (critic, host) {
        (false, _) => 0.0,
        (true, Some(h)) => {
            h.autograd_scale * model::embedded_critic_activation_bytes(m, t.seq_len.value, t.micro_batch.value)
        }
        (true, None) => model::critic_activation_bytes(m, l, t.seq_len.value, t.micro_batch.value, micro, recompute),
    };
    let critic = critic.then(|| model::critic_state_bytes(m, l));
    let critic_optimizer = critic.map_or(0.0, |c| c.optimizer);
    // A teacher in a process of its own holds its memory there (`teacher_items` says how much).
    let teacher = t.teacher.as_ref().filter(|_| !t.teacher_process);
    let teacher_weights = teacher.map_or(0.0, |tm| model::teacher_weight_bytes(tm, l, host.is_some()));
    let teacher_activations = teacher.map_or(0.0, |tm| match host {
        Some(_) => model::embedded_teacher_activation_bytes(tm, t.seq_len.value, t.micro_batch.value),
        None => model::teacher_activation_bytes(tm, l, t.seq_len.value, t.micro_batch.value),
    });
    TrainMem {
        weights: s.weights,
        adapters: s.adapters,
        gradients: s.gradients,
        optimizer: s.optimizer,
        activations: act,
        lora_dropout,
        stream_buffer: 2.0 * (s.optimizer + critic_optimizer) / layers_per_stage,
        // Each copy is a deep copy of the policy: base weights and any adapters.
        weight_copies: host.map_or(0.0, |h| h.copy_bytes(s.weights + s.adapters, l.precision)),
        process: host.map_or(0.0, |h| h.process_bytes),
        critic_weights: critic.map_or(0.0, |c| c.weights),
        critic_gradients: critic.map_or(0.0, |c| c.gradients),
        critic_optimizer,
        critic_activations,
        teacher_weights,
        teacher_activations,
        gemm_casts: match (host, t.precision.value) {
            (Some(_), Precision::Bf16) => s.weights / 2.0,
            _ => 0.0,
        },
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
        // The embedded trainer keeps fp32 weights, gradients and Adam state: its `precision` is
        // its GEMMs' (`TrainMem::gemm_casts`, `embedded::train_step`).
        precision: if t.backend.value == Backend::Embedded { Precision::Fp32 } else { t.precision.value },
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
    // The embedded process on a `local` cluster whose device resolved to a GPU keeps every tensor
    // there (docs/gpu.md): its memory is checked against that GPU's, as the driver reports it.
    let on_gpu =
        cx.gpu.as_ref().filter(|_| on_host && l.backend == Backend::Embedded).map(|g| (g.name.clone(), g.memory));
    let (dev_name, capacity, usable_share) = match (device, &cx.input.cluster.host, &on_gpu) {
        (Some(g), _, _) if !on_host => (g.name.clone(), g.hbm, a.usable_hbm),
        (_, _, Some((name, memory))) => (name.clone(), *memory, a.usable_hbm),
        (_, Some(h), _) => (h.name.clone(), h.memory, a.usable_hbm),
        _ => return None,
    };
    let usable = capacity as f64 * usable_share;
    let global = batch.map(|b| b.global_batch);
    let recompute = t.recompute.value;
    let offload = t.optimizer_offload.value;
    let host = (on_host && l.backend == Backend::Embedded).then(|| {
        // On a CPU-only host every trainer's memory row is the one embedded process's.
        let first = !memory.iter().any(|r| r.role.trains());
        EmbeddedHost::new(cx, first)
    });
    let host = host.as_ref();
    // PPO (std/stages `ppo`) also trains a learned critic (docs/plan.md, "PPO").
    let critic = st.kind == "ppo";
    let mem = train_mem(m, &l, t, critic, global, recompute, host);
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
            bytes_per_gpu: mem.all_optimizer() as u64,
            host_bytes_per_node: 0,
            per_step: stream_cost(mem.all_optimizer()),
        }),
        OptimizerOffload::Cpu => {
            let host = mem.all_optimizer() * gpn as f64;
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
                bytes_per_gpu: mem.all_optimizer() as u64,
                host_bytes_per_node: host as u64,
                per_step: cpu_cost(mem.all_optimizer()),
            })
        }
    };

    let lora = t.lora.as_ref().map(|lo| lora_report(m, &l, t, critic, lo, global, recompute, host));
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
            note: match host {
                Some(h) => format!(
                    "libtorch autograd, fp32: seq {} x micro-batch {}, x{} for backward",
                    t.seq_len.value, t.micro_batch.value, h.autograd_scale
                ),
                None => format!(
                    "seq {} / CP{}, micro-batch {}, recompute {}",
                    t.seq_len.value,
                    l.cp,
                    t.micro_batch.value,
                    recompute_name(recompute)
                ),
            },
        },
    ]);
    if mem.gemm_casts > 0.0 {
        items.push(MemItem {
            name: "gemm_casts".into(),
            bytes: mem.gemm_casts as u64,
            note: "bf16 x 2 B: the weights the bf16 GEMMs read (precision = bf16), kept for backward".into(),
        });
    }
    if critic {
        items.extend(critic_items(m, &l, t, &mem, host));
    }
    if let Some(tm) = &t.teacher {
        items.extend(teacher_items(tm, &l, t, &mem, host));
    }
    if let Some(h) = host {
        let names = h.copy_names();
        if !names.is_empty() {
            items.push(MemItem {
                name: "weight_copies".into(),
                bytes: mem.weight_copies as u64,
                note: h.copy_note(l.precision),
            });
        }
        if h.process_bytes > 0.0 {
            items.push(MemItem {
                name: "embedded_process".into(),
                bytes: mem.process as u64,
                note: "libtorch, runtime and task data resident (measured)".into(),
            });
        }
    }
    if let Some(lo) = t.lora.as_ref().filter(|lo| lo.dropout > 0.0) {
        let held = if recompute == Recompute::Full {
            "one layer while it is recomputed".to_string()
        } else {
            let micro = global.map(|g| g / (l.dp * t.micro_batch.value).max(1));
            let n = model::in_flight(&l, micro);
            format!(
                "{} layers x {n} micro-batch{} in flight",
                m.layers.div_ceil(l.pp.max(1)),
                if n == 1.0 { "" } else { "es" }
            )
        };
        items.push(MemItem {
            name: "lora_dropout".into(),
            bytes: mem.lora_dropout as u64,
            note: format!(
                "dropout {}: kept dropped input of each wrapped layer, {held}, {}",
                lo.dropout,
                l.precision.as_str()
            ),
        });
    }
    if offload == OptimizerOffload::StreamFromDisk {
        items.push(MemItem {
            name: "stream_buffer".into(),
            bytes: mem.stream_buffer as u64,
            note: "two layers of optimizer state in flight".into(),
        });
    }
    if !fits {
        let over = total - usable;
        let mut fixes = train_fixes(cx, m, &l, t, critic, global, &mem, usable, gpus, &stream_cost, &cpu_cost);
        if let (Some(_), Some(h)) = (&on_gpu, &cx.input.cluster.host) {
            // On the GPU of a `local` cluster: the host's memory is the other place it can run.
            let host_usable = h.memory as f64 * usable_share;
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
                d = d.with_secondary(sp, format!("optimizer state ({}) stays in HBM", gb_fixed(mem.all_optimizer())));
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

    // Step time from FLOPs and MFU, at the expected sequence of an RL trainer's rollout when the
    // recipe states its lengths (memory above stays at seq_len).
    let lengths = if st.role == Role::Train { super::lengths::plan_lengths(cx) } else { None };
    let seq = lengths.as_ref().map_or(t.seq_len.value as f64, |l| l.sequence(t.seq_len.value));
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
    let critic_active = model::critic_spec(m).active_params as f64;
    let critic_tok = if critic {
        time::critic_flops_per_token(
            critic_active,
            m.layers as f64,
            seq,
            (m.heads * m.head_dim) as f64,
            recompute == Recompute::Full,
        )
    } else {
        0.0
    };
    let critic_s = div(tokens * critic_tok, gpus as f64 * peak * a.train_mfu);
    // OPD: the teacher's no-grad forward over every token of the step (docs/plan.md).
    let teacher_tok = t.teacher.as_ref().map_or(0.0, |tm| {
        time::teacher_flops_per_token(tm.active_params as f64, tm.layers as f64, seq, (tm.heads * tm.head_dim) as f64)
    });
    let teacher_s = div(tokens * teacher_tok, gpus as f64 * peak * a.train_mfu);
    let mut gpu_step = Estimate {
        seconds: step_s + critic_s + teacher_s,
        assumptions: vec![
            format!(
                "{:.3e} tokens per optimizer step (global batch x seq {})",
                tokens,
                if seq == t.seq_len.value as f64 {
                    t.seq_len.value.to_string()
                } else {
                    format!("{seq:.1} expected; memory at {}", t.seq_len.value)
                }
            ),
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
        ]
        .into_iter()
        .chain(critic.then(|| {
            format!(
                "critic: {:.3e} FLOPs per token: 2 x {} params (values) + 6 x (value loss fwd + bwd){} + attention: {:.2} s of the step",
                critic_tok,
                param_count(critic_active as u64),
                if recompute == Recompute::Full { " + 2 x (recompute)" } else { "" },
                critic_s
            )
        }))
        .chain(t.teacher.as_ref().map(|tm| {
            format!(
                "teacher: {:.3e} FLOPs per token: 2 x {} params ({}, no-grad forward) + attention: {:.2} s of the step",
                teacher_tok,
                param_count(tm.active_params),
                tm.name,
                teacher_s
            )
        }))
        .collect(),
    };
    super::lengths::note_into(lengths.as_ref(), &mut gpu_step.assumptions);
    // The embedded backend on a CPU-only host: its own step-time model (docs/plan.md, "Step time
    // on a CPU host"), rollout and local handoff included.
    let cpu_host = cx.input.cluster.host.as_ref().filter(|_| host.is_some());
    let (step, critic_s, teacher_s, cpu) = match (cpu_host, host) {
        (Some(hs), Some(h)) => {
            let spr = batch.map_or(1, |b| b.steps_per_rollout);
            let on = super::embedded::On::of(cx);
            let (est, critic_s, teacher_s) = super::embedded::train_step(
                a,
                on,
                m,
                t,
                global,
                spr,
                critic,
                cx.input.placement.embedded.kl_reference,
                h.entropy_in_loss,
                lengths.as_ref(),
            );
            let rollout = batch.and_then(|b| super::embedded::rollout(cx, m, b, t.lora.as_ref()));
            let bytes = lora.as_ref().map_or(m.params as f64 * l.precision.bytes(), |lo| lo.sync_bytes as f64);
            let sync = super::embedded::sync(a, on, hs, m, t.lora.as_ref(), bytes);
            (est, critic_s, teacher_s, Some(CpuSide { rollout, sync }))
        }
        _ => (gpu_step, critic_s, teacher_s, None),
    };
    Some(TrainFacts {
        stage: st.name.clone(),
        gpus,
        pp: l.pp,
        params: m.params as f64,
        layers: m.layers,
        precision: l.precision,
        step,
        critic_s,
        teacher_s,
        offload_s: offload_report.map_or(0.0, |o| o.per_step.seconds),
        network_bw: device.map_or(0.0, |g| g.network_bandwidth),
        scaleup_bw: device.map_or(0.0, |g| g.scaleup_bandwidth),
        shards: l.tp.max(1) * l.ep.max(1),
        gpus_per_node: device.map_or(1, |g| g.gpus_per_node),
        disk_bw,
        lora,
        cpu,
    })
}

/// PPO's critic, item by item: weights, gradients, optimizer state (where the policy's is) and
/// activations (docs/plan.md, "PPO").
fn critic_items(m: &ModelSpec, l: &Layout, t: &Trainer, mem: &TrainMem, host: Option<&EmbeddedHost>) -> Vec<MemItem> {
    let c = model::critic_spec(m);
    let head = match m.tied_embeddings {
        Some(false) => format!("LM head {} x {} dropped", m.vocab, m.hidden_size),
        Some(true) => "tied embedding kept".to_string(),
        None => "embedding tying unknown: LM head counted (upper bound)".to_string(),
    };
    let full = if t.lora.is_some() { ", trained in full (LoRA is the policy's)" } else { "" };
    let offload = t.optimizer_offload.value;
    vec![
        MemItem {
            name: "critic_weights".into(),
            bytes: mem.critic_weights as u64,
            note: format!(
                "{} params: policy, {head}, + value head {}; {} x {} B",
                param_count(c.params),
                m.hidden_size,
                l.precision.as_str(),
                l.precision.bytes()
            ),
        },
        MemItem {
            name: "critic_gradients".into(),
            bytes: mem.critic_gradients as u64,
            note: format!("FP32 accumulation buffer{full}"),
        },
        MemItem {
            name: "critic_optimizer".into(),
            bytes: if offload == OptimizerOffload::OnGpu { mem.critic_optimizer as u64 } else { 0 },
            note: match offload {
                OptimizerOffload::OnGpu => format!(
                    "its own Adam (critic_lr): FP32 master + 2 moments, {} B/param, sharded over {} ranks",
                    model::optimizer_bytes_per_param(l.precision),
                    optimizer_shards(l)
                ),
                OptimizerOffload::Cpu => format!("{} kept in host memory", gb_fixed(mem.critic_optimizer)),
                OptimizerOffload::StreamFromDisk => format!("{} streamed from disk", gb_fixed(mem.critic_optimizer)),
            },
        },
        MemItem {
            name: "critic_activations".into(),
            bytes: mem.critic_activations as u64,
            note: match host {
                Some(h) => format!(
                    "value loss, libtorch fp32: seq {} x micro-batch {}, x{}; no vocab-wide tensors",
                    t.seq_len.value, t.micro_batch.value, h.autograd_scale
                ),
                None => format!(
                    "value loss: seq {} / CP{}, micro-batch {}, recompute {}; no logits",
                    t.seq_len.value,
                    l.cp,
                    t.micro_batch.value,
                    recompute_name(t.recompute.value)
                ),
            },
        },
    ]
}

/// On-policy distillation's teacher, item by item: its frozen weights and its no-grad forward's
/// activations (docs/plan.md, "On-policy distillation: the teacher").
fn teacher_items(tm: &ModelSpec, l: &Layout, t: &Trainer, mem: &TrainMem, host: Option<&EmbeddedHost>) -> Vec<MemItem> {
    if t.teacher_process {
        // Its own process holds it: what that process needs, beside (not on) this rank.
        let w = model::teacher_weight_bytes(tm, l, host.is_some());
        let a = match host {
            Some(_) => model::embedded_teacher_activation_bytes(tm, t.seq_len.value, t.micro_batch.value),
            None => model::teacher_activation_bytes(tm, l, t.seq_len.value, t.micro_batch.value),
        };
        return vec![MemItem {
            name: "teacher_process".into(),
            bytes: 0,
            note: format!(
                "OPD teacher {} in a worker process of its own (process = true): {} of weights + {} of activations there, not here",
                tm.name,
                crate::units::gb(w as u64),
                crate::units::gb(a as u64)
            ),
        }];
    }
    let weights = match host {
        Some(_) => "fp32 x 4 B, whole".to_string(),
        None => format!("{} x {} B, sharded like the policy's", l.precision.as_str(), l.precision.bytes()),
    };
    vec![
        MemItem {
            name: "teacher_weights".into(),
            bytes: mem.teacher_weights as u64,
            note: format!(
                "OPD teacher {}, {} params, {weights}: frozen, no gradients, no optimizer state",
                tm.name,
                param_count(tm.params)
            ),
        },
        MemItem {
            name: "teacher_activations".into(),
            bytes: mem.teacher_activations as u64,
            note: match host {
                Some(_) => format!(
                    "no-grad forward, fp32: one layer + logits and log-softmax of seq {} x micro-batch {}",
                    t.seq_len.value, t.micro_batch.value
                ),
                None => format!(
                    "no-grad forward: one layer + FP32 logits and log-softmax, seq {} / CP{}, micro-batch {}",
                    t.seq_len.value, l.cp, t.micro_batch.value
                ),
            },
        },
    ]
}

/// The adapters by name and size, and the full fine-tune this rank would hold without them.
#[allow(clippy::too_many_arguments)]
fn lora_report(
    m: &ModelSpec,
    l: &Layout,
    t: &Trainer,
    critic: bool,
    lo: &Lora,
    global: Option<u64>,
    recompute: Recompute,
    host: Option<&EmbeddedHost>,
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
    let f = train_mem(m, l, &full, critic, global, recompute, host);
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
    critic: bool,
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
            stream_cost(mem.all_optimizer()).seconds
        ));
    }
    if offload != OptimizerOffload::Cpu {
        let x = mem.on_gpu(OptimizerOffload::Cpu);
        fixes.push(format!(
            "`optimizer = adam {{ state = cpu }}`: {} per GPU ({}), needs {} host memory per GPU, est. +{:.1} s per step",
             gb_fixed(x),
            verdict(x),
             gb_fixed(mem.all_optimizer()),
            cpu_cost(mem.all_optimizer()).seconds
        ));
    }
    if l.backend != Backend::Embedded && (offload == OptimizerOffload::OnGpu || l.backend == Backend::Fsdp) {
        // More data-parallel replicas shard the optimizer state (and, under FSDP, everything).
        // Only layouts the cluster can hold.
        for k in [2u64, 4, 8, 16].into_iter().filter(|k| gpus.saturating_mul(*k) <= cx.total_gpus) {
            let l2 = Layout { dp: l.dp * k, ..*l };
            let x = train_mem(m, &l2, t, critic, global, t.recompute.value, None).on_gpu(offload);
            if x <= usable {
                fixes.push(format!("{} GPUs for this stage (DP{}): {} per GPU", gpus * k, l2.dp, gb_fixed(x)));
                break;
            }
        }
    }
    // `recompute` is a field of `megatron` only (std/prelude): offer it to no other backend.
    if l.backend == Backend::Megatron && t.recompute.value != Recompute::Full {
        let x = train_mem(m, l, t, critic, global, Recompute::Full, None).on_gpu(offload);
        fixes.push(format!("`recompute = full`: {} per GPU ({})", gb_fixed(x), verdict(x)));
    }
    if l.backend == Backend::Megatron && m.layers >= 2 * l.pp && l.dp.is_multiple_of(2) {
        let l2 = Layout { pp: l.pp * 2, dp: l.dp / 2, ..*l };
        let x = train_mem(m, &l2, t, critic, global, t.recompute.value, None).on_gpu(offload);
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
