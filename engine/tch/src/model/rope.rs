//! Rotary position embedding: the tables (with `rope_scaling`) and their application to query
//! and key heads.

use super::Policy;
use miles_runtime::{ModelConfig, RopeScaling};
use tch::{Kind, Tensor};

/// Rotary tables [max_len, head_dim], Hugging Face convention (rotate_half over the two halves
/// of a head), with `rope_scaling` applied to the frequencies.
pub(super) fn rope_tables(cfg: &ModelConfig) -> (Tensor, Tensor) {
    let hd = cfg.head_dim() as i64;
    let inv: Vec<f32> = (0..hd / 2)
        .map(|i| {
            scale_frequency(1.0 / cfg.rope_theta.powf(2.0 * i as f64 / hd as f64), cfg.rope_scaling.as_ref()) as f32
        })
        .collect();
    let inv = crate::device::from_slice(&inv);
    let pos = Tensor::arange(cfg.max_len as i64, (Kind::Float, crate::device::current()));
    let freqs = pos.unsqueeze(1) * inv.unsqueeze(0);
    let emb = Tensor::cat(&[&freqs, &freqs], 1);
    (emb.cos(), emb.sin())
}

/// One rotary frequency under `scaling` (transformers' `_compute_linear_scaling_rope_parameters`
/// and `_compute_llama3_parameters`).
fn scale_frequency(f: f64, scaling: Option<&RopeScaling>) -> f64 {
    match scaling {
        None => f,
        Some(RopeScaling::Linear { factor }) => f / factor,
        Some(RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings }) => {
            let old = *original_max_position_embeddings as f64;
            let wavelen = 2.0 * std::f64::consts::PI / f;
            if wavelen < old / high_freq_factor {
                f
            } else if wavelen > old / low_freq_factor {
                f / factor
            } else {
                let smooth = (old / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                (1.0 - smooth) * f / factor + smooth * f
            }
        }
    }
}

impl Policy {
    /// Rotary position embedding at `positions` [B, T]: rotates queries or keys [B, heads, T, hd].
    pub(super) fn rotary(&self, positions: &Tensor, b: i64, t: i64) -> impl Fn(&Tensor) -> Tensor {
        let hd = self.cfg.head_dim() as i64;
        let flat_pos = positions.reshape([-1]);
        let cos = self.cos.index_select(0, &flat_pos).view([b, 1, t, hd]).to_kind(self.kind());
        let sin = self.sin.index_select(0, &flat_pos).view([b, 1, t, hd]).to_kind(self.kind());
        move |x: &Tensor| -> Tensor {
            let x1 = x.narrow(-1, 0, hd / 2);
            let x2 = x.narrow(-1, hd / 2, hd / 2);
            let rot = Tensor::cat(&[&x2.neg(), &x1], -1);
            x * &cos + rot * &sin
        }
    }
}
