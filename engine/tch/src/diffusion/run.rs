//! A diffusion RL run: pretrain the denoiser on the domain (plain denoising loss), train the
//! reward classifier, then RL steps. Each step samples `samples_per_condition` images for each of
//! `conditions_per_step` conditions, in micro-groups of `micro_group` images denoised together;
//! with `streaming` a reward thread scores a micro-group as soon as it finishes denoising while
//! the next one denoises (Miles-Diffusion's streaming micro-group rewards), otherwise the whole
//! batch is scored after the last micro-group. Rewards become group-relative advantages (one group
//! per condition) and the clipped per-step objective updates the denoiser.

use super::ddpm::{pretrain_loss, sample, SampleParams, Schedule, ScheduleKind, Trajectory};
use super::domain::Domain;
use super::grid::write_grid_svg;
use super::model::{Denoiser, DenoiserConfig};
use super::reward::{Analytic, Classifier};
use super::rl::{accumulate_rl_gradients, choose_steps, group_advantages, DenoiserAdam, RlLossSpec};
use miles_runtime::exec::Metrics;
use miles_runtime::rng::Rng;
use miles_runtime::{RunError, TrainSpec, E_BACKEND, E_NONFINITE, E_SPEC};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use tch::Tensor;

/// Everything a diffusion run needs, as plain serde data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiffusionRunSpec {
    pub seed: u64,
    pub model: DenoiserConfig,
    #[serde(default)]
    pub schedule: ScheduleKind,
    /// Denoising steps T.
    pub steps: usize,
    /// Sampler noise level (sigma_t = eta sqrt(beta_tilde_t)); > 0 so every step has a log-prob.
    pub eta: f64,
    /// Classifier-free guidance weight (1: the conditional model alone).
    pub guidance: f64,
    pub pretrain: PretrainSpec,
    pub reward: DiffusionRewardSpec,
    pub rl: DiffusionRlSpec,
    pub eval: DiffusionEvalSpec,
    /// Score each micro-group while the next one denoises (else after the whole batch).
    pub streaming: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PretrainSpec {
    pub steps: u64,
    pub lr: f64,
    pub batch: usize,
    /// Probability of training on the null condition (classifier-free guidance).
    pub p_uncond: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiffusionRewardSpec {
    /// Classifier training steps on the domain (batch 32) before RL; or a checkpoint to load.
    pub classifier_steps: u64,
    #[serde(default)]
    pub classifier_path: Option<PathBuf>,
    /// Weight of the classifier's p(condition | image) in the reward.
    pub classifier_weight: f64,
    /// Softmax temperature of that probability (above 1: graded rather than 0/1 rewards).
    #[serde(default = "one")]
    pub classifier_temperature: f64,
    /// An analytic property added with `analytic_weight`.
    #[serde(default)]
    pub analytic: Option<AnalyticReward>,
    #[serde(default)]
    pub analytic_weight: f64,
    /// Stand-in for a large reward model: sleep this long per scored micro-group after the
    /// classifier's real forward (so overlap can be measured on a small machine).
    #[serde(default)]
    pub extra_cost_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AnalyticReward {
    Brightness,
    Contrast,
    CenterMass,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiffusionRlSpec {
    pub steps: u64,
    pub conditions_per_step: usize,
    /// The group: images sampled per condition, compared with each other.
    pub samples_per_condition: usize,
    /// Images denoised together (divides the group).
    pub micro_group: usize,
    pub lr: f64,
    pub clip: f64,
    pub kl_coef: f64,
    /// Train on this many of the T denoising steps per trajectory (chosen at random); None: all.
    #[serde(default)]
    pub train_steps: Option<usize>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiffusionEvalSpec {
    pub every: u64,
    /// Held-out (condition, seed) pairs.
    pub samples: usize,
}

/// What a finished run reports.
#[derive(Debug, Clone, Serialize)]
pub struct DiffusionSummary {
    pub steps_done: u64,
    pub eval_start: f64,
    pub eval_end: f64,
    pub classifier_accuracy: f32,
    pub wall_seconds: f64,
}

impl DiffusionRunSpec {
    /// The rules `miles check` will state in the stdlib; here so a spec from anywhere is refused
    /// before any work.
    pub fn validate(&self) -> Result<(), RunError> {
        self.model.validate()?;
        let r = &self.rl;
        let bad = |m: String| Err(RunError::new(E_SPEC, m));
        if r.micro_group == 0 || r.samples_per_condition % r.micro_group != 0 {
            return bad(format!(
                "micro_group = {} must divide samples_per_condition = {}: a micro-group holds one condition's images",
                r.micro_group, r.samples_per_condition
            ));
        }
        if self.eta <= 0.0 {
            return bad("eta must be > 0: RL needs every denoising step's log-probability".into());
        }
        if r.train_steps.is_some_and(|k| k == 0 || k > self.steps) {
            return bad(format!("train_steps must be in 1..={}", self.steps));
        }
        if r.conditions_per_step == 0 || self.eval.samples == 0 {
            return bad("conditions_per_step and eval samples must be positive".into());
        }
        Ok(())
    }
}

/// Scored micro-groups: the reward stage as a thread (streaming) or inline.
struct RewardStage {
    classifier: Classifier,
    analytic: Option<Analytic>,
    spec: DiffusionRewardSpec,
}

impl RewardStage {
    fn score(&self, images: &Tensor, conds: &[i64]) -> Result<Vec<f32>, RunError> {
        let p = self.classifier.score(images, conds)?;
        let a = match &self.analytic {
            Some(a) => a.score(images)?,
            None => vec![0.0; p.len()],
        };
        Ok(p.iter()
            .zip(&a)
            .map(|(p, a)| (self.spec.classifier_weight * *p as f64 + self.spec.analytic_weight * *a as f64) as f32)
            .collect())
    }
}

/// A micro-group handed to the reward stage: its images, conditions and index.
type Job = (usize, Tensor, Vec<i64>);

/// Runs `spec`, writing metrics.jsonl, sample grids (`grids/step-NNNNN.svg`) and the denoiser's
/// last good checkpoint (`denoiser.safetensors`) into `out`.
pub fn run(spec: &DiffusionRunSpec, out: &Path, threads: Option<usize>) -> Result<DiffusionSummary, RunError> {
    spec.validate()?;
    if let Some(n) = threads {
        tch::set_num_threads(n.max(1) as i32);
    }
    let t0 = Instant::now();
    std::fs::create_dir_all(out.join("grids")).map_err(|e| RunError::io(E_BACKEND, "cannot create", out, e))?;
    let mut metrics = Metrics::open(&out.join("metrics.jsonl"), None)?;
    let domain = Domain::new(spec.model.side, spec.model.conditions)?;
    let schedule = Schedule::new(spec.schedule, spec.steps)?;

    // The reward model: trained on the domain, or loaded; its input shape must be the denoiser's.
    let (classifier, accuracy) = match &spec.reward.classifier_path {
        Some(p) => (Classifier::load(p, spec.model.side, spec.model.conditions)?, f32::NAN),
        None => {
            Classifier::train_on_domain(&domain, spec.reward.classifier_steps as usize, 32, 3e-3, spec.seed ^ 0xC1A5)?
        }
    };
    let mut classifier = classifier.with_extra_cost(Duration::from_millis(spec.reward.extra_cost_ms));
    classifier.temperature = spec.reward.classifier_temperature;
    let probe = Tensor::zeros([1, 1, spec.model.side as i64, spec.model.side as i64], tch::kind::FLOAT_CPU);
    classifier.check_input(&probe)?;
    let analytic = spec.reward.analytic.map(|a| match a {
        AnalyticReward::Brightness => Analytic::Brightness,
        AnalyticReward::Contrast => Analytic::Contrast,
        AnalyticReward::CenterMass => Analytic::CenterMass,
    });
    let stage = RewardWorker::start(RewardStage { classifier, analytic, spec: spec.reward.clone() });

    // Pretraining: the plain denoising loss on domain images.
    let model = Denoiser::init(&spec.model, spec.seed)?;
    model.set_requires_grad(true);
    let adam_spec = |lr: f64| -> TrainSpec {
        serde_json::from_value(json!({"lr": lr, "micro_batch": 1, "global_batch": 1, "grad_clip": 1.0}))
            .expect("static spec")
    };
    let mut opt = DenoiserAdam::new(&model, adam_spec(spec.pretrain.lr));
    let mut rng = Rng::derived(spec.seed, "diffusion-pretrain", 0);
    let (mut loss_sum, mut since) = (0.0, 0u64);
    for i in 0..spec.pretrain.steps {
        let conds: Vec<i64> =
            (0..spec.pretrain.batch).map(|_| (rng.next_f64() * spec.model.conditions as f64) as i64).collect();
        let x0 = domain.batch(&conds, &mut rng);
        let loss = pretrain_loss(&model, &schedule, &x0, &conds, &mut rng, spec.pretrain.p_uncond)?;
        loss.backward();
        opt.step(&model, spec.pretrain.lr)?;
        loss_sum += loss.double_value(&[]);
        since += 1;
        if (i + 1) % 100 == 0 || i + 1 == spec.pretrain.steps {
            write_row(
                &mut metrics,
                0,
                &[("pretrain/loss", loss_sum / since as f64), ("pretrain/step", (i + 1) as f64)],
            )?;
            (loss_sum, since) = (0.0, 0);
        }
    }
    let reference = model.deep_copy();
    reference.set_requires_grad(false);
    let mut opt = DenoiserAdam::new(&model, adam_spec(spec.rl.lr));
    model.save(&out.join("denoiser.safetensors"))?;

    let eval_pairs = domain.eval_pairs(spec.eval.samples, spec.seed ^ 0xE7A1);
    let eval = |model: &Denoiser, step: u64| -> Result<f64, RunError> {
        let conds: Vec<i64> = eval_pairs.iter().map(|p| p.0).collect();
        let params = SampleParams { guidance: spec.guidance, eta: spec.eta, seed: spec.seed ^ 0xE7A1 };
        let traj = sample(model, &conds, &schedule, params)?;
        let images = traj.images();
        let r = stage.score_now(&images, &conds)?;
        let cols = spec.model.conditions.min(conds.len()).max(1);
        write_grid_svg(
            &out.join(format!("grids/step-{step:05}.svg")),
            &images,
            cols,
            &format!("step {step}: held-out samples"),
        )?;
        Ok(r.iter().map(|x| *x as f64).sum::<f64>() / r.len().max(1) as f64)
    };
    let eval_start = eval(&model, 0)?;
    write_row(&mut metrics, 0, &[("eval/reward_mean", eval_start), ("reward/classifier_accuracy", accuracy as f64)])?;
    let mut eval_end = eval_start;

    let mut step_rng = Rng::derived(spec.seed, "diffusion-conditions", 0);
    let (g, mg) = (spec.rl.samples_per_condition, spec.rl.micro_group);
    for step in 1..=spec.rl.steps {
        let t_step = Instant::now();
        let conds: Vec<i64> = (0..spec.rl.conditions_per_step)
            .map(|_| (step_rng.next_f64() * spec.model.conditions as f64) as i64)
            .collect();
        let all: Vec<i64> = conds.iter().flat_map(|&c| std::iter::repeat_n(c, g)).collect();
        let micro: Vec<Vec<i64>> = all.chunks(mg).map(<[i64]>::to_vec).collect();
        let t_roll = Instant::now();
        let (trajs, rewards, denoise_s, wait_s) = rollout(&model, &schedule, spec, step, &micro, &stage)?;
        let rollout_s = t_roll.elapsed().as_secs_f64();
        let group_of: Vec<usize> = (0..all.len()).map(|i| i / g).collect();
        let adv = group_advantages(&rewards, &group_of, true);
        // RL: every micro-group's recorded trajectory, the loss averaged over micro-groups.
        let t_train = Instant::now();
        let steps = choose_steps(spec.steps, spec.rl.train_steps, spec.seed, step);
        let n = trajs.len() as f64;
        let loss_spec = RlLossSpec { clip: spec.rl.clip, kl_coef: spec.rl.kl_coef / n };
        let (mut loss, mut clip, mut kl) = (0.0, 0.0, 0.0);
        for (k, tr) in trajs.iter().enumerate() {
            let a: Vec<f32> = adv[k * mg..(k + 1) * mg].iter().map(|x| x / n as f32).collect();
            let st = accumulate_rl_gradients(
                &model,
                Some(&reference),
                tr,
                &Tensor::from_slice(&a),
                &steps,
                &schedule,
                loss_spec,
            )?;
            (loss, clip, kl) = (loss + st.loss * n, clip + st.clip_frac / n, kl + st.kl * n);
        }
        let grad_norm = opt.step(&model, spec.rl.lr)?;
        let train_s = t_train.elapsed().as_secs_f64();
        let mean_r = rewards.iter().map(|x| *x as f64).sum::<f64>() / rewards.len().max(1) as f64;
        let mut row: Vec<(&str, f64)> = vec![
            ("rollout/reward_mean", mean_r),
            ("train/loss", loss / n),
            ("train/clip_frac", clip),
            ("train/kl", kl / n),
            ("train/grad_norm", grad_norm),
            ("perf/rollout_s", rollout_s),
            ("perf/denoise_s", denoise_s),
            ("perf/reward_wait_s", wait_s),
            ("perf/train_s", train_s),
        ];
        if step % spec.eval.every == 0 || step == spec.rl.steps {
            eval_end = eval(&model, step)?;
            model.save(&out.join("denoiser.safetensors"))?;
            row.push(("eval/reward_mean", eval_end));
        }
        row.push(("perf/step_s", t_step.elapsed().as_secs_f64()));
        write_row(&mut metrics, step, &row)?;
    }
    Ok(DiffusionSummary {
        steps_done: spec.rl.steps,
        eval_start,
        eval_end,
        classifier_accuracy: accuracy,
        wall_seconds: t0.elapsed().as_secs_f64(),
    })
}

/// Denoises the step's micro-groups one after another and has the reward stage score them:
/// streamed (micro-group k is sent as soon as it is denoised, so it is scored while k + 1
/// denoises) or all after the last one. Returns the trajectories, the rewards in sample order, the
/// seconds spent denoising and the seconds spent waiting for rewards after denoising ended.
fn rollout(
    model: &Denoiser,
    schedule: &Schedule,
    spec: &DiffusionRunSpec,
    step: u64,
    micro: &[Vec<i64>],
    stage: &RewardWorker,
) -> Result<(Vec<Trajectory>, Vec<f32>, f64, f64), RunError> {
    let mut trajs = Vec::with_capacity(micro.len());
    let mut held = Vec::new();
    let mut denoise_s = 0.0;
    for (k, conds) in micro.iter().enumerate() {
        let t = Instant::now();
        let seed = miles_runtime::rng::derive_seed(spec.seed, "diffusion-rollout", step * 1_000_003 + k as u64);
        let tr = sample(model, conds, schedule, SampleParams { guidance: spec.guidance, eta: spec.eta, seed })?;
        let images = tr.images();
        denoise_s += t.elapsed().as_secs_f64();
        if let Some(i) = first_nonfinite(&images) {
            return Err(RunError::new(
                E_NONFINITE,
                format!(
                    "the denoiser produced NaN/inf at RL step {step} (micro-group {k}, image {i}); \
                     the last good checkpoint is denoiser.safetensors"
                ),
            ));
        }
        trajs.push(tr);
        if spec.streaming {
            stage.send(k, images, conds.clone())?;
        } else {
            held.push((k, images, conds.clone()));
        }
    }
    for (k, images, conds) in held {
        stage.send(k, images, conds)?;
    }
    let t = Instant::now();
    let mut offsets = Vec::with_capacity(micro.len());
    let mut at = 0;
    for m in micro {
        offsets.push(at);
        at += m.len();
    }
    let mut rewards = vec![0f32; at];
    for _ in 0..micro.len() {
        let (k, r) = stage.recv()?;
        rewards[offsets[k]..offsets[k] + r.len()].copy_from_slice(&r);
    }
    Ok((trajs, rewards, denoise_s, t.elapsed().as_secs_f64()))
}

/// The reward stage in a thread of its own, which owns the reward model: jobs in, scores out.
struct RewardWorker {
    jobs: Option<mpsc::Sender<Job>>,
    results: mpsc::Receiver<(usize, Result<Vec<f32>, RunError>)>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl RewardWorker {
    fn start(stage: RewardStage) -> RewardWorker {
        let (job_tx, job_rx) = mpsc::channel::<Job>();
        let (res_tx, res_rx) = mpsc::channel();
        let handle = std::thread::spawn(move || {
            // One intra-op thread: the other core denoises meanwhile.
            tch::set_num_threads(1);
            let _g = tch::no_grad_guard();
            for (k, images, conds) in job_rx {
                if res_tx.send((k, stage.score(&images, &conds))).is_err() {
                    break;
                }
            }
        });
        RewardWorker { jobs: Some(job_tx), results: res_rx, handle: Some(handle) }
    }

    fn send(&self, k: usize, images: Tensor, conds: Vec<i64>) -> Result<(), RunError> {
        self.jobs.as_ref().and_then(|j| j.send((k, images, conds)).ok()).ok_or_else(|| {
            RunError::new(E_BACKEND, "the reward stage stopped (its thread ended); the step was not trained")
        })
    }

    fn recv(&self) -> Result<(usize, Vec<f32>), RunError> {
        let (k, r) = self.results.recv_timeout(Duration::from_secs(600)).map_err(|_| {
            RunError::new(E_BACKEND, "the reward stage did not answer within 600 s or died; the step was not trained")
        })?;
        Ok((k, r.map_err(|e| RunError::new(e.code, format!("reward stage: {}", e.message)))?))
    }

    /// Scores one batch and waits for it (evaluation).
    fn score_now(&self, images: &Tensor, conds: &[i64]) -> Result<Vec<f32>, RunError> {
        self.send(usize::MAX, images.shallow_clone(), conds.to_vec())?;
        self.recv().map(|(_, r)| r)
    }
}

impl Drop for RewardWorker {
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

fn first_nonfinite(images: &Tensor) -> Option<usize> {
    let b = images.size()[0];
    let bad = images.isfinite().logical_not().reshape([b, -1]).any_dim(1, false);
    let v = Vec::<bool>::try_from(bad).ok()?;
    v.iter().position(|x| *x)
}

/// A metrics row: `step` and the values (a non-finite one as null), through the runtime's
/// metrics.jsonl writer (and its TensorBoard copy).
fn write_row(m: &mut Metrics, step: u64, values: &[(&str, f64)]) -> Result<(), RunError> {
    let mut row = Map::new();
    row.insert("step".into(), json!(step));
    for (k, v) in values {
        row.insert((*k).into(), if v.is_finite() { json!(v) } else { Value::Null });
    }
    m.write(&row)
}

fn one() -> f64 {
    1.0
}
