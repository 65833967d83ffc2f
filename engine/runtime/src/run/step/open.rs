//! Opening and closing a run, the same for both executors: the output directory (refused when it
//! holds another run), the task, a fresh run's opening (SFT, reference, first weights, step-0
//! evaluation and checkpoint), a resumed run's position, and the summary.

use super::checkpoint::{newest_good_checkpoint, save_checkpoint, CkptState};
use super::metrics::Metrics;
use super::samples::SamplesLog;
use super::sft::run_sft;
use crate::atomic_write::write_json;
use crate::backend::{Trainer, WeightSnapshot, WeightTransport};
use crate::progress::Progress;
use crate::spec::{RunOptions, RunSpec, Summary, RESUME_FREE};
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
    /// samples.jsonl, cut back to the checkpoint like metrics.jsonl.
    pub(crate) samples: SamplesLog,
    pub(crate) progress: Progress,
    /// The checkpoint a resume continues from (None: a fresh run).
    pub(crate) resume_from: Option<(PathBuf, CkptState)>,
}

impl Outputs {
    /// The output directory (refused when it holds another run), the checkpoint to resume from
    /// (the newest whose files match their manifest; refused when its spec differs in a field
    /// that changes state), metrics.jsonl cut back to it, and progress.
    pub(crate) fn open(spec: &RunSpec, opts: &RunOptions) -> Result<Outputs, RunError> {
        let out = &opts.out_dir;
        prepare_out_dir(spec, opts)?;
        let ckpt_root = out.join("checkpoints");
        let metrics_path = out.join("metrics.jsonl");
        let found = if opts.resume { newest_good_checkpoint(&ckpt_root)? } else { None };
        let resume_from = match found {
            Some(f) => {
                for line in &f.skipped {
                    eprintln!("warning: {line}");
                }
                for note in resumable(&f.state.spec, spec, &f.dir, Some(f.state.step))? {
                    eprintln!("note: {note}");
                }
                Some((f.dir, f.state))
            }
            None => None,
        };
        // The spec last: a refused resume leaves the run's own.
        write_json(&out.join("spec.json"), spec)?;
        let resume_step = resume_from.as_ref().map(|c| c.1.step);
        let metrics = Metrics::open(&metrics_path, resume_step)?;
        let samples = SamplesLog::open(&out.join("samples.jsonl"), resume_step)?;
        let progress = Progress::new(opts.progress, spec.steps).with_rule(spec.solved_rule());
        Ok(Outputs { ckpt_root, metrics_path, metrics, samples, progress, resume_from })
    }
}

/// Whether `spec` may resume what `saved` wrote at `at` (a checkpoint of step `step`, or the run's
/// spec.json): the changes it makes, as notes, or E0507 naming every field that differs and may
/// not, or a checkpoint already past the run's steps.
fn resumable(saved: &RunSpec, spec: &RunSpec, at: &Path, step: Option<u64>) -> Result<Vec<String>, RunError> {
    let d = spec.resume_diff(saved);
    if !d.refused.is_empty() {
        let fields: Vec<String> = d.refused.iter().map(|c| format!("\n  {c}")).collect();
        return Err(RunError::new(
            E_OUT_DIR,
            format!(
                "{} was written by a run of another spec; resume needs the same one, and these fields differ \
                 (saved -> now):{}",
                at.display(),
                fields.concat()
            ),
        )
        .with_help(format!(
            "resume with the recipe and --set overrides the run was started with (a resume may change only {}), \
             or start a new run in another --out",
            RESUME_FREE.join(", ")
        )));
    }
    let mut notes: Vec<String> = d.allowed.iter().map(|c| format!("resuming with {c}")).collect();
    if let Some(step) = step.filter(|s| *s > spec.steps) {
        return Err(RunError::new(
            E_OUT_DIR,
            format!(
                "{} is at step {step}, past the run's {} steps: there is nothing to resume",
                at.display(),
                spec.steps
            ),
        )
        .with_help(format!("resume with --steps {step} or more")));
    }
    if saved.steps != spec.steps && spec.train.decay != crate::spec::Decay::None {
        notes.push(format!(
            "the learning rate's {} decay now ends at step {}: the remaining steps follow the new schedule",
            format!("{:?}", spec.train.decay).to_lowercase(),
            spec.steps
        ));
    }
    Ok(notes)
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
    interrupted: bool,
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
        interrupted,
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
    // An episode is not sent its row as the file has it (its first prompt joins the reset
    // observation, env_reward.prompt): each first prompt as sent is checked instead (E0510 too).
    let sent_as_is = spec.env.is_none();
    if let Some(limit) = spec.rollout.max_prompt_tokens.filter(|l| sent_as_is && max_prompt > *l) {
        return Err(prompt_over_limit(max_prompt, limit, task.tokenizer.special().bos.is_some()));
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

/// E0510 for a prompt set whose longest prompt is over `max_prompt_tokens`. The count includes
/// the BOS token only where the tokenizer adds one (Qwen's adds none), and says so only then.
fn prompt_over_limit(max_prompt: usize, limit: usize, bos: bool) -> RunError {
    let with = if bos { " (with BOS)" } else { "" };
    RunError::new(
        E_TOO_LONG,
        format!("the longest prompt is {max_prompt} tokens{with}, over the rollout's max_prompt_tokens {limit}"),
    )
    .with_help(format!("raise `max_prompt_tokens` to {max_prompt}.tokens, or shorten the prompts"))
}

/// Creates the output directory; refuses one that holds a run unless resuming, and a resume whose
/// spec differs from the run's spec.json in a field a resume may not change.
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
            let saved = serde_json::from_str::<RunSpec>(&old).map_err(|e| {
                RunError::new(E_OUT_DIR, format!("{} is not a run spec this miles reads: {e}", spec_path.display()))
                    .with_help("start a new run in another --out")
            })?;
            resumable(&saved, spec, out, None)?;
        }
    }
    fs::create_dir_all(out).map_err(|e| RunError::io(E_OUT_DIR, "cannot create", out, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::HfModelSpec;

    fn tiny() -> RunSpec {
        RunSpec::from_json(include_str!("../../../tests/data/tiny.json")).unwrap()
    }

    /// The longest prompt's count says "with BOS" only for a tokenizer that adds one (issue #42):
    /// the char tokenizer does, the Qwen3 fixture's has none.
    #[test]
    fn the_prompt_length_error_mentions_bos_only_where_the_tokenizer_adds_one() {
        let mut spec = tiny();
        spec.rollout.max_prompt_tokens = Some(1);
        let chars = build_task(&spec).err().expect("a 1-token limit refuses every prompt");
        assert!(chars.message.contains("tokens (with BOS), over"), "{}", chars.message);

        spec.hf = Some(HfModelSpec {
            path: PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/hf/qwen3")),
        });
        spec.model.vocab_size = 1 << 20;
        let qwen = build_task(&spec).err().expect("a 1-token limit refuses every prompt");
        assert_eq!(qwen.code, E_TOO_LONG, "{}", qwen.message);
        assert!(!qwen.message.contains("BOS"), "the Qwen3 tokenizer adds no BOS: {}", qwen.message);
    }
}
