//! The optimizer: AdamW with our own (checkpointable) moments, one `adam_step` for the policy,
//! PPO's critic and the diffusion denoiser; what it updates (the whole model, or the adapters under
//! LoRA, each with its own state) and the plan of optimizer steps: passes over the batch (`epochs`),
//! each a seeded shuffle cut into mini-batches.

use super::dp::DataParallel;
use super::TchTrainer;
use miles_runtime::rng::Rng;
use miles_runtime::{RunError, TrainSpec, Trajectory, E_BACKEND, E_NONFINITE};
use std::borrow::Cow;
use tch::{Kind, Tensor};

pub(crate) struct AdamState {
    pub(crate) m: Vec<Tensor>,
    pub(crate) v: Vec<Tensor>,
    pub(crate) t: u64,
}

impl AdamState {
    pub(crate) fn zeros(params: &[(String, Tensor)]) -> AdamState {
        let z = || -> Vec<Tensor> { params.iter().map(|(_, p)| p.detach().zeros_like()).collect() };
        AdamState { m: z(), v: z(), t: 0 }
    }
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
    let grads = grads_of(params);
    adam_step_with(params, &grads, adam, spec, lr)
}

/// The gradient of each of `params`, zeros where none was accumulated.
pub(crate) fn grads_of(params: &[(String, Tensor)]) -> Vec<Tensor> {
    params
        .iter()
        .map(|(_, p)| {
            let g = p.grad();
            if g.defined() {
                g
            } else {
                p.zeros_like()
            }
        })
        .collect()
}

/// `adam_step` with the gradients given (a data-parallel group's sums). A parameter whose moments
/// are undefined belongs to another rank's ZeRO-1 shard: it counts in the norm, and its owner
/// updates it.
pub(crate) fn adam_step_with(
    params: &[(String, Tensor)],
    grads: &[Tensor],
    adam: &mut AdamState,
    spec: &TrainSpec,
    lr: f64,
) -> Result<f64, RunError> {
    let _g = tch::no_grad_guard();
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
        if !adam.m[i].defined() {
            continue;
        }
        adamw_update(p, g, &mut adam.m[i], &mut adam.v[i], Coefficients { scale, lr, b1, b2, eps, wd, bc1, bc2 });
    }
    Ok(norm)
}

/// One AdamW step's scalars: the clip's scale, the rate, the moments' decays, epsilon, the
/// decoupled weight decay and the bias corrections.
#[derive(Clone, Copy)]
struct Coefficients {
    scale: f64,
    lr: f64,
    b1: f64,
    b2: f64,
    eps: f64,
    wd: f64,
    bc1: f64,
    bc2: f64,
}

/// One tensor's AdamW update, in place and with one scratch tensor (two under clipping): m and v
/// by `lerp_` (m + (1 - b1)(g - m) is b1 m + (1 - b1) g), the denominator built in the scratch
/// from sqrt(v) with the bias corrections and the step size folded into it, the weights moved by
/// one `addcdiv_`. The per-op form it replaced allocated ~10 temporaries per tensor and read the
/// tensor's bytes ~20 times (bench/RESULTS.md "AdamW in place").
fn adamw_update(p: &Tensor, g: &Tensor, m: &mut Tensor, v: &mut Tensor, c: Coefficients) {
    let g = if c.scale != 1.0 { g * c.scale } else { g.shallow_clone() };
    let _ = m.lerp_(&g, 1.0 - c.b1);
    let mut scratch = g.square();
    let _ = v.lerp_(&scratch, 1.0 - c.b2);
    if c.lr == 0.0 {
        // No step (a schedule at 0): the moments moved, the weights do not (and the folded
        // denominator below would be 0 x inf).
        return;
    }
    // scratch = -(sqrt(v / bc2) + eps) * bc1 / lr, so that p += m / scratch is the Adam step.
    let _ = v.sqrt_out(&scratch);
    let k = -c.bc1 / c.lr;
    let _ = scratch.g_mul_scalar_(k / c.bc2.sqrt());
    let _ = scratch.g_add_scalar_(c.eps * k);
    let mut p = p.shallow_clone();
    // Decoupled weight decay, on matrices only (norm gains stay at their scale).
    if c.wd > 0.0 && p.dim() >= 2 {
        let _ = p.g_mul_scalar_(1.0 - c.lr * c.wd);
    }
    let _ = p.addcdiv_(m, &scratch);
}

/// `adam_step` after this rank's micro-batches ended with `local`: alone, as it always was; in a
/// data-parallel group, over the gradients summed across the ranks (a failure on any rank fails
/// the step on all before any weight changes), and under ZeRO-1 each rank updates the parameters
/// it owns and sends them to the others. The policy's and the critic's steps are both this one.
pub(super) fn group_adam_step(
    dp: Option<&DataParallel>,
    params: &[(String, Tensor)],
    adam: &mut AdamState,
    spec: &TrainSpec,
    lr: f64,
    local: Result<(), RunError>,
) -> Result<f64, RunError> {
    let Some(dp) = dp else {
        local?;
        return adam_step(params, adam, spec, lr);
    };
    let grads = dp.reduce_grads(params, local)?;
    let norm = adam_step_with(params, &grads, adam, spec, lr)?;
    if dp.zero {
        dp.broadcast_owned(params)?;
    }
    Ok(norm)
}

/// One optimizer step of an RL call: the pass over the batch it belongs to, the batch rows it
/// trains (in the pass's order) and its learning rate.
pub(super) struct OptStep {
    pub epoch: usize,
    pub rows: Vec<usize>,
    pub lr: f64,
}

/// The order of the batch's `n` rows in each of `epochs` passes: the batch's own order for one pass
/// (a single pass trains as it always did), else a shuffle per pass seeded by `seed` and the pass.
pub fn epoch_orders(n: usize, epochs: usize, seed: u64) -> Vec<Vec<usize>> {
    (0..epochs.max(1))
        .map(|e| {
            let mut order: Vec<usize> = (0..n).collect();
            if epochs > 1 {
                Rng::derived(seed, "epoch_shuffle", e as u64).shuffle(&mut order);
            }
            order
        })
        .collect()
}

/// The RL call's optimizer steps, one per learning rate: `epochs` passes over the batch (each in
/// its `epoch_orders` order), each cut into `lrs.len() / epochs` consecutive mini-batches. The
/// policy's and the critic's updates step through the same plan.
pub(super) fn optimizer_plan(n: usize, lrs: &[f64], epochs: usize, seed: u64) -> Result<Vec<OptStep>, RunError> {
    let epochs = epochs.max(1);
    if lrs.len() % epochs != 0 {
        return Err(RunError::new(
            E_BACKEND,
            format!("{} learning rates for {epochs} passes over the batch: need a multiple of the passes", lrs.len()),
        ));
    }
    let per_epoch = lrs.len() / epochs;
    let per_opt = n.div_ceil(per_epoch.max(1));
    let mut steps = Vec::with_capacity(lrs.len());
    for (e, order) in epoch_orders(n, epochs, seed).into_iter().enumerate() {
        for (k, &lr) in lrs[e * per_epoch..(e + 1) * per_epoch].iter().enumerate() {
            let (lo, hi) = (k * per_opt, ((k + 1) * per_opt).min(n));
            if lo < hi {
                steps.push(OptStep { epoch: e, rows: order[lo..hi].to_vec(), lr });
            }
        }
    }
    Ok(steps)
}

/// The trajectories of `rows`: borrowed when they are a run of the batch, else copied in order.
pub(super) fn rows_of<'b>(batch: &'b [Trajectory], rows: &[usize]) -> Cow<'b, [Trajectory]> {
    match rows.first() {
        Some(&lo) if rows.iter().enumerate().all(|(k, &r)| r == lo + k) => Cow::Borrowed(&batch[lo..lo + rows.len()]),
        Some(_) => Cow::Owned(rows.iter().map(|&r| batch[r].clone()).collect()),
        None => Cow::Borrowed(&[]),
    }
}

impl TchTrainer {
    /// What the optimizer updates: the active adapter once LoRA is attached, else every parameter.
    pub(super) fn trainable(&self) -> Vec<(String, Tensor)> {
        match self.policy.lora() {
            Some(l) => l.named(),
            None => self.policy.params().iter().map(|(n, t)| (n.clone(), t.shallow_clone())).collect(),
        }
    }

    /// The tensors each optimizer state (`self.adam[i]`) steps: the model's, or each adapter's.
    pub(super) fn optimizer_sets(&self) -> Vec<Vec<(String, Tensor)>> {
        match self.policy.adapters() {
            [] => vec![self.trainable()],
            ads => ads.iter().map(|a| a.named()).collect(),
        }
    }

    /// Every optimizer state's tensors with its names, in checkpoint order (`states`: one per
    /// optimizer set, `self.adam` or its gathered copy under ZeRO-1).
    pub(super) fn optimizer_tensors_of(&self, states: &[AdamState]) -> Vec<(String, Tensor)> {
        let mut named = Vec::new();
        for (set, adam) in self.optimizer_sets().iter().zip(states) {
            for (i, (n, _)) in set.iter().enumerate() {
                named.push((format!("exp_avg.{n}"), adam.m[i].shallow_clone()));
                named.push((format!("exp_avg_sq.{n}"), adam.v[i].shallow_clone()));
            }
        }
        named
    }

    /// Fresh optimizer state for what trains (every adapter's under LoRA); this rank's shard of it
    /// under ZeRO-1.
    pub(super) fn fresh_optimizer(&mut self) {
        let shard = self.zero_shard();
        self.adam = self.optimizer_sets().iter().map(|s| AdamState::zeros_shard(s, shard)).collect();
    }

    /// Fresh optimizer state for what trains, whole on every rank (a checkpoint loads into it).
    pub(super) fn fresh_full_optimizer(&mut self) {
        self.adam = self.optimizer_sets().iter().map(|s| AdamState::zeros(s)).collect();
    }

    pub(super) fn zero_grad(&mut self) {
        for (_, p) in self.trainable() {
            let mut g = p.grad();
            if g.defined() {
                let _ = g.zero_();
            }
        }
    }

    /// A micro-batch loss's value, which must be finite: else the accumulated gradients are
    /// dropped and `message` is the error (the weights stay as they were).
    pub(super) fn finite_loss(&mut self, loss: &Tensor, message: &'static str) -> Result<f64, RunError> {
        let lv = loss.double_value(&[]);
        if !lv.is_finite() {
            self.zero_grad();
            return Err(RunError::new(E_NONFINITE, message));
        }
        Ok(lv)
    }

    /// Global-norm clip then one AdamW step of what trains, after this rank's micro-batches ended
    /// with `local` (`group_adam_step`). Returns the pre-clip norm; a non-finite norm leaves the
    /// weights untouched and is an error.
    pub(super) fn optimizer_step(&mut self, lr: f64, local: Result<(), RunError>) -> Result<f64, RunError> {
        let params = self.trainable();
        let adam = &mut self.adam[self.policy.lora().map_or(0, |_| self.policy.active_adapter())];
        let norm = group_adam_step(self.dp.as_ref(), &params, adam, &self.spec, lr, local)?;
        self.version += 1;
        Ok(norm)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The per-op form `adamw_update` replaced, as it was: the reference it must agree with.
    fn reference(p: &Tensor, g: &Tensor, m: &mut Tensor, v: &mut Tensor, c: Coefficients) {
        let g = if c.scale != 1.0 { g * c.scale } else { g.shallow_clone() };
        let _ = m.g_mul_scalar_(c.b1);
        let _ = m.g_add_(&(&g * (1.0 - c.b1)));
        let _ = v.g_mul_scalar_(c.b2);
        let _ = v.g_add_(&(g.square() * (1.0 - c.b2)));
        let mut p = p.shallow_clone();
        if c.wd > 0.0 && p.dim() >= 2 {
            let _ = p.g_mul_scalar_(1.0 - c.lr * c.wd);
        }
        let denom = (&*v / c.bc2).sqrt() + c.eps;
        let _ = p.g_sub_(&(&*m / denom * (c.lr / c.bc1)));
    }

    fn rel(a: &Tensor, b: &Tensor) -> f64 {
        (a - b).norm().double_value(&[]) / b.norm().double_value(&[]).max(1e-30)
    }

    /// Six steps with clipping, weight decay, a step at lr 0 and a vector (no decay): weights and
    /// moments within 1e-6 of the per-op form (float order only).
    #[test]
    fn in_place_adamw_matches_the_per_op_form() {
        let _g = tch::no_grad_guard();
        tch::manual_seed(7);
        for shape in [&[64i64, 48][..], &[48][..]] {
            let p0 = Tensor::randn(shape, (Kind::Float, tch::Device::Cpu));
            let (pa, pb) = (p0.copy(), p0.copy());
            let (mut ma, mut va) = (p0.zeros_like(), p0.zeros_like());
            let (mut mb, mut vb) = (p0.zeros_like(), p0.zeros_like());
            for (t, (scale, lr)) in
                [(1.0, 1e-3), (0.5, 1e-3), (1.0, 0.0), (0.25, 3e-4), (1.0, 1e-2), (1.0, 1e-3)].into_iter().enumerate()
            {
                let g = Tensor::randn(shape, (Kind::Float, tch::Device::Cpu)) * 0.1;
                let t = t as i32 + 1;
                let (b1, b2): (f64, f64) = (0.9, 0.999);
                let c = Coefficients {
                    scale,
                    lr,
                    b1,
                    b2,
                    eps: 1e-8,
                    wd: 0.1,
                    bc1: 1.0 - b1.powi(t),
                    bc2: 1.0 - b2.powi(t),
                };
                adamw_update(&pa, &g, &mut ma, &mut va, c);
                reference(&pb, &g, &mut mb, &mut vb, c);
            }
            for (what, a, b) in [("weights", &pa, &pb), ("m", &ma, &mb), ("v", &va, &vb)] {
                let e = rel(a, b);
                assert!(e < 1e-6, "{what} {shape:?}: {e:.3e}");
            }
            assert!(rel(&pa, &p0) > 1e-4, "the weights moved");
            assert_eq!(pa.isfinite().all().int64_value(&[]), 1);
        }
    }
}
