//! LoRA adapters: the linear layers each target wraps, their parameters, and the dropped inputs
//! that adapter dropout keeps for the backward pass.

use super::*;

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
