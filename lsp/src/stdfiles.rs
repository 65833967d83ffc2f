//! The embedded standard library as files an editor can open (see the crate docs).

use miles_compiler::program::STDLIB;
use std::path::{Path, PathBuf};

/// Where the stdlib of this build is written: versioned by a hash of its contents, so two
/// builds never share a stale copy.
pub fn default_dir() -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("miles").join(format!("std-{:016x}", content_hash()))
}

fn content_hash() -> u64 {
    miles_compiler::fs::fnv1a64(STDLIB.iter().flat_map(|(k, s)| [k.as_bytes(), s.as_bytes()]))
}

/// Writes every stdlib module under `dir` (read-only) unless already there. Failing to write
/// only costs go-to-definition into the stdlib, so errors are returned for a log line.
pub fn materialize(dir: &Path) -> Result<(), String> {
    for (key, text) in STDLIB {
        let path = file_of(dir, key);
        if path.exists() {
            continue;
        }
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
        }
        // Written whole under a temporary name, then renamed: a second server starting at the
        // same time never sees half a file.
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        std::fs::write(&tmp, text).map_err(|e| format!("{}: {e}", tmp.display()))?;
        if let Ok(meta) = std::fs::metadata(&tmp) {
            let mut perm = meta.permissions();
            perm.set_readonly(true);
            let _ = std::fs::set_permissions(&tmp, perm);
        }
        std::fs::rename(&tmp, &path).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}

/// `std/stages` -> `<dir>/std/stages.miles`.
pub fn file_of(dir: &Path, key: &str) -> PathBuf {
    dir.join(format!("{key}.miles"))
}

/// `<dir>/std/stages.miles` -> `std/stages`, for a path inside the stdlib directory.
pub fn key_of(dir: &Path, path: &Path) -> Option<String> {
    let rel = path.strip_prefix(dir).ok()?;
    let key = rel.to_string_lossy().replace('\\', "/");
    let key = key.strip_suffix(".miles")?.to_string();
    STDLIB.iter().any(|(k, _)| *k == key).then_some(key)
}
