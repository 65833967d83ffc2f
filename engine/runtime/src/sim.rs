//! A simulated backend: an engine whose response lengths follow a long-tailed (log-normal)
//! distribution and whose decode steps and training take modelled wall time, and a trainer that
//! only counts. It runs the real executors (sync and asynchronous) with no model, for tests of the
//! scheduling machinery and for bench/async (the bubble that long tails cause in sync RL).
//!
//! Timing model: one decode step of `active` samples takes `step_s + per_sample_s * active`
//! (a memory-bound decoder: a fixed cost per step plus a little per row); training a batch takes
//! `train_fixed_s + train_per_token_s * tokens`.
//!
//! Responses: on the reverse task a sample is the right answer with probability `p_solve` (short,
//! ends with EOS); otherwise random letters of log-normal length (ending with EOS when shorter than
//! max_new_tokens). Each prompt has a difficulty from its hash: hard prompts (the top `hard_frac`)
//! ramble `hard_len_factor` times longer and are solved less often, the workload that starves
//! under discard-and-requeue.

use crate::backend::*;
use crate::rng::{derive_seed, Rng};
use crate::sample::{FinishReason, GenRequest, Sample, SamplingParams, StreamSample, Trajectory, VersionSpan};
use crate::spec::RunSpec;
use crate::token::{TokenId, BOS, EOS};
use crate::{RunError, E_CHECKPOINT};
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::time::Duration;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SimConfig {
    pub step_s: f64,
    pub per_sample_s: f64,
    /// Log-normal response length: exp(N(len_mu, len_sigma)) tokens, clipped to max_new_tokens.
    pub len_mu: f64,
    pub len_sigma: f64,
    pub hard_frac: f64,
    pub hard_len_factor: f64,
    pub p_solve: f64,
    pub train_fixed_s: f64,
    pub train_per_token_s: f64,
    /// Engine slots (samples in flight at once) of the streaming engine.
    pub slots: usize,
    /// Tests: the trainer fails (E0508) in this RL step, like a backend crash.
    #[serde(default)]
    pub crash_at_train: Option<u64>,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            step_s: 0.0,
            per_sample_s: 0.0,
            len_mu: 2.0,
            len_sigma: 0.8,
            hard_frac: 0.1,
            hard_len_factor: 4.0,
            p_solve: 0.4,
            train_fixed_s: 0.0,
            train_per_token_s: 0.0,
            slots: 64,
            crash_at_train: None,
        }
    }
}

fn sleep(s: f64) {
    if s > 0.0 {
        std::thread::sleep(Duration::from_secs_f64(s));
    }
}

fn difficulty(prompt: &[TokenId]) -> f64 {
    Rng::new(crate::rng::Fnv1a::default().tokens(prompt).0).next_f64()
}

/// The whole response of one sample, decided when it starts (only its timing is simulated).
fn plan_response(cfg: &SimConfig, prompt: &[TokenId], params: &SamplingParams, vocab: usize) -> Vec<TokenId> {
    let mut rng = Rng::new(params.seed);
    let hard = difficulty(prompt) > 1.0 - cfg.hard_frac;
    // The reverse task's prompt is BOS, letters, '>': the answer is the letters reversed.
    let letters: Vec<TokenId> = prompt.iter().copied().filter(|&t| t != BOS).collect();
    let letters = &letters[..letters.len().saturating_sub(1)];
    let p_solve = if hard { cfg.p_solve * 0.25 } else { cfg.p_solve };
    if params.greedy || rng.next_f64() < p_solve {
        let mut r: Vec<TokenId> = letters.iter().rev().copied().collect();
        r.push(EOS);
        r.truncate(params.max_new_tokens);
        return r;
    }
    let mut len = (cfg.len_mu + cfg.len_sigma * rng.normal()).exp();
    if hard {
        len *= cfg.hard_len_factor;
    }
    let len = (len.round() as usize).clamp(1, params.max_new_tokens);
    let lo = (EOS + 1) as u64;
    let mut r: Vec<TokenId> =
        (0..len).map(|_| (lo + rng.below((vocab as u64).saturating_sub(lo).max(1))) as TokenId).collect();
    if len < params.max_new_tokens {
        if let Some(last) = r.last_mut() {
            *last = EOS;
        }
    }
    r
}

fn finish_of(r: &[TokenId]) -> FinishReason {
    if r.last() == Some(&EOS) {
        FinishReason::Stop
    } else {
        FinishReason::Length
    }
}

struct Active {
    id: u64,
    planned: Vec<TokenId>,
    done: usize,
    versions: Vec<VersionSpan>,
}

/// The simulated engine: a batch `RolloutEngine` (sync executor) and a `StreamEngine`.
pub struct SimEngine {
    pub cfg: SimConfig,
    vocab: usize,
    version: u64,
    active: Vec<Active>,
    queued: Vec<GenRequest>,
}

impl SimEngine {
    pub fn new(cfg: SimConfig, vocab: usize) -> SimEngine {
        SimEngine { cfg, vocab, version: 0, active: Vec::new(), queued: Vec::new() }
    }

    fn step_cost(&self, active: usize) -> f64 {
        self.cfg.step_s + self.cfg.per_sample_s * active as f64
    }
}

impl RolloutEngine for SimEngine {
    fn generate(
        &mut self,
        prompts: &[Vec<TokenId>],
        n: usize,
        params: &SamplingParams,
    ) -> Result<Vec<Sample>, RunError> {
        let mut out = Vec::new();
        for (i, p) in prompts.iter().enumerate() {
            for j in 0..n {
                let ps = SamplingParams { seed: derive_seed(params.seed, "sim", (i * n + j) as u64), ..params.clone() };
                let r = plan_response(&self.cfg, p, &ps, self.vocab);
                out.push(Sample {
                    prompt_index: i,
                    logprobs: vec![-1.0; r.len()],
                    finish: finish_of(&r),
                    response: r,
                    weight_version: self.version,
                    routing: None,
                });
            }
        }
        // The batch decodes until its longest sample ends; rows that finished early idle.
        let longest = out.iter().map(|s| s.response.len()).max().unwrap_or(0);
        let total: f64 =
            (0..longest).map(|t| self.step_cost(out.iter().filter(|s| s.response.len() > t).count())).sum();
        sleep(total);
        Ok(out)
    }

    fn weight_version(&self) -> u64 {
        self.version
    }

    fn load_weights(&mut self, weights: &WeightSnapshot) -> Result<(), RunError> {
        self.version = weights.version;
        Ok(())
    }
}

impl StreamEngine for SimEngine {
    fn slots(&self) -> usize {
        self.cfg.slots
    }

    fn submit(&mut self, req: GenRequest) -> Result<(), RunError> {
        self.queued.push(req);
        Ok(())
    }

    fn step(&mut self) -> Result<Vec<StreamSample>, RunError> {
        for req in std::mem::take(&mut self.queued) {
            let planned = plan_response(&self.cfg, &req.prompt, &req.params, self.vocab);
            self.active.push(Active {
                id: req.id,
                planned,
                done: 0,
                versions: vec![VersionSpan { version: self.version, from_token: 0 }],
            });
        }
        sleep(self.step_cost(self.active.len()));
        let mut out = Vec::new();
        let mut i = 0;
        while i < self.active.len() {
            let a = &mut self.active[i];
            a.done += 1;
            if a.done >= a.planned.len() {
                let a = self.active.swap_remove(i);
                out.push(StreamSample {
                    id: a.id,
                    logprobs: vec![-1.0; a.planned.len()],
                    finish: finish_of(&a.planned),
                    response: a.planned,
                    versions: a.versions,
                    aborted: false,
                    routing: None,
                });
            } else {
                i += 1;
            }
        }
        Ok(out)
    }

    fn in_flight(&self) -> usize {
        self.active.len() + self.queued.len()
    }

    fn abort_all(&mut self) -> Vec<StreamSample> {
        let queued = std::mem::take(&mut self.queued).into_iter().map(|r| Active {
            id: r.id,
            planned: Vec::new(),
            done: 0,
            versions: vec![VersionSpan { version: self.version, from_token: 0 }],
        });
        let active: Vec<Active> = std::mem::take(&mut self.active).into_iter().chain(queued).collect();
        active
            .into_iter()
            .map(|mut a| {
                a.planned.truncate(a.done);
                StreamSample {
                    id: a.id,
                    logprobs: vec![-1.0; a.planned.len()],
                    finish: FinishReason::Length,
                    response: a.planned,
                    versions: a.versions,
                    routing: None,
                    aborted: true,
                }
            })
            .collect()
    }

    fn load_weights(&mut self, weights: &WeightSnapshot) -> Result<(), RunError> {
        self.version = weights.version;
        for a in &mut self.active {
            a.versions.push(VersionSpan { version: weights.version, from_token: a.done });
        }
        Ok(())
    }

    fn weight_version(&self) -> u64 {
        self.version
    }
}

impl EvalEngine for SimEngine {}

/// What the simulated trainer keeps (and checkpoints): its version and every group it trained.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SimTrainerState {
    pub version: u64,
    /// The prompt of every group trained, in order.
    pub trained_prompts: Vec<Vec<TokenId>>,
    /// (weight version the batch's samples started from, oldest first) per step.
    pub batch_versions: Vec<Vec<u64>>,
}

pub struct SimTrainer {
    pub cfg: SimConfig,
    pub state: SimTrainerState,
}

pub const SIM_TRAINER_FILE: &str = "sim_trainer.json";

impl Trainer for SimTrainer {
    fn train_rl(&mut self, batch: &[Trajectory], lrs: &[f64], _temperature: f64) -> Result<TrainStats, RunError> {
        if self.cfg.crash_at_train == Some(self.state.batch_versions.len() as u64 + 1) {
            return Err(RunError::new(crate::E_BACKEND, "simulated crash of the trainer"));
        }
        let tokens: usize = batch.iter().map(|t| t.prompt.len() + t.response.len()).sum();
        sleep(self.cfg.train_fixed_s + self.cfg.train_per_token_s * tokens as f64);
        let mut last = usize::MAX;
        for t in batch {
            if t.group != last {
                self.state.trained_prompts.push(t.prompt.clone());
                last = t.group;
            }
        }
        self.state.batch_versions.push(batch.iter().map(|t| t.weight_version).collect());
        self.state.version += lrs.len() as u64;
        Ok(TrainStats {
            optimizer_steps: lrs.len() as u64,
            tokens: batch.iter().map(|t| t.response.len() as u64).sum(),
            tis_weight: 1.0,
            ..TrainStats::default()
        })
    }

    fn train_sft(&mut self, _batch: &[(Vec<TokenId>, Vec<TokenId>)], _lr: f64) -> Result<SftStats, RunError> {
        Ok(SftStats::default())
    }

    fn reset_optimizer(&mut self) {}

    fn freeze_reference(&mut self) -> Result<(), RunError> {
        Ok(())
    }

    fn logprobs(
        &mut self,
        _p: &[Vec<TokenId>],
        responses: &[Vec<TokenId>],
        _t: f64,
    ) -> Result<Vec<Vec<f32>>, RunError> {
        Ok(responses.iter().map(|r| vec![-1.0; r.len()]).collect())
    }

    fn version(&self) -> u64 {
        self.state.version
    }

    fn export_weights(&self) -> Result<WeightSnapshot, RunError> {
        Ok(WeightSnapshot {
            version: self.state.version,
            tensors: vec![NamedTensor { name: "sim".into(), shape: vec![1], data: vec![self.state.version as f32] }],
        })
    }

    fn save(&self, dir: &Path) -> Result<(), RunError> {
        crate::atomic_write::write_json(&dir.join(SIM_TRAINER_FILE), &self.state)
    }

    fn load(&mut self, dir: &Path) -> Result<(), RunError> {
        let p = dir.join(SIM_TRAINER_FILE);
        let text = std::fs::read_to_string(&p).map_err(|e| RunError::io(E_CHECKPOINT, "cannot read", &p, e))?;
        self.state =
            serde_json::from_str(&text).map_err(|e| RunError::new(E_CHECKPOINT, format!("{}: {e}", p.display())))?;
        Ok(())
    }

    fn save_model(&self, dir: &Path) -> Result<(), RunError> {
        self.save(dir)
    }
}

pub struct SimBackend {
    pub cfg: SimConfig,
}

impl Backend for SimBackend {
    fn name(&self) -> &'static str {
        "sim"
    }

    fn set_threads(&self, _threads: Option<usize>) {}

    fn create(&self, spec: &RunSpec) -> Result<EngineAndTrainer, RunError> {
        Ok((
            Box::new(SimEngine::new(self.cfg.clone(), spec.model.vocab_size)),
            Box::new(SimTrainer { cfg: self.cfg.clone(), state: SimTrainerState::default() }),
        ))
    }

    fn create_async(&self, spec: &RunSpec) -> Result<Option<AsyncParts>, RunError> {
        let eval_engine: Option<Box<dyn EvalEngine>> = match spec.eval.mode {
            crate::schedule::EvalMode::Snapshot => {
                Some(Box::new(SimEngine::new(self.cfg.clone(), spec.model.vocab_size)))
            }
            _ => None,
        };
        Ok(Some(AsyncParts {
            engine: Box::new(SimEngine::new(self.cfg.clone(), spec.model.vocab_size)),
            trainer: Box::new(SimTrainer { cfg: self.cfg.clone(), state: SimTrainerState::default() }),
            eval_engine,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(seed: u64) -> SamplingParams {
        SamplingParams::plain(8, seed)
    }

    #[test]
    fn version_spans_across_a_swap() {
        let mut e = SimEngine::new(SimConfig { p_solve: 0.0, len_mu: 5.0, len_sigma: 0.0, ..Default::default() }, 12);
        e.submit(GenRequest { id: 7, prompt: vec![BOS, 4, 5, 6], params: params(1) }).unwrap();
        assert!(e.step().unwrap().is_empty());
        assert!(e.step().unwrap().is_empty());
        StreamEngine::load_weights(&mut e, &WeightSnapshot { version: 1, tensors: vec![] }).unwrap();
        let mut out = Vec::new();
        while out.is_empty() {
            out = e.step().unwrap();
        }
        assert_eq!(out[0].response.len(), 8, "exp(5) tokens clipped to max_new_tokens");
        assert_eq!(
            out[0].versions,
            vec![VersionSpan { version: 0, from_token: 0 }, VersionSpan { version: 1, from_token: 2 }]
        );
        assert_eq!(out[0].oldest_version(), 0);
        assert_eq!(out[0].finish, FinishReason::Length);
    }

    #[test]
    fn solved_answers_are_the_reversed_letters() {
        let cfg = SimConfig { p_solve: 1.0, hard_frac: 0.0, ..Default::default() };
        let r = plan_response(&cfg, &[BOS, 4, 5, 6, 9], &params(3), 12);
        assert_eq!(r, vec![6, 5, 4, EOS]);
    }
}
