//! The policy: a Llama-style decoder-only transformer (RMSNorm, rotary positions, grouped-query
//! attention, SwiGLU MLP), fp32 on CPU, with Hugging Face parameter names. The variants of the
//! Llama family that `ModelConfig` names are layers of the same model: explicit head width, q/k/v
//! and o_proj biases (Qwen2, Llama `attention_bias`), q/k RMSNorm (Qwen3), tied embeddings and
//! scaled rotary frequencies (`crate::hf` reads and writes Hugging Face directories).
//!
//! `Policy`'s `impl` is spread over concept files: this one builds it and holds its settings and
//! adapters; `forward` (the passes, their padding convention), `rope`, `weights` (snapshots,
//! saving and loading); beside them `params` (names and shapes), `gemm` (how every GEMM
//! computes), `cache` (KV caches) and `tensors` (safetensors and snapshot entries).

mod cache;
mod forward;
mod gemm;
mod params;
mod rope;
mod tensors;
mod weights;

pub use cache::{KvCache, SlotCache};
pub use forward::left_pad;
pub(crate) use gemm::Gemm;
pub use params::param_names;
pub(crate) use params::{param_by_name, param_shape};
pub(crate) use tensors::{
    f32_values, load_named, named_tensor, named_tensors, open, read_entry, read_tensors, write_tensors,
};
pub use weights::MODEL_CONFIG_FILE;

use crate::lora::Adapters;
use crate::moe::{MoeLayer, Swiglu};
use miles_runtime::rng::Rng;
use miles_runtime::{LoraSpec, ModelConfig, RunError, E_BACKEND};
use rope::rope_tables;
use tch::{Device, Kind, Tensor};

pub(crate) fn backend_err(e: impl std::fmt::Display) -> RunError {
    RunError::new(E_BACKEND, format!("libtorch: {e}"))
}

struct Layer {
    ln1: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    o: Tensor,
    ln2: Tensor,
    mlp: Mlp,
    q_bias: Option<Tensor>,
    k_bias: Option<Tensor>,
    v_bias: Option<Tensor>,
    o_bias: Option<Tensor>,
    /// RMSNorm weights over each query / key head (`qk_norm`).
    q_norm: Option<Tensor>,
    k_norm: Option<Tensor>,
}

/// A layer's MLP: dense SwiGLU (LoRA can wrap it), or routed experts.
enum Mlp {
    Dense(Swiglu),
    Moe(MoeLayer),
}

pub struct Policy {
    pub cfg: ModelConfig,
    /// Every parameter, in a fixed order, with its Hugging Face name. The fields below are
    /// shallow clones (same storage).
    params: Vec<(String, Tensor)>,
    embed: Tensor,
    layers: Vec<Layer>,
    norm: Tensor,
    lm_head: Tensor,
    cos: Tensor,
    sin: Tensor,
    /// The run's LoRA settings (`RunSpec.train.lora`): an engine needs them to take an adapter
    /// update; the trainer attaches adapters from them when RL begins.
    pub lora_spec: Option<LoraSpec>,
    /// Attached adapters (one, or several on this one base: multi-LoRA); the active one's
    /// low-rank terms are added by every wrapped layer (`crate::lora`). Empty: the base alone.
    loras: Vec<Adapters>,
    active: usize,
    /// Batch-invariant kernels (`crate::invariant`): set on the engine's and the trainer's copies
    /// of a `batch_invariant` run.
    pub invariant: bool,
    /// Matmuls in bf16 against these fp32 weights, results back in fp32, as autocast does: the
    /// embedded trainer's `precision = bf16`, on the CPU (AVX512-BF16/AMX) and on a GPU alike.
    pub bf16_matmuls: bool,
}

impl Policy {
    /// Deterministic init from `seed`: normals drawn by our own RNG (not torch's), so the init
    /// does not depend on libtorch's generator or thread count.
    pub fn init(cfg: &ModelConfig, seed: u64) -> Policy {
        let out_scale = 1.0 / (2.0 * cfg.n_layers as f64).sqrt();
        let params = param_names(cfg)
            .into_iter()
            .enumerate()
            .map(|(i, name)| {
                let shape = param_shape(cfg, &name);
                let t = if name.ends_with(".bias") {
                    Tensor::zeros(&shape[..], (Kind::Float, crate::device::current()))
                } else if shape.len() == 1 {
                    Tensor::ones(&shape[..], (Kind::Float, crate::device::current()))
                } else {
                    let n: i64 = shape.iter().product();
                    let std = if name.ends_with("o_proj.weight") || name.ends_with("down_proj.weight") {
                        cfg.init_std * out_scale
                    } else {
                        cfg.init_std
                    };
                    let mut rng = Rng::derived(seed, "init", i as u64);
                    let data: Vec<f32> = (0..n).map(|_| (rng.normal() * std) as f32).collect();
                    crate::device::from_slice(&data).view(&shape[..])
                };
                (name, t)
            })
            .collect();
        Policy::from_params(cfg.clone(), params)
    }

    /// `params` must hold `param_names(&cfg)` with their `param_shape`s (callers check; a missing
    /// one becomes an empty tensor that fails at the first forward).
    pub(crate) fn from_params(cfg: ModelConfig, params: Vec<(String, Tensor)>) -> Policy {
        // On the process's device (`crate::device`) before any handle below is taken, so the
        // fields stay shallow clones of `params`.
        let params: Vec<(String, Tensor)> = params.into_iter().map(|(n, t)| (n, crate::device::put(t))).collect();
        let get = |name: &str| param_by_name(&params, name);
        let layers = (0..cfg.n_layers)
            .map(|i| {
                let p = |s: &str| get(&format!("model.layers.{i}.{s}.weight"));
                let swiglu = |s: &str| Swiglu {
                    gate: p(&format!("{s}.gate_proj")),
                    up: p(&format!("{s}.up_proj")),
                    down: p(&format!("{s}.down_proj")),
                };
                let mlp = match cfg.moe.as_ref().filter(|m| m.is_moe_layer(i)) {
                    Some(m) => Mlp::Moe(MoeLayer {
                        router: p("mlp.gate"),
                        experts: (0..m.experts).map(|j| swiglu(&format!("mlp.experts.{j}"))).collect(),
                        shared: (m.shared_expert_d_ff > 0).then(|| swiglu("mlp.shared_expert")),
                    }),
                    None => Mlp::Dense(swiglu("mlp")),
                };
                let bias = |s: &str, on: bool| on.then(|| get(&format!("model.layers.{i}.self_attn.{s}.bias")));
                let (q_bias, k_bias, v_bias) =
                    (bias("q_proj", cfg.qkv_bias), bias("k_proj", cfg.qkv_bias), bias("v_proj", cfg.qkv_bias));
                Layer {
                    q_bias,
                    k_bias,
                    v_bias,
                    o_bias: bias("o_proj", cfg.o_bias),
                    q_norm: cfg.qk_norm.then(|| p("self_attn.q_norm")),
                    k_norm: cfg.qk_norm.then(|| p("self_attn.k_norm")),
                    ln1: p("input_layernorm"),
                    q: p("self_attn.q_proj"),
                    k: p("self_attn.k_proj"),
                    v: p("self_attn.v_proj"),
                    o: p("self_attn.o_proj"),
                    ln2: p("post_attention_layernorm"),
                    mlp,
                }
            })
            .collect();
        let (cos, sin) = rope_tables(&cfg);
        let embed = get("model.embed_tokens.weight");
        // Tied: the same storage, so the output projection's gradient lands on the embedding.
        let lm_head = if cfg.tie_embeddings { embed.shallow_clone() } else { get("lm_head.weight") };
        Policy {
            embed,
            norm: get("model.norm.weight"),
            lm_head,
            layers,
            cos,
            sin,
            cfg,
            params,
            lora_spec: None,
            loras: Vec::new(),
            active: 0,
            invariant: false,
            bf16_matmuls: false,
        }
    }

    pub fn params(&self) -> &[(String, Tensor)] {
        &self.params
    }

    /// Where the weights live (the process's device, `crate::device`).
    pub fn device(&self) -> Device {
        self.embed.device()
    }

    /// What the forward computes in: fp32, or bf16 for an engine that samples in bf16.
    pub fn kind(&self) -> Kind {
        self.embed.kind()
    }

    /// The same weights in `kind` (an engine's copy: `precision = bf16` samples with bf16 weights
    /// and activations, the trainer staying fp32). Weight updates then round into it.
    pub fn to_kind(&self, kind: Kind) -> Policy {
        let params = self.params.iter().map(|(n, t)| (n.clone(), t.detach().to_kind(kind))).collect();
        let mut p = Policy::from_params(self.cfg.clone(), params);
        p.lora_spec = self.lora_spec.clone();
        p.invariant = self.invariant;
        p.bf16_matmuls = self.bf16_matmuls;
        p
    }

    /// How this policy's GEMMs compute.
    pub(crate) fn gemm(&self) -> Gemm {
        match (self.invariant, self.bf16_matmuls) {
            (true, _) => Gemm::Invariant,
            (false, true) => Gemm::Bf16,
            (false, false) => Gemm::Plain,
        }
    }

    /// `x W^T (+ bias)` as [`Policy::gemm`] says.
    pub(crate) fn lin(&self, x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Tensor {
        self.gemm().linear(x, w, bias)
    }

    pub fn set_requires_grad(&self, on: bool) {
        for (_, t) in &self.params {
            let _ = t.set_requires_grad(on);
        }
    }

    /// A detached deep copy (e.g. the frozen KL reference, or the engine's own weights).
    pub fn deep_copy(&self) -> Policy {
        let params = self.params.iter().map(|(n, t)| (n.clone(), t.detach().copy())).collect();
        let mut p = Policy::from_params(self.cfg.clone(), params);
        p.lora_spec = self.lora_spec.clone();
        p.loras = self.loras.iter().map(Adapters::deep_copy).collect();
        p.active = self.active;
        p.invariant = self.invariant;
        p.bf16_matmuls = self.bf16_matmuls;
        p
    }

    /// Another handle on the same weights (shared storage): an engine for one call.
    pub(crate) fn shallow(&self) -> Policy {
        let params = self.params.iter().map(|(n, t)| (n.clone(), t.shallow_clone())).collect();
        let mut p = Policy::from_params(self.cfg.clone(), params);
        p.lora_spec = self.lora_spec.clone();
        p.loras = self.loras.iter().map(Adapters::deep_copy).collect();
        p.active = self.active;
        p.invariant = self.invariant;
        p.bf16_matmuls = self.bf16_matmuls;
        p
    }

    /// The active adapter, if any are attached.
    pub fn lora(&self) -> Option<&Adapters> {
        self.loras.get(self.active)
    }

    /// Which adapter forward passes apply (0 with none or one).
    pub fn active_adapter(&self) -> usize {
        self.active
    }

    /// Every attached adapter, in the order of `LoraSpec::names`.
    pub fn adapters(&self) -> &[Adapters] {
        &self.loras
    }

    /// Replaces the attached adapters (empty: the base alone); the first becomes active.
    pub fn set_adapters(&mut self, adapters: Vec<Adapters>) {
        self.loras = adapters;
        self.active = 0;
    }

    /// Makes adapter `i` the one every forward pass applies.
    pub fn select_adapter(&mut self, i: usize) -> Result<(), RunError> {
        // Before RL attaches them, every adapter is zero: each may be selected and is the base.
        let n = self.lora_spec.as_ref().map_or(1, |s| s.names().len()).max(self.loras.len());
        if i >= n {
            return Err(RunError::new(E_BACKEND, format!("adapter {i} selected, the policy has {}", self.loras.len())));
        }
        self.active = i;
        Ok(())
    }
}
