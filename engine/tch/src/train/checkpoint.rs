//! The trainer's checkpoints: the model, the adapters (PEFT names), the optimizer's moments, the
//! frozen reference, PPO's critic and the step counters, and their loading on resume.

use super::optim::AdamState;
use super::TchTrainer;
use crate::critic::Critic;
use crate::model::{load_named, named_tensors, read_tensors, write_tensors};
use miles_runtime::{NamedTensor, RunError, WeightSnapshot, E_CHECKPOINT};
use std::path::Path;
use tch::Tensor;

/// A checkpoint's adapters (PEFT names, as in `adapter_model.safetensors`).
const ADAPTER_FILE: &str = "adapter_model.safetensors";

/// The whole optimizer states a ZeRO-1 checkpoint writes: the policy's (one per adapter under
/// LoRA) and the critic's.
type Gathered = (Vec<AdamState>, Option<AdamState>);

impl TchTrainer {
    /// Writes the checkpoint. In a data-parallel group every rank calls it at once: under ZeRO-1
    /// the ranks first send their moments' shards (a transient whole copy on each), then rank 0
    /// writes exactly the files one process writes and the others write nothing. The files do not
    /// depend on the group, so a checkpoint from N ranks resumes on any M (`load`).
    pub fn save(&self, dir: &Path) -> Result<(), RunError> {
        let gathered = self.gathered_optimizer()?;
        if self.dp_rank().0 != 0 {
            return Ok(());
        }
        let (states, critic_state) = match &gathered {
            Some((s, c)) => (s.as_slice(), c.as_ref()),
            None => (self.adam.as_slice(), self.critic.as_ref().map(|c| &c.adam)),
        };
        self.policy.save(dir)?;
        if !self.policy.adapters().is_empty() {
            let named: Vec<(String, Tensor)> =
                self.policy.adapters().iter().flat_map(|l| l.named()).map(|(n, t)| (n, t.detach())).collect();
            write_tensors(&named, &dir.join(ADAPTER_FILE))?;
        }
        write_tensors(&self.optimizer_tensors_of(states), &dir.join("optimizer.safetensors"))?;
        if let Some(r) = &self.reference {
            write_tensors(r.params(), &dir.join("reference.safetensors"))?;
        }
        if let (Some(c), Some(adam)) = (&self.critic, critic_state) {
            c.save_with(dir, adam)?;
        }
        miles_runtime::exec::write_json(
            &dir.join("trainer.json"),
            &serde_json::json!({
                "version": self.version,
                "adam_t": self.adam[0].t,
                "adam_steps": self.adam.iter().map(|a| a.t).collect::<Vec<_>>(),
                "critic_adam_t": self.critic.as_ref().map(|c| c.adam.t),
            }),
        )
    }

    /// ZeRO-1: the whole optimizer states (the policy's, one per adapter, and the critic's) from
    /// the ranks' shards; None when the optimizer is not sharded.
    fn gathered_optimizer(&self) -> Result<Option<Gathered>, RunError> {
        let Some(dp) = self.dp.as_ref().filter(|d| d.zero) else { return Ok(None) };
        let mut states = Vec::with_capacity(self.adam.len());
        for (set, adam) in self.optimizer_sets().iter().zip(&self.adam) {
            states.push(dp.gather_moments(set, adam)?);
        }
        let critic = match &self.critic {
            Some(c) => dp.gather_moments(&c.params(), &c.adam)?,
            None => None,
        };
        // Rank 0 holds every state whole; the others nothing (they write nothing).
        Ok(states.into_iter().collect::<Option<Vec<_>>>().map(|s| (s, critic)))
    }

    /// Loads a checkpoint. Every rank of a data-parallel group reads the whole files (the same
    /// weights everywhere) and, under ZeRO-1, keeps its shard of the moments: the checkpoint's
    /// files are one process's whatever group wrote them, so N ranks resume from M's.
    pub fn load(&mut self, dir: &Path) -> Result<(), RunError> {
        self.policy.load_tensors(&dir.join("model.safetensors"))?;
        self.base_stale.set(true);
        self.load_adapters(dir)?;
        let p = dir.join("optimizer.safetensors");
        let read = read_tensors(&p)?;
        self.fresh_full_optimizer();
        let mut named = self.optimizer_tensors_of(&self.adam);
        load_named(&mut named, read, &p)?;
        let rp = dir.join("reference.safetensors");
        if rp.exists() {
            let mut r = self.policy.deep_copy();
            // The reference is the policy RL started from: no adapters.
            r.set_adapters(Vec::new());
            r.load_tensors(&rp)?;
            r.set_requires_grad(false);
            self.reference = Some(r);
        }
        let tp = dir.join("trainer.json");
        let text = std::fs::read_to_string(&tp).map_err(|e| RunError::io(E_CHECKPOINT, "cannot read", &tp, e))?;
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| RunError::new(E_CHECKPOINT, format!("{}: {e}", tp.display())))?;
        self.version = v["version"].as_u64().unwrap_or(0);
        match v["adam_steps"].as_array() {
            Some(ts) => {
                for (a, t) in self.adam.iter_mut().zip(ts) {
                    a.t = t.as_u64().unwrap_or(0);
                }
            }
            None => self.adam[0].t = v["adam_t"].as_u64().unwrap_or(0),
        }
        self.critic = Critic::load(dir, &self.policy, v["critic_adam_t"].as_u64().unwrap_or(0))?;
        self.shard_optimizer();
        Ok(())
    }

    /// A checkpoint taken after LoRA began holds the adapters: they are attached (the base
    /// frozen) and loaded; one taken before holds none, and the trainer is back to full weights.
    fn load_adapters(&mut self, dir: &Path) -> Result<(), RunError> {
        let p = dir.join(ADAPTER_FILE);
        if !p.exists() {
            self.policy.set_adapters(Vec::new());
            self.policy.set_requires_grad(true);
            return Ok(());
        }
        if self.policy.lora_spec.is_none() {
            return Err(RunError::new(
                E_CHECKPOINT,
                format!("{} holds LoRA adapters, but the recipe's trainer has no `lora`", p.display()),
            )
            .with_help("add the `lora` the run was started with, or resume from a checkpoint of a full fine-tune"));
        }
        let tensors = named_tensors(read_tensors(&p)?)?;
        self.policy.set_adapters(Vec::new());
        self.begin_lora()?;
        // safetensors keeps names sorted; the adapters' own order is adapter by adapter, layer by
        // layer.
        let order: Vec<String> = self.policy.adapters().iter().flat_map(|l| l.named()).map(|(n, _)| n).collect();
        let mut by_name: std::collections::HashMap<String, NamedTensor> =
            tensors.into_iter().map(|t| (t.name.clone(), t)).collect();
        let mut ordered = Vec::with_capacity(order.len());
        for n in &order {
            match by_name.remove(n) {
                Some(t) => ordered.push(t),
                None => {
                    return Err(RunError::new(
                        E_CHECKPOINT,
                        format!(
                            "{}: missing adapter {n}: the checkpoint's LoRA differs from the recipe's",
                            p.display()
                        ),
                    ))
                }
            }
        }
        if let Some(extra) = by_name.keys().next() {
            return Err(RunError::new(
                E_CHECKPOINT,
                format!("{}: adapter {extra} is not in the recipe's LoRA (other rank or target_modules)", p.display()),
            ));
        }
        let snap = WeightSnapshot { version: 0, tensors: ordered };
        self.policy
            .load_snapshot(&snap)
            .map_err(|e| RunError::new(E_CHECKPOINT, format!("{}: {}", p.display(), e.message)))
    }
}
