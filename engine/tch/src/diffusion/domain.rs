//! The procedural image domain diffusion RL runs on: one simple bright shape on a dark ground per
//! class (a horizontal bar, a vertical bar, a diagonal, ...), each drawn at a random position and
//! size with random stroke thickness, intensity and a little pixel noise. It needs no dataset, so
//! the denoiser's pretraining, the reward classifier and every test draw from the same source, and
//! a seed fixes every image (all randomness comes from `miles_runtime::rng::Rng`, not libtorch).
//!
//! With only a handful of classes, holding out *conditions* would leave the classifier nothing to
//! say about them; held-out evaluation is instead a fixed list of (condition, seed) pairs
//! (`eval_pairs`), the same at every evaluation of a run.

use miles_runtime::rng::{derive_seed, Rng};
use miles_runtime::{RunError, E_SPEC};
use tch::Tensor;

/// The classes' shapes, by condition id. A domain has at most this many conditions.
pub const SHAPES: [&str; 8] =
    ["horizontal bar", "vertical bar", "diagonal", "anti-diagonal", "square outline", "filled disc", "cross", "ring"];

/// The smallest side the shapes still tell apart at (a stroke is a pixel or two wide).
pub const MIN_SIDE: usize = 6;

/// The standard deviation of the per-pixel noise, in image units ([-1, 1]).
const PIXEL_NOISE: f64 = 0.04;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Domain {
    /// Images are `side` x `side` pixels.
    pub side: usize,
    /// Classes 0..conditions, the first `conditions` entries of `SHAPES`.
    pub conditions: usize,
}

impl Default for Domain {
    /// 16x16 images of the 8 shapes.
    fn default() -> Self {
        Domain { side: 16, conditions: SHAPES.len() }
    }
}

/// One drawn instance's nuisance parameters, in pixels (pixel centres are at integer coordinates).
struct Pose {
    cx: f64,
    cy: f64,
    /// Half-length of a bar, half-size of a square, radius of a disc or ring.
    r: f64,
    /// Half the stroke width.
    half_width: f64,
    /// Peak brightness of the ink, as a fraction of the [-1, 1] range.
    intensity: f64,
}

impl Domain {
    /// A domain with its sizes checked: the fields are public for struct literals, and `draw`
    /// stays total for any of them, but a run builds its domain here so a bad recipe value is an
    /// error, not a degenerate image.
    pub fn new(side: usize, conditions: usize) -> Result<Domain, RunError> {
        if side < MIN_SIDE {
            return Err(RunError::new(
                E_SPEC,
                format!("diffusion images must be at least {MIN_SIDE}x{MIN_SIDE} pixels, not {side}x{side}"),
            ));
        }
        if conditions == 0 || conditions > SHAPES.len() {
            return Err(RunError::new(
                E_SPEC,
                format!(
                    "the procedural image domain has 1 to {} classes ({}), not {conditions}",
                    SHAPES.len(),
                    SHAPES.join(", ")
                ),
            ));
        }
        Ok(Domain { side, conditions })
    }

    /// Refuses a condition outside 0..conditions, naming its position.
    pub fn check_conditions(&self, conds: &[i64]) -> Result<(), RunError> {
        match conds.iter().position(|&c| c < 0 || c as usize >= self.conditions) {
            None => Ok(()),
            Some(i) => Err(RunError::new(
                E_SPEC,
                format!("condition {} (sample {i}) is not a class of this domain (0..{})", conds[i], self.conditions),
            )),
        }
    }

    /// The shape class `cond` draws (taken modulo the number of shapes, as `draw` does).
    pub fn shape_name(cond: i64) -> &'static str {
        SHAPES[cond.rem_euclid(SHAPES.len() as i64) as usize]
    }

    /// One `side * side` image of class `cond`, row-major, values in [-1, 1] (-1 is the dark
    /// ground). The condition is taken modulo the number of shapes so the function is total;
    /// callers check ids with `check_conditions` first.
    pub fn draw(&self, cond: i64, rng: &mut Rng) -> Vec<f32> {
        let s = self.side as f64;
        let centre = (s - 1.0) / 2.0;
        let jitter = 0.12 * s;
        let mut u = || rng.next_f64();
        // Draw order is part of the domain's definition: changing it changes every seeded image.
        let pose = Pose {
            cx: centre + jitter * (2.0 * u() - 1.0),
            cy: centre + jitter * (2.0 * u() - 1.0),
            r: s * (0.24 + 0.12 * u()),
            half_width: (s / 16.0) * (0.5 + 0.5 * u()),
            intensity: 0.65 + 0.35 * u(),
        };
        let shape = cond.rem_euclid(SHAPES.len() as i64) as usize;
        let mut img = Vec::with_capacity(self.side * self.side);
        for y in 0..self.side {
            for x in 0..self.side {
                // Coverage of the pixel by the ink, approximated from the signed distance of its
                // centre to the ink region: a soft one-pixel edge, so thin strokes do not alias.
                let ink = (0.5 - signed_distance(shape, &pose, x as f64, y as f64)).clamp(0.0, 1.0);
                let v = -1.0 + 2.0 * pose.intensity * ink + PIXEL_NOISE * rng.normal();
                img.push(v.clamp(-1.0, 1.0) as f32);
            }
        }
        img
    }

    /// A [B, 1, side, side] batch, image i of class `conds[i]`, drawn in order from `rng`.
    pub fn batch(&self, conds: &[i64], rng: &mut Rng) -> Tensor {
        let data: Vec<f32> = conds.iter().flat_map(|&c| self.draw(c, rng)).collect();
        let s = self.side as i64;
        Tensor::from_slice(&data).view([conds.len() as i64, 1, s, s])
    }

    /// The held-out evaluation set: `n` (condition, seed) pairs, the classes in turn (balanced to
    /// within one) and each pair's seed derived from `seed` and its index, so the list is the
    /// same at every evaluation and in every process. The seed is the sampler's: it fixes the
    /// starting noise of that sample.
    pub fn eval_pairs(&self, n: usize, seed: u64) -> Vec<(i64, u64)> {
        let k = self.conditions.max(1);
        (0..n).map(|i| ((i % k) as i64, derive_seed(seed, "diffusion-eval", i as u64))).collect()
    }

    /// The conditions of `eval_pairs(n, seed)`.
    pub fn eval_conditions(&self, n: usize, seed: u64) -> Vec<i64> {
        self.eval_pairs(n, seed).into_iter().map(|(c, _)| c).collect()
    }
}

/// Distance from segment (ax, ay)-(bx, by) to the point (x, y).
fn segment_distance(ax: f64, ay: f64, bx: f64, by: f64, x: f64, y: f64) -> f64 {
    let (dx, dy) = (bx - ax, by - ay);
    let len2 = dx * dx + dy * dy;
    let t = if len2 == 0.0 { 0.0 } else { (((x - ax) * dx + (y - ay) * dy) / len2).clamp(0.0, 1.0) };
    (x - (ax + t * dx)).hypot(y - (ay + t * dy))
}

/// Signed distance (pixels) from (x, y) to the ink of `shape`: negative inside. Strokes are
/// curves widened by `half_width`; the disc is filled.
fn signed_distance(shape: usize, p: &Pose, x: f64, y: f64) -> f64 {
    let (cx, cy, r, w) = (p.cx, p.cy, p.r, p.half_width);
    let (dx, dy) = (x - cx, y - cy);
    // Diagonals get the same length as a bar: r along each axis would make them 1.4x longer.
    let d = r / std::f64::consts::SQRT_2;
    match shape {
        0 => segment_distance(cx - r, cy, cx + r, cy, x, y) - w,
        1 => segment_distance(cx, cy - r, cx, cy + r, x, y) - w,
        // y grows downwards: the diagonal runs from top left to bottom right.
        2 => segment_distance(cx - d, cy - d, cx + d, cy + d, x, y) - w,
        3 => segment_distance(cx - d, cy + d, cx + d, cy - d, x, y) - w,
        4 => (dx.abs().max(dy.abs()) - 0.95 * r).abs() - w,
        5 => dx.hypot(dy) - 0.55 * r,
        6 => segment_distance(cx - r, cy, cx + r, cy, x, y).min(segment_distance(cx, cy - r, cx, cy + r, x, y)) - w,
        _ => (dx.hypot(dy) - 0.85 * r).abs() - w,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shape_has_ink_and_ground_within_range() {
        let d = Domain::default();
        for c in 0..SHAPES.len() as i64 {
            let img = d.draw(c, &mut Rng::new(c as u64));
            assert_eq!(img.len(), 256);
            assert!(img.iter().all(|v| (-1.0..=1.0).contains(v)));
            let bright = img.iter().filter(|&&v| v > 0.0).count();
            assert!((4..200).contains(&bright), "{}: {bright} bright pixels", SHAPES[c as usize]);
        }
    }

    #[test]
    fn sizes_and_conditions_are_checked() {
        assert!(Domain::new(4, 8).is_err());
        assert!(Domain::new(16, 9).unwrap_err().message.contains("1 to 8 classes"));
        let d = Domain::new(16, 3).unwrap();
        assert!(d.check_conditions(&[0, 2, 1]).is_ok());
        assert!(d.check_conditions(&[0, 3]).unwrap_err().message.contains("sample 1"));
        assert_eq!(d.eval_conditions(7, 1), vec![0, 1, 2, 0, 1, 2, 0]);
    }
}
