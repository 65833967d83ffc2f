//! Writes that survive a kill (write then rename), checkpoints with exact resume, and the final
//! model.

use super::*;
use crate::spec::RunSpec;
use crate::tasks::TaskSet;
use std::fs;
use std::io::Write;
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
