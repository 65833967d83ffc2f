//! A PEFT LoRA adapter directory (`adapter_config.json` + `adapter_model.safetensors`), read at
//! check time for `lora { init = DIR }`: the config's rank, alpha, dropout and target modules,
//! and the tensors' names and shapes from the safetensors header alone (no tensor data), so
//! `miles check` refuses what the trainer's loader (engine/tch/src/lora.rs `read_peft`) would:
//! another adapter type, a rank or targets the recipe does not say, or an adapter made for
//! another base model. Pure: files come through the `FileSystem`.

use crate::fs::{join, FileSystem};
use crate::num::Q;
use serde_json::Value as Json;
use std::collections::BTreeMap;

/// The linear layers LoRA wraps, in std/prelude's `LoraTarget` order, with the block PEFT's
/// tensor names put them in.
pub const TARGETS: [(&str, &str); 7] = [
    ("q_proj", "self_attn"),
    ("k_proj", "self_attn"),
    ("v_proj", "self_attn"),
    ("o_proj", "self_attn"),
    ("gate_proj", "mlp"),
    ("up_proj", "mlp"),
    ("down_proj", "mlp"),
];

pub const CONFIG: &str = "adapter_config.json";
pub const WEIGHTS: &str = "adapter_model.safetensors";

/// safetensors' own bound on a header (the format refuses larger ones).
const MAX_HEADER: u64 = 100 << 20;

/// What `lora { init }` reads from an adapter directory.
#[derive(Clone, Debug, PartialEq)]
pub struct Adapter {
    pub rank: u64,
    pub alpha: Q,
    pub dropout: Q,
    /// In `TARGETS` order.
    pub target_modules: Vec<String>,
    pub base_model: Option<String>,
    /// Layers covered: every layer 0..layers has an A and a B for every target.
    pub layers: u64,
    /// (target, "lora_A" | "lora_B") -> the shape, the same in every layer.
    pub shapes: BTreeMap<(String, String), Vec<u64>>,
    /// The weights file, for errors.
    pub weights: String,
}

/// The sizes of the model an adapter must fit.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ModelSizes {
    pub layers: u64,
    pub d_model: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
    pub d_ff: u64,
}

impl ModelSizes {
    /// (out, in) of `target`'s weight, as the trainer lays them out (engine/tch/src/lora.rs).
    fn shape(&self, target: &str) -> (u64, u64) {
        let (d, q, kv) = (self.d_model, self.heads * self.head_dim, self.kv_heads * self.head_dim);
        match target {
            "q_proj" => (q, d),
            "k_proj" | "v_proj" => (kv, d),
            "o_proj" => (d, q),
            "gate_proj" | "up_proj" => (self.d_ff, d),
            _ => (d, self.d_ff),
        }
    }
}

/// Reads `dir`'s adapter. The error names the file and the key or tensor.
pub fn read(fs: &dyn FileSystem, dir: &str) -> Result<Adapter, String> {
    let cfg_path = join(dir, CONFIG);
    let bytes = fs.read(&cfg_path).map_err(|e| format!("cannot read {cfg_path}: {e}"))?;
    let cfg: Json = serde_json::from_slice(&bytes).map_err(|e| format!("{cfg_path} is not valid JSON: {e}"))?;
    let bad = |why: String| format!("{cfg_path}: {why}");
    let Some(c) = cfg.as_object() else { return Err(bad("not a JSON object".into())) };
    let get = |k: &str| c.get(k).filter(|v| !v.is_null());
    if get("peft_type").and_then(Json::as_str) != Some("LORA") {
        return Err(bad(format!(
            "`peft_type` is {}: only LoRA adapters (\"LORA\") are supported",
            get("peft_type").map_or("missing".into(), Json::to_string)
        )));
    }
    for flag in ["use_dora", "use_rslora", "fan_in_fan_out"] {
        if get(flag).and_then(Json::as_bool) == Some(true) {
            return Err(bad(format!("`{flag}` = true is not supported (plain LoRA only)")));
        }
    }
    if let Some(b) = get("bias").filter(|b| b.as_str() != Some("none")) {
        return Err(bad(format!("`bias` = {b} is not supported (only \"none\": no trained biases)")));
    }
    for key in ["modules_to_save", "layers_to_transform", "layers_pattern", "layer_replication"] {
        if get(key).is_some_and(|v| !(v.as_array().is_some_and(|a| a.is_empty()))) {
            return Err(bad(format!("`{key}` = {} is not supported (every layer, adapters only)", c[key])));
        }
    }
    for key in ["rank_pattern", "alpha_pattern"] {
        if get(key).is_some_and(|v| !(v.as_object().is_some_and(|o| o.is_empty()))) {
            return Err(bad(format!("`{key}` is not supported (one rank and alpha for every module)")));
        }
    }
    let rank =
        get("r").and_then(Json::as_u64).filter(|r| *r > 0).ok_or_else(|| bad("no positive integer `r`".into()))?;
    let number = |k: &str, default: Option<Q>| -> Result<Q, String> {
        match get(k) {
            None => default.ok_or_else(|| bad(format!("no `{k}`"))),
            Some(Json::Number(n)) => {
                Q::parse_literal(&n.to_string()).ok_or_else(|| bad(format!("`{k}` must be a number >= 0, found {n}")))
            }
            Some(v) => Err(bad(format!("`{k}` must be a number, found {v}"))),
        }
    };
    let alpha = number("lora_alpha", None)?;
    let dropout = number("lora_dropout", Some(Q::int(0)))?;
    let names: Vec<String> = match get("target_modules") {
        Some(Json::Array(a)) => a
            .iter()
            .map(|v| v.as_str().map(str::to_string).ok_or_else(|| bad(format!("`target_modules` holds {v}"))))
            .collect::<Result<_, _>>()?,
        Some(Json::String(s)) => {
            return Err(bad(format!(
                "`target_modules` is the pattern \"{s}\": list the module names (q_proj, k_proj, ...)"
            )))
        }
        _ => return Err(bad("no `target_modules` list".into())),
    };
    if let Some(x) = names.iter().find(|n| !TARGETS.iter().any(|(t, _)| t == n)) {
        return Err(bad(format!(
            "target module `{x}` is not one LoRA can wrap here ({})",
            TARGETS.map(|(t, _)| t).join(", ")
        )));
    }
    let target_modules: Vec<String> =
        TARGETS.iter().filter(|(t, _)| names.iter().any(|n| n == t)).map(|(t, _)| t.to_string()).collect();
    if target_modules.is_empty() {
        return Err(bad("`target_modules` is empty".into()));
    }
    let weights = join(dir, WEIGHTS);
    let header = header(fs, &weights)?;
    let (layers, shapes) = tensor_layout(&header, &target_modules, rank, &weights)?;
    Ok(Adapter {
        rank,
        alpha,
        dropout,
        target_modules,
        base_model: get("base_model_name_or_path").and_then(Json::as_str).map(str::to_string),
        layers,
        shapes,
        weights,
    })
}

/// The safetensors header: tensor name -> shape.
fn header(fs: &dyn FileSystem, path: &str) -> Result<BTreeMap<String, Vec<u64>>, String> {
    let head = fs.read_prefix(path, 8).map_err(|e| format!("cannot read {path}: {e}"))?;
    let Ok(len) = <[u8; 8]>::try_from(head.as_slice()) else {
        return Err(format!("{path} is not a safetensors file (shorter than its 8-byte header length)"));
    };
    let len = u64::from_le_bytes(len);
    if len > MAX_HEADER {
        return Err(format!("{path} is not a safetensors file (a header of {len} bytes)"));
    }
    let bytes = fs.read_prefix(path, 8 + len as usize).map_err(|e| format!("cannot read {path}: {e}"))?;
    let text =
        bytes.get(8..).filter(|b| b.len() as u64 == len).ok_or_else(|| format!("{path} ends inside its header"))?;
    let json: Json = serde_json::from_slice(text).map_err(|e| format!("{path}: the header is not valid JSON: {e}"))?;
    let Some(o) = json.as_object() else { return Err(format!("{path}: the header is not a JSON object")) };
    let mut out = BTreeMap::new();
    for (name, v) in o.iter().filter(|(n, _)| *n != "__metadata__") {
        let shape = v
            .get("shape")
            .and_then(Json::as_array)
            .and_then(|a| a.iter().map(Json::as_u64).collect::<Option<Vec<u64>>>())
            .ok_or_else(|| format!("{path}: tensor {name} has no shape"))?;
        out.insert(name.clone(), shape);
    }
    Ok(out)
}

/// Checks the tensors are exactly PEFT's A and B of each target in layers 0..L with rank `rank`
/// (`base_model.model.model.layers.{l}.{block}.{target}.lora_{A|B}.weight`), and returns L and
/// the per-target shapes.
#[allow(clippy::type_complexity)]
fn tensor_layout(
    header: &BTreeMap<String, Vec<u64>>,
    targets: &[String],
    rank: u64,
    path: &str,
) -> Result<(u64, BTreeMap<(String, String), Vec<u64>>), String> {
    let mut layers = 0;
    let mut shapes: BTreeMap<(String, String), Vec<u64>> = BTreeMap::new();
    for (name, shape) in header {
        let parsed = name.strip_prefix("base_model.model.model.layers.").and_then(|rest| {
            let (layer, rest) = rest.split_once('.')?;
            let layer: u64 = layer.parse().ok()?;
            let (block, rest) = rest.split_once('.')?;
            let (target, rest) = rest.split_once('.')?;
            let which = rest.strip_suffix(".weight")?;
            let known = TARGETS.iter().any(|(t, b)| *t == target && *b == block);
            (known && (which == "lora_A" || which == "lora_B")).then(|| (layer, target.to_string(), which.to_string()))
        });
        let Some((layer, target, which)) = parsed else {
            return Err(format!("{path}: tensor {name} is not a LoRA A or B of a decoder layer"));
        };
        if !targets.contains(&target) {
            return Err(format!(
                "{path}: tensor {name} wraps {target}, which adapter_config.json's target_modules lacks"
            ));
        }
        let r_at = if which == "lora_A" { 0 } else { 1 };
        if shape.len() != 2 || shape[r_at] != rank {
            return Err(format!(
                "{path}: tensor {name} has shape {shape:?}, not rank r = {rank} (adapter_config.json)"
            ));
        }
        layers = layers.max(layer + 1);
        match shapes.get(&(target.clone(), which.clone())) {
            Some(s) if s != shape => {
                return Err(format!(
                    "{path}: tensor {name} has shape {shape:?}, the other layers' {which} of {target} {s:?}"
                ))
            }
            _ => {
                shapes.insert((target, which), shape.clone());
            }
        }
    }
    let want = layers as usize * targets.len() * 2;
    if header.len() != want || layers == 0 {
        // Some layer lacks a tensor: name the first.
        for l in 0..layers.max(1) {
            for (t, b) in TARGETS.iter().filter(|(t, _)| targets.iter().any(|x| x == t)) {
                for which in ["lora_A", "lora_B"] {
                    let n = format!("base_model.model.model.layers.{l}.{b}.{t}.{which}.weight");
                    if !header.contains_key(&n) {
                        return Err(format!("{path}: no tensor {n}"));
                    }
                }
            }
        }
    }
    Ok((layers, shapes))
}

impl Adapter {
    /// Whether the adapter fits a model of `m`'s sizes; the error names the tensor and says what
    /// the model needs.
    pub fn fits(&self, m: &ModelSizes) -> Result<(), String> {
        if self.layers != m.layers {
            return Err(format!(
                "{} has adapters for {} layers, the model has {}: an adapter made for another base model",
                self.weights, self.layers, m.layers
            ));
        }
        for ((target, which), shape) in &self.shapes {
            let (out, inp) = m.shape(target);
            let want = if which == "lora_A" { vec![self.rank, inp] } else { vec![out, self.rank] };
            if *shape != want {
                let block = TARGETS.iter().find(|(t, _)| t == target).map_or("", |(_, b)| b);
                return Err(format!(
                    "{}: tensor base_model.model.model.layers.0.{block}.{target}.{which}.weight has shape {shape:?}, \
                     the model's {target} needs {want:?} (d_model {}, heads {} x head_dim {}, kv_heads {}, d_ff {}): \
                     an adapter made for another base model",
                    self.weights, m.d_model, m.heads, m.head_dim, m.kv_heads, m.d_ff
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::{DiskFs, MemoryFs};

    fn fixture() -> String {
        format!("{}/../../tests/fixtures/peft/llama-r4", env!("CARGO_MANIFEST_DIR"))
    }

    /// tests/fixtures/hf/llama's sizes (its config.json).
    const LLAMA: ModelSizes = ModelSizes { layers: 2, d_model: 64, heads: 4, kv_heads: 2, head_dim: 16, d_ff: 96 };

    #[test]
    fn reads_the_peft_fixture() {
        let a = read(&DiskFs, &fixture()).unwrap();
        assert_eq!(a.rank, 4);
        assert_eq!(a.alpha, Q::int(8));
        assert_eq!(a.dropout, Q::int(0));
        assert_eq!(a.target_modules, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]);
        assert_eq!(a.base_model.as_deref(), Some("../../hf/llama"));
        assert_eq!(a.layers, 2);
        assert_eq!(a.shapes[&("k_proj".to_string(), "lora_B".to_string())], vec![32, 4]);
        a.fits(&LLAMA).unwrap();
    }

    #[test]
    fn refuses_another_base() {
        let a = read(&DiskFs, &fixture()).unwrap();
        let e = a.fits(&ModelSizes { layers: 3, ..LLAMA }).unwrap_err();
        assert!(
            e.ends_with("has adapters for 2 layers, the model has 3: an adapter made for another base model"),
            "{e}"
        );
        let e = a.fits(&ModelSizes { d_model: 96, ..LLAMA }).unwrap_err();
        assert!(e.contains("tensor base_model.model.model.layers.0.mlp.down_proj.lora_B.weight has shape [64, 4], the model's down_proj needs [96, 4]"), "{e}");
    }

    /// A directory in memory: `cfg` as adapter_config.json and a header of `tensors`.
    fn adapter(cfg: &str, tensors: &[(&str, [u64; 2])]) -> MemoryFs {
        let mut h = serde_json::Map::new();
        h.insert("__metadata__".into(), serde_json::json!({"format": "pt"}));
        for (n, s) in tensors {
            h.insert(n.to_string(), serde_json::json!({"dtype": "F32", "shape": s, "data_offsets": [0, 0]}));
        }
        let text = serde_json::to_vec(&h).unwrap();
        let mut bytes = (text.len() as u64).to_le_bytes().to_vec();
        bytes.extend(text);
        let fs = MemoryFs::with(&[("a/adapter_config.json", cfg)]);
        fs.insert("a/adapter_model.safetensors", bytes);
        fs
    }

    const Q0A: &str = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight";
    const Q0B: &str = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight";

    #[test]
    fn errors_name_the_file_and_key() {
        let ok = r#"{"peft_type": "LORA", "r": 2, "lora_alpha": 4, "target_modules": ["q_proj"]}"#;
        let fs = adapter(ok, &[(Q0A, [2, 64]), (Q0B, [64, 2])]);
        assert_eq!(read(&fs, "a").unwrap().layers, 1);
        let err = |cfg: &str, t: &[(&str, [u64; 2])]| read(&adapter(cfg, t), "a").unwrap_err();
        let one = [(Q0A, [2, 64]), (Q0B, [64, 2])];
        assert_eq!(
            err(&ok.replace("LORA", "IA3"), &one),
            "a/adapter_config.json: `peft_type` is \"IA3\": only LoRA adapters (\"LORA\") are supported"
        );
        assert_eq!(
            err(&ok.replace("\"r\": 2", "\"r\": 2, \"use_dora\": true"), &one),
            "a/adapter_config.json: `use_dora` = true is not supported (plain LoRA only)"
        );
        assert!(err(&ok.replace("[\"q_proj\"]", "\"q_proj|v_proj\""), &one).contains("is the pattern"));
        assert!(err(&ok.replace("q_proj\"]", "q_proj\", \"lm_head\"]"), &one).contains("target module `lm_head`"));
        assert_eq!(
            err(ok, &[(Q0A, [3, 64]), (Q0B, [64, 2])]),
            format!(
                "a/adapter_model.safetensors: tensor {Q0A} has shape [3, 64], not rank r = 2 (adapter_config.json)"
            )
        );
        assert_eq!(err(ok, &[(Q0A, [2, 64])]), format!("a/adapter_model.safetensors: no tensor {Q0B}"));
        let e = read(&MemoryFs::new(), "a").unwrap_err();
        assert_eq!(e, "cannot read a/adapter_config.json: no such file");
    }
}
