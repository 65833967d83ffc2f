//! Helpers the run tests share: a fresh output directory and quiet run options.

use miles_runtime::{ProgressMode, RunOptions};
use std::path::{Path, PathBuf};

/// An empty directory under the system's temporary one, named for this process and `name`.
pub fn fresh_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("miles-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// Options for a run into `dir` without progress output, resumed or not, stopped early or not.
pub fn opts(dir: &Path, resume: bool, stop_after: Option<u64>) -> RunOptions {
    let mut o = RunOptions::new(dir);
    o.progress = ProgressMode::Off;
    o.resume = resume;
    o.stop_after = stop_after;
    o
}
