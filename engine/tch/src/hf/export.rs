//! A policy out as a Hugging Face directory, atomically: everything is written into a temp
//! directory beside the target, which is then renamed into place. An MoE policy is written as
//! the transformers architecture that holds it (qwen3_moe or mixtral, Mixtral under its own
//! tensor names); one that no transformers class holds is refused, naming why.

use super::config::{config_json, Architecture};
use super::HfMeta;
use crate::model::{write_tensors, Policy};
use miles_runtime::{RunError, E_CHECKPOINT};
use std::fs;
use std::path::Path;

pub(super) fn export(policy: &Policy, dir: &Path, source: Option<&HfMeta>) -> Result<(), RunError> {
    miles_runtime::atomic_write::write_dir_atomically(dir, |tmp| fill(policy, tmp, source))
}

/// With LoRA attached, `tmp` gets the merged model, and beside it `adapter/` (PEFT's adapter
/// directory) and `base/` (the frozen base the adapter applies to, as a Hugging Face directory).
pub(crate) fn fill(policy: &Policy, tmp: &Path, source: Option<&HfMeta>) -> Result<(), RunError> {
    if policy.adapters().len() > 1 {
        // Several adapters: the base itself, and one PEFT directory per adapter.
        let mut base = policy.deep_copy();
        base.set_adapters(Vec::new());
        let root = tmp.join("adapters");
        fs::create_dir(&root).map_err(|e| RunError::io(E_CHECKPOINT, "cannot create", &root, e))?;
        for l in policy.adapters() {
            let d = root.join(l.name.as_deref().unwrap_or("default"));
            fs::create_dir(&d).map_err(|e| RunError::io(E_CHECKPOINT, "cannot create", &d, e))?;
            l.write_peft(&d, Some("../.."))?;
        }
        return fill(&base, tmp, source);
    }
    if let Some(l) = policy.lora() {
        let mut base = policy.deep_copy();
        base.set_adapters(Vec::new());
        let (base_dir, adapter_dir) = (tmp.join("base"), tmp.join("adapter"));
        for d in [&base_dir, &adapter_dir] {
            fs::create_dir(d).map_err(|e| RunError::io(E_CHECKPOINT, "cannot create", d, e))?;
        }
        fill(&base, &base_dir, source)?;
        l.write_peft(&adapter_dir, Some("../base"))?;
        return fill(&policy.merged(), tmp, source);
    }
    // What the directory says it is: the source's own config.json, so every field transformers
    // knows and we do not survives (only the dtype changes: the weights are written in fp32), or
    // one written from the policy's config, refused when no transformers class holds the model.
    let (config, arch) = match source {
        Some(src) => (miles_runtime::hf_dir::float32_config(&src.config), src.architecture),
        None => config_json(&policy.cfg)?,
    };
    write_weights(policy, tmp, arch)?;
    miles_runtime::exec::write_json(&tmp.join("config.json"), &config)?;
    let Some(src) = source else { return Ok(()) };
    for f in &src.carried_files {
        let (from, to) = (src.dir.join(f), tmp.join(f));
        fs::copy(&from, &to).map_err(|e| RunError::io(E_CHECKPOINT, "cannot copy", &from, e))?;
    }
    Ok(())
}

/// model.safetensors (fp32) into `dir`, each parameter under `arch`'s name for it (Mixtral's
/// `block_sparse_moe` names; the model's own for every other architecture).
pub(crate) fn write_weights(policy: &Policy, dir: &Path, arch: Architecture) -> Result<(), RunError> {
    let named: Vec<(String, tch::Tensor)> =
        policy.params().iter().map(|(n, t)| (super::moe::hf_name(arch, n), t.detach())).collect();
    write_tensors(&named, &dir.join("model.safetensors"))
}
