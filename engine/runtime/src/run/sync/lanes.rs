//! Multi-LoRA in the synchronous executor: several named adapters on one base, each a lane with
//! its own task (prompts), learning rate, optimizer state and metrics (`lora/<name>/...`). A step
//! runs every lane in turn on the one engine and the one trainer, each switched to the lane's
//! adapter: the lane's prompts are sampled with its adapter, scored by the run's reward against
//! its task, and train its adapter alone (its own loss normalisation, gradient clip and Adam
//! step), so no trajectory of one adapter reaches another's update. One weight update then
//! carries every adapter.

use super::StepOutcome;
use crate::backend::{RolloutEngine, TrainStats, Trainer};
use crate::reward::BatchReward;
use crate::rng::derive_seed;
use crate::run::step::batch::{single_turn_batch, StepBatch};
use crate::run::step::eval::evaluate;
use crate::run::step::open::build_task_for;
use crate::run::step::train::{step_lrs, train_checked};
use crate::sample::SamplingParams;
use crate::spec::RunSpec;
use crate::tasks::TaskSet;
use crate::RunError;
use serde_json::{json, Map};
use std::time::Instant;

pub(crate) struct Lane {
    pub(crate) name: String,
    pub(crate) task: TaskSet,
    /// The adapter's own learning rate; None: the trainer's.
    lr: Option<f64>,
    /// Under the task verifier (`exact_match`), the lane's own scoring (its `partial_credit`);
    /// None: the run's reward scores the lane.
    reward: Option<crate::reward::TaskReward>,
}

/// The lanes of `spec`: one per named adapter (one named adapter is a lane too: its own prompts
/// and learning rate), none for a run without named adapters.
pub(crate) fn lanes_of(spec: &RunSpec) -> Result<Vec<Lane>, RunError> {
    let Some(l) = spec.train.lora.as_ref().filter(|l| !l.adapters.is_empty()) else { return Ok(Vec::new()) };
    l.adapters
        .iter()
        .map(|a| {
            Ok(Lane {
                name: a.name.clone(),
                task: build_task_for(spec, &a.task)?,
                lr: a.lr,
                reward: spec
                    .reward
                    .is_none()
                    .then_some(crate::reward::TaskReward { partial_credit: a.task.partial_credit }),
            })
        })
        .collect()
}

/// Every lane's rollout, reward and training for `step`. The outcome's batch is all lanes'
/// together (for the run's columns: groups renumbered apart), its training stats their
/// combination (sums of counts, means of the per-lane means), with each lane's own columns.
pub(crate) fn step(
    spec: &RunSpec,
    lanes: &mut [Lane],
    engine: &mut dyn RolloutEngine,
    trainer: &mut dyn Trainer,
    reward: &mut dyn BatchReward,
    step: u64,
    last_ckpt: &Option<std::path::PathBuf>,
) -> Result<StepOutcome, RunError> {
    let r = &spec.rollout;
    let k = lanes.len().max(1) as f64;
    let mut out = StepOutcome {
        sb: StepBatch::default(),
        ts: TrainStats::default(),
        lrs: Vec::new(),
        cols: Map::new(),
        gen_s: 0.0,
        reward_s: 0.0,
        teacher_s: 0.0,
        train_s: 0.0,
        faults: None,
    };
    for (i, lane) in lanes.iter_mut().enumerate() {
        let t_gen = Instant::now();
        engine.select_adapter(i)?;
        let items = lane.task.train_batch(spec.seed, &format!("rollout/{}", lane.name), step, r.rollout_batch);
        let seed = derive_seed(spec.seed, &format!("sampling/{}", lane.name), step);
        let params = SamplingParams::rollout(r, seed).with_stop(lane.task.stop_tokens());
        let prompts =
            items.iter().map(|it| lane.task.tokenizer.encode_prompt(&it.prompt)).collect::<Result<Vec<_>, _>>()?;
        let samples = engine.generate(&prompts, r.samples_per_prompt, &params)?;
        out.gen_s += t_gen.elapsed().as_secs_f64();
        let t_reward = Instant::now();
        let scorer: &mut dyn BatchReward = match lane.reward.as_mut() {
            Some(r) => r,
            None => &mut *reward,
        };
        let mut sb = single_turn_batch(spec, &lane.task, scorer, (items, prompts, samples), step)?;
        sb.tag_adapter(&lane.name);
        out.reward_s += t_reward.elapsed().as_secs_f64();
        if sb.batch.is_empty() {
            return Err(RunError::new(
                crate::reward::E_REWARD,
                format!("step {step}, adapter `{}`: the reward `{}` dropped every sample", lane.name, reward.name()),
            )
            .with_help("the reward failed on every sample: fix it, or set `on_error = zero`"));
        }
        // The lane's own learning rate, on the run's schedule.
        let scale = lane.lr.map_or(1.0, |lr| if spec.train.lr > 0.0 { lr / spec.train.lr } else { 0.0 });
        let lrs: Vec<f64> = step_lrs(spec, step).into_iter().map(|x| x * scale).collect();
        let t_train = Instant::now();
        trainer.select_adapter(i)?;
        let ts = train_checked(trainer, &sb.batch, &lrs, r.temperature, step, last_ckpt)?;
        out.train_s += t_train.elapsed().as_secs_f64();
        let n = sb.rewards.len().max(1) as f64;
        let p = format!("lora/{}/", lane.name);
        out.cols.insert(format!("{p}reward_mean"), json!(sb.rewards.iter().map(|&x| x as f64).sum::<f64>() / n));
        out.cols.insert(format!("{p}response_len"), json!(sb.sampled_tokens as f64 / sb.responses.max(1) as f64));
        out.cols.insert(format!("{p}loss"), json!(ts.loss));
        out.cols.insert(format!("{p}grad_norm"), json!(ts.grad_norm));
        out.cols.insert(format!("{p}lr"), json!(lrs.first().copied().unwrap_or(0.0)));
        merge_into(&mut out, sb, &ts, k);
        if out.lrs.is_empty() {
            out.lrs = lrs;
        }
    }
    engine.select_adapter(0)?;
    trainer.select_adapter(0)?;
    Ok(out)
}

/// Adds one lane's batch and training stats (weight 1/k for the per-call means) to `out`.
fn merge_into(out: &mut StepOutcome, sb: StepBatch, t: &TrainStats, k: f64) {
    let o = &mut out.sb;
    let offset = o.groups.iter().max().map_or(0, |g| g + 1);
    o.batch.extend(sb.batch);
    o.rewards.extend(sb.rewards);
    o.groups.extend(sb.groups.iter().map(|g| g + offset));
    o.sampled_tokens += sb.sampled_tokens;
    o.responses += sb.responses;
    o.stopped += sb.stopped;
    o.shown.extend(sb.shown);
    for (key, v) in sb.metrics {
        match o.metrics.iter_mut().find(|(k2, _)| *k2 == key) {
            Some(m) => m.1 += v,
            None => o.metrics.push((key, v)),
        }
    }
    let ts = &mut out.ts;
    for (acc, x) in [
        (&mut ts.loss, t.loss),
        (&mut ts.grad_norm, t.grad_norm),
        (&mut ts.entropy, t.entropy),
        (&mut ts.clip_frac, t.clip_frac),
        (&mut ts.kl, t.kl),
        (&mut ts.logp_diff, t.logp_diff),
        (&mut ts.rollout_kl, t.rollout_kl),
        (&mut ts.tis_weight, t.tis_weight),
    ] {
        *acc += x / k;
    }
    if let Some(f) = t.mis_masked {
        *ts.mis_masked.get_or_insert(0.0) += f / k;
    }
    // Every lane makes the same passes: pass by pass, the lanes' mean (the largest log-ratio's max).
    ts.epochs.resize(t.epochs.len().max(ts.epochs.len()), Default::default());
    for (acc, e) in ts.epochs.iter_mut().zip(&t.epochs) {
        acc.clip_frac += e.clip_frac / k;
        acc.approx_kl += e.approx_kl / k;
        acc.approx_kl_k3 += e.approx_kl_k3 / k;
        acc.max_abs_log_ratio = acc.max_abs_log_ratio.max(e.max_abs_log_ratio);
    }
    ts.optimizer_steps += t.optimizer_steps;
    ts.tokens += t.tokens;
    ts.logprob_s += t.logprob_s;
    ts.forward_s += t.forward_s;
    ts.backward_s += t.backward_s;
    ts.optimizer_s += t.optimizer_s;
}

/// Every lane's held-out evaluation with its adapter (`lora/<name>/eval/*` into `row`); the run's
/// `eval/accuracy` and `eval/response_len` are their means.
pub(crate) fn evaluate_lanes(
    spec: &RunSpec,
    lanes: &[Lane],
    reward: &mut dyn BatchReward,
    engine: &mut dyn RolloutEngine,
    row: &mut Map<String, serde_json::Value>,
) -> Result<(f64, f64), RunError> {
    let (mut acc, mut len) = (0.0, 0.0);
    for (i, lane) in lanes.iter().enumerate() {
        engine.select_adapter(i)?;
        let (a, l) = evaluate(spec, &lane.task, reward, None, engine)?;
        row.insert(format!("lora/{}/eval/accuracy", lane.name), json!(a));
        row.insert(format!("lora/{}/eval/response_len", lane.name), json!(l));
        acc += a;
        len += l;
    }
    engine.select_adapter(0)?;
    let k = lanes.len().max(1) as f64;
    Ok((acc / k, len / k))
}
