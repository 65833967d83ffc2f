//! Training: log-prob recomputation, the GRPO/PPO loss (asymmetric clip, TIS, k3 KL, entropy
//! bonus, token/sequence aggregation), masked cross-entropy SFT, gradient accumulation over
//! micro-batches, global-norm clipping and AdamW with our own (checkpointable) state.

use crate::critic::{gae, value_loss, whiten, Critic};
use crate::model::{left_pad, load_named, named_tensors, read_tensors, write_tensors, Policy};
use crate::moe::{flips, Route};
use miles_runtime::tasks::TokenId;
use miles_runtime::{
    Aggregation, CriticStats, MoeStats, NamedTensor, OpdSpec, OpdStats, PpoSpec, RunError, SftStats, TrainSpec,
    TrainStats, Trajectory, WeightSnapshot, E_CHECKPOINT, E_NONFINITE,
};
use std::cell::Cell;
use std::path::Path;
use std::time::Instant;
use tch::{Kind, Tensor};

/// One padded micro-batch, aligned for next-token prediction: column c of the [B, L-1] tensors
/// is the prediction of token c+1 from tokens 0..=c.
pub struct Packed {
    pub tokens: Tensor,
    pub valid: Tensor,
    pub positions: Tensor,
    /// Next tokens [B, L-1].
    targets: Tensor,
    /// Loss mask over predicted tokens [B, L-1] (response tokens only, times the trajectory mask).
    mask: Tensor,
    /// Response token j of row b sits at column off_b + j.
    offsets: Vec<i64>,
    lens: Vec<usize>,
    width: i64,
    /// Column of each row's first token (left padding: after the pads; aligned: 0).
    starts: Vec<usize>,
}

pub fn pack(prompts: &[&[TokenId]], responses: &[&[TokenId]], masks: Option<&[&[f32]]>) -> Packed {
    let seqs: Vec<Vec<i64>> =
        prompts.iter().zip(responses).map(|(p, r)| p.iter().chain(r.iter()).map(|&t| t as i64).collect()).collect();
    let (tokens, valid, positions, l) = left_pad(&seqs);
    let w = l - 1;
    let b = seqs.len();
    let mut mask = vec![0f32; b * w.max(0) as usize];
    let mut offsets = Vec::with_capacity(b);
    for (i, (p, r)) in prompts.iter().zip(responses).enumerate() {
        // Sequence starts at column l - len; response token j is token index p.len()+j, predicted
        // at column (l - len) + p.len() + j - 1.
        let off = l - (p.len() + r.len()) as i64 + p.len() as i64 - 1;
        offsets.push(off);
        for j in 0..r.len() {
            let m = masks.map_or(1.0, |ms| ms[i].get(j).copied().unwrap_or(0.0));
            mask[i * w as usize + (off as usize + j)] = m;
        }
    }
    let targets = tokens.narrow(1, 1, w);
    Packed {
        mask: crate::device::from_slice(&mask).view([b as i64, w]),
        targets,
        tokens,
        valid,
        positions,
        offsets,
        lens: responses.iter().map(|r| r.len()).collect(),
        width: w,
        starts: seqs.iter().map(|q| (l as usize).saturating_sub(q.len())).collect(),
    }
}

/// `pack` for the batch-invariant mode: token i of every row in column i (right padding) over
/// `max_len` columns, the layout the sampler's slot cache has, so each query attends the same key
/// columns in both.
pub fn pack_aligned(
    prompts: &[&[TokenId]],
    responses: &[&[TokenId]],
    masks: Option<&[&[f32]]>,
    max_len: usize,
) -> Packed {
    let b = prompts.len();
    let l = max_len.max(2);
    let w = l - 1;
    let (mut tok, mut valid, mut mask) = (vec![0i64; b * l], vec![false; b * l], vec![0f32; b * w]);
    let mut offsets = Vec::with_capacity(b);
    for (i, (p, r)) in prompts.iter().zip(responses).enumerate() {
        for (j, &t) in p.iter().chain(r.iter()).take(l).enumerate() {
            tok[i * l + j] = t as i64;
            valid[i * l + j] = true;
        }
        let off = p.len() as i64 - 1;
        offsets.push(off);
        for j in 0..r.len() {
            if let Some(m) = mask.get_mut(i * w + (off as usize + j)) {
                *m = masks.map_or(1.0, |ms| ms[i].get(j).copied().unwrap_or(0.0));
            }
        }
    }
    let shape = [b as i64, l as i64];
    let tokens = crate::device::from_slice(&tok).view(shape);
    let positions =
        Tensor::arange(l as i64, (Kind::Int64, crate::device::current())).unsqueeze(0).repeat([b as i64, 1]);
    Packed {
        mask: crate::device::from_slice(&mask).view([b as i64, w as i64]),
        targets: tokens.narrow(1, 1, w as i64),
        tokens,
        valid: crate::device::from_slice(&valid).view(shape),
        positions,
        offsets,
        lens: responses.iter().map(|r| r.len()).collect(),
        width: w as i64,
        starts: vec![0; b],
    }
}

/// The layout `policy`'s forward needs: aligned for the batch-invariant mode, else left-padded.
pub fn pack_for(policy: &Policy, prompts: &[&[TokenId]], responses: &[&[TokenId]], masks: Option<&[&[f32]]>) -> Packed {
    match policy.invariant {
        true => pack_aligned(prompts, responses, masks, policy.cfg.max_len),
        false => pack(prompts, responses, masks),
    }
}

impl Packed {
    /// Scatters per-response-token values into a [B, L-1] tensor aligned with `targets`.
    fn align(&self, values: &[&[f32]]) -> Tensor {
        let b = self.lens.len();
        let w = self.width as usize;
        let mut out = vec![0f32; b * w];
        for i in 0..b {
            for j in 0..self.lens[i] {
                out[i * w + self.offsets[i] as usize + j] = values[i].get(j).copied().unwrap_or(0.0);
            }
        }
        crate::device::from_slice(&out).view([b as i64, w as i64])
    }

    fn extract(&self, t: &Tensor) -> Result<Vec<Vec<f32>>, RunError> {
        let flat = crate::model::f32_values(t)?;
        let w = self.width as usize;
        Ok((0..self.lens.len())
            .map(|i| (0..self.lens[i]).map(|j| flat[i * w + self.offsets[i] as usize + j]).collect())
            .collect())
    }
}

/// R3: the recorded experts of a packed micro-batch's trajectories, per MoE layer [B, L, k], and
/// the mask [B, L] of tokens that have them (pads and each sequence's last token do not). None
/// when no trajectory carries routing.
pub fn recorded_routes(chunk: &[Trajectory], pk: &Packed) -> Option<(Vec<Tensor>, Tensor)> {
    let first = chunk.iter().find_map(|t| t.routing.as_ref())?;
    let (layers, k) = (first.layers, first.top_k);
    let (b, l) = (chunk.len(), pk.width as usize + 1);
    let mut ids = vec![vec![0i64; b * l * k]; layers];
    let mut mask = vec![false; b * l];
    for (i, t) in chunk.iter().enumerate() {
        let Some(r) = t.routing.as_ref().filter(|r| r.layers == layers && r.top_k == k) else { continue };
        let start = pk.starts[i];
        for (tok, per) in r.ids().chunks_exact(layers * k).enumerate() {
            let col = start + tok;
            mask[i * l + col] = true;
            for (li, layer_ids) in ids.iter_mut().enumerate() {
                layer_ids[(i * l + col) * k..(i * l + col + 1) * k].copy_from_slice(&per[li * k..(li + 1) * k]);
            }
        }
    }
    let shape = [b as i64, l as i64];
    let ids = ids.iter().map(|v| crate::device::from_slice(v).view([b as i64, l as i64, k as i64])).collect();
    Some((ids, crate::device::from_slice(&mask).view(shape)))
}

/// Log-probs of the targets [B, L-1] and the full log-softmax [B, L-1, V] at `temperature`,
/// MoE layers routed by `route` (None: the router's own choice, no statistics).
fn token_logprobs(policy: &Policy, pk: &Packed, temperature: f64, route: Option<&mut Route>) -> (Tensor, Tensor) {
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

pub(crate) struct AdamState {
    pub(crate) m: Vec<Tensor>,
    pub(crate) v: Vec<Tensor>,
    pub(crate) t: u64,
}

pub struct TchTrainer {
    pub policy: Policy,
    reference: Option<Policy>,
    spec: TrainSpec,
    /// The optimizer state of what trains: the whole model, or one per adapter under LoRA (each
    /// adapter steps, clips and counts its own Adam steps: multi-LoRA adapters never share one).
    adam: Vec<AdamState>,
    version: u64,
    /// The Hugging Face directory the policy was loaded from: the saved model carries its
    /// config.json and tokenizer files through.
    pub source: Option<crate::hf::HfMeta>,
    /// PPO's critic, from the first RL step on (`crate::critic`).
    pub critic: Option<Critic>,
    /// The engines may not hold this trainer's base weights (a fresh trainer, or one loaded from
    /// a checkpoint): the next export sends the base with the adapters. Cleared by that export.
    base_stale: Cell<bool>,
    /// R3: replay the trajectories' recorded experts in every forward over them.
    pub replay: bool,
}

/// A checkpoint's adapters (PEFT names, as in `adapter_model.safetensors`).
const ADAPTER_FILE: &str = "adapter_model.safetensors";

impl TchTrainer {
    pub fn new(mut policy: Policy, spec: TrainSpec) -> TchTrainer {
        policy.lora_spec = spec.lora.clone();
        policy.set_requires_grad(true);
        let adam = vec![AdamState::zeros(policy.params())];
        TchTrainer {
            policy,
            reference: None,
            spec,
            adam,
            version: 0,
            source: None,
            critic: None,
            base_stale: Cell::new(true),
            replay: false,
        }
    }

    /// A run's trainer: `policy` with the run's training settings, replaying routing when the
    /// rollout says so (in process and in a `miles worker` alike).
    pub fn for_run(mut policy: Policy, spec: &miles_runtime::RunSpec, source: Option<crate::hf::HfMeta>) -> TchTrainer {
        policy.invariant = spec.rollout.batch_invariant;
        policy.bf16_matmuls = spec.train.precision == miles_runtime::Precision::Bf16;
        let mut t = TchTrainer::new(policy, spec.train.clone());
        t.replay = spec.rollout.r3.as_ref().is_some_and(|r| r.replay);
        t.source = source;
        t
    }

    /// What the optimizer updates: the active adapter once LoRA is attached, else every parameter.
    fn trainable(&self) -> Vec<(String, Tensor)> {
        match self.policy.lora() {
            Some(l) => l.named(),
            None => self.policy.params().iter().map(|(n, t)| (n.clone(), t.shallow_clone())).collect(),
        }
    }

    /// Every optimizer state's tensors with its names, in checkpoint order.
    fn optimizer_tensors(&self) -> Vec<(String, Tensor)> {
        let sets: Vec<Vec<(String, Tensor)>> = match self.policy.adapters() {
            [] => vec![self.trainable()],
            ads => ads.iter().map(|a| a.named()).collect(),
        };
        let mut named = Vec::new();
        for (set, adam) in sets.iter().zip(&self.adam) {
            for (i, (n, _)) in set.iter().enumerate() {
                named.push((format!("exp_avg.{n}"), adam.m[i].shallow_clone()));
                named.push((format!("exp_avg_sq.{n}"), adam.v[i].shallow_clone()));
            }
        }
        named
    }

    /// Fresh optimizer state for what trains (every adapter's under LoRA).
    fn fresh_optimizer(&mut self) {
        self.adam = match self.policy.adapters() {
            [] => vec![AdamState::zeros(self.policy.params())],
            ads => ads.iter().map(|a| AdamState::zeros(&a.named())).collect(),
        };
    }

    /// Multi-LoRA: the adapter the next `train_rl` trains (and every forward applies).
    pub fn select_adapter(&mut self, i: usize) -> Result<(), RunError> {
        self.begin_lora();
        self.policy.select_adapter(i)
    }

    /// With LoRA, RL trains adapters on the base as it stands now (after any SFT warm-up): the
    /// base is frozen and the optimizer restarts over the adapters alone. Since B starts at
    /// zero the policy is unchanged, so engines sampling the base sample this policy exactly.
    fn begin_lora(&mut self) {
        if !self.policy.adapters().is_empty() || self.policy.lora_spec.is_none() {
            return;
        }
        self.policy.set_requires_grad(false);
        self.policy.attach_lora();
        for l in self.policy.adapters() {
            l.set_requires_grad(true);
        }
        self.fresh_optimizer();
    }

    /// Dropout on the adapters' inputs, in training forward passes only.
    fn set_training(&self, on: bool) {
        if let Some(l) = self.policy.lora() {
            l.set_training(on);
        }
    }

    /// A weight update: with LoRA attached and the engines holding the base, the adapters alone.
    pub fn export(&self) -> Result<WeightSnapshot, RunError> {
        if !self.policy.adapters().is_empty() && !self.base_stale.get() {
            return self.policy.adapter_snapshot(self.version);
        }
        let w = self.policy.snapshot(self.version)?;
        self.base_stale.set(false);
        Ok(w)
    }

    /// Every weight, base and adapters, for a receiver that holds nothing yet.
    pub fn export_full(&self) -> Result<WeightSnapshot, RunError> {
        self.policy.snapshot(self.version)
    }

    fn zero_grad(&mut self) {
        for (_, p) in self.trainable() {
            let mut g = p.grad();
            if g.defined() {
                let _ = g.zero_();
            }
        }
    }

    /// Global-norm clip then one AdamW step. Returns the pre-clip norm; a non-finite norm leaves
    /// the weights untouched and is an error.
    fn optimizer_step(&mut self, lr: f64) -> Result<f64, RunError> {
        let params = self.trainable();
        let adam = &mut self.adam[self.policy.lora().map_or(0, |_| self.policy.active_adapter())];
        let norm = adam_step(&params, adam, &self.spec, lr)?;
        self.version += 1;
        Ok(norm)
    }

    /// Log-probs (no grad) of packed rows under `policy`, in micro-batches.
    /// Log-probs of each trajectory's response under `policy`, replaying recorded routing when
    /// `replay` (the old and reference passes see the experts the training forward will use).
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
            let pr: Vec<&[TokenId]> = chunk.iter().map(|t| t.prompt.as_slice()).collect();
            let rs: Vec<&[TokenId]> = chunk.iter().map(|t| t.response.as_slice()).collect();
            let pk = pack_for(policy, &pr, &rs, None);
            let mut route = match (replay, policy.cfg.moe.is_some()) {
                (true, true) => Some(Route::for_batch(recorded_routes(chunk, &pk), &pk.valid, false)),
                _ => None,
            };
            let (lp, _) = token_logprobs(policy, &pk, temperature, route.as_mut());
            out.extend(pk.extract(&lp)?);
        }
        Ok(out)
    }

    // `a = a + b` on purpose: tch's `+=` is in-place and would corrupt the autograd graph.
    #[allow(clippy::assign_op_pattern)]
    pub fn train_rl_impl(
        &mut self,
        batch: &[Trajectory],
        lrs: &[f64],
        temperature: f64,
    ) -> Result<TrainStats, RunError> {
        let kept;
        let mut moe = MoeAcc::new(&self.policy, self.replay);
        let batch = match moe.as_mut().map(|m| m.drop_unfit(batch, &self.policy)) {
            Some(Some(k)) => {
                kept = k;
                &kept[..]
            }
            _ => batch,
        };
        self.begin_lora();
        if self.spec.ppo.is_some() && self.critic.is_none() {
            self.critic = Some(Critic::from_policy(&self.policy));
        }
        let micro = self.spec.micro_batch.max(1);
        // Phase timings for the profile (CPU ops are synchronous, so wall time is the op's time).
        let t_lp = Instant::now();
        // On-policy (one optimizer step for the whole batch): every micro-batch is computed before
        // the update, so the "old" log-probs are the detached log-probs of the training forward
        // itself and the separate pass is skipped. With several steps per batch, later slices see
        // updated weights, so the old log-probs come from a pass over the weights that generated
        // the batch (the trainer's view of them).
        let on_policy = lrs.len() == 1;
        let old = match on_policy {
            true => None,
            false => Some(Self::logprobs_of(&self.policy, batch, micro, temperature, self.replay)?),
        };
        let reference = match (&self.reference, self.spec.kl_coef > 0.0) {
            (Some(r), true) => Some(Self::logprobs_of(r, batch, micro, temperature, self.replay)?),
            _ => None,
        };
        // PPO: per-token advantages and returns from the critic's values before any update.
        let ppo = self.spec.ppo.clone();
        let targets = match (&ppo, &self.critic) {
            (Some(p), Some(c)) => Some(critic_targets(c, batch, micro, p)?),
            _ => None,
        };
        // On-policy distillation: the teacher stage scored the sampled tokens before the batch came.
        let opd = self.spec.opd.clone();
        if let Some(o) = &opd {
            if let Some(i) = batch.iter().position(|t| t.teacher_logprobs.len() != t.response.len()) {
                return Err(RunError::new(
                    miles_runtime::E_BACKEND,
                    format!("sample {i} reached the trainer without the teacher stage `{}`'s log-probs", o.stage),
                ));
            }
        }
        // Per-token advantages (PPO's, distillation's, or both), else one per response.
        let (token_adv, opd_stats) = token_advantages(batch, targets.as_ref(), opd.as_ref());
        let mut st = TrainStats { logprob_s: t_lp.elapsed().as_secs_f64(), opd: opd_stats, ..TrainStats::default() };
        let (mut diff_sum, mut rkl_sum) = (0f64, 0f64);
        let tok_total = trained_tokens(batch);
        if let Some(old) = &old {
            for (t, o) in batch.iter().zip(old) {
                for ((a, b), m) in o.iter().zip(&t.rollout_logprobs).zip(&t.loss_mask) {
                    diff_sum += ((a - b).abs() * m) as f64;
                    let d = (*a - *b) as f64;
                    rkl_sum += (d.exp() - d - 1.0) * *m as f64;
                }
            }
        }
        let (mut ent_sum, mut clip_sum, mut kl_sum, mut tis_sum) = (0f64, 0f64, 0f64, 0f64);
        for (lo, slice, lr) in optimizer_slices(batch, lrs) {
            // Global denominators so accumulated micro-batch gradients equal the full batch's.
            let g_tokens = trained_tokens(slice).max(1.0);
            let g_seqs = slice.len() as f64;
            self.zero_grad();
            let mut loss_acc = 0f64;
            for (ci, chunk) in slice.chunks(micro).enumerate() {
                let base = lo + ci * micro;
                let t_fwd = Instant::now();
                let pr: Vec<&[TokenId]> = chunk.iter().map(|t| t.prompt.as_slice()).collect();
                let rs: Vec<&[TokenId]> = chunk.iter().map(|t| t.response.as_slice()).collect();
                let ms: Vec<&[f32]> = chunk.iter().map(|t| t.loss_mask.as_slice()).collect();
                let pk = pack_for(&self.policy, &pr, &rs, Some(&ms));
                let rollv: Vec<&[f32]> = chunk.iter().map(|t| t.rollout_logprobs.as_slice()).collect();
                let roll_t = pk.align(&rollv);
                let adv_t = match &token_adv {
                    Some(adv) => pk.align(&(0..chunk.len()).map(|i| adv[base + i].as_slice()).collect::<Vec<_>>()),
                    None => {
                        let adv: Vec<f32> = chunk.iter().map(|t| t.advantage).collect();
                        crate::device::from_slice(&adv).view([chunk.len() as i64, 1])
                    }
                };
                self.set_training(true);
                let recorded = moe.as_ref().and_then(|_| recorded_routes(chunk, &pk));
                let mut route = moe.as_ref().map(|m| {
                    let replay = match m.replayed {
                        true => recorded
                            .as_ref()
                            .map(|(i, m)| (i.iter().map(Tensor::shallow_clone).collect(), m.shallow_clone())),
                        false => None,
                    };
                    Route::for_batch(replay, &pk.valid, true)
                });
                let (lp, logp_all) = token_logprobs(&self.policy, &pk, temperature, route.as_mut());
                self.set_training(false);
                let (aux, flipped) = match (moe.as_mut(), route.as_ref()) {
                    (Some(m), Some(r)) => m.add(r, recorded.as_ref(), &pk),
                    _ => (None, None),
                };
                let old_t = match &old {
                    Some(old) => {
                        let oldv: Vec<&[f32]> = (0..chunk.len()).map(|i| old[base + i].as_slice()).collect();
                        pk.align(&oldv)
                    }
                    None => {
                        let old_t = lp.detach();
                        let _g = tch::no_grad_guard();
                        let diff = (&old_t - &roll_t).abs() * &pk.mask;
                        diff_sum += diff.sum(Kind::Double).double_value(&[]);
                        rkl_sum += (kl_k3(&roll_t, &old_t) * &pk.mask).sum(Kind::Double).double_value(&[]);
                        if let (Some(m), Some(f)) = (moe.as_mut(), &flipped) {
                            // Column c predicts token c + 1 from the hidden state at token c.
                            let at = f.narrow(1, 0, pk.width).to_kind(Kind::Float) * &pk.mask;
                            m.flip_diff += (&diff * &at).sum(Kind::Double).double_value(&[]);
                            m.flip_tokens += at.sum(Kind::Double).double_value(&[]);
                        }
                        old_t
                    }
                };
                // PPO's `rollout_logprobs`: the behaviour policy is the sampler's.
                let old_t =
                    if ppo.as_ref().is_some_and(|p| p.rollout_logprobs) { roll_t.shallow_clone() } else { old_t };
                let terms =
                    pg_terms(&lp, &old_t, &roll_t, &adv_t, self.spec.clip_low, self.spec.clip_high, self.spec.tis_cap);
                // The entropy is a statistic unless it is in the loss: then no gradient graph.
                let entropy = if self.spec.entropy_coef != 0.0 {
                    -(logp_all.exp() * &logp_all).sum_dim_intlist(-1, false, Kind::Float)
                } else {
                    let _g = tch::no_grad_guard();
                    let la = logp_all.detach();
                    -(la.exp() * &la).sum_dim_intlist(-1, false, Kind::Float)
                };
                let mut tok_loss = terms.pg.shallow_clone();
                if let Some(refs) = &reference {
                    let rv: Vec<&[f32]> = (0..chunk.len()).map(|i| refs[base + i].as_slice()).collect();
                    let kl = kl_k3(&lp, &pk.align(&rv));
                    kl_sum += (&kl * &pk.mask).sum(Kind::Double).double_value(&[]);
                    tok_loss = tok_loss + kl * self.spec.kl_coef;
                }
                if self.spec.entropy_coef != 0.0 {
                    tok_loss = tok_loss - &entropy * self.spec.entropy_coef;
                }
                let masked = tok_loss * &pk.mask;
                let loss = match self.spec.aggregation {
                    Aggregation::Token => masked.sum(Kind::Float) / g_tokens,
                    Aggregation::Sequence => {
                        let per = masked.sum_dim_intlist(-1, false, Kind::Float)
                            / pk.mask.sum_dim_intlist(-1, false, Kind::Float).clamp_min(1.0);
                        per.sum(Kind::Float) / g_seqs
                    }
                };
                // The load-balancing loss, weighted so the micro-batches' terms add up to the slice's.
                let loss = match (aux, self.policy.cfg.moe.as_ref()) {
                    (Some(a), Some(c)) if c.aux_loss_coef > 0.0 => {
                        loss + a * (c.aux_loss_coef * chunk.len() as f64 / slice.len() as f64)
                    }
                    _ => loss,
                };
                let lv = loss.double_value(&[]);
                if !lv.is_finite() {
                    self.zero_grad();
                    return Err(RunError::new(E_NONFINITE, "loss is NaN/infinite; weights were not updated"));
                }
                loss_acc += lv;
                st.forward_s += t_fwd.elapsed().as_secs_f64();
                let t_bwd = Instant::now();
                loss.backward();
                st.backward_s += t_bwd.elapsed().as_secs_f64();
                let t_stats = Instant::now();
                let _g = tch::no_grad_guard();
                ent_sum += (&entropy * &pk.mask).sum(Kind::Double).double_value(&[]);
                clip_sum += (&terms.clipped * &pk.mask).sum(Kind::Double).double_value(&[]);
                tis_sum += (&terms.tis * &pk.mask).sum(Kind::Double).double_value(&[]);
                // The statistics are forward-side work (reductions of forward tensors).
                st.forward_s += t_stats.elapsed().as_secs_f64();
            }
            let t_opt = Instant::now();
            let norm = self.optimizer_step(lr)?;
            st.optimizer_s += t_opt.elapsed().as_secs_f64();
            st.loss += loss_acc;
            st.grad_norm += norm;
            st.optimizer_steps += 1;
        }
        if let (Some(p), Some(tg)) = (&ppo, &targets) {
            let mut critic = self.critic.take();
            let res = critic.as_mut().map(|c| train_critic(c, &self.spec, p, batch, lrs, tg, micro));
            self.critic = critic;
            st.critic = res.transpose()?;
        }
        st.logp_diff = diff_sum / tok_total.max(1.0);
        st.rollout_kl = rkl_sum / tok_total.max(1.0);
        let k = st.optimizer_steps.max(1) as f64;
        st.loss /= k;
        st.grad_norm /= k;
        let n = tok_total.max(1.0);
        st.entropy = ent_sum / n;
        st.clip_frac = clip_sum / n;
        st.kl = kl_sum / n;
        st.tis_weight = tis_sum / n;
        st.tokens = tok_total as u64;
        st.moe = moe.map(MoeAcc::finish);
        Ok(st)
    }

    pub fn train_sft_impl(&mut self, batch: &[(Vec<TokenId>, Vec<TokenId>)], lr: f64) -> Result<SftStats, RunError> {
        let micro = self.spec.micro_batch.max(1);
        let total: f64 = batch.iter().map(|(_, a)| a.len() as f64).sum::<f64>().max(1.0);
        self.zero_grad();
        let mut loss_acc = 0f64;
        for chunk in batch.chunks(micro) {
            let pr: Vec<&[TokenId]> = chunk.iter().map(|(p, _)| p.as_slice()).collect();
            let rs: Vec<&[TokenId]> = chunk.iter().map(|(_, a)| a.as_slice()).collect();
            let pk = pack(&pr, &rs, None);
            self.set_training(true);
            let mut route = self.policy.cfg.moe.as_ref().map(|_| Route::for_batch(None, &pk.valid, true));
            let (lp, _) = token_logprobs(&self.policy, &pk, 1.0, route.as_mut());
            self.set_training(false);
            let loss = -(lp * &pk.mask).sum(Kind::Float) / total;
            let loss = match (route.and_then(|r| r.aux), self.policy.cfg.moe.as_ref()) {
                (Some(a), Some(c)) if c.aux_loss_coef > 0.0 => {
                    let layers = c.moe_layers(self.policy.cfg.n_layers).max(1) as f64;
                    loss + a * (c.aux_loss_coef * chunk.len() as f64 / (batch.len() as f64 * layers))
                }
                _ => loss,
            };
            let lv = loss.double_value(&[]);
            if !lv.is_finite() {
                self.zero_grad();
                return Err(RunError::new(E_NONFINITE, "SFT loss is NaN/infinite"));
            }
            loss_acc += lv;
            loss.backward();
        }
        let norm = self.optimizer_step(lr)?;
        Ok(SftStats { loss: loss_acc, grad_norm: norm, tokens: total as u64 })
    }

    pub fn logprobs_impl(
        &self,
        prompts: &[Vec<TokenId>],
        responses: &[Vec<TokenId>],
        temperature: f64,
    ) -> Result<Vec<Vec<f32>>, RunError> {
        let batch: Vec<Trajectory> =
            prompts.iter().zip(responses).map(|(p, r)| Trajectory::to_score(p.clone(), r.clone())).collect();
        Self::logprobs_of(&self.policy, &batch, self.spec.micro_batch.max(1), temperature, false)
    }

    pub fn reset_optimizer(&mut self) {
        self.fresh_optimizer();
    }

    pub fn freeze_reference(&mut self) {
        let r = self.policy.deep_copy();
        r.set_requires_grad(false);
        self.reference = Some(r);
    }

    pub fn version(&self) -> u64 {
        self.version
    }

    pub fn save(&self, dir: &Path) -> Result<(), RunError> {
        self.policy.save(dir)?;
        if !self.policy.adapters().is_empty() {
            let named: Vec<(String, Tensor)> =
                self.policy.adapters().iter().flat_map(|l| l.named()).map(|(n, t)| (n, t.detach())).collect();
            write_tensors(&named, &dir.join(ADAPTER_FILE))?;
        }
        write_tensors(&self.optimizer_tensors(), &dir.join("optimizer.safetensors"))?;
        if let Some(r) = &self.reference {
            write_tensors(r.params(), &dir.join("reference.safetensors"))?;
        }
        if let Some(c) = &self.critic {
            c.save(dir)?;
        }
        miles_runtime::exec::write_json(
            &dir.join("trainer.json"),
            &serde_json::json!({
                "version": self.version,
                "adam_t": self.adam[0].t,
                "adam_steps": self.adam.iter().map(|a| a.t).collect::<Vec<_>>(),
                "critic_adam_t": self.critic.as_ref().map(|c| c.adam.t),
            }),
        )
    }

    pub fn load(&mut self, dir: &Path) -> Result<(), RunError> {
        self.policy.load_tensors(&dir.join("model.safetensors"))?;
        self.base_stale.set(true);
        self.load_adapters(dir)?;
        let p = dir.join("optimizer.safetensors");
        let read = read_tensors(&p)?;
        self.fresh_optimizer();
        let mut named = self.optimizer_tensors();
        load_named(&mut named, read, &p)?;
        let rp = dir.join("reference.safetensors");
        if rp.exists() {
            let mut r = self.policy.deep_copy();
            // The reference is the policy RL started from: no adapters.
            r.set_adapters(Vec::new());
            r.load_tensors(&rp)?;
            r.set_requires_grad(false);
            self.reference = Some(r);
        }
        let tp = dir.join("trainer.json");
        let text = std::fs::read_to_string(&tp).map_err(|e| RunError::io(E_CHECKPOINT, "cannot read", &tp, e))?;
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| RunError::new(E_CHECKPOINT, format!("{}: {e}", tp.display())))?;
        self.version = v["version"].as_u64().unwrap_or(0);
        match v["adam_steps"].as_array() {
            Some(ts) => {
                for (a, t) in self.adam.iter_mut().zip(ts) {
                    a.t = t.as_u64().unwrap_or(0);
                }
            }
            None => self.adam[0].t = v["adam_t"].as_u64().unwrap_or(0),
        }
        self.critic = Critic::load(dir, &self.policy, v["critic_adam_t"].as_u64().unwrap_or(0))?;
        Ok(())
    }
}

impl TchTrainer {
    /// A checkpoint taken after LoRA began holds the adapters: they are attached (the base
    /// frozen) and loaded; one taken before holds none, and the trainer is back to full weights.
    fn load_adapters(&mut self, dir: &Path) -> Result<(), RunError> {
        let p = dir.join(ADAPTER_FILE);
        if !p.exists() {
            self.policy.set_adapters(Vec::new());
            self.policy.set_requires_grad(true);
            return Ok(());
        }
        if self.policy.lora_spec.is_none() {
            return Err(RunError::new(
                E_CHECKPOINT,
                format!("{} holds LoRA adapters, but the recipe's trainer has no `lora`", p.display()),
            )
            .with_help("add the `lora` the run was started with, or resume from a checkpoint of a full fine-tune"));
        }
        let tensors = named_tensors(read_tensors(&p)?)?;
        self.policy.set_adapters(Vec::new());
        self.begin_lora();
        // safetensors keeps names sorted; the adapters' own order is adapter by adapter, layer by
        // layer.
        let order: Vec<String> = self.policy.adapters().iter().flat_map(|l| l.named()).map(|(n, _)| n).collect();
        let mut by_name: std::collections::HashMap<String, NamedTensor> =
            tensors.into_iter().map(|t| (t.name.clone(), t)).collect();
        let mut ordered = Vec::with_capacity(order.len());
        for n in &order {
            match by_name.remove(n) {
                Some(t) => ordered.push(t),
                None => {
                    return Err(RunError::new(
                        E_CHECKPOINT,
                        format!(
                            "{}: missing adapter {n}: the checkpoint's LoRA differs from the recipe's",
                            p.display()
                        ),
                    ))
                }
            }
        }
        if let Some(extra) = by_name.keys().next() {
            return Err(RunError::new(
                E_CHECKPOINT,
                format!("{}: adapter {extra} is not in the recipe's LoRA (other rank or target_modules)", p.display()),
            ));
        }
        let snap = WeightSnapshot { version: 0, tensors: ordered };
        self.policy
            .load_snapshot(&snap)
            .map_err(|e| RunError::new(E_CHECKPOINT, format!("{}: {}", p.display(), e.message)))
    }
}

/// Per-token advantages when any term is per token: task_coef x the task's advantage (PPO's GAE
/// per token, else the response's group-relative one) + coef x (log pi_teacher - log pi_student)
/// of each sampled token (the student's from the sampler). None: GRPO's one per response.
fn token_advantages(
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

/// The batch's consecutive slices, one per optimizer step (`lrs`), with each slice's start: the
/// policy's and the critic's updates step through the same slices.
fn optimizer_slices<'b>(batch: &'b [Trajectory], lrs: &[f64]) -> Vec<(usize, &'b [Trajectory], f64)> {
    let per_opt = batch.len().div_ceil(lrs.len().max(1));
    lrs.iter()
        .enumerate()
        .filter_map(|(k, &lr)| {
            let (lo, hi) = (k * per_opt, ((k + 1) * per_opt).min(batch.len()));
            (lo < hi).then(|| (lo, &batch[lo..hi], lr))
        })
        .collect()
}

/// Tokens the loss covers (the loss masks' sum).
fn trained_tokens(batch: &[Trajectory]) -> f64 {
    batch.iter().map(|t| t.loss_mask.iter().map(|&m| m as f64).sum::<f64>()).sum()
}

/// PPO's targets for a batch: per response token, the advantage (GAE, whitened over the batch's
/// trained tokens), the return and the value the critic gave before any update.
struct CriticTargets {
    adv: Vec<Vec<f32>>,
    returns: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
}

fn critic_targets(c: &Critic, batch: &[Trajectory], micro: usize, p: &PpoSpec) -> Result<CriticTargets, RunError> {
    let _g = tch::no_grad_guard();
    let mut values = Vec::with_capacity(batch.len());
    for chunk in batch.chunks(micro.max(1)) {
        let pr: Vec<&[TokenId]> = chunk.iter().map(|t| t.prompt.as_slice()).collect();
        let rs: Vec<&[TokenId]> = chunk.iter().map(|t| t.response.as_slice()).collect();
        let pk = pack(&pr, &rs, None);
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
/// policy's (slices of the batch), each step at `critic_lr` on the policy's LR schedule.
#[allow(clippy::too_many_arguments)]
fn train_critic(
    c: &mut Critic,
    spec: &TrainSpec,
    p: &PpoSpec,
    batch: &[Trajectory],
    lrs: &[f64],
    tg: &CriticTargets,
    micro: usize,
) -> Result<CriticStats, RunError> {
    let mut cs = CriticStats::default();
    // Statistics of the values before the update, over trained tokens.
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
    cs.value_mean = vsum / n1;
    cs.return_mean = rsum / n1;
    let var_r = rsq / n1 - (rsum / n1).powi(2);
    let var_e = esq / n1 - (esum / n1).powi(2);
    cs.explained_variance = if var_r > 1e-12 { 1.0 - var_e / var_r } else { 0.0 };
    let (mut clip_sum, mut steps) = (0f64, 0u64);
    for (lo, slice, lr) in optimizer_slices(batch, lrs) {
        let g_tokens = trained_tokens(slice).max(1.0);
        c.zero_grad();
        let mut loss_acc = 0f64;
        for (ci, chunk) in slice.chunks(micro.max(1)).enumerate() {
            let base = lo + ci * micro.max(1);
            let pr: Vec<&[TokenId]> = chunk.iter().map(|t| t.prompt.as_slice()).collect();
            let rs: Vec<&[TokenId]> = chunk.iter().map(|t| t.response.as_slice()).collect();
            let ms: Vec<&[f32]> = chunk.iter().map(|t| t.loss_mask.as_slice()).collect();
            let pk = pack(&pr, &rs, Some(&ms));
            let rows = |x: &[Vec<f32>]| -> Vec<Vec<f32>> { (0..chunk.len()).map(|i| x[base + i].clone()).collect() };
            let (old_rows, ret_rows) = (rows(&tg.values), rows(&tg.returns));
            let v_old = pk.align(&old_rows.iter().map(Vec::as_slice).collect::<Vec<_>>());
            let ret = pk.align(&ret_rows.iter().map(Vec::as_slice).collect::<Vec<_>>());
            let v = c.values(&pk.tokens, &pk.positions, &pk.valid).narrow(1, 0, pk.width);
            let (vl, clipped) = value_loss(&v, &v_old, &ret, p.value_clip);
            let loss = (vl * &pk.mask).sum(Kind::Float) / g_tokens;
            let lv = loss.double_value(&[]);
            if !lv.is_finite() {
                c.zero_grad();
                return Err(RunError::new(
                    E_NONFINITE,
                    "critic value loss is NaN/infinite; the critic was not updated",
                ));
            }
            loss_acc += lv;
            loss.backward();
            clip_sum += (clipped * &pk.mask).sum(Kind::Double).double_value(&[]);
        }
        let ratio = if spec.lr > 0.0 { lr / spec.lr } else { 1.0 };
        cs.grad_norm += adam_step(&c.params(), &mut c.adam, spec, p.critic_lr * ratio)?;
        cs.value_loss += loss_acc;
        steps += 1;
    }
    let k = steps.max(1) as f64;
    cs.value_loss /= k;
    cs.grad_norm /= k;
    cs.clip_frac = clip_sum / n1;
    Ok(cs)
}

/// Global-norm clip (`spec.grad_clip`) then one AdamW step of `params` with `adam`'s moments.
/// Returns the pre-clip norm; a non-finite norm leaves the weights untouched and is an error. The
/// policy's and PPO's critic's optimizers are both this one.
pub(crate) fn adam_step(
    params: &[(String, Tensor)],
    adam: &mut AdamState,
    spec: &TrainSpec,
    lr: f64,
) -> Result<f64, RunError> {
    let _g = tch::no_grad_guard();
    let grads: Vec<Tensor> = params
        .iter()
        .map(|(_, p)| {
            let g = p.grad();
            if g.defined() {
                g
            } else {
                p.zeros_like()
            }
        })
        .collect();
    let sq: f64 = grads.iter().map(|g| g.square().sum(Kind::Double).double_value(&[])).sum();
    let norm = sq.sqrt();
    if !norm.is_finite() {
        return Err(RunError::new(E_NONFINITE, "gradient norm is NaN/infinite; weights were not updated"));
    }
    let clip = spec.grad_clip;
    let scale = if clip > 0.0 && norm > clip { clip / (norm + 1e-6) } else { 1.0 };
    let (b1, b2, eps, wd) = (spec.beta1, spec.beta2, spec.eps, spec.weight_decay);
    adam.t += 1;
    let t = adam.t as i32;
    let bc1 = 1.0 - b1.powi(t);
    let bc2 = 1.0 - b2.powi(t);
    for (i, ((_, p), g)) in params.iter().zip(grads.iter()).enumerate() {
        let g = if scale != 1.0 { g * scale } else { g.shallow_clone() };
        let m = &mut adam.m[i];
        let _ = m.g_mul_scalar_(b1);
        let _ = m.g_add_(&(&g * (1.0 - b1)));
        let v = &mut adam.v[i];
        let _ = v.g_mul_scalar_(b2);
        let _ = v.g_add_(&(g.square() * (1.0 - b2)));
        let mut p = p.shallow_clone();
        // Decoupled weight decay, on matrices only (norm gains stay at their scale).
        if wd > 0.0 && p.dim() >= 2 {
            let _ = p.g_mul_scalar_(1.0 - lr * wd);
        }
        let denom = (&*v / bc2).sqrt() + eps;
        let upd = &*m / denom * (lr / bc1);
        let _ = p.g_sub_(&upd);
    }
    Ok(norm)
}

impl AdamState {
    pub(crate) fn zeros(params: &[(String, Tensor)]) -> AdamState {
        let z = || -> Vec<Tensor> { params.iter().map(|(_, p)| p.detach().zeros_like()).collect() };
        AdamState { m: z(), v: z(), t: 0 }
    }
}

/// One RL call's MoE statistics as its micro-batches add to them.
struct MoeAcc {
    replayed: bool,
    layers: usize,
    experts: usize,
    aux_sum: f64,
    passes: usize,
    load: Vec<Vec<f64>>,
    flips: Vec<(f64, f64)>,
    disagreements: Vec<(f64, f64)>,
    flip_diff: f64,
    flip_tokens: f64,
    r3_bytes: u64,
    r3_tokens: u64,
    dropped: u64,
}

impl MoeAcc {
    fn new(policy: &Policy, replay: bool) -> Option<MoeAcc> {
        let m = policy.cfg.moe.as_ref()?;
        let layers = m.moe_layers(policy.cfg.n_layers);
        Some(MoeAcc {
            replayed: replay,
            layers,
            experts: m.experts,
            aux_sum: 0.0,
            passes: 0,
            load: Vec::new(),
            flips: vec![(0.0, 0.0); layers],
            disagreements: vec![(0.0, 0.0); layers],
            flip_diff: 0.0,
            flip_tokens: 0.0,
            r3_bytes: 0,
            r3_tokens: 0,
            dropped: 0,
        })
    }

    /// The batch without trajectories whose routing cannot be replayed on this model (each named
    /// on stderr with its reason); None when every one fits.
    fn drop_unfit(&mut self, batch: &[Trajectory], policy: &Policy) -> Option<Vec<Trajectory>> {
        let m = policy.cfg.moe.as_ref()?;
        let unfit = |t: &Trajectory| {
            t.routing
                .as_ref()
                .and_then(|r| r.mismatch(t.prompt.len() + t.response.len(), self.layers, m.top_k, m.experts))
        };
        let reasons: Vec<Option<String>> = batch.iter().map(unfit).collect();
        for t in batch {
            if let Some(r) = &t.routing {
                self.r3_bytes += r.bytes() as u64;
            }
        }
        if reasons.iter().all(Option::is_none) {
            return None;
        }
        let mut kept = Vec::new();
        for (i, (t, why)) in batch.iter().zip(&reasons).enumerate() {
            match why {
                Some(w) => {
                    self.dropped += 1;
                    // The first few, then the count (`r3/dropped`): one bad engine must not flood.
                    if self.dropped <= 3 {
                        eprintln!("miles: R3: trajectory {i} of group {} dropped from training: {w}", t.group);
                    }
                }
                None => kept.push(t.clone()),
            }
        }
        Some(kept)
    }

    /// Adds one training pass's routing. Returns its load-balancing loss (mean over MoE layers)
    /// and the [B, L] mask of recorded tokens the trainer's router disagrees on.
    fn add(
        &mut self,
        r: &Route,
        recorded: Option<&(Vec<Tensor>, Tensor)>,
        pk: &Packed,
    ) -> (Option<Tensor>, Option<Tensor>) {
        self.passes += 1;
        let _g = tch::no_grad_guard();
        self.load.push(r.load.iter().map(|l| l.max().double_value(&[]) * self.experts as f64).collect());
        let mut flipped = None;
        if let Some((ids, mask)) = recorded {
            let m = mask.logical_and(&pk.valid);
            self.r3_tokens += m.sum(Kind::Int64).int64_value(&[]) as u64;
            add_counts(&mut self.flips, flips(&r.used, ids, &m).0);
            let (own, any) = flips(&r.own, ids, &m);
            add_counts(&mut self.disagreements, own);
            flipped = Some(any);
        }
        let layers = self.layers.max(1) as f64;
        let aux = r.aux.as_ref().map(|a| {
            self.aux_sum += a.double_value(&[]) / layers;
            a / layers
        });
        (aux, flipped)
    }

    fn finish(self) -> MoeStats {
        let n = self.passes.max(1) as f64;
        let load_max = (0..self.layers)
            .map(|l| self.load.iter().map(|p| p.get(l).copied().unwrap_or(0.0)).sum::<f64>() / n)
            .collect();
        let recorded = self.r3_tokens > 0;
        MoeStats {
            aux_loss: self.aux_sum / n,
            load_max,
            route_mismatch: if recorded { rates(&self.flips) } else { Vec::new() },
            router_disagreement: if recorded { rates(&self.disagreements) } else { Vec::new() },
            flip_logp_diff: self.flip_diff / self.flip_tokens.max(1.0),
            flip_tokens: self.flip_tokens as u64,
            replayed: self.replayed && recorded,
            r3_bytes: self.r3_bytes,
            r3_tokens: self.r3_tokens,
            r3_dropped: self.dropped,
        }
    }
}

fn add_counts(acc: &mut [(f64, f64)], per: Vec<(f64, f64)>) {
    for (a, (num, den)) in acc.iter_mut().zip(per) {
        a.0 += num;
        a.1 += den;
    }
}

fn rates(counts: &[(f64, f64)]) -> Vec<f64> {
    counts.iter().map(|(a, b)| a / b.max(1.0)).collect()
}
