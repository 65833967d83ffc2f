//! Files the CLI reads and writes: the compiler's one real-disk `FileSystem` (shared with the
//! language server), and atomic writes.

pub use miles_compiler::fs::DiskFs;

/// Writes a file atomically (temporary file, fsync, rename): `DiskFs::write_atomic`.
pub fn write_atomic(path: &str, bytes: &[u8]) -> std::io::Result<()> {
    DiskFs::write_atomic(path, bytes)
}
