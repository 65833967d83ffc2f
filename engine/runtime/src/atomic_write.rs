//! Writes that survive a kill, the engine side's one implementation (the language tools have
//! `DiskFs::write_atomic`): a temporary file (or directory) beside the target is filled, synced,
//! then renamed over it, so a reader sees the old content or the new, never a torn one, and a
//! failed write (a full disk) leaves the old one as it was.

use crate::{RunError, E_CHECKPOINT};
use std::fs;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

/// Writes JSON atomically (temp file, fsync, rename).
pub fn write_json<T: serde::Serialize>(path: &Path, v: &T) -> Result<(), RunError> {
    let text =
        serde_json::to_string_pretty(v).map_err(|e| RunError::new(E_CHECKPOINT, format!("cannot serialise: {e}")))?;
    write_atomically(path, text.as_bytes())
}

pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), RunError> {
    write_with(path, |w| w.write_all(bytes)).map_err(|e| RunError::io(E_CHECKPOINT, "cannot write", path, e))
}

fn temp_beside(path: &Path) -> PathBuf {
    path.with_extension(format!("tmp-{}", std::process::id()))
}

/// Streams into a temporary file beside `path` through a small buffer (payload chunks larger than
/// it go straight to the file), fsyncs it once after its last byte and renames it over `path`.
/// The directory is not synced: a caller renaming many files syncs it once for all.
pub fn write_with(path: &Path, fill: impl FnOnce(&mut BufWriter<fs::File>) -> io::Result<()>) -> io::Result<()> {
    let tmp = temp_beside(path);
    let res = (|| {
        let mut w = BufWriter::with_capacity(64 << 10, fs::File::create(&tmp)?);
        fill(&mut w)?;
        w.flush()?;
        let f = w.into_inner().map_err(|e| e.into_error())?;
        f.sync_all()?;
        drop(f);
        fs::rename(&tmp, path)
    })();
    if res.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    res
}

/// A file another library writes by path (safetensors): `fill` writes the temporary path, which
/// is then synced and renamed over `path`.
pub fn replace_file(path: &Path, fill: impl FnOnce(&Path) -> Result<(), RunError>) -> Result<(), RunError> {
    let tmp = temp_beside(path);
    let res = fill(&tmp).and_then(|_| {
        fs::File::open(&tmp)
            .and_then(|f| f.sync_all())
            .and_then(|_| fs::rename(&tmp, path))
            .map_err(|e| RunError::io(E_CHECKPOINT, "cannot write", path, e))
    });
    if res.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    res
}

/// Fills a fresh temp directory with `fill`, syncs it whole, then renames it over `dir` (replacing
/// an older one, which is put back if the rename fails) and syncs the parent (the new name).
pub fn write_dir_atomically(dir: &Path, fill: impl FnOnce(&Path) -> Result<(), RunError>) -> Result<(), RunError> {
    let name = dir.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_else(|| "dir".into());
    let parent = dir.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    fs::create_dir_all(parent).map_err(|e| RunError::io(E_CHECKPOINT, "cannot create", parent, e))?;
    let tmp = parent.join(format!(".{name}.tmp-{}", std::process::id()));
    let _ = fs::remove_dir_all(&tmp);
    fs::create_dir_all(&tmp).map_err(|e| RunError::io(E_CHECKPOINT, "cannot create", &tmp, e))?;
    // Files other libraries write by path (safetensors) are not synced by them: every file and
    // directory is synced here, before the rename publishes them, so a crash after it cannot leave
    // a published directory with torn or empty files.
    if let Err(e) =
        fill(&tmp).and_then(|_| sync_tree(&tmp).map_err(|e| RunError::io(E_CHECKPOINT, "cannot sync", &tmp, e)))
    {
        let _ = fs::remove_dir_all(&tmp);
        return Err(e);
    }
    // Directory renames cannot replace a non-empty directory: move the old one aside first.
    let old = parent.join(format!(".{name}.old-{}", std::process::id()));
    let had_old = dir.exists();
    if had_old {
        let _ = fs::remove_dir_all(&old);
        fs::rename(dir, &old).map_err(|e| RunError::io(E_CHECKPOINT, "cannot replace", dir, e))?;
    }
    if let Err(e) = fs::rename(&tmp, dir) {
        if had_old {
            let _ = fs::rename(&old, dir);
        }
        let _ = fs::remove_dir_all(&tmp);
        return Err(RunError::io(E_CHECKPOINT, "cannot rename into", dir, e));
    }
    let _ = fs::remove_dir_all(&old);
    if let Ok(d) = fs::File::open(parent) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Fsyncs every file and directory under `dir`, `dir` included (its entries: the names).
fn sync_tree(dir: &Path) -> io::Result<()> {
    for e in fs::read_dir(dir)? {
        let p = e?.path();
        if p.is_dir() {
            sync_tree(&p)?;
        } else {
            // Read-only is enough: fsync flushes the file's data whoever wrote it.
            fs::File::open(&p)?.sync_all()?;
        }
    }
    fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_fill_leaves_the_old_file_and_directory_and_no_temporary() {
        let dir = std::env::temp_dir().join(format!("miles-atomic-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let file = dir.join("w.bin");
        write_atomically(&file, b"old").unwrap();
        let err = write_with(&file, |w| {
            w.write_all(b"torn")?;
            Err(io::Error::other("disk full"))
        });
        assert!(err.is_err());
        assert!(replace_file(&file, |_| Err(RunError::new(E_CHECKPOINT, "no"))).is_err());
        assert_eq!(fs::read(&file).unwrap(), b"old");
        let model = dir.join("model");
        write_dir_atomically(&model, |t| write_atomically(&t.join("a"), b"1")).unwrap();
        assert!(write_dir_atomically(&model, |_| Err(RunError::new(E_CHECKPOINT, "no"))).is_err());
        assert_eq!(fs::read(model.join("a")).unwrap(), b"1");
        replace_file(&file, |t| fs::write(t, b"new").map_err(|e| RunError::io(E_CHECKPOINT, "w", t, e))).unwrap();
        assert_eq!(fs::read(&file).unwrap(), b"new");
        let mut left: Vec<String> =
            fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        left.sort();
        assert_eq!(left, ["model", "w.bin"], "no temporary left behind");
        let _ = fs::remove_dir_all(&dir);
    }
}
