//! The RL step (GRPO and its variants, PPO, on-policy distillation): the inputs computed before
//! any update (the behaviour and reference log-probs, PPO's targets, per-token advantages), then
//! per optimizer step of every pass over the batch (`epochs`) its micro-batches, each a training
//! forward and the enabled terms of the loss (the clipped policy gradient per token or per
//! sequence with its TIS weight and MIS mask, the KL to the reference, the entropy bonus, MoE's
//! load-balancing loss), then PPO's critic over the same passes. In a data-parallel group (`dp`)
//! each rank trains its share of every step's micro-batches and the statistics are summed over the
//! ranks at the end of the call.

use super::advantage::{chunk_advantages, reinforce_pp_returns, require_teacher_logprobs, token_advantages};
use super::dp::DataParallel;
use super::loss::{
    aggregate, entropy, kl_k3, masked_sum, policy_terms, token_logprobs, trained_tokens, Denominators, PgOptions,
};
use super::moe::{add_aux_loss, MoeAcc};
use super::optim::{optimizer_plan, rows_of};
use super::pack::{pack_chunk, pack_for, recorded_routes, Packed};
use super::ppo::{critic_targets, train_critic, CriticTargets};
use super::TchTrainer;
use crate::critic::Critic;
use crate::model::Policy;
use crate::moe::Route;
use miles_runtime::rng::derive_seed;
use miles_runtime::{AdvantageEstimator, EpochStats, OpdStats, RunError, TrainStats, Trajectory};
use std::time::Instant;
use tch::Tensor;

/// What the RL step reads besides the trajectories, all computed before any weight changes.
struct RlInputs {
    /// The behaviour policy's log-probs per response token, from a pass over the weights that
    /// generated the batch; None on-policy (one optimizer step: the training forward's own).
    old: Option<Vec<Vec<f32>>>,
    /// The frozen reference's log-probs, when a KL term reads them.
    reference: Option<Vec<Vec<f32>>>,
    /// PPO's advantages, returns and old values.
    targets: Option<CriticTargets>,
    /// Per-token advantages (PPO's, distillation's, or both); None: one per response.
    token_adv: Option<Vec<Vec<f32>>>,
}

/// Sums over the batch's trained tokens, divided by their count in the step's statistics.
#[derive(Default)]
struct TokenSums {
    /// |trainer's behaviour log-prob - sampler's|.
    logp_diff: f64,
    /// k3 KL between the trainer's behaviour log-probs and the sampler's.
    rollout_kl: f64,
    entropy: f64,
    clip: f64,
    kl: f64,
    tis: f64,
    /// Tokens MIS masked.
    mis_masked: f64,
}

impl TokenSums {
    /// The drift between the trainer's behaviour log-probs `old` and the sampler's, per token.
    fn add_rollout_drift(&mut self, batch: &[Trajectory], old: &[Vec<f32>]) {
        for (t, o) in batch.iter().zip(old) {
            for ((a, b), m) in o.iter().zip(&t.rollout_logprobs).zip(&t.loss_mask) {
                self.logp_diff += ((a - b).abs() * m) as f64;
                let d = (*a - *b) as f64;
                self.rollout_kl += (d.exp() - d - 1.0) * *m as f64;
            }
        }
    }

    /// The means: the drift (measured once, before any update) over the batch's `tokens`, the
    /// training forwards' statistics over every pass's (`passes` x `tokens`).
    fn finish(self, st: &mut TrainStats, tokens: f64, passes: usize, mis: bool) {
        st.logp_diff = self.logp_diff / tokens.max(1.0);
        st.rollout_kl = self.rollout_kl / tokens.max(1.0);
        let n = (tokens * passes.max(1) as f64).max(1.0);
        st.entropy = self.entropy / n;
        st.clip_frac = self.clip / n;
        st.kl = self.kl / n;
        st.tis_weight = self.tis / n;
        st.mis_masked = mis.then_some(self.mis_masked / n);
        st.tokens = tokens as u64;
    }
}

/// One pass's sums over its trained tokens: the training forward's log-probs against the behaviour
/// ones, before each step's update.
#[derive(Default, Clone)]
struct EpochSums {
    tokens: f64,
    clip: f64,
    k1: f64,
    k3: f64,
    max_abs: f64,
}

impl EpochSums {
    /// Adds a micro-batch: d = logp - old on the trained tokens, clipped the clip indicator.
    fn add(&mut self, lp: &Tensor, old: &Tensor, clipped: &Tensor, mask: &Tensor) {
        let _g = tch::no_grad_guard();
        // In f64, and k3 = expm1(d) - d, so a ratio that is not exactly 1 never rounds to 0 here.
        let d = (lp.detach().to_kind(tch::Kind::Double) - old.to_kind(tch::Kind::Double)) * mask;
        self.tokens += mask.sum(tch::Kind::Double).double_value(&[]);
        self.clip += masked_sum(clipped, mask);
        self.k1 -= d.sum(tch::Kind::Double).double_value(&[]);
        self.k3 += ((d.expm1() - &d) * mask).sum(tch::Kind::Double).double_value(&[]);
        self.max_abs = self.max_abs.max(d.abs().max().double_value(&[]));
    }

    fn finish(&self) -> EpochStats {
        let n = self.tokens.max(1.0);
        EpochStats {
            clip_frac: self.clip / n,
            approx_kl: self.k1 / n,
            approx_kl_k3: self.k3 / n,
            max_abs_log_ratio: self.max_abs,
        }
    }
}

/// One micro-batch of an optimizer step: its trajectories, row i the batch's `rows[i]`, and the
/// step's denominators.
struct Micro<'a> {
    chunk: &'a [Trajectory],
    rows: &'a [usize],
    /// Rows in the step's slice (the MoE loss's share).
    slice_len: usize,
    denom: &'a Denominators,
}

/// A training forward over a micro-batch: the targets' log-probs (in the autograd graph), the full
/// log-softmax, and MoE's load-balancing loss and flipped-route mask.
struct Forward {
    lp: Tensor,
    logp_all: Tensor,
    aux: Option<Tensor>,
    flipped: Option<Tensor>,
}

impl TchTrainer {
    /// Log-probs of each trajectory's response under `policy` (no grad, in micro-batches),
    /// replaying recorded routing when `replay` (the old and reference passes see the experts the
    /// training forward will use).
    pub(crate) fn logprobs_of(
        policy: &Policy,
        batch: &[Trajectory],
        micro: usize,
        temperature: f64,
        replay: bool,
    ) -> Result<Vec<Vec<f32>>, RunError> {
        let _g = tch::no_grad_guard();
        let mut out = Vec::with_capacity(batch.len());
        for chunk in batch.chunks(micro.max(1)) {
            let pk = pack_chunk(chunk, false, |p, r, m| pack_for(policy, p, r, m));
            let mut route = match (replay, policy.cfg.moe.is_some()) {
                (true, true) => Some(Route::for_batch(recorded_routes(chunk, &pk), &pk.valid, false)),
                _ => None,
            };
            let (lp, _) = token_logprobs(policy, &pk, temperature, route.as_mut());
            out.extend(pk.extract(&lp)?);
        }
        Ok(out)
    }

    pub fn train_rl_impl(
        &mut self,
        batch: &[Trajectory],
        lrs: &[f64],
        temperature: f64,
    ) -> Result<TrainStats, RunError> {
        if let Some(dp) = &self.dp {
            // This call's collective seconds only (a checkpoint's gather came before).
            dp.take_collective_s();
        }
        let mut moe = MoeAcc::new(&self.policy, self.replay);
        let kept = moe.as_mut().and_then(|m| m.drop_unfit(batch, &self.policy));
        let batch = kept.as_deref().unwrap_or(batch);
        self.begin_lora()?;
        if self.spec.ppo.is_some() && self.critic.is_none() {
            self.critic = Some(Critic::from_policy_sharded(&self.policy, self.zero_shard()));
            self.dp_take_critic()?;
        }
        let micro = self.spec.micro_batch.max(1);
        let epochs = self.spec.epochs.max(1);
        // The passes' shuffles: the run's seed and the optimizer steps taken so far (the step's
        // place in the run, saved in every checkpoint, so a resumed run shuffles alike).
        let plan = optimizer_plan(batch.len(), lrs, epochs, derive_seed(self.seed, "epochs", self.version))?;
        // The first pass's order (its steps cover every row once).
        let first_order: Option<Vec<usize>> =
            plan.first().map(|_| plan.iter().filter(|p| p.epoch == 0).flat_map(|p| p.rows.iter().copied()).collect());
        // Phase timings for the profile (CPU ops are synchronous, so wall time is the op's time).
        let t_lp = Instant::now();
        let on_policy = epochs == 1 && lrs.len() == 1;
        let (inputs, opd) = self.rl_inputs(batch, on_policy, first_order.as_deref(), temperature)?;
        let mut st = TrainStats { logprob_s: t_lp.elapsed().as_secs_f64(), opd, ..TrainStats::default() };
        let mut sums = TokenSums::default();
        // The drift before any update is over the whole batch, which every rank holds: rank 0
        // counts it, so the sum over ranks counts it once.
        if let (Some(old), (0, _)) = (&inputs.old, self.dp_rank()) {
            sums.add_rollout_drift(batch, old);
        }
        let mut passes = vec![EpochSums::default(); epochs];
        for step in &plan {
            let slice = rows_of(batch, &step.rows);
            let denom = Denominators::of(&slice, micro);
            self.zero_grad();
            let mut loss_acc = 0f64;
            // This rank's micro-batches (all of them in one process); a failure is carried to the
            // optimizer step, which fails it on every rank of a group at once.
            let mut local = Ok(());
            for (k, (chunk, rows)) in slice.chunks(micro).zip(step.rows.chunks(micro)).enumerate() {
                if !self.trains_micro(k) {
                    continue;
                }
                let m = Micro { chunk, rows, slice_len: slice.len(), denom: &denom };
                let acc = (&mut sums, &mut passes[step.epoch]);
                match self.rl_micro_batch(&m, &inputs, temperature, &mut moe, acc, &mut st) {
                    Ok(l) => loss_acc += l,
                    Err(e) => {
                        local = Err(e);
                        break;
                    }
                }
            }
            let t_opt = Instant::now();
            let norm = self.optimizer_step(step.lr, local)?;
            st.optimizer_s += t_opt.elapsed().as_secs_f64();
            st.loss += loss_acc;
            st.grad_norm += norm;
            st.optimizer_steps += 1;
        }
        if let (Some(p), Some(tg), Some(c)) = (&self.spec.ppo, &inputs.targets, self.critic.as_mut()) {
            st.critic = Some(train_critic(c, &self.spec, p, batch, &plan, tg, self.dp.as_ref())?);
        }
        if let Some(dp) = &self.dp {
            reduce_rl_stats(dp, &mut st, &mut sums, &mut passes, moe.as_mut())?;
        }
        let k = st.optimizer_steps.max(1) as f64;
        st.loss /= k;
        st.grad_norm /= k;
        sums.finish(&mut st, trained_tokens(batch), epochs, self.spec.mis.is_some());
        if epochs > 1 {
            st.epochs = passes.iter().map(EpochSums::finish).collect();
        }
        st.moe = moe.map(MoeAcc::finish);
        Ok(st)
    }

    /// The step's inputs, before any update. On-policy (one optimizer step for the whole batch)
    /// every micro-batch is computed before the update, so the "old" log-probs are the detached
    /// log-probs of the training forward itself and the separate pass is skipped. With several
    /// steps per batch (or several passes), later steps see updated weights, so the old log-probs
    /// come from one pass over the weights that generated the batch (the trainer's view of them),
    /// in the micro-batches of the first pass's order (`first_order`), so the first step's
    /// training forward computes exactly them (its ratio is exactly 1). REINFORCE++ with a KL
    /// reads them too, before any forward, for its per-token rewards.
    fn rl_inputs(
        &self,
        batch: &[Trajectory],
        on_policy: bool,
        first_order: Option<&[usize]>,
        temperature: f64,
    ) -> Result<(RlInputs, Option<OpdStats>), RunError> {
        let micro = self.spec.micro_batch.max(1);
        let reinforce = self.spec.advantage == AdvantageEstimator::ReinforcePp;
        let with_ref = self.reference.is_some() && self.spec.kl_coef > 0.0;
        let old = match (on_policy && !(reinforce && with_ref), first_order) {
            (false, Some(order)) => {
                let lp = Self::logprobs_of(&self.policy, &rows_of(batch, order), micro, temperature, self.replay)?;
                let mut old = vec![Vec::new(); batch.len()];
                for (&i, l) in order.iter().zip(lp) {
                    old[i] = l;
                }
                Some(old)
            }
            _ => None,
        };
        let reference = match (&self.reference, with_ref) {
            (Some(r), true) => Some(Self::logprobs_of(r, batch, micro, temperature, self.replay)?),
            _ => None,
        };
        // PPO: per-token advantages and returns from the critic's values before any update.
        let targets = match (&self.spec.ppo, &self.critic) {
            (Some(p), Some(c)) => Some(critic_targets(c, batch, micro, p)?),
            _ => None,
        };
        if let Some(o) = &self.spec.opd {
            require_teacher_logprobs(batch, o)?;
        }
        let task = match (&targets, reinforce) {
            (Some(tg), _) => Some(tg.adv.clone()),
            (None, true) => Some(reinforce_pp_returns(
                batch,
                old.as_deref(),
                reference.as_deref(),
                self.spec.kl_coef,
                self.spec.std_norm,
            )),
            (None, false) => None,
        };
        let (token_adv, opd) = token_advantages(batch, task, self.spec.opd.as_ref());
        Ok((RlInputs { old, reference, targets, token_adv }, opd))
    }

    /// One micro-batch: the training forward, the loss of the enabled terms, its backward and the
    /// statistics. Returns the loss's value.
    // `a = a + b` on purpose: tch's `+=` is in-place and would corrupt the autograd graph.
    #[allow(clippy::assign_op_pattern)]
    fn rl_micro_batch(
        &mut self,
        m: &Micro,
        inputs: &RlInputs,
        temperature: f64,
        moe: &mut Option<MoeAcc>,
        (sums, pass): (&mut TokenSums, &mut EpochSums),
        st: &mut TrainStats,
    ) -> Result<f64, RunError> {
        let t_fwd = Instant::now();
        let pk = pack_chunk(m.chunk, true, |p, r, ms| pack_for(&self.policy, p, r, ms));
        let rollv: Vec<&[f32]> = m.chunk.iter().map(|t| t.rollout_logprobs.as_slice()).collect();
        let roll_t = pk.align(&rollv);
        let adv_t = chunk_advantages(m.chunk, m.rows, &pk, inputs.token_adv.as_deref());
        let f = self.training_forward(m.chunk, &pk, temperature, moe);
        let old_t = match &inputs.old {
            Some(old) => pk.align_rows(old, m.rows),
            None => on_policy_old(&f, &roll_t, &pk, moe.as_mut(), sums),
        };
        // PPO's `rollout_logprobs`: the behaviour policy is the sampler's.
        let old_t = match self.spec.ppo.as_ref().is_some_and(|p| p.rollout_logprobs) {
            true => roll_t.shallow_clone(),
            false => old_t,
        };
        let s = &self.spec;
        let terms = policy_terms(&f.lp, &old_t, &roll_t, &adv_t, &pk.mask, &PgOptions::of(s));
        // The entropy is a statistic unless it is in the loss: then no gradient graph.
        let entropy = entropy(&f.logp_all, s.entropy_coef != 0.0);
        let mut tok_loss = terms.pg.shallow_clone();
        if let Some(refs) = &inputs.reference {
            let kl = kl_k3(&f.lp, &pk.align_rows(refs, m.rows));
            sums.kl += masked_sum(&kl, &pk.mask);
            // REINFORCE++ put the KL in the per-token rewards already.
            if s.advantage != AdvantageEstimator::ReinforcePp {
                tok_loss = tok_loss + kl * s.kl_coef;
            }
        }
        if s.entropy_coef != 0.0 {
            tok_loss = tok_loss - &entropy * s.entropy_coef;
        }
        let loss = aggregate(tok_loss * &pk.mask, &pk.mask, s.aggregation, m.denom);
        // The load-balancing loss, weighted so the micro-batches' terms add up to the slice's.
        let loss = add_aux_loss(loss, f.aux, self.policy.cfg.moe.as_ref(), m.chunk.len(), m.slice_len as f64);
        let lv = self.finite_loss(&loss, "loss is NaN/infinite; weights were not updated")?;
        st.forward_s += t_fwd.elapsed().as_secs_f64();
        let t_bwd = Instant::now();
        loss.backward();
        st.backward_s += t_bwd.elapsed().as_secs_f64();
        let t_stats = Instant::now();
        let _g = tch::no_grad_guard();
        sums.entropy += masked_sum(&entropy, &pk.mask);
        sums.clip += masked_sum(&terms.clipped, &pk.mask);
        sums.tis += masked_sum(&terms.tis, &pk.mask);
        sums.mis_masked += masked_sum(&(1.0 - &terms.mis), &pk.mask);
        pass.add(&f.lp, &old_t, &terms.clipped, &pk.mask);
        // The statistics are forward-side work (reductions of forward tensors).
        st.forward_s += t_stats.elapsed().as_secs_f64();
        Ok(lv)
    }

    /// The training forward over `pk` (adapter dropout on), MoE layers replaying `chunk`'s
    /// recorded experts under R3 and adding their routing to `moe`.
    fn training_forward(
        &self,
        chunk: &[Trajectory],
        pk: &Packed,
        temperature: f64,
        moe: &mut Option<MoeAcc>,
    ) -> Forward {
        self.set_training(true);
        let mut pass = moe.as_ref().map(|m| m.pass_route(chunk, pk));
        let (lp, logp_all) = token_logprobs(&self.policy, pk, temperature, pass.as_mut().map(|p| &mut p.route));
        self.set_training(false);
        let (aux, flipped) = match (moe.as_mut(), pass.as_ref()) {
            (Some(m), Some(p)) => m.add(p, pk),
            _ => (None, None),
        };
        Forward { lp, logp_all, aux, flipped }
    }
}

/// A data-parallel group: the call's statistics over the whole batch, as one process reports them.
/// Each rank's sums cover its micro-batches, so they are summed over the ranks (the pass's largest
/// |log-ratio| is a max); the whole-batch figures (the drift before any update, counted by rank 0;
/// the token count, the critic's value statistics, OPD's, R3's bytes) are left as they are. Also
/// the max over ranks of the seconds in collectives and each rank's peak RSS.
fn reduce_rl_stats(
    dp: &DataParallel,
    st: &mut TrainStats,
    sums: &mut TokenSums,
    passes: &mut [EpochSums],
    moe: Option<&mut MoeAcc>,
) -> Result<(), RunError> {
    let s = sums;
    let mut add: Vec<&mut f64> = vec![
        &mut st.loss,
        &mut s.logp_diff,
        &mut s.rollout_kl,
        &mut s.entropy,
        &mut s.clip,
        &mut s.kl,
        &mut s.tis,
        &mut s.mis_masked,
    ];
    // The critic's value loss and clip fraction are sums over micro-batches divided by global
    // counts (optimizer steps, the batch's tokens x passes): the ranks' shares add up.
    if let Some(c) = st.critic.as_mut() {
        add.extend([&mut c.value_loss, &mut c.clip_frac]);
    }
    let mut max: Vec<&mut f64> = Vec::new();
    for p in passes.iter_mut() {
        add.extend([&mut p.tokens, &mut p.clip, &mut p.k1, &mut p.k3]);
        max.push(&mut p.max_abs);
    }
    if let Some(m) = moe {
        add.extend(m.rank_sums());
    }
    let (collective_s, wait_s, rss) = dp.reduce_stats(&mut add, &mut max)?;
    st.collective_s = collective_s;
    st.rank_wait_s = wait_s;
    st.rank_peak_rss = rss;
    Ok(())
}

/// On-policy, the behaviour log-probs are the training forward's own, detached; their drift from
/// the sampler's `roll_t` is measured here, and (MoE) on the tokens whose route flipped.
fn on_policy_old(f: &Forward, roll_t: &Tensor, pk: &Packed, moe: Option<&mut MoeAcc>, sums: &mut TokenSums) -> Tensor {
    let old_t = f.lp.detach();
    let _g = tch::no_grad_guard();
    let diff = (&old_t - roll_t).abs() * &pk.mask;
    sums.logp_diff += diff.sum(tch::Kind::Double).double_value(&[]);
    sums.rollout_kl += masked_sum(&kl_k3(roll_t, &old_t), &pk.mask);
    if let (Some(m), Some(flipped)) = (moe, &f.flipped) {
        m.add_flip_drift(&diff, flipped, pk);
    }
    old_t
}
