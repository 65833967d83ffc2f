//! Weights of a Hugging Face directory into a `Policy`: one model.safetensors, or the shards
//! that model.safetensors.index.json lists. Names and shapes are checked against config.json
//! before any tensor is used.

use super::config::{parse_config, HfConfig};
use super::{HfMeta, CARRIED_FILES};
use crate::model::{backend_err, open, param_names, param_shape, read_entry, Policy};
use miles_runtime::safetensors::{Dtype, Entry, Header};
use miles_runtime::{RunError, E_CHECKPOINT};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use tch::{Kind, Tensor};

const SINGLE: &str = "model.safetensors";
const INDEX: &str = "model.safetensors.index.json";

fn err(path: &Path, msg: impl std::fmt::Display) -> RunError {
    RunError::new(E_CHECKPOINT, format!("{}: {msg}", path.display()))
}

pub(super) fn load(dir: &Path, max_len: Option<usize>) -> Result<(Policy, HfMeta), RunError> {
    let cpath = dir.join("config.json");
    let text = std::fs::read_to_string(&cpath).map_err(|e| RunError::io(E_CHECKPOINT, "cannot read", &cpath, e))?;
    let hc = parse_config(&cpath, &text)?;
    let mut cfg = hc.model.clone();
    if let Some(n) = max_len {
        if n == 0 || n > cfg.max_len {
            return Err(err(
                &cpath,
                format!(
                    "max_len {n} is outside 1..={} (max_position_embeddings, or Mistral's sliding_window)",
                    cfg.max_len
                ),
            ));
        }
        cfg.max_len = n;
    }
    let found = locate_weights(dir)?;
    let params = match_params(&cfg, &hc, found)?;
    let meta = meta(dir, &hc)?;
    Ok((Policy::from_params(cfg, params), meta))
}

/// A tensor's checked header entry and the file it is in.
struct Located {
    entry: Entry,
    file: PathBuf,
}

/// The checked header of one weights file (nothing of its data is read).
fn read_header(path: &Path) -> Result<Header, RunError> {
    if !path.is_file() {
        return Err(err(path, "missing (weights file)"));
    }
    miles_runtime::safetensors::read_file_header(path)
}

/// Where each tensor of the directory is: headers only, so that names, shapes and dtypes are
/// checked against config.json before any tensor is allocated.
fn locate_weights(dir: &Path) -> Result<HashMap<String, Located>, RunError> {
    let single = dir.join(SINGLE);
    let index = dir.join(INDEX);
    let mut out = HashMap::new();
    if single.is_file() {
        for entry in read_header(&single)?.entries {
            out.insert(entry.name.clone(), Located { entry, file: single.clone() });
        }
        return Ok(out);
    }
    if !index.is_file() {
        return Err(err(
            dir,
            format!("no {SINGLE} or {INDEX} (only safetensors weights are read; convert pytorch_model.bin first)"),
        ));
    }
    let text = std::fs::read_to_string(&index).map_err(|e| RunError::io(E_CHECKPOINT, "cannot read", &index, e))?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| err(&index, format!("not valid JSON: {e}")))?;
    let map =
        v.get("weight_map").and_then(|m| m.as_object()).ok_or_else(|| err(&index, "missing object `weight_map`"))?;
    // shard file -> tensors the index puts there
    let mut shards: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, file) in map {
        let file = file.as_str().ok_or_else(|| err(&index, format!("weight_map entry `{name}` is not a file name")))?;
        if file.contains('/') || file.contains('\\') || file == ".." {
            return Err(err(
                &index,
                format!("weight_map entry `{name}`: shard `{file}` is not a file of this directory"),
            ));
        }
        shards.entry(file.to_string()).or_default().push(name.clone());
    }
    for (file, names) in shards {
        let path = dir.join(&file);
        if !path.is_file() {
            return Err(err(&path, format!("missing (a shard listed in {INDEX}, holding `{}`)", names[0])));
        }
        let mut got: HashMap<String, Entry> =
            read_header(&path)?.entries.into_iter().map(|e| (e.name.clone(), e)).collect();
        for name in names {
            let entry = got
                .remove(&name)
                .ok_or_else(|| err(&path, format!("tensor `{name}` is listed here by {INDEX} but absent")))?;
            out.insert(name, Located { entry, file: path.clone() });
        }
    }
    Ok(out)
}

/// Every parameter `cfg` implies, in `param_names` order, converted to fp32; anything missing,
/// misshapen, of another dtype or left over is an error naming file and tensor (by the name the
/// directory uses: Mixtral's for a Mixtral), found from the headers before any data is read.
fn match_params(
    cfg: &miles_runtime::ModelConfig,
    hc: &HfConfig,
    mut found: HashMap<String, Located>,
) -> Result<Vec<(String, Tensor)>, RunError> {
    let arch = hc.architecture.class_name();
    let mut wanted = Vec::new();
    for own in param_names(cfg) {
        let name = super::moe::hf_name(hc.architecture, &own);
        let Some(r) = found.remove(&name) else {
            // transformers 5 holds experts fused in memory; a directory saved in that form
            // (rather than save_pretrained's per-expert one) says so instead of a bare "missing".
            let fused = found.keys().filter(|n| n.ends_with("experts.gate_up_proj")).min().map(|n| {
                format!(
                    "; `{n}` is the fused 3-D form, which is not read: save it per expert as the Hub's checkpoints are"
                )
            });
            let files: std::collections::BTreeSet<String> =
                found.values().map(|r| r.file.display().to_string()).collect();
            let files: Vec<String> = files.into_iter().collect();
            return Err(RunError::new(
                E_CHECKPOINT,
                format!(
                    "tensor `{name}` is missing (config.json describes a {arch} that has it; read {}){}",
                    files.join(", "),
                    fused.unwrap_or_default()
                ),
            ));
        };
        let want = param_shape(cfg, &own);
        let shape: Vec<i64> = r.entry.shape.iter().map(|&d| d as i64).collect();
        if shape != want {
            return Err(err(&r.file, format!("tensor `{name}` has shape {shape:?}, config.json implies {want:?}")));
        }
        if !matches!(r.entry.dtype, Dtype::F32 | Dtype::BF16 | Dtype::F16) {
            let d = r.entry.dtype.name();
            return Err(err(&r.file, format!("tensor `{name}` has dtype {d}; bf16, fp16 or fp32 are read")));
        }
        wanted.push((own, r));
    }
    // Rotary tables are recomputed; a tied model may still store its lm_head.
    let ignored =
        |name: &str| name.ends_with("rotary_emb.inv_freq") || (cfg.tie_embeddings && name == "lm_head.weight");
    found.retain(|name, _| !ignored(name));
    if let Some((name, r)) = found.iter().min_by(|a, b| a.0.cmp(b.0)) {
        return Err(err(&r.file, format!("unexpected tensor `{name}` (not part of a {arch} with this config.json)")));
    }
    // Every claim checked: now the data, one tensor at a time (each file opened once).
    let mut files: HashMap<PathBuf, std::fs::File> = HashMap::new();
    let mut params = Vec::with_capacity(wanted.len());
    for (name, r) in wanted {
        let file = match files.entry(r.file.clone()) {
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => v.insert(open(&r.file)?),
        };
        let t = read_entry(file, &r.file, &r.entry)?;
        let t = if t.kind() == Kind::Float { t } else { t.f_to_kind(Kind::Float).map_err(backend_err)? };
        params.push((name, t));
    }
    Ok(params)
}

fn meta(dir: &Path, hc: &HfConfig) -> Result<HfMeta, RunError> {
    let mut eos = hc.eos_token_ids.clone();
    let gpath = dir.join("generation_config.json");
    if gpath.is_file() {
        let text = std::fs::read_to_string(&gpath).map_err(|e| RunError::io(E_CHECKPOINT, "cannot read", &gpath, e))?;
        let g: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| err(&gpath, format!("not valid JSON: {e}")))?;
        let ids = match g.get("eos_token_id") {
            Some(serde_json::Value::Array(a)) => a.iter().filter_map(|v| v.as_i64()).collect(),
            Some(v) => v.as_i64().into_iter().collect(),
            None => vec![],
        };
        for id in ids {
            if !eos.contains(&id) {
                eos.push(id);
            }
        }
    }
    Ok(HfMeta {
        dir: dir.to_path_buf(),
        architecture: hc.architecture,
        config: hc.raw.clone(),
        max_position_embeddings: hc.max_position_embeddings,
        bos_token_id: hc.bos_token_id,
        eos_token_ids: eos,
        pad_token_id: hc.pad_token_id,
        dtype: hc.dtype.clone(),
        carried_files: CARRIED_FILES.iter().filter(|f| dir.join(f).is_file()).map(|f| f.to_string()).collect(),
    })
}
