//! metrics.jsonl (appended and flushed per step, cut back on resume) and its TensorBoard copy.

use crate::atomic_write::write_atomically;
use crate::{RunError, E_OUT_DIR};
use serde_json::{Map, Value};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

/// metrics.jsonl: one JSON object per line, appended and flushed per step. On resume, lines of
/// steps after the checkpoint (and a torn last line from a kill) are dropped first.
pub struct Metrics {
    file: fs::File,
    path: PathBuf,
    /// The same scalars as TensorBoard events in OUT/tensorboard/ (best effort: a failure to
    /// write them is reported once and the run goes on with metrics.jsonl alone).
    tb: Option<crate::tensorboard::EventWriter>,
}

/// Opens a JSONL file of per-step rows for appending, first cut back to the rows of steps up to
/// `upto` (a resume's checkpoint; a torn last line from a kill goes too), or emptied (a fresh
/// run): a resumed run appends the steps it repeats without duplicating them. The cut is an
/// atomic rewrite, so a kill during it leaves the old file whole.
pub(crate) fn open_cut_back(path: &Path, upto: Option<u64>) -> Result<fs::File, RunError> {
    let mut kept = String::new();
    if let Some(upto) = upto.filter(|_| path.exists()) {
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
    write_atomically(path, kept.as_bytes())?;
    fs::OpenOptions::new().append(true).open(path).map_err(|e| RunError::io(E_OUT_DIR, "cannot open", path, e))
}

impl Metrics {
    pub fn open(path: &Path, resume_step: Option<u64>) -> Result<Metrics, RunError> {
        let file = open_cut_back(path, resume_step)?;
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

    pub fn write(&mut self, row: &Map<String, Value>) -> Result<(), RunError> {
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
