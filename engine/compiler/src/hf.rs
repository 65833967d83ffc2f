//! A Hugging Face model directory's config.json, read at check time: the sizes and layer flags of
//! the `hf` schema (std/prelude), derived exactly as the runtime derives them when it loads the
//! directory (engine/tch/src/hf/config.rs `parse_config`), so `miles check` refuses what `miles
//! run` would refuse. Pure: the builtin `hf_config` reads the file through the `FileSystem`.

use crate::num::Q;
use crate::value::Value;
use serde_json::{Map, Value as Json};
use std::collections::BTreeMap;

/// The architectures the embedded backend loads: (model_type, `architectures` class name).
pub const ARCHITECTURES: [(&str, &str); 4] = [
    ("llama", "LlamaForCausalLM"),
    ("mistral", "MistralForCausalLM"),
    ("qwen2", "Qwen2ForCausalLM"),
    ("qwen3", "Qwen3ForCausalLM"),
];

/// The keys of the map `hf_config` returns, in the order docs list them.
pub const KEYS: [&str; 16] = [
    "architecture",
    "layers",
    "d_model",
    "heads",
    "kv_heads",
    "head_dim",
    "d_ff",
    "vocab",
    "max_len",
    "tie_embeddings",
    "qkv_bias",
    "o_bias",
    "qk_norm",
    "rope_theta",
    "experts",
    "params",
];

/// config.json as one object, with getters that name the key in their errors. JSON null counts
/// as absent (transformers writes `"head_dim": null`, `"sliding_window": null`).
struct Fields<'a> {
    map: &'a Map<String, Json>,
}

impl Fields<'_> {
    fn get(&self, key: &str) -> Option<&Json> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    fn int(&self, key: &str) -> Result<Option<u64>, String> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or_else(|| format!("`{key}` must be a non-negative integer, found {v}")),
        }
    }

    fn required(&self, key: &str) -> Result<u64, String> {
        self.int(key)?.ok_or_else(|| format!("no `{key}`"))
    }

    fn bool(&self, key: &str) -> Result<Option<bool>, String> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_bool().map(Some).ok_or_else(|| format!("`{key}` must be true or false, found {v}")),
        }
    }

    fn str(&self, key: &str) -> Result<Option<&str>, String> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_str().map(Some).ok_or_else(|| format!("`{key}` must be a string, found {v}")),
        }
    }

    /// A number, exactly as written (JSON numbers are decimal text).
    fn number(&self, key: &str) -> Result<Option<Q>, String> {
        match self.get(key) {
            None => Ok(None),
            Some(Json::Number(n)) => Q::parse_literal(&n.to_string())
                .map(Some)
                .ok_or_else(|| format!("`{key}` must be a positive number, found {n}")),
            Some(v) => Err(format!("`{key}` must be a number, found {v}")),
        }
    }
}

/// The architecture: the first supported class of `architectures`, else `model_type` (the
/// runtime's order).
fn architecture(f: &Fields) -> Result<&'static str, String> {
    let supported = || ARCHITECTURES.map(|(_, c)| c).join(", ");
    if let Some(v) = f.get("architectures") {
        let names: Vec<&str> = v.as_array().map(|a| a.iter().filter_map(|x| x.as_str()).collect()).unwrap_or_default();
        return names
            .iter()
            .find_map(|n| ARCHITECTURES.iter().find(|(_, c)| c == n).map(|(t, _)| *t))
            .ok_or_else(|| format!("`architectures` is {v}: supported are {}", supported()));
    }
    match f.str("model_type")? {
        Some(t) => ARCHITECTURES.iter().find(|(m, _)| *m == t).map(|(m, _)| *m).ok_or_else(|| {
            format!("`model_type` is \"{t}\": supported are {}", ARCHITECTURES.map(|(m, _)| m).join(", "))
        }),
        None => Err("neither `architectures` nor `model_type` says which model this is".into()),
    }
}

/// transformers' default when config.json omits max_position_embeddings.
fn default_max_position(arch: &str) -> u64 {
    match arch {
        "llama" => 2048,
        "mistral" => 4096 * 32,
        _ => 32768,
    }
}

/// rope_theta: top level, else inside `rope_scaling` / `rope_parameters` (transformers 5), else
/// 10000.
fn rope_theta(f: &Fields) -> Result<Q, String> {
    if let Some(t) = f.number("rope_theta")? {
        return Ok(t);
    }
    let (key, params) = match (f.get("rope_scaling"), f.get("rope_parameters")) {
        (Some(s), _) => ("rope_scaling", Some(s)),
        (None, Some(p)) => ("rope_parameters", Some(p)),
        (None, None) => ("rope_scaling", None),
    };
    match params {
        None => Ok(Q::int(10000)),
        Some(Json::Object(m)) => Ok(Fields { map: m }.number("rope_theta")?.unwrap_or(Q::int(10000))),
        Some(v) => Err(format!("`{key}` must be an object, found {v}")),
    }
}

/// The `hf_config` map of a config.json's text; the error says what is wrong, naming the key
/// (the caller prefixes the file).
pub fn config_map(text: &str) -> Result<BTreeMap<String, Value>, String> {
    let raw: Json = serde_json::from_str(text).map_err(|e| format!("not valid JSON: {e}"))?;
    let Some(map) = raw.as_object() else { return Err("not a JSON object".into()) };
    let f = Fields { map };
    let arch = architecture(&f)?;
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
    let attention_bias = f.bool("attention_bias")?.unwrap_or(false);
    let (qkv_bias, o_bias, qk_norm) = match arch {
        // Qwen2 always has q/k/v biases and never an o_proj bias.
        "qwen2" => (true, false, false),
        "qwen3" => (attention_bias, attention_bias, true),
        _ => (attention_bias, attention_bias, false),
    };
    let layers = f.required("num_hidden_layers")?;
    let d_model = f.required("hidden_size")?;
    let heads = f.required("num_attention_heads")?;
    let kv_heads = f.int("num_key_value_heads")?.unwrap_or(heads);
    let d_ff = f.required("intermediate_size")?;
    let vocab = f.required("vocab_size")?;
    let max_pos = f.int("max_position_embeddings")?.unwrap_or(default_max_position(arch));
    // Mistral attends within a sliding window: up to the window, full attention is the same
    // computation, so the model is exact up to there.
    let window = if arch == "mistral" { f.int("sliding_window")? } else { None };
    let max_len = window.map_or(max_pos, |w| w.min(max_pos));
    let positive = [
        ("vocab_size", vocab),
        ("hidden_size", d_model),
        ("num_hidden_layers", layers),
        ("num_attention_heads", heads),
        ("num_key_value_heads", kv_heads),
        ("intermediate_size", d_ff),
        ("max_position_embeddings", max_len),
    ];
    if let Some((k, _)) = positive.iter().find(|(_, v)| *v == 0) {
        return Err(format!("`{k}` must be at least 1"));
    }
    let head_dim = match f.int("head_dim")? {
        Some(h) => h,
        None if d_model % heads != 0 => {
            return Err("`hidden_size` must be a multiple of `num_attention_heads` (or set `head_dim`)".into())
        }
        None => d_model / heads,
    };
    if head_dim == 0 || head_dim % 2 != 0 {
        return Err(format!("head size {head_dim} must be even (rotary positions rotate pairs)"));
    }
    if heads % kv_heads != 0 {
        return Err("`num_attention_heads` must be a multiple of `num_key_value_heads`".into());
    }
    let tie = f.bool("tie_word_embeddings")?.unwrap_or(false);
    let params =
        param_count(Sizes { layers, d_model, heads, kv_heads, head_dim, d_ff, vocab }, qkv_bias, o_bias, qk_norm, tie)
            .ok_or("the sizes are too large to count parameters")?;
    let int = |n: u64| Value::int(i128::from(n));
    let mut out = BTreeMap::new();
    out.insert("architecture".into(), Value::Str(arch.into()));
    out.insert("layers".into(), int(layers));
    out.insert("d_model".into(), int(d_model));
    out.insert("heads".into(), int(heads));
    out.insert("kv_heads".into(), int(kv_heads));
    out.insert("head_dim".into(), int(head_dim));
    out.insert("d_ff".into(), int(d_ff));
    out.insert("vocab".into(), int(vocab));
    out.insert("max_len".into(), int(max_len));
    out.insert("tie_embeddings".into(), Value::Bool(tie));
    out.insert("qkv_bias".into(), Value::Bool(qkv_bias));
    out.insert("o_bias".into(), Value::Bool(o_bias));
    out.insert("qk_norm".into(), Value::Bool(qk_norm));
    out.insert("rope_theta".into(), Value::Num { q: rope_theta(&f)?, float: true });
    out.insert("experts".into(), int(0));
    out.insert("params".into(), Value::int(params));
    Ok(out)
}

struct Sizes {
    layers: u64,
    d_model: u64,
    heads: u64,
    kv_heads: u64,
    head_dim: u64,
    d_ff: u64,
    vocab: u64,
}

/// Every weight of the decoder: embeddings; per layer q/k/v/o (with their biases), the q/k
/// RMSNorms, the three SwiGLU matrices and two RMSNorms; the final norm; the LM head unless tied.
fn param_count(s: Sizes, qkv_bias: bool, o_bias: bool, qk_norm: bool, tie: bool) -> Option<i128> {
    let [layers, d, heads, kv, hd, ff, vocab] =
        [s.layers, s.d_model, s.heads, s.kv_heads, s.head_dim, s.d_ff, s.vocab].map(i128::from);
    let q = d.checked_mul(heads * hd)?;
    let kv_proj = d.checked_mul(kv * hd)?;
    let o = (heads * hd).checked_mul(d)?;
    let biases = if qkv_bias { heads * hd + 2 * kv * hd } else { 0 } + if o_bias { d } else { 0 };
    let norms = if qk_norm { 2 * hd } else { 0 } + 2 * d;
    let mlp = 3i128.checked_mul(d)?.checked_mul(ff)?;
    let layer =
        q.checked_add(2 * kv_proj)?.checked_add(o)?.checked_add(biases)?.checked_add(norms)?.checked_add(mlp)?;
    let embed = vocab.checked_mul(d)?;
    let head = if tie { 0 } else { embed };
    layers.checked_mul(layer)?.checked_add(embed)?.checked_add(head)?.checked_add(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> String {
        let path = format!("{}/../../tests/fixtures/hf/{name}/config.json", env!("CARGO_MANIFEST_DIR"));
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    /// `key = value` for every key, in `KEYS` order.
    fn show(m: &BTreeMap<String, Value>) -> String {
        KEYS.iter()
            .map(|k| format!("{k} = {}", m.get(*k).map(|v| v.to_string()).unwrap_or("-".into())))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// `params` is what transformers counts for the fixture (`sum(p.numel() for p in
    /// model.parameters())`: llama 138560, qwen2 94784, qwen3 138144).
    #[test]
    fn reads_the_three_fixture_architectures() {
        // Llama: untied, no biases, theta from the 4.x top-level key.
        assert_eq!(
            show(&config_map(&fixture("llama")).unwrap()),
            "architecture = \"llama\", layers = 2, d_model = 64, heads = 4, kv_heads = 2, head_dim = 16, d_ff = 96, \
             vocab = 600, max_len = 128, tie_embeddings = false, qkv_bias = false, o_bias = false, qk_norm = false, \
             rope_theta = 500000.0, experts = 0, params = 138560"
        );
        // Qwen2: q/k/v biases and no o bias; tied embeddings; theta from `rope_parameters`.
        assert_eq!(
            show(&config_map(&fixture("qwen2")).unwrap()),
            "architecture = \"qwen2\", layers = 2, d_model = 64, heads = 4, kv_heads = 2, head_dim = 16, d_ff = 96, \
             vocab = 512, max_len = 128, tie_embeddings = true, qkv_bias = true, o_bias = false, qk_norm = false, \
             rope_theta = 1000000.0, experts = 0, params = 94784"
        );
        // Qwen3: q/k norms, head_dim given (24, not 64 / 4), untied.
        assert_eq!(
            show(&config_map(&fixture("qwen3")).unwrap()),
            "architecture = \"qwen3\", layers = 2, d_model = 64, heads = 4, kv_heads = 2, head_dim = 24, d_ff = 96, \
             vocab = 500, max_len = 128, tie_embeddings = false, qkv_bias = false, o_bias = false, qk_norm = true, \
             rope_theta = 1000000.0, experts = 0, params = 138144"
        );
    }

    #[test]
    fn what_the_runtime_would_refuse_is_an_error_naming_the_key() {
        let cases = [
            ("{", "not valid JSON"),
            ("[1]", "not a JSON object"),
            (
                r#"{"model_type": "gpt2", "num_hidden_layers": 2}"#,
                "`model_type` is \"gpt2\": supported are llama, mistral, qwen2, qwen3",
            ),
            (r#"{"architectures": ["BertModel"]}"#, "`architectures` is [\"BertModel\"]"),
            (r#"{"model_type": "llama", "hidden_size": 64}"#, "no `num_hidden_layers`"),
            (
                r#"{"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 8, "vocab_size": 0}"#,
                "`vocab_size` must be at least 1",
            ),
            (
                r#"{"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 8, "vocab_size": 9, "hidden_act": "gelu"}"#,
                "`hidden_act` = \"gelu\" (only \"silu\") is not supported",
            ),
            (
                r#"{"model_type": "llama", "num_hidden_layers": "two"}"#,
                "`num_hidden_layers` must be a non-negative integer, found \"two\"",
            ),
        ];
        for (text, want) in cases {
            let e = config_map(text).unwrap_err();
            assert!(e.starts_with(want), "{text}: {e}");
        }
    }
}
