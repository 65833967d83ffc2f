//! Files the CLI reads and writes: the compiler's one real-disk `FileSystem` (shared with the
//! language server), and atomic writes.

pub use miles_compiler::fs::DiskFs;

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
