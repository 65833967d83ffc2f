//! Opening and closing a run, the same for both executors: the output directory (refused when it
//! holds another run), the task, a fresh run's opening (SFT, reference, first weights, step-0
//! evaluation and checkpoint), a resumed run's position, and the summary.

use super::checkpoint::{latest_checkpoint, save_checkpoint, CkptState};
use super::metrics::Metrics;
use super::sft::run_sft;
use crate::atomic_write::write_json;
use crate::backend::{Trainer, WeightSnapshot, WeightTransport};
use crate::progress::Progress;
use crate::spec::{RunOptions, RunSpec, Summary};
use crate::tasks::TaskSet;
use crate::{RunError, E_OUT_DIR, E_TOO_LONG, E_VOCAB};
use serde_json::{json, Map, Value};
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

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
    evaluate: impl FnOnce(&mut E, &mut Map<String, Value>) -> Result<(f64, f64), RunError>,
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
    let acc = evaluate(engine, &mut row)?;
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

/// The task of a run, with the checks that need it (vocabulary, lengths).
pub(crate) fn build_task(spec: &RunSpec) -> Result<TaskSet, RunError> {
    build_task_for(spec, &spec.task)
}

/// `build_task` of another task of the run (a multi-LoRA adapter's), with the same checks.
pub(crate) fn build_task_for(spec: &RunSpec, task_spec: &crate::spec::TaskSpec) -> Result<TaskSet, RunError> {
    let hf = match &spec.hf {
        Some(h) => Some(crate::tokenize::HfTokenizer::load(&h.path)?),
        None => None,
    };
    let extra = spec.env.as_ref().map(|e| e.alphabet()).unwrap_or("");
    let task = TaskSet::build_for(task_spec, hf, extra)?;
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
