//! The synchronous schedule: optional SFT warm-up, then per step generate -> reward -> train ->
//! sync weights, with evaluation, atomic checkpoints, exact resume and metrics.jsonl. Multi-LoRA's
//! named adapters run here, as lanes of a step (`lanes`). DAPO's dynamic sampling
//! (`sync { filter = drop_flat }`) runs here too: `Parts::dynamic_batch`.

pub(crate) mod lanes;

use crate::backend::{Backend, LocalHandoff, RolloutEngine, TrainStats, Trainer, WeightTransport};
use crate::env::faults::Faults;
use crate::progress::Progress;
use crate::reward::BatchReward;
use crate::rng::derive_seed;
use crate::run::step::batch::{
    round_batch, score_round, single_turn_batch, Generated, Generation, ScoredRound, StepBatch,
};
use crate::run::step::checkpoint::{is_checkpoint_of, save_checkpoint, save_final_model};
use crate::run::step::episodes::{all_episodes_faulted, EnvRunner};
use crate::run::step::eval::evaluate;
use crate::run::step::metrics::Metrics;
use crate::run::step::open::{start_fresh, summary, Outputs, Position};
use crate::run::step::samples;
use crate::run::step::score::SharedReward;
use crate::run::step::teacher::TeacherStage;
use crate::run::step::train::{
    check_wall_time, count_flat_groups, insert_perf, insert_train_stats, step_lrs, train_checked, StepTimes,
};
use crate::sample::SamplingParams;
use crate::schedule::DynamicSampling;
use crate::spec::{RunOptions, RunSpec, Summary};
use crate::tasks::TaskSet;
use crate::{RunError, E_CHECKPOINT};
use lanes::Lane;
use serde_json::{json, Map};
use std::path::PathBuf;
use std::time::Instant;

/// Runs `spec` under the sync schedule (`run_with` has validated it and built its task and lanes).
pub(super) fn run(
    spec: &RunSpec,
    opts: &RunOptions,
    backend: &dyn Backend,
    task: TaskSet,
    mut lanes: Vec<Lane>,
    started: Instant,
) -> Result<Summary, RunError> {
    refuse_dynamic_sampling(spec, &lanes)?;
    let mut outs = Outputs::open(spec, opts)?;
    let mut p = Parts::create(spec, opts, backend, &task)?;
    let start = p.open(spec, &task, &lanes, &mut outs)?;
    let Position { mut step, eval_start, mut eval_last, mut last_ckpt } = start;
    let Outputs { ckpt_root, metrics_path, mut metrics, mut samples, mut progress, .. } = outs;
    let out = &opts.out_dir;

    let mut last_reward = None;
    let mut steps_this_run = 0u64;
    let mut stopped_early = false;
    let mut interrupted = false;
    while step < spec.steps {
        if let Some(n) = opts.stop_after {
            if steps_this_run >= n {
                stopped_early = true;
                break;
            }
        }
        // Ctrl-C: the step in progress has finished; a checkpoint at it follows.
        if opts.interrupted() {
            (stopped_early, interrupted) = (true, true);
            break;
        }
        check_wall_time(opts, started, step)?;
        step += 1;
        steps_this_run += 1;
        let t_step = Instant::now();
        let outcome = if !lanes.is_empty() {
            // Multi-LoRA: every lane generates, is scored and trains with its own adapter.
            let (engine, trainer, reward) = (p.engine.as_mut(), p.trainer.as_mut(), p.reward.as_mut());
            lanes::step(spec, &mut lanes, engine, trainer, reward, step, &last_ckpt)?
        } else {
            p.rollout_and_train(spec, &task, step, &last_ckpt, &mut metrics, &metrics_path, &mut progress)?
        };
        let StepOutcome { sb, ts, lrs, cols: lane_cols, gen_s, reward_s, teacher_s, train_s, faults } = outcome;
        let t_sync = Instant::now();
        let w = p.transport.transfer(p.trainer.export_weights()?)?;
        p.engine.load_weights(&w)?;
        let sync_s = t_sync.elapsed().as_secs_f64();

        let version = p.engine.weight_version();
        let (mut row, reward_mean) = step_row(spec, step, version, lanes.len(), &sb, &ts, &lrs, lane_cols);
        if let Some(f) = &faults {
            row.extend(f.columns());
        }
        let do_eval = step == spec.steps || (spec.eval.every > 0 && step % spec.eval.every == 0);
        if do_eval {
            let t0 = Instant::now();
            let acc = match lanes.is_empty() {
                true => evaluate(spec, &task, p.eval_reward.as_mut(), p.env.as_ref(), p.engine.as_mut())?,
                false => lanes::evaluate_lanes(spec, &lanes, p.eval_reward.as_mut(), p.engine.as_mut(), &mut row)?,
            };
            row.insert("eval/accuracy".into(), json!(acc.0));
            row.insert("eval/response_len".into(), json!(acc.1));
            row.insert("perf/eval_s".into(), json!(t0.elapsed().as_secs_f64()));
            eval_last = Some(acc.0);
            progress.eval(step, acc.0);
        }
        let gen_tokens = sb.sampled_tokens;
        let trained: usize = sb.batch.iter().map(|t| t.prompt.len() + t.response.len()).sum();
        let times = StepTimes { gen_s, reward_s, teacher_s, train_s, sync_s, step_s: t_step.elapsed().as_secs_f64() };
        let sync_bytes = p.trainer.last_sync_bytes().map_or(w.bytes(), |b| b as usize);
        insert_perf(&mut row, &ts, &times, gen_tokens as u64, trained, sync_bytes);
        metrics.write(&row)?;
        samples.write(&sb.shown)?;
        last_reward = Some(reward_mean);
        let note = faults.as_ref().map(Faults::reward_note).unwrap_or_default();
        progress.step(
            step,
            reward_mean,
            &note,
            gen_tokens as f64 / gen_s.max(1e-9),
            trained as f64 / train_s.max(1e-9),
        );

        let ck = spec.checkpoint.every;
        if (ck > 0 && step % ck == 0) || step == spec.steps {
            let trainer = p.trainer.as_ref();
            let files = |d: &std::path::Path| save_prompt_cursor(spec, d, p.next_batch);
            last_ckpt = Some(save_checkpoint(&ckpt_root, spec, step, eval_start, eval_last, trainer, files)?);
        }
    }
    if interrupted && !is_checkpoint_of(&last_ckpt, step) {
        let trainer = p.trainer.as_ref();
        let files = |d: &std::path::Path| save_prompt_cursor(spec, d, p.next_batch);
        last_ckpt = Some(save_checkpoint(&ckpt_root, spec, step, eval_start, eval_last, trainer, files)?);
    }
    if !stopped_early {
        save_final_model(out, p.trainer.as_ref(), &task)?;
    }
    let at = Position { step, eval_start, eval_last, last_ckpt };
    Ok(summary(at, last_reward, stopped_early, interrupted, metrics_path, started, &mut progress))
}

/// What a synchronous run holds from its opening to its end: the backend's engine and trainer,
/// the teacher stage, the rollouts' reward and the evaluations' own, the environment, and the
/// weight transport. Made in that order; the fields are declared in the reverse one, so they are
/// dropped (processes stopped, connections closed) last made, first.
struct Parts {
    /// Under dynamic sampling, the index of the next batch of `rollout_batch` prompts to draw
    /// (`TaskSet::train_batch`): a step draws one per generation round, so the next step starts
    /// after the last one drawn. Saved with each checkpoint (`PROMPT_CURSOR_FILE`). Without dynamic
    /// sampling, step k draws batch k and this stays unused.
    next_batch: u64,
    transport: Box<dyn WeightTransport>,
    env: Option<EnvRunner>,
    eval_reward: Box<dyn BatchReward>,
    reward: Box<dyn BatchReward>,
    teacher: Option<TeacherStage>,
    trainer: Box<dyn Trainer>,
    engine: Box<dyn RolloutEngine>,
}

impl Parts {
    fn create(spec: &RunSpec, opts: &RunOptions, backend: &dyn Backend, task: &TaskSet) -> Result<Parts, RunError> {
        backend.set_threads(opts.threads);
        let (engine, trainer) = backend.create(spec)?;
        let teacher = TeacherStage::for_run(spec, backend)?;
        // One reward for rollouts and evaluations (one reward program per run).
        let shared = SharedReward::for_run(spec)?;
        let (reward, eval_reward) = (shared.boxed(), shared.boxed());
        // The sync schedule also plays the plug-in layers (their chat server needs `opts`).
        let env = EnvRunner::for_sync_run(spec, opts, &task.tokenizer)?;
        if let Some(e) = &env {
            e.env.keep_log_in(&env_log_dir(&opts.out_dir));
        }
        let transport: Box<dyn WeightTransport> = Box::new(LocalHandoff);
        Ok(Parts { next_batch: 1, transport, env, eval_reward, reward, teacher, trainer, engine })
    }

    /// Where the run starts: the checkpoint it resumes from, or a fresh run's opening.
    fn open(
        &mut self,
        spec: &RunSpec,
        task: &TaskSet,
        lanes: &[Lane],
        outs: &mut Outputs,
    ) -> Result<Position, RunError> {
        Ok(match outs.resume_from.take() {
            Some((dir, st)) => {
                self.next_batch = load_prompt_cursor(spec, &dir, st.step)?;
                self.trainer.load(&dir)?;
                let w = self.transport.transfer(self.trainer.export_weights()?)?;
                self.engine.load_weights(&w)?;
                outs.progress.note(&format!("resumed from {} (step {})", dir.display(), st.step));
                Position::resumed(dir, &st)
            }
            None => {
                let (eval_reward, env) = (&mut self.eval_reward, &self.env);
                start_fresh(
                    spec,
                    task,
                    self.trainer.as_mut(),
                    self.transport.as_mut(),
                    outs,
                    self.engine.as_mut(),
                    |e, w| e.load_weights(&w),
                    |e, row| match lanes.is_empty() {
                        true => evaluate(spec, task, eval_reward.as_mut(), env.as_ref(), e),
                        false => lanes::evaluate_lanes(spec, lanes, eval_reward.as_mut(), e, row),
                    },
                    Map::new(),
                    |d| save_prompt_cursor(spec, d, 1),
                )?
            }
        })
    }

    /// A step's rollout (single responses scored by the run's reward, or episodes), the teacher
    /// stage, and training. Episode faults are told on the console here; a step whose every
    /// episode was dropped writes its metrics row, then stops the run (E0509).
    #[allow(clippy::too_many_arguments)]
    fn rollout_and_train(
        &mut self,
        spec: &RunSpec,
        task: &TaskSet,
        step: u64,
        last_ckpt: &Option<PathBuf>,
        metrics: &mut Metrics,
        metrics_path: &std::path::Path,
        progress: &mut Progress,
    ) -> Result<StepOutcome, RunError> {
        let r = &spec.rollout;
        let t_gen = Instant::now();
        let mut faults = None;
        // The batch, generation seconds, and scoring seconds so far with when scoring last began.
        let (mut sb, gen_s, reward_before, t_reward) = match (&self.env, spec.dynamic_sampling) {
            (Some(env), _) => {
                // Episodes: generation and the environment interleave turn by turn.
                let items = task.train_batch(spec.seed, "rollout", step, r.rollout_batch);
                let params =
                    SamplingParams::rollout(r, derive_seed(spec.seed, "sampling", step)).with_stop(task.stop_tokens());
                let (groups, results) = env.play(
                    task,
                    self.engine.as_mut(),
                    &items,
                    r.samples_per_prompt,
                    &params,
                    &format!("step{step}"),
                )?;
                let f = Faults::of(&results, env.limits.on_env_error);
                progress.faults(step, &fault_kinds(&f), f.warning(&format!("step {step}")).as_deref());
                faults = Some(f);
                let sb = env.batch(&groups, &results).with_shown(samples::episodes(
                    spec,
                    &task.tokenizer,
                    step,
                    &groups,
                    &results,
                ));
                (sb, t_gen.elapsed().as_secs_f64(), 0.0, Instant::now())
            }
            (None, Some(ds)) => {
                let (sb, gen_s, reward_s) = self.dynamic_batch(spec, task, step, ds)?;
                (sb, gen_s, reward_s, Instant::now())
            }
            (None, None) => {
                let generated = self.generate_batch(spec, task, step)?;
                let gen_s = t_gen.elapsed().as_secs_f64();
                let t_reward = Instant::now();
                let sb = single_turn_batch(spec, task, self.reward.as_mut(), generated, step)?;
                (sb, gen_s, 0.0, t_reward)
            }
        };
        // Dynamic sampling found no group with signal (some reward was trained on, all flat): the
        // step trains nothing; its row says so (`train/skipped`).
        if sb.batch.is_empty() && spec.dynamic_sampling.is_some() && !sb.rewards.is_empty() {
            let reward_s = reward_before + t_reward.elapsed().as_secs_f64();
            let (ts, lrs) = (TrainStats::default(), step_lrs(spec, step));
            let (teacher_s, train_s) = (0.0, 0.0);
            return Ok(StepOutcome { sb, ts, lrs, cols: Map::new(), gen_s, reward_s, teacher_s, train_s, faults });
        }
        if sb.batch.is_empty() {
            let e = match &faults {
                Some(f) => {
                    // The failing step's row first, so that the error's help points at a row.
                    metrics.write(&faulted_row(step, self.engine.weight_version(), &sb, f))?;
                    all_episodes_faulted(&format!("step {step}"), f, step, metrics_path)
                }
                None => RunError::new(
                    crate::reward::E_REWARD,
                    format!("step {step}: the reward `{}` dropped every sample of the batch", self.reward.name()),
                )
                .with_help("the reward failed on every sample: fix it, or set `on_error = zero`"),
            };
            return Err(e);
        }
        let lrs = step_lrs(spec, step);
        let reward_s = reward_before + t_reward.elapsed().as_secs_f64();
        let teacher_s = match self.teacher.as_mut() {
            Some(t) => t.score(&mut sb.batch)?,
            None => 0.0,
        };
        let t_train = Instant::now();
        let mut ts = train_checked(self.trainer.as_mut(), &sb.batch, &lrs, r.temperature, step, last_ckpt)?;
        let train_s = t_train.elapsed().as_secs_f64();
        if let Some(t) = &self.teacher {
            t.note(&mut ts);
        }
        Ok(StepOutcome { sb, ts, lrs, cols: Map::new(), gen_s, reward_s, teacher_s, train_s, faults })
    }
}

impl Parts {
    /// Batch `b` of the prompt stream, tokenised and sampled with sampling stream `b`.
    fn generate_batch(&mut self, spec: &RunSpec, task: &TaskSet, b: u64) -> Result<Generation, RunError> {
        let r = &spec.rollout;
        let items = task.train_batch(spec.seed, "rollout", b, r.rollout_batch);
        let params = SamplingParams::rollout(r, derive_seed(spec.seed, "sampling", b)).with_stop(task.stop_tokens());
        let prompts = items.iter().map(|it| task.tokenizer.encode_prompt(&it.prompt)).collect::<Result<Vec<_>, _>>()?;
        let samples = self.engine.generate(&prompts, r.samples_per_prompt, &params)?;
        Ok((items, prompts, samples))
    }

    /// DAPO's dynamic sampling (`RunSpec::dynamic_sampling`): rounds of `rollout_batch` fresh
    /// prompts (the next batches of the prompt stream, `next_batch`), each generated and scored,
    /// until `rollout_batch` groups with signal (rewards not all equal) are kept or `max_rounds`
    /// rounds were generated. The first groups with signal are kept, in order, and no more than
    /// `rollout_batch`; a flat group is dropped whatever its round. Short after the last round,
    /// the step trains on the groups it kept; with none, on nothing (the caller skips the step),
    /// its rewards then the step's, for its row. Returns the batch, generation and scoring seconds.
    fn dynamic_batch(
        &mut self,
        spec: &RunSpec,
        task: &TaskSet,
        step: u64,
        ds: DynamicSampling,
    ) -> Result<(StepBatch, f64, f64), RunError> {
        let r = &spec.rollout;
        let want = r.rollout_batch;
        let mut rounds: Vec<ScoredRound> = Vec::new();
        // The groups kept: (round, row of the round).
        let mut kept: Vec<(usize, usize)> = Vec::new();
        let mut first_flat = 0usize;
        let (mut gen_s, mut reward_s) = (0.0, 0.0);
        while rounds.len() < ds.max_rounds.max(1) as usize && kept.len() < want {
            let b = self.next_batch;
            self.next_batch += 1;
            let t_gen = Instant::now();
            // Batch b as a plain run's step b draws it: a step without flat groups samples alike.
            let (items, prompts, samples) = self.generate_batch(spec, task, b)?;
            gen_s += t_gen.elapsed().as_secs_f64();
            let t_reward = Instant::now();
            let first = rounds.len() * want;
            let round = score_round(spec, task, self.reward.as_mut(), (items, prompts, samples), step, first)?;
            reward_s += t_reward.elapsed().as_secs_f64();
            let flat = round.flat_groups();
            if rounds.is_empty() {
                first_flat = flat.iter().filter(|&&f| f).count();
            }
            for (i, _) in flat.iter().enumerate().filter(|(_, &f)| !f) {
                if kept.len() < want {
                    kept.push((rounds.len(), i));
                }
            }
            rounds.push(round);
        }
        let generated = Generated::of(spec, &rounds);
        let n_rounds = rounds.len();
        let extra = generated.responses.saturating_sub(want * r.samples_per_prompt);
        let kept_groups = kept.len();
        let mut rows: Vec<Vec<usize>> = vec![Vec::new(); n_rounds];
        for &(round, i) in &kept {
            rows[round].push(i);
        }
        // Every reward of the step, by group (rows numbered across rounds), for a step that keeps
        // no group: its row reports those (all flat) rather than nothing.
        let mut all: (Vec<f32>, Vec<usize>) = (Vec::new(), Vec::new());
        for (k, round) in rounds.iter().enumerate() {
            for (s, o) in round.samples.iter().zip(&round.scores.outcomes) {
                if let Some(x) = o.reward() {
                    all.0.push(x);
                    all.1.push(k * want + s.prompt_index);
                }
            }
        }
        let trained = ScoredRound::concat(rounds.into_iter().zip(&rows).map(|(r, k)| r.select(k)).collect());
        let mut sb = round_batch(spec, task, step, trained, generated);
        if kept_groups == 0 {
            (sb.rewards, sb.groups) = all;
        }
        sb.metrics.extend([
            ("rollout/gen_rounds".to_string(), n_rounds as f64),
            ("rollout/kept_groups".to_string(), kept_groups as f64),
            ("rollout/extra_samples".to_string(), extra as f64),
            // The first round's share of flat groups, as a run without dynamic sampling reports
            // it (the trained groups have none).
            ("rollout/flat_group_frac".to_string(), first_flat as f64 / want.max(1) as f64),
        ]);
        Ok((sb, gen_s, reward_s))
    }
}

/// A step's metrics row before its evaluation and timings: the rollout's columns (`rollout/*` and
/// the batch's own), the training stats, and multi-LoRA's per-adapter columns; with the step's
/// mean reward.
#[allow(clippy::too_many_arguments)]
fn step_row(
    spec: &RunSpec,
    step: u64,
    weight_version: u64,
    lanes: usize,
    sb: &StepBatch,
    ts: &TrainStats,
    lrs: &[f64],
    lane_cols: Map<String, serde_json::Value>,
) -> (Map<String, serde_json::Value>, f64) {
    let r = &spec.rollout;
    let rewards = &sb.rewards;
    let n = rewards.len().max(1) as f64;
    let n_samples = sb.responses.max(1) as f64;
    let reward_mean = rewards.iter().map(|&x| x as f64).sum::<f64>() / n;
    let flat_groups = count_flat_groups(rewards, &sb.groups);
    let mut row = Map::new();
    row.insert("step".into(), json!(step));
    row.insert("weight_version".into(), json!(weight_version));
    row.insert("rollout/reward_mean".into(), json!(reward_mean));
    let solved = crate::spec::env::solved_frac(rewards.iter().map(|&x| f64::from(x)), spec.solved_at());
    row.insert("rollout/solved_frac".into(), json!(solved));
    row.insert("rollout/response_len".into(), json!(sb.sampled_tokens as f64 / n_samples));
    row.insert("rollout/stop_frac".into(), json!(sb.stopped as f64 / n_samples));
    row.insert("rollout/flat_group_frac".into(), json!(flat_groups as f64 / (r.rollout_batch * lanes.max(1)) as f64));
    for (k, v) in &sb.metrics {
        row.insert(k.clone(), json!(v));
    }
    if sb.batch.is_empty() {
        // Dynamic sampling kept no group: no optimizer step, so no `train/*` statistics.
        row.insert("train/skipped".into(), json!(1));
    } else {
        insert_train_stats(&mut row, ts, lrs);
    }
    row.extend(lane_cols);
    (row, reward_mean)
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
    /// The step's episode faults (a run with an environment), for its row and console line.
    pub(crate) faults: Option<Faults>,
}

/// The row of a step that trained nothing because every episode faulted: its episode columns and
/// fault counts, written before the run stops.
fn faulted_row(step: u64, weight_version: u64, sb: &StepBatch, f: &Faults) -> Map<String, serde_json::Value> {
    let mut row = Map::new();
    row.insert("step".into(), json!(step));
    row.insert("weight_version".into(), json!(weight_version));
    for (k, v) in &sb.metrics {
        row.insert(k.clone(), json!(v));
    }
    row.extend(f.columns());
    row
}

/// Dynamic sampling draws more prompts for single responses, alone in a step: a run of episodes
/// (`env`) or of multi-LoRA adapters is refused rather than run without it.
fn refuse_dynamic_sampling(spec: &RunSpec, lanes: &[Lane]) -> Result<(), RunError> {
    let what = match () {
        _ if spec.dynamic_sampling.is_none() => return Ok(()),
        _ if spec.env.is_some() => "a run of episodes (an environment)",
        _ if !lanes.is_empty() => "a multi-LoRA run (named adapters)",
        _ => return Ok(()),
    };
    Err(RunError::new(
        crate::E_SPEC,
        format!(
            "`sync {{ filter = drop_flat }}` (dynamic sampling) over-samples single responses; {what} cannot use it"
        ),
    )
    .with_help("drop `filter = drop_flat` from the schedule, or use `schedule = fully_async { filter = drop_flat }`"))
}

/// The dynamic-sampling prompt cursor in a checkpoint: `{"next_batch": N}`.
const PROMPT_CURSOR_FILE: &str = "prompt_cursor.json";

/// Writes the prompt cursor into a checkpoint being made (a run with dynamic sampling only).
fn save_prompt_cursor(spec: &RunSpec, dir: &std::path::Path, next_batch: u64) -> Result<(), RunError> {
    if spec.dynamic_sampling.is_none() {
        return Ok(());
    }
    crate::atomic_write::write_json(&dir.join(PROMPT_CURSOR_FILE), &json!({ "next_batch": next_batch }))
}

/// The prompt cursor a resume continues from. A checkpoint without one (made by a run without
/// dynamic sampling) is where a plain run would be: step k + 1 draws batch k + 1.
fn load_prompt_cursor(spec: &RunSpec, dir: &std::path::Path, step: u64) -> Result<u64, RunError> {
    let path = dir.join(PROMPT_CURSOR_FILE);
    if spec.dynamic_sampling.is_none() || !path.exists() {
        return Ok(step + 1);
    }
    let text = std::fs::read_to_string(&path).map_err(|e| RunError::io(E_CHECKPOINT, "cannot read", &path, e))?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| RunError::new(E_CHECKPOINT, format!("{}: not JSON: {e}", path.display())))?;
    v["next_batch"].as_u64().filter(|&n| n > step).ok_or_else(|| {
        RunError::new(E_CHECKPOINT, format!("{}: no valid `next_batch` after step {step}", path.display()))
    })
}

/// The fault reasons of a step, as the console's rate limit compares them.
pub(crate) fn fault_kinds(f: &Faults) -> String {
    f.kinds().iter().map(|k| k.name()).collect::<Vec<_>>().join(" ")
}

/// Where a run keeps its environments' logs (a `command_env`'s stderr): `OUT/env/`.
pub(crate) fn env_log_dir(out: &std::path::Path) -> PathBuf {
    out.join("env")
}
