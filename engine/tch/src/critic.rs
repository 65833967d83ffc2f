//! PPO's learned critic (Schulman et al. 2017, "Proximal Policy Optimization Algorithms"; GAE:
//! Schulman et al. 2016, "High-Dimensional Continuous Control Using Generalized Advantage
//! Estimation"). The critic is a model of its own: a copy of the policy's transformer taken when
//! RL begins (after any SFT warm-up), whose LM head is replaced by a value head (d_model -> 1,
//! zero-initialised, so every value starts at 0), trained by its own AdamW at `critic_lr`. A
//! separate model rather than a value head on the policy's trunk keeps the value loss out of the
//! policy's gradient (no coefficient to tune between them) and the policy's weights, and so its
//! weight updates, exactly as GRPO's.
//!
//! Values are read per response token: V_j is the value of the prefix before response token j,
//! the hidden state at the position that predicts it. The task reward arrives at the last token;
//! GAE gives each token's advantage from the values (`gae`).

use crate::model::{load_named, read_tensors, write_tensors, Policy};
use crate::train::AdamState;
use miles_runtime::RunError;
use std::path::Path;
use tch::{Kind, Tensor};

pub struct Critic {
    pub model: Policy,
    head: Tensor,
    head_bias: Tensor,
    pub(crate) adam: AdamState,
}

/// The critic's checkpoint files.
const WEIGHTS: &str = "critic.safetensors";
const OPTIMIZER: &str = "critic_optimizer.safetensors";

impl Critic {
    /// A critic whose trunk is a copy of `policy` (adapters dropped) and whose values start at 0.
    pub fn from_policy(policy: &Policy) -> Critic {
        Critic::from_policy_sharded(policy, None)
    }

    /// `from_policy` with its Adam moments allocated for this rank's ZeRO-1 shard (`shard` =
    /// (rank, world)) only, so the whole state never passes through the rank's memory.
    pub(crate) fn from_policy_sharded(policy: &Policy, shard: Option<(usize, usize)>) -> Critic {
        let mut model = policy.deep_copy();
        model.set_adapters(Vec::new());
        model.set_requires_grad(true);
        let d = model.cfg.d_model as i64;
        let head = Tensor::zeros([1, d], (Kind::Float, crate::device::current())).set_requires_grad(true);
        let head_bias = Tensor::zeros([1], (Kind::Float, crate::device::current())).set_requires_grad(true);
        let mut c = Critic { model, head, head_bias, adam: AdamState::zeros(&[]) };
        c.adam = AdamState::zeros_shard(&c.params(), shard);
        c
    }

    /// Every trained tensor with its checkpoint name (shallow clones).
    pub fn params(&self) -> Vec<(String, Tensor)> {
        let mut v: Vec<(String, Tensor)> =
            self.model.params().iter().map(|(n, t)| (format!("critic.{n}"), t.shallow_clone())).collect();
        v.push(("critic.value_head.weight".into(), self.head.shallow_clone()));
        v.push(("critic.value_head.bias".into(), self.head_bias.shallow_clone()));
        v
    }

    /// Values [B, T] of every position of `tokens` (the critic's trunk, then the value head).
    pub fn values(&self, tokens: &Tensor, positions: &Tensor, valid: &Tensor) -> Tensor {
        self.model
            .hidden(tokens, positions, valid, None, None)
            .linear(&self.head, Some(&self.head_bias))
            .squeeze_dim(-1)
    }

    pub fn zero_grad(&self) {
        for (_, p) in self.params() {
            let mut g = p.grad();
            if g.defined() {
                let _ = g.zero_();
            }
        }
    }

    pub fn save(&self, dir: &Path) -> Result<(), RunError> {
        self.save_with(dir, &self.adam)
    }

    /// The critic's files with the optimizer state `adam` (its own, or under ZeRO-1 the whole
    /// state gathered from the ranks' shards).
    pub(crate) fn save_with(&self, dir: &Path, adam: &AdamState) -> Result<(), RunError> {
        let params: Vec<(String, Tensor)> = self.params().into_iter().map(|(n, t)| (n, t.detach())).collect();
        write_tensors(&params, &dir.join(WEIGHTS))?;
        write_tensors(&self.moments(adam), &dir.join(OPTIMIZER))
    }

    fn moments(&self, adam: &AdamState) -> Vec<(String, Tensor)> {
        let mut named = Vec::new();
        for (i, (n, _)) in self.params().iter().enumerate() {
            named.push((format!("exp_avg.{n}"), adam.m[i].shallow_clone()));
            named.push((format!("exp_avg_sq.{n}"), adam.v[i].shallow_clone()));
        }
        named
    }

    /// The critic of a checkpoint, if it holds one (one taken before RL began holds none).
    pub fn load(dir: &Path, policy: &Policy, adam_t: u64) -> Result<Option<Critic>, RunError> {
        let wp = dir.join(WEIGHTS);
        if !wp.exists() {
            return Ok(None);
        }
        let mut c = Critic::from_policy(policy);
        let mut params = c.params();
        load_named(&mut params, read_tensors(&wp)?, &wp)?;
        let op = dir.join(OPTIMIZER);
        let mut moments = c.moments(&c.adam);
        load_named(&mut moments, read_tensors(&op)?, &op)?;
        c.adam.t = adam_t;
        Ok(Some(c))
    }
}

/// Generalised advantage estimation over one response of `values.len()` tokens whose task
/// reward `reward` arrives at its last token: delta_j = r_j + gamma V_{j+1} - V_j (V after the
/// last token is 0), A_j = delta_j + gamma lambda A_{j+1}. Returns (advantages, returns = A + V).
pub fn gae(values: &[f32], reward: f32, gamma: f64, lambda: f64) -> (Vec<f32>, Vec<f32>) {
    let n = values.len();
    let mut adv = vec![0f32; n];
    let mut next_value = 0f64;
    let mut acc = 0f64;
    for j in (0..n).rev() {
        let r = if j + 1 == n { reward as f64 } else { 0.0 };
        let delta = r + gamma * next_value - values[j] as f64;
        acc = delta + gamma * lambda * acc;
        adv[j] = acc as f32;
        next_value = values[j] as f64;
    }
    let returns = adv.iter().zip(values).map(|(a, v)| a + v).collect();
    (adv, returns)
}

/// PPO's clipped value loss per token: 0.5 max((V - R)^2, (V_old + clip(V - V_old, -c, c) - R)^2)
/// (no clipping when `clip` is 0), and 1 where the clipped term was the larger.
pub fn value_loss(v: &Tensor, v_old: &Tensor, ret: &Tensor, clip: f64) -> (Tensor, Tensor) {
    let l1 = (v - ret).square();
    if clip <= 0.0 {
        let zeros = l1.zeros_like();
        return (l1 * 0.5, zeros);
    }
    let vc = v_old + (v - v_old).clamp(-clip, clip);
    let l2 = (vc - ret).square();
    let clipped = l2.gt_tensor(&l1).to_kind(Kind::Float);
    (l1.maximum(&l2) * 0.5, clipped)
}

/// Scales `adv` to zero mean and unit variance over the tokens where `mask` is 1 (whitening, as
/// PPO implementations do); the rest are left as they are.
pub fn whiten(adv: &mut [Vec<f32>], mask: &[&[f32]]) {
    let (mut n, mut sum, mut sq) = (0f64, 0f64, 0f64);
    for (a, m) in adv.iter().zip(mask) {
        for (x, w) in a.iter().zip(m.iter()) {
            if *w > 0.0 {
                n += 1.0;
                sum += *x as f64;
                sq += (*x as f64).powi(2);
            }
        }
    }
    if n < 2.0 {
        return;
    }
    let mean = sum / n;
    let std = (sq / n - mean * mean).max(0.0).sqrt();
    for a in adv.iter_mut() {
        for x in a.iter_mut() {
            *x = ((*x as f64 - mean) / (std + 1e-8)) as f32;
        }
    }
}
