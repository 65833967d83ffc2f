//! Checkpoints with exact resume, and the final model. A checkpoint is written whole or not at all
//! (`atomic_write`: every file and directory synced before the rename publishes it), its last file
//! is `manifest.json` (each other file's size and SHA-256), and a resume uses the newest checkpoint
//! whose files match their manifest, saying which newer ones it skipped and why.

use crate::atomic_write::{write_dir_atomically, write_json};
use crate::backend::Trainer;
use crate::spec::RunSpec;
use crate::tasks::TaskSet;
use crate::{RunError, E_CHECKPOINT};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::fs;
use std::io::Read;
use std::path::{Component, Path, PathBuf};

pub(crate) const STATE_FILE: &str = "state.json";
/// Written last: a checkpoint directory without it is incomplete and never used.
pub(crate) const MANIFEST_FILE: &str = "manifest.json";
/// However few `checkpoint.keep` asks for: a damaged newest checkpoint leaves one to resume from.
const MIN_KEEP: usize = 2;

/// What a checkpoint records besides the backend's own files.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct CkptState {
    pub(crate) step: u64,
    /// Spec this checkpoint belongs to: resume refuses a spec that differs in a field that
    /// changes state (`RunSpec::resume_diff`).
    pub(crate) spec: RunSpec,
    pub(crate) eval_start: Option<f64>,
    pub(crate) eval_last: Option<f64>,
}

/// Every file of a checkpoint but itself, by path relative to the checkpoint (`/`-separated).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Manifest {
    step: u64,
    files: BTreeMap<String, FileSum>,
}

#[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct FileSum {
    bytes: u64,
    sha256: String,
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
/// they appear atomically with the rest), state.json and the manifest; then only the newest
/// `checkpoint.keep` (at least 2) stay, the older ones removed once this one is complete.
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
        write_json(&tmp.join(STATE_FILE), &CkptState { step, spec: spec.clone(), eval_start, eval_last })?;
        write_json(&tmp.join(MANIFEST_FILE), &Manifest { step, files: sums(tmp)? })
    })?;
    let mut all = list_checkpoints(root)?;
    all.sort();
    let keep = spec.checkpoint.keep.max(MIN_KEEP);
    if all.len() > keep {
        for (_, d) in &all[..all.len() - keep] {
            let _ = fs::remove_dir_all(d);
        }
    }
    Ok(dir)
}

/// Whether `last` is the checkpoint of `step` (an interrupted run writes one unless it is).
pub(crate) fn is_checkpoint_of(last: &Option<PathBuf>, step: u64) -> bool {
    last.as_ref().is_some_and(|d| d.file_name().is_some_and(|n| n.to_string_lossy() == ckpt_name(step)))
}

/// The size and SHA-256 of every file under `dir`.
fn sums(dir: &Path) -> Result<BTreeMap<String, FileSum>, RunError> {
    let mut files = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let rd = fs::read_dir(&d).map_err(|e| RunError::io(E_CHECKPOINT, "cannot list", &d, e))?;
        for e in rd {
            let p = e.map_err(|e| RunError::io(E_CHECKPOINT, "cannot list", &d, e))?.path();
            if p.is_dir() {
                todo.push(p);
                continue;
            }
            let rel = p.strip_prefix(dir).unwrap_or(&p);
            let name = rel.components().map(|c| c.as_os_str().to_string_lossy()).collect::<Vec<_>>().join("/");
            files.insert(name, sum_file(&p).map_err(|e| RunError::io(E_CHECKPOINT, "cannot read", &p, e))?);
        }
    }
    Ok(files)
}

fn sum_file(path: &Path) -> std::io::Result<FileSum> {
    let mut f = fs::File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut bytes = 0u64;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        bytes += n as u64;
    }
    let sha256 = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    Ok(FileSum { bytes, sha256 })
}

/// The `step-N` directories of `root` that hold a manifest (complete), with their steps; a
/// killed run's temporary directories are removed on the way.
fn list_checkpoints(root: &Path) -> Result<Vec<(u64, PathBuf)>, RunError> {
    Ok(list_step_dirs(root)?.into_iter().filter(|(_, d)| d.join(MANIFEST_FILE).exists()).collect())
}

fn list_step_dirs(root: &Path) -> Result<Vec<(u64, PathBuf)>, RunError> {
    let mut v = Vec::new();
    let rd = match fs::read_dir(root) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(v),
        Err(e) => return Err(RunError::io(E_CHECKPOINT, "cannot list", root, e)),
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if let Some(n) = name.strip_prefix("step-").and_then(|s| s.parse::<u64>().ok()) {
            v.push((n, e.path()));
        } else if name.starts_with('.') && name.contains(".tmp-") {
            // Left by a killed run: never complete, never used.
            let _ = fs::remove_dir_all(e.path());
        }
    }
    Ok(v)
}

/// The checkpoint a resume continues from: the newest whose files match its manifest.
pub(crate) struct Found {
    pub(crate) dir: PathBuf,
    pub(crate) state: CkptState,
    /// One line per newer checkpoint passed over, naming it, why, and the one used instead.
    pub(crate) skipped: Vec<String>,
}

/// The newest usable checkpoint under `root`: None when there is none at all; an error (naming
/// each and why) when every one there is damaged or incomplete, so a resume never silently starts
/// the run over.
pub(crate) fn newest_good_checkpoint(root: &Path) -> Result<Option<Found>, RunError> {
    let mut all = list_step_dirs(root)?;
    all.sort();
    let mut bad: Vec<(PathBuf, String)> = Vec::new();
    while let Some((_, dir)) = all.pop() {
        match verify(&dir) {
            Ok(state) => {
                let skipped = bad
                    .iter()
                    .map(|(b, why)| {
                        format!(
                            "checkpoint {} cannot be used ({why}); resuming from {} instead",
                            b.display(),
                            dir.display()
                        )
                    })
                    .collect();
                return Ok(Some(Found { dir, state, skipped }));
            }
            Err(why) => bad.push((dir, why)),
        }
    }
    if bad.is_empty() {
        return Ok(None);
    }
    let each: Vec<String> = bad.iter().map(|(d, why)| format!("\n  {}: {why}", d.display())).collect();
    Err(RunError::new(
        E_CHECKPOINT,
        format!("no checkpoint in {} can be resumed from:{}", root.display(), each.concat()),
    )
    .with_help("restore a checkpoint from a copy, or start the run again without --resume in a new --out"))
}

/// A checkpoint's state, once every file its manifest lists has the size and SHA-256 it lists.
fn verify(dir: &Path) -> Result<CkptState, String> {
    let mp = dir.join(MANIFEST_FILE);
    let text = match fs::read_to_string(&mp) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(format!("it has no {MANIFEST_FILE}: it was not completed, or an older miles wrote it"))
        }
        Err(e) => return Err(format!("cannot read {MANIFEST_FILE}: {e}")),
    };
    let m: Manifest = serde_json::from_str(&text).map_err(|e| format!("{MANIFEST_FILE} is unreadable: {e}"))?;
    for (name, want) in &m.files {
        // The manifest names files inside the checkpoint, never elsewhere.
        let rel = Path::new(name);
        if !rel.components().all(|c| matches!(c, Component::Normal(_))) {
            return Err(format!("{MANIFEST_FILE} names `{name}`, outside the checkpoint"));
        }
        let p = dir.join(rel);
        let len = match fs::metadata(&p) {
            Ok(md) => md.len(),
            Err(_) => return Err(format!("{name} is missing")),
        };
        if len != want.bytes {
            return Err(format!("{name} is {len} bytes, its manifest says {}", want.bytes));
        }
        let got = sum_file(&p).map_err(|e| format!("cannot read {name}: {e}"))?;
        if got.sha256 != want.sha256 {
            return Err(format!("{name} does not match its SHA-256 in {MANIFEST_FILE}"));
        }
    }
    if !m.files.contains_key(STATE_FILE) {
        return Err(format!("{MANIFEST_FILE} does not list {STATE_FILE}"));
    }
    let st = fs::read_to_string(dir.join(STATE_FILE)).map_err(|e| format!("cannot read {STATE_FILE}: {e}"))?;
    let state: CkptState = serde_json::from_str(&st).map_err(|e| format!("{STATE_FILE} is unreadable: {e}"))?;
    if state.step != m.step {
        return Err(format!("{STATE_FILE} says step {}, its manifest step {}", state.step, m.step));
    }
    Ok(state)
}

#[cfg(test)]
mod tests;
