//! Writes that survive a kill: a temp file (or directory) filled, synced, then renamed over the
//! target, so a reader sees the old content or the new, never a torn one.

use crate::{RunError, E_CHECKPOINT};
use std::fs;
use std::io::Write;
use std::path::Path;

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
