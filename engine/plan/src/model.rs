//! Memory formulas. Every function is total: sizes are checked to be non-zero by the caller,
//! and divisions go through `div` so a zero that slips through gives 0, never a panic or NaN.
//! docs/plan.md derives each formula.

use crate::input::{Attention, Backend, Lora, LoraTarget, ModelSpec, Precision, Recompute};

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

/// (in, out) features of a wrapped linear layer; `mlp` is the MLP width it belongs to.
pub(crate) fn lora_shape(m: &ModelSpec, t: LoraTarget, mlp: f64) -> (f64, f64) {
    let h = m.hidden_size as f64;
    let (q, kv) = ((m.heads * m.head_dim) as f64, (m.kv_heads * m.head_dim) as f64);
    match t {
        LoraTarget::QProj => (h, q),
        LoraTarget::KProj | LoraTarget::VProj => (h, kv),
        LoraTarget::OProj => (q, h),
        LoraTarget::GateProj | LoraTarget::UpProj => (h, mlp),
        LoraTarget::DownProj => (mlp, h),
    }
}

/// Linear layers one target wraps in the whole model, and their MLP width: one per layer for an
/// attention projection; for an MLP projection one per dense layer, and in an MoE model one per
/// routed expert of each MoE layer (PEFT wraps every expert's own linear layer). The dense layers
/// of an MoE model count only when the model gives their width (`intermediate_size`).
pub(crate) fn lora_instances(m: &ModelSpec, t: LoraTarget) -> Vec<(f64, f64, bool)> {
    if !t.is_mlp() {
        return vec![(m.layers as f64, 0.0, false)];
    }
    if param_split(m).routed > 0.0 {
        let mut v = vec![((moe_layers(m) * m.experts) as f64, expert_width(m), true)];
        if let Some(f) = m.intermediate_size.filter(|_| m.dense_layers > 0) {
            v.push((m.dense_layers as f64, f as f64, false));
        }
        v
    } else {
        vec![(m.layers as f64, dense_mlp_width(m), false)]
    }
}

/// One adapter's parameters on one target: rank x (in + out) per wrapped linear layer (A is
/// rank x in, B out x rank), split into those on routed experts and the rest.
pub(crate) fn lora_target_params(m: &ModelSpec, t: LoraTarget, rank: u64) -> ParamSplit {
    let mut s = ParamSplit { routed: 0.0, other: 0.0 };
    for (n, mlp, expert) in lora_instances(m, t) {
        let (i, o) = lora_shape(m, t, mlp);
        let p = n * rank as f64 * (i + o);
        if expert {
            s.routed += p;
        } else {
            s.other += p;
        }
    }
    s
}

/// One adapter's parameters over its target modules.
pub(crate) fn lora_params(m: &ModelSpec, lora: &Lora) -> ParamSplit {
    let mut s = ParamSplit { routed: 0.0, other: 0.0 };
    for &t in &lora.target_modules {
        let p = lora_target_params(m, t, lora.rank.value);
        s.routed += p.routed;
        s.other += p.other;
    }
    s
}

/// Activation bytes of one transformer layer for one micro-batch on one rank
/// (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
/// with tensor and sequence parallelism; `s` is the rank's share of the sequence after CP).
/// The s^2 attention-score term is left out: flash attention never stores the scores, which
/// also makes `selective` (the paper's recomputation of exactly that term) equal to `none`.
pub(crate) fn layer_activation_bytes(s: f64, b: f64, h: f64, tp: f64, recompute: Recompute) -> f64 {
    match recompute {
        Recompute::Off | Recompute::Selective => div(34.0 * s * b * h, tp),
        // Only the layer's input is kept (2 bytes per element, split by sequence parallelism).
        Recompute::Full => div(2.0 * s * b * h, tp),
    }
}

/// Activation bytes on the busiest rank (the first pipeline stage under 1F1B, which holds
/// `min(pp, micro-batches)` micro-batches in flight), plus the FP32 logits on the last stage
/// and, under full recomputation, one layer's full activations while it is recomputed.
pub(crate) fn activation_bytes(
    m: &ModelSpec,
    l: &Layout,
    seq_len: u64,
    micro_batch: u64,
    micro_batches: Option<u64>,
    recompute: Recompute,
) -> f64 {
    layer_stack_activation_bytes(m, l, seq_len, micro_batch, micro_batches, recompute)
        + logits_bytes(m, l, seq_len, micro_batch)
}

/// `activation_bytes` without the logits: the layers' activations on the busiest rank (and,
/// under full recomputation, the one layer being recomputed).
pub(crate) fn layer_stack_activation_bytes(
    m: &ModelSpec,
    l: &Layout,
    seq_len: u64,
    micro_batch: u64,
    micro_batches: Option<u64>,
    recompute: Recompute,
) -> f64 {
    let s = div(seq_len as f64, l.cp as f64);
    let (b, h, tp) = (micro_batch as f64, m.hidden_size as f64, l.tp as f64);
    let layers_per_stage = m.layers.div_ceil(l.pp.max(1)) as f64;
    let in_flight = in_flight(l, micro_batches);
    let per_layer = layer_activation_bytes(s, b, h, tp, recompute);
    let mut total = per_layer * layers_per_stage * in_flight;
    if recompute == Recompute::Full {
        total += layer_activation_bytes(s, b, h, tp, Recompute::Off);
    }
    total
}

/// The FP32 logits of one micro-batch on the last pipeline stage, split over TP by the
/// vocabulary-parallel head: s b vocab x 4 / TP.
pub(crate) fn logits_bytes(m: &ModelSpec, l: &Layout, seq_len: u64, micro_batch: u64) -> f64 {
    let s = div(seq_len as f64, l.cp as f64);
    div(s * micro_batch as f64 * m.vocab as f64 * 4.0, l.tp as f64)
}

/// FP32 elements the embedded libtorch trainer (engine/tch) keeps for the backward pass per token
/// of one transformer layer, counted from its forward (`Policy::forward`), with d = d_model,
/// q = heads x head_dim, kv = kv_heads x head_dim, f = the MLP width, H heads and S keys
/// (the sequence):
/// - two RMSNorms, 2d each (x x rsqrt and the output);
/// - the fused q|k|v GEMM's output, q + 2kv (its views stay alive through rotary);
/// - rotary on q and k together, 2(q + kv) (the rotated half and the result);
/// - grouped-query keys and values repeated to every head, 2q (0 when kv_heads = heads);
/// - attention scores and their softmax, 2 H S (libtorch's CPU attention with a mask);
/// - the attention output and its contiguous copy, 2q;
/// - the two residual sums, 2d;
/// - the fused gate|up output 2f, SiLU f and the gated product f (in an MoE layer f is the
///   token's top_k experts' widths, `embedded_mlp_width`);
/// - in an MoE layer, the router's logits and gates, 2 x experts.
///
/// Total 6d + 5q + 4kv (+ 2q) + 4f + 2 H S (+ 2 experts), averaged over the layers.
pub(crate) fn embedded_layer_elements(m: &ModelSpec, seq_len: u64) -> f64 {
    let d = m.hidden_size as f64;
    let q = (m.heads * m.head_dim) as f64;
    let kv = (m.kv_heads * m.head_dim) as f64;
    let f = embedded_mlp_width(m);
    let repeat = if m.kv_heads < m.heads { 2.0 * q } else { 0.0 };
    // An MoE layer's router writes its logits and their gate (softmax or sigmoid): 2 x experts.
    let router = div(2.0 * (moe_layers(m) * m.experts) as f64, m.layers as f64);
    6.0 * d + 5.0 * q + 4.0 * kv + repeat + 4.0 * f + router + 2.0 * (m.heads * seq_len) as f64
}

/// The MLP width a token passes through, averaged over the layers: a dense layer's `d_ff`; in an
/// MoE layer its top_k experts' widths (the shared expert, which a `transformer` may add, is not
/// counted: the planner's input has no width for it).
pub(crate) fn embedded_mlp_width(m: &ModelSpec) -> f64 {
    let moe = moe_layers(m) as f64;
    if moe == 0.0 {
        return dense_mlp_width(m);
    }
    let dense = (m.layers as f64 - moe).max(0.0);
    div(dense * dense_mlp_width(m) + moe * m.top_k as f64 * expert_width(m), m.layers as f64)
}

/// The MLP weights of a layer, averaged over the layers, whose concatenated gate|up copy a GEMM
/// keeps for its input gradient: d_ff of a dense layer, every expert's width in an MoE layer.
fn embedded_concat_mlp_width(m: &ModelSpec) -> f64 {
    let moe = moe_layers(m) as f64;
    if moe == 0.0 {
        return dense_mlp_width(m);
    }
    let dense = (m.layers as f64 - moe).max(0.0);
    div(dense * dense_mlp_width(m) + moe * m.experts as f64 * expert_width(m), m.layers as f64)
}

/// FP32 elements per token above the layers: the embedding's output d, the final RMSNorm 2d, and
/// three [tokens, vocab] tensors at the peak (the log-softmax autograd keeps, then the entropy's
/// exp and product in the forward, or the two vocabulary-wide gradients in the backward), one
/// more when the entropy is in the loss (its exp is then kept too).
pub(crate) fn embedded_head_elements(m: &ModelSpec, entropy_in_loss: bool) -> f64 {
    let vocab_tensors = if entropy_in_loss { 4.0 } else { 3.0 };
    3.0 * m.hidden_size as f64 + vocab_tensors * m.vocab as f64
}

/// The embedded trainer's activation bytes for one micro-batch (it runs one at a time), before
/// `Assumptions::embedded_autograd_scale`: tokens = micro-batch x seq, every layer's
/// `embedded_layer_elements` plus the head's, 4 B each (FP32), plus the per-call concatenated
/// q|k|v and gate|up weights each layer's GEMMs keep for their input gradient
/// ((q + 2kv) d + 2 f d per layer).
/// With LoRA each wrapped layer's adapter also keeps its A output (rank elements per token and
/// adapter) for B's gradient.
pub(crate) fn embedded_activation_bytes(
    m: &ModelSpec,
    seq_len: u64,
    micro_batch: u64,
    entropy_in_loss: bool,
    lora: Option<&Lora>,
) -> f64 {
    let layers = m.layers as f64;
    let adapters = lora
        .map_or(0.0, |lo| (lo.target_modules.len() as u64 * lo.rank.value * lo.adapters.value.max(1)) as f64 * layers);
    embedded_bytes(m, seq_len, micro_batch, embedded_head_elements(m, entropy_in_loss), adapters)
}

/// The embedded layers' activations for one micro-batch plus `head` and `adapters` FP32
/// elements per token, with the concatenated weights; see `embedded_activation_bytes`.
fn embedded_bytes(m: &ModelSpec, seq_len: u64, micro_batch: u64, head: f64, adapters: f64) -> f64 {
    let tokens = (seq_len * micro_batch) as f64;
    let layers = m.layers as f64;
    let d = m.hidden_size as f64;
    let (q, kv) = ((m.heads * m.head_dim) as f64, (m.kv_heads * m.head_dim) as f64);
    let concat = layers * ((q + 2.0 * kv) * d + 2.0 * embedded_concat_mlp_width(m) * d);
    let per_token = layers * embedded_layer_elements(m, seq_len) + head + adapters;
    (tokens * per_token + concat) * 4.0
}

/// PPO's critic (docs/plan.md, "PPO"): a second model of the policy's architecture whose LM
/// head (vocab x d_model) is replaced by a value head (d_model -> 1). Returns the LM head's
/// parameters it drops: vocab x d_model when the embeddings are untied; 0 when they are tied
/// (the head is the embedding, which the critic keeps) or when the model does not say
/// (`tied_embeddings: None`, as `schema llm`), which counts the critic as large as it can be.
pub(crate) fn critic_dropped_head(m: &ModelSpec) -> u64 {
    if m.tied_embeddings == Some(false) {
        m.vocab.saturating_mul(m.hidden_size)
    } else {
        0
    }
}

/// The critic as a model to size: the policy's parameters (and active parameters) minus the
/// dropped LM head plus the value head's d_model. Its routed experts are the policy's, so it
/// shards exactly as the policy does under the same layout. For weights, gradients and optimizer
/// state only (`state_bytes`): its other fields are the policy's.
pub(crate) fn critic_spec(m: &ModelSpec) -> ModelSpec {
    let (head, value) = (critic_dropped_head(m), m.hidden_size);
    ModelSpec {
        params: m.params.saturating_sub(head).saturating_add(value),
        active_params: m.active_params.saturating_sub(head).saturating_add(value),
        ..m.clone()
    }
}

/// The critic's weights, gradients and optimizer state on one rank: a full fine-tune of
/// `critic_spec` in the trainer's precision and layout (the critic is fully trained, whatever
/// `lora` says of the policy).
pub(crate) fn critic_state_bytes(m: &ModelSpec, l: &Layout) -> StateBytes {
    state_bytes(&critic_spec(m), l, None)
}

/// The critic's training activations on the busiest rank: the policy's layers, no
/// vocabulary-sized logits (its value head's output is one element per token, left out).
pub(crate) fn critic_activation_bytes(
    m: &ModelSpec,
    l: &Layout,
    seq_len: u64,
    micro_batch: u64,
    micro_batches: Option<u64>,
    recompute: Recompute,
) -> f64 {
    layer_stack_activation_bytes(m, l, seq_len, micro_batch, micro_batches, recompute)
}

/// The critic's activations on the embedded trainer, before the autograd scale: every layer's
/// `embedded_layer_elements` and the concatenated weights as for the policy, and above the
/// layers only the embedding's output and the final RMSNorm (3 d per token): no vocabulary-wide
/// tensors, no adapters.
pub(crate) fn embedded_critic_activation_bytes(m: &ModelSpec, seq_len: u64, micro_batch: u64) -> f64 {
    embedded_bytes(m, seq_len, micro_batch, 3.0 * m.hidden_size as f64, 0.0)
}

/// On-policy distillation's teacher (docs/plan.md, "On-policy distillation: the teacher"): its
/// weights on one trainer rank. Frozen, so weights only (no gradients, no optimizer state),
/// sharded like the policy's base weights under the trainer's layout and precision
/// (`base_weight_bytes`: FSDP also gathers two of its layers). `embedded_host`: the embedded
/// CPU backend loads it whole in FP32, params x 4 B, whatever the trainer's precision.
pub(crate) fn teacher_weight_bytes(teacher: &ModelSpec, l: &Layout, embedded_host: bool) -> f64 {
    if embedded_host {
        teacher.params as f64 * 4.0
    } else {
        base_weight_bytes(teacher, l)
    }
}

/// The teacher's no-grad forward over one micro-batch on a GPU trainer rank: nothing is kept for a
/// backward, so only the live tensors of one layer at a time, `layer_activation_bytes` without
/// recomputation (34 s b h / TP, h the teacher's d_model), plus the vocabulary-wide FP32 logits and
/// their log-softmax, 2 x `logits_bytes` (2 x 4 s b vocab / TP); s = seq / CP.
pub(crate) fn teacher_activation_bytes(teacher: &ModelSpec, l: &Layout, seq_len: u64, micro_batch: u64) -> f64 {
    let s = div(seq_len as f64, l.cp as f64);
    let layer = layer_activation_bytes(s, micro_batch as f64, teacher.hidden_size as f64, l.tp as f64, Recompute::Off);
    layer + 2.0 * logits_bytes(teacher, l, seq_len, micro_batch)
}

/// The teacher's no-grad forward on the embedded CPU backend, FP32 (no autograd, so no autograd
/// scale): one layer's intermediates at a time, `embedded_layer_elements` per token plus its
/// concatenated q|k|v and gate|up weights ((q + 2kv) d + 2 f d), and above the layers the
/// residual stream and final RMSNorm (3 d) and the logits and their log-softmax (2 x vocab) per
/// token; tokens = micro-batch x seq, 4 B each.
pub(crate) fn embedded_teacher_activation_bytes(teacher: &ModelSpec, seq_len: u64, micro_batch: u64) -> f64 {
    let tokens = (seq_len * micro_batch) as f64;
    let d = teacher.hidden_size as f64;
    let (q, kv) = ((teacher.heads * teacher.head_dim) as f64, (teacher.kv_heads * teacher.head_dim) as f64);
    let concat = (q + 2.0 * kv) * d + 2.0 * dense_mlp_width(teacher) * d;
    let per_token = embedded_layer_elements(teacher, seq_len) + 3.0 * d + 2.0 * teacher.vocab as f64;
    (tokens * per_token + concat) * 4.0
}

/// Micro-batches whose activations the busiest rank holds at once: `min(pp, micro-batches)`
/// under 1F1B (all `pp` when the micro-batch count is unknown).
pub(crate) fn in_flight(l: &Layout, micro_batches: Option<u64>) -> f64 {
    micro_batches.map_or(l.pp, |n| n.clamp(1, l.pp.max(1))) as f64
}

/// Bytes of the wrapped layers' inputs LoRA dropout keeps for the backward pass, over the whole
/// model for one micro-batch on one rank, before pipeline stages and recomputation (see
/// `lora_dropout_bytes`). PEFT applies `lora_dropout` to each wrapped linear layer's input before
/// the adapter's A; with dropout > 0 autograd keeps that dropped copy for A's weight gradient, one
/// tensor of tokens x in features per wrapped layer in the training precision (with dropout 0 the
/// adapter reuses the input the base layer already keeps: nothing extra).
///
/// Tokens on the rank: s b, s = seq_len / CP. Split over TP as the layer inputs are: under
/// sequence parallelism a column-parallel layer's input (q, k, v, gate, up) is split along the
/// sequence and a row-parallel one's (o, down) along its features, so both are s b in / TP.
/// Routed experts see only the tokens routed to them: with uniform routing each of the E experts
/// of a MoE layer gets k / E of the tokens, so the `lora_instances` count (E per MoE layer) x k/E
/// leaves k x tokens per MoE layer. Experts are split over ETP (not TP): with EP > 1 (ETP 1) each
/// rank receives k x its s b / TP tokens at full width; with EP 1 (ETP = TP) the TP group gathers
/// the tokens, so gate and up see all k s b at width h and down k s b at f / TP. Both are
/// k s b in x ETP / TP for gate and up, k s b in / TP for down.
pub(crate) fn lora_dropout_model_bytes(m: &ModelSpec, l: &Layout, lora: &Lora, seq_len: u64, micro_batch: u64) -> f64 {
    if lora.dropout <= 0.0 {
        return 0.0;
    }
    let tokens = div(seq_len as f64, l.cp as f64) * micro_batch as f64;
    let (tp, etp) = (l.tp as f64, l.etp() as f64);
    let routed_share = div(m.top_k as f64, m.experts as f64);
    let mut elems = 0.0;
    for &t in &lora.target_modules {
        for (n, mlp, expert) in lora_instances(m, t) {
            let (i, _) = lora_shape(m, t, mlp);
            elems += if !expert {
                div(n * tokens * i, tp)
            } else if t == LoraTarget::DownProj {
                div(n * routed_share * tokens * i, tp)
            } else {
                div(n * routed_share * tokens * i * etp, tp)
            };
        }
    }
    elems * l.precision.bytes()
}

/// LoRA dropout's kept inputs on the busiest rank (0 without dropout). Like `activation_bytes`:
/// the first pipeline stage's ceil(layers / p) layers (the model's bytes spread evenly over its
/// layers) for each of the `min(p, micro-batches)` micro-batches in flight. Under full
/// recomputation Megatron keeps only each layer's input and reruns the layer's forward in the
/// backward pass, dropout included (its RNG state is restored), so the kept inputs exist for one
/// layer of one micro-batch at a time: one average layer's, counted like the one layer of full
/// activations `activation_bytes` adds while it is recomputed.
pub(crate) fn lora_dropout_bytes(
    m: &ModelSpec,
    l: &Layout,
    lora: &Lora,
    seq_len: u64,
    micro_batch: u64,
    micro_batches: Option<u64>,
    recompute: Recompute,
) -> f64 {
    let per_layer = div(lora_dropout_model_bytes(m, l, lora, seq_len, micro_batch), m.layers as f64);
    match recompute {
        Recompute::Off | Recompute::Selective => {
            per_layer * m.layers.div_ceil(l.pp.max(1)) as f64 * in_flight(l, micro_batches)
        }
        Recompute::Full => per_layer,
    }
}

/// KV-cache bytes of one token on one GPU of an engine whose attention is split over `group`
/// GPUs (tp / dp with data-parallel attention).
pub(crate) fn kv_bytes_per_token(m: &ModelSpec, group: u64, kv: Precision) -> f64 {
    let b = kv.bytes();
    let layers = m.layers as f64;
    match m.attention {
        // MLA caches the compressed latent and the rotary key, shared by all heads, so each
        // GPU of the attention group keeps the whole of it.
        Attention::Mla => {
            let width = m.kv_lora_rank.unwrap_or(0) + m.qk_rope_head_dim.unwrap_or(0);
            layers * width as f64 * b
        }
        // K and V per KV head; heads split over the group, replicated when the group is larger.
        Attention::Mha | Attention::Gqa => {
            let heads_per_gpu = m.kv_heads.div_ceil(group.max(1));
            layers * 2.0 * heads_per_gpu as f64 * m.head_dim as f64 * b
        }
    }
}

/// DSA's indexer cache per token on one GPU: an FP8 key of `index_head_dim` and its FP32 scale
/// per layer (DeepSeek-V3.2's layout, which GLM-5 shares); 0 without sparse attention.
pub(crate) fn indexer_bytes_per_token(m: &ModelSpec) -> f64 {
    m.index_head_dim.filter(|_| m.sparse_topk.is_some()).map_or(0.0, |d| m.layers as f64 * (d as f64 + 4.0))
}

/// Rollout weight bytes on one GPU of an engine: the experts are split over all `tp` GPUs (by
/// EP or TP), the rest over the attention group (`tp / dp`): data-parallel attention
/// replicates it `dp` times.
pub(crate) fn rollout_weight_bytes(m: &ModelSpec, tp: u64, dp: u64, p: Precision) -> f64 {
    let s = param_split(m);
    let group = (tp / dp.max(1)).max(1) as f64;
    (div(s.other, group) + div(s.routed, tp as f64)) * p.bytes()
}

/// Share of an MoE layer's experts that a decode step of `batch` tokens touches, assuming
/// uniform routing: 1 - (1 - k/E)^batch.
pub(crate) fn experts_touched(m: &ModelSpec, batch: u64) -> f64 {
    if m.experts == 0 || m.top_k == 0 {
        return 1.0;
    }
    let miss = 1.0 - (m.top_k as f64 / m.experts as f64).min(1.0);
    1.0 - miss.powf(batch as f64)
}

/// Bytes of one recorded expert id: `routing_dtype`'s, else the smallest integer type that holds
/// ids 0..experts (u8 up to 256 experts, u16 up to 65,536, else i32), as the engine stores them.
pub(crate) fn route_id_bytes(m: &ModelSpec, routing_dtype: Option<u64>) -> u64 {
    routing_dtype.unwrap_or(match m.experts {
        0..=256 => 1,
        257..=65_536 => 2,
        _ => 4,
    })
}

/// R3 bytes per recorded token: an expert id per MoE layer and routed expert.
pub(crate) fn r3_bytes_per_token(m: &ModelSpec, id_bytes: u64) -> f64 {
    (moe_layers(m) * m.top_k * id_bytes) as f64
}

/// R3 data of one trajectory of `tokens` (prompt + response): the engine records every token it
/// forwarded, the prompt and every response token but the last (never fed back).
pub(crate) fn r3_bytes(m: &ModelSpec, tokens: u64, id_bytes: u64) -> f64 {
    tokens.saturating_sub(1) as f64 * r3_bytes_per_token(m, id_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::glm5;
    use crate::input::Attention;

    fn llama8b() -> ModelSpec {
        ModelSpec {
            name: "Llama-3.1-8B".into(),
            params: 8_030_000_000,
            active_params: 8_030_000_000,
            layers: 32,
            dense_layers: 0,
            hidden_size: 4096,
            heads: 32,
            kv_heads: 8,
            head_dim: 128,
            vocab: 128_256,
            experts: 0,
            top_k: 0,
            max_context: 131_072,
            attention: Attention::Gqa,
            kv_lora_rank: None,
            qk_rope_head_dim: None,
            sparse_topk: None,
            index_head_dim: None,
            update_requantize_s: None,
            intermediate_size: None,
            tied_embeddings: None,
        }
    }

    fn layout(backend: Backend, tp: u64, pp: u64, cp: u64, ep: u64, dp: u64) -> Layout {
        Layout { backend, tp, pp, cp, ep, dp, precision: Precision::Bf16 }
    }

    fn close(a: f64, b: f64, rel: f64) -> bool {
        (a - b).abs() <= rel * b.abs()
    }

    #[test]
    fn glm5_split_from_total_and_active() {
        // (744 - 40) / (256 - 8) = 2.8387 B per expert; x 256 = 726.7 B routed.
        let s = param_split(&glm5());
        assert!(close(s.routed, 726.71e9, 1e-4), "{}", s.routed);
        assert!(close(s.other, 17.29e9, 1e-3), "{}", s.other);
        assert_eq!(param_split(&llama8b()).routed, 0.0);
    }

    #[test]
    fn glm5_reference_optimizer_is_279_gb_per_rank() {
        // domain.md §9: 32 training GPUs, TP2 PP4 CP4 EP8 -> 744e9 x 12 / 32 = 279 GB.
        let l = layout(Backend::Megatron, 2, 4, 4, 8, 1);
        assert_eq!((l.etp(), l.edp()), (1, 1));
        let b = state_bytes(&glm5(), &l, None);
        assert!(close(b.optimizer, 279.0e9, 1e-9), "{}", b.optimizer);
        // Weights: 17.29e9 / 8 + 726.71e9 / 32 = 24.87e9 params, 2 bytes each.
        assert!(close(b.weights, 49.74e9, 1e-3), "{}", b.weights);
        assert!(close(b.gradients, 99.48e9, 1e-3), "{}", b.gradients);
    }

    #[test]
    fn dense_megatron_distributed_optimizer_is_6_plus_12_over_d() {
        // Megatron docs: 6 + 12/d bytes per parameter with the distributed optimizer.
        let l = layout(Backend::Megatron, 1, 1, 1, 1, 8);
        let b = state_bytes(&llama8b(), &l, None);
        let p = 8.03e9;
        assert!(close(b.weights + b.gradients + b.optimizer, p * (6.0 + 12.0 / 8.0), 1e-12));
    }

    #[test]
    fn fsdp_and_embedded() {
        let m = llama8b();
        let b = state_bytes(&m, &layout(Backend::Fsdp, 1, 1, 1, 1, 8), None);
        assert!(close(b.optimizer, 8.03e9 * 12.0 / 8.0, 1e-12));
        assert!(close(b.weights, 8.03e9 * 2.0 / 8.0 + 2.0 * 8.03e9 / 32.0 * 2.0, 1e-12));
        let l = Layout { precision: Precision::Fp32, ..layout(Backend::Embedded, 1, 1, 1, 1, 1) };
        let b = state_bytes(&m, &l, None);
        assert_eq!((b.weights, b.gradients, b.optimizer), (8.03e9 * 4.0, 8.03e9 * 4.0, 8.03e9 * 8.0));
    }

    #[test]
    fn activations_by_recompute() {
        // s = 8192 / 2 (CP2), b = 1, h = 4096, t = 2: 34 s b h / t = 34 x 4096 x 4096 / 2.
        assert_eq!(layer_activation_bytes(4096.0, 1.0, 4096.0, 2.0, Recompute::Off), 285_212_672.0);
        assert_eq!(layer_activation_bytes(4096.0, 1.0, 4096.0, 2.0, Recompute::Full), 16_777_216.0);
        let m = llama8b();
        let l = layout(Backend::Megatron, 2, 4, 2, 1, 1);
        // Full: 8 layers/stage x 4 in flight x 16.78 MB + one layer at 285.2 MB + logits
        // 4096 x 128256 x 4 / 2 = 1050.7 MB.
        let a = activation_bytes(&m, &l, 8192, 1, None, Recompute::Full);
        assert_eq!(a, 8.0 * 4.0 * 16_777_216.0 + 285_212_672.0 + 1_050_673_152.0);
        // Two micro-batches only: two in flight.
        let a2 = activation_bytes(&m, &l, 8192, 1, Some(2), Recompute::Full);
        assert_eq!(a2, 8.0 * 2.0 * 16_777_216.0 + 285_212_672.0 + 1_050_673_152.0);
    }

    #[test]
    fn kv_cache_per_token() {
        // MLA: 78 layers x (512 + 64) x 2 bytes = 89,856 bytes, whatever the TP.
        assert_eq!(kv_bytes_per_token(&glm5(), 8, Precision::Bf16), 89_856.0);
        // DSA's indexer: an FP8 key of 128 and a 4-byte scale per layer, only for a sparse model.
        assert_eq!(indexer_bytes_per_token(&glm5()), 0.0);
        let dsa = ModelSpec { sparse_topk: Some(2048), index_head_dim: Some(128), ..glm5() };
        assert_eq!(indexer_bytes_per_token(&dsa), 78.0 * 132.0);
        // GQA: 32 layers x 2 x (8 heads / TP2 = 4) x 128 x 2 bytes = 65,536.
        assert_eq!(kv_bytes_per_token(&llama8b(), 2, Precision::Bf16), 65_536.0);
        // TP16 > 8 KV heads: one head per GPU (replicated).
        assert_eq!(kv_bytes_per_token(&llama8b(), 16, Precision::Bf16), 16_384.0);
    }

    #[test]
    fn r3_matches_domain_example() {
        // domain.md: 32K tokens x 60 layers x k=8 x 4 bytes (int32 ids) ~ 60 MB.
        let m = ModelSpec { layers: 60, dense_layers: 0, ..glm5() };
        assert_eq!(r3_bytes(&m, 32_768 + 1, 4), 62_914_560.0);
        assert_eq!(r3_bytes(&llama8b(), 32_768, 4), 0.0);
        // GLM-5's 256 experts fit a u8: a quarter of that.
        assert_eq!(route_id_bytes(&m, None), 1);
        assert_eq!(r3_bytes(&m, 32_768 + 1, route_id_bytes(&m, None)), 15_728_640.0);
        assert_eq!(r3_bytes_per_token(&m, 1), 480.0);
    }

    #[test]
    fn route_id_is_the_smallest_type_for_the_expert_count() {
        let with = |experts| ModelSpec { experts, ..glm5() };
        assert_eq!(route_id_bytes(&with(8), None), 1);
        assert_eq!(route_id_bytes(&with(256), None), 1);
        assert_eq!(route_id_bytes(&with(257), None), 2);
        assert_eq!(route_id_bytes(&with(65_536), None), 2);
        assert_eq!(route_id_bytes(&with(65_537), None), 4);
        assert_eq!(route_id_bytes(&with(8), Some(4)), 4);
    }

    #[test]
    fn rollout_weights() {
        // GLM-5 fp8 on TP8: (17.29e9 + 726.71e9) / 8 x (1 + 4/16384) bytes.
        let w = rollout_weight_bytes(&glm5(), 8, 1, Precision::Fp8Blockwise);
        assert!(close(w, 93.0e9 * (1.0 + 4.0 / 16384.0), 1e-3), "{w}");
        // DP attention 8: the non-expert part is whole on every GPU.
        let w = rollout_weight_bytes(&glm5(), 8, 8, Precision::Bf16);
        assert!(close(w, (17.29e9 + 726.71e9 / 8.0) * 2.0, 1e-3), "{w}");
    }

    #[test]
    fn experts_touched_saturates() {
        let m = glm5();
        assert!(close(experts_touched(&m, 1), 8.0 / 256.0, 1e-12));
        assert!(experts_touched(&m, 1000) > 0.999);
        assert_eq!(experts_touched(&llama8b(), 3), 1.0);
    }

    /// Qwen3-30B-A3B as std/models has it (config.json: 48 layers, hidden 2048, 32 Q / 4 KV heads
    /// of 128, 128 experts of width 768, top 8).
    fn qwen3_30b() -> ModelSpec {
        ModelSpec {
            name: "Qwen3-30B-A3B".into(),
            params: 30_500_000_000,
            active_params: 3_300_000_000,
            layers: 48,
            hidden_size: 2048,
            heads: 32,
            kv_heads: 4,
            vocab: 151_936,
            experts: 128,
            top_k: 8,
            max_context: 40_960,
            ..llama8b()
        }
    }

    fn lora(rank: u64, adapters: u64, targets: &[LoraTarget]) -> Lora {
        Lora {
            rank: rank.into(),
            adapters: adapters.into(),
            target_modules: targets.to_vec(),
            dropout: 0.0,
            init: None,
            span: None,
        }
    }

    const QKVO: &[LoraTarget] = &[LoraTarget::QProj, LoraTarget::KProj, LoraTarget::VProj, LoraTarget::OProj];
    const MLP: &[LoraTarget] = &[LoraTarget::GateProj, LoraTarget::UpProj, LoraTarget::DownProj];

    #[test]
    fn lora_attention_adapters_are_rank_times_in_plus_out_per_layer() {
        // q 2048 -> 4096, k and v 2048 -> 512, o 4096 -> 2048: 17,408 x rank 16 x 48 layers.
        let a = lora_params(&qwen3_30b(), &lora(16, 1, QKVO));
        assert_eq!((a.other, a.routed), (13_369_344.0, 0.0));
        let q = lora_target_params(&qwen3_30b(), LoraTarget::QProj, 16);
        assert_eq!(q.other, 48.0 * 16.0 * (2048.0 + 4096.0));
    }

    #[test]
    fn lora_on_moe_mlp_wraps_every_routed_expert() {
        // One expert of one layer: (30.5e9 - 3.3e9) / 120 / 48 = 4.72M = 3 x 2048 x width, so
        // width 768.6 (config.json: moe_intermediate_size 768).
        let m = qwen3_30b();
        assert!(close(expert_width(&m), 768.0, 1e-3), "{}", expert_width(&m));
        let a = lora_params(&m, &lora(16, 1, MLP));
        assert_eq!(a.other, 0.0);
        assert!(close(a.routed, 3.0 * 16.0 * (2048.0 + 768.6) * 128.0 * 48.0, 1e-4), "{}", a.routed);
        // A dense model wraps one MLP per layer, of the width the record gives or the params leave.
        let dense = lora_params(&llama8b(), &lora(8, 1, &[LoraTarget::DownProj]));
        assert_eq!(dense.routed, 0.0);
        let given = ModelSpec { intermediate_size: Some(14_336), ..llama8b() };
        assert_eq!(lora_params(&given, &lora(8, 1, &[LoraTarget::DownProj])).other, 32.0 * 8.0 * (14_336.0 + 4096.0));
        // Qwen3-4B (tied embeddings): the width left by its parameters is within 0.2% of 9728.
        let qwen3_4b = ModelSpec {
            params: 4_020_000_000,
            active_params: 4_020_000_000,
            layers: 36,
            hidden_size: 2560,
            heads: 32,
            kv_heads: 8,
            vocab: 151_936,
            ..llama8b()
        };
        assert!(close(dense_mlp_width(&qwen3_4b), 9728.0, 2e-3), "{}", dense_mlp_width(&qwen3_4b));
    }

    #[test]
    fn lora_freezes_the_base_same_weights_no_base_gradients_or_optimizer() {
        // Megatron TP2 EP8 DP4 on 8 GPUs: the same model with and without LoRA.
        let (m, l) = (qwen3_30b(), layout(Backend::Megatron, 2, 1, 1, 8, 4));
        let full = state_bytes(&m, &l, None);
        let lo = state_bytes(&m, &l, Some(&lora(16, 1, QKVO)));
        assert_eq!(lo.weights, full.weights);
        assert_eq!(full.adapters, 0.0);
        // Attention adapters split like attention: by TP2; their optimizer state also by DP4.
        let local = 13_369_344.0 / 2.0;
        assert_eq!((lo.adapters, lo.gradients, lo.optimizer), (local * 2.0, local * 4.0, local / 4.0 * 12.0));
        assert!(full.gradients > 17e9 && full.optimizer > 45e9, "{full:?}");
        // Expert adapters split like the experts: by EP8.
        let e = state_bytes(&m, &l, Some(&lora(16, 1, &[LoraTarget::UpProj])));
        let up = lora_target_params(&m, LoraTarget::UpProj, 16).routed;
        assert!(close(e.gradients, up / 8.0 * 4.0, 1e-12), "{e:?}");
    }

    #[test]
    fn two_adapters_double_adapter_state_not_the_base() {
        let (m, l) = (qwen3_30b(), layout(Backend::Fsdp, 1, 1, 1, 1, 8));
        let one = state_bytes(&m, &l, Some(&lora(16, 1, QKVO)));
        let two = state_bytes(&m, &l, Some(&lora(16, 2, QKVO)));
        assert_eq!(two.weights, one.weights);
        assert_eq!(
            (two.adapters, two.gradients, two.optimizer),
            (2.0 * one.adapters, 2.0 * one.gradients, 2.0 * one.optimizer)
        );
    }

    /// A dense model small enough to size by hand: 4 layers, h 64, q 4 x 16 = 64, kv 2 x 16 = 32,
    /// MLP width 128.
    fn tiny() -> ModelSpec {
        ModelSpec {
            params: 1_000_000,
            active_params: 1_000_000,
            layers: 4,
            hidden_size: 64,
            heads: 4,
            kv_heads: 2,
            head_dim: 16,
            vocab: 1000,
            intermediate_size: Some(128),
            ..llama8b()
        }
    }

    fn with_dropout(lo: Lora, dropout: f64) -> Lora {
        Lora { dropout, ..lo }
    }

    #[test]
    fn lora_dropout_keeps_each_wrapped_layers_input() {
        let (m, l) = (tiny(), layout(Backend::Megatron, 1, 1, 1, 1, 1));
        let all = with_dropout(lora(8, 1, &LoraTarget::ALL), 0.1);
        // Input widths per layer: q, k, v, o, gate, up 64 each, down 128 = 512. seq 32 x
        // micro-batch 2 = 64 tokens x 512 x 2 B (bf16) = 65,536 B per layer, x 4 layers.
        let b = lora_dropout_bytes(&m, &l, &all, 32, 2, None, Recompute::Off);
        assert_eq!(b, 4.0 * 64.0 * 512.0 * 2.0);
        assert_eq!(b, 262_144.0);
        // Linear in the micro-batch (and the same under `selective`).
        assert_eq!(lora_dropout_bytes(&m, &l, &all, 32, 4, None, Recompute::Selective), 2.0 * b);
        // Dropout 0: the adapter reuses the input the base layer keeps, nothing extra.
        assert_eq!(lora_dropout_bytes(&m, &l, &with_dropout(all.clone(), 0.0), 32, 2, None, Recompute::Off), 0.0);
        // Attention only: 4 x 64 per layer.
        let qkvo = with_dropout(lora(8, 1, QKVO), 0.1);
        assert_eq!(lora_dropout_bytes(&m, &l, &qkvo, 32, 2, None, Recompute::Off), 4.0 * 64.0 * 256.0 * 2.0);
        // PP2: 2 layers per stage x 2 micro-batches in flight; CP2 and TP2 each halve it.
        let pp = layout(Backend::Megatron, 1, 2, 1, 1, 1);
        assert_eq!(lora_dropout_bytes(&m, &pp, &all, 32, 2, None, Recompute::Off), 2.0 * 2.0 * 65_536.0);
        assert_eq!(lora_dropout_bytes(&m, &pp, &all, 32, 2, Some(1), Recompute::Off), 2.0 * 65_536.0);
        let split = layout(Backend::Megatron, 2, 1, 2, 1, 1);
        assert_eq!(lora_dropout_bytes(&m, &split, &all, 32, 2, None, Recompute::Off), b / 4.0);
        // Full recomputation: one layer of one micro-batch, while it is recomputed.
        assert_eq!(lora_dropout_bytes(&m, &pp, &all, 32, 2, None, Recompute::Full), 65_536.0);
        // FP32 training: 4 B.
        let fp32 = Layout { precision: Precision::Fp32, ..l };
        assert_eq!(lora_dropout_bytes(&m, &fp32, &all, 32, 2, None, Recompute::Off), 2.0 * b);
    }

    #[test]
    fn lora_dropout_on_experts_keeps_only_routed_tokens() {
        // 2 MoE layers of 4 experts, top 2, h 64: one expert is (P - A) / (E - k) = 12,288
        // params = 2 layers x 3 x 64 x 32, so width 32.
        let m = ModelSpec {
            params: 124_576,
            active_params: 100_000,
            layers: 2,
            hidden_size: 64,
            experts: 4,
            top_k: 2,
            intermediate_size: None,
            ..tiny()
        };
        assert_eq!(expert_width(&m), 32.0);
        let down = with_dropout(lora(8, 1, &[LoraTarget::DownProj]), 0.05);
        // 8 wrapped experts x (16 tokens x 2/4) rows x 32 = 2 layers x k 2 x 16 tokens x 32, bf16.
        let l = layout(Backend::Megatron, 1, 1, 1, 1, 1);
        assert_eq!(lora_dropout_bytes(&m, &l, &down, 16, 1, None, Recompute::Off), 2.0 * 2.0 * 16.0 * 32.0 * 2.0);
        assert_eq!(lora_dropout_bytes(&m, &l, &down, 16, 3, None, Recompute::Off), 3.0 * 4096.0);
        // gate_proj reads h = 64. TP2 EP1 (ETP2): the TP group gathers the tokens, so every rank
        // keeps all k x tokens at width h; TP2 EP2 (ETP1): its half of the tokens.
        let gate = with_dropout(lora(8, 1, &[LoraTarget::GateProj]), 0.05);
        let etp2 = layout(Backend::Megatron, 2, 1, 1, 1, 1);
        assert_eq!(lora_dropout_bytes(&m, &etp2, &gate, 16, 1, None, Recompute::Off), 2.0 * 2.0 * 16.0 * 64.0 * 2.0);
        let ep2 = layout(Backend::Megatron, 2, 1, 1, 2, 1);
        assert_eq!(lora_dropout_bytes(&m, &ep2, &gate, 16, 1, None, Recompute::Off), 2.0 * 2.0 * 8.0 * 64.0 * 2.0);
        // down_proj's input (width f) is split over ETP either way: k x tokens x f / TP.
        assert_eq!(lora_dropout_bytes(&m, &etp2, &down, 16, 1, None, Recompute::Off), 2048.0);
        assert_eq!(lora_dropout_bytes(&m, &ep2, &down, 16, 1, None, Recompute::Off), 2048.0);
    }

    #[test]
    fn embedded_trainer_activations_by_hand() {
        // tiny: d 64, q 4 x 16 = 64, kv 2 x 16 = 32, f 128, 4 heads, seq 8. Per token and layer:
        // 6 x 64 + 5 x 64 + 4 x 32 + 2 x 64 (GQA repeat) + 4 x 128 + 2 x 4 x 8 = 1536.
        let m = tiny();
        assert_eq!(embedded_layer_elements(&m, 8), 1536.0);
        // MHA: no repeated keys and values.
        let mha = ModelSpec { kv_heads: 4, ..tiny() };
        assert_eq!(embedded_layer_elements(&mha, 8), 1536.0 - 128.0 + 4.0 * 32.0);
        // Head: 3 x 64 + 3 x vocab 1000; the entropy in the loss keeps one more vocab tensor.
        assert_eq!(embedded_head_elements(&m, false), 3192.0);
        assert_eq!(embedded_head_elements(&m, true), 4192.0);
        // Micro-batch 2 x seq 8 = 16 tokens x (4 layers x 1536 + 3192) plus the concatenated
        // weights 4 x (128 x 64 + 2 x 128 x 64) = 98,304, 4 B each.
        let a = embedded_activation_bytes(&m, 8, 2, false, None);
        assert_eq!(a, (16.0 * 9336.0 + 98_304.0) * 4.0);
        assert_eq!(a, 990_720.0);
        // LoRA rank 8 on all 7 targets: each keeps its A output, 7 x 8 x 4 layers per token.
        let lo = lora(8, 1, &LoraTarget::ALL);
        assert_eq!(embedded_activation_bytes(&m, 8, 2, false, Some(&lo)), 990_720.0 + 16.0 * 224.0 * 4.0);
        // Linear in the micro-batch above the concatenated weights.
        let b = embedded_activation_bytes(&m, 8, 4, false, None);
        assert_eq!(b - a, 16.0 * 9336.0 * 4.0);
    }

    #[test]
    fn ppo_critic_bytes_by_hand() {
        // tiny, untied: 1,000,000 params - LM head 1000 x 64 + value head 64 = 936,064.
        let m = ModelSpec { tied_embeddings: Some(false), ..tiny() };
        assert_eq!(critic_dropped_head(&m), 64_000);
        assert_eq!((critic_spec(&m).params, critic_spec(&m).active_params), (936_064, 936_064));
        // Tied (the head is the embedding, kept) or not known: 1,000,064.
        for tied in [Some(true), None] {
            assert_eq!(critic_spec(&ModelSpec { tied_embeddings: tied, ..tiny() }).params, 1_000_064);
        }
        // Megatron TP1 PP1 DP1, bf16: 2 B weights, 4 B FP32 gradients, 12 B Adam state per param.
        let l = layout(Backend::Megatron, 1, 1, 1, 1, 1);
        let c = critic_state_bytes(&m, &l);
        assert_eq!((c.weights, c.adapters, c.gradients, c.optimizer), (1_872_128.0, 0.0, 3_744_256.0, 11_232_768.0));
        // TP2: weights and gradients halve; DP2 shards the optimizer state too.
        let c = critic_state_bytes(&m, &layout(Backend::Megatron, 2, 1, 1, 1, 2));
        assert_eq!((c.weights, c.gradients, c.optimizer), (936_064.0, 1_872_128.0, 2_808_192.0));
        // FSDP over 2: a half of everything, plus two gathered layers (936,064 / 4 x 2 x 2 B).
        let c = critic_state_bytes(&m, &layout(Backend::Fsdp, 1, 1, 1, 1, 2));
        assert_eq!((c.weights, c.gradients, c.optimizer), (936_064.0 + 936_064.0, 1_872_128.0, 5_616_384.0));
        // Embedded, FP32: 4 B weights, 4 B gradients, 8 B moments.
        let fp32 = Layout { precision: Precision::Fp32, ..layout(Backend::Embedded, 1, 1, 1, 1, 1) };
        let c = critic_state_bytes(&m, &fp32);
        assert_eq!((c.weights, c.gradients, c.optimizer), (3_744_256.0, 3_744_256.0, 7_488_512.0));

        // Activations: the policy's without the FP32 logits. seq 32, micro-batch 2, TP1, off:
        // 34 x 32 x 2 x 64 = 139,264 B per layer x 4 layers; the logits are 64 x 1000 x 4 B.
        let a = critic_activation_bytes(&m, &l, 32, 2, None, Recompute::Off);
        assert_eq!(a, 4.0 * 139_264.0);
        assert_eq!(activation_bytes(&m, &l, 32, 2, None, Recompute::Off), a + 256_000.0);
        // Embedded, seq 8 x micro-batch 2 = 16 tokens: 4 layers x 1536 + 3 x 64 per token, plus
        // the concatenated weights 98,304, 4 B each; the policy's head adds 3 x vocab per token.
        let e = embedded_critic_activation_bytes(&m, 8, 2);
        assert_eq!(e, (16.0 * (4.0 * 1536.0 + 192.0) + 98_304.0) * 4.0);
        assert_eq!(e, 798_720.0);
        assert_eq!(embedded_activation_bytes(&m, 8, 2, false, None), e + 16.0 * 3000.0 * 4.0);
    }

    #[test]
    fn opd_teacher_bytes_by_hand() {
        // tiny as the teacher: 1,000,000 params, d 64, 4 layers, vocab 1000. Frozen: weights only.
        let t = tiny();
        // Megatron TP1 bf16: 2 B per param; TP2 halves them.
        let l = layout(Backend::Megatron, 1, 1, 1, 1, 1);
        assert_eq!(teacher_weight_bytes(&t, &l, false), 2_000_000.0);
        assert_eq!(teacher_weight_bytes(&t, &layout(Backend::Megatron, 2, 1, 1, 1, 2), false), 1_000_000.0);
        // FSDP over 2: half the weights, plus two gathered layers (1,000,000 / 4 x 2 x 2 B).
        assert_eq!(teacher_weight_bytes(&t, &layout(Backend::Fsdp, 1, 1, 1, 1, 2), false), 2_000_000.0);
        // The embedded CPU host: FP32 and whole, whatever the trainer's precision.
        assert_eq!(teacher_weight_bytes(&t, &l, true), 4_000_000.0);

        // GPU no-grad forward, seq 32, micro-batch 2: one layer 34 x 32 x 2 x 64 = 139,264 B, plus
        // FP32 logits and log-softmax 2 x 64 tokens x 1000 x 4 B = 512,000 B.
        assert_eq!(teacher_activation_bytes(&t, &l, 32, 2), 651_264.0);
        // TP2 or CP2: half of each.
        assert_eq!(teacher_activation_bytes(&t, &layout(Backend::Megatron, 2, 1, 1, 1, 1), 32, 2), 325_632.0);
        assert_eq!(teacher_activation_bytes(&t, &layout(Backend::Megatron, 1, 1, 2, 1, 1), 32, 2), 325_632.0);
        // Fewer than the policy's activations with no recomputation: 4 layers x 139,264 + 256,000.
        assert!(teacher_activation_bytes(&t, &l, 32, 2) < activation_bytes(&t, &l, 32, 2, None, Recompute::Off));

        // Embedded, seq 8 x micro-batch 2 = 16 tokens: one layer's 1536 + 3 x 64 + 2 x 1000 = 3728
        // per token, plus one layer's concatenated weights (64 + 64) x 64 + 2 x 128 x 64 = 24,576,
        // 4 B each; no autograd.
        let e = embedded_teacher_activation_bytes(&t, 8, 2);
        assert_eq!(e, (16.0 * 3728.0 + 24_576.0) * 4.0);
        assert_eq!(e, 336_896.0);
    }

    #[test]
    fn ppo_critic_of_an_moe_model_keeps_its_experts() {
        // Subtracting the head from total and active leaves total - active, so the routed
        // experts (and their sharding over EP) are the policy's.
        let m = ModelSpec { tied_embeddings: Some(false), ..qwen3_30b() };
        let c = critic_spec(&m);
        assert_eq!(c.params, 30_500_000_000 - 151_936 * 2048 + 2048);
        assert_eq!(param_split(&c).routed, param_split(&m).routed);
        let l = layout(Backend::Megatron, 2, 1, 1, 8, 4);
        let (p, q) = (state_bytes(&m, &l, None), critic_state_bytes(&m, &l));
        // Only the dense part changes: by (head - d) / TP2 params on every rank.
        let dense = (151_936.0 * 2048.0 - 2048.0) / 2.0;
        assert!(close(p.weights - q.weights, dense * 2.0, 1e-9), "{p:?} {q:?}");
        assert!(close(p.gradients - q.gradients, dense * 4.0, 1e-9), "{p:?} {q:?}");
    }

    #[test]
    fn div_by_zero_is_zero() {
        assert_eq!(div(1.0, 0.0), 0.0);
        let l = layout(Backend::Megatron, 1, 1, 1, 1, 1);
        let m = ModelSpec { layers: 0, hidden_size: 0, ..llama8b() };
        assert!(activation_bytes(&m, &Layout { pp: 0, cp: 0, ..l }, 0, 0, Some(0), Recompute::Full).is_finite());
        let all = with_dropout(lora(16, 1, &LoraTarget::ALL), 0.1);
        let moe = ModelSpec { layers: 0, hidden_size: 0, ..qwen3_30b() };
        for m in [&m, &moe] {
            let a = lora_params(m, &all);
            assert!(a.routed.is_finite() && a.other.is_finite() && a.other >= 0.0, "{a:?}");
            let d = lora_dropout_bytes(m, &Layout { pp: 0, cp: 0, ..l }, &all, 0, 0, Some(0), Recompute::Off);
            assert!(d.is_finite() && d >= 0.0, "{d}");
        }
    }
}
