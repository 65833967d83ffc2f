//! The optimizer: AdamW with our own (checkpointable) moments, one `adam_step` for the policy,
//! PPO's critic and the diffusion denoiser; what it updates (the whole model, or the adapters under
//! LoRA, each with its own state) and the batch's slices, one per optimizer step.

use super::TchTrainer;
use miles_runtime::{RunError, TrainSpec, Trajectory, E_NONFINITE};
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

/// The batch's consecutive slices, one per optimizer step (`lrs`), with each slice's start: the
/// policy's and the critic's updates step through the same slices.
pub(super) fn optimizer_slices<'b>(batch: &'b [Trajectory], lrs: &[f64]) -> Vec<(usize, &'b [Trajectory], f64)> {
    let per_opt = batch.len().div_ceil(lrs.len().max(1));
    lrs.iter()
        .enumerate()
        .filter_map(|(k, &lr)| {
            let (lo, hi) = (k * per_opt, ((k + 1) * per_opt).min(batch.len()));
            (lo < hi).then(|| (lo, &batch[lo..hi], lr))
        })
        .collect()
}

impl TchTrainer {
    /// What the optimizer updates: the active adapter once LoRA is attached, else every parameter.
    pub(super) fn trainable(&self) -> Vec<(String, Tensor)> {
        match self.policy.lora() {
            Some(l) => l.named(),
            None => self.policy.params().iter().map(|(n, t)| (n.clone(), t.shallow_clone())).collect(),
        }
    }

    /// Every optimizer state's tensors with its names, in checkpoint order.
    pub(super) fn optimizer_tensors(&self) -> Vec<(String, Tensor)> {
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
    pub(super) fn fresh_optimizer(&mut self) {
        self.adam = match self.policy.adapters() {
            [] => vec![AdamState::zeros(self.policy.params())],
            ads => ads.iter().map(|a| AdamState::zeros(&a.named())).collect(),
        };
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

    /// Global-norm clip then one AdamW step. Returns the pre-clip norm; a non-finite norm leaves
    /// the weights untouched and is an error.
    pub(super) fn optimizer_step(&mut self, lr: f64) -> Result<f64, RunError> {
        let params = self.trainable();
        let adam = &mut self.adam[self.policy.lora().map_or(0, |_| self.policy.active_adapter())];
        let norm = adam_step(&params, adam, &self.spec, lr)?;
        self.version += 1;
        Ok(norm)
    }
}
