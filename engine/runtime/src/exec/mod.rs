//! The synchronous executor: optional SFT warm-up, then per step generate -> reward -> train ->
//! sync weights, with evaluation, atomic checkpoints, exact resume and metrics.jsonl.
//!
//! Its parts, shared with the asynchronous executor (crate::async_exec): `open` (the output
//! directory, the task, a fresh run's opening and how a run ends), `step` (a step's learning
//! rates, training and its metrics), `sft` (the warm-up), `score` (rewards and held-out
//! evaluation), `checkpoint` (atomic writes, checkpoints and the final model) and `metrics`
//! (metrics.jsonl and TensorBoard).

use crate::backend::*;
use crate::env::rollout::EnvRunner;
use crate::reward::{BatchReward, RewardTally};
use crate::rng::derive_seed;
use crate::spec::{RunOptions, RunSpec, Summary};
use crate::tasks::{PromptRow, TaskSet, TokenId};
use crate::*;
use serde_json::{json, Map};
use std::time::Instant;

mod checkpoint;
mod lanes;
mod metrics;
mod open;
mod score;
mod sft;
mod step;
mod teacher;

pub use checkpoint::*;
pub use metrics::Metrics;
pub(crate) use open::*;
pub(crate) use score::*;
pub(crate) use sft::*;
pub use step::peak_rss_bytes;
pub(crate) use step::*;
pub(crate) use teacher::TeacherStage;

/// Runs `spec` on `backend`. Errors carry E05xx codes; nothing panics on bad input.
pub fn run_with(spec: &RunSpec, opts: &RunOptions, backend: &dyn Backend) -> Result<Summary, RunError> {
    let started = Instant::now();
    spec.validate()?;
    let task = build_task(spec)?;
    let mut lanes = lanes::lanes_of(spec)?;
    if !spec.schedule.is_sync() {
        return crate::async_exec::run(spec, opts, backend, task, started);
    }

    let mut outs = Outputs::open(spec, opts)?;
    backend.set_threads(opts.threads);
    let (mut engine, mut trainer) = backend.create(spec)?;
    let mut teacher = TeacherStage::for_run(spec, backend)?;
    let mut reward = crate::reward::spec::build_run_reward(spec)?;
    let mut eval_reward = crate::reward::spec::build_run_reward(spec)?;
    let env = EnvRunner::for_run(spec)?;
    let mut transport: Box<dyn WeightTransport> = Box::new(LocalHandoff);

    let start = match outs.resume_from.take() {
        Some((dir, st)) => {
            trainer.load(&dir)?;
            let w = transport.transfer(trainer.export_weights()?)?;
            engine.load_weights(&w)?;
            outs.progress.note(&format!("resumed from {} (step {})", dir.display(), st.step));
            Position::resumed(dir, &st)
        }
        None => start_fresh(
            spec,
            &task,
            trainer.as_mut(),
            transport.as_mut(),
            &mut outs,
            engine.as_mut(),
            |e, w| e.load_weights(&w),
            |e, row| match lanes.is_empty() {
                true => evaluate(spec, &task, eval_reward.as_mut(), env.as_ref(), e),
                false => lanes::evaluate_lanes(spec, &lanes, eval_reward.as_mut(), e, row),
            },
            Map::new(),
            |_| Ok(()),
        )?,
    };
    let Position { mut step, eval_start, mut eval_last, mut last_ckpt } = start;
    let Outputs { ckpt_root, metrics_path, mut metrics, mut progress, .. } = outs;
    let out = &opts.out_dir;

    let mut last_reward = None;
    let mut steps_this_run = 0u64;
    let mut stopped_early = false;
    while step < spec.steps {
        if let Some(n) = opts.stop_after {
            if steps_this_run >= n {
                stopped_early = true;
                break;
            }
        }
        check_wall_time(opts, started, step)?;
        step += 1;
        steps_this_run += 1;
        let t_step = Instant::now();
        let r = &spec.rollout;
        let outcome = if !lanes.is_empty() {
            // Multi-LoRA: every lane generates, is scored and trains with its own adapter.
            lanes::step(spec, &mut lanes, engine.as_mut(), trainer.as_mut(), reward.as_mut(), step, &last_ckpt)?
        } else {
            let items = task.train_batch(spec.seed, "rollout", step, r.rollout_batch);
            let params =
                SamplingParams::rollout(r, derive_seed(spec.seed, "sampling", step)).with_stop(task.stop_tokens());
            let t_gen = Instant::now();
            let (mut sb, gen_s, t_reward) = match &env {
                Some(env) => {
                    // Episodes: generation and the environment interleave turn by turn.
                    let (groups, results) = env.play(
                        &task,
                        engine.as_mut(),
                        &items,
                        r.samples_per_prompt,
                        &params,
                        &format!("step{step}"),
                    )?;
                    (env.batch(&groups, &results), t_gen.elapsed().as_secs_f64(), Instant::now())
                }
                None => {
                    let prompts = items
                        .iter()
                        .map(|it| task.tokenizer.encode_prompt(&it.prompt))
                        .collect::<Result<Vec<_>, _>>()?;
                    let samples = engine.generate(&prompts, r.samples_per_prompt, &params)?;
                    let gen_s = t_gen.elapsed().as_secs_f64();
                    let t_reward = Instant::now();
                    let sb = single_turn_batch(spec, &task, reward.as_mut(), &items, &prompts, &samples, step)?;
                    (sb, gen_s, t_reward)
                }
            };
            if sb.batch.is_empty() {
                let e = match &env {
                    Some(_) => crate::env::rollout::all_episodes_faulted(&format!("step {step}")),
                    None => RunError::new(
                        crate::reward::E_REWARD,
                        format!("step {step}: the reward `{}` dropped every sample of the batch", reward.name()),
                    )
                    .with_help("the reward failed on every sample: fix it, or set `on_error = zero`"),
                };
                return Err(e);
            }
            let lrs = step_lrs(spec, step);
            let reward_s = t_reward.elapsed().as_secs_f64();
            let teacher_s = match teacher.as_mut() {
                Some(t) => t.score(&mut sb.batch)?,
                None => 0.0,
            };
            let t_train = Instant::now();
            let mut ts = train_checked(trainer.as_mut(), &sb.batch, &lrs, r.temperature, step, &last_ckpt)?;
            let train_s = t_train.elapsed().as_secs_f64();
            if let Some(t) = &teacher {
                t.note(&mut ts);
            }
            StepOutcome { sb, ts, lrs, cols: Map::new(), gen_s, reward_s, teacher_s, train_s }
        };
        let StepOutcome { sb, ts, lrs, cols: lane_cols, gen_s, reward_s, teacher_s, train_s } = outcome;
        let StepBatch { batch, rewards, groups, sampled_tokens: gen_tokens, responses, stopped, metrics: extra } = sb;
        let t_sync = Instant::now();
        let w = transport.transfer(trainer.export_weights()?)?;
        engine.load_weights(&w)?;
        let sync_s = t_sync.elapsed().as_secs_f64();

        let n = rewards.len().max(1) as f64;
        let n_samples = responses.max(1) as f64;
        let reward_mean = rewards.iter().map(|&x| x as f64).sum::<f64>() / n;
        let flat_groups = count_flat_groups(&rewards, &groups);
        let mut row = Map::new();
        row.insert("step".into(), json!(step));
        row.insert("weight_version".into(), json!(engine.weight_version()));
        row.insert("rollout/reward_mean".into(), json!(reward_mean));
        row.insert("rollout/solved_frac".into(), json!(rewards.iter().filter(|&&x| x >= 1.0).count() as f64 / n));
        row.insert("rollout/response_len".into(), json!(gen_tokens as f64 / n_samples));
        row.insert("rollout/stop_frac".into(), json!(stopped as f64 / n_samples));
        row.insert(
            "rollout/flat_group_frac".into(),
            json!(flat_groups as f64 / (r.rollout_batch * lanes.len().max(1)) as f64),
        );
        for (k, v) in &extra {
            row.insert(k.clone(), json!(v));
        }
        insert_train_stats(&mut row, &ts, &lrs);
        row.extend(lane_cols);
        let do_eval = step == spec.steps || (spec.eval.every > 0 && step % spec.eval.every == 0);
        if do_eval {
            let t0 = Instant::now();
            let acc = match lanes.is_empty() {
                true => evaluate(spec, &task, eval_reward.as_mut(), env.as_ref(), engine.as_mut())?,
                false => lanes::evaluate_lanes(spec, &lanes, eval_reward.as_mut(), engine.as_mut(), &mut row)?,
            };
            row.insert("eval/accuracy".into(), json!(acc.0));
            row.insert("eval/response_len".into(), json!(acc.1));
            row.insert("perf/eval_s".into(), json!(t0.elapsed().as_secs_f64()));
            eval_last = Some(acc.0);
            progress.eval(step, acc.0);
        }
        let trained: usize = batch.iter().map(|t| t.prompt.len() + t.response.len()).sum();
        let times = StepTimes { gen_s, reward_s, teacher_s, train_s, sync_s, step_s: t_step.elapsed().as_secs_f64() };
        let sync_bytes = trainer.last_sync_bytes().map_or(w.bytes(), |b| b as usize);
        insert_perf(&mut row, &ts, &times, gen_tokens as u64, trained, sync_bytes);
        metrics.write(&row)?;
        last_reward = Some(reward_mean);
        progress.step(step, reward_mean, gen_tokens as f64 / gen_s.max(1e-9), trained as f64 / train_s.max(1e-9));

        let ck = spec.checkpoint.every;
        if (ck > 0 && step % ck == 0) || step == spec.steps {
            last_ckpt =
                Some(save_checkpoint(&ckpt_root, spec, step, eval_start, eval_last, trainer.as_ref(), |_| Ok(()))?);
        }
    }
    if !stopped_early {
        save_final_model(out, trainer.as_ref(), &task)?;
    }
    let at = Position { step, eval_start, eval_last, last_ckpt };
    Ok(summary(at, last_reward, stopped_early, metrics_path, started, &mut progress))
}

/// A step's rollout and training, as the metrics row reads them: the batch, the training
/// stats and learning rates, extra columns (multi-LoRA's per-adapter ones) and phase seconds.
pub(crate) struct StepOutcome {
    pub(crate) sb: StepBatch,
    pub(crate) ts: TrainStats,
    pub(crate) lrs: Vec<f64>,
    pub(crate) cols: Map<String, serde_json::Value>,
    pub(crate) gen_s: f64,
    pub(crate) reward_s: f64,
    /// The teacher stage's scoring (on-policy distillation); 0 without one.
    pub(crate) teacher_s: f64,
    pub(crate) train_s: f64,
}

/// What one RL step's rollout gives the trainer and the metrics: single responses or episodes.
#[derive(Default)]
pub struct StepBatch {
    pub batch: Vec<Trajectory>,
    /// One per trained response (episode); a dropped one leaves its group.
    pub rewards: Vec<f32>,
    pub groups: Vec<usize>,
    /// Sampled tokens, responses (episodes), and those that ended on a stop token.
    pub sampled_tokens: usize,
    pub responses: usize,
    pub stopped: usize,
    /// Extra columns of the step's metrics row (reward counts, episode ends, ...).
    pub metrics: Vec<(String, f64)>,
}

/// A step of single responses: scored by the run's reward (sample ids `step12/p3/s1`), dropped
/// samples left out of their group, group-relative advantages.
fn single_turn_batch(
    spec: &RunSpec,
    task: &TaskSet,
    reward: &mut dyn BatchReward,
    items: &[PromptRow],
    prompts: &[Vec<TokenId>],
    samples: &[Sample],
    step: u64,
) -> Result<StepBatch, RunError> {
    let mut nth = vec![0usize; items.len()];
    let scored: Vec<Scored> = samples
        .iter()
        .map(|s| {
            let j = nth[s.prompt_index];
            nth[s.prompt_index] += 1;
            (format!("step{step}/p{}/s{j}", s.prompt_index), &items[s.prompt_index], &s.response[..], s.finish)
        })
        .collect();
    let outcomes = score_responses(reward, task, &scored)?;
    // Counts of this step's samples (a resumed run writes the same rows).
    let mut tally = RewardTally::default();
    tally.add(&outcomes);
    let kept: Vec<(&Sample, f32)> =
        samples.iter().zip(&outcomes).filter_map(|(s, o)| o.reward().map(|r| (s, r))).collect();
    let rewards: Vec<f32> = kept.iter().map(|k| k.1).collect();
    let groups: Vec<usize> = kept.iter().map(|k| k.0.prompt_index).collect();
    let adv = grpo_advantages(&rewards, &groups, spec.train.std_norm);
    let batch = kept
        .iter()
        .zip(&adv)
        .map(|(&(s, reward), &advantage)| Trajectory {
            prompt: prompts[s.prompt_index].clone(),
            response: s.response.clone(),
            rollout_logprobs: s.logprobs.clone(),
            loss_mask: vec![1.0; s.response.len()],
            reward,
            advantage,
            group: s.prompt_index,
            weight_version: s.weight_version,
            routing: s.routing.clone(),
            teacher_logprobs: Vec::new(),
        })
        .collect();
    Ok(StepBatch {
        batch,
        rewards,
        groups,
        sampled_tokens: samples.iter().map(|s| s.response.len()).sum(),
        responses: samples.len(),
        stopped: samples.iter().filter(|s| s.finish == FinishReason::Stop).count(),
        metrics: tally.metrics().iter().map(|(k, v)| (k.to_string(), *v)).collect(),
    })
}
