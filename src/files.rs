//! The real file system behind the compiler's `FileSystem` trait.

use miles_compiler::fs::FileSystem;

pub struct DiskFs;

/// Recipes larger than this are refused before reading them whole (the parser's own limit is
/// lower; this only guards memory).
const MAX_READ: u64 = 64 << 20;

impl FileSystem for DiskFs {
    fn read(&self, path: &str) -> Result<Vec<u8>, String> {
        let meta = std::fs::metadata(path).map_err(|e| e.to_string())?;
        if meta.is_dir() {
            return Err("it is a directory".into());
        }
        if meta.len() > MAX_READ {
            return Err(format!("it is {} bytes; the limit is {MAX_READ}", meta.len()));
        }
        std::fs::read(path).map_err(|e| e.to_string())
    }
}

/// Writes a file atomically: a temporary file in the same directory, fsync, then rename, so a
/// crash or a full disk never leaves a half-written file where a good one was.
pub fn write_atomic(path: &str, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let target = std::path::Path::new(path);
    let dir = target.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
    let name = target.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "out".into());
    let tmp = dir.join(format!(".{name}.tmp.{}", std::process::id()));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, target)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}
