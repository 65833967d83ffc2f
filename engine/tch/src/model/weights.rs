//! The policy's weights in and out: snapshots for weight updates (the base, the adapters or
//! both), the merged model a LoRA-unaware loader reads, and model.safetensors + config.json.

use super::tensors::{load_named, named_tensor, read_tensors, write_tensors};
use super::{backend_err, Policy};
use crate::lora::{is_adapter_name, Adapters};
use miles_runtime::{ModelConfig, NamedTensor, RunError, WeightSnapshot, E_BACKEND, E_CHECKPOINT};
use std::path::Path;
use tch::Tensor;

/// A checkpoint's model description where no config.json can say it (`Policy::save`).
pub const MODEL_CONFIG_FILE: &str = "miles_model.json";

impl Policy {
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

    /// Attaches the adapters of `lora_spec`, one per adapter it names (no-op without one, or
    /// when attached already): fresh, or the PEFT adapter it starts from (`init`).
    pub fn attach_lora(&mut self) -> Result<(), RunError> {
        if let (true, Some(s)) = (self.loras.is_empty(), &self.lora_spec) {
            self.loras = match &s.init {
                Some(dir) => vec![crate::lora::init_from_peft(&self.cfg, s, dir)?],
                None => (0..s.names().len()).map(|i| Adapters::init(&self.cfg, s, i)).collect(),
            };
            self.active = 0;
        }
        Ok(())
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
            self.attach_lora()?;
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
    /// A mixture of experts no transformers class holds (a shared expert, sigmoid gating, Llama
    /// attention with dense layers, ...) is a checkpoint all the same: its own parameter names
    /// and `MODEL_CONFIG_FILE` (its `ModelConfig`) instead of config.json, which `load` reads.
    pub fn save(&self, dir: &Path) -> Result<(), RunError> {
        match crate::hf::config_json(&self.cfg) {
            Ok((config, arch)) => {
                crate::hf::write_weights(self, dir, arch)?;
                miles_runtime::exec::write_json(&dir.join("config.json"), &config)
            }
            Err(_) if self.cfg.moe.is_some() => {
                let named: Vec<(&str, Tensor)> = self.params.iter().map(|(n, t)| (n.as_str(), t.detach())).collect();
                write_tensors(&named, &dir.join("model.safetensors"))?;
                let cfg =
                    serde_json::to_value(&self.cfg).map_err(|e| RunError::internal(format!("model config: {e}")))?;
                miles_runtime::exec::write_json(&dir.join(MODEL_CONFIG_FILE), &cfg)
            }
            Err(e) => Err(e),
        }
    }

    /// Reads a directory written by `save` (or any Hugging Face directory `load_hf` reads).
    pub fn load(dir: &Path) -> Result<Policy, RunError> {
        let own = dir.join(MODEL_CONFIG_FILE);
        if dir.join("config.json").is_file() || !own.is_file() {
            return Policy::load_hf(dir, None).map(|(p, _)| p);
        }
        let text = std::fs::read_to_string(&own).map_err(|e| RunError::io(E_CHECKPOINT, "cannot read", &own, e))?;
        let cfg: ModelConfig = serde_json::from_str(&text)
            .map_err(|e| RunError::new(E_CHECKPOINT, format!("{}: not a model config: {e}", own.display())))?;
        let mut p = Policy::init(&cfg, 0);
        p.load_tensors(&dir.join("model.safetensors"))?;
        Ok(p)
    }

    /// Overwrites parameters from a safetensors file holding exactly this model's tensors, under
    /// its own names or, for a Mixtral, Mixtral's (a checkpoint `save` wrote).
    pub fn load_tensors(&mut self, path: &Path) -> Result<(), RunError> {
        let read = read_tensors(path)?.into_iter().map(|(n, t)| (crate::hf::moe::own_name(&n), t)).collect();
        load_named(&mut self.params, read, path)
    }
}
