//! The compiler's only door to files. The CLI passes the real file system (`DiskFs`); tests pass
//! an in-memory one; the language server overlays unsaved editor buffers on the disk.
//!
//! The compiler itself never touches the disk: `DiskFs` lives here, beside the trait, only so
//! the CLI and the language server share one implementation with one set of guards.

use std::collections::BTreeMap;
use std::sync::Mutex;

pub trait FileSystem: Send + Sync {
    /// The bytes of a file, or a message saying why it cannot be read.
    fn read(&self, path: &str) -> Result<Vec<u8>, String>;

    /// Whether a file (or directory) is there, without reading it (a checkpoint shard may be
    /// gigabytes).
    fn exists(&self, path: &str) -> bool {
        self.read(path).is_ok()
    }

    /// At most the first `max` bytes of a file: a safetensors header without its tensors. The
    /// default reads the whole file; `DiskFs` reads only the prefix.
    fn read_prefix(&self, path: &str, max: usize) -> Result<Vec<u8>, String> {
        let mut bytes = self.read(path)?;
        bytes.truncate(max);
        Ok(bytes)
    }

    /// Whether `path` is a directory (following symbolic links). File systems that know no
    /// directories answer false.
    fn is_dir(&self, _path: &str) -> bool {
        false
    }

    /// Where a symbolic link points, unresolved; None when `path` is not a link. With `exists`
    /// it tells a dangling link (an interrupted Hub download) from a missing file.
    fn read_link(&self, _path: &str) -> Option<String> {
        None
    }

    /// The names in a directory, sorted (empty when it cannot be listed): what an error offers
    /// instead of a missing name, and where `parquet_files` looks for shards.
    fn list_dir(&self, _path: &str) -> Vec<String> {
        Vec::new()
    }
}

/// The real disk, read-only: the one implementation that touches it (the CLI and the language
/// server both use it).
pub struct DiskFs;

/// Files larger than this are refused before reading them whole (the parser's own limit is
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

    fn exists(&self, path: &str) -> bool {
        std::fs::metadata(path).is_ok()
    }

    fn read_prefix(&self, path: &str, max: usize) -> Result<Vec<u8>, String> {
        use std::io::Read;
        let f = std::fs::File::open(path).map_err(|e| e.to_string())?;
        if f.metadata().map_err(|e| e.to_string())?.is_dir() {
            return Err("it is a directory".into());
        }
        let mut out = Vec::new();
        f.take(max as u64).read_to_end(&mut out).map_err(|e| e.to_string())?;
        Ok(out)
    }

    fn is_dir(&self, path: &str) -> bool {
        std::fs::metadata(path).is_ok_and(|m| m.is_dir())
    }

    fn read_link(&self, path: &str) -> Option<String> {
        std::fs::read_link(path).ok().map(|p| p.to_string_lossy().into_owned())
    }

    fn list_dir(&self, path: &str) -> Vec<String> {
        // Bounded against a pathological directory, but far above any dataset's shard count:
        // `parquet_files` decides from this listing whether a directory holds shards.
        let mut names: Vec<String> = std::fs::read_dir(path)
            .map(|d| d.flatten().take(100_000).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        names.sort();
        names
    }
}

impl DiskFs {
    /// Writes a file atomically, the language tools' one way to write (formatted sources,
    /// `miles.lock`, plans, reports, docs): a temporary file beside `path` (with `path`'s
    /// permissions when it exists), fsync, then rename, so a crash or a full disk never leaves a
    /// half-written file where a good one was. The engine's writes (checkpoints, weights) have
    /// their own in `miles_runtime::atomic_write`.
    pub fn write_atomic(path: impl AsRef<std::path::Path>, bytes: &[u8]) -> std::io::Result<()> {
        use std::io::Write;
        let target = path.as_ref();
        let dir = target.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
        let name = target.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "out".into());
        let tmp = dir.join(format!(".{name}.tmp.{}", std::process::id()));
        let result = (|| {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(bytes)?;
            if let Ok(meta) = std::fs::metadata(target) {
                f.set_permissions(meta.permissions())?;
            }
            f.sync_all()?;
            std::fs::rename(&tmp, target)
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result
    }
}

/// FNV-1a, 64-bit, of the concatenation of `parts`: a content hash that is stable across runs
/// and platforms (unlike `DefaultHasher`) and needs no dependency; not for security. The saved
/// plan's source hashes and the editor's stdlib directory name both use it.
pub fn fnv1a64<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for part in parts {
        for b in part {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x100000001b3);
        }
    }
    h
}

/// Files held in memory, keyed by path, and symbolic links (path -> target, relative to the
/// link's directory or absolute), so tests can build a Hub cache with a dangling link.
#[derive(Default)]
pub struct MemoryFs {
    files: Mutex<BTreeMap<String, Vec<u8>>>,
    links: Mutex<BTreeMap<String, String>>,
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
    /// A symbolic link at `path` to `target` (relative to `path`'s directory, or absolute).
    pub fn link(&self, path: &str, target: &str) {
        if let Ok(mut m) = self.links.lock() {
            m.insert(normalize(path), target.to_string());
        }
    }

    /// `path` with its links followed (at most 40, as Linux's limit).
    fn resolve(&self, path: &str) -> String {
        let mut p = normalize(path);
        let Ok(links) = self.links.lock() else { return p };
        for _ in 0..40 {
            match links.get(&p) {
                Some(t) => p = join(&parent_dir(&p), t),
                None => break,
            }
        }
        p
    }
}

impl FileSystem for MemoryFs {
    fn read(&self, path: &str) -> Result<Vec<u8>, String> {
        let path = self.resolve(path);
        let m = self.files.lock().map_err(|_| "file table poisoned".to_string())?;
        m.get(&path).cloned().ok_or_else(|| "no such file".to_string())
    }

    fn exists(&self, path: &str) -> bool {
        self.read(path).is_ok() || self.is_dir(path)
    }

    fn is_dir(&self, path: &str) -> bool {
        let prefix = format!("{}/", self.resolve(path));
        self.files.lock().is_ok_and(|m| m.keys().any(|k| k.starts_with(&prefix)))
            || self.links.lock().is_ok_and(|m| m.keys().any(|k| k.starts_with(&prefix)))
    }

    fn read_link(&self, path: &str) -> Option<String> {
        self.links.lock().ok()?.get(&normalize(path)).cloned()
    }

    fn list_dir(&self, path: &str) -> Vec<String> {
        let prefix = format!("{}/", self.resolve(path));
        let mut names = std::collections::BTreeSet::new();
        let mut add = |k: &String| {
            if let Some(rest) = k.strip_prefix(&prefix) {
                names.insert(rest.split('/').next().unwrap_or(rest).to_string());
            }
        };
        if let Ok(m) = self.files.lock() {
            m.keys().for_each(&mut add);
        }
        if let Ok(m) = self.links.lock() {
            m.keys().for_each(&mut add);
        }
        names.into_iter().collect()
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

    fn exists(&self, path: &str) -> bool {
        self.overlay.exists(path) || self.base.exists(path)
    }

    fn read_prefix(&self, path: &str, max: usize) -> Result<Vec<u8>, String> {
        self.overlay.read_prefix(path, max).or_else(|_| self.base.read_prefix(path, max))
    }

    fn is_dir(&self, path: &str) -> bool {
        self.overlay.is_dir(path) || self.base.is_dir(path)
    }

    fn read_link(&self, path: &str) -> Option<String> {
        self.overlay.read_link(path).or_else(|| self.base.read_link(path))
    }

    fn list_dir(&self, path: &str) -> Vec<String> {
        let mut names = self.base.list_dir(path);
        names.extend(self.overlay.list_dir(path));
        names.sort();
        names.dedup();
        names
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

    #[test]
    fn fnv1a64_is_the_published_function() {
        // Test vectors of the FNV reference (isthe.com/chongo/tech/comp/fnv).
        assert_eq!(fnv1a64([b"".as_slice()]), 0xcbf29ce484222325);
        assert_eq!(fnv1a64([b"a".as_slice()]), 0xaf63dc4c8601ec8c);
        assert_eq!(fnv1a64([b"foo".as_slice()]), 0xdcb27518fed9d577);
        assert_eq!(fnv1a64([b"fo".as_slice(), b"o".as_slice()]), fnv1a64([b"foo".as_slice()]));
    }

    #[test]
    fn disk_refuses_directories() {
        let dir = std::env::temp_dir();
        let err = DiskFs.read(&dir.to_string_lossy()).err().unwrap_or_default();
        assert_eq!(err, "it is a directory");
    }
}
