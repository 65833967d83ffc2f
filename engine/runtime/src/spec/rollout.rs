//! How the rollout engine samples the training responses, and in what precision.

use super::{is_false, one};
use serde::{Deserialize, Serialize};

/// Generation settings for the training rollouts (evaluation is always greedy).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RolloutSpec {
    /// Prompts per RL step.
    pub rollout_batch: usize,
    /// Samples per prompt (one GRPO group).
    pub samples_per_prompt: usize,
    pub max_new_tokens: usize,
    #[serde(default = "one")]
    pub temperature: f64,
    #[serde(default = "one")]
    pub top_p: f64,
    /// 0 = no top-k filter.
    #[serde(default)]
    pub top_k: usize,
    /// The recipe's `max_prompt_tokens`: a prompt set whose longest prompt (with BOS) is longer
    /// stops the run before training (E0510). None: no bound but the model's `max_len`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_prompt_tokens: Option<usize>,
    /// The rollout engine's compute precision (the embedded engine: fp32, or bf16 weights and
    /// activations, as production engines sample, the trainer staying fp32).
    #[serde(default, skip_serializing_if = "Precision::is_fp32")]
    pub precision: Precision,
    /// R3: the engine records every token's routed experts (an MoE policy); None: it does not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub r3: Option<R3Spec>,
    /// The engine and the trainer run batch-invariant kernels: the trainer's log-probs of the
    /// sampled tokens equal the sampler's bit for bit (true on-policy; docs/moe.md).
    #[serde(default, skip_serializing_if = "is_false")]
    pub batch_invariant: bool,
}

/// What the embedded backend computes in: the engine's `precision` (bf16: weights and
/// activations in bf16) and the trainer's (bf16: matmuls in bf16 against fp32 master weights).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Precision {
    #[default]
    Fp32,
    Bf16,
}

impl Precision {
    pub(super) fn is_fp32(&self) -> bool {
        *self == Precision::Fp32
    }
}

/// std/stages `generate`'s `record_routing`, `routing_replay` and `routing_dtype`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct R3Spec {
    /// The trainer's forward uses the recorded experts (else it re-routes and only measures the
    /// mismatch, `r3/route_mismatch`).
    pub replay: bool,
    /// The id type on the wire.
    pub id: crate::routing::RouteId,
}
