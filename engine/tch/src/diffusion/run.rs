//! A diffusion RL run: pretrain the denoiser on the domain (plain denoising loss), train the
//! reward classifier, then RL steps. Each step samples `samples_per_condition` images for each of
//! `conditions_per_step` conditions, in micro-groups of `micro_group` images denoised together;
//! with `streaming` a reward thread scores a micro-group as soon as it finishes denoising while
//! the next one denoises (Miles-Diffusion's streaming micro-group rewards), otherwise the whole
//! batch is scored after the last micro-group. Rewards become group-relative advantages (one group
//! per condition) and the clipped per-step objective updates the denoiser.

use super::ddpm::{pretrain_loss, sample, SampleParams, Schedule, Trajectory};
use super::domain::Domain;
use super::grid::write_grid_svg;
use super::model::Denoiser;
use super::reward::Classifier;
use super::reward_stage::{ProcessStage, RewardStage, Scorer, ThreadStage, WorkerConfig};
use super::rl::{accumulate_rl_gradients, choose_steps, group_advantages, DenoiserAdam, RlLossSpec};
pub use miles_runtime::diffusion::{
    DiffusionEvalSpec, DiffusionRewardSpec, DiffusionRlSpec, DiffusionRunSpec, DiffusionSummary, PretrainSpec,
};
use miles_runtime::exec::Metrics;
use miles_runtime::rng::Rng;
use miles_runtime::{RunError, TrainSpec, E_BACKEND, E_NONFINITE};
use serde_json::{json, Map, Value};
use std::path::Path;
use std::time::{Duration, Instant};
use tch::Tensor;

/// Runs `spec`, writing metrics.jsonl, sample grids (`grids/step-NNNNN.svg`) and the denoiser's
/// last good checkpoint (`denoiser.safetensors`) into `out`.
pub fn run(spec: &DiffusionRunSpec, out: &Path, threads: Option<usize>) -> Result<DiffusionSummary, RunError> {
    spec.validate()?;
    // A reward worker process is the `miles-engine` binary again (`image-reward`).
    let worker_exe = if spec.reward.process { Some(crate::engine_exe("reward")?) } else { None };
    if let Some(n) = threads {
        tch::set_num_threads(n.max(1) as i32);
    }
    let t0 = Instant::now();
    std::fs::create_dir_all(out.join("grids")).map_err(|e| RunError::io(E_BACKEND, "cannot create", out, e))?;
    let mut metrics = Metrics::open(&out.join("metrics.jsonl"), None)?;
    let domain = Domain::new(spec.model.side, spec.model.conditions)?;
    // What RL starts from and is judged by (the pretrained denoiser, the reward classifier, the
    // judge, the held-out samples) follows the pretraining seed; RL's own draws follow `seed`.
    let base_seed = spec.pretrain.seed.unwrap_or(spec.seed);
    let schedule = Schedule::new(spec.schedule, spec.steps)?;
    let (classifier, accuracy) = reward_model(spec, &domain, base_seed, out)?;
    // The judge: trained like the reward model from an unrelated seed, never optimised against.
    let judge = match spec.eval.judge_steps {
        0 => None,
        n => Some(Classifier::train_on_domain(&domain, n as usize, 32, 3e-3, base_seed ^ 0x7D6E_0001)?.0),
    };
    let mut stage = reward_stage(spec, classifier, worker_exe, out)?;
    let model = Denoiser::init(&spec.model, base_seed)?;
    model.set_requires_grad(true);
    let mut opt = DenoiserAdam::new(&model, adam_spec(spec.pretrain.lr, 1.0));
    pretrain(&model, &mut opt, spec, &domain, &schedule, base_seed, &mut metrics)?;
    // The frozen reference only when a KL term reads it.
    let reference = (spec.rl.kl_coef > 0.0).then(|| {
        let r = model.deep_copy();
        r.set_requires_grad(false);
        r
    });
    // Assigned, not shadowed: the pretraining optimizer's moments are freed here.
    opt = DenoiserAdam::new(&model, adam_spec(spec.rl.lr, spec.rl.grad_clip));
    model.save(&out.join("denoiser.safetensors"))?;

    let pairs = domain.eval_pairs(spec.eval.samples, base_seed ^ 0xE7A1);
    let evaluation = Evaluation { spec, out, schedule: &schedule, judge, pairs, seed: base_seed ^ 0xE7A1 };
    let first = evaluation.run(&model, &mut stage, 0)?;
    // The step whose weights denoiser.safetensors holds (0: the pretrained denoiser).
    let mut saved_at = 0;
    let mut row = first.row();
    row.push(("reward/classifier_accuracy", accuracy as f64));
    write_row(&mut metrics, 0, &row)?;
    let mut last = first;

    let mut step_rng = Rng::derived(spec.seed, "diffusion-conditions", 0);
    for step in 1..=spec.rl.steps {
        let t_step = Instant::now();
        let rl = RlStep { model: &model, reference: reference.as_ref(), schedule: &schedule, spec, step, saved_at };
        let mut row = rl.run(&mut step_rng, &mut stage, &mut opt)?;
        if step % spec.eval.every == 0 || step == spec.rl.steps {
            last = evaluation.run(&model, &mut stage, step).map_err(|e| at_rl_step(e, step, saved_at))?;
            model.save(&out.join("denoiser.safetensors"))?;
            saved_at = step;
            row.extend(last.row());
        }
        if spec.reward.process {
            row.push(("reward/worker_restarts", stage.restarts() as f64));
        }
        row.push(("perf/step_s", t_step.elapsed().as_secs_f64()));
        // The high-water mark so far (`miles report` sets the last against the plan's memory).
        if let Some(b) = miles_runtime::exec::peak_rss_bytes() {
            row.push(("perf/peak_rss_bytes", b as f64));
        }
        write_row(&mut metrics, step, &row)?;
    }
    Ok(DiffusionSummary {
        steps_done: spec.rl.steps,
        eval_start: first.reward,
        eval_end: last.reward,
        classifier_accuracy: accuracy,
        judge_start: first.judge,
        judge_end: last.judge,
        wall_seconds: t0.elapsed().as_secs_f64(),
    })
}

/// The denoiser's AdamW settings at `lr`.
fn adam_spec(lr: f64, grad_clip: f64) -> TrainSpec {
    serde_json::from_value(json!({"lr": lr, "micro_batch": 1, "global_batch": 1, "grad_clip": grad_clip}))
        .expect("static spec")
}

/// The reward model: trained on the domain (and kept in `out/classifier`, so another recipe can
/// reward against the same model), or loaded; its input shape must be the denoiser's. With its
/// held-out accuracy (NaN when loaded).
fn reward_model(
    spec: &DiffusionRunSpec,
    domain: &Domain,
    base_seed: u64,
    out: &Path,
) -> Result<(Classifier, f32), RunError> {
    match &spec.reward.classifier_path {
        Some(p) => Ok((Classifier::load_dir(p, spec.model.side, spec.model.conditions)?, f32::NAN)),
        None => {
            let (c, acc) = Classifier::train_on_domain(
                domain,
                spec.reward.classifier_steps as usize,
                32,
                3e-3,
                base_seed ^ 0xC1A5,
            )?;
            // Kept, so another recipe can reward against the same model (`classifier = "..."`).
            c.save_dir(&out.join("classifier"))?;
            Ok((c, acc))
        }
    }
}

/// The reward stage scoring `classifier`'s rewards: a worker process (`worker_exe`, which loads
/// the classifier from its directory) or a thread of this one.
fn reward_stage(
    spec: &DiffusionRunSpec,
    classifier: Classifier,
    worker_exe: Option<std::path::PathBuf>,
    out: &Path,
) -> Result<RewardStage, RunError> {
    let mut classifier = classifier.with_extra_cost(Duration::from_millis(spec.reward.extra_cost_ms));
    classifier.temperature = spec.reward.classifier_temperature;
    Ok(match worker_exe {
        Some(exe) => {
            let classifier = match &spec.reward.classifier_path {
                Some(p) => p.clone(),
                None => out.join("classifier"),
            };
            let config = WorkerConfig {
                classifier,
                side: spec.model.side,
                conditions: spec.model.conditions,
                reward: spec.reward.clone(),
            };
            RewardStage::Process(ProcessStage::start(&exe, &config)?)
        }
        None => RewardStage::Thread(ThreadStage::start(Scorer::new(classifier, &spec.reward))),
    })
}

/// Pretraining: the plain denoising loss on domain images, its mean written every 100 steps.
fn pretrain(
    model: &Denoiser,
    opt: &mut DenoiserAdam,
    spec: &DiffusionRunSpec,
    domain: &Domain,
    schedule: &Schedule,
    base_seed: u64,
    metrics: &mut Metrics,
) -> Result<(), RunError> {
    let mut rng = Rng::derived(base_seed, "diffusion-pretrain", 0);
    let (mut loss_sum, mut since) = (0.0, 0u64);
    for i in 0..spec.pretrain.steps {
        let conds: Vec<i64> =
            (0..spec.pretrain.batch).map(|_| (rng.next_f64() * spec.model.conditions as f64) as i64).collect();
        let x0 = domain.batch(&conds, &mut rng);
        let loss = pretrain_loss(model, schedule, &x0, &conds, &mut rng, spec.pretrain.p_uncond)?;
        let l = loss.double_value(&[]);
        if !l.is_finite() {
            // Before the update: the weights are still those of step i.
            return Err(RunError::new(
                E_NONFINITE,
                format!(
                    "the denoiser's pretraining loss became {l} at pretraining step {}; nothing was saved yet",
                    i + 1
                ),
            )
            .with_help("lower denoise_pretrain.lr"));
        }
        loss.backward();
        opt.step(model, spec.pretrain.lr)?;
        loss_sum += l;
        since += 1;
        if (i + 1) % 100 == 0 || i + 1 == spec.pretrain.steps {
            write_row(metrics, 0, &[("pretrain/loss", loss_sum / since as f64), ("pretrain/step", (i + 1) as f64)])?;
            (loss_sum, since) = (0.0, 0);
        }
    }
    Ok(())
}

/// The held-out evaluation: fixed (condition, seed) pairs sampled, scored by the reward stage and
/// the judge, and drawn as a grid.
struct Evaluation<'a> {
    spec: &'a DiffusionRunSpec,
    out: &'a Path,
    schedule: &'a Schedule,
    judge: Option<Classifier>,
    pairs: Vec<(i64, u64)>,
    /// The sampler's seed.
    seed: u64,
}

impl Evaluation<'_> {
    fn run(&self, model: &Denoiser, stage: &mut RewardStage, step: u64) -> Result<Eval, RunError> {
        let spec = self.spec;
        let conds: Vec<i64> = self.pairs.iter().map(|p| p.0).collect();
        let params = SampleParams { guidance: spec.guidance, eta: spec.eta, seed: self.seed };
        let traj = sample(model, &conds, self.schedule, params)?;
        let images = traj.images();
        let r = stage.score_now(&images, &conds)?;
        let cols = spec.model.conditions.min(conds.len()).max(1);
        write_grid_svg(
            &self.out.join(format!("grids/step-{step:05}.svg")),
            &images,
            cols,
            &format!("step {step}: held-out samples"),
        )?;
        let judge = match &self.judge {
            Some(j) => accuracy_of(&j.predict(&images)?, &conds),
            None => f64::NAN,
        };
        Ok(Eval {
            reward: r.iter().map(|x| *x as f64).sum::<f64>() / r.len().max(1) as f64,
            judge,
            diversity: diversity(&images, &conds)?,
        })
    }
}

/// One RL step: conditions drawn, their micro-groups denoised and rewarded, group-relative
/// advantages, the clipped per-step objective's gradients and one optimizer step.
struct RlStep<'a> {
    model: &'a Denoiser,
    reference: Option<&'a Denoiser>,
    schedule: &'a Schedule,
    spec: &'a DiffusionRunSpec,
    step: u64,
    /// The step whose weights denoiser.safetensors holds, for a non-finite value's error.
    saved_at: u64,
}

impl RlStep<'_> {
    /// Runs the step; returns its metrics row.
    fn run(
        &self,
        step_rng: &mut Rng,
        stage: &mut RewardStage,
        opt: &mut DenoiserAdam,
    ) -> Result<Vec<(&'static str, f64)>, RunError> {
        let (spec, step) = (self.spec, self.step);
        let (g, mg) = (spec.rl.samples_per_condition, spec.rl.micro_group);
        let conds: Vec<i64> = (0..spec.rl.conditions_per_step)
            .map(|_| (step_rng.next_f64() * spec.model.conditions as f64) as i64)
            .collect();
        let all: Vec<i64> = conds.iter().flat_map(|&c| std::iter::repeat_n(c, g)).collect();
        let micro: Vec<Vec<i64>> = all.chunks(mg).map(<[i64]>::to_vec).collect();
        let t_roll = Instant::now();
        let (trajs, rewards, denoise_s, wait_s) = rollout(self.model, self.schedule, spec, step, &micro, stage)
            .map_err(|e| at_rl_step(e, step, self.saved_at))?;
        let rollout_s = t_roll.elapsed().as_secs_f64();
        let group_of: Vec<usize> = (0..all.len()).map(|i| i / g).collect();
        let adv = group_advantages(&rewards, &group_of, spec.rl.std_norm);
        let t_train = Instant::now();
        let (loss, clip, kl) = self.accumulate(&trajs, &adv).map_err(|e| at_rl_step(e, step, self.saved_at))?;
        let grad_norm = opt.step(self.model, spec.rl.lr)?;
        let train_s = t_train.elapsed().as_secs_f64();
        let mean_r = rewards.iter().map(|x| *x as f64).sum::<f64>() / rewards.len().max(1) as f64;
        Ok(vec![
            ("rollout/reward_mean", mean_r),
            ("train/loss", loss),
            ("train/clip_frac", clip),
            ("train/kl", kl),
            ("train/grad_norm", grad_norm),
            ("perf/rollout_s", rollout_s),
            ("perf/denoise_s", denoise_s),
            ("perf/reward_wait_s", wait_s),
            ("perf/train_s", train_s),
        ])
    }

    /// Every micro-group's recorded trajectory's gradients, the loss averaged over micro-groups.
    /// Returns the loss, the clip fraction and the KL.
    fn accumulate(&self, trajs: &[Trajectory], adv: &[f32]) -> Result<(f64, f64, f64), RunError> {
        let spec = self.spec;
        let mg = spec.rl.micro_group;
        let steps = choose_steps(spec.steps, spec.rl.train_steps, spec.seed, self.step);
        let n = trajs.len() as f64;
        let loss_spec = RlLossSpec { clip: spec.rl.clip, kl_coef: spec.rl.kl_coef / n };
        let (mut loss, mut clip, mut kl) = (0.0, 0.0, 0.0);
        for (k, tr) in trajs.iter().enumerate() {
            let a: Vec<f32> = adv[k * mg..(k + 1) * mg].iter().map(|x| x / n as f32).collect();
            let st = accumulate_rl_gradients(
                self.model,
                self.reference,
                tr,
                &Tensor::from_slice(&a),
                &steps,
                self.schedule,
                loss_spec,
            )?;
            (loss, clip, kl) = (loss + st.loss * n, clip + st.clip_frac / n, kl + st.kl * n);
        }
        Ok((loss / n, clip, kl / n))
    }
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
    stage: &mut RewardStage,
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
                format!("the denoiser produced NaN/inf (micro-group {k}, image {i})"),
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

/// A non-finite value met at RL `step`, said with where the last good denoiser is; the update of
/// that step was not applied. Other errors pass as they are.
fn at_rl_step(e: RunError, step: u64, saved_at: u64) -> RunError {
    if e.code != E_NONFINITE {
        return e;
    }
    RunError::new(
        E_NONFINITE,
        format!(
            "RL step {step}: {}; the run stopped, that step's update not applied; the last good denoiser is \
             denoiser.safetensors (the weights after step {saved_at})",
            e.message
        ),
    )
    .with_help("lower diffusion_grpo.lr, or raise kl_coef")
}

/// One held-out evaluation: the mean reward, the judge's accuracy and the samples' diversity.
#[derive(Clone, Copy)]
struct Eval {
    reward: f64,
    judge: f64,
    diversity: f64,
}

impl Eval {
    fn row(&self) -> Vec<(&'static str, f64)> {
        vec![("eval/reward_mean", self.reward), ("eval/judge_accuracy", self.judge), ("eval/diversity", self.diversity)]
    }
}

fn accuracy_of(pred: &[i64], conds: &[i64]) -> f64 {
    pred.iter().zip(conds).filter(|(p, c)| p == c).count() as f64 / conds.len().max(1) as f64
}

/// How different one condition's samples are from each other: the per-pixel standard deviation
/// across a condition's images, averaged over pixels and then over conditions (0 when every
/// sample of a condition is the same picture: the mode collapse reward hacking shows).
fn diversity(images: &Tensor, conds: &[i64]) -> Result<f64, RunError> {
    let b = images.size()[0] as usize;
    let px = crate::model::f32_values(images)?;
    let n = px.len() / b.max(1);
    let mut by: std::collections::BTreeMap<i64, Vec<usize>> = Default::default();
    for (i, c) in conds.iter().enumerate() {
        by.entry(*c).or_default().push(i);
    }
    let per: Vec<f64> = by
        .values()
        .filter(|rows| rows.len() > 1)
        .map(|rows| {
            let m = rows.len() as f64;
            (0..n)
                .map(|j| {
                    let mean = rows.iter().map(|&r| px[r * n + j] as f64).sum::<f64>() / m;
                    (rows.iter().map(|&r| (px[r * n + j] as f64 - mean).powi(2)).sum::<f64>() / m).sqrt()
                })
                .sum::<f64>()
                / n as f64
        })
        .collect();
    Ok(if per.is_empty() { f64::NAN } else { per.iter().sum::<f64>() / per.len() as f64 })
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
