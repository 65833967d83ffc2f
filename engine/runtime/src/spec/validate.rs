//! The constraints on a run spec that serde cannot express, checked section by section in one
//! fixed order (the first one broken is the error).

use super::*;
use crate::{RunError, E_SPEC};

/// The error of a broken constraint: E0504 with the field path.
fn bad(field: &str, why: &str) -> Result<(), RunError> {
    Err(RunError::new(E_SPEC, format!("run spec field `{field}`: {why}")))
}

impl RunSpec {
    /// Checks the constraints serde cannot express. Errors are E0504 with the field path.
    pub fn validate(&self) -> Result<(), RunError> {
        self.validate_model()?;
        self.validate_rollout()?;
        self.validate_train()?;
        self.validate_lora()?;
        self.validate_optimizer()?;
        self.validate_sections()?;
        self.validate_task()?;
        self.validate_schedule()?;
        self.validate_episodes_and_eval()
    }

    /// The model's sizes and layout.
    fn validate_model(&self) -> Result<(), RunError> {
        let m = &self.model;
        for (name, v) in [
            ("model.vocab_size", m.vocab_size),
            ("model.d_model", m.d_model),
            ("model.n_layers", m.n_layers),
            ("model.n_heads", m.n_heads),
            ("model.n_kv_heads", m.n_kv_heads),
            ("model.d_ff", m.d_ff),
            ("model.max_len", m.max_len),
        ] {
            if v == 0 {
                return bad(name, "must be at least 1");
            }
        }
        if m.head_dim.is_none() && m.d_model % m.n_heads != 0 {
            return bad("model.n_heads", "d_model must be a multiple of n_heads");
        }
        if m.head_dim() == 0 || m.head_dim() % 2 != 0 {
            return bad("model.n_heads", "head size must be even (rotary positions rotate pairs)");
        }
        if m.n_heads % m.n_kv_heads != 0 {
            return bad("model.n_kv_heads", "n_heads must be a multiple of n_kv_heads");
        }
        if (m.qk_norm || m.o_bias) && m.qkv_bias != m.o_bias {
            // The layouts of Llama (biases on all four or none), Qwen2 (q/k/v only) and Qwen3.
            return bad("model.o_bias", "o_bias needs qkv_bias, and with qk_norm the two go together");
        }
        if !(m.init_std > 0.0 && m.init_std.is_finite()) {
            return bad("model.init_std", "must be a positive number");
        }
        Ok(())
    }

    /// The rollout's batch and sampling settings.
    fn validate_rollout(&self) -> Result<(), RunError> {
        let r = &self.rollout;
        if r.rollout_batch == 0 {
            return bad("rollout.rollout_batch", "must be at least 1");
        }
        if r.samples_per_prompt == 0 {
            return bad("rollout.samples_per_prompt", "must be at least 1");
        }
        if r.max_new_tokens == 0 {
            return bad("rollout.max_new_tokens", "must be at least 1");
        }
        if !(r.temperature > 0.0 && r.temperature.is_finite()) {
            return bad("rollout.temperature", "must be > 0 (evaluation is greedy already)");
        }
        if !(r.top_p > 0.0 && r.top_p <= 1.0) {
            return bad("rollout.top_p", "must be in (0, 1]");
        }
        Ok(())
    }

    /// The trainer's learning rate and batches, and the distillation and PPO settings.
    fn validate_train(&self) -> Result<(), RunError> {
        let t = &self.train;
        if !(t.lr >= 0.0 && t.lr.is_finite()) {
            return bad("train.lr", "must be a finite number >= 0");
        }
        if t.micro_batch == 0 || t.global_batch == 0 {
            return bad("train.micro_batch", "micro_batch and global_batch must be >= 1");
        }
        if t.global_batch % t.micro_batch != 0 {
            return bad("train.global_batch", "must be a multiple of train.micro_batch");
        }
        if let Some(o) = &t.opd {
            for (field, v) in [("coef", o.coef), ("task_coef", o.task_coef)] {
                if !(v >= 0.0 && v.is_finite()) {
                    return bad(&format!("train.opd.{field}"), "must be a finite number >= 0");
                }
            }
            if t.lora.is_some() {
                return bad("train.lora", "distillation with LoRA is not run yet");
            }
        }
        if let Some(p) = &t.ppo {
            for (field, v) in [("critic_lr", p.critic_lr), ("value_clip", p.value_clip)] {
                if !(v >= 0.0 && v.is_finite()) {
                    return bad(&format!("train.ppo.{field}"), "must be a finite number >= 0");
                }
            }
            for (field, v) in [("gamma", p.gamma), ("lambda", p.lambda)] {
                if !(0.0..=1.0).contains(&v) {
                    return bad(&format!("train.ppo.{field}"), "must be in [0, 1]");
                }
            }
            if t.lora.is_some() {
                return bad("train.lora", "PPO's critic with LoRA is not run yet");
            }
        }
        self.validate_variants()
    }

    /// The algorithm variants' settings: passes over the batch, MIS's band, the overlong shaping.
    fn validate_variants(&self) -> Result<(), RunError> {
        let t = &self.train;
        if t.epochs == 0 {
            return bad("train.epochs", "must be at least 1 (passes over each rollout batch)");
        }
        if let Some(m) = &t.mis {
            if !(m.low >= 0.0 && m.low < 1.0) {
                return bad("train.mis.low", &format!("must be in [0, 1) (the band holds ratio 1), not {}", m.low));
            }
            if !(m.high > 1.0 && m.high.is_finite()) {
                return bad(
                    "train.mis.high",
                    &format!("must be a finite number > 1 (the band holds ratio 1), not {}", m.high),
                );
            }
        }
        if let Some(o) = &t.overlong {
            if o.max == 0 {
                return bad("train.overlong.max", "must be at least 1 token");
            }
            if o.cache > o.max {
                return bad(
                    "train.overlong.cache",
                    &format!("the soft band ({} tokens) must not exceed max ({} tokens)", o.cache, o.max),
                );
            }
            if !(o.penalty >= 0.0 && o.penalty.is_finite()) {
                return bad("train.overlong.penalty", "must be a finite number >= 0");
            }
        }
        Ok(())
    }

    /// LoRA and its named adapters.
    fn validate_lora(&self) -> Result<(), RunError> {
        let (m, t) = (&self.model, &self.train);
        if let Some(l) = &t.lora {
            if l.rank == 0 || l.rank > m.d_model {
                return bad("train.lora.rank", "must be between 1 and the model's d_model");
            }
            if !(l.alpha >= 0.0 && l.alpha.is_finite()) {
                return bad("train.lora.alpha", "must be a finite number >= 0");
            }
            if !(0.0..1.0).contains(&l.dropout) {
                return bad("train.lora.dropout", "must be in [0, 1)");
            }
            if l.target_modules.is_empty() {
                return bad("train.lora.target_modules", "needs at least one module");
            }
            if let Some(x) = l.target_modules.iter().find(|x| !LORA_TARGETS.contains(&x.as_str())) {
                return bad("train.lora.target_modules", &format!("`{x}` is not one of {}", LORA_TARGETS.join(", ")));
            }
            if !l.adapters.is_empty() && (!self.schedule.is_sync() || self.env.is_some()) {
                return bad(
                    "train.lora.adapters",
                    "named adapters run under the sync schedule, on single-turn prompts",
                );
            }
            for (i, a) in l.adapters.iter().enumerate() {
                let valid =
                    !a.name.is_empty() && a.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
                if !valid {
                    return bad(
                        "train.lora.adapters",
                        &format!("adapter name `{}` must be letters, digits, _ or -", a.name),
                    );
                }
                if l.adapters[..i].iter().any(|b| b.name == a.name) {
                    return bad("train.lora.adapters", &format!("two adapters are named `{}`", a.name));
                }
                if a.lr.is_some_and(|lr| !(lr >= 0.0 && lr.is_finite())) {
                    return bad(
                        "train.lora.adapters",
                        &format!("adapter `{}`: lr must be a finite number >= 0", a.name),
                    );
                }
            }
        }
        Ok(())
    }

    /// The batch split into optimizer steps, and the clip, TIS, KL and AdamW settings.
    fn validate_optimizer(&self) -> Result<(), RunError> {
        let (r, t) = (&self.rollout, &self.train);
        let total = r.rollout_batch * r.samples_per_prompt;
        if total % t.global_batch != 0 {
            return bad(
                "train.global_batch",
                &format!(
                    "rollout_batch * samples_per_prompt = {total} must be a multiple of \
                     global_batch = {}",
                    t.global_batch
                ),
            );
        }
        if !(0.0..1.0).contains(&t.clip_low) {
            return bad("train.clip_low", "must be in [0, 1)");
        }
        if t.clip_high < 0.0 {
            return bad("train.clip_high", "must be >= 0");
        }
        if let Some(cap) = t.tis_cap {
            if cap.is_nan() || cap <= 0.0 {
                return bad("train.tis_cap", "must be > 0");
            }
        }
        if t.kl_coef < 0.0 {
            return bad("train.kl_coef", "must be >= 0");
        }
        if !(0.0..1.0).contains(&t.beta1) || !(0.0..1.0).contains(&t.beta2) {
            return bad("train.beta1", "beta1 and beta2 must be in [0, 1)");
        }
        if t.grad_clip < 0.0 {
            return bad("train.grad_clip", "must be >= 0 (0 = off)");
        }
        Ok(())
    }

    /// The SFT warm-up's batch and the checkpoints kept.
    fn validate_sections(&self) -> Result<(), RunError> {
        if let Some(s) = &self.sft {
            if s.batch == 0 {
                return bad("sft.batch", "must be at least 1");
            }
        }
        if self.checkpoint.keep == 0 {
            return bad("checkpoint.keep", "must be at least 1");
        }
        Ok(())
    }

    /// The task's generator settings.
    fn validate_task(&self) -> Result<(), RunError> {
        match &self.task.kind {
            TaskKind::Addition { digits } | TaskKind::Multiplication { digits } => {
                if *digits == 0 || *digits > 9 {
                    return bad("task.kind.digits", "must be in 1..=9");
                }
            }
            TaskKind::Reverse { min_len, max_len, alphabet, .. } | TaskKind::Sort { min_len, max_len, alphabet } => {
                if *min_len == 0 || min_len > max_len {
                    return bad("task.kind.min_len", "need 1 <= min_len <= max_len");
                }
                if let TaskKind::Reverse { working, .. } = &self.task.kind {
                    if working > min_len {
                        return bad(
                            "task.kind.working",
                            "must not exceed min_len (the working is the string's first letters)",
                        );
                    }
                }
                if alphabet.is_empty() {
                    return bad("task.kind.alphabet", "must not be empty");
                }
            }
            TaskKind::Data { .. } => {}
        }
        Ok(())
    }

    /// An asynchronous schedule's settings against the rollout's.
    fn validate_schedule(&self) -> Result<(), RunError> {
        let r = &self.rollout;
        if let Some(d) = self.dynamic_sampling {
            // The synchronous executor is the one that regenerates; never accept and ignore.
            if !self.schedule.is_sync() {
                return bad(
                    "dynamic_sampling",
                    "runs under the sync schedule only (fully_async filters with `schedule.filter = drop_flat`)",
                );
            }
            if d.max_rounds == 0 {
                return bad("dynamic_sampling.max_rounds", "must be at least 1 (the first round counts)");
            }
        }
        if let Some(a) = self.async_schedule() {
            if a.max_concurrent == 0 {
                return bad("schedule.max_concurrent", "must be at least 1");
            }
            if a.buffer_capacity < r.rollout_batch {
                return bad(
                    "schedule.buffer_capacity",
                    &format!(
                        "must hold at least one step's rollout_batch = {} groups (the trainer would wait forever)",
                        r.rollout_batch
                    ),
                );
            }
            if a.update_interval == 0 {
                return bad("schedule.update_interval", "must be at least 1");
            }
            if !(a.stall_timeout_s > 0.0 && a.stall_timeout_s.is_finite()) {
                return bad("schedule.stall_timeout_s", "must be a positive number of seconds");
            }
            if a.refill == Refill::PerGroup && a.max_concurrent < r.samples_per_prompt {
                return bad(
                    "schedule.max_concurrent",
                    "per-group refill needs room for a whole group (samples_per_prompt samples)",
                );
            }
        }
        Ok(())
    }

    /// The environment's settings, the reward beside them, the evaluation and the held-out split.
    fn validate_episodes_and_eval(&self) -> Result<(), RunError> {
        if let Some(e) = &self.env {
            e.timeouts()?;
        }
        if self.env.is_some() && self.reward.is_some() {
            return bad("reward", "an episode's reward comes from its environment: give one or the other");
        }
        if self.eval.mode == EvalMode::External && self.eval.command.as_deref().is_none_or(|c| c.trim().is_empty()) {
            return bad("eval.command", "external evaluation needs a command");
        }
        if self.task.split.test_size == 0 {
            return bad("task.split.test_size", "must be at least 1");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> RunSpec {
        RunSpec::from_json(include_str!("../../tests/data/tiny.json")).unwrap()
    }

    /// The message of the broken constraint, which must name `field`.
    fn refused(s: &RunSpec, field: &str) -> String {
        let e = s.validate().expect_err(field);
        assert_eq!(e.code, E_SPEC);
        assert!(e.message.contains(&format!("`{field}`")), "{}", e.message);
        e.message
    }

    #[test]
    fn dynamic_sampling_is_refused_off_the_sync_schedule() {
        let mut s = spec();
        s.dynamic_sampling = Some(DynamicSampling { max_rounds: 3 });
        s.validate().unwrap();
        let mut z = s.clone();
        z.dynamic_sampling = Some(DynamicSampling { max_rounds: 0 });
        refused(&z, "dynamic_sampling.max_rounds");
        s.schedule = ScheduleSpec::OneStepOff;
        assert!(refused(&s, "dynamic_sampling").contains("sync schedule only"));
    }

    #[test]
    fn algorithm_variants_are_validated_with_the_field_named() {
        let mut s = spec();
        s.train.epochs = 2;
        s.train.mis = Some(MisSpec { low: 0.5, high: 2.0 });
        s.train.overlong = Some(OverlongSpec { max: 16, cache: 4, penalty: 1.0 });
        s.validate().unwrap();

        let mut e = s.clone();
        e.train.epochs = 0;
        assert!(refused(&e, "train.epochs").contains("at least 1"));
        for (low, high, field) in
            [(1.0, 2.0, "train.mis.low"), (-0.1, 2.0, "train.mis.low"), (f64::NAN, 2.0, "train.mis.low")]
                .into_iter()
                .chain([(0.5, 1.0, "train.mis.high"), (0.5, f64::INFINITY, "train.mis.high")])
        {
            let mut m = s.clone();
            m.train.mis = Some(MisSpec { low, high });
            refused(&m, field);
        }
        let mut o = s.clone();
        o.train.overlong = Some(OverlongSpec { max: 16, cache: 17, penalty: 1.0 });
        assert!(refused(&o, "train.overlong.cache").contains("17 tokens"));
        o.train.overlong = Some(OverlongSpec { max: 16, cache: 16, penalty: 1.0 });
        o.validate().unwrap();
        o.train.overlong = Some(OverlongSpec { max: 16, cache: 4, penalty: -1.0 });
        refused(&o, "train.overlong.penalty");
        o.train.overlong = Some(OverlongSpec { max: 0, cache: 0, penalty: 1.0 });
        refused(&o, "train.overlong.max");
    }
}
