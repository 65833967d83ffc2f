//! Memory formulas. Every function is total: sizes are checked to be non-zero by the caller,
//! and divisions go through `div` so a zero that slips through gives 0, never a panic or NaN.
//! docs/plan.md derives each formula.

use crate::input::{Attention, Backend, Lora, LoraTarget, ModelSpec, Precision, Recompute};

mod activations;
mod embedded;
mod lora;
mod roles;
mod rollout;
#[cfg(test)]
mod tests;

pub(crate) use activations::*;
pub(crate) use embedded::*;
pub(crate) use lora::*;
pub(crate) use roles::*;
pub(crate) use rollout::*;

/// `a / b`, 0 when `b` is 0.
pub(crate) fn div(a: f64, b: f64) -> f64 {
    if b == 0.0 || !b.is_finite() {
        0.0
    } else {
        a / b
    }
}

/// Parameters split into the routed experts and everything else (attention, embeddings,
/// dense MLPs, shared experts, norms).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct ParamSplit {
    pub routed: f64,
    pub other: f64,
}

/// Total minus active parameters are the experts a token does not use: (E - k) of the E routed
/// experts of every MoE layer. So one expert (summed over layers) is (total - active) / (E - k)
/// and all routed experts are E times that. Needs no per-expert figure from the model card.
pub(crate) fn param_split(m: &ModelSpec) -> ParamSplit {
    let total = m.params as f64;
    if m.experts > m.top_k && m.top_k > 0 && m.params > m.active_params {
        let per_expert = (total - m.active_params as f64) / (m.experts - m.top_k) as f64;
        let routed = (per_expert * m.experts as f64).min(total);
        ParamSplit { routed, other: total - routed }
    } else {
        ParamSplit { routed: 0.0, other: total }
    }
}

/// Layers with routed experts (R3 records one routing decision per such layer).
pub(crate) fn moe_layers(m: &ModelSpec) -> u64 {
    if m.experts == 0 {
        0
    } else {
        m.layers.saturating_sub(m.dense_layers)
    }
}

/// The trainer layout with every size at least 1 (checked by the caller).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Layout {
    pub backend: Backend,
    pub tp: u64,
    pub pp: u64,
    pub cp: u64,
    pub ep: u64,
    pub dp: u64,
    pub precision: Precision,
}

impl Layout {
    /// Expert tensor parallelism: Megatron's MoE recipes run experts without TP once EP > 1
    /// (`--expert-tensor-parallel-size 1`); with EP = 1 experts are split like dense layers.
    pub fn etp(&self) -> u64 {
        if self.ep > 1 {
            1
        } else {
            self.tp
        }
    }
    /// Expert data parallelism: the ranks left over once the experts are placed
    /// (tp x cp x dp = etp x ep x edp, Megatron's "parallel folding").
    pub fn edp(&self) -> u64 {
        (self.tp * self.cp * self.dp) / (self.etp() * self.ep).max(1)
    }
}

/// Parameters held by one rank, and the share of optimizer state it owns.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct RankParams {
    /// Parameters whose weights (and gradients) live on the rank.
    pub local: f64,
    /// Parameters whose optimizer state lives on the rank.
    pub optimizer: f64,
}

pub(crate) fn rank_params(m: &ModelSpec, l: &Layout) -> RankParams {
    shard_params(param_split(m), l)
}

/// The rank's share of parameters split into routed experts and the rest: the base model's, or
/// LoRA adapters', which are laid out like the layers they wrap.
pub(crate) fn shard_params(s: ParamSplit, l: &Layout) -> RankParams {
    match l.backend {
        Backend::Megatron => {
            let (tp, pp, cp, dp, ep) = (l.tp as f64, l.pp as f64, l.cp as f64, l.dp as f64, l.ep as f64);
            let (etp, edp) = (l.etp() as f64, l.edp() as f64);
            let other_local = div(s.other, tp * pp);
            let routed_local = div(s.routed, ep * etp * pp);
            // The distributed optimizer shards each parameter's state over its data-parallel
            // group: dp x cp for dense parameters, the expert data-parallel group for experts.
            RankParams {
                local: other_local + routed_local,
                optimizer: div(other_local, dp * cp) + div(routed_local, edp),
            }
        }
        Backend::Fsdp => {
            // FSDP shards parameters, gradients and optimizer state over all data-parallel ranks.
            let world = (l.dp * l.tp * l.pp * l.cp) as f64;
            let shard = div(s.routed + s.other, world);
            RankParams { local: shard, optimizer: shard }
        }
        Backend::Embedded => RankParams { local: s.routed + s.other, optimizer: s.routed + s.other },
    }
}

/// Bytes per parameter of optimizer state: FP32 master weights plus two Adam moments (12), or
/// only the moments (8) when the model already trains in FP32 and is its own master copy.
pub(crate) fn optimizer_bytes_per_param(p: Precision) -> f64 {
    if p == Precision::Fp32 {
        8.0
    } else {
        12.0
    }
}

/// Weight, gradient and optimizer bytes on one rank.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct StateBytes {
    /// The model's weights (with LoRA: the frozen base).
    pub weights: f64,
    /// LoRA adapter weights, all adapters (0 for a full fine-tune).
    pub adapters: f64,
    pub gradients: f64,
    pub optimizer: f64,
}

/// The base model's weight bytes on one rank.
fn base_weight_bytes(m: &ModelSpec, l: &Layout) -> f64 {
    let wb = l.precision.bytes();
    let mut weights = rank_params(m, l).local * wb;
    if l.backend == Backend::Fsdp {
        // FSDP gathers one layer's full weights for compute and prefetches the next.
        weights += 2.0 * div(m.params as f64, m.layers as f64) * wb;
    }
    weights
}

/// Full fine-tuning, or with `lora` a frozen base (weights only) plus the adapters, whose
/// gradients and optimizer state are the only ones (all `adapters` of them, laid out like the
/// layers they wrap).
pub(crate) fn state_bytes(m: &ModelSpec, l: &Layout, lora: Option<&Lora>) -> StateBytes {
    let trained = match lora {
        None => rank_params(m, l),
        Some(lo) => {
            let a = lora_params(m, lo);
            let n = lo.adapters.value.max(1) as f64;
            shard_params(ParamSplit { routed: a.routed * n, other: a.other * n }, l)
        }
    };
    StateBytes {
        weights: base_weight_bytes(m, l),
        adapters: if lora.is_some() { trained.local * l.precision.bytes() } else { 0.0 },
        // Gradients accumulate in FP32 (Megatron's main_grad buffer; FSDP's reduce dtype).
        gradients: trained.local * 4.0,
        optimizer: trained.optimizer * optimizer_bytes_per_param(l.precision),
    }
}

/// Width of one routed expert's MLP in an MoE model: one expert in one MoE layer is
/// (P - A) / (E - k) / MoE layers parameters, 3 x d_model x width of them (SwiGLU gate, up, down).
pub(crate) fn expert_width(m: &ModelSpec) -> f64 {
    let per_expert = div(param_split(m).routed, m.experts as f64);
    div(per_expert, moe_layers(m) as f64 * 3.0 * m.hidden_size as f64)
}

/// Width of a dense layer's MLP: the model's `intermediate_size` when given, else what is left
/// of a layer's parameters after attention, once one vocab x d_model embedding is set aside:
/// ((P - vocab d) / layers - attention) / 3 d (an overestimate when the embeddings are untied).
pub(crate) fn dense_mlp_width(m: &ModelSpec) -> f64 {
    if let Some(f) = m.intermediate_size {
        return f as f64;
    }
    let (h, layers) = (m.hidden_size as f64, m.layers as f64);
    let attention = 2.0 * h * (m.heads * m.head_dim) as f64 + 2.0 * h * (m.kv_heads * m.head_dim) as f64;
    let per_layer = div(m.params as f64 - m.vocab as f64 * h, layers);
    div(per_layer - attention, 3.0 * h).max(0.0)
}
