//! The models beside the policy: PPO's critic and an on-policy-distillation teacher.

use super::*;

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
