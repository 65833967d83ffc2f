//! PPO's critic in the RL step: the targets it gives before any update (GAE advantages, whitened
//! over the trained tokens, and returns) and its own updates by the clipped value loss
//! (`crate::critic` holds the model and the formulas).

use super::dp::DataParallel;
use super::loss::{masked_sum, trained_tokens};
use super::optim::{group_adam_step, rows_of, OptStep};
use super::pack::{pack, pack_chunk};
use crate::critic::{gae, value_loss, whiten, Critic};
use miles_runtime::{CriticStats, PpoSpec, RunError, TrainSpec, Trajectory, E_NONFINITE};
use tch::Kind;

/// PPO's targets for a batch: per response token, the advantage (GAE, whitened over the batch's
/// trained tokens), the return and the value the critic gave before any update.
pub(super) struct CriticTargets {
    pub adv: Vec<Vec<f32>>,
    pub returns: Vec<Vec<f32>>,
    pub values: Vec<Vec<f32>>,
}

pub(super) fn critic_targets(
    c: &Critic,
    batch: &[Trajectory],
    micro: usize,
    p: &PpoSpec,
) -> Result<CriticTargets, RunError> {
    let _g = tch::no_grad_guard();
    let mut values = Vec::with_capacity(batch.len());
    for chunk in batch.chunks(micro.max(1)) {
        let pk = pack_chunk(chunk, false, pack);
        let v = c.values(&pk.tokens, &pk.positions, &pk.valid).narrow(1, 0, pk.width);
        values.extend(pk.extract(&v)?);
    }
    let (mut adv, mut returns) = (Vec::with_capacity(batch.len()), Vec::with_capacity(batch.len()));
    for (t, v) in batch.iter().zip(&values) {
        let (a, r) = gae(v, t.reward, p.gamma, p.lambda);
        adv.push(a);
        returns.push(r);
    }
    let masks: Vec<&[f32]> = batch.iter().map(|t| t.loss_mask.as_slice()).collect();
    whiten(&mut adv, &masks);
    Ok(CriticTargets { adv, returns, values })
}

/// The critic's updates for a batch: the clipped value loss over the same optimizer steps as the
/// policy's (`plan`: every pass's mini-batches of the batch), each step at `critic_lr` on the
/// policy's LR schedule. The targets (old values, returns) are those from before any update. In a
/// data-parallel group (`dp`) this rank trains its micro-batches, the gradients are summed over
/// the ranks, and (ZeRO-1) each rank updates its shard of the critic and sends it to the others;
/// the value loss and clip fraction returned are this rank's shares (the caller sums them).
pub(super) fn train_critic(
    c: &mut Critic,
    spec: &TrainSpec,
    p: &PpoSpec,
    batch: &[Trajectory],
    plan: &[OptStep],
    tg: &CriticTargets,
    dp: Option<&DataParallel>,
) -> Result<CriticStats, RunError> {
    let micro = spec.micro_batch.max(1);
    let (mut cs, tokens) = value_stats(batch, tg);
    let (mut clip_sum, mut steps) = (0f64, 0u64);
    for step in plan {
        let slice = rows_of(batch, &step.rows);
        let g_tokens = trained_tokens(&slice).max(1.0);
        c.zero_grad();
        let mut loss_acc = 0f64;
        let mut local = Ok(());
        for (k, (chunk, rows)) in slice.chunks(micro).zip(step.rows.chunks(micro)).enumerate() {
            if dp.is_some_and(|d| k % d.world != d.rank) {
                continue;
            }
            let pk = pack_chunk(chunk, true, pack);
            let (v_old, ret) = (pk.align_rows(&tg.values, rows), pk.align_rows(&tg.returns, rows));
            let v = c.values(&pk.tokens, &pk.positions, &pk.valid).narrow(1, 0, pk.width);
            let (vl, clipped) = value_loss(&v, &v_old, &ret, p.value_clip);
            let loss = (vl * &pk.mask).sum(Kind::Float) / g_tokens;
            let lv = loss.double_value(&[]);
            if !lv.is_finite() {
                c.zero_grad();
                local =
                    Err(RunError::new(E_NONFINITE, "critic value loss is NaN/infinite; the critic was not updated"));
                break;
            }
            loss_acc += lv;
            loss.backward();
            clip_sum += masked_sum(&clipped, &pk.mask);
        }
        let ratio = if spec.lr > 0.0 { step.lr / spec.lr } else { 1.0 };
        cs.grad_norm += group_adam_step(dp, &c.params(), &mut c.adam, spec, p.critic_lr * ratio, local)?;
        cs.value_loss += loss_acc;
        steps += 1;
    }
    let k = steps.max(1) as f64;
    cs.value_loss /= k;
    cs.grad_norm /= k;
    // Over every pass's tokens: a token trained E times counts E times.
    cs.clip_frac = clip_sum / (tokens * (plan.iter().map(|s| s.epoch).max().map_or(1, |e| e + 1)) as f64);
    Ok(cs)
}

/// Statistics of the values before the update, over trained tokens: their mean, the returns'
/// mean and the explained variance; with the count of trained tokens (at least 1).
fn value_stats(batch: &[Trajectory], tg: &CriticTargets) -> (CriticStats, f64) {
    let (mut n, mut vsum, mut rsum, mut rsq, mut esq, mut esum) = (0f64, 0f64, 0f64, 0f64, 0f64, 0f64);
    for ((t, v), r) in batch.iter().zip(&tg.values).zip(&tg.returns) {
        for ((&m, &v), &r) in t.loss_mask.iter().zip(v).zip(r) {
            if m > 0.0 {
                let (v, r) = (v as f64, r as f64);
                n += 1.0;
                vsum += v;
                rsum += r;
                rsq += r * r;
                esum += r - v;
                esq += (r - v) * (r - v);
            }
        }
    }
    let n1 = n.max(1.0);
    let var_r = rsq / n1 - (rsum / n1).powi(2);
    let var_e = esq / n1 - (esum / n1).powi(2);
    let cs = CriticStats {
        value_mean: vsum / n1,
        return_mean: rsum / n1,
        explained_variance: if var_r > 1e-12 { 1.0 - var_e / var_r } else { 0.0 },
        ..CriticStats::default()
    };
    (cs, n1)
}
