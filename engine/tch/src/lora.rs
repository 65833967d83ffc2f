//! LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models") laid out as PEFT
//! lays it out: a wrapped linear layer W [out, in] gets A [r, in] and B [out, r] and computes
//! `W x + (alpha / r) B A dropout(x)`. A starts uniform in +-1/sqrt(in) (PEFT's
//! kaiming-uniform with a = sqrt(5)), B at zero, so an adapted policy starts equal to its base.
//!
//! The rollout engines run the adapters **unmerged** too (the base stays as loaded and each
//! wrapped layer adds its low-rank term), rather than merging `B A` into W and subtracting the
//! previous adapter at every update: the trainer and the engines then compute the same
//! operations on the same tensors (no train-rollout mismatch from merging), repeated updates
//! cannot accumulate rounding into the base, and an update is the adapter tensors alone. The
//! cost is two thin matmuls per wrapped layer and token. Merging happens once, at export
//! ([`Adapters::merged`]).
//!
//! Tensor names are PEFT's (`base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`),
//! in weight updates, checkpoints and the exported `adapter_model.safetensors` alike. With several
//! named adapters on one base (multi-LoRA) the name goes where PEFT puts it in memory
//! (`...q_proj.lora_A.<name>.weight`); each exported adapter directory drops it, as PEFT's do.

use crate::model::{backend_err, named_tensor, read_tensors, write_tensors};
use miles_runtime::rng::Rng;
use miles_runtime::{LoraSpec, ModelConfig, NamedTensor, RunError, E_BACKEND, E_CHECKPOINT};
use std::cell::Cell;
use std::path::Path;
use tch::{Kind, Tensor};

/// A linear layer of a transformer layer that LoRA can wrap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Q,
    K,
    V,
    O,
    Gate,
    Up,
    Down,
}

impl Target {
    pub const ALL: [Target; 7] = [Target::Q, Target::K, Target::V, Target::O, Target::Gate, Target::Up, Target::Down];

    /// The Hugging Face (and PEFT `target_modules`) name.
    pub fn hf(self) -> &'static str {
        match self {
            Target::Q => "q_proj",
            Target::K => "k_proj",
            Target::V => "v_proj",
            Target::O => "o_proj",
            Target::Gate => "gate_proj",
            Target::Up => "up_proj",
            Target::Down => "down_proj",
        }
    }

    pub fn parse(name: &str) -> Option<Target> {
        Target::ALL.into_iter().find(|t| t.hf() == name)
    }

    /// The module path inside a layer.
    fn module(self) -> String {
        let block = if matches!(self, Target::Gate | Target::Up | Target::Down) { "mlp" } else { "self_attn" };
        format!("{block}.{}", self.hf())
    }

    /// (out, in) of the wrapped weight.
    pub fn shape(self, cfg: &ModelConfig) -> (i64, i64) {
        let d = cfg.d_model as i64;
        let q = (cfg.n_heads * cfg.head_dim()) as i64;
        let kv = (cfg.n_kv_heads * cfg.head_dim()) as i64;
        let ff = cfg.d_ff as i64;
        match self {
            Target::Q => (q, d),
            Target::K | Target::V => (kv, d),
            Target::O => (d, q),
            Target::Gate | Target::Up => (ff, d),
            Target::Down => (d, ff),
        }
    }
}

/// PEFT's name of layer `layer`'s adapter matrix `which` ("lora_A" or "lora_B") on `t`, of the
/// adapter `adapter` (None: the one adapter, PEFT's file naming).
pub fn peft_name(layer: usize, t: Target, which: &str, adapter: Option<&str>) -> String {
    let m = t.module();
    match adapter {
        Some(a) => format!("base_model.model.model.layers.{layer}.{m}.{which}.{a}.weight"),
        None => format!("base_model.model.model.layers.{layer}.{m}.{which}.weight"),
    }
}

/// The base weight an adapter name belongs to (`model.layers.0.self_attn.q_proj.weight`).
pub fn base_name(layer: usize, t: Target) -> String {
    format!("model.layers.{layer}.{}.weight", t.module())
}

pub fn is_adapter_name(name: &str) -> bool {
    name.contains(".lora_A.") || name.contains(".lora_B.")
}

struct Adapter {
    a: Tensor,
    b: Tensor,
}

/// The adapters of one policy: one (A, B) per wrapped layer.
pub struct Adapters {
    pub spec: LoraSpec,
    /// This adapter's name among several (multi-LoRA); None for the one adapter of a run.
    pub name: Option<String>,
    scale: f64,
    /// `layers[l][i]` wraps `Target::ALL[i]` of layer l.
    layers: Vec<[Option<Adapter>; 7]>,
    /// Dropout is on in training forward passes only.
    training: Cell<bool>,
}

impl Adapters {
    /// Fresh adapters for `cfg` (A seeded from `spec.init_seed`, B zero), the `index`-th of
    /// `spec.names()`. `spec` was validated (`RunSpec::validate`): targets are known names.
    pub fn init(cfg: &ModelConfig, spec: &LoraSpec, index: usize) -> Adapters {
        let name = spec.names().get(index).copied().flatten().map(str::to_string);
        let r = spec.rank as i64;
        let targets: Vec<Target> = spec.target_modules.iter().filter_map(|n| Target::parse(n)).collect();
        let layers = (0..cfg.n_layers)
            .map(|l| {
                std::array::from_fn(|i| {
                    let t = Target::ALL[i];
                    targets.contains(&t).then(|| {
                        let (out, inp) = t.shape(cfg);
                        let bound = 1.0 / (inp as f64).sqrt();
                        let slot = ((index * cfg.n_layers + l) * 7 + i) as u64;
                        let mut rng = Rng::derived(spec.init_seed, "lora", slot);
                        let data: Vec<f32> =
                            (0..r * inp).map(|_| ((rng.next_f64() * 2.0 - 1.0) * bound) as f32).collect();
                        Adapter {
                            a: crate::device::from_slice(&data).view([r, inp]),
                            b: Tensor::zeros([out, r], (Kind::Float, crate::device::current())),
                        }
                    })
                })
            })
            .collect();
        Adapters { scale: spec.scale(), spec: spec.clone(), name, layers, training: Cell::new(false) }
    }

    /// Every adapter tensor with its PEFT name, layer by layer, A before B: the order of updates,
    /// checkpoints and the optimizer state. Shallow clones (same storage).
    pub fn named(&self) -> Vec<(String, Tensor)> {
        self.named_as(self.name.as_deref())
    }

    /// `named` under the adapter name `adapter` (None: PEFT's file naming).
    fn named_as(&self, adapter: Option<&str>) -> Vec<(String, Tensor)> {
        let mut out = Vec::new();
        for (l, slots) in self.layers.iter().enumerate() {
            for (i, ad) in slots.iter().enumerate() {
                if let Some(ad) = ad {
                    out.push((peft_name(l, Target::ALL[i], "lora_A", adapter), ad.a.shallow_clone()));
                    out.push((peft_name(l, Target::ALL[i], "lora_B", adapter), ad.b.shallow_clone()));
                }
            }
        }
        out
    }

    /// Adapter parameters (A and B, all layers).
    pub fn numel(&self) -> usize {
        self.named().iter().map(|(_, t)| t.numel()).sum()
    }

    pub fn set_requires_grad(&self, on: bool) {
        for (_, t) in self.named() {
            let _ = t.set_requires_grad(on);
        }
    }

    pub fn set_training(&self, on: bool) {
        self.training.set(on);
    }

    pub fn deep_copy(&self) -> Adapters {
        let layers = self
            .layers
            .iter()
            .map(|slots| {
                std::array::from_fn(|i| {
                    slots[i].as_ref().map(|ad| Adapter { a: ad.a.detach().copy(), b: ad.b.detach().copy() })
                })
            })
            .collect();
        Adapters {
            spec: self.spec.clone(),
            name: self.name.clone(),
            scale: self.scale,
            layers,
            training: Cell::new(false),
        }
    }

    /// The low-rank term of `t` in layer `layer` for input `x` [.., in], if `t` is wrapped.
    pub fn delta(&self, layer: usize, t: Target, x: &Tensor) -> Option<Tensor> {
        let ad = self.layers.get(layer)?[t as usize].as_ref()?;
        let p = self.spec.dropout;
        let x = if self.training.get() && p > 0.0 { x.dropout(p, true) } else { x.shallow_clone() };
        Some(x.linear::<Tensor>(&ad.a, None).linear::<Tensor>(&ad.b, None) * self.scale)
    }

    /// The low-rank terms of several layers whose outputs the forward pass computes as one
    /// concatenated GEMM (q, k, v; gate, up): their deltas concatenated along the last axis,
    /// zeros for an unwrapped one; None when none of them is wrapped.
    pub fn delta_cat(&self, layer: usize, parts: &[(Target, i64)], x: &Tensor) -> Option<Tensor> {
        let ds: Vec<Option<Tensor>> = parts.iter().map(|&(t, _)| self.delta(layer, t, x)).collect();
        if ds.iter().all(Option::is_none) {
            return None;
        }
        let mut lead = x.size();
        lead.pop();
        let cols: Vec<Tensor> = ds
            .into_iter()
            .zip(parts)
            .map(|(d, &(_, out))| {
                d.unwrap_or_else(|| {
                    let mut shape = lead.clone();
                    shape.push(out);
                    Tensor::zeros(&shape[..], (Kind::Float, crate::device::current()))
                })
            })
            .collect();
        Some(Tensor::cat(&cols, -1))
    }

    /// Copies adapter tensors from a weight update or a checkpoint; the names and shapes must be
    /// exactly this policy's adapters (`what` names the source in the error).
    pub fn load(&mut self, tensors: &[NamedTensor], what: &str) -> Result<(), RunError> {
        let named = self.named();
        if tensors.len() != named.len() {
            return Err(RunError::new(
                E_BACKEND,
                format!("{what} holds {} adapter tensors, this policy's LoRA has {}", tensors.len(), named.len()),
            )
            .with_help("the adapters were made for another rank, target_modules or model"));
        }
        let _g = tch::no_grad_guard();
        for (nt, (name, p)) in tensors.iter().zip(named) {
            let shape: Vec<i64> = nt.shape.iter().map(|&d| d as i64).collect();
            if nt.name != name || shape != p.size() {
                return Err(RunError::new(
                    E_BACKEND,
                    format!("{what}: adapter tensor {} {shape:?} does not match {name} {:?}", nt.name, p.size()),
                )
                .with_help("the adapters were made for another rank, target_modules or model"));
            }
            let mut p = p;
            p.f_copy_(&crate::device::from_slice(&nt.data).view(&shape[..])).map_err(backend_err)?;
        }
        Ok(())
    }

    /// `w + scale * B A` for the base weight `w` of `t` in `layer` (`w` itself when unwrapped).
    pub fn merged(&self, layer: usize, t: Target, w: &Tensor) -> Tensor {
        let _g = tch::no_grad_guard();
        match self.layers.get(layer).and_then(|s| s[t as usize].as_ref()) {
            Some(ad) => w.detach() + ad.b.detach().matmul(&ad.a.detach()) * self.scale,
            None => w.detach(),
        }
    }

    /// Which adapter (layer, target) a base weight name belongs to.
    pub fn wraps(&self, base: &str) -> Option<(usize, Target)> {
        self.layers.iter().enumerate().find_map(|(l, slots)| {
            slots
                .iter()
                .enumerate()
                .find(|(i, ad)| ad.is_some() && base_name(l, Target::ALL[*i]) == base)
                .map(|(i, _)| (l, Target::ALL[i]))
        })
    }

    /// PEFT's adapter directory: `adapter_config.json` and `adapter_model.safetensors`, into an
    /// existing `dir` (callers write into a temp directory and rename it into place).
    pub fn write_peft(&self, dir: &Path, base_model: Option<&str>) -> Result<(), RunError> {
        let named: Vec<(String, Tensor)> = self.named_as(None).into_iter().map(|(n, t)| (n, t.detach())).collect();
        write_tensors(&named, &dir.join("adapter_model.safetensors"))?;
        miles_runtime::exec::write_json(&dir.join("adapter_config.json"), &self.peft_config(base_model))
    }

    /// PEFT's `LoraConfig` as `save_pretrained` writes it, for the settings we run (plain LoRA:
    /// no DoRA, no rsLoRA, no bias training, every layer).
    pub fn peft_config(&self, base_model: Option<&str>) -> serde_json::Value {
        let targets: Vec<&str> = Target::ALL
            .into_iter()
            .filter(|t| self.spec.target_modules.iter().any(|n| n == t.hf()))
            .map(Target::hf)
            .collect();
        serde_json::json!({
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "base_model_name_or_path": base_model,
            "r": self.spec.rank,
            "lora_alpha": self.spec.alpha,
            "lora_dropout": self.spec.dropout,
            "target_modules": targets,
            "bias": "none",
            "fan_in_fan_out": false,
            "inference_mode": true,
            "init_lora_weights": true,
            "modules_to_save": null,
            "layers_to_transform": null,
            "layers_pattern": null,
            "rank_pattern": {},
            "alpha_pattern": {},
            "use_rslora": false,
            "use_dora": false,
            "revision": null,
        })
    }
}

/// Reads a PEFT adapter directory for a model of `cfg`: its `adapter_config.json` must describe
/// plain LoRA, and its tensors must be exactly the adapters that config implies.
pub fn read_peft(dir: &Path, cfg: &ModelConfig) -> Result<Adapters, RunError> {
    let spec = peft_spec(dir)?;
    let mut ad = Adapters::init(cfg, &spec, 0);
    load_peft_tensors(&mut ad, dir)?;
    Ok(ad)
}

/// The run's one adapter started from the PEFT directory `spec.init` (`lora { init }`): the
/// recipe's rank, alpha and targets (which `miles check` compared with the file's; compared
/// again here, in case the file changed since), the file's A and B.
pub fn init_from_peft(cfg: &ModelConfig, spec: &LoraSpec, dir: &Path) -> Result<Adapters, RunError> {
    if !spec.adapters.is_empty() {
        return Err(RunError::new(
            E_CHECKPOINT,
            "`lora { init }` starts one adapter, not the named adapters of a multi-LoRA run",
        ));
    }
    let file = peft_spec(dir)?;
    let set = |t: &[String]| {
        let mut v: Vec<String> = t.to_vec();
        v.sort();
        v.dedup();
        v
    };
    let differs = if file.rank != spec.rank {
        Some(format!("r = {} (the recipe's rank {})", file.rank, spec.rank))
    } else if (file.alpha - spec.alpha).abs() > 1e-9 * spec.alpha.abs().max(1.0) {
        Some(format!("lora_alpha = {} (the recipe's alpha {})", file.alpha, spec.alpha))
    } else if set(&file.target_modules) != set(&spec.target_modules) {
        Some(format!("target_modules = {:?} (the recipe's {:?})", file.target_modules, spec.target_modules))
    } else {
        None
    };
    if let Some(d) = differs {
        return Err(RunError::new(
            E_CHECKPOINT,
            format!("{}: {d}; it changed after `miles check` read it", dir.join("adapter_config.json").display()),
        )
        .with_help("run `miles check` (or `miles run`) again on the recipe"));
    }
    let mut ad = Adapters::init(cfg, spec, 0);
    load_peft_tensors(&mut ad, dir)?;
    Ok(ad)
}

/// The `LoraSpec` an adapter_config.json describes (plain LoRA only).
fn peft_spec(dir: &Path) -> Result<LoraSpec, RunError> {
    let cp = dir.join("adapter_config.json");
    let text = std::fs::read_to_string(&cp).map_err(|e| RunError::io(E_CHECKPOINT, "cannot read", &cp, e))?;
    let c: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| RunError::new(E_CHECKPOINT, format!("{}: {e}", cp.display())))?;
    let bad = |why: String| RunError::new(E_CHECKPOINT, format!("{}: {why}", cp.display()));
    if c["peft_type"].as_str() != Some("LORA") {
        return Err(bad(format!("peft_type is {}, only LORA adapters are supported", c["peft_type"])));
    }
    for flag in ["use_dora", "use_rslora", "fan_in_fan_out"] {
        if c[flag].as_bool() == Some(true) {
            return Err(bad(format!("`{flag}` adapters are not supported (plain LoRA only)")));
        }
    }
    if c["bias"].as_str().is_some_and(|b| b != "none") {
        return Err(bad(format!("bias = {} is not supported (only \"none\")", c["bias"])));
    }
    let rank = c["r"].as_u64().ok_or_else(|| bad("no integer `r`".into()))? as usize;
    let alpha = c["lora_alpha"].as_f64().ok_or_else(|| bad("no number `lora_alpha`".into()))?;
    let targets: Vec<String> = match &c["target_modules"] {
        serde_json::Value::Array(a) => a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect(),
        other => return Err(bad(format!("target_modules {other} is not a list of module names"))),
    };
    if let Some(x) = targets.iter().find(|t| Target::parse(t).is_none()) {
        return Err(bad(format!("target module `{x}` is not a linear layer of this model")));
    }
    Ok(LoraSpec {
        rank,
        alpha,
        dropout: c["lora_dropout"].as_f64().unwrap_or(0.0),
        target_modules: targets,
        init_seed: 0,
        adapters: Vec::new(),
        init: None,
    })
}

/// Copies `dir`'s adapter_model.safetensors into `ad`: exactly its tensors, of its shapes.
fn load_peft_tensors(ad: &mut Adapters, dir: &Path) -> Result<(), RunError> {
    let wp = dir.join("adapter_model.safetensors");
    let mut map: std::collections::HashMap<String, Tensor> = read_tensors(&wp)?.into_iter().collect();
    let mut tensors = Vec::new();
    for (name, _) in ad.named() {
        let t = map
            .remove(&name)
            .ok_or_else(|| RunError::new(E_CHECKPOINT, format!("{}: missing tensor {name}", wp.display())))?;
        tensors.push(named_tensor(&name, &t)?);
    }
    if let Some(extra) = map.keys().next() {
        return Err(RunError::new(E_CHECKPOINT, format!("{}: unexpected tensor {extra}", wp.display())));
    }
    ad.load(&tensors, &wp.display().to_string())
}
