//! The advantage each response token is trained with: GRPO's one per response, PPO's GAE per
//! token, and on-policy distillation's teacher scores folded in per token (docs/recipes/opd.md).

use super::pack::Packed;
use super::ppo::CriticTargets;
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

/// Per-token advantages when any term is per token: task_coef x the task's advantage (PPO's GAE
/// per token, else the response's group-relative one) + coef x (log pi_teacher - log pi_student)
/// of each sampled token (the student's from the sampler). None: GRPO's one per response.
pub(super) fn token_advantages(
    batch: &[Trajectory],
    targets: Option<&CriticTargets>,
    opd: Option<&OpdSpec>,
) -> (Option<Vec<Vec<f32>>>, Option<OpdStats>) {
    let task = |i: usize, j: usize| match targets {
        Some(tg) => tg.adv[i][j],
        None => batch[i].advantage,
    };
    let Some(o) = opd else {
        return (targets.map(|tg| tg.adv.clone()), None);
    };
    let (mut n, mut kl, mut tsum, mut d_abs, mut a_abs) = (0f64, 0f64, 0f64, 0f64, 0f64);
    let adv = batch
        .iter()
        .enumerate()
        .map(|(i, t)| {
            (0..t.response.len())
                .map(|j| {
                    let d = t.teacher_logprobs[j] - t.rollout_logprobs[j];
                    let (dt, at) = (o.coef as f32 * d, o.task_coef as f32 * task(i, j));
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

/// A micro-batch's advantages (rows `base..` of the batch): per token [B, L-1] aligned with its
/// targets, or one per response [B, 1].
pub(super) fn chunk_advantages(
    chunk: &[Trajectory],
    base: usize,
    pk: &Packed,
    token_adv: Option<&[Vec<f32>]>,
) -> Tensor {
    match token_adv {
        Some(adv) => pk.align_rows(adv, base),
        None => {
            let adv: Vec<f32> = chunk.iter().map(|t| t.advantage).collect();
            crate::device::from_slice(&adv).view([chunk.len() as i64, 1])
        }
    }
}
