//! The RL loss's terms: log-probs of the sampled tokens, the clipped policy gradient (per token or
//! per sequence, GSPO) with its TIS weight and MIS mask, the k3 KL to a reference, the entropy, and
//! their reduction over the step (token, sequence, micro-batch token means or a constant).

use super::pack::Packed;
use crate::model::Policy;
use crate::moe::Route;
use miles_runtime::{Aggregation, MisSpec, RatioLevel, TrainSpec, Trajectory};
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
    /// Clipped policy-gradient loss per token, times the TIS weight and the MIS mask.
    pub pg: Tensor,
    /// 1 where the clipped branch was taken (every token of a clipped sequence under GSPO).
    pub clipped: Tensor,
    pub tis: Tensor,
    /// MIS: 1 where the token keeps its gradient, 0 where its trainer/sampler ratio left the band
    /// (all ones without `mis`).
    pub mis: Tensor,
}

/// The policy-gradient term's settings (the trainer's clip, TIS, MIS and ratio level).
#[derive(Debug, Clone, Copy)]
pub struct PgOptions {
    pub clip_low: f64,
    pub clip_high: f64,
    pub tis_cap: Option<f64>,
    pub mis: Option<MisSpec>,
    pub ratio: RatioLevel,
}

impl PgOptions {
    pub fn of(spec: &TrainSpec) -> PgOptions {
        PgOptions {
            clip_low: spec.clip_low,
            clip_high: spec.clip_high,
            tis_cap: spec.tis_cap,
            mis: spec.mis,
            ratio: spec.ratio,
        }
    }
}

/// max(-A r, -A clip(r, 1-lo, 1+hi)) * tis, with r = exp(logp - old) and
/// tis = min(exp(old - rollout), cap) (detached; 1 without a cap): per token, no MIS.
pub fn pg_terms(
    logp: &Tensor,
    old: &Tensor,
    rollout: &Tensor,
    adv: &Tensor,
    clip_low: f64,
    clip_high: f64,
    tis_cap: Option<f64>,
) -> PgTerms {
    let o = PgOptions { clip_low, clip_high, tis_cap, mis: None, ratio: RatioLevel::Token };
    policy_terms(logp, old, rollout, adv, &Tensor::ones_like(logp), &o)
}

/// The clipped policy gradient over [B, L-1] tensors (`mask` the trained tokens):
/// max(-A r, -A clip(r, 1-lo, 1+hi)) x tis x mis. Per token r = exp(logp - old); per sequence
/// (GSPO) r = exp(sum_t m_t (logp_t - old_t) / sum_t m_t), the same on every token of the row, the
/// gradient flowing through the mean to each token. tis = min(exp(old - rollout), cap) and mis = 1
/// where low <= exp(old - rollout) <= high else 0 (IcePop), both per token and detached.
pub fn policy_terms(
    logp: &Tensor,
    old: &Tensor,
    rollout: &Tensor,
    adv: &Tensor,
    mask: &Tensor,
    o: &PgOptions,
) -> PgTerms {
    let ratio = match o.ratio {
        RatioLevel::Token => (logp - old).exp(),
        RatioLevel::Sequence => {
            let n = mask.sum_dim_intlist(-1, true, Kind::Float).clamp_min(1.0);
            (((logp - old) * mask).sum_dim_intlist(-1, true, Kind::Float) / n).exp()
        }
    };
    let l1 = -adv * &ratio;
    let l2 = -adv * ratio.clamp(1.0 - o.clip_low, 1.0 + o.clip_high);
    // Broadcast a sequence's term over its tokens (GSPO with one advantage per response).
    let l1 = l1.expand_as(logp);
    let l2 = l2.expand_as(logp);
    let clipped = l2.gt_tensor(&l1).to_kind(Kind::Float);
    let pg = l1.maximum(&l2);
    // The trainer/sampler weight, read by TIS and MIS alike; no gradient flows through it.
    let w = (old - rollout).exp().detach();
    let tis = match o.tis_cap {
        Some(cap) => w.clamp_max(cap),
        None => Tensor::ones_like(logp),
    };
    let mis = match o.mis {
        Some(m) => w.ge(m.low).logical_and(&w.le(m.high)).to_kind(Kind::Float),
        None => Tensor::ones_like(logp),
    };
    PgTerms { pg: pg * &tis * &mis, clipped, tis, mis }
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

/// The global denominators of one optimizer step, so the micro-batches' accumulated losses (and
/// gradients) equal the whole step's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Denominators {
    /// Trained tokens in the step (at least 1).
    pub tokens: f64,
    /// Sequences in the step.
    pub seqs: f64,
    /// Micro-batches in the step (`micro_token` averages their token means).
    pub micro_batches: f64,
}

impl Denominators {
    /// The step `slice`, cut into micro-batches of `micro` rows.
    pub fn of(slice: &[Trajectory], micro: usize) -> Denominators {
        Denominators {
            tokens: trained_tokens(slice).max(1.0),
            seqs: slice.len() as f64,
            micro_batches: slice.len().div_ceil(micro.max(1)).max(1) as f64,
        }
    }
}

/// One micro-batch's share of the step's loss, from its masked per-token loss [B, L-1]; the shares
/// of the step's micro-batches add up to:
/// - token: the sum over the step's trained tokens / their count (DAPO);
/// - sequence: the mean over sequences of each one's token mean (the GRPO paper);
/// - micro_token: the mean over micro-batches of each one's token mean (BNPO as TRL computes it);
/// - constant: the sum over the step's trained tokens / (sequences x `tokens`) (Dr. GRPO).
pub fn aggregate(masked: Tensor, mask: &Tensor, aggregation: Aggregation, d: &Denominators) -> Tensor {
    match aggregation {
        Aggregation::Token => masked.sum(Kind::Float) / d.tokens,
        Aggregation::Sequence => {
            let per = masked.sum_dim_intlist(-1, false, Kind::Float)
                / mask.sum_dim_intlist(-1, false, Kind::Float).clamp_min(1.0);
            per.sum(Kind::Float) / d.seqs
        }
        Aggregation::MicroToken => {
            // A micro-batch with no trained token adds 0 (its sum is 0), as TRL's clamp does.
            let n = mask.sum(Kind::Float).clamp_min(1.0);
            masked.sum(Kind::Float) / n / d.micro_batches
        }
        Aggregation::Constant { tokens } => masked.sum(Kind::Float) / (d.seqs.max(1.0) * tokens.max(1) as f64),
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
