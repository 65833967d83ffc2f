//! What the tch tests share: the tiny model they all train and sample.

use miles_runtime::ModelConfig;

/// A 2-layer, 32-wide decoder over 12 tokens (GQA 4:2), every later field at today's defaults;
/// `init_std` sets how peaked its first distributions are.
pub fn tiny_config(init_std: f64) -> ModelConfig {
    ModelConfig {
        vocab_size: 12,
        d_model: 32,
        n_layers: 2,
        n_heads: 4,
        n_kv_heads: 2,
        d_ff: 48,
        max_len: 24,
        rope_theta: 10000.0,
        norm_eps: 1e-5,
        init_std,
        head_dim: None,
        qkv_bias: false,
        o_bias: false,
        qk_norm: false,
        tie_embeddings: false,
        rope_scaling: None,
    }
}
