//! Rewards for diffusion RL: a small classifier trained on the procedural domain (the reward is
//! its probability that an image shows the class it was conditioned on), and analytic properties
//! of the image (brightness, contrast, how centred its ink is) that need no model.
//!
//! Both refuse a batch with a NaN or infinite pixel, naming the sample: a diverged denoiser must
//! stop the run (E0505), not hand the trainer a NaN advantage or a reward of 0 that looks real.

use super::domain::Domain;
use crate::model::{backend_err, read_tensors};
use miles_runtime::rng::Rng;
use miles_runtime::{RunError, E_BACKEND, E_CHECKPOINT, E_NONFINITE, E_SPEC};
use std::path::Path;
use std::time::Duration;
use tch::{Device, Kind, Tensor};

/// Channels of the two conv layers and width of the hidden linear layer.
const C1: i64 = 8;
const C2: i64 = 16;
const HIDDEN: i64 = 64;

/// `config.json`'s `kind` of a classifier directory.
pub const CLASSIFIER_KIND: &str = "miles_shape_classifier";

/// Samples the accuracy after training is measured on (balanced over the classes).
const EVAL_SAMPLES: usize = 512;

/// A conv net over [B, 1, side, side] images with `conditions` logits: two 3x3 conv + ReLU +
/// 2x2 max-pool blocks, then a hidden ReLU layer. Small enough to train in seconds on one CPU
/// thread, and position-tolerant, which the domain's jitter needs.
pub struct Classifier {
    pub side: usize,
    pub conditions: usize,
    /// Slept after each `score`, standing in for the latency of a large reward model (a VLM or a
    /// learned preference model) so the overlap of scoring with denoising can be measured on a
    /// small machine. The real forward pass still runs; zero by default.
    pub extra_cost: Duration,
    /// Softmax temperature of the scored probability: a classifier trained to near-certainty
    /// gives 0/1 rewards; a temperature above 1 makes them graded (1: the trained model's).
    pub temperature: f64,
    /// Every parameter with its name, in `param_shapes` order.
    params: Vec<(String, Tensor)>,
}

impl std::fmt::Debug for Classifier {
    /// Sizes and cost only: the weights are thousands of numbers.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Classifier")
            .field("side", &self.side)
            .field("conditions", &self.conditions)
            .field("extra_cost", &self.extra_cost)
            .finish_non_exhaustive()
    }
}

/// Parameter names and shapes of a classifier for `side` x `side` images and `conditions` classes.
fn param_shapes(side: usize, conditions: usize) -> Vec<(&'static str, Vec<i64>)> {
    let pooled = (side / 4) as i64;
    vec![
        ("conv1.weight", vec![C1, 1, 3, 3]),
        ("conv1.bias", vec![C1]),
        ("conv2.weight", vec![C2, C1, 3, 3]),
        ("conv2.bias", vec![C2]),
        ("fc1.weight", vec![HIDDEN, C2 * pooled * pooled]),
        ("fc1.bias", vec![HIDDEN]),
        ("fc2.weight", vec![conditions as i64, HIDDEN]),
        ("fc2.bias", vec![conditions as i64]),
    ]
}

fn shape_text(dims: &[i64]) -> String {
    format!("[{}]", dims.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", "))
}

/// An image batch's shape as the shape errors say it: the batch dimension as `B`.
fn batch_shape_text(dims: &[i64]) -> String {
    match dims.len() {
        4 => format!("[B, {}, {}, {}]", dims[1], dims[2], dims[3]),
        _ => format!("a tensor of shape {}", shape_text(dims)),
    }
}

/// The batch's pixels as f32, one row of `per_image` values per sample, refusing NaN and infinity
/// by sample index.
fn finite_rows(images: &Tensor) -> Result<(usize, usize, Vec<f32>), RunError> {
    let dims = images.size();
    let b = dims.first().copied().unwrap_or(0).max(0) as usize;
    let v = Vec::<f32>::try_from(images.detach().to_kind(Kind::Float).contiguous().view([-1])).map_err(backend_err)?;
    let per_image = v.len().checked_div(b).unwrap_or(0);
    if let Some(i) = (0..b).find(|&i| v[i * per_image..(i + 1) * per_image].iter().any(|x| !x.is_finite())) {
        return Err(RunError::new(
            E_NONFINITE,
            format!("image {i} of the batch to score contains NaN or an infinite value"),
        )
        .with_help("the denoiser diverged: lower the learning rate or the KL/clip bounds and resume"));
    }
    Ok((b, per_image, v))
}

impl Classifier {
    /// A fresh classifier, its weights drawn from `seed` (He-normal, zero biases).
    pub fn init(side: usize, conditions: usize, seed: u64) -> Classifier {
        let mut rng = Rng::derived(seed, "diffusion-classifier-init", 0);
        let params = param_shapes(side, conditions)
            .into_iter()
            .map(|(name, shape)| {
                let n: i64 = shape.iter().product();
                let t = if name.ends_with(".bias") {
                    Tensor::zeros(shape.as_slice(), (Kind::Float, Device::Cpu))
                } else {
                    let fan_in: i64 = shape[1..].iter().product();
                    let std = (2.0 / fan_in.max(1) as f64).sqrt();
                    let v: Vec<f32> = (0..n).map(|_| (rng.normal() * std) as f32).collect();
                    Tensor::from_slice(&v).view(shape.as_slice())
                };
                (name.to_string(), t)
            })
            .collect();
        Classifier { side, conditions, extra_cost: Duration::ZERO, temperature: 1.0, params }
    }

    /// The classifier with `extra_cost` slept after each score (see the field).
    pub fn with_extra_cost(mut self, extra_cost: Duration) -> Classifier {
        self.extra_cost = extra_cost;
        self
    }

    /// Parameters by name, in a fixed order.
    pub fn params(&self) -> &[(String, Tensor)] {
        &self.params
    }

    fn p(&self, i: usize) -> &Tensor {
        &self.params[i].1
    }

    /// Logits [B, conditions] of images already checked by `check_input`.
    fn logits(&self, x: &Tensor) -> Tensor {
        let block = |x: &Tensor, w: &Tensor, b: &Tensor| {
            x.conv2d(w, Some(b), [1, 1], [1, 1], [1, 1], 1).relu().max_pool2d([2, 2], [2, 2], [0, 0], [1, 1], false)
        };
        let h = block(x, self.p(0), self.p(1));
        let h = block(&h, self.p(2), self.p(3)).flatten(1, -1);
        h.linear(self.p(4), Some(self.p(5))).relu().linear(self.p(6), Some(self.p(7)))
    }

    /// Trains a fresh classifier (seeded by `seed`) with Adam on `steps` batches of `batch` fresh
    /// images, classes drawn uniformly; returns it with its accuracy on `EVAL_SAMPLES` images it
    /// never saw (a stream of its own, balanced over the classes).
    pub fn train_on_domain(
        domain: &Domain,
        steps: usize,
        batch: usize,
        lr: f64,
        seed: u64,
    ) -> Result<(Classifier, f32), RunError> {
        if domain.conditions == 0 || domain.side < 4 {
            return Err(RunError::new(
                E_SPEC,
                format!(
                    "cannot train a classifier on {}x{} images of {} classes",
                    domain.side, domain.side, domain.conditions
                ),
            ));
        }
        let mut c = Classifier::init(domain.side, domain.conditions, seed);
        let vs = tch::nn::VarStore::new(Device::Cpu);
        // The store's variables become the classifier's parameters (same storage), so the
        // optimizer updates them in place.
        for (name, t) in c.params.iter_mut() {
            let (module, leaf) = name.split_once('.').unwrap_or(("", name.as_str()));
            *t = (vs.root() / module).f_var_copy(leaf, t).map_err(backend_err)?;
        }
        let mut opt = tch::nn::OptimizerConfig::build(tch::nn::Adam::default(), &vs, lr).map_err(backend_err)?;
        let mut rng = Rng::derived(seed, "diffusion-classifier-train", 0);
        let k = domain.conditions as u64;
        for _ in 0..steps {
            let conds: Vec<i64> = (0..batch.max(1)).map(|_| rng.below(k) as i64).collect();
            let x = domain.batch(&conds, &mut rng);
            let y = Tensor::from_slice(&conds);
            let loss = c.logits(&x).cross_entropy_for_logits(&y);
            let l = loss.double_value(&[]);
            if !l.is_finite() {
                return Err(RunError::new(E_NONFINITE, format!("the reward classifier's loss became {l}"))
                    .with_help("lower the classifier's learning rate"));
            }
            opt.zero_grad();
            loss.backward();
            opt.step();
        }
        // Plain tensors from here on: the classifier no longer records gradients.
        for (_, t) in c.params.iter_mut() {
            *t = t.detach().copy();
        }
        drop(opt);
        drop(vs);
        let mut eval_rng = Rng::derived(seed, "diffusion-classifier-eval", 0);
        let conds: Vec<i64> = (0..EVAL_SAMPLES).map(|i| (i % domain.conditions) as i64).collect();
        let x = domain.batch(&conds, &mut eval_rng);
        let pred = tch::no_grad(|| c.logits(&x).argmax(-1, false));
        let pred = Vec::<i64>::try_from(pred).map_err(backend_err)?;
        let right = pred.iter().zip(&conds).filter(|(p, c)| p == c).count();
        Ok((c, right as f32 / EVAL_SAMPLES as f32))
    }

    /// Refuses images this classifier cannot read: it reads [B, 1, side, side].
    pub fn check_input(&self, images: &Tensor) -> Result<(), RunError> {
        let dims = images.size();
        let s = self.side as i64;
        if dims.len() == 4 && dims[1] == 1 && dims[2] == s && dims[3] == s {
            return Ok(());
        }
        Err(RunError::new(
            E_SPEC,
            format!("the reward model reads [B, 1, {s}, {s}] images; the denoiser makes {}", batch_shape_text(&dims)),
        )
        .with_help("train (or load) the reward classifier for the denoiser's image size"))
    }

    /// For each image, the classifier's probability of its intended class `conds[i]`, in [0, 1].
    /// Then sleeps `extra_cost`.
    pub fn score(&self, images: &Tensor, conds: &[i64]) -> Result<Vec<f32>, RunError> {
        self.check_input(images)?;
        let (b, _, _) = finite_rows(images)?;
        if conds.len() != b {
            return Err(RunError::new(E_BACKEND, format!("{b} images to score but {} conditions", conds.len())));
        }
        if let Some(i) = conds.iter().position(|&c| c < 0 || c as usize >= self.conditions) {
            return Err(RunError::new(
                E_SPEC,
                format!(
                    "condition {} (sample {i}) is not a class of the reward model (0..{})",
                    conds[i], self.conditions
                ),
            ));
        }
        let probs = tch::no_grad(|| {
            let x = images.detach().to_kind(Kind::Float);
            let idx = Tensor::from_slice(conds).view([b as i64, 1]);
            (self.logits(&x) / self.temperature.max(1e-6)).softmax(-1, Kind::Float).gather(1, &idx, false).view([-1])
        });
        let out = Vec::<f32>::try_from(probs).map_err(backend_err)?;
        if !self.extra_cost.is_zero() {
            std::thread::sleep(self.extra_cost);
        }
        Ok(out)
    }

    /// Writes the parameters as safetensors, atomically (a temp file beside `path`, renamed).
    pub fn save(&self, path: &Path) -> Result<(), RunError> {
        miles_runtime::atomic_write::replace_file(path, |tmp| {
            Tensor::write_safetensors(&self.params, tmp)
                .map_err(|e| RunError::new(E_CHECKPOINT, format!("cannot write {}: {e}", path.display())))
        })
    }

    /// Writes the classifier as a directory: `model.safetensors` and `config.json` (its kind,
    /// image side and classes, which `miles check` reads to match the reward's input shape with
    /// the denoiser's output before a run starts). Each file is written then renamed.
    pub fn save_dir(&self, dir: &Path) -> Result<(), RunError> {
        std::fs::create_dir_all(dir).map_err(|e| RunError::io(E_CHECKPOINT, "cannot create", dir, e))?;
        self.save(&dir.join("model.safetensors"))?;
        let config = serde_json::json!({"kind": CLASSIFIER_KIND, "side": self.side, "conditions": self.conditions});
        miles_runtime::exec::write_json(&dir.join("config.json"), &config)
    }

    /// Reads a classifier directory written by `save_dir` for a denoiser of `side` x `side`
    /// images and `conditions` classes: a config of another size is refused before any tensor is
    /// read, naming both shapes.
    pub fn load_dir(dir: &Path, side: usize, conditions: usize) -> Result<Classifier, RunError> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|e| RunError::io(E_CHECKPOINT, "cannot read", &path, e))?;
        let v: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| RunError::new(E_CHECKPOINT, format!("{}: not JSON: {e}", path.display())))?;
        let n = |k: &str| v.get(k).and_then(serde_json::Value::as_u64).map(|x| x as usize);
        if v.get("kind").and_then(serde_json::Value::as_str) != Some(CLASSIFIER_KIND) {
            return Err(RunError::new(E_CHECKPOINT, format!("{}: not a miles shape classifier", path.display())));
        }
        let (s, k) = (n("side").unwrap_or(0), n("conditions").unwrap_or(0));
        if s != side || k != conditions {
            return Err(RunError::new(
                E_SPEC,
                format!(
                    "the reward model {} reads [B, 1, {s}, {s}] images of {k} classes; the denoiser makes [B, 1, {side}, {side}] images of {conditions} classes",
                    dir.display()
                ),
            )
            .with_help("train (or load) the reward classifier for the denoiser's image size and classes"));
        }
        Classifier::load(&dir.join("model.safetensors"), side, conditions)
    }

    /// The most probable class of each image.
    pub fn predict(&self, images: &Tensor) -> Result<Vec<i64>, RunError> {
        self.check_input(images)?;
        finite_rows(images)?;
        let pred = tch::no_grad(|| self.logits(&images.detach().to_kind(Kind::Float)).argmax(-1, false));
        Vec::<i64>::try_from(pred).map_err(backend_err)
    }

    /// Reads a classifier saved by `save`, for `side` x `side` images of `conditions` classes;
    /// any missing, extra or differently shaped tensor is an error naming the file.
    pub fn load(path: &Path, side: usize, conditions: usize) -> Result<Classifier, RunError> {
        let mut found: std::collections::BTreeMap<String, Tensor> = read_tensors(path)?.into_iter().collect();
        let err = |m: String| {
            RunError::new(E_CHECKPOINT, format!("{}: {m}", path.display()))
                .with_help(format!("it must hold a reward classifier for {side}x{side} images of {conditions} classes"))
        };
        let mut params = Vec::new();
        for (name, shape) in param_shapes(side, conditions) {
            let t = found.remove(name).ok_or_else(|| err(format!("no tensor {name}")))?;
            if t.size() != shape {
                return Err(err(format!(
                    "{name} has shape {}, expected {}",
                    shape_text(&t.size()),
                    shape_text(&shape)
                )));
            }
            params.push((name.to_string(), t.to_kind(Kind::Float)));
        }
        if let Some(extra) = found.keys().next() {
            return Err(err(format!("unexpected tensor {extra}")));
        }
        Ok(Classifier { side, conditions, extra_cost: Duration::ZERO, temperature: 1.0, params })
    }
}

/// Rewards computed from the pixels alone; each is in [0, 1] for images in [-1, 1].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Analytic {
    /// Mean pixel value mapped from [-1, 1] to [0, 1].
    Brightness,
    /// Standard deviation of the pixels (population, over the image): 0 for a flat image, 1 for
    /// half black and half white.
    Contrast,
    /// 1 when the intensity centroid (weights (v + 1) / 2, so black weighs nothing) is the image
    /// centre, falling linearly to 0 at a corner pixel's centre; 0 for an all-black image, which
    /// has no centroid.
    CenterMass,
}

impl Analytic {
    /// The reward of each image of a [B, 1, H, W] batch.
    pub fn score(&self, images: &Tensor) -> Result<Vec<f32>, RunError> {
        let dims = images.size();
        if dims.len() != 4 || dims[1] != 1 || dims[2] < 1 || dims[3] < 1 {
            return Err(RunError::new(
                E_BACKEND,
                format!("analytic rewards read [B, 1, H, W] images, not {}", batch_shape_text(&dims)),
            ));
        }
        let (h, w) = (dims[2] as usize, dims[3] as usize);
        let (b, n, v) = finite_rows(images)?;
        Ok((0..b).map(|i| self.one(&v[i * n..(i + 1) * n], h, w)).collect())
    }

    fn one(&self, px: &[f32], h: usize, w: usize) -> f32 {
        let n = px.len() as f64;
        let mean = px.iter().map(|&x| x as f64).sum::<f64>() / n;
        match self {
            Analytic::Brightness => ((mean + 1.0) / 2.0) as f32,
            Analytic::Contrast => (px.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n).sqrt() as f32,
            Analytic::CenterMass => {
                let (mut total, mut sx, mut sy) = (0.0, 0.0, 0.0);
                for (j, &x) in px.iter().enumerate() {
                    let m = ((x as f64 + 1.0) / 2.0).max(0.0);
                    total += m;
                    sx += m * (j % w) as f64;
                    sy += m * (j / w) as f64;
                }
                if total <= 0.0 {
                    return 0.0;
                }
                let (cx, cy) = ((w as f64 - 1.0) / 2.0, (h as f64 - 1.0) / 2.0);
                let far = cx.hypot(cy);
                if far == 0.0 {
                    return 1.0;
                }
                (1.0 - (sx / total - cx).hypot(sy / total - cy) / far).clamp(0.0, 1.0) as f32
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fresh_classifier_scores_probabilities() {
        let c = Classifier::init(16, 8, 1);
        let x = Domain::default().batch(&[0, 3, 7], &mut Rng::new(2));
        let s = c.score(&x, &[0, 3, 7]).unwrap();
        assert!(s.iter().all(|p| (0.0..=1.0).contains(p)), "{s:?}");
        assert!(c.score(&x, &[0, 3]).is_err());
        assert!(c.score(&x, &[0, 3, 8]).unwrap_err().message.contains("sample 2"));
    }

    #[test]
    fn centre_mass_of_a_centred_and_a_corner_pixel() {
        // 3x3: the centre pixel white, the rest black; then the top-left corner.
        let mut px = vec![-1.0f32; 9];
        px[4] = 1.0;
        assert_eq!(Analytic::CenterMass.one(&px, 3, 3), 1.0);
        px[4] = -1.0;
        px[0] = 1.0;
        assert_eq!(Analytic::CenterMass.one(&px, 3, 3), 0.0);
        assert_eq!(Analytic::CenterMass.one(&[-1.0; 9], 3, 3), 0.0);
    }
}
