//! Mixture-of-experts Hugging Face directories: Qwen3-MoE's and Mixtral's config.json keys read
//! into `MoeConfig` (every field whose value we cannot honour is an error naming it). Writing
//! them back, and Mixtral's tensor names, are `miles_runtime::hf_dir`'s.
//!
//! The weights are read in the Hub's per-expert form, which transformers 5's save_pretrained
//! also writes (it fuses experts into 3-D tensors only in memory).

use super::config::{err, Architecture, Fields};
use miles_runtime::{Gating, MoeConfig, RunError};

/// Mixtral's tensor names, both ways: the runtime's, shared with the workers' weight updates.
pub(crate) use miles_runtime::hf_dir::{hf_name, own_name};

/// transformers' default `router_aux_loss_coef` for both architectures.
const DEFAULT_AUX_LOSS_COEF: f64 = 0.001;

/// The config.json keys read for an MoE architecture, beyond the dense ones (docs/models.md).
pub const QWEN3_MOE_KEYS: &[&str] = &[
    "num_experts",
    "num_local_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "intermediate_size",
    "norm_topk_prob",
    "decoder_sparse_step",
    "mlp_only_layers",
    "router_aux_loss_coef",
];
pub const MIXTRAL_KEYS: &[&str] = &[
    "num_local_experts",
    "num_experts",
    "num_experts_per_tok",
    "intermediate_size",
    "router_jitter_noise",
    "router_aux_loss_coef",
];

/// The experts' count: `num_experts` (the Hub's Qwen3-MoE key) or `num_local_experts` (Mixtral's,
/// and what transformers 5 writes for both); both present must agree.
fn experts(f: &Fields) -> Result<Option<usize>, RunError> {
    match (f.usize("num_experts")?, f.usize("num_local_experts")?) {
        (Some(a), Some(b)) if a != b => {
            Err(err(f.path, format!("fields `num_experts` ({a}) and `num_local_experts` ({b}) disagree")))
        }
        (a, b) => Ok(a.or(b)),
    }
}

/// Keys of MoE designs neither architecture has: a value other than "none" is refused by name.
fn refuse_foreign(f: &Fields, arch: Architecture) -> Result<(), RunError> {
    let class = arch.class_name();
    for key in ["shared_expert_intermediate_size", "n_shared_experts"] {
        if let Some(n) = f.usize(key)? {
            if n > 0 {
                return Err(err(f.path, format!("field `{key}` = {n}: {class} has no shared expert")));
            }
        }
    }
    if let Some(s) = f.str("scoring_func")? {
        if s != "softmax" {
            return Err(err(
                f.path,
                format!("field `scoring_func` = \"{s}\" is not supported for {class} (only \"softmax\")"),
            ));
        }
    }
    Ok(())
}

/// `MoeConfig` of a Qwen3-MoE or Mixtral config.json (None for a dense architecture, and for a
/// Qwen3-MoE with `num_experts = 0`, which transformers builds with dense MLPs only).
pub(super) fn read(arch: Architecture, f: &Fields, n_layers: usize) -> Result<Option<MoeConfig>, RunError> {
    let class = arch.class_name();
    let top_k_of = |experts: usize| -> Result<usize, RunError> {
        let k = f.required("num_experts_per_tok")?;
        if k == 0 || k > experts {
            return Err(err(
                f.path,
                format!("field `num_experts_per_tok` = {k} must be in 1..={experts} (the experts)"),
            ));
        }
        Ok(k)
    };
    let aux_loss_coef = match f.f64("router_aux_loss_coef")? {
        Some(c) if c < 0.0 => return Err(err(f.path, format!("field `router_aux_loss_coef` = {c} must be >= 0"))),
        c => c.unwrap_or(DEFAULT_AUX_LOSS_COEF),
    };
    match arch {
        Architecture::Qwen3Moe => {
            refuse_foreign(f, arch)?;
            let experts = experts(f)?.ok_or_else(|| err(f.path, "missing field `num_experts`"))?;
            if experts == 0 {
                return Ok(None);
            }
            let sparse_step = f.usize("decoder_sparse_step")?.unwrap_or(1);
            if sparse_step == 0 {
                return Err(err(f.path, "field `decoder_sparse_step` must be at least 1"));
            }
            let mlp_only_layers = f.usize_list("mlp_only_layers")?;
            if let Some(&i) = mlp_only_layers.iter().find(|&&i| i >= n_layers) {
                return Err(err(f.path, format!("field `mlp_only_layers` names layer {i}, of {n_layers} layers")));
            }
            let expert_d_ff = f.required("moe_intermediate_size")?;
            if expert_d_ff == 0 {
                return Err(err(f.path, "field `moe_intermediate_size` must be at least 1"));
            }
            Ok(Some(MoeConfig {
                experts,
                top_k: top_k_of(experts)?,
                expert_d_ff,
                shared_expert_d_ff: 0,
                dense_layers: 0,
                mlp_only_layers,
                sparse_step,
                gating: Gating::Softmax,
                // transformers' default for Qwen3-MoE (the published checkpoints set it true).
                norm_topk: f.bool("norm_topk_prob")?.unwrap_or(false),
                aux_loss_coef,
            }))
        }
        Architecture::Mixtral => {
            refuse_foreign(f, arch)?;
            if let Some(j) = f.f64("router_jitter_noise")? {
                if j != 0.0 {
                    return Err(err(
                        f.path,
                        format!("field `router_jitter_noise` = {j} is not supported for {class} (only 0: the trainer does not jitter router inputs)"),
                    ));
                }
            }
            let layers = f.usize_list("mlp_only_layers")?;
            if !layers.is_empty() {
                return Err(err(
                    f.path,
                    format!("field `mlp_only_layers` = {layers:?}: {class} has experts in every layer"),
                ));
            }
            if f.bool("norm_topk_prob")? == Some(false) {
                return Err(err(
                    f.path,
                    format!("field `norm_topk_prob` = false: {class} always renormalises the top-k weights"),
                ));
            }
            let experts = experts(f)?.ok_or_else(|| err(f.path, "missing field `num_local_experts`"))?;
            if experts == 0 {
                return Err(err(f.path, "field `num_local_experts` must be at least 1"));
            }
            Ok(Some(MoeConfig {
                experts,
                top_k: top_k_of(experts)?,
                expert_d_ff: f.required("intermediate_size")?,
                shared_expert_d_ff: 0,
                dense_layers: 0,
                mlp_only_layers: Vec::new(),
                sparse_step: 1,
                gating: Gating::Softmax,
                norm_topk: true,
                aux_loss_coef,
            }))
        }
        Architecture::Llama | Architecture::Mistral | Architecture::Qwen2 | Architecture::Qwen3 => Ok(None),
    }
}
