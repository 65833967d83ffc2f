//! A policy out as a Hugging Face directory, atomically: everything is written into a temp
//! directory beside the target, which is then renamed into place.

use super::HfMeta;
use crate::model::Policy;
use miles_runtime::{RunError, E_CHECKPOINT};
use serde_json::Value;
use std::fs;
use std::path::Path;

pub(super) fn export(policy: &Policy, dir: &Path, source: Option<&HfMeta>) -> Result<(), RunError> {
    let io = |what: &str, p: &Path, e: std::io::Error| RunError::io(E_CHECKPOINT, what, p, e);
    let name = dir.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_else(|| "model".into());
    let parent = match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => Path::new(".").to_path_buf(),
    };
    fs::create_dir_all(&parent).map_err(|e| io("cannot create", &parent, e))?;
    let tmp = parent.join(format!(".{name}.tmp-{}", std::process::id()));
    let old = parent.join(format!(".{name}.old-{}", std::process::id()));
    let _ = fs::remove_dir_all(&tmp);
    fs::create_dir(&tmp).map_err(|e| io("cannot create", &tmp, e))?;
    let filled = fill(policy, &tmp, source);
    if let Err(e) = filled {
        let _ = fs::remove_dir_all(&tmp);
        return Err(e);
    }
    // A directory cannot be renamed over a non-empty one: move the old one aside first.
    let had_old = dir.exists();
    if had_old {
        let _ = fs::remove_dir_all(&old);
        fs::rename(dir, &old).map_err(|e| io("cannot replace", dir, e))?;
    }
    if let Err(e) = fs::rename(&tmp, dir) {
        if had_old {
            let _ = fs::rename(&old, dir);
        }
        let _ = fs::remove_dir_all(&tmp);
        return Err(io("cannot write", dir, e));
    }
    if had_old {
        let _ = fs::remove_dir_all(&old);
    }
    Ok(())
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
    policy.save(tmp)?;
    let Some(src) = source else { return Ok(()) };
    // The source's own config.json, so every field transformers knows and we do not survives;
    // only the dtype changes, since the weights are written in fp32.
    let mut config = src.config.clone();
    if let Value::Object(m) = &mut config {
        let key = if m.contains_key("dtype") && !m.contains_key("torch_dtype") { "dtype" } else { "torch_dtype" };
        m.insert(key.into(), Value::from("float32"));
    }
    miles_runtime::exec::write_json(&tmp.join("config.json"), &config)?;
    for f in &src.carried_files {
        let (from, to) = (src.dir.join(f), tmp.join(f));
        fs::copy(&from, &to).map_err(|e| RunError::io(E_CHECKPOINT, "cannot copy", &from, e))?;
    }
    Ok(())
}
