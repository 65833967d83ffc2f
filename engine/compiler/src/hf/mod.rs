//! A Hugging Face model directory's config.json, read at check time: the map behind the builtin
//! `hf_config` (the `hf` schema of std/prelude). Two kinds of architecture:
//! - **loadable** ones, which the embedded backend runs (`dense.rs`: llama, mistral, qwen2,
//!   qwen3; `moe.rs`: qwen3_moe, mixtral): read exactly as the engine reads them when it loads the
//!   directory (engine/tch/src/hf/config.rs `parse_config`), with the same refusals, so `miles
//!   check` refuses what `miles run` would;
//! - **plan-only** ones, which `miles plan` sizes and `miles run` refuses (`moe.rs`: glm4_moe;
//!   `mla.rs`: deepseek_v3, kimi_k2, glm_moe_dsa; `gpt_oss.rs`): what sizes them is read, what
//!   would only matter to running them (activation, partial rotary, sliding windows) is not refused.
//!
//! `params.rs` counts the parameters as transformers lays each architecture out. The map says
//! which keys were read (`read`, in order) and which present ones were not (`ignored`). Pure: the
//! builtin reads the file through the `FileSystem`.

mod dense;
mod gpt_oss;
mod mla;
mod moe;
mod params;

use crate::num::Q;
use crate::value::Value;
use serde_json::{Map, Value as Json};
use std::cell::RefCell;
use std::collections::BTreeMap;

/// The architectures the embedded backend loads: (model_type, `architectures` class name).
pub const ARCHITECTURES: [(&str, &str); 6] = [
    ("llama", "LlamaForCausalLM"),
    ("mistral", "MistralForCausalLM"),
    ("qwen2", "Qwen2ForCausalLM"),
    ("qwen3", "Qwen3ForCausalLM"),
    ("qwen3_moe", "Qwen3MoeForCausalLM"),
    ("mixtral", "MixtralForCausalLM"),
];

/// Architectures `miles plan` sizes and `miles run` refuses. Kimi K2's config.json says
/// `model_type: "kimi_k2"` with DeepSeek-V3's class: it is sized as DeepSeek-V3.
pub const PLAN_ONLY: [(&str, &str); 5] = [
    ("deepseek_v3", "DeepseekV3ForCausalLM"),
    ("kimi_k2", "DeepseekV3ForCausalLM"),
    ("glm4_moe", "Glm4MoeForCausalLM"),
    ("glm_moe_dsa", "GlmMoeDsaForCausalLM"),
    ("gpt_oss", "GptOssForCausalLM"),
];

/// The keys of the map `hf_config` returns, in the order docs list them.
pub const KEYS: [&str; 39] = [
    "architecture",
    "loadable",
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
    "norm_eps",
    "attention",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_rope_head_dim",
    "v_head_dim",
    "sparse_topk",
    "index_head_dim",
    "experts",
    "top_k",
    "expert_d_ff",
    "shared_expert_d_ff",
    "dense_layers",
    "moe_layers",
    "mlp_only_layers",
    "sparse_step",
    "gating",
    "norm_topk",
    "aux_loss_coef",
    "params",
    "active_params",
    "mtp_params",
    "read",
    "ignored",
];

/// Keys that say nothing about the model's shape or outputs: left out of `ignored`, which lists
/// what could change the model and was not read. Token ids and the dtype are read by `miles run`
/// (tokenizer, weights), not by the planner.
const BOOKKEEPING: [&str; 14] = [
    "_name_or_path",
    "architectures",
    "auto_map",
    "transformers_version",
    "torch_dtype",
    "dtype",
    "use_cache",
    "initializer_range",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "output_router_logits",
    "attention_dropout",
    "pretraining_tp",
];

/// config.json as one object, with getters that name the key in their errors and remember which
/// keys they consulted (`read`). JSON null counts as absent (transformers writes `"head_dim":
/// null`, `"sliding_window": null`) but a present null key still counts as read.
pub(crate) struct Fields<'a> {
    map: &'a Map<String, Json>,
    read: RefCell<Vec<String>>,
}

impl<'a> Fields<'a> {
    fn new(map: &'a Map<String, Json>) -> Fields<'a> {
        Fields { map, read: RefCell::new(Vec::new()) }
    }

    fn get(&self, key: &str) -> Option<&'a Json> {
        if self.map.contains_key(key) {
            let mut read = self.read.borrow_mut();
            if !read.iter().any(|k| k == key) {
                read.push(key.to_string());
            }
        }
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

    /// A size that must be at least 1.
    fn positive(&self, key: &str) -> Result<u64, String> {
        match self.required(key)? {
            0 => Err(format!("`{key}` must be at least 1")),
            n => Ok(n),
        }
    }

    fn bool(&self, key: &str) -> Result<Option<bool>, String> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_bool().map(Some).ok_or_else(|| format!("`{key}` must be true or false, found {v}")),
        }
    }

    fn str(&self, key: &str) -> Result<Option<&'a str>, String> {
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

    /// A list of layer indices (Qwen3-MoE's `mlp_only_layers`), each below `layers`.
    fn layer_list(&self, key: &str, layers: u64) -> Result<Vec<u64>, String> {
        let bad = |v: &Json| format!("`{key}` must be a list of layer indices, found {v}");
        match self.get(key) {
            None => Ok(Vec::new()),
            Some(Json::Array(a)) => {
                let mut out = Vec::new();
                for v in a {
                    let i = v.as_u64().ok_or_else(|| bad(v))?;
                    if i >= layers {
                        return Err(format!(
                            "`{key}` names layer {i}, and the model has {layers} layers (0..{layers})"
                        ));
                    }
                    out.push(i);
                }
                out.sort_unstable();
                out.dedup();
                Ok(out)
            }
            Some(v) => Err(bad(v)),
        }
    }

    /// Present keys not read, bookkeeping left out, in key order.
    fn ignored(&self) -> Vec<String> {
        let read = self.read.borrow();
        self.map.keys().filter(|k| !read.contains(k) && !BOOKKEEPING.contains(&k.as_str())).cloned().collect()
    }
}

/// How attention is laid out, for the KV cache and the parameter count.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Attention {
    /// One K and V per head (`kv_heads == heads`) or shared by groups of heads.
    Gqa,
    /// Multi-head latent attention (DeepSeek-V3): a compressed KV latent and a decoupled rotary key
    /// are cached; queries through a low-rank `q_lora_rank` (none: a full projection).
    Mla { q_lora_rank: Option<u64>, kv_lora_rank: u64, qk_nope_head_dim: u64, qk_rope_head_dim: u64, v_head_dim: u64 },
}

/// DeepSeek sparse attention's lightning indexer (GLM-5): per layer, keys of `head_dim` cached per
/// token and `heads` scoring heads; each query attends to the `topk` best tokens.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Dsa {
    pub topk: u64,
    pub head_dim: u64,
    pub heads: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Gating {
    Softmax,
    Sigmoid,
}

/// The mixture of experts of an MoE config.json, with the set of layers that have experts.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct MoeSizes {
    pub experts: u64,
    pub top_k: u64,
    pub expert_d_ff: u64,
    /// Total width of the always-on shared experts (DeepSeek: `n_shared_experts` x
    /// `moe_intermediate_size`); 0: none.
    pub shared_d_ff: u64,
    /// Leading layers with a dense MLP (`first_k_dense_replace`).
    pub dense_layers: u64,
    /// Further dense layers by index (Qwen3-MoE's `mlp_only_layers`).
    pub mlp_only_layers: Vec<u64>,
    /// Every `sparse_step`-th layer has experts (Qwen3-MoE's `decoder_sparse_step`, DeepSeek's
    /// `moe_layer_freq`, which counts from layer 0).
    pub sparse_step: u64,
    /// DeepSeek's `moe_layer_freq` counts `i % freq == 0`; Qwen3-MoE's step `(i + 1) % step == 0`.
    pub step_from_zero: bool,
    pub gating: Gating,
    pub norm_topk: bool,
    pub aux_loss_coef: Q,
    /// gpt-oss: a bias on the router and on every expert's two projections.
    pub biases: bool,
}

impl MoeSizes {
    /// Softmax routing to `top_k` of `experts` in every layer, renormalised, no shared experts or
    /// biases (Mixtral); a reader sets what its architecture changes (Qwen3-MoE, gpt-oss).
    pub fn every_layer(experts: u64, top_k: u64, expert_d_ff: u64, aux_loss_coef: Q) -> MoeSizes {
        MoeSizes {
            experts,
            top_k,
            expert_d_ff,
            shared_d_ff: 0,
            dense_layers: 0,
            mlp_only_layers: Vec::new(),
            sparse_step: 1,
            step_from_zero: false,
            gating: Gating::Softmax,
            norm_topk: true,
            aux_loss_coef,
            biases: false,
        }
    }

    /// Whether layer `i` has routed experts (the runtime's `MoeConfig::is_moe_layer`, with
    /// DeepSeek's frequency counted as its reference code counts it).
    pub fn is_moe_layer(&self, i: u64) -> bool {
        let step = self.sparse_step.max(1);
        let on_step = if self.step_from_zero { i.is_multiple_of(step) } else { (i + 1).is_multiple_of(step) };
        i >= self.dense_layers && !self.mlp_only_layers.contains(&i) && on_step
    }

    pub fn moe_layers(&self, layers: u64) -> u64 {
        (0..layers).filter(|&i| self.is_moe_layer(i)).count() as u64
    }
}

/// Every figure one config.json gives the planner and the run.
#[derive(Clone, Debug)]
pub(crate) struct Sized {
    pub arch: &'static str,
    pub loadable: bool,
    pub layers: u64,
    pub d_model: u64,
    pub heads: u64,
    pub kv_heads: u64,
    /// Query/key width per head (MLA: the no-rope plus the rope part).
    pub head_dim: u64,
    /// Width of a dense layer's MLP (`intermediate_size`).
    pub d_ff: u64,
    pub vocab: u64,
    pub max_len: u64,
    pub tie: bool,
    pub qkv_bias: bool,
    pub o_bias: bool,
    pub qk_norm: bool,
    pub rope_theta: Q,
    pub norm_eps: Q,
    pub attention: Attention,
    pub dsa: Option<Dsa>,
    pub moe: Option<MoeSizes>,
    /// gpt-oss: one learned attention sink per head and layer.
    pub sinks: bool,
    /// Multi-token-prediction layers (`num_nextn_predict_layers`), counted apart from `params`.
    pub mtp_layers: u64,
}

/// The architecture's model_type: the first known class of `architectures` (the runtime's order),
/// else `model_type`; Kimi K2 names DeepSeek-V3's class with its own model_type.
fn architecture(f: &Fields) -> Result<&'static str, String> {
    let known = || ARCHITECTURES.iter().chain(PLAN_ONLY.iter());
    let supported = || {
        format!(
            "the embedded backend loads {}; `miles plan` also sizes {} (plan only)",
            ARCHITECTURES.map(|(m, _)| m).join(", "),
            PLAN_ONLY.map(|(m, _)| m).join(", ")
        )
    };
    let model_type = f.str("model_type")?;
    if let Some(v) = f.get("architectures") {
        let names: Vec<&str> = v.as_array().map(|a| a.iter().filter_map(|x| x.as_str()).collect()).unwrap_or_default();
        // The model_type first where it names a known model of one of these classes (kimi_k2).
        if let Some(t) = known().find(|(m, c)| Some(*m) == model_type && names.contains(c)) {
            return Ok(t.0);
        }
        return names
            .iter()
            .find_map(|n| known().find(|(_, c)| c == n).map(|(t, _)| *t))
            .ok_or_else(|| format!("`architectures` is {v}: {}", supported()));
    }
    match model_type {
        Some(t) => known()
            .find(|(m, _)| *m == t)
            .map(|(m, _)| *m)
            .ok_or_else(|| format!("`model_type` is \"{t}\": {}", supported())),
        None => Err("neither `architectures` nor `model_type` says which model this is".into()),
    }
}

/// rope_theta: top level, else inside `rope_scaling` / `rope_parameters` (transformers 5), else
/// 10000. With `check_type`, a rope type the engine does not compute is refused (loadable
/// architectures: engine/tch reads default, linear and llama3).
fn rope_theta(f: &Fields, check_type: bool) -> Result<Q, String> {
    let (key, params) = match (f.get("rope_scaling"), f.get("rope_parameters")) {
        (Some(s), _) => ("rope_scaling", Some(s)),
        (None, Some(p)) => ("rope_parameters", Some(p)),
        (None, None) => ("rope_scaling", None),
    };
    let inner = match params {
        None => None,
        Some(Json::Object(m)) => Some(Fields::new(m)),
        Some(v) => return Err(format!("`{key}` must be an object, found {v}")),
    };
    if let (true, Some(p)) = (check_type, &inner) {
        let kind = match p.str("rope_type")? {
            Some(k) => k,
            None => p.str("type")?.unwrap_or("default"),
        };
        if !["default", "linear", "llama3"].contains(&kind) {
            return Err(format!("`{key}`: rope type `{kind}` is not supported (supported: default, linear, llama3)"));
        }
    }
    if let Some(t) = f.number("rope_theta")? {
        return Ok(t);
    }
    Ok(inner.map(|p| p.number("rope_theta")).transpose()?.flatten().unwrap_or(Q::int(10000)))
}

/// The attention sizes of a grouped-query config.json as the plan-only readers take them.
#[derive(Clone, Copy)]
pub(crate) struct Gqa {
    pub layers: u64,
    pub d_model: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
}

impl Gqa {
    /// Read in this order (it is the order `read` lists); `num_key_value_heads` defaults to the
    /// heads, and is at least 1.
    fn read(f: &Fields) -> Result<Gqa, String> {
        let layers = f.positive("num_hidden_layers")?;
        let d_model = f.positive("hidden_size")?;
        let heads = f.positive("num_attention_heads")?;
        let kv_heads = f.int("num_key_value_heads")?.unwrap_or(heads).max(1);
        let head_dim = head_dim(f, d_model, heads)?;
        Ok(Gqa { layers, d_model, heads, kv_heads, head_dim })
    }
}

/// `head_dim`, else `hidden_size / num_attention_heads`; even (rotary positions rotate pairs).
fn head_dim(f: &Fields, d_model: u64, heads: u64) -> Result<u64, String> {
    let h = match f.int("head_dim")? {
        Some(h) => h,
        None if !d_model.is_multiple_of(heads) => {
            return Err("`hidden_size` must be a multiple of `num_attention_heads` (or set `head_dim`)".into())
        }
        None => d_model / heads,
    };
    if h == 0 || !h.is_multiple_of(2) {
        return Err(format!("head size {h} must be even (rotary positions rotate pairs)"));
    }
    Ok(h)
}

/// The `hf_config` map of a config.json's text; the error says what is wrong, naming the key
/// (the caller prefixes the file).
pub fn config_map(text: &str) -> Result<BTreeMap<String, Value>, String> {
    let raw: Json = serde_json::from_str(text).map_err(|e| format!("not valid JSON: {e}"))?;
    let Some(map) = raw.as_object() else { return Err("not a JSON object".into()) };
    let f = Fields::new(map);
    let arch = architecture(&f)?;
    let s = match arch {
        "llama" | "mistral" | "qwen2" | "qwen3" => dense::read(&f, arch)?,
        "qwen3_moe" | "mixtral" => moe::read_loadable(&f, arch)?,
        "glm4_moe" => moe::read_glm4_moe(&f)?,
        "deepseek_v3" | "kimi_k2" | "glm_moe_dsa" => mla::read(&f, arch)?,
        _ => gpt_oss::read(&f)?,
    };
    let counts = params::count(&s).ok_or("the sizes are too large to count parameters")?;
    Ok(to_map(&s, counts, &f))
}

fn to_map(s: &Sized, c: params::Counts, f: &Fields) -> BTreeMap<String, Value> {
    let int = |n: u64| Value::int(i128::from(n));
    let opt = |n: Option<u64>| n.map_or(Value::None, int);
    let strs = |v: Vec<String>| Value::List(v.into_iter().map(Value::Str).collect());
    let mut out = BTreeMap::new();
    let mut put = |k: &str, v: Value| {
        out.insert(k.to_string(), v);
    };
    put("architecture", Value::Str(s.arch.into()));
    put("loadable", Value::Bool(s.loadable));
    put("layers", int(s.layers));
    put("d_model", int(s.d_model));
    put("heads", int(s.heads));
    put("kv_heads", int(s.kv_heads));
    put("head_dim", int(s.head_dim));
    put("d_ff", int(s.d_ff));
    put("vocab", int(s.vocab));
    put("max_len", int(s.max_len));
    put("tie_embeddings", Value::Bool(s.tie));
    put("qkv_bias", Value::Bool(s.qkv_bias));
    put("o_bias", Value::Bool(s.o_bias));
    put("qk_norm", Value::Bool(s.qk_norm));
    put("rope_theta", Value::Num { q: s.rope_theta, float: true });
    put("norm_eps", Value::Num { q: s.norm_eps, float: true });
    let mla = match &s.attention {
        Attention::Mla { q_lora_rank, kv_lora_rank, qk_rope_head_dim, v_head_dim, .. } => {
            Some((*q_lora_rank, *kv_lora_rank, *qk_rope_head_dim, *v_head_dim))
        }
        Attention::Gqa => None,
    };
    let attention = match (&s.attention, s.kv_heads == s.heads) {
        (Attention::Mla { .. }, _) => "mla",
        (Attention::Gqa, true) => "mha",
        (Attention::Gqa, false) => "gqa",
    };
    put("attention", Value::Str(attention.into()));
    put("q_lora_rank", opt(mla.and_then(|m| m.0)));
    put("kv_lora_rank", opt(mla.map(|m| m.1)));
    put("qk_rope_head_dim", opt(mla.map(|m| m.2)));
    put("v_head_dim", opt(mla.map(|m| m.3)));
    put("sparse_topk", opt(s.dsa.as_ref().map(|d| d.topk)));
    put("index_head_dim", opt(s.dsa.as_ref().map(|d| d.head_dim)));
    let m = s.moe.as_ref();
    put("experts", int(m.map_or(0, |m| m.experts)));
    put("top_k", int(m.map_or(0, |m| m.top_k)));
    put("expert_d_ff", int(m.map_or(s.d_ff, |m| m.expert_d_ff)));
    put("shared_expert_d_ff", int(m.map_or(0, |m| m.shared_d_ff)));
    put("dense_layers", int(m.map_or(0, |m| m.dense_layers)));
    put("moe_layers", int(m.map_or(0, |m| m.moe_layers(s.layers))));
    put("mlp_only_layers", Value::List(m.map_or(vec![], |m| m.mlp_only_layers.iter().map(|&i| int(i)).collect())));
    put("sparse_step", int(m.map_or(1, |m| m.sparse_step)));
    let gating = m.map_or("softmax", |m| if m.gating == Gating::Sigmoid { "sigmoid" } else { "softmax" });
    put("gating", Value::Str(gating.into()));
    put("norm_topk", Value::Bool(m.is_none_or(|m| m.norm_topk)));
    put("aux_loss_coef", Value::Num { q: m.map_or(Q::ZERO, |m| m.aux_loss_coef), float: true });
    put("params", Value::int(c.params));
    put("active_params", Value::int(c.active));
    put("mtp_params", Value::int(c.mtp));
    put("read", strs(f.read.borrow().clone()));
    put("ignored", strs(f.ignored()));
    out
}

#[cfg(test)]
mod tests;
