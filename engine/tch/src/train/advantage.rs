//! The advantage each response token is trained with: GRPO's (or RLOO's) one per response, PPO's
//! GAE per token, REINFORCE++'s per-token returns, and on-policy distillation's teacher scores
//! folded in per token (docs/recipes/opd.md).

use super::pack::Packed;
use crate::critic::whiten;
use miles_runtime::{OpdSpec, OpdStats, RunError, Trajectory};
use tch::Tensor;

/// On-policy distillation: the teacher stage scored the sampled tokens before the batch came;
/// a trajectory without its scores is an error.
pub(super) fn require_teacher_logprobs(batch: &[Trajectory], o: &OpdSpec) -> Result<(), RunError> {
    match batch.iter().position(|t| t.teacher_logprobs.len() != t.response.len()) {
        Some(i) => Err(RunError::new(
            miles_runtime::E_BACKEND,
            format!("sample {i} reached the trainer without the teacher stage `{}`'s log-probs", o.stage),
        )),
        None => Ok(()),
    }
}

/// Per-token advantages when any term is per token: task_coef x the task's advantage (per token
/// when `task` has them, PPO's GAE or REINFORCE++'s returns, else the response's group-relative
/// one) + coef x (log pi_teacher - log pi_student) of each sampled token (the student's from the
/// sampler). None: GRPO's one per response.
pub(super) fn token_advantages(
    batch: &[Trajectory],
    task: Option<Vec<Vec<f32>>>,
    opd: Option<&OpdSpec>,
) -> (Option<Vec<Vec<f32>>>, Option<OpdStats>) {
    let task_at = |i: usize, j: usize| match &task {
        Some(adv) => adv[i][j],
        None => batch[i].advantage,
    };
    let Some(o) = opd else {
        return (task, None);
    };
    let (mut n, mut kl, mut tsum, mut d_abs, mut a_abs) = (0f64, 0f64, 0f64, 0f64, 0f64);
    let adv = batch
        .iter()
        .enumerate()
        .map(|(i, t)| {
            (0..t.response.len())
                .map(|j| {
                    let d = t.teacher_logprobs[j] - t.rollout_logprobs[j];
                    let (dt, at) = (o.coef as f32 * d, o.task_coef as f32 * task_at(i, j));
                    if t.loss_mask.get(j).copied().unwrap_or(0.0) > 0.0 {
                        n += 1.0;
                        kl -= d as f64;
                        tsum += t.teacher_logprobs[j] as f64;
                        d_abs += dt.abs() as f64;
                        a_abs += at.abs() as f64;
                    }
                    dt + at
                })
                .collect()
        })
        .collect();
    let n = n.max(1.0);
    let share = if d_abs + a_abs > 0.0 { d_abs / (d_abs + a_abs) } else { 0.0 };
    (Some(adv), Some(OpdStats { reverse_kl: kl / n, teacher_logp: tsum / n, opd_share: share, teacher_restarts: 0 }))
}

/// REINFORCE++ (OpenRLHF): per response token the reward r_t = -kl_coef x k1_t on trained tokens,
/// k1_t = old_t - ref_t (when the behaviour and reference log-probs are given), plus the sample's
/// reward at its last trained token; the advantage is the return G_t = sum_{s >= t} r_s (gamma 1),
/// whitened over the batch's trained tokens (mean 0, std 1, + 1e-8) when `std_norm`. Untrained
/// tokens carry no reward (tool output in an episode is not the policy's action).
pub fn reinforce_pp_returns(
    batch: &[Trajectory],
    old: Option<&[Vec<f32>]>,
    reference: Option<&[Vec<f32>]>,
    kl_coef: f64,
    std_norm: bool,
) -> Vec<Vec<f32>> {
    let mut adv: Vec<Vec<f32>> = batch
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let m = |j: usize| t.loss_mask.get(j).copied().unwrap_or(0.0) > 0.0;
            let n = t.response.len();
            let mut r = vec![0f64; n];
            if let (Some(old), Some(rf), true) = (old, reference, kl_coef > 0.0) {
                for (j, r) in r.iter_mut().enumerate().filter(|(j, _)| m(*j)) {
                    *r = -kl_coef * (old[i][j] as f64 - rf[i][j] as f64);
                }
            }
            if let Some(last) = (0..n).rev().find(|&j| m(j)) {
                r[last] += t.reward as f64;
            }
            let mut g = 0f64;
            let mut out = vec![0f32; n];
            for j in (0..n).rev() {
                g += r[j];
                out[j] = g as f32;
            }
            out
        })
        .collect();
    if std_norm {
        let masks: Vec<&[f32]> = batch.iter().map(|t| t.loss_mask.as_slice()).collect();
        whiten(&mut adv, &masks);
    }
    adv
}

/// A micro-batch's advantages (row i is the batch's trajectory `rows[i]`): per token [B, L-1]
/// aligned with its targets, or one per response [B, 1].
pub(super) fn chunk_advantages(
    chunk: &[Trajectory],
    rows: &[usize],
    pk: &Packed,
    token_adv: Option<&[Vec<f32>]>,
) -> Tensor {
    match token_adv {
        Some(adv) => pk.align_rows(adv, rows),
        None => {
            let adv: Vec<f32> = chunk.iter().map(|t| t.advantage).collect();
            crate::device::from_slice(&adv).view([chunk.len() as i64, 1])
        }
    }
}
