//! The denoiser: an MLP over the flattened image that predicts the noise epsilon of a noised
//! image x_t, given the timestep and the condition (fp32 on CPU, named parameters in a fixed
//! order, a seeded init drawn by our own RNG as `crate::model::Policy::init` does).
//!
//! ```text
//! h   = in(x_t) + time(sinusoid(t)) + cond[c]          c in 0..=K, K the null condition
//! h  += fc2(silu(fc1(silu(norm_i(h)))))                 for each of `layers` residual blocks
//! eps = out(silu(out_norm(h)))                          [B, S*S] -> [B, 1, S, S]
//! ```
//!
//! A U-Net would denoise better; an MLP keeps a 16x16 domain fast on a CPU (one sampler step of
//! 32 images is a few small matrix products) and its gradients exact and simple to test.

use crate::model::{backend_err, load_named, read_tensors, write_tensors};
pub use miles_runtime::diffusion::DenoiserConfig;
use miles_runtime::rng::Rng;
use miles_runtime::{RunError, E_SPEC};
use std::path::Path;
use tch::{Device, Kind, Tensor};

struct Block {
    norm_w: Tensor,
    norm_b: Tensor,
    fc1_w: Tensor,
    fc1_b: Tensor,
    fc2_w: Tensor,
    fc2_b: Tensor,
}

pub struct Denoiser {
    pub cfg: DenoiserConfig,
    /// Every parameter in `cfg.param_shapes()` order; the fields below are shallow clones (same
    /// storage), so an optimizer step on `params` is what the forward reads.
    params: Vec<(String, Tensor)>,
    in_w: Tensor,
    in_b: Tensor,
    time_w: Tensor,
    time_b: Tensor,
    cond: Tensor,
    blocks: Vec<Block>,
    out_norm_w: Tensor,
    out_norm_b: Tensor,
    out_w: Tensor,
    out_b: Tensor,
    /// Sinusoid frequencies [hidden / 2] (not a parameter).
    freqs: Tensor,
}

impl std::fmt::Debug for Denoiser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Denoiser").field("cfg", &self.cfg).field("params", &self.num_params()).finish()
    }
}

impl Denoiser {
    /// Deterministic init from `seed`: weights N(0, 1/fan_in) (the residual branches' second
    /// layer scaled down by sqrt(2 layers), so the stack starts near the identity), condition
    /// embeddings N(0, 1), biases 0, norm gains 1. Each tensor draws from its own stream, so a
    /// tensor's init does not depend on the sizes of the ones before it.
    pub fn init(cfg: &DenoiserConfig, seed: u64) -> Result<Denoiser, RunError> {
        cfg.validate()?;
        let branch_scale = 1.0 / (2.0 * cfg.layers.max(1) as f64).sqrt();
        let params = cfg
            .param_shapes()
            .into_iter()
            .enumerate()
            .map(|(i, (name, shape))| {
                let t = if name.ends_with("norm.weight") {
                    Tensor::ones(&shape[..], (Kind::Float, Device::Cpu))
                } else if name.ends_with(".bias") {
                    Tensor::zeros(&shape[..], (Kind::Float, Device::Cpu))
                } else {
                    let std = match name.as_str() {
                        "cond.weight" => 1.0,
                        n if n.ends_with("fc2.weight") => branch_scale / (shape[1] as f64).sqrt(),
                        _ => 1.0 / (shape[1] as f64).sqrt(),
                    };
                    let n: i64 = shape.iter().product();
                    let mut rng = Rng::derived(seed, "diffusion-init", i as u64);
                    let data: Vec<f32> = (0..n).map(|_| (rng.normal() * std) as f32).collect();
                    Tensor::from_slice(&data).view(&shape[..])
                };
                (name, t)
            })
            .collect();
        Ok(Denoiser::from_params(cfg.clone(), params))
    }

    /// `params` must hold `cfg.param_shapes()` in order (callers build it so).
    fn from_params(cfg: DenoiserConfig, params: Vec<(String, Tensor)>) -> Denoiser {
        let get = |name: &str| crate::model::param_by_name(&params, name);
        let blocks = (0..cfg.layers)
            .map(|i| {
                let p = |s: &str| get(&format!("blocks.{i}.{s}"));
                Block {
                    norm_w: p("norm.weight"),
                    norm_b: p("norm.bias"),
                    fc1_w: p("fc1.weight"),
                    fc1_b: p("fc1.bias"),
                    fc2_w: p("fc2.weight"),
                    fc2_b: p("fc2.bias"),
                }
            })
            .collect();
        let half = cfg.hidden / 2;
        // The transformer's sinusoid: frequency 10000^(-i / half), i in 0..half.
        let f: Vec<f32> = (0..half).map(|i| (10000f64.powf(-(i as f64) / half as f64)) as f32).collect();
        Denoiser {
            in_w: get("in.weight"),
            in_b: get("in.bias"),
            time_w: get("time.weight"),
            time_b: get("time.bias"),
            cond: get("cond.weight"),
            blocks,
            out_norm_w: get("out_norm.weight"),
            out_norm_b: get("out_norm.bias"),
            out_w: get("out.weight"),
            out_b: get("out.bias"),
            freqs: Tensor::from_slice(&f),
            cfg,
            params,
        }
    }

    pub fn params(&self) -> &[(String, Tensor)] {
        &self.params
    }

    /// Number of scalar parameters.
    pub fn num_params(&self) -> usize {
        self.params.iter().map(|(_, t)| t.numel()).sum()
    }

    pub fn set_requires_grad(&self, on: bool) {
        for (_, t) in &self.params {
            let _ = t.set_requires_grad(on);
        }
    }

    /// Drops every parameter's accumulated gradient (before the next backward).
    pub fn zero_grad(&self) {
        for (_, t) in &self.params {
            t.shallow_clone().zero_grad();
        }
    }

    /// An independent copy (new storage, no gradient): the engine's or the reference's weights.
    pub fn deep_copy(&self) -> Denoiser {
        let params = self.params.iter().map(|(n, t)| (n.clone(), t.detach().copy())).collect();
        Denoiser::from_params(self.cfg.clone(), params)
    }

    /// Copies `other`'s weights into this model's tensors in place (a weight sync between two
    /// denoisers of the same config).
    pub fn copy_from(&self, other: &Denoiser) -> Result<(), RunError> {
        if other.cfg != self.cfg {
            return Err(RunError::internal(format!(
                "denoiser weight copy between configs {:?} and {:?}",
                other.cfg, self.cfg
            )));
        }
        let _g = tch::no_grad_guard();
        for ((_, dst), (_, src)) in self.params.iter().zip(&other.params) {
            dst.shallow_clone().f_copy_(src).map_err(backend_err)?;
        }
        Ok(())
    }

    /// Checks that `cond` holds ids in 0..=K (K the null condition), so `forward`'s embedding
    /// lookup cannot go out of range.
    pub fn check_conditions(&self, cond: &[i64]) -> Result<(), RunError> {
        let k = self.cfg.null_condition();
        match cond.iter().find(|&&c| c < 0 || c > k) {
            Some(c) => Err(RunError::new(
                E_SPEC,
                format!("diffusion condition {c} is outside 0..={k} ({k} is the null condition)"),
            )),
            None => Ok(()),
        }
    }

    /// Checks a batch of images against this model's side: [B, 1, S, S] f32.
    pub fn check_images(&self, x: &Tensor, what: &str) -> Result<(), RunError> {
        let s = self.cfg.side as i64;
        let size = x.size();
        if size.len() != 4 || size[1] != 1 || size[2] != s || size[3] != s || x.kind() != Kind::Float {
            return Err(RunError::internal(format!(
                "{what} is {size:?} {:?}, expected [B, 1, {s}, {s}] f32",
                x.kind()
            )));
        }
        Ok(())
    }

    /// The sinusoidal embedding of integer timesteps `t` [B] -> [B, hidden]: sines then cosines.
    pub fn timestep_embedding(&self, t: &Tensor) -> Tensor {
        let arg = t.to_kind(Kind::Float).unsqueeze(1) * self.freqs.unsqueeze(0);
        Tensor::cat(&[arg.sin(), arg.cos()], 1)
    }

    /// The predicted noise [B, 1, S, S] of `x_t` [B, 1, S, S] at timesteps `t` [B] (i64) under
    /// conditions `cond` [B] (i64, in 0..=K: callers check with `check_conditions`).
    pub fn forward(&self, x_t: &Tensor, t: &Tensor, cond: &Tensor) -> Tensor {
        let b = x_t.size()[0];
        let s = self.cfg.side as i64;
        let h = self.cfg.hidden as i64;
        let x = x_t.reshape([b, s * s]);
        let temb = self.timestep_embedding(t).linear(&self.time_w, Some(&self.time_b));
        let h0 = x.linear(&self.in_w, Some(&self.in_b)) + temb + self.cond.index_select(0, cond);
        // Out of place (`&hs + y`, never `+=`: tch's AddAssign writes into hs, which layer_norm's
        // backward still needs).
        let hs = self.blocks.iter().fold(h0, |hs, blk| {
            let y = hs.layer_norm([h], Some(&blk.norm_w), Some(&blk.norm_b), 1e-5, false).silu();
            let y = y.linear(&blk.fc1_w, Some(&blk.fc1_b)).silu().linear(&blk.fc2_w, Some(&blk.fc2_b));
            &hs + y
        });
        let y = hs.layer_norm([h], Some(&self.out_norm_w), Some(&self.out_norm_b), 1e-5, false).silu();
        y.linear(&self.out_w, Some(&self.out_b)).view([b, 1, s, s])
    }

    /// The weights as one safetensors file, written beside it and renamed over it (a run killed
    /// mid-write leaves the last good file); an error names it.
    pub fn save(&self, path: &Path) -> Result<(), RunError> {
        let named: Vec<(&str, Tensor)> = self.params.iter().map(|(n, t)| (n.as_str(), t.detach())).collect();
        miles_runtime::atomic_write::replace_file(path, |tmp| write_tensors(&named, tmp))
    }

    /// A denoiser of `cfg` with the weights of a file `save` wrote (every name, with its shape).
    pub fn load(cfg: &DenoiserConfig, path: &Path) -> Result<Denoiser, RunError> {
        cfg.validate()?;
        let params = cfg
            .param_shapes()
            .into_iter()
            .map(|(n, shape)| (n, Tensor::zeros(&shape[..], (Kind::Float, Device::Cpu))))
            .collect();
        let mut d = Denoiser::from_params(cfg.clone(), params);
        d.load_tensors(path)?;
        Ok(d)
    }

    /// Overwrites this model's weights in place from a file `save` wrote.
    pub fn load_tensors(&mut self, path: &Path) -> Result<(), RunError> {
        let read = read_tensors(path)?;
        if let Some((extra, _)) = read.iter().find(|(n, _)| !self.params.iter().any(|(m, _)| m == n)) {
            return Err(RunError::new(
                miles_runtime::E_CHECKPOINT,
                format!("{}: tensor {extra} is not a parameter of this denoiser ({:?})", path.display(), self.cfg),
            ));
        }
        load_named(&mut self.params, read, path)
    }
}

/// A [B] i64 tensor of `v`.
pub(crate) fn ids(v: &[i64]) -> Tensor {
    Tensor::from_slice(v)
}

/// A tensor of `shape` filled with standard normals from `rng` (f32).
pub(crate) fn normals(rng: &mut Rng, shape: &[i64]) -> Tensor {
    let n: i64 = shape.iter().product();
    let data: Vec<f32> = (0..n).map(|_| rng.normal() as f32).collect();
    Tensor::from_slice(&data).view(shape)
}

/// `E_BACKEND` for a value a tensor should have had.
pub(crate) fn scalar(t: &Tensor) -> Result<f64, RunError> {
    t.f_double_value(&[]).map_err(crate::model::backend_err)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> DenoiserConfig {
        DenoiserConfig { side: 4, conditions: 3, hidden: 8, layers: 2 }
    }

    #[test]
    fn init_is_seeded_and_counts_its_parameters() {
        tch::set_num_threads(1);
        let cfg = tiny();
        let (a, b, c) =
            (Denoiser::init(&cfg, 1).unwrap(), Denoiser::init(&cfg, 1).unwrap(), Denoiser::init(&cfg, 2).unwrap());
        let same = |x: &Denoiser, y: &Denoiser| x.params().iter().zip(y.params()).all(|((_, s), (_, t))| s.equal(t));
        assert!(same(&a, &b));
        assert!(!same(&a, &c));
        // in 8x16+8, time 8x8+8, cond 4x8, 2 blocks of (8+8+64+8+64+8), out_norm 8+8, out 16x8+16.
        let expected = (8 * 16 + 8) + (8 * 8 + 8) + 4 * 8 + 2 * (8 + 8 + 64 + 8 + 64 + 8) + 16 + (16 * 8 + 16);
        assert_eq!(a.num_params(), expected);
    }

    #[test]
    fn forward_has_the_image_shape_and_reads_the_condition() {
        tch::set_num_threads(1);
        let d = Denoiser::init(&tiny(), 3).unwrap();
        let x = Tensor::zeros([2, 1, 4, 4], (Kind::Float, Device::Cpu));
        let t = ids(&[5, 5]);
        let e = d.forward(&x, &t, &ids(&[0, 3]));
        assert_eq!(e.size(), vec![2, 1, 4, 4]);
        assert!(!e.get(0).equal(&e.get(1)), "different conditions, same output");
        assert!(d.check_conditions(&[0, 3]).is_ok());
        assert!(d.check_conditions(&[4]).is_err());
        assert!(d.check_conditions(&[-1]).is_err());
    }

    #[test]
    fn bad_sizes_are_errors() {
        assert!(Denoiser::init(&DenoiserConfig { hidden: 7, ..tiny() }, 0).is_err());
        assert!(Denoiser::init(&DenoiserConfig { side: 0, ..tiny() }, 0).is_err());
    }

    #[test]
    fn save_then_load_round_trips_and_a_missing_file_is_named() {
        tch::set_num_threads(1);
        let d = Denoiser::init(&tiny(), 4).unwrap();
        let dir = std::env::temp_dir().join(format!("miles-denoiser-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("denoiser.safetensors");
        d.save(&path).unwrap();
        let e = Denoiser::load(&tiny(), &path).unwrap();
        assert!(d.params().iter().zip(e.params()).all(|((n, s), (m, t))| n == m && s.equal(t)));
        let wrong = Denoiser::load(&DenoiserConfig { hidden: 16, ..tiny() }, &path).unwrap_err();
        assert!(wrong.message.contains("denoiser.safetensors"), "{}", wrong.message);
        let missing = Denoiser::load(&tiny(), &dir.join("absent.safetensors")).unwrap_err();
        assert!(missing.message.contains("absent.safetensors"), "{}", missing.message);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
