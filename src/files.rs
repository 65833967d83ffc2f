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
