//! What the tch tests share: the tiny model they all train and sample.

use miles_runtime::{DecoderSizes, ModelConfig};

/// A 2-layer, 32-wide decoder over 12 tokens (GQA 4:2), every later field at today's defaults;
/// `init_std` sets how peaked its first distributions are.
pub fn tiny_config(init_std: f64) -> ModelConfig {
    let sizes =
        DecoderSizes { vocab_size: 12, d_model: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, d_ff: 48, max_len: 24 };
    ModelConfig { init_std, ..ModelConfig::decoder(sizes) }
}

/// A trajectory to train on: every response token trained (mask 1), sampled at log-prob -2.
// Each test crate compiles this module and uses part of it.
#[allow(dead_code)]
pub fn trajectory(prompt: Vec<u32>, response: Vec<u32>, reward: f32, advantage: f32) -> miles_runtime::Trajectory {
    miles_runtime::Trajectory {
        rollout_logprobs: vec![-2.0; response.len()],
        loss_mask: vec![1.0; response.len()],
        prompt,
        response,
        reward,
        advantage,
        group: 0,
        weight_version: 0,
        routing: None,
    }
}
