//! The traits a compute backend implements. The synchronous executor drives them; the asynchronous
//! and distributed runtimes plug in behind the same traits (an engine may be remote, a transport
//! may broadcast or write deltas to disk). What they exchange (sampling settings, samples,
//! trajectories) is plain data in `sample`.

use crate::sample::{GenRequest, Sample, SamplingParams, StreamSample, Trajectory};
use crate::spec::{RunSpec, TrainSpec};
use crate::token::TokenId;
use crate::RunError;
use serde::{Deserialize, Serialize};
use std::path::Path;

pub trait RolloutEngine {
    /// `n` samples for each prompt, grouped: samples of prompt i are contiguous, in order. A
    /// group's prompt is processed once and shared by its n samples.
    fn generate(
        &mut self,
        prompts: &[Vec<TokenId>],
        n: usize,
        params: &SamplingParams,
    ) -> Result<Vec<Sample>, RunError>;
    fn weight_version(&self) -> u64;
    /// Replaces the engine's weights (the receiving end of a weight transport).
    fn load_weights(&mut self, weights: &WeightSnapshot) -> Result<(), RunError>;

    /// Multi-LoRA: the adapter the next `generate` samples with (one engine, one base, every
    /// adapter). An engine without adapters serves only adapter 0.
    fn select_adapter(&mut self, i: usize) -> Result<(), RunError> {
        one_adapter(i)
    }
}

fn one_adapter(i: usize) -> Result<(), RunError> {
    match i {
        0 => Ok(()),
        _ => Err(RunError::new(crate::E_BACKEND, format!("adapter {i} selected; this backend serves one adapter"))),
    }
}

/// The rollout engine as the asynchronous executor drives it (`stream`): requests of one sample
/// each, submitted and advanced step by step (continuous batching), weights swapped between two
/// steps while requests are in flight. It runs on the executor's generation thread, hence `Send`.
pub trait StreamEngine: Send {
    /// Requests the engine holds at once; the executor never has more in flight.
    fn slots(&self) -> usize;
    /// Starts a request (it is prefilled at the next `step`).
    fn submit(&mut self, req: GenRequest) -> Result<(), RunError>;
    /// Advances every request in flight (at least one token each, when there is any) and returns
    /// those that finished.
    fn step(&mut self) -> Result<Vec<StreamSample>, RunError>;
    fn in_flight(&self) -> usize;
    /// Aborts every request in flight and returns them, partial, with `aborted = true`.
    fn abort_all(&mut self) -> Vec<StreamSample>;
    /// Swaps the weights between two steps. Requests in flight continue under the new ones (their
    /// KV cache stays as computed), and record the new version from their next token on.
    fn load_weights(&mut self, weights: &WeightSnapshot) -> Result<(), RunError>;
    fn weight_version(&self) -> u64;
    /// Called once on the generation thread before anything else: the engine's own intra-op
    /// thread budget (the trainer keeps its own on the executor's thread).
    fn bind_thread(&mut self, _threads: Option<usize>) {}
}

/// What one RL train call reports (means over the call's tokens unless said otherwise).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TrainStats {
    pub loss: f64,
    /// Global grad norm before clipping (mean over optimizer steps).
    pub grad_norm: f64,
    pub entropy: f64,
    /// Fraction of tokens whose clipped term was active.
    pub clip_frac: f64,
    /// k3 estimate of KL(policy || reference); 0 without a reference.
    pub kl: f64,
    /// Mean |logp_train - logp_rollout| of the sampled tokens before the update: the
    /// train-rollout mismatch.
    pub logp_diff: f64,
    /// k3 estimate of KL(rollout || trainer) over the sampled tokens, before the update: the
    /// train-rollout mismatch as a divergence.
    #[serde(default)]
    pub rollout_kl: f64,
    /// Mean TIS weight (1 without TIS).
    pub tis_weight: f64,
    pub optimizer_steps: u64,
    /// Tokens the loss covered (loss-mask sum).
    pub tokens: u64,
    /// Wall seconds of this call's phases, for profiling (`perf/*` in metrics.jsonl): the "old"
    /// (and reference) log-prob recomputation, the forward passes with the loss, the backward
    /// passes, and the clip + AdamW steps. Zero where a backend does not measure them.
    #[serde(default)]
    pub logprob_s: f64,
    #[serde(default)]
    pub forward_s: f64,
    #[serde(default)]
    pub backward_s: f64,
    #[serde(default)]
    pub optimizer_s: f64,
    /// PPO: the critic's value loss (mean over tokens and optimizer steps), its mean value and
    /// the explained variance of the returns; None for GRPO.
    #[serde(default)]
    pub critic: Option<CriticStats>,
    /// On-policy distillation's per-token statistics; None without a teacher.
    #[serde(default)]
    pub opd: Option<OpdStats>,
    /// Mixture-of-experts routing and R3; None for a dense policy.
    #[serde(default)]
    pub moe: Option<MoeStats>,
    /// Masked importance sampling (`mis`): the fraction of trained tokens whose trainer/sampler
    /// ratio left the band and got no gradient; None without `mis`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mis_masked: Option<f64>,
    /// Several passes over the batch (`epochs` > 1): each pass's statistics, in order; empty for
    /// one pass.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub epochs: Vec<EpochStats>,
    /// A data-parallel trainer (`embedded_trainer { dp }`): the seconds a rank spent in this call's
    /// exchanges (the gradients' all-reduces, ZeRO-1's broadcasts, the statistics), the max over
    /// ranks, the wait for the slowest rank to arrive excluded; 0 in one process.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub collective_s: f64,
    /// A data-parallel trainer: the seconds a rank waited at the barriers before the exchanges
    /// for the slowest rank (the ranks' skew), the max over ranks; 0 in one process.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub rank_wait_s: f64,
    /// A data-parallel trainer: each rank's peak resident set so far (VmHWM), in bytes, by rank;
    /// empty in one process.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rank_peak_rss: Vec<u64>,
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

/// One pass over the batch (`epochs` > 1), over its trained tokens, each measured by the training
/// forward before that optimizer step's update against the behaviour log-probs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EpochStats {
    /// Fraction of tokens whose clipped term was active.
    pub clip_frac: f64,
    /// Mean of old - logp (k1 of KL(old || current)): 0 on the first pass's first step.
    pub approx_kl: f64,
    /// Mean of r - 1 - log r (k3, r = exp(logp - old), >= 0 and 0 only where r = 1).
    pub approx_kl_k3: f64,
    /// The largest |logp - old| of the pass.
    pub max_abs_log_ratio: f64,
}

/// One RL train call's MoE statistics (docs/moe.md), over the batch's real tokens.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MoeStats {
    /// The load-balancing loss, mean over MoE layers and micro-batches (1 = balanced), before its
    /// coefficient.
    pub aux_loss: f64,
    /// Per MoE layer: the most loaded expert's share of routed slots times the expert count
    /// (1 = balanced, `experts` = every token on one expert).
    pub load_max: Vec<f64>,
    /// Per MoE layer: the fraction of recorded tokens whose experts in the training forward
    /// differ from the rollout's (0 under replay); empty without recorded routing.
    pub route_mismatch: Vec<f64>,
    /// Per MoE layer: the fraction of recorded tokens whose trainer router would choose other
    /// experts than the rollout did (what replay corrects; equal to `route_mismatch` without it).
    pub router_disagreement: Vec<f64>,
    /// Mean |logp_train - logp_rollout| over the trained tokens the trainer's router disagrees on
    /// (in any layer), and how many there were; on-policy steps only (one optimizer step).
    pub flip_logp_diff: f64,
    pub flip_tokens: u64,
    /// The recorded experts were replayed in the training forward.
    pub replayed: bool,
    /// Routing bytes the batch carried (what R3 costs the buffer and the transport).
    pub r3_bytes: u64,
    /// Tokens with recorded routing.
    pub r3_tokens: u64,
    /// Trajectories dropped because their routing did not fit the model (the first reason is
    /// printed).
    pub r3_dropped: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct OpdStats {
    /// Mean of log pi_student(x_t) - log pi_teacher(x_t) over trained tokens: the one-sample
    /// reverse-KL estimate.
    pub reverse_kl: f64,
    /// Mean teacher log-prob of the sampled tokens.
    pub teacher_logp: f64,
    /// Share of the advantage's magnitude from the distillation term: sum |coef d| / (sum |coef d|
    /// + sum |task_coef A|).
    pub opd_share: f64,
    /// Restarts of the teacher's worker process so far (0 when it is in the trainer's process).
    #[serde(default)]
    pub teacher_restarts: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CriticStats {
    pub value_loss: f64,
    pub value_mean: f64,
    pub return_mean: f64,
    /// 1 - Var(returns - values) / Var(returns), before the update.
    pub explained_variance: f64,
    pub grad_norm: f64,
    /// Fraction of tokens whose clipped value term was active.
    pub clip_frac: f64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SftStats {
    pub loss: f64,
    pub grad_norm: f64,
    pub tokens: u64,
}

/// Named fp32 tensors with Hugging Face (Llama) names: the backend-neutral unit of weight sync.
#[derive(Debug, Clone, PartialEq)]
pub struct WeightSnapshot {
    pub version: u64,
    pub tensors: Vec<NamedTensor>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct NamedTensor {
    pub name: String,
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

impl WeightSnapshot {
    pub fn bytes(&self) -> usize {
        self.tensors.iter().map(|t| t.data.len() * 4).sum()
    }
}

pub trait Trainer {
    /// One RL step's batch: recomputes log-probs (the "old" policy), then takes
    /// `lrs.len()` optimizer steps over equal slices of `batch` (PPO/GRPO loss, micro-batches
    /// with gradient accumulation). `temperature` is the rollout's, applied to the logits.
    fn train_rl(&mut self, batch: &[Trajectory], lrs: &[f64], temperature: f64) -> Result<TrainStats, RunError>;
    /// One supervised optimizer step: masked cross-entropy of `answer` given `prompt`.
    fn train_sft(&mut self, batch: &[(Vec<TokenId>, Vec<TokenId>)], lr: f64) -> Result<SftStats, RunError>;
    /// Fresh optimizer state (between SFT and RL).
    fn reset_optimizer(&mut self);
    /// Freezes a copy of the current policy as the KL reference.
    fn freeze_reference(&mut self) -> Result<(), RunError>;
    /// Log-probs of `response` under the current policy (temperature applied), one per token.
    fn logprobs(
        &mut self,
        prompts: &[Vec<TokenId>],
        responses: &[Vec<TokenId>],
        temperature: f64,
    ) -> Result<Vec<Vec<f32>>, RunError>;
    /// Number of optimizer steps taken so far: the weight version.
    fn version(&self) -> u64;
    /// The next weight update for the rollout engines, which hold the previous one: with LoRA
    /// the adapters alone once the engines hold the base.
    fn export_weights(&self) -> Result<WeightSnapshot, RunError>;
    /// Every weight, for a receiver that may hold none yet (a snapshot evaluation engine).
    fn export_full_weights(&self) -> Result<WeightSnapshot, RunError> {
        self.export_weights()
    }
    /// Bytes the last `export_weights` moved, when they did not travel in its snapshot (a trainer
    /// in a worker process publishes straight to the engines and returns a receipt).
    fn last_sync_bytes(&self) -> Option<u64> {
        None
    }

    /// Multi-LoRA: the adapter the next `train_rl` trains; the others do not change.
    fn select_adapter(&mut self, i: usize) -> Result<(), RunError> {
        one_adapter(i)
    }
    /// Writes weights, optimizer state and reference into `dir` (exists, empty).
    fn save(&self, dir: &Path) -> Result<(), RunError>;
    fn load(&mut self, dir: &Path) -> Result<(), RunError>;
    /// Writes only the model (safetensors + config.json) into `dir`.
    fn save_model(&self, dir: &Path) -> Result<(), RunError>;
}

/// Moves weights from the trainer to the engines. Colocated runs hand them over locally.
pub trait WeightTransport {
    fn name(&self) -> &'static str;
    fn transfer(&mut self, weights: WeightSnapshot) -> Result<WeightSnapshot, RunError>;
}

/// Same process, same memory: hand the snapshot over as it is.
pub struct LocalHandoff;

impl WeightTransport for LocalHandoff {
    fn name(&self) -> &'static str {
        "local"
    }
    fn transfer(&mut self, weights: WeightSnapshot) -> Result<WeightSnapshot, RunError> {
        Ok(weights)
    }
}

/// What `Backend::create` returns: the rollout engine and the trainer of one run.
pub type EngineAndTrainer = (Box<dyn RolloutEngine>, Box<dyn Trainer>);

/// What `Backend::create_async` returns: the parts of a one_step_off or fully_async run.
pub struct AsyncParts {
    /// Runs on the generation thread (in-process, or a client of a remote engine).
    pub engine: Box<dyn StreamEngine>,
    /// Stays on the executor's thread.
    pub trainer: Box<dyn Trainer>,
    /// A second engine for `eval.mode = snapshot`, on its own thread; None for the other modes.
    pub eval_engine: Option<Box<dyn EvalEngine>>,
}

/// A batch engine that can run on a thread of its own (snapshot evaluation).
pub trait EvalEngine: RolloutEngine + Send {
    /// Called once on its thread: the engine's own intra-op thread budget.
    fn bind_thread(&mut self, _threads: Option<usize>) {}
}

/// On-policy distillation's teacher (std/stages `teacher_logprobs`, docs/recipes/opd.md): a frozen model
/// that scores every response token of a batch, between the reward and the trainer.
pub trait TeacherScorer: Send {
    /// The teacher's log-prob of each response token, per trajectory.
    fn logprobs(&mut self, batch: &[Trajectory]) -> Result<Vec<Vec<f32>>, RunError>;
    /// Restarts of a teacher hosted in a worker process of its own; 0 in the run's process.
    fn restarts(&self) -> u32 {
        0
    }
}

/// A compute backend: builds the engine and trainer of a run.
pub trait Backend {
    fn name(&self) -> &'static str;
    /// Sets intra-op threads (None = backend default).
    fn set_threads(&self, threads: Option<usize>);
    fn create(&self, spec: &RunSpec) -> Result<EngineAndTrainer, RunError>;
    /// The teacher stage of a distilling run (`spec.train.opd`); a backend without one refuses.
    fn teacher(&self, spec: &RunSpec) -> Result<Box<dyn TeacherScorer>, RunError> {
        let stage = spec.train.opd.as_ref().map_or("teacher", |o| o.stage.as_str());
        Err(RunError::new(
            crate::E_BACKEND,
            format!("the `{}` backend cannot run the teacher stage `{stage}`", self.name()),
        ))
    }
    /// The parts of an asynchronous run; None when this backend cannot run one (the executor
    /// then reports which schedules it can).
    fn create_async(&self, _spec: &RunSpec) -> Result<Option<AsyncParts>, RunError> {
        Ok(None)
    }
}

/// Learning rate at optimizer step `k` (0-based) of `total`: linear warm-up over `warmup` steps
/// from lr/warmup to lr, then none/linear/cosine decay to `min_lr_ratio * lr`.
pub fn lr_at(t: &TrainSpec, k: u64, total: u64) -> f64 {
    schedule(t.lr, t.warmup_steps, t.decay, t.min_lr_ratio, k, total)
}

pub fn schedule(lr: f64, warmup: u64, decay: crate::spec::Decay, min_ratio: f64, k: u64, total: u64) -> f64 {
    if warmup > 0 && k < warmup {
        return lr * (k + 1) as f64 / warmup as f64;
    }
    let span = total.saturating_sub(warmup).max(1) as f64;
    let progress = ((k - warmup.min(k)) as f64 / span).clamp(0.0, 1.0);
    let min_lr = lr * min_ratio;
    match decay {
        crate::spec::Decay::None => lr,
        crate::spec::Decay::Linear => min_lr + (lr - min_lr) * (1.0 - progress),
        crate::spec::Decay::Cosine => min_lr + (lr - min_lr) * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::Decay;

    #[test]
    fn lr_schedules() {
        assert_eq!(schedule(1.0, 4, Decay::None, 0.0, 0, 10), 0.25);
        assert_eq!(schedule(1.0, 4, Decay::None, 0.0, 3, 10), 1.0);
        assert_eq!(schedule(1.0, 0, Decay::Linear, 0.0, 5, 10), 0.5);
        assert_eq!(schedule(1.0, 0, Decay::Linear, 0.1, 10, 10), 0.1);
        assert!((schedule(1.0, 0, Decay::Cosine, 0.0, 5, 10) - 0.5).abs() < 1e-12);
        assert!((schedule(1.0, 2, Decay::Cosine, 0.0, 2, 12) - 1.0).abs() < 1e-12);
    }
}
