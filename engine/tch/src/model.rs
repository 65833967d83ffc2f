//! The policy: a Llama-style decoder-only transformer (RMSNorm, rotary positions, grouped-query
//! attention, SwiGLU MLP), fp32 on CPU, with Hugging Face parameter names. The variants of the
//! Llama family that `ModelConfig` names are layers of the same model: explicit head width, q/k/v
//! and o_proj biases (Qwen2, Llama `attention_bias`), q/k RMSNorm (Qwen3), tied embeddings and
//! scaled rotary frequencies (`crate::hf` reads and writes Hugging Face directories).
//!
//! Padding convention: batches are LEFT-padded. A row's positions count only its real tokens, and
//! no real token attends to a pad, so a sequence gives the same logits whatever it is batched
//! with (up to float reduction order) — sampling and training see the same numbers.

use crate::lora::{is_adapter_name, Adapters, Target};
use crate::moe::{MoeLayer, Route, Swiglu};
use miles_runtime::rng::Rng;
use miles_runtime::{
    LoraSpec, ModelConfig, NamedTensor, RopeScaling, RunError, WeightSnapshot, E_BACKEND, E_CHECKPOINT,
};
use std::path::Path;
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

/// How a policy's GEMMs compute: libtorch's in the weights' kind, bf16 against fp32 weights, or
/// the batch-invariant kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Gemm {
    Plain,
    Bf16,
    Invariant,
}

impl Gemm {
    /// `x W^T (+ bias)`, in fp32 under bf16 GEMMs (what attention, norms and the residual take).
    pub(crate) fn linear(self, x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Tensor {
        match self {
            Gemm::Bf16 => self.linear_low(x, w, bias).to_kind(Kind::Float),
            _ => self.linear_low(x, w, bias),
        }
    }

    /// `linear`, its output left in bf16 under bf16 GEMMs: for an MLP's inner activations, whose
    /// elementwise ops (and their backward) then move half the bytes, as under autocast.
    pub(crate) fn linear_low(self, x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Tensor {
        match self {
            Gemm::Invariant => crate::invariant::linear(x, w, bias),
            // Autocast by hand (tch's autocast picks fp16): the gradient flows back through the
            // casts into the fp32 weights.
            Gemm::Bf16 => {
                let bf =
                    |t: &Tensor| if t.kind() == Kind::BFloat16 { t.shallow_clone() } else { t.to_kind(Kind::BFloat16) };
                bf(x).linear(&bf(w), bias.map(bf).as_ref())
            }
            Gemm::Plain => x.linear(w, bias),
        }
    }
}

/// Per-layer key/value buffers of a batch, preallocated to the longest sequence so a decode step
/// writes in place instead of concatenating.
pub struct KvCache {
    k: Vec<Tensor>,
    v: Vec<Tensor>,
    /// Filled slots.
    pub len: i64,
}

impl KvCache {
    /// Buffers for `policy`'s sizes and compute kind.
    pub fn new(policy: &Policy, batch: i64, capacity: i64) -> KvCache {
        let cfg = &policy.cfg;
        let hd = cfg.head_dim() as i64;
        let shape = [batch, cfg.n_kv_heads as i64, capacity, hd];
        let mk = || Tensor::zeros(shape, (policy.kind(), policy.device()));
        KvCache { k: (0..cfg.n_layers).map(|_| mk()).collect(), v: (0..cfg.n_layers).map(|_| mk()).collect(), len: 0 }
    }

    /// Rows `index` of the batch (e.g. each prompt's row repeated n times after a shared prefill).
    pub fn select_rows(&mut self, index: &Tensor) {
        for t in self.k.iter_mut().chain(self.v.iter_mut()) {
            *t = t.index_select(0, index);
        }
    }
}

/// Per-layer key/value buffers of `slots` independent sequences, [slots, max_len, kv_heads,
/// head_dim]: the engine of continuous batching (`forward_slots`). A slot is reused by the next
/// request as soon as its sequence finishes; nothing is cleared (columns are overwritten in order).
pub struct SlotCache {
    k: Vec<Tensor>,
    v: Vec<Tensor>,
}

impl SlotCache {
    /// Buffers for `policy`'s sizes and compute kind.
    pub fn new(policy: &Policy, slots: i64) -> SlotCache {
        let cfg = &policy.cfg;
        let hd = cfg.head_dim() as i64;
        let shape = [slots, cfg.max_len as i64, cfg.n_kv_heads as i64, hd];
        let mk = || Tensor::zeros(shape, (policy.kind(), policy.device()));
        SlotCache { k: (0..cfg.n_layers).map(|_| mk()).collect(), v: (0..cfg.n_layers).map(|_| mk()).collect() }
    }
}

/// The shape `cfg` implies for parameter `name` (empty for a name it does not have).
pub(crate) fn param_shape(cfg: &ModelConfig, name: &str) -> Vec<i64> {
    let d = cfg.d_model as i64;
    let hd = cfg.head_dim() as i64;
    let q = cfg.n_heads as i64 * hd;
    let kv = cfg.n_kv_heads as i64 * hd;
    let v = cfg.vocab_size as i64;
    let (stem, kind) = name.rsplit_once('.').unwrap_or((name, ""));
    let leaf = stem.rsplit('.').next().unwrap_or("");
    let ff = crate::moe::mlp_width(cfg.moe.as_ref(), stem).unwrap_or(cfg.d_ff) as i64;
    match (leaf, kind) {
        ("gate", "weight") if stem.ends_with(".mlp.gate") => match &cfg.moe {
            Some(m) => vec![m.experts as i64, d],
            None => vec![],
        },
        ("embed_tokens" | "lm_head", "weight") => vec![v, d],
        ("input_layernorm" | "post_attention_layernorm" | "norm", "weight") => vec![d],
        ("q_norm" | "k_norm", "weight") => vec![hd],
        ("q_proj", "weight") => vec![q, d],
        ("q_proj", "bias") => vec![q],
        ("k_proj" | "v_proj", "weight") => vec![kv, d],
        ("k_proj" | "v_proj", "bias") => vec![kv],
        ("o_proj", "weight") => vec![d, q],
        ("o_proj", "bias") => vec![d],
        ("gate_proj" | "up_proj", "weight") => vec![ff, d],
        ("down_proj", "weight") => vec![d, ff],
        _ => vec![],
    }
}

/// Parameter names in the order they are created, saved and synced. The optional ones come
/// right after the weight they belong to, and only when `cfg` enables them, so a plain Llama
/// config keeps its names, order and seeded init.
pub fn param_names(cfg: &ModelConfig) -> Vec<String> {
    let mut v = vec!["model.embed_tokens.weight".to_string()];
    for i in 0..cfg.n_layers {
        let mut push = |s: &str| v.push(format!("model.layers.{i}.{s}"));
        push("input_layernorm.weight");
        for p in ["q_proj", "k_proj", "v_proj"] {
            push(&format!("self_attn.{p}.weight"));
            if cfg.qkv_bias {
                push(&format!("self_attn.{p}.bias"));
            }
        }
        push("self_attn.o_proj.weight");
        if cfg.o_bias {
            push("self_attn.o_proj.bias");
        }
        if cfg.qk_norm {
            push("self_attn.q_norm.weight");
            push("self_attn.k_norm.weight");
        }
        push("post_attention_layernorm.weight");
        match cfg.moe.as_ref().filter(|m| i >= m.dense_layers) {
            Some(m) => v.extend(crate::moe::mlp_param_names(m, i)),
            None => {
                for s in ["mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"] {
                    v.push(format!("model.layers.{i}.{s}.weight"));
                }
            }
        }
    }
    v.push("model.norm.weight".into());
    if !cfg.tie_embeddings {
        v.push("lm_head.weight".into());
    }
    v
}

/// Rotary tables [max_len, head_dim], Hugging Face convention (rotate_half over the two halves
/// of a head), with `rope_scaling` applied to the frequencies.
fn rope_tables(cfg: &ModelConfig) -> (Tensor, Tensor) {
    let hd = cfg.head_dim() as i64;
    let inv: Vec<f32> = (0..hd / 2)
        .map(|i| {
            scale_frequency(1.0 / cfg.rope_theta.powf(2.0 * i as f64 / hd as f64), cfg.rope_scaling.as_ref()) as f32
        })
        .collect();
    let inv = crate::device::from_slice(&inv);
    let pos = Tensor::arange(cfg.max_len as i64, (Kind::Float, crate::device::current()));
    let freqs = pos.unsqueeze(1) * inv.unsqueeze(0);
    let emb = Tensor::cat(&[&freqs, &freqs], 1);
    (emb.cos(), emb.sin())
}

/// One rotary frequency under `scaling` (transformers' `_compute_linear_scaling_rope_parameters`
/// and `_compute_llama3_parameters`).
fn scale_frequency(f: f64, scaling: Option<&RopeScaling>) -> f64 {
    match scaling {
        None => f,
        Some(RopeScaling::Linear { factor }) => f / factor,
        Some(RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings }) => {
            let old = *original_max_position_embeddings as f64;
            let wavelen = 2.0 * std::f64::consts::PI / f;
            if wavelen < old / high_freq_factor {
                f
            } else if wavelen > old / low_freq_factor {
                f / factor
            } else {
                let smooth = (old / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                (1.0 - smooth) * f / factor + smooth * f
            }
        }
    }
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
                let mlp = match cfg.moe.as_ref().filter(|m| i >= m.dense_layers) {
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

    /// `x W^T (+ bias)` for layer `li`'s `t`, plus its adapter's term when `t` is wrapped.
    fn proj(&self, li: usize, t: Target, x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Tensor {
        let y = self.lin(x, w, bias);
        match self.lora().and_then(|l| l.delta(li, t, x)) {
            Some(d) => y + d,
            None => y,
        }
    }

    /// A concatenated GEMM's output `y` (q|k|v or gate|up) plus the wrapped parts' adapter terms.
    fn add_deltas(&self, li: usize, y: Tensor, parts: &[(Target, i64)], x: &Tensor) -> Tensor {
        match self.lora().and_then(|l| l.delta_cat(li, parts, x)) {
            Some(d) => y + d,
            None => y,
        }
    }

    /// Layer `li`'s MLP on normed inputs `xn` [B, T, d]: the dense SwiGLU (gate and up as one
    /// GEMM, plus any adapter terms) or the routed experts.
    fn mlp(&self, li: usize, layer: &Layer, xn: &Tensor, route: Option<&mut Route>) -> Tensor {
        match &layer.mlp {
            Mlp::Dense(m) => {
                let ff = m.gate.size()[0];
                // The inner activations stay bf16 under bf16 GEMMs, unless adapters (fp32) add
                // their terms to them.
                let gemm = self.gemm();
                let gate_up = Tensor::cat(&[&m.gate, &m.up], 0);
                let gu = match self.lora() {
                    None => gemm.linear_low(xn, &gate_up, None),
                    Some(_) => gemm.linear(xn, &gate_up, None),
                };
                let gu = self.add_deltas(li, gu, &[(Target::Gate, ff), (Target::Up, ff)], xn);
                let act = gu.narrow(-1, 0, ff).silu() * gu.narrow(-1, ff, ff);
                self.proj(li, Target::Down, &act, &m.down, None)
            }
            Mlp::Moe(m) => match &self.cfg.moe {
                Some(c) => m.forward(c, xn, route, self.gemm()),
                None => xn.zeros_like(),
            },
        }
    }

    /// Logits [B, T, V] for `tokens` [B, T] at `positions` [B, T]. `key_valid` [B, S] marks real
    /// tokens among all S = cache.len + T keys. With a cache, the new keys/values are stored and
    /// `cache.len` advances by T.
    pub fn forward(
        &self,
        tokens: &Tensor,
        positions: &Tensor,
        key_valid: &Tensor,
        cache: Option<&mut KvCache>,
    ) -> Tensor {
        self.forward_routed(tokens, positions, key_valid, cache, None)
    }

    /// `forward`, routing MoE layers by `route` (R3 replay) and reporting what they chose. Logits
    /// are fp32 whatever the compute kind.
    pub fn forward_routed(
        &self,
        tokens: &Tensor,
        positions: &Tensor,
        key_valid: &Tensor,
        cache: Option<&mut KvCache>,
        route: Option<&mut Route>,
    ) -> Tensor {
        self.lin(&self.hidden_routed(tokens, positions, key_valid, cache, route), &self.lm_head, None)
            .to_kind(Kind::Float)
    }

    /// The final normed hidden states [B, T, d_model] that `forward` projects to logits (PPO's
    /// critic reads values from them).
    pub fn hidden(
        &self,
        tokens: &Tensor,
        positions: &Tensor,
        key_valid: &Tensor,
        cache: Option<&mut KvCache>,
    ) -> Tensor {
        self.hidden_routed(tokens, positions, key_valid, cache, None)
    }

    // `x = x + y` on purpose: tch's `+=` is in-place (add_), which would overwrite activations
    // autograd still needs.
    #[allow(clippy::assign_op_pattern)]
    /// `hidden`, with MoE routing by `route`.
    pub fn hidden_routed(
        &self,
        tokens: &Tensor,
        positions: &Tensor,
        key_valid: &Tensor,
        mut cache: Option<&mut KvCache>,
        mut route: Option<&mut Route>,
    ) -> Tensor {
        let (b, t) = tokens.size2().unwrap_or((0, 0));
        let cfg = &self.cfg;
        let h = cfg.n_heads as i64;
        let kvh = cfg.n_kv_heads as i64;
        let hd = cfg.head_dim() as i64;
        let past = cache.as_ref().map_or(0, |c| c.len);
        let s = past + t;

        // Query i (slot past+i) may see key j when j is a real token and j <= past+i; it always
        // sees itself, so pad rows stay finite (their outputs are never used).
        let qi = Tensor::arange_start(past, s, (Kind::Int64, crate::device::current())).unsqueeze(1);
        let kj = Tensor::arange(s, (Kind::Int64, crate::device::current())).unsqueeze(0);
        let causal = kj.le_tensor(&qi); // [T, S]
        let diag = kj.eq_tensor(&qi);
        let allowed = causal.unsqueeze(0).logical_and(&key_valid.unsqueeze(1)).logical_or(&diag.unsqueeze(0)); // [B, T, S]
                                                                                                               // Boolean mask (true = may attend) for libtorch's fused attention, built once per pass.
        let mask = allowed.unsqueeze(1); // [B, 1, T, S]

        let rope = self.rotary(positions, b, t);

        let mut x = self.embed.index_select(0, &tokens.reshape([-1])).view([b, t, -1]);
        for (li, layer) in self.layers.iter().enumerate() {
            let xn = rms_norm(&x, &layer.ln1, cfg.norm_eps);
            // One GEMM for Q, K and V (weights concatenated per call; the parameters keep their
            // Hugging Face names and shapes).
            // Biases too are concatenated per call: a copy kept in the layer would miss the
            // optimizer's in-place updates and the gradient.
            let qkv_bias = match (&layer.q_bias, &layer.k_bias, &layer.v_bias) {
                (Some(qb), Some(kb), Some(vb)) => Some(Tensor::cat(&[qb, kb, vb], 0)),
                _ => None,
            };
            let qkv = self.lin(&xn, &Tensor::cat(&[&layer.q, &layer.k, &layer.v], 0), qkv_bias.as_ref());
            let qkv =
                self.add_deltas(li, qkv, &[(Target::Q, h * hd), (Target::K, kvh * hd), (Target::V, kvh * hd)], &xn);
            let qk = qkv.narrow(-1, 0, (h + kvh) * hd).view([b, t, h + kvh, hd]);
            let qk = match (&layer.q_norm, &layer.k_norm) {
                (Some(qn), Some(kn)) => Tensor::cat(
                    &[
                        rms_norm(&qk.narrow(2, 0, h), qn, cfg.norm_eps),
                        rms_norm(&qk.narrow(2, h, kvh), kn, cfg.norm_eps),
                    ],
                    2,
                ),
                _ => qk,
            };
            // Rotary on the query and key heads together: [B, H + KVH, T, hd].
            let qk = rope(&qk.transpose(1, 2));
            let q = qk.narrow(1, 0, h);
            let k = qk.narrow(1, h, kvh);
            let v = qkv.narrow(-1, (h + kvh) * hd, kvh * hd).view([b, t, kvh, hd]).transpose(1, 2);
            let (k_all, v_all) = match cache.as_deref_mut() {
                Some(c) => {
                    c.k[li].narrow(2, past, t).copy_(&k);
                    c.v[li].narrow(2, past, t).copy_(&v);
                    (c.k[li].narrow(2, 0, s), c.v[li].narrow(2, 0, s))
                }
                None => (k, v),
            };
            let (k_all, v_all) = repeat_kv(k_all, v_all, [b, kvh, s, hd], h);
            // Fused attention (scale 1/sqrt(hd) by default).
            let att = if self.invariant {
                crate::invariant::attention(&q, &k_all, &v_all, &mask)
            } else {
                Tensor::scaled_dot_product_attention(&q, &k_all, &v_all, Some(&mask), 0.0, false, None, false)
            };
            let att = att.transpose(1, 2).contiguous().view([b, t, h * hd]);
            x = x + self.proj(li, Target::O, &att, &layer.o, layer.o_bias.as_ref());
            let xn = rms_norm(&x, &layer.ln2, cfg.norm_eps);
            x = x + self.mlp(li, layer, &xn, route.as_deref_mut());
        }
        if let Some(c) = cache {
            c.len = s;
        }
        rms_norm(&x, &self.norm, cfg.norm_eps)
    }

    /// Logits [B, T, V] for `tokens` [B, T] of the sequences held in cache slots `rows` [B], at
    /// `positions` [B, T] (a token's position is also its cache column). Keys/values are written
    /// into their slots first; a query at position p attends columns 0..=p of its slot, so
    /// sequences of different lengths share a batch with no padding between prompt and response
    /// (continuous batching). Right padding in a prefill is harmless: a padded column is
    /// overwritten by the decode step that reaches it, before any real query can see it.
    pub fn forward_slots(&self, tokens: &Tensor, positions: &Tensor, rows: &Tensor, cache: &mut SlotCache) -> Tensor {
        self.forward_slots_routed(tokens, positions, rows, cache, None)
    }

    // `x = x + y` on purpose, as in `hidden_routed`.
    #[allow(clippy::assign_op_pattern)]
    /// `forward_slots`, reporting MoE routing into `route`.
    pub fn forward_slots_routed(
        &self,
        tokens: &Tensor,
        positions: &Tensor,
        rows: &Tensor,
        cache: &mut SlotCache,
        mut route: Option<&mut Route>,
    ) -> Tensor {
        let (b, t) = tokens.size2().unwrap_or((0, 0));
        let cfg = &self.cfg;
        let h = cfg.n_heads as i64;
        let kvh = cfg.n_kv_heads as i64;
        let hd = cfg.head_dim() as i64;
        // Batch-invariant: attend over every column, as the trainer does over its max_len layout.
        let span = if self.invariant { cfg.max_len as i64 } else { positions.max().int64_value(&[]) + 1 };
        let kj = Tensor::arange(span, (Kind::Int64, crate::device::current())).view([1, 1, span]);
        let allowed = kj.le_tensor(&positions.unsqueeze(2)); // [B, T, span]
        let mask = Tensor::zeros([b, 1, t, span], (self.kind(), self.device()))
            .masked_fill(&allowed.logical_not().unsqueeze(1), f64::NEG_INFINITY);
        let flat_pos = positions.reshape([-1]);
        let flat_rows = rows.unsqueeze(1).expand([b, t], false).reshape([-1]);
        let rope = self.rotary(positions, b, t);
        let mut x = self.embed.index_select(0, &tokens.reshape([-1])).view([b, t, -1]);
        for (li, layer) in self.layers.iter().enumerate() {
            let xn = rms_norm(&x, &layer.ln1, cfg.norm_eps);
            let head_norm = |x: Tensor, w: &Option<Tensor>| match w {
                Some(w) => rms_norm(&x, w, cfg.norm_eps),
                None => x,
            };
            let q = head_norm(
                self.proj(li, Target::Q, &xn, &layer.q, layer.q_bias.as_ref()).view([b, t, h, hd]),
                &layer.q_norm,
            );
            let k = head_norm(
                self.proj(li, Target::K, &xn, &layer.k, layer.k_bias.as_ref()).view([b, t, kvh, hd]),
                &layer.k_norm,
            );
            let q = rope(&q.transpose(1, 2));
            let k = rope(&k.transpose(1, 2));
            let v = self.proj(li, Target::V, &xn, &layer.v, layer.v_bias.as_ref()).view([b, t, kvh, hd]);
            let k_rows = k.transpose(1, 2).reshape([b * t, kvh, hd]);
            let _ = cache.k[li].index_put_(&[Some(&flat_rows), Some(&flat_pos)], &k_rows, false);
            let _ = cache.v[li].index_put_(&[Some(&flat_rows), Some(&flat_pos)], &v.reshape([b * t, kvh, hd]), false);
            let k_all = cache.k[li].index_select(0, rows).narrow(1, 0, span).permute([0, 2, 1, 3]);
            let v_all = cache.v[li].index_select(0, rows).narrow(1, 0, span).permute([0, 2, 1, 3]);
            let (k_all, v_all) = repeat_kv(k_all, v_all, [b, kvh, span, hd], h);
            let att = if self.invariant {
                crate::invariant::attention(&q, &k_all, &v_all, &allowed.unsqueeze(1))
            } else {
                let scores = q.matmul(&k_all.transpose(-2, -1)) * (1.0 / (hd as f64).sqrt()) + &mask;
                scores.softmax(-1, Kind::Float).to_kind(self.kind()).matmul(&v_all)
            };
            let att = att.transpose(1, 2).contiguous().view([b, t, h * hd]);
            x = x + self.proj(li, Target::O, &att, &layer.o, layer.o_bias.as_ref());
            let xn = rms_norm(&x, &layer.ln2, cfg.norm_eps);
            x = x + self.mlp(li, layer, &xn, route.as_deref_mut());
        }
        self.lin(&rms_norm(&x, &self.norm, cfg.norm_eps), &self.lm_head, None).to_kind(Kind::Float)
    }

    /// Rotary position embedding at `positions` [B, T]: rotates queries or keys [B, heads, T, hd].
    fn rotary(&self, positions: &Tensor, b: i64, t: i64) -> impl Fn(&Tensor) -> Tensor {
        let hd = self.cfg.head_dim() as i64;
        let flat_pos = positions.reshape([-1]);
        let cos = self.cos.index_select(0, &flat_pos).view([b, 1, t, hd]).to_kind(self.kind());
        let sin = self.sin.index_select(0, &flat_pos).view([b, 1, t, hd]).to_kind(self.kind());
        move |x: &Tensor| -> Tensor {
            let x1 = x.narrow(-1, 0, hd / 2);
            let x2 = x.narrow(-1, hd / 2, hd / 2);
            let rot = Tensor::cat(&[&x2.neg(), &x1], -1);
            x * &cos + rot * &sin
        }
    }

    /// Every weight: the base parameters, then the attached adapters (PEFT names).
    pub fn snapshot(&self, version: u64) -> Result<WeightSnapshot, RunError> {
        let adapters: Vec<(String, Tensor)> = self.loras.iter().flat_map(Adapters::named).collect();
        let tensors = self.params.iter().chain(&adapters).map(|(n, t)| named_tensor(n, t)).collect::<Result<_, _>>()?;
        Ok(WeightSnapshot { version, tensors })
    }

    /// The attached adapters alone: a LoRA weight update once the engines hold the base.
    pub fn adapter_snapshot(&self, version: u64) -> Result<WeightSnapshot, RunError> {
        let adapters: Vec<(String, Tensor)> = self.loras.iter().flat_map(Adapters::named).collect();
        let tensors = adapters.iter().map(|(n, t)| named_tensor(n, t)).collect::<Result<_, _>>()?;
        Ok(WeightSnapshot { version, tensors })
    }

    /// Attaches fresh adapters from `lora_spec`, one per adapter it names (no-op without one, or
    /// when attached already).
    pub fn attach_lora(&mut self) {
        if let (true, Some(s)) = (self.loras.is_empty(), &self.lora_spec) {
            self.loras = (0..s.names().len()).map(|i| Adapters::init(&self.cfg, s, i)).collect();
            self.active = 0;
        }
    }

    /// Loads adapter tensors (every attached adapter's, in order) from an update or checkpoint.
    fn load_adapters(&mut self, tensors: &[NamedTensor], what: &str) -> Result<(), RunError> {
        let mut rest = tensors;
        for l in &mut self.loras {
            let n = l.named().len().min(rest.len());
            let (mine, more) = rest.split_at(n);
            l.load(mine, what)?;
            rest = more;
        }
        match rest.first() {
            Some(t) => {
                Err(RunError::new(E_BACKEND, format!("{what}: adapter tensor {} belongs to no adapter here", t.name)))
            }
            None => Ok(()),
        }
    }

    /// Copies a snapshot into this policy: either every base parameter (names and shapes must
    /// match), optionally followed by adapters, or adapters alone (a LoRA update: the base stays).
    pub fn load_snapshot(&mut self, w: &WeightSnapshot) -> Result<(), RunError> {
        let split = w.tensors.iter().position(|t| is_adapter_name(&t.name)).unwrap_or(w.tensors.len());
        let (base, adapters) = w.tensors.split_at(split);
        if !adapters.is_empty() {
            if self.lora_spec.is_none() {
                return Err(RunError::new(
                    E_BACKEND,
                    format!("weight update {} carries LoRA adapters, but this policy has no LoRA settings", w.version),
                ));
            }
            self.attach_lora();
        }
        if base.is_empty() && !adapters.is_empty() {
            return self.load_adapters(adapters, &format!("weight update {}", w.version));
        }
        if base.len() != self.params.len() {
            return Err(RunError::new(
                E_BACKEND,
                format!("weight snapshot has {} tensors, the policy {}", base.len(), self.params.len()),
            ));
        }
        let _g = tch::no_grad_guard();
        for (nt, (name, p)) in base.iter().zip(self.params.iter_mut()) {
            let shape: Vec<i64> = nt.shape.iter().map(|&d| d as i64).collect();
            if nt.name != *name || shape != p.size() {
                return Err(RunError::new(
                    E_BACKEND,
                    format!("weight snapshot tensor {} {:?} does not match {} {:?}", nt.name, shape, name, p.size()),
                ));
            }
            p.f_copy_(&crate::device::from_slice(&nt.data).view(&shape[..])).map_err(backend_err)?;
        }
        if adapters.is_empty() {
            // A full update without adapters: the policy is the base alone (before RL began).
            self.loras.clear();
            return Ok(());
        }
        self.load_adapters(adapters, &format!("weight update {}", w.version))
    }

    /// The base with the active adapter merged in (`W + (alpha/r) B A`), adapters detached: what
    /// a Hugging Face loader that knows no LoRA reads. A copy; `self` is unchanged.
    pub fn merged(&self) -> Policy {
        let Some(l) = self.lora() else { return self.deep_copy() };
        let params = self
            .params
            .iter()
            .map(|(n, t)| {
                let t = match l.wraps(n) {
                    Some((li, target)) => l.merged(li, target, t),
                    None => t.detach().copy(),
                };
                (n.clone(), t)
            })
            .collect();
        let mut p = Policy::from_params(self.cfg.clone(), params);
        p.lora_spec = self.lora_spec.clone();
        p
    }

    /// model.safetensors + config.json (a Hugging Face directory without tokenizer files) into
    /// an existing `dir`; callers that need atomicity write into a temp dir (`export_hf` does).
    pub fn save(&self, dir: &Path) -> Result<(), RunError> {
        let config = crate::hf::config_json(&self.cfg)?;
        let named: Vec<(&str, Tensor)> = self.params.iter().map(|(n, t)| (n.as_str(), t.detach())).collect();
        write_tensors(&named, &dir.join("model.safetensors"))?;
        miles_runtime::exec::write_json(&dir.join("config.json"), &config)
    }

    /// Reads a directory written by `save` (or any Hugging Face directory `load_hf` reads).
    pub fn load(dir: &Path) -> Result<Policy, RunError> {
        Policy::load_hf(dir, None).map(|(p, _)| p)
    }

    /// Overwrites parameters from a safetensors file holding exactly this model's tensors.
    pub fn load_tensors(&mut self, path: &Path) -> Result<(), RunError> {
        load_named(&mut self.params, read_tensors(path)?, path)
    }
}

/// A shallow handle on the parameter `name` of `params`, or an empty tensor that fails at the
/// first forward (callers check names and shapes before building a model from them).
pub(crate) fn param_by_name(params: &[(String, Tensor)], name: &str) -> Tensor {
    params
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, t)| t.shallow_clone())
        .unwrap_or_else(|| Tensor::zeros([0], (Kind::Float, crate::device::current())))
}

/// The one safetensors writer of checkpoints and exports: an error names the file.
pub(crate) fn write_tensors<S: AsRef<str>, T: AsRef<Tensor>>(named: &[(S, T)], path: &Path) -> Result<(), RunError> {
    // The writer reads host memory: GPU tensors are copied to the host first.
    let host: Vec<(&str, Tensor)> =
        named.iter().map(|(n, t)| (n.as_ref(), t.as_ref().to_device(Device::Cpu))).collect();
    Tensor::write_safetensors(&host, path)
        .map_err(|e| RunError::new(E_CHECKPOINT, format!("cannot write {}: {e}", path.display())))
}

/// The one safetensors reader of checkpoints (Hugging Face loading has its own messages).
pub(crate) fn read_tensors(path: &Path) -> Result<Vec<(String, Tensor)>, RunError> {
    Tensor::read_safetensors(path)
        .map_err(|e| RunError::new(E_CHECKPOINT, format!("cannot read {}: {e}", path.display())))
}

/// A tensor's values as f32, flattened.
pub(crate) fn f32_values(t: &Tensor) -> Result<Vec<f32>, RunError> {
    Vec::<f32>::try_from(t.detach().to_kind(Kind::Float).contiguous().view([-1])).map_err(backend_err)
}

pub(crate) fn named_tensor(name: &str, t: &Tensor) -> Result<NamedTensor, RunError> {
    Ok(NamedTensor {
        name: name.to_string(),
        shape: t.size().iter().map(|&d| d as usize).collect(),
        data: f32_values(t)?,
    })
}

/// Tensors read from a file as weight-snapshot entries.
pub(crate) fn named_tensors(read: Vec<(String, Tensor)>) -> Result<Vec<NamedTensor>, RunError> {
    read.iter().map(|(n, t)| named_tensor(n, t)).collect()
}

/// Copies `read` into `dst` by name; every name must be present with the same shape.
pub(crate) fn load_named(
    dst: &mut [(String, Tensor)],
    read: Vec<(String, Tensor)>,
    path: &Path,
) -> Result<(), RunError> {
    let map: std::collections::HashMap<String, Tensor> = read.into_iter().collect();
    let _g = tch::no_grad_guard();
    for (name, p) in dst.iter_mut() {
        let src = map
            .get(name)
            .ok_or_else(|| RunError::new(E_CHECKPOINT, format!("{}: missing tensor {name}", path.display())))?;
        if src.size() != p.size() || src.kind() != Kind::Float {
            return Err(RunError::new(
                E_CHECKPOINT,
                format!(
                    "{}: tensor {name} is {:?} {:?}, expected {:?} f32",
                    path.display(),
                    src.size(),
                    src.kind(),
                    p.size()
                ),
            ));
        }
        p.f_copy_(src).map_err(backend_err)?;
    }
    Ok(())
}

/// Grouped-query attention: each of the `kvh` key/value heads [B, KVH, S, hd] serves `h / kvh`
/// query heads, so keys and values are repeated to [B, H, S, hd] (returned as they are when
/// `kvh == h`).
fn repeat_kv(k: Tensor, v: Tensor, [b, kvh, s, hd]: [i64; 4], h: i64) -> (Tensor, Tensor) {
    if kvh == h {
        return (k, v);
    }
    let g = h / kvh;
    let rep = |x: &Tensor| x.unsqueeze(2).expand([b, kvh, g, s, hd], false).reshape([b, h, s, hd]);
    (rep(&k), rep(&v))
}

fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> Tensor {
    // libtorch's native RMSNorm: x * rsqrt(mean(x^2) + eps) * w over the last dimension.
    x.rms_norm(w.size(), Some(w), eps)
}

/// Left-pads `seqs` with PAD. Returns tokens [B, L], key_valid [B, L] (bool) and positions [B, L]
/// (index among the row's real tokens; 0 on pads).
pub fn left_pad(seqs: &[Vec<i64>]) -> (Tensor, Tensor, Tensor, i64) {
    let l = seqs.iter().map(|s| s.len()).max().unwrap_or(0).max(1);
    let b = seqs.len();
    let mut tok = vec![0i64; b * l];
    let mut valid = vec![false; b * l];
    let mut pos = vec![0i64; b * l];
    for (i, s) in seqs.iter().enumerate() {
        let off = l - s.len();
        for (j, &t) in s.iter().enumerate() {
            tok[i * l + off + j] = t;
            valid[i * l + off + j] = true;
            pos[i * l + off + j] = j as i64;
        }
    }
    let shape = [b as i64, l as i64];
    (
        crate::device::from_slice(&tok).view(shape),
        crate::device::from_slice(&valid).view(shape),
        crate::device::from_slice(&pos).view(shape),
        l as i64,
    )
}
