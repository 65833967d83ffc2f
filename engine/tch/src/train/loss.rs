//! The RL loss's terms: log-probs of the sampled tokens, the clipped policy gradient with its TIS
//! weight, the k3 KL to a reference, the entropy, and their reduction over tokens or sequences.

use super::pack::Packed;
use crate::model::Policy;
use crate::moe::Route;
use miles_runtime::{Aggregation, Trajectory};
use tch::{Kind, Tensor};

/// Log-probs of the targets [B, L-1] and the full log-softmax [B, L-1, V] at `temperature`,
/// MoE layers routed by `route` (None: the router's own choice, no statistics).
pub(super) fn token_logprobs(
    policy: &Policy,
    pk: &Packed,
    temperature: f64,
    route: Option<&mut Route>,
) -> (Tensor, Tensor) {
    let logits = policy.forward_routed(&pk.tokens, &pk.positions, &pk.valid, None, route);
    let logp_all = tempered_log_softmax(&logits.narrow(1, 0, pk.width), temperature);
    let lp = logp_all.gather(-1, &pk.targets.unsqueeze(-1), false).squeeze_dim(-1);
    (lp, logp_all)
}

/// log softmax(logits / temperature) over the vocabulary: the one definition of the log-probs
/// the trainer scores, which the batch-invariant sampler reports too (`stream::torch_logprob`).
pub(crate) fn tempered_log_softmax(logits: &Tensor, temperature: f64) -> Tensor {
    let logits = if temperature != 1.0 { logits / temperature } else { logits.shallow_clone() };
    logits.log_softmax(-1, Kind::Float)
}

/// Per-token PPO/GRPO loss terms (exposed for the hand-computed tests).
pub struct PgTerms {
    /// Clipped policy-gradient loss per token, times the TIS weight.
    pub pg: Tensor,
    /// 1 where the clipped branch was taken.
    pub clipped: Tensor,
    pub tis: Tensor,
}

/// max(-A r, -A clip(r, 1-lo, 1+hi)) * tis, with r = exp(logp - old) and
/// tis = min(exp(old - rollout), cap) (detached; 1 without a cap).
pub fn pg_terms(
    logp: &Tensor,
    old: &Tensor,
    rollout: &Tensor,
    adv: &Tensor,
    clip_low: f64,
    clip_high: f64,
    tis_cap: Option<f64>,
) -> PgTerms {
    let ratio = (logp - old).exp();
    let l1 = -adv * &ratio;
    let l2 = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high);
    let clipped = l2.gt_tensor(&l1).to_kind(Kind::Float);
    let pg = l1.maximum(&l2);
    let tis = match tis_cap {
        Some(cap) => (old - rollout).exp().clamp_max(cap).detach(),
        None => Tensor::ones_like(logp),
    };
    PgTerms { pg: pg * &tis, clipped, tis }
}

/// k3 estimator of KL(policy || ref) per token: exp(ref - logp) - (ref - logp) - 1 (>= 0, unbiased).
pub fn kl_k3(logp: &Tensor, ref_logp: &Tensor) -> Tensor {
    let d = ref_logp - logp;
    d.exp() - &d - 1.0
}

/// The entropy of each position's distribution [B, L-1] from its log-softmax: in the autograd
/// graph when it is a loss term (`in_loss`), else a statistic computed without one.
pub(super) fn entropy(logp_all: &Tensor, in_loss: bool) -> Tensor {
    if in_loss {
        -(logp_all.exp() * logp_all).sum_dim_intlist(-1, false, Kind::Float)
    } else {
        let _g = tch::no_grad_guard();
        let la = logp_all.detach();
        -(la.exp() * &la).sum_dim_intlist(-1, false, Kind::Float)
    }
}

/// The global denominators of one optimizer step, so the micro-batches' accumulated gradients
/// equal the whole slice's.
pub(super) struct Denominators {
    /// Trained tokens in the slice (at least 1).
    pub tokens: f64,
    /// Sequences in the slice.
    pub seqs: f64,
}

impl Denominators {
    pub(super) fn of(slice: &[Trajectory]) -> Denominators {
        Denominators { tokens: trained_tokens(slice).max(1.0), seqs: slice.len() as f64 }
    }
}

/// The micro-batch's loss from the masked per-token loss [B, L-1]: the token mean or the mean of
/// the sequences' token means, over the step's denominators.
pub(super) fn aggregate(masked: Tensor, mask: &Tensor, aggregation: Aggregation, d: &Denominators) -> Tensor {
    match aggregation {
        Aggregation::Token => masked.sum(Kind::Float) / d.tokens,
        Aggregation::Sequence => {
            let per = masked.sum_dim_intlist(-1, false, Kind::Float)
                / mask.sum_dim_intlist(-1, false, Kind::Float).clamp_min(1.0);
            per.sum(Kind::Float) / d.seqs
        }
    }
}

/// Tokens the loss covers (the loss masks' sum).
pub(super) fn trained_tokens(batch: &[Trajectory]) -> f64 {
    batch.iter().map(|t| t.loss_mask.iter().map(|&m| m as f64).sum::<f64>()).sum()
}

/// The sum over `mask`ed tokens of a per-token statistic, as f64 (no gradient).
pub(super) fn masked_sum(x: &Tensor, mask: &Tensor) -> f64 {
    (x * mask).sum(Kind::Double).double_value(&[])
}
