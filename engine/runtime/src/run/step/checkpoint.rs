//! Checkpoints with exact resume (written whole or not at all, `atomic_write`), and the final
//! model.

use crate::atomic_write::{write_dir_atomically, write_json};
use crate::backend::Trainer;
use crate::spec::RunSpec;
use crate::tasks::TaskSet;
use crate::{RunError, E_CHECKPOINT};
use std::fs;
use std::path::{Path, PathBuf};

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

/// The final model, Hugging Face style (model.safetensors + config.json + tokenizer), written
/// atomically into OUT/model. Both executors end a finished run with it.
pub(crate) fn save_final_model(out: &Path, trainer: &dyn Trainer, task: &TaskSet) -> Result<(), RunError> {
    write_dir_atomically(&out.join("model"), |tmp| {
        trainer.save_model(tmp)?;
        task.tokenizer.save(tmp)?;
        // A LoRA run's model has its frozen base beside it (`base/`): it gets the tokenizer too.
        let base = tmp.join("base");
        if base.is_dir() {
            task.tokenizer.save(&base)?;
        }
        Ok(())
    })
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
