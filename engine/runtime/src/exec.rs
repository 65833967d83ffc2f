//! The synchronous executor: optional SFT warm-up, then per step generate -> reward -> train ->
//! sync weights, with evaluation, atomic checkpoints, exact resume and metrics.jsonl.

use crate::backend::*;
use crate::env::rollout::EnvRunner;
use crate::progress::Progress;
use crate::reward::{BatchReward, RewardOutcome, RewardTally};
use crate::rng::derive_seed;
use crate::spec::{RunOptions, RunSpec, Summary};
use crate::tasks::{PromptRow, TaskSet, TokenId};
use crate::*;
use serde_json::{json, Map, Value};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

pub(crate) const STATE_FILE: &str = "state.json";

/// What a checkpoint records besides the backend's own files.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct CkptState {
    pub(crate) step: u64,
    /// Spec this checkpoint belongs to: resume refuses a different spec.
    pub(crate) spec: RunSpec,
    pub(crate) eval_start: Option<f64>,
    pub(crate) eval_last: Option<f64>,
}

/// Runs `spec` on `backend`. Errors carry E05xx codes; nothing panics on bad input.
pub fn run_with(spec: &RunSpec, opts: &RunOptions, backend: &dyn Backend) -> Result<Summary, RunError> {
    let started = Instant::now();
    spec.validate()?;
    let task = build_task(spec)?;
    if !spec.schedule.is_sync() {
        return crate::async_exec::run(spec, opts, backend, task, started);
    }

    let mut outs = Outputs::open(spec, opts)?;
    backend.set_threads(opts.threads);
    let (mut engine, mut trainer) = backend.create(spec)?;
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
            |e| evaluate(spec, &task, eval_reward.as_mut(), env.as_ref(), e),
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
        let items = task.train_batch(spec.seed, "rollout", step, r.rollout_batch);
        let params = SamplingParams::rollout(r, derive_seed(spec.seed, "sampling", step)).with_stop(task.stop_tokens());
        let t_gen = Instant::now();
        let (sb, gen_s, t_reward) = match &env {
            Some(env) => {
                // Episodes: generation and the environment interleave turn by turn.
                let (groups, results) =
                    env.play(&task, engine.as_mut(), &items, r.samples_per_prompt, &params, &format!("step{step}"))?;
                (env.batch(&groups, &results), t_gen.elapsed().as_secs_f64(), Instant::now())
            }
            None => {
                let prompts =
                    items.iter().map(|it| task.tokenizer.encode_prompt(&it.prompt)).collect::<Result<Vec<_>, _>>()?;
                let samples = engine.generate(&prompts, r.samples_per_prompt, &params)?;
                let gen_s = t_gen.elapsed().as_secs_f64();
                let t_reward = Instant::now();
                let sb = single_turn_batch(spec, &task, reward.as_mut(), &items, &prompts, &samples, step)?;
                (sb, gen_s, t_reward)
            }
        };
        if sb.batch.is_empty() {
            let e = match &env {
                Some(_) => RunError::new(
                    E_TIMEOUT,
                    format!("step {step}: every episode ended by an environment fault and was dropped"),
                )
                .with_help(
                    "see rollout/episode_end/* in metrics.jsonl; or train on faulted episodes (on_env_error = score)",
                ),
                None => RunError::new(
                    crate::reward::E_REWARD,
                    format!("step {step}: the reward `{}` dropped every sample of the batch", reward.name()),
                )
                .with_help("the reward failed on every sample: fix it, or set `on_error = zero`"),
            };
            return Err(e);
        }
        let StepBatch { batch, rewards, groups, sampled_tokens: gen_tokens, responses, stopped, metrics: extra } = sb;
        let lrs = step_lrs(spec, step);
        let reward_s = t_reward.elapsed().as_secs_f64();
        let t_train = Instant::now();
        let ts = train_checked(trainer.as_mut(), &batch, &lrs, r.temperature, step, &last_ckpt)?;
        let train_s = t_train.elapsed().as_secs_f64();
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
        row.insert("rollout/flat_group_frac".into(), json!(flat_groups as f64 / r.rollout_batch as f64));
        for (k, v) in &extra {
            row.insert(k.clone(), json!(v));
        }
        insert_train_stats(&mut row, &ts, &lrs);
        let do_eval = step == spec.steps || (spec.eval.every > 0 && step % spec.eval.every == 0);
        if do_eval {
            let t0 = Instant::now();
            let acc = evaluate(spec, &task, eval_reward.as_mut(), env.as_ref(), engine.as_mut())?;
            row.insert("eval/accuracy".into(), json!(acc.0));
            row.insert("eval/response_len".into(), json!(acc.1));
            row.insert("perf/eval_s".into(), json!(t0.elapsed().as_secs_f64()));
            eval_last = Some(acc.0);
            progress.eval(step, acc.0);
        }
        let trained: usize = batch.iter().map(|t| t.prompt.len() + t.response.len()).sum();
        let times = StepTimes { gen_s, reward_s, train_s, sync_s, step_s: t_step.elapsed().as_secs_f64() };
        insert_perf(&mut row, &ts, &times, gen_tokens as u64, trained, w.bytes());
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

/// What both executors write as a run goes, opened before the backend starts.
pub(crate) struct Outputs {
    pub(crate) ckpt_root: PathBuf,
    pub(crate) metrics_path: PathBuf,
    pub(crate) metrics: Metrics,
    pub(crate) progress: Progress,
    /// The checkpoint a resume continues from (None: a fresh run).
    pub(crate) resume_from: Option<(PathBuf, CkptState)>,
}

impl Outputs {
    /// The output directory (refused when it holds another run), the checkpoint to resume from
    /// (refused when it belongs to another spec), metrics.jsonl cut back to it, and progress.
    pub(crate) fn open(spec: &RunSpec, opts: &RunOptions) -> Result<Outputs, RunError> {
        let out = &opts.out_dir;
        prepare_out_dir(spec, opts)?;
        let ckpt_root = out.join("checkpoints");
        let metrics_path = out.join("metrics.jsonl");
        let resume_from = if opts.resume { latest_checkpoint(&ckpt_root)? } else { None };
        if let Some((dir, st)) = &resume_from {
            if st.spec != *spec {
                return Err(RunError::new(
                    E_OUT_DIR,
                    format!("{} holds a checkpoint of a different run spec; resume needs the same spec", dir.display()),
                ));
            }
        }
        let metrics = Metrics::open(&metrics_path, resume_from.as_ref().map(|c| c.1.step))?;
        let progress = Progress::new(opts.progress, spec.steps);
        Ok(Outputs { ckpt_root, metrics_path, metrics, progress, resume_from })
    }
}

/// Where a run stands: where its loop starts, and where it ended.
pub(crate) struct Position {
    /// Steps done.
    pub(crate) step: u64,
    pub(crate) eval_start: Option<f64>,
    pub(crate) eval_last: Option<f64>,
    pub(crate) last_ckpt: Option<PathBuf>,
}

impl Position {
    pub(crate) fn resumed(dir: PathBuf, st: &CkptState) -> Position {
        Position { step: st.step, eval_start: st.eval_start, eval_last: st.eval_last, last_ckpt: Some(dir) }
    }
}

/// How a run ends, the same for both executors: the progress line, and the summary.
pub(crate) fn summary(
    at: Position,
    last_reward: Option<f64>,
    stopped_early: bool,
    metrics_path: PathBuf,
    started: Instant,
    progress: &mut Progress,
) -> Summary {
    progress.finish(at.eval_start, at.eval_last);
    Summary {
        steps_done: at.step,
        eval_start: at.eval_start,
        eval_end: at.eval_last,
        last_reward,
        checkpoint: at.last_ckpt,
        metrics_path,
        wall_seconds: started.elapsed().as_secs_f64(),
        stopped_early,
    }
}

/// A fresh run's opening, the same for both executors: the SFT warm-up, a fresh optimizer, the
/// frozen reference (with a KL term), the first weights into the engine (`load`), the step-0
/// evaluation (`evaluate`) as its own metrics row (`row` holds the executor's extra columns), and
/// the step-0 checkpoint with the executor's own files (`ckpt_files`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn start_fresh<E: ?Sized>(
    spec: &RunSpec,
    task: &TaskSet,
    trainer: &mut dyn Trainer,
    transport: &mut dyn WeightTransport,
    outs: &mut Outputs,
    engine: &mut E,
    load: impl FnOnce(&mut E, WeightSnapshot) -> Result<(), RunError>,
    evaluate: impl FnOnce(&mut E) -> Result<(f64, f64), RunError>,
    mut row: Map<String, Value>,
    ckpt_files: impl FnOnce(&Path) -> Result<(), RunError>,
) -> Result<Position, RunError> {
    if let Some(sft) = &spec.sft {
        run_sft(spec, sft, task, trainer, &mut outs.metrics, &mut outs.progress)?;
    }
    trainer.reset_optimizer();
    if spec.train.kl_coef > 0.0 {
        trainer.freeze_reference()?;
    }
    load(engine, transport.transfer(trainer.export_weights()?)?)?;
    let t0 = Instant::now();
    let acc = evaluate(engine)?;
    row.insert("step".into(), json!(0));
    row.insert("eval/accuracy".into(), json!(acc.0));
    row.insert("eval/response_len".into(), json!(acc.1));
    row.insert("perf/eval_s".into(), json!(t0.elapsed().as_secs_f64()));
    outs.metrics.write(&row)?;
    outs.progress.eval(0, acc.0);
    let last_ckpt = if spec.checkpoint.every > 0 {
        Some(save_checkpoint(&outs.ckpt_root, spec, 0, Some(acc.0), Some(acc.0), trainer, ckpt_files)?)
    } else {
        None
    };
    Ok(Position { step: 0, eval_start: Some(acc.0), eval_last: Some(acc.0), last_ckpt })
}

/// Refuses to start step `step + 1` after the run's wall-time limit (`--max-wall`).
pub(crate) fn check_wall_time(opts: &RunOptions, started: Instant, step: u64) -> Result<(), RunError> {
    match opts.max_wall {
        Some(limit) if started.elapsed() > limit => Err(RunError::new(
            E_TIMEOUT,
            format!("the run's wall-time limit ({:.0} s) expired after step {step}", limit.as_secs_f64()),
        )
        .with_help("resume with --resume to continue from the last checkpoint")),
        _ => Ok(()),
    }
}

/// The learning rate of each optimizer step of RL step `step` (1-based).
pub(crate) fn step_lrs(spec: &RunSpec, step: u64) -> Vec<f64> {
    let per_step = spec.optimizer_steps_per_rl_step() as u64;
    let total = per_step * spec.steps;
    (0..per_step).map(|j| lr_at(&spec.train, (step - 1) * per_step + j, total)).collect()
}

/// One RL training step; a NaN/infinite loss or gradient stops the run (E0505) naming the last
/// good checkpoint.
pub(crate) fn train_checked(
    trainer: &mut dyn Trainer,
    batch: &[Trajectory],
    lrs: &[f64],
    temperature: f64,
    step: u64,
    last_ckpt: &Option<PathBuf>,
) -> Result<TrainStats, RunError> {
    let ts = trainer.train_rl(batch, lrs, temperature).map_err(|e| {
        if e.code == E_NONFINITE {
            non_finite(step, last_ckpt)
        } else {
            e
        }
    })?;
    if !ts.loss.is_finite() || !ts.grad_norm.is_finite() {
        return Err(non_finite(step, last_ckpt));
    }
    Ok(ts)
}

/// The `train/*` columns of a step's metrics row.
pub(crate) fn insert_train_stats(row: &mut Map<String, Value>, ts: &TrainStats, lrs: &[f64]) {
    row.insert("train/loss".into(), json!(ts.loss));
    row.insert("train/grad_norm".into(), json!(ts.grad_norm));
    row.insert("train/entropy".into(), json!(ts.entropy));
    row.insert("train/clip_frac".into(), json!(ts.clip_frac));
    row.insert("train/kl".into(), json!(ts.kl));
    row.insert("train/logp_diff".into(), json!(ts.logp_diff));
    row.insert("train/tis_weight".into(), json!(ts.tis_weight));
    row.insert("train/lr".into(), json!(lrs.last().copied().unwrap_or(0.0)));
    row.insert("train/tokens".into(), json!(ts.tokens));
}

/// Seconds a step spent in each phase.
pub(crate) struct StepTimes {
    /// Generation (async: seconds the engine was busy since the last step).
    pub(crate) gen_s: f64,
    pub(crate) reward_s: f64,
    pub(crate) train_s: f64,
    pub(crate) sync_s: f64,
    pub(crate) step_s: f64,
}

/// The `perf/*` columns of a step's metrics row: where the step's time goes (bench/peers profiles
/// it): generation, scoring and advantages, training (split by the backend into log-prob
/// recompute, forward, backward, optimizer), and the token counts behind the rates. step_s minus
/// these is orchestration (and eval).
pub(crate) fn insert_perf(
    row: &mut Map<String, Value>,
    ts: &TrainStats,
    t: &StepTimes,
    gen_tokens: u64,
    trained: usize,
    sync_bytes: usize,
) {
    row.insert("perf/gen_tokens_per_s".into(), json!(gen_tokens as f64 / t.gen_s.max(1e-9)));
    row.insert("perf/train_tokens_per_s".into(), json!(trained as f64 / t.train_s.max(1e-9)));
    row.insert("perf/sync_s".into(), json!(t.sync_s));
    row.insert("perf/sync_bytes".into(), json!(sync_bytes));
    row.insert("perf/gen_s".into(), json!(t.gen_s));
    row.insert("perf/reward_s".into(), json!(t.reward_s));
    row.insert("perf/train_s".into(), json!(t.train_s));
    row.insert("perf/logprob_s".into(), json!(ts.logprob_s));
    row.insert("perf/forward_s".into(), json!(ts.forward_s));
    row.insert("perf/backward_s".into(), json!(ts.backward_s));
    row.insert("perf/optimizer_s".into(), json!(ts.optimizer_s));
    row.insert("perf/gen_tokens".into(), json!(gen_tokens));
    row.insert("perf/trained_tokens".into(), json!(trained));
    row.insert("perf/step_s".into(), json!(t.step_s));
}

/// The final model, Hugging Face style (model.safetensors + config.json + tokenizer), written
/// atomically into OUT/model. Both executors end a finished run with it.
pub(crate) fn save_final_model(out: &Path, trainer: &dyn Trainer, task: &TaskSet) -> Result<(), RunError> {
    write_dir_atomically(&out.join("model"), |tmp| {
        trainer.save_model(tmp)?;
        task.tokenizer.save(tmp)
    })
}

/// The task of a run, with the checks that need it (vocabulary, lengths).
pub(crate) fn build_task(spec: &RunSpec) -> Result<TaskSet, RunError> {
    let hf = match &spec.hf {
        Some(h) => Some(crate::tokenize::HfTokenizer::load(&h.path)?),
        None => None,
    };
    let extra = spec.env.as_ref().map(|e| e.alphabet()).unwrap_or("");
    let task = TaskSet::build_for(&spec.task, hf, extra)?;
    for w in &task.warnings {
        eprintln!("warning: {w}");
    }
    let vocab = task.tokenizer.vocab_size();
    if spec.model.vocab_size < vocab {
        return Err(RunError::new(
            E_VOCAB,
            format!("model vocab_size {} does not cover the task tokenizer's {} tokens", spec.model.vocab_size, vocab),
        )
        .with_help(format!("set model.vocab_size to at least {vocab}")));
    }
    let (max_prompt, max_answer) = task.max_token_lens();
    if let Some(limit) = spec.rollout.max_prompt_tokens.filter(|l| max_prompt > *l) {
        return Err(RunError::new(
            E_TOO_LONG,
            format!(
                "the longest prompt is {max_prompt} tokens (with BOS), over the rollout's max_prompt_tokens {limit}"
            ),
        )
        .with_help(format!("raise `max_prompt_tokens` to {max_prompt}.tokens, or shorten the prompts")));
    }
    let need = max_prompt + spec.rollout.max_new_tokens.max(max_answer);
    if need > spec.model.max_len {
        return Err(RunError::new(
            E_TOO_LONG,
            format!(
                "longest prompt ({max_prompt} tokens) plus max_new_tokens/answer ({}) is {need}, \
                 over model.max_len {}",
                spec.rollout.max_new_tokens.max(max_answer),
                spec.model.max_len
            ),
        ));
    }
    if spec.rollout.max_new_tokens < max_answer {
        eprintln!(
            "warning: rollout.max_new_tokens {} is shorter than the longest answer ({max_answer} \
             tokens with EOS): some problems cannot be solved",
            spec.rollout.max_new_tokens
        );
    }

    Ok(task)
}

pub(crate) fn non_finite(step: u64, last: &Option<PathBuf>) -> RunError {
    let kept = match last {
        Some(d) => format!("the last good checkpoint is {}", d.display()),
        None => "no checkpoint was written before it".to_string(),
    };
    RunError::new(E_NONFINITE, format!("loss or gradient became NaN/infinite at step {step}; the run stopped ({kept})"))
        .with_help("lower train.lr, set train.grad_clip, or set train.tis_cap")
}

pub(crate) fn count_flat_groups(rewards: &[f32], groups: &[usize]) -> usize {
    let mut first: std::collections::BTreeMap<usize, (f32, bool)> = Default::default();
    for (&r, &g) in rewards.iter().zip(groups) {
        let e = first.entry(g).or_insert((r, true));
        if e.0 != r {
            e.1 = false;
        }
    }
    first.values().filter(|v| v.1).count()
}

pub(crate) fn run_sft(
    spec: &RunSpec,
    sft: &crate::spec::SftSpec,
    task: &TaskSet,
    trainer: &mut dyn Trainer,
    metrics: &mut Metrics,
    progress: &mut Progress,
) -> Result<(), RunError> {
    progress.note(&format!("SFT warm-up: {} steps", sft.steps));
    // With an environment, the examples are the turns of its gold episodes (env::demo).
    let demos = match &spec.env {
        Some(e) => Some((e.env.build()?, e.limits(spec.model.max_len)?)),
        None => None,
    };
    for k in 0..sft.steps {
        let items = task.train_batch(spec.seed, "sft", k, sft.batch);
        let batch = match &demos {
            Some((env, limits)) => {
                let codec = crate::session::ChatCodec::new(&task.tokenizer, None).map_err(|e| {
                    RunError::new(crate::E_SPEC, format!("the tokenizer cannot frame observations: {e}"))
                })?;
                let tasks: Vec<_> = crate::env::rollout::tasks_of(&items, 1, derive_seed(spec.seed, "sft", k), "sft")
                    .into_iter()
                    .map(|(_, t)| t)
                    .collect();
                crate::env::demo::demonstration_pairs(
                    env.as_ref(),
                    &tasks,
                    &codec,
                    limits.tool_format,
                    limits.max_turns,
                    limits.max_context,
                    limits.turn_timeout,
                )?
            }
            None => items
                .iter()
                .map(|it| {
                    Ok((task.tokenizer.encode_prompt(&it.prompt)?, task.tokenizer.encode_answer(&it.label_text())?))
                })
                .collect::<Result<Vec<_>, RunError>>()?,
        };
        let lr = schedule(sft.lr, sft.warmup_steps, crate::spec::Decay::None, 0.0, k, sft.steps);
        let st = trainer.train_sft(&batch, lr)?;
        if !st.loss.is_finite() {
            return Err(RunError::new(E_NONFINITE, format!("SFT loss became NaN/infinite at SFT step {}", k + 1))
                .with_help("lower sft.lr"));
        }
        if (k + 1) % 10 == 0 || k + 1 == sft.steps {
            let mut row = Map::new();
            row.insert("step".into(), json!(0));
            row.insert("sft/step".into(), json!(k + 1));
            row.insert("sft/loss".into(), json!(st.loss));
            row.insert("sft/grad_norm".into(), json!(st.grad_norm));
            metrics.write(&row)?;
            progress.sft(k + 1, sft.steps, st.loss);
        }
    }
    Ok(())
}

/// Held-out success and mean sampled tokens on the first `eval.prompts` test items: greedy
/// responses scored by the run's reward, or, in a run with an environment, one greedy episode per
/// item. Every executor and evaluation mode measures through here.
pub(crate) fn evaluate(
    spec: &RunSpec,
    task: &TaskSet,
    reward: &mut dyn BatchReward,
    env: Option<&EnvRunner>,
    engine: &mut dyn RolloutEngine,
) -> Result<(f64, f64), RunError> {
    if let Some(env) = env {
        return env.evaluate(task, engine, eval_rows(spec, task), spec.rollout.max_new_tokens);
    }
    let items: Vec<&PromptRow> = eval_rows(spec, task).iter().collect();
    let prompts = items.iter().map(|it| task.tokenizer.encode_prompt(&it.prompt)).collect::<Result<Vec<_>, _>>()?;
    let params = SamplingParams::greedy(spec.rollout.max_new_tokens).with_stop(task.stop_tokens());
    let samples = engine.generate(&prompts, 1, &params)?;
    let scored: Vec<Scored> = samples
        .iter()
        .map(|s| (format!("eval/p{}", s.prompt_index), items[s.prompt_index], &s.response[..], s.finish))
        .collect();
    let outcomes = score_responses(reward, task, &scored)?;
    let len: usize = samples.iter().map(|s| s.response.len()).sum();
    let n = samples.len().max(1) as f64;
    Ok((eval_score(&outcomes), len as f64 / n))
}

/// What one RL step's rollout gives the trainer and the metrics: single responses or episodes.
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

/// The test rows an evaluation plays (the first `eval.prompts`).
fn eval_rows<'t>(spec: &RunSpec, task: &'t TaskSet) -> &'t [PromptRow] {
    &task.test[..spec.eval.prompts.max(1).min(task.test.len())]
}

/// Held-out score of greedy responses: the fraction the reward scores 1 (exact match: accuracy);
/// a dropped sample counts as 0 here, so a failing reward never raises the score.
pub(crate) fn eval_score(outcomes: &[RewardOutcome]) -> f64 {
    let full = outcomes.iter().filter(|o| o.reward().is_some_and(|r| r >= 1.0)).count();
    full as f64 / outcomes.len().max(1) as f64
}

/// A response to score: its sample id (what a failing reward's message names, e.g.
/// `step12/p3/s1`), its prompt row, its ids and how it ended.
pub(crate) type Scored<'a> = (String, &'a PromptRow, &'a [TokenId], FinishReason);

/// Scores responses with `reward`, in order.
pub(crate) fn score_responses(
    reward: &mut dyn BatchReward,
    task: &TaskSet,
    responses: &[Scored],
) -> Result<Vec<RewardOutcome>, RunError> {
    let inputs: Vec<_> = responses
        .iter()
        .map(|(id, row, ids, finish)| row.reward_input(id.clone(), task.tokenizer.decode(ids), *finish))
        .collect();
    let out = reward.score_batch(&inputs)?;
    if out.len() != inputs.len() {
        return Err(RunError::new(
            crate::reward::E_REWARD,
            format!("reward `{}` returned {} results for {} samples", reward.name(), out.len(), inputs.len()),
        ));
    }
    Ok(out)
}

pub(crate) fn prepare_out_dir(spec: &RunSpec, opts: &RunOptions) -> Result<(), RunError> {
    let out = &opts.out_dir;
    let spec_path = out.join("spec.json");
    if out.exists() {
        let has_run = spec_path.exists() || out.join("metrics.jsonl").exists();
        if has_run && !opts.resume {
            return Err(RunError::new(E_OUT_DIR, format!("{} already holds a run", out.display()))
                .with_help("pass --resume to continue it, or choose another output directory"));
        }
        if has_run && spec_path.exists() {
            let old =
                fs::read_to_string(&spec_path).map_err(|e| RunError::io(E_OUT_DIR, "cannot read", &spec_path, e))?;
            let same = serde_json::from_str::<RunSpec>(&old).map(|s| s == *spec).unwrap_or(false);
            if !same {
                return Err(RunError::new(
                    E_OUT_DIR,
                    format!("{} holds a run of a different spec; resume needs the same spec", out.display()),
                ));
            }
        }
    }
    fs::create_dir_all(out).map_err(|e| RunError::io(E_OUT_DIR, "cannot create", out, e))?;
    write_json(&spec_path, spec)
}

/// Writes JSON atomically (temp file, fsync, rename).
pub fn write_json<T: serde::Serialize>(path: &Path, v: &T) -> Result<(), RunError> {
    let text =
        serde_json::to_string_pretty(v).map_err(|e| RunError::new(E_CHECKPOINT, format!("cannot serialise: {e}")))?;
    write_atomically(path, text.as_bytes())
}

pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), RunError> {
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    let res = (|| {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, path)
    })();
    res.map_err(|e| {
        let _ = fs::remove_file(&tmp);
        RunError::io(E_CHECKPOINT, "cannot write", path, e)
    })
}

/// Fills a fresh temp directory with `fill`, then renames it over `dir` (replacing an older one).
pub(crate) fn write_dir_atomically(
    dir: &Path,
    fill: impl FnOnce(&Path) -> Result<(), RunError>,
) -> Result<(), RunError> {
    let name = dir.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_else(|| "dir".into());
    let parent = dir.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(parent).map_err(|e| RunError::io(E_CHECKPOINT, "cannot create", parent, e))?;
    let tmp = parent.join(format!(".{name}.tmp-{}", std::process::id()));
    let _ = fs::remove_dir_all(&tmp);
    fs::create_dir_all(&tmp).map_err(|e| RunError::io(E_CHECKPOINT, "cannot create", &tmp, e))?;
    if let Err(e) = fill(&tmp) {
        let _ = fs::remove_dir_all(&tmp);
        return Err(e);
    }
    // Directory renames cannot replace a non-empty directory: move the old one aside first.
    let old = parent.join(format!(".{name}.old-{}", std::process::id()));
    if dir.exists() {
        fs::rename(dir, &old).map_err(|e| RunError::io(E_CHECKPOINT, "cannot replace", dir, e))?;
    }
    fs::rename(&tmp, dir).map_err(|e| RunError::io(E_CHECKPOINT, "cannot rename into", dir, e))?;
    let _ = fs::remove_dir_all(&old);
    if let Ok(d) = fs::File::open(parent) {
        let _ = d.sync_all();
    }
    Ok(())
}

pub(crate) fn ckpt_name(step: u64) -> String {
    format!("step-{step:08}")
}

/// A checkpoint: the trainer's files, the executor's own (`extra` fills the same temp directory, so
/// they appear atomically with the rest) and state.json; only the newest `checkpoint.keep` stay.
pub(crate) fn save_checkpoint(
    root: &Path,
    spec: &RunSpec,
    step: u64,
    eval_start: Option<f64>,
    eval_last: Option<f64>,
    trainer: &dyn Trainer,
    extra: impl FnOnce(&Path) -> Result<(), RunError>,
) -> Result<PathBuf, RunError> {
    let dir = root.join(ckpt_name(step));
    write_dir_atomically(&dir, |tmp| {
        trainer.save(tmp)?;
        extra(tmp)?;
        // Written last: a directory with state.json is complete (the rename makes it so anyway).
        write_json(&tmp.join(STATE_FILE), &CkptState { step, spec: spec.clone(), eval_start, eval_last })
    })?;
    // Keep the newest `keep`.
    let mut all = list_checkpoints(root)?;
    all.sort();
    let keep = spec.checkpoint.keep.max(1);
    if all.len() > keep {
        for (_, d) in &all[..all.len() - keep] {
            let _ = fs::remove_dir_all(d);
        }
    }
    Ok(dir)
}

fn list_checkpoints(root: &Path) -> Result<Vec<(u64, PathBuf)>, RunError> {
    let mut v = Vec::new();
    let rd = match fs::read_dir(root) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(v),
        Err(e) => return Err(RunError::io(E_CHECKPOINT, "cannot list", root, e)),
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if let Some(n) = name.strip_prefix("step-").and_then(|s| s.parse::<u64>().ok()) {
            if e.path().join(STATE_FILE).exists() {
                v.push((n, e.path()));
            }
        } else if name.starts_with('.') && name.contains(".tmp-") {
            // Left by a killed run: never complete, never used.
            let _ = fs::remove_dir_all(e.path());
        }
    }
    Ok(v)
}

pub(crate) fn latest_checkpoint(root: &Path) -> Result<Option<(PathBuf, CkptState)>, RunError> {
    let mut all = list_checkpoints(root)?;
    all.sort();
    while let Some((_, dir)) = all.pop() {
        let p = dir.join(STATE_FILE);
        let parsed = fs::read_to_string(&p).ok().and_then(|t| serde_json::from_str::<CkptState>(&t).ok());
        match parsed {
            Some(st) => return Ok(Some((dir, st))),
            None => eprintln!("warning: ignoring unreadable checkpoint {}", dir.display()),
        }
    }
    Ok(None)
}

/// metrics.jsonl: one JSON object per line, appended and flushed per step. On resume, lines of
/// steps after the checkpoint (and a torn last line from a kill) are dropped first.
pub(crate) struct Metrics {
    file: fs::File,
    path: PathBuf,
    /// The same scalars as TensorBoard events in OUT/tensorboard/ (best effort: a failure to
    /// write them is reported once and the run goes on with metrics.jsonl alone).
    tb: Option<crate::tensorboard::EventWriter>,
}

impl Metrics {
    pub(crate) fn open(path: &Path, resume_step: Option<u64>) -> Result<Metrics, RunError> {
        let keep_upto = resume_step;
        let mut kept = String::new();
        if path.exists() {
            if let Some(upto) = keep_upto {
                let text = fs::read_to_string(path).map_err(|e| RunError::io(E_OUT_DIR, "cannot read", path, e))?;
                for line in text.lines() {
                    let Ok(v) = serde_json::from_str::<Value>(line) else {
                        continue;
                    };
                    if v.get("step").and_then(Value::as_u64).is_some_and(|s| s <= upto) {
                        kept.push_str(line);
                        kept.push('\n');
                    }
                }
            }
        }
        write_atomically(path, kept.as_bytes())?;
        let file = fs::OpenOptions::new()
            .append(true)
            .open(path)
            .map_err(|e| RunError::io(E_OUT_DIR, "cannot open", path, e))?;
        let now =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
        let tb_dir = path.parent().unwrap_or(Path::new(".")).join("tensorboard");
        let tb = match crate::tensorboard::EventWriter::create(&tb_dir, now) {
            Ok(w) => Some(w),
            Err(e) => {
                eprintln!("warning: no TensorBoard events ({}: {e}); metrics.jsonl is complete", tb_dir.display());
                None
            }
        };
        Ok(Metrics { file, path: path.to_path_buf(), tb })
    }

    pub(crate) fn write(&mut self, row: &Map<String, Value>) -> Result<(), RunError> {
        let mut line = serde_json::to_string(row)
            .map_err(|e| RunError::new(E_OUT_DIR, format!("cannot serialise metrics: {e}")))?;
        line.push('\n');
        // One write per line so a kill leaves at most one torn line, which resume drops.
        self.file
            .write_all(line.as_bytes())
            .and_then(|_| self.file.flush())
            .map_err(|e| RunError::io(E_OUT_DIR, "cannot append to", &self.path, e))?;
        if let Some(tb) = &mut self.tb {
            let step = row.get("step").and_then(Value::as_i64).unwrap_or(0);
            let scalars: Vec<(&str, f32)> = row
                .iter()
                .filter(|(k, _)| k.as_str() != "step")
                .filter_map(|(k, v)| v.as_f64().map(|x| (k.as_str(), x as f32)))
                .collect();
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs_f64())
                .unwrap_or(0.0);
            if let Err(e) = tb.scalars(step, now, &scalars) {
                eprintln!(
                    "warning: TensorBoard events stop here ({}: {e}); metrics.jsonl is complete",
                    tb.path.display()
                );
                self.tb = None;
            }
        }
        Ok(())
    }
}
