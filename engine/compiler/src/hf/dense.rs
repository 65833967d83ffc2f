//! The architectures the embedded backend loads, dense (llama, mistral, qwen2, qwen3), and the
//! attention and refusals its MoE pair (qwen3_moe, mixtral: `moe.rs`) shares with them: read as
//! engine/tch/src/hf/config.rs `parse_config` reads them.

use super::{head_dim, rope_theta, Attention, Fields, Sized};
use crate::num::Q;

/// transformers' default when config.json omits max_position_embeddings.
fn default_max_position(arch: &str) -> u64 {
    match arch {
        "llama" => 2048,
        "mistral" => 4096 * 32,
        _ => 32768,
    }
}

/// What the embedded backend would refuse of any architecture it loads.
pub(super) fn refusals(f: &Fields, arch: &str) -> Result<(), String> {
    let unsupported =
        |what: String| Err(format!("{what} is not supported (the embedded backend loads {arch} with it off)"));
    if let Some(act) = f.str("hidden_act")? {
        if act != "silu" {
            return unsupported(format!("`hidden_act` = \"{act}\" (only \"silu\")"));
        }
    }
    if f.bool("mlp_bias")? == Some(true) {
        return unsupported("`mlp_bias` = true".into());
    }
    if let Some(p) = f.number("partial_rotary_factor")? {
        if p != Q::ONE {
            return unsupported(format!("`partial_rotary_factor` = {p}"));
        }
    }
    if f.bool("use_sliding_window")? == Some(true) {
        return unsupported("`use_sliding_window` = true".into());
    }
    Ok(())
}

/// A loadable architecture's sizes with a dense MLP of `intermediate_size` in every layer; the
/// MoE pair adds its experts to this.
pub(super) fn read(f: &Fields, arch: &'static str) -> Result<Sized, String> {
    refusals(f, arch)?;
    let attention_bias = f.bool("attention_bias")?.unwrap_or(false);
    let (qkv_bias, o_bias, qk_norm) = match arch {
        // Qwen2 always has q/k/v biases and never an o_proj bias.
        "qwen2" => (true, false, false),
        "qwen3" | "qwen3_moe" => (attention_bias, attention_bias, true),
        _ => (attention_bias, attention_bias, false),
    };
    let layers = f.positive("num_hidden_layers")?;
    let d_model = f.positive("hidden_size")?;
    let heads = f.positive("num_attention_heads")?;
    let kv_heads = f.int("num_key_value_heads")?.unwrap_or(heads);
    if kv_heads == 0 {
        return Err("`num_key_value_heads` must be at least 1".into());
    }
    let d_ff = f.positive("intermediate_size")?;
    let vocab = f.positive("vocab_size")?;
    let max_pos = f.int("max_position_embeddings")?.unwrap_or(default_max_position(arch));
    // Mistral and Mixtral attend within a sliding window: up to the window, full attention is the
    // same computation, so the model is exact up to there.
    let window = if matches!(arch, "mistral" | "mixtral") { f.int("sliding_window")? } else { None };
    let max_len = window.map_or(max_pos, |w| w.min(max_pos));
    if max_len == 0 {
        return Err("`max_position_embeddings` must be at least 1".into());
    }
    let head_dim = head_dim(f, d_model, heads)?;
    if !heads.is_multiple_of(kv_heads) {
        return Err("`num_attention_heads` must be a multiple of `num_key_value_heads`".into());
    }
    Ok(Sized {
        arch,
        loadable: true,
        layers,
        d_model,
        heads,
        kv_heads,
        head_dim,
        d_ff,
        vocab,
        max_len,
        tie: f.bool("tie_word_embeddings")?.unwrap_or(false),
        qkv_bias,
        o_bias,
        qk_norm,
        rope_theta: rope_theta(f, true)?,
        // The engine's default when config.json has none.
        norm_eps: f.number("rms_norm_eps")?.unwrap_or(Q::parse_literal("1e-6").unwrap_or(Q::ZERO)),
        attention: Attention::Gqa,
        dsa: None,
        moe: None,
        sinks: false,
        mtp_layers: 0,
    })
}
