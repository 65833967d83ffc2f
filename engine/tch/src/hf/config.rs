//! config.json <-> `ModelConfig`. Reads both forms transformers writes: 4.x (`rope_theta`,
//! `rope_scaling`, `torch_dtype`) and 5.x (`rope_parameters`, `dtype`). The MoE keys of
//! Qwen3-MoE and Mixtral are read by `super::moe`. Writing one (`config_json`) and the
//! architecture a `ModelConfig` is written as live in `miles_runtime::hf_dir`, shared with the
//! workers' weight updates through disk.

use super::moe;
use miles_runtime::{ModelConfig, RopeScaling, RunError, E_CHECKPOINT};
use serde_json::{Map, Value};
use std::path::Path;

pub use miles_runtime::hf_dir::{config_json, Architecture};

/// config.json, read.
#[derive(Debug, Clone)]
pub struct HfConfig {
    pub architecture: Architecture,
    /// max_len = max_position_embeddings (or the sliding window, where it is smaller).
    pub model: ModelConfig,
    pub max_position_embeddings: usize,
    pub bos_token_id: Option<i64>,
    pub eos_token_ids: Vec<i64>,
    pub pad_token_id: Option<i64>,
    pub dtype: Option<String>,
    pub raw: Value,
}

pub(super) fn err(path: &Path, msg: impl std::fmt::Display) -> RunError {
    RunError::new(E_CHECKPOINT, format!("{}: {msg}", path.display()))
}

/// A config.json object with typed, path-naming getters. JSON null counts as absent.
pub(super) struct Fields<'a> {
    pub(super) path: &'a Path,
    map: &'a Map<String, Value>,
}

impl Fields<'_> {
    fn get(&self, key: &str) -> Option<&Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    /// A list of non-negative integers (absent: empty).
    pub(super) fn usize_list(&self, key: &str) -> Result<Vec<usize>, RunError> {
        let bad =
            |v: &Value| err(self.path, format!("field `{key}` must be a list of non-negative integers, found {v}"));
        match self.get(key) {
            None => Ok(vec![]),
            Some(Value::Array(a)) => a.iter().map(|v| v.as_u64().map(|n| n as usize).ok_or_else(|| bad(v))).collect(),
            Some(v) => Err(bad(v)),
        }
    }

    pub(super) fn usize(&self, key: &str) -> Result<Option<usize>, RunError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .map(|n| Some(n as usize))
                .ok_or_else(|| err(self.path, format!("field `{key}` must be a non-negative integer, found {v}"))),
        }
    }

    pub(super) fn required(&self, key: &str) -> Result<usize, RunError> {
        self.usize(key)?.ok_or_else(|| err(self.path, format!("missing field `{key}`")))
    }

    pub(super) fn f64(&self, key: &str) -> Result<Option<f64>, RunError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => {
                v.as_f64().map(Some).ok_or_else(|| err(self.path, format!("field `{key}` must be a number, found {v}")))
            }
        }
    }

    pub(super) fn bool(&self, key: &str) -> Result<Option<bool>, RunError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| err(self.path, format!("field `{key}` must be true or false, found {v}"))),
        }
    }

    pub(super) fn str(&self, key: &str) -> Result<Option<&str>, RunError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => {
                v.as_str().map(Some).ok_or_else(|| err(self.path, format!("field `{key}` must be a string, found {v}")))
            }
        }
    }

    /// An id or a list of ids (eos_token_id may be either).
    fn ids(&self, key: &str) -> Result<Vec<i64>, RunError> {
        let bad = |v: &Value| err(self.path, format!("field `{key}` must be a token id or a list of them, found {v}"));
        match self.get(key) {
            None => Ok(vec![]),
            Some(Value::Array(a)) => a.iter().map(|v| v.as_i64().ok_or_else(|| bad(v))).collect(),
            Some(v) => Ok(vec![v.as_i64().ok_or_else(|| bad(v))?]),
        }
    }
}

fn architecture(f: &Fields) -> Result<Architecture, RunError> {
    let supported = || Architecture::ALL.map(|a| a.class_name()).join(", ");
    if let Some(v) = f.get("architectures") {
        let names: Vec<&str> = v.as_array().map(|a| a.iter().filter_map(|x| x.as_str()).collect()).unwrap_or_default();
        return names
            .iter()
            .find_map(|n| Architecture::ALL.into_iter().find(|a| a.class_name() == *n))
            .ok_or_else(|| err(f.path, format!("field `architectures` is {v}: supported are {}", supported())));
    }
    match f.str("model_type")? {
        Some(t) => Architecture::ALL
            .into_iter()
            .find(|a| a.model_type() == t)
            .ok_or_else(|| err(f.path, format!("field `model_type` is \"{t}\": supported are {}", supported()))),
        None => Err(err(f.path, "neither `architectures` nor `model_type` says which model this is")),
    }
}

/// (rope_theta, rope_scaling) from either form.
fn rope(f: &Fields) -> Result<(f64, Option<RopeScaling>), RunError> {
    let (key, params) = match (f.get("rope_scaling"), f.get("rope_parameters")) {
        (Some(s), _) => ("rope_scaling", Some(s)),
        (None, Some(p)) => ("rope_parameters", Some(p)),
        (None, None) => ("rope_scaling", None),
    };
    let params = match params {
        None => None,
        Some(Value::Object(m)) => Some(Fields { path: f.path, map: m }),
        Some(v) => return Err(err(f.path, format!("field `{key}` must be an object, found {v}"))),
    };
    let theta = match f.f64("rope_theta")? {
        Some(t) => t,
        None => params.as_ref().map(|p| p.f64("rope_theta")).transpose()?.flatten().unwrap_or(10000.0),
    };
    let Some(p) = params else { return Ok((theta, None)) };
    let kind = match p.str("rope_type")? {
        Some(k) => k,
        None => p.str("type")?.unwrap_or("default"),
    };
    let need = |k: &str| -> Result<f64, RunError> {
        p.f64(k)?.ok_or_else(|| err(f.path, format!("field `{key}`: rope type `{kind}` needs `{k}`")))
    };
    let scaling = match kind {
        "default" => None,
        "linear" => Some(RopeScaling::Linear { factor: need("factor")? }),
        "llama3" => Some(RopeScaling::Llama3 {
            factor: need("factor")?,
            low_freq_factor: need("low_freq_factor")?,
            high_freq_factor: need("high_freq_factor")?,
            original_max_position_embeddings: p.usize("original_max_position_embeddings")?.ok_or_else(|| {
                err(f.path, format!("field `{key}`: rope type `llama3` needs `original_max_position_embeddings`"))
            })?,
        }),
        other => {
            return Err(err(
                f.path,
                format!("field `{key}`: rope type `{other}` is not supported (supported: default, linear, llama3)"),
            ))
        }
    };
    if let Some(RopeScaling::Llama3 { low_freq_factor, high_freq_factor, .. }) = &scaling {
        if high_freq_factor <= low_freq_factor {
            return Err(err(f.path, format!("field `{key}`: high_freq_factor must exceed low_freq_factor")));
        }
    }
    Ok((theta, scaling))
}

/// Reads a config.json. `path` only names the file in errors.
pub fn parse_config(path: &Path, text: &str) -> Result<HfConfig, RunError> {
    let raw: Value = serde_json::from_str(text).map_err(|e| err(path, format!("not valid JSON: {e}")))?;
    let Some(map) = raw.as_object() else { return Err(err(path, "not a JSON object")) };
    let f = Fields { path, map };
    let arch = architecture(&f)?;
    let unsupported = |what: String| Err(err(path, format!("{what} is not supported for {}", arch.class_name())));

    if let Some(act) = f.str("hidden_act")? {
        if act != "silu" {
            return unsupported(format!("field `hidden_act` = \"{act}\" (only \"silu\")"));
        }
    }
    if f.bool("mlp_bias")? == Some(true) {
        return unsupported("field `mlp_bias` = true".into());
    }
    if let Some(p) = f.f64("partial_rotary_factor")? {
        if p != 1.0 {
            return unsupported(format!("field `partial_rotary_factor` = {p}"));
        }
    }
    let attention_bias = f.bool("attention_bias")?.unwrap_or(false);
    let (qkv_bias, o_bias, qk_norm) = match arch {
        Architecture::Llama | Architecture::Mistral => (attention_bias, attention_bias, false),
        // Qwen2 always has q/k/v biases and never an o_proj bias.
        Architecture::Qwen2 => (true, false, false),
        Architecture::Qwen3 | Architecture::Qwen3Moe => (attention_bias, attention_bias, true),
        // MixtralAttention has no biases whatever the config says: one it asks for is refused
        // rather than dropped.
        Architecture::Mixtral if attention_bias => return unsupported("field `attention_bias` = true".into()),
        Architecture::Mixtral => (false, false, false),
    };
    if f.bool("use_sliding_window")? == Some(true) {
        return unsupported("field `use_sliding_window` = true".into());
    }

    let d_model = f.required("hidden_size")?;
    let n_heads = f.required("num_attention_heads")?;
    let n_kv_heads = f.usize("num_key_value_heads")?.unwrap_or(n_heads);
    let max_pos = f.usize("max_position_embeddings")?.unwrap_or(arch.default_max_position());
    // Mistral attends within a sliding window (no `use_sliding_window` switch): up to the
    // window, full attention is the same computation, so the model is exact up to there.
    let window = match arch {
        Architecture::Mistral | Architecture::Mixtral => f.usize("sliding_window")?,
        _ => None,
    };
    let (theta, rope_scaling) = rope(&f)?;
    let n_layers = f.required("num_hidden_layers")?;
    let moe = moe::read(arch, &f, n_layers)?;
    let model = ModelConfig {
        vocab_size: f.required("vocab_size")?,
        d_model,
        n_layers,
        n_heads,
        n_kv_heads,
        d_ff: f.required("intermediate_size")?,
        max_len: window.map_or(max_pos, |w| w.min(max_pos)),
        rope_theta: theta,
        norm_eps: f.f64("rms_norm_eps")?.unwrap_or(1e-6),
        init_std: f.f64("initializer_range")?.unwrap_or(0.02),
        // transformers 5 writes head_dim always: the implied one is kept implicit, so a config
        // read back equals the one written.
        head_dim: f.usize("head_dim")?.filter(|&h| n_heads == 0 || d_model % n_heads != 0 || h != d_model / n_heads),
        qkv_bias,
        o_bias,
        qk_norm,
        tie_embeddings: f.bool("tie_word_embeddings")?.unwrap_or(false),
        rope_scaling,
        moe,
    };
    let positive = [
        ("vocab_size", model.vocab_size),
        ("hidden_size", model.d_model),
        ("num_hidden_layers", model.n_layers),
        ("num_attention_heads", model.n_heads),
        ("num_key_value_heads", model.n_kv_heads),
        ("intermediate_size", model.d_ff),
        ("max_position_embeddings", model.max_len),
    ];
    if let Some((k, _)) = positive.iter().find(|(_, v)| *v == 0) {
        return Err(err(path, format!("field `{k}` must be at least 1")));
    }
    if model.head_dim.is_none() && d_model % n_heads != 0 {
        return Err(err(path, "field `hidden_size` must be a multiple of `num_attention_heads` (or set `head_dim`)"));
    }
    if model.head_dim() == 0 || model.head_dim() % 2 != 0 {
        return Err(err(path, format!("head size {} must be even (rotary positions rotate pairs)", model.head_dim())));
    }
    if n_heads % n_kv_heads != 0 {
        return Err(err(path, "field `num_attention_heads` must be a multiple of `num_key_value_heads`"));
    }
    let dtype = match f.str("torch_dtype")? {
        Some(d) => Some(d.to_string()),
        None => f.str("dtype")?.map(str::to_string),
    };
    Ok(HfConfig {
        architecture: arch,
        model,
        max_position_embeddings: max_pos,
        bos_token_id: f.ids("bos_token_id")?.first().copied(),
        eos_token_ids: f.ids("eos_token_id")?,
        pad_token_id: f.ids("pad_token_id")?.first().copied(),
        dtype,
        raw,
    })
}
