//! The compiler's only door to files. The CLI passes the real file system; tests and the
//! language server pass an in-memory one (the server overlays unsaved editor buffers).

use std::collections::BTreeMap;
use std::sync::Mutex;

pub trait FileSystem: Send + Sync {
    /// The bytes of a file, or a message saying why it cannot be read.
    fn read(&self, path: &str) -> Result<Vec<u8>, String>;
}

/// Files held in memory, keyed by path.
#[derive(Default)]
pub struct MemoryFs {
    files: Mutex<BTreeMap<String, Vec<u8>>>,
}

impl MemoryFs {
    pub fn new() -> MemoryFs {
        MemoryFs::default()
    }
    pub fn with(files: &[(&str, &str)]) -> MemoryFs {
        let fs = MemoryFs::new();
        for (p, t) in files {
            fs.insert(p, t.as_bytes().to_vec());
        }
        fs
    }
    pub fn insert(&self, path: &str, bytes: Vec<u8>) {
        if let Ok(mut m) = self.files.lock() {
            m.insert(normalize(path), bytes);
        }
    }
    pub fn remove(&self, path: &str) {
        if let Ok(mut m) = self.files.lock() {
            m.remove(&normalize(path));
        }
    }
}

impl FileSystem for MemoryFs {
    fn read(&self, path: &str) -> Result<Vec<u8>, String> {
        let m = self.files.lock().map_err(|_| "file table poisoned".to_string())?;
        m.get(&normalize(path)).cloned().ok_or_else(|| "no such file".to_string())
    }
}

/// A file system that reads from a base (the real disk) but prefers overlaid contents: what
/// an editor holds unsaved.
pub struct OverlayFs<'a> {
    pub base: &'a dyn FileSystem,
    pub overlay: &'a MemoryFs,
}

impl FileSystem for OverlayFs<'_> {
    fn read(&self, path: &str) -> Result<Vec<u8>, String> {
        self.overlay.read(path).or_else(|_| self.base.read(path))
    }
}

/// Joins and normalises `/`-separated paths lexically (`a/./b/../c` -> `a/c`).
pub fn normalize(path: &str) -> String {
    let absolute = path.starts_with('/');
    let mut parts: Vec<&str> = Vec::new();
    for seg in path.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                if matches!(parts.last(), Some(p) if *p != "..") {
                    parts.pop();
                } else if !absolute {
                    parts.push("..");
                }
            }
            s => parts.push(s),
        }
    }
    let joined = parts.join("/");
    if absolute {
        format!("/{joined}")
    } else if joined.is_empty() {
        ".".into()
    } else {
        joined
    }
}

pub fn parent_dir(path: &str) -> String {
    match path.rfind('/') {
        Some(0) => "/".into(),
        Some(i) => path[..i].to_string(),
        None => ".".into(),
    }
}

pub fn join(dir: &str, rel: &str) -> String {
    if rel.starts_with('/') {
        normalize(rel)
    } else {
        normalize(&format!("{dir}/{rel}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn normalizes() {
        assert_eq!(normalize("a/./b/../c"), "a/c");
        assert_eq!(normalize("../x"), "../x");
        assert_eq!(normalize("/a/../../b"), "/b");
        assert_eq!(join("recipes", "../lib/x.miles"), "lib/x.miles");
        assert_eq!(parent_dir("a/b.miles"), "a");
        assert_eq!(parent_dir("b.miles"), ".");
    }
}
