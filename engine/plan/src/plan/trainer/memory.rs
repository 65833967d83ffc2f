//! A trainer rank's memory: the device it lives on ([`Budget`]), what each model it holds takes
//! ([`Held`]: the policy, PPO's critic, OPD's teacher), what the rank holds beside them
//! ([`TrainMem`]), and the rows the plan prints, one [`Rank::items_for`] per model.

use super::host::EmbeddedHost;
use crate::input::*;
use crate::model::{self, Layout};
use crate::output::*;
use crate::plan::Ctx;
use crate::units::{gb_fixed, params as param_count};

/// Where a trainer rank's memory lives and how much of it the plan may use.
pub(super) struct Budget {
    pub(super) device: String,
    pub(super) capacity: u64,
    pub(super) share: f64,
    pub(super) usable: f64,
    /// The embedded process computes on the GPU of a `local` cluster (the host is the other place
    /// it could run).
    pub(super) local_gpu: bool,
}

impl Budget {
    /// The rank's device: a GPU of the stage's ranges, the GPU a `local` cluster resolved to, or
    /// the host; `None` when there is none.
    pub(super) fn of(cx: &Ctx, device: Option<&GpuSpec>, on_host: bool, backend: Backend) -> Option<Budget> {
        let a = &cx.input.assumptions;
        // The embedded process on a `local` cluster whose device resolved to a GPU keeps every
        // tensor there (docs/gpu.md): its memory is checked against that GPU's, as the driver
        // reports it.
        let on_gpu =
            cx.gpu.as_ref().filter(|_| on_host && backend == Backend::Embedded).map(|g| (g.name.clone(), g.memory));
        let (name, capacity, share) = match (device, &cx.input.cluster.host, &on_gpu) {
            (Some(g), _, _) if !on_host => (g.name.clone(), g.hbm, a.usable_hbm),
            (_, _, Some((name, memory))) => (name.clone(), *memory, a.usable_hbm),
            (_, Some(h), _) => (h.name.clone(), h.memory, a.usable_hbm),
            _ => return None,
        };
        let usable = capacity as f64 * share;
        Some(Budget { device: name, capacity, share, usable, local_gpu: on_gpu.is_some() })
    }
}

/// A model a trainer rank holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ModelRole {
    /// The trained policy (with LoRA: a frozen base and its adapters).
    Policy,
    /// PPO's critic: a full fine-tune of `model::critic_spec` under the policy's layout, its
    /// optimizer state kept where the policy's is (docs/plan.md, "PPO").
    Critic,
    /// On-policy distillation's teacher: frozen weights and the live tensors of its no-grad
    /// forward over one micro-batch (docs/plan.md, "On-policy distillation: the teacher").
    Teacher,
}

impl ModelRole {
    /// Its rows' names: `weights`, `critic_weights`, `teacher_weights`...
    fn prefix(self) -> &'static str {
        match self {
            ModelRole::Policy => "",
            ModelRole::Critic => "critic_",
            ModelRole::Teacher => "teacher_",
        }
    }

    /// Trained: it has gradients and optimizer state.
    fn trains(self) -> bool {
        self != ModelRole::Teacher
    }

    fn item(self, what: &str, bytes: f64, note: String) -> MemItem {
        MemItem { name: format!("{}{what}", self.prefix()), bytes: bytes as u64, note }
    }
}

/// What one model takes on the rank (0 where it holds none: a teacher has no gradients).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Held {
    /// With LoRA, the policy's frozen base.
    pub(super) weights: f64,
    /// The policy's LoRA adapters (0 without LoRA, and for the other models).
    pub(super) adapters: f64,
    pub(super) gradients: f64,
    pub(super) optimizer: f64,
    pub(super) activations: f64,
}

pub(super) struct TrainMem {
    pub(super) policy: Held,
    /// 0 without a critic.
    pub(super) critic: Held,
    /// 0 without a teacher, or with one in a process of its own.
    pub(super) teacher: Held,
    /// LoRA dropout's kept copies of the wrapped layers' inputs (0 without dropout).
    pub(super) lora_dropout: f64,
    pub(super) stream_buffer: f64,
    /// The embedded process on a CPU-only host (0 elsewhere): its other copies of the weights
    /// and its fixed resident base.
    pub(super) weight_copies: f64,
    pub(super) process: f64,
    /// The embedded trainer's bf16 GEMMs (`precision = bf16`): bf16 copies of the weights, made
    /// per forward and kept for backward (0 in fp32).
    pub(super) gemm_casts: f64,
}

impl TrainMem {
    fn of(&self, role: ModelRole) -> &Held {
        match role {
            ModelRole::Policy => &self.policy,
            ModelRole::Critic => &self.critic,
            ModelRole::Teacher => &self.teacher,
        }
    }

    pub(super) fn on_gpu(&self, offload: OptimizerOffload) -> f64 {
        let on_gpu = offload == OptimizerOffload::OnGpu;
        let opt = if on_gpu { self.policy.optimizer } else { 0.0 };
        let buf = if offload == OptimizerOffload::StreamFromDisk { self.stream_buffer } else { 0.0 };
        let critic_opt = if on_gpu { self.critic.optimizer } else { 0.0 };
        // Summed in this order (the plan's totals are these bytes, to the byte).
        self.policy.weights
            + self.policy.adapters
            + self.policy.gradients
            + opt
            // The critic trains after the policy's passes have freed their graphs (the embedded
            // trainer does; PPO trainers generally run the two losses as separate phases), and
            // the teacher's forward runs before the policy's passes: the peak holds one of the
            // activation sets, not their sum.
            + self.policy.activations.max(self.critic.activations).max(self.teacher.activations)
            + self.lora_dropout
            + buf
            + self.weight_copies
            + self.process
            + self.critic.weights
            + self.critic.gradients
            + critic_opt
            + self.teacher.weights
            + self.gemm_casts
    }

    /// Optimizer state of the policy and the critic together: what an offload moves.
    pub(super) fn all_optimizer(&self) -> f64 {
        self.policy.optimizer + self.critic.optimizer
    }
}

/// A trainer rank: its layout, the trainer's fields, whether it trains a critic, the global
/// batch (for micro-batches in flight), its recomputation, and the embedded process where it is
/// one. What-ifs (`fixes`, `lora`) are the same rank with one of these changed.
#[derive(Clone, Copy)]
pub(super) struct Rank<'a> {
    pub(super) l: &'a Layout,
    pub(super) t: &'a Trainer,
    pub(super) critic: bool,
    pub(super) global: Option<u64>,
    pub(super) recompute: Recompute,
    pub(super) host: Option<&'a EmbeddedHost>,
}

impl Rank<'_> {
    /// Micro-batches per optimizer step on one replica, where the global batch is known.
    fn micro(&self) -> Option<u64> {
        self.global.map(|g| g / (self.l.dp * self.t.micro_batch.value).max(1))
    }

    /// A data-parallel embedded trainer's ranks (1: one process).
    pub(super) fn ranks(&self) -> u64 {
        self.t.data_parallel.as_ref().map_or(1, |d| d.ranks.value.max(1))
    }

    /// The share of the optimizer state the rank holds: 1/N of the Adam moments under ZeRO-1
    /// (each rank keeps the moments of the parameters it owns), else all of it.
    fn optimizer_share(&self) -> f64 {
        match &self.t.data_parallel {
            Some(d) if d.zero.value == Zero::Optimizer => 1.0 / self.ranks() as f64,
            _ => 1.0,
        }
    }

    /// What `m` takes on the rank in `role` (for the critic, `m` is the policy it derives from).
    fn held(&self, m: &ModelSpec, role: ModelRole) -> Held {
        let (l, t) = (self.l, self.t);
        let (seq, mb) = (t.seq_len.value, t.micro_batch.value);
        let (micro, recompute) = (self.micro(), self.recompute);
        match role {
            ModelRole::Policy => {
                let s = model::state_bytes(m, l, t.lora.as_ref());
                let activations = match self.host {
                    Some(h) => {
                        h.autograd_scale
                            * model::embedded_activation_bytes(m, seq, mb, h.entropy_in_loss, t.lora.as_ref())
                    }
                    None => model::activation_bytes(m, l, seq, mb, micro, recompute),
                };
                Held {
                    weights: s.weights,
                    adapters: s.adapters,
                    gradients: s.gradients,
                    optimizer: s.optimizer * self.optimizer_share(),
                    activations,
                }
            }
            ModelRole::Critic => {
                let s = model::critic_state_bytes(m, l);
                let activations = match self.host {
                    Some(h) => h.autograd_scale * model::embedded_critic_activation_bytes(m, seq, mb),
                    None => model::critic_activation_bytes(m, l, seq, mb, micro, recompute),
                };
                Held {
                    weights: s.weights,
                    adapters: 0.0,
                    gradients: s.gradients,
                    optimizer: s.optimizer * self.optimizer_share(),
                    activations,
                }
            }
            ModelRole::Teacher => Held {
                weights: model::teacher_weight_bytes(m, l, self.host.is_some()),
                activations: match self.host {
                    Some(_) => model::embedded_teacher_activation_bytes(m, seq, mb),
                    None => model::teacher_activation_bytes(m, l, seq, mb),
                },
                ..Held::default()
            },
        }
    }

    /// The rank's memory with `m` as the policy.
    pub(super) fn mem(&self, m: &ModelSpec) -> TrainMem {
        let (l, t) = (self.l, self.t);
        let policy = self.held(m, ModelRole::Policy);
        let critic = if self.critic { self.held(m, ModelRole::Critic) } else { Held::default() };
        // A teacher in a process of its own holds its memory there (`items_for` says how much).
        let teacher = t.teacher.as_ref().filter(|_| !t.teacher_process);
        let teacher = teacher.map_or(Held::default(), |tm| self.held(tm, ModelRole::Teacher));
        let lora_dropout = t.lora.as_ref().map_or(0.0, |lo| {
            model::lora_dropout_bytes(m, l, lo, t.seq_len.value, t.micro_batch.value, self.micro(), self.recompute)
        });
        let layers_per_stage = m.layers.div_ceil(l.pp.max(1)).max(1) as f64;
        TrainMem {
            policy,
            critic,
            teacher,
            lora_dropout,
            stream_buffer: 2.0 * (policy.optimizer + critic.optimizer) / layers_per_stage,
            // Each copy is a deep copy of the policy: base weights and any adapters.
            weight_copies: self.host.map_or(0.0, |h| h.copy_bytes(policy.weights + policy.adapters, l.precision)),
            process: self.host.map_or(0.0, |h| h.process_bytes),
            gemm_casts: match (self.host, t.precision.value) {
                (Some(_), Precision::Bf16) => policy.weights / 2.0,
                _ => 0.0,
            },
        }
    }

    /// Every row of the rank: the policy's, the critic's, the teacher's, then what the rank holds
    /// beside them.
    pub(super) fn items(&self, m: &ModelSpec, mem: &TrainMem, lora: Option<&LoraReport>) -> Vec<MemItem> {
        let mut items = self.items_for(m, ModelRole::Policy, mem, lora);
        if self.critic {
            items.extend(self.items_for(m, ModelRole::Critic, mem, lora));
        }
        if let Some(tm) = &self.t.teacher {
            items.extend(self.items_for(tm, ModelRole::Teacher, mem, lora));
        }
        items.extend(self.rank_items(m, mem));
        items
    }

    /// One model's rows, item by item: its weights (and the policy's adapters), gradients and
    /// optimizer state where it trains, activations, and the policy's bf16 GEMM casts. A teacher
    /// in a process of its own is one row saying what that process holds.
    fn items_for(&self, m: &ModelSpec, role: ModelRole, mem: &TrainMem, lora: Option<&LoraReport>) -> Vec<MemItem> {
        if role == ModelRole::Teacher && self.t.teacher_process {
            return vec![self.teacher_process_item(m)];
        }
        let held = mem.of(role);
        let mut items = vec![role.item("weights", held.weights, self.weights_note(m, role))];
        if let (ModelRole::Policy, Some(r)) = (role, lora) {
            items.push(role.item("adapters", held.adapters, format!("{}, {}", r.summary, self.l.precision.as_str())));
        }
        if role.trains() {
            let offload = self.t.optimizer_offload.value;
            let optimizer = if offload == OptimizerOffload::OnGpu { held.optimizer } else { 0.0 };
            items.push(role.item("gradients", held.gradients, self.gradients_note(role)));
            items.push(role.item("optimizer", optimizer, self.optimizer_note(role, held.optimizer)));
        }
        items.push(role.item("activations", held.activations, self.activations_note(role)));
        if role == ModelRole::Policy && mem.gemm_casts > 0.0 {
            items.push(MemItem {
                name: "gemm_casts".into(),
                bytes: mem.gemm_casts as u64,
                note: "bf16 x 2 B: the weights the bf16 GEMMs read (precision = bf16), kept for backward".into(),
            });
        }
        items
    }

    /// An OPD teacher in a worker process of its own: what that process needs, beside (not on)
    /// this rank.
    fn teacher_process_item(&self, tm: &ModelSpec) -> MemItem {
        let there = self.held(tm, ModelRole::Teacher);
        MemItem {
            name: "teacher_process".into(),
            bytes: 0,
            note: format!(
                "OPD teacher {} in a worker process of its own (process = true): {} of weights + {} of activations there, not here",
                tm.name,
                crate::units::gb(there.weights as u64),
                crate::units::gb(there.activations as u64)
            ),
        }
    }

    fn weights_note(&self, m: &ModelSpec, role: ModelRole) -> String {
        // The embedded process's layout is fp32 (`layout::check_layout`): `fp32 x 4 B` there.
        let precision = format!("{} x {} B", self.l.precision.as_str(), self.l.precision.bytes());
        match role {
            ModelRole::Policy if self.t.lora.is_some() => {
                format!("frozen base, {precision}: no gradients, no optimizer state")
            }
            ModelRole::Policy => precision,
            ModelRole::Critic => {
                let head = match m.tied_embeddings {
                    Some(false) => format!("LM head {} x {} dropped", m.vocab, m.hidden_size),
                    Some(true) => "tied embedding kept".to_string(),
                    None => "embedding tying unknown: LM head counted (upper bound)".to_string(),
                };
                let params = param_count(model::critic_spec(m).params);
                format!("{params} params: policy, {head}, + value head {}; {precision}", m.hidden_size)
            }
            ModelRole::Teacher => {
                let how = if self.host.is_some() { "whole" } else { "sharded like the policy's" };
                format!(
                    "OPD teacher {}, {} params, {precision}, {how}: frozen, no gradients, no optimizer state",
                    m.name,
                    param_count(m.params)
                )
            }
        }
    }

    fn gradients_note(&self, role: ModelRole) -> String {
        match (role, self.t.lora.is_some()) {
            (ModelRole::Policy, true) => "FP32, adapters only".into(),
            (ModelRole::Critic, true) => "FP32 accumulation buffer, trained in full (LoRA is the policy's)".into(),
            _ => "FP32 accumulation buffer".into(),
        }
    }

    /// Where the optimizer state of `bytes` is kept: on the GPU, sharded; in host memory; or
    /// streamed from disk (`offload`).
    fn optimizer_note(&self, role: ModelRole, bytes: f64) -> String {
        match self.t.optimizer_offload.value {
            OptimizerOffload::OnGpu if self.ranks() > 1 => self.ranks_optimizer_note(role),
            OptimizerOffload::OnGpu => {
                let per_param = model::optimizer_bytes_per_param(self.l.precision);
                let shards = optimizer_shards(self.l);
                match role {
                    ModelRole::Critic => format!(
                        "its own Adam (critic_lr): FP32 master + 2 moments, {per_param} B/param, sharded over {shards} ranks"
                    ),
                    _ => {
                        let only = if self.t.lora.is_some() { ", adapters only" } else { "" };
                        format!("FP32 master + 2 Adam moments, {per_param} B/param{only}, sharded over {shards} ranks")
                    }
                }
            }
            OptimizerOffload::Cpu => format!("{} kept in host memory", gb_fixed(bytes)),
            OptimizerOffload::StreamFromDisk => format!("{} streamed from disk", gb_fixed(bytes)),
        }
    }

    /// A data-parallel embedded trainer's Adam state on one rank: whole on every rank, or its
    /// 1/N under ZeRO-1, which rank 0 gathers whole while it writes a checkpoint.
    fn ranks_optimizer_note(&self, role: ModelRole) -> String {
        let per_param = model::optimizer_bytes_per_param(self.l.precision);
        let n = self.ranks();
        let what = match (role, self.t.lora.is_some()) {
            (ModelRole::Critic, _) => "the critic's 2 Adam moments (critic_lr)",
            (_, true) => "2 Adam moments, adapters only",
            _ => "2 Adam moments",
        };
        if self.optimizer_share() < 1.0 {
            format!(
                "{what}, {per_param} B/param: 1/{n} on each of {n} ranks (zero = optimizer: the parameters a rank owns, greedy by size; rank 0 gathers the rest while it writes a checkpoint)"
            )
        } else {
            format!("{what}, {per_param} B/param: whole on each of {n} ranks (zero = none)")
        }
    }

    /// The activations' shape: libtorch's fp32 tensors in the embedded process, else the
    /// sequence split over CP with the rank's recomputation.
    fn activations_note(&self, role: ModelRole) -> String {
        let (seq, mb) = (self.t.seq_len.value, self.t.micro_batch.value);
        match self.host {
            Some(h) => {
                let shape = format!("seq {seq} x micro-batch {mb}");
                let scale = h.autograd_scale;
                match role {
                    ModelRole::Policy => format!("libtorch autograd, fp32: {shape}, x{scale} for backward"),
                    ModelRole::Critic => format!("value loss, libtorch fp32: {shape}, x{scale}; no vocab-wide tensors"),
                    ModelRole::Teacher => {
                        format!("no-grad forward, fp32: one layer + logits and log-softmax of {shape}")
                    }
                }
            }
            None => {
                let shape = format!("seq {seq} / CP{}, micro-batch {mb}", self.l.cp);
                let recompute = recompute_name(self.recompute);
                match role {
                    ModelRole::Policy => format!("{shape}, recompute {recompute}"),
                    ModelRole::Critic => format!("value loss: {shape}, recompute {recompute}; no logits"),
                    ModelRole::Teacher => {
                        format!("no-grad forward: one layer + FP32 logits and log-softmax, {shape}")
                    }
                }
            }
        }
    }

    /// What the rank holds beside its models: the embedded process's other copies of the weights
    /// and its resident base, LoRA dropout's kept inputs, and the optimizer stream's buffer.
    fn rank_items(&self, m: &ModelSpec, mem: &TrainMem) -> Vec<MemItem> {
        let (l, t) = (self.l, self.t);
        let mut items = Vec::new();
        if let Some(h) = self.host {
            if !h.copy_names().is_empty() {
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
                    note: if self.ranks() > 1 {
                        format!("in each of the {} ranks' processes: libtorch, runtime and task data resident (measured in one)", self.ranks())
                    } else {
                        "libtorch, runtime and task data resident (measured)".into()
                    },
                });
            }
        }
        if let Some(lo) = t.lora.as_ref().filter(|lo| lo.dropout > 0.0) {
            let held = if self.recompute == Recompute::Full {
                "one layer while it is recomputed".to_string()
            } else {
                let n = model::in_flight(l, self.micro());
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
        if t.optimizer_offload.value == OptimizerOffload::StreamFromDisk {
            items.push(MemItem {
                name: "stream_buffer".into(),
                bytes: mem.stream_buffer as u64,
                note: "two layers of optimizer state in flight".into(),
            });
        }
        items
    }
}

/// Ranks the optimizer state is sharded over.
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
