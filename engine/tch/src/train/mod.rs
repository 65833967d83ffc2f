//! Training: log-prob recomputation, the GRPO/PPO loss (asymmetric clip, per-token or per-sequence
//! ratio, TIS, MIS, k3 KL, entropy bonus, token/sequence/micro-batch/constant aggregation),
//! REINFORCE++'s per-token returns, several passes over a batch, masked cross-entropy SFT,
//! gradient accumulation over micro-batches, global-norm clipping and AdamW with our own
//! (checkpointable) state.
//!
//! `TchTrainer`'s `impl` is spread over concept files: `rl` (the RL step and its terms), `sft`,
//! `optim` (AdamW, what trains, the optimizer slices), `checkpoint`, `dp` (data-parallel training
//! over c10d: a rank's share of the micro-batches, gradients summed across ranks, ZeRO-1's
//! sharded optimizer); beside them `pack` (the micro-batch layout), `loss` (the loss's terms),
//! `advantage` (per-token advantages, OPD's folding), `ppo` (the critic's targets and updates) and
//! `moe` (R3 replay, the load-balancing loss, route statistics).

mod advantage;
mod checkpoint;
mod dp;
mod loss;
mod moe;
mod optim;
mod pack;
mod ppo;
mod rl;
mod sft;

pub use advantage::reinforce_pp_returns;
pub(crate) use loss::tempered_log_softmax;
pub use loss::{aggregate, kl_k3, pg_terms, policy_terms, Denominators, PgOptions, PgTerms};
pub use optim::epoch_orders;
pub(crate) use optim::{adam_step, AdamState};
pub use pack::{pack, pack_aligned, pack_for, recorded_routes, Packed};

use crate::critic::Critic;
use crate::model::Policy;
use miles_runtime::tasks::TokenId;
use miles_runtime::{RunError, TrainSpec, Trajectory, WeightSnapshot};
use std::cell::Cell;

pub struct TchTrainer {
    pub policy: Policy,
    reference: Option<Policy>,
    spec: TrainSpec,
    /// The optimizer state of what trains: the whole model, or one per adapter under LoRA (each
    /// adapter steps, clips and counts its own Adam steps: multi-LoRA adapters never share one).
    adam: Vec<AdamState>,
    version: u64,
    /// The Hugging Face directory the policy was loaded from: the saved model carries its
    /// config.json and tokenizer files through.
    pub source: Option<crate::hf::HfMeta>,
    /// PPO's critic, from the first RL step on (`crate::critic`).
    pub critic: Option<Critic>,
    /// The engines may not hold this trainer's base weights (a fresh trainer, or one loaded from
    /// a checkpoint): the next export sends the base with the adapters. Cleared by that export.
    base_stale: Cell<bool>,
    /// R3: replay the trajectories' recorded experts in every forward over them.
    pub replay: bool,
    /// The run's seed: with the optimizer steps taken so far (`version`, checkpointed) it seeds
    /// each RL call's shuffles of the batch over several passes (`epochs`).
    pub seed: u64,
    /// This rank's data-parallel group (`join_dp`); None in one process (or a group of 1).
    dp: Option<dp::DataParallel>,
}

impl TchTrainer {
    pub fn new(mut policy: Policy, spec: TrainSpec) -> TchTrainer {
        policy.lora_spec = spec.lora.clone();
        policy.set_requires_grad(true);
        // ZeRO-1 ranks allocate their shard of the moments once `join_dp` says which they own: the
        // whole state allocated first would stay in the process's peak memory.
        let adam = match &spec.dp {
            Some(d) if d.zero == miles_runtime::ZeroStage::Optimizer && d.ranks > 1 => {
                vec![AdamState::unallocated(policy.params().len())]
            }
            _ => vec![AdamState::zeros(policy.params())],
        };
        let mut t = TchTrainer {
            policy,
            reference: None,
            spec,
            adam,
            version: 0,
            source: None,
            critic: None,
            base_stale: Cell::new(true),
            replay: false,
            seed: 0,
            dp: None,
        };
        // Adapters attached already were loaded from a PEFT directory (`lora { init }`,
        // `initial_policy`): LoRA training starts now, on them, with the base frozen.
        if !t.policy.adapters().is_empty() {
            t.start_lora();
        }
        t
    }

    /// A run's trainer: `policy` with the run's training settings, replaying routing when the
    /// rollout says so (in process and in a `miles worker` alike).
    pub fn for_run(mut policy: Policy, spec: &miles_runtime::RunSpec, source: Option<crate::hf::HfMeta>) -> TchTrainer {
        policy.invariant = spec.rollout.batch_invariant;
        policy.bf16_matmuls = spec.train.precision == miles_runtime::Precision::Bf16;
        let mut t = TchTrainer::new(policy, spec.train.clone());
        t.replay = spec.rollout.r3.as_ref().is_some_and(|r| r.replay);
        t.seed = spec.seed;
        t.source = source;
        t
    }

    /// Multi-LoRA: the adapter the next `train_rl` trains (and every forward applies).
    pub fn select_adapter(&mut self, i: usize) -> Result<(), RunError> {
        self.begin_lora()?;
        self.policy.select_adapter(i)
    }

    /// With LoRA, RL trains adapters on the base as it stands now (after any SFT warm-up): the
    /// base is frozen and the optimizer restarts over the adapters alone. Since B starts at
    /// zero the policy is unchanged, so engines sampling the base sample this policy exactly.
    /// With `init`, the adapters start at the PEFT adapter's A and B instead (attached from the
    /// start, so the engines sample base + adapter from the first step).
    fn begin_lora(&mut self) -> Result<(), RunError> {
        if !self.policy.adapters().is_empty() || self.policy.lora_spec.is_none() {
            return Ok(());
        }
        self.policy.attach_lora()?;
        self.start_lora();
        self.dp_take_adapters()
    }

    /// Freezes the base and trains the attached adapters, with a fresh optimizer over them.
    fn start_lora(&mut self) {
        self.policy.set_requires_grad(false);
        for l in self.policy.adapters() {
            l.set_requires_grad(true);
        }
        self.fresh_optimizer();
    }

    /// Dropout on the adapters' inputs, in training forward passes only.
    fn set_training(&self, on: bool) {
        if let Some(l) = self.policy.lora() {
            l.set_training(on);
        }
    }

    /// A weight update: with LoRA attached and the engines holding the base, the adapters alone.
    pub fn export(&self) -> Result<WeightSnapshot, RunError> {
        if !self.policy.adapters().is_empty() && !self.base_stale.get() {
            return self.policy.adapter_snapshot(self.version);
        }
        let w = self.policy.snapshot(self.version)?;
        self.base_stale.set(false);
        Ok(w)
    }

    /// Every weight, base and adapters, for a receiver that holds nothing yet.
    pub fn export_full(&self) -> Result<WeightSnapshot, RunError> {
        self.policy.snapshot(self.version)
    }

    pub fn logprobs_impl(
        &self,
        prompts: &[Vec<TokenId>],
        responses: &[Vec<TokenId>],
        temperature: f64,
    ) -> Result<Vec<Vec<f32>>, RunError> {
        let batch: Vec<Trajectory> =
            prompts.iter().zip(responses).map(|(p, r)| Trajectory::to_score(p.clone(), r.clone())).collect();
        Self::logprobs_of(&self.policy, &batch, self.spec.micro_batch.max(1), temperature, false)
    }

    pub fn reset_optimizer(&mut self) {
        self.fresh_optimizer();
    }

    pub fn freeze_reference(&mut self) {
        let r = self.policy.deep_copy();
        r.set_requires_grad(false);
        self.reference = Some(r);
    }

    pub fn version(&self) -> u64 {
        self.version
    }
}
