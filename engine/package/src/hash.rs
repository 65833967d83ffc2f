//! The content hash of a package's sources: SHA-256 over every file's relative path and bytes, in
//! sorted order, so the same tree hashes the same on every machine (`.git` is left out).
//! A symbolic link is refused rather than hashed: what it points at is not part of the tree, so
//! the hash could not pin what an import through it reads.

use sha2::{Digest, Sha256};
use std::path::Path;

/// Why a tree has no hash.
#[derive(Debug)]
pub enum TreeError {
    Io(std::io::Error),
    /// A symbolic link, by its path relative to the root.
    Symlink(String),
}

impl From<std::io::Error> for TreeError {
    fn from(e: std::io::Error) -> TreeError {
        TreeError::Io(e)
    }
}

/// `sha256:` and 64 hex digits.
pub fn tree(root: &Path) -> Result<String, TreeError> {
    let mut files = Vec::new();
    let mut links = Vec::new();
    visit(root, root, &mut files, &mut links)?;
    if let Some(first) = links.into_iter().min() {
        return Err(TreeError::Symlink(first));
    }
    files.sort();
    let mut h = Sha256::new();
    for rel in &files {
        let bytes = std::fs::read(root.join(rel))?;
        h.update(rel.as_bytes());
        h.update([0]);
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(&bytes);
    }
    Ok(format!("sha256:{}", hex(&h.finalize())))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Short hex of a string, for cache directory names.
pub fn short(s: &str) -> String {
    hex(&Sha256::digest(s.as_bytes()))[..16].to_string()
}

/// Relative paths (with `/`) of every regular file under `dir`, skipping `.git` (and symbolic
/// links, which `tree` refuses).
pub fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) -> std::io::Result<()> {
    visit(root, dir, out, &mut Vec::new())
}

/// `walk`, also listing the symbolic links it met in `links`.
fn visit(root: &Path, dir: &Path, out: &mut Vec<String>, links: &mut Vec<String>) -> std::io::Result<()> {
    let rel = |path: &Path| {
        let rel = path.strip_prefix(root).unwrap_or(path);
        rel.components().map(|c| c.as_os_str().to_string_lossy()).collect::<Vec<_>>().join("/")
    };
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        if name == ".git" {
            continue;
        }
        let path = entry.path();
        let ty = entry.file_type()?;
        if ty.is_dir() {
            visit(root, &path, out, links)?;
        } else if ty.is_file() {
            out.push(rel(&path));
        } else if ty.is_symlink() {
            links.push(rel(&path));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_tree_same_hash_and_any_change_shows() {
        let base = std::env::temp_dir().join(format!("miles-hash-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        for d in ["a", "b"] {
            std::fs::create_dir_all(base.join(d).join("sub")).unwrap();
            std::fs::write(base.join(d).join("x.miles"), "const a = 1\n").unwrap();
            std::fs::write(base.join(d).join("sub/y.miles"), "const b = 2\n").unwrap();
        }
        std::fs::create_dir_all(base.join("b/.git")).unwrap();
        std::fs::write(base.join("b/.git/HEAD"), "ignored").unwrap();
        let (a, b) = (tree(&base.join("a")).unwrap(), tree(&base.join("b")).unwrap());
        assert_eq!(a, b);
        assert!(a.starts_with("sha256:") && a.len() == 71);
        std::fs::write(base.join("b/sub/y.miles"), "const b = 3\n").unwrap();
        assert_ne!(a, tree(&base.join("b")).unwrap());
        let _ = std::fs::remove_dir_all(&base);
    }

    /// A symbolic link anywhere in the tree (to a file outside it, or inside it) has no hash.
    #[cfg(unix)]
    #[test]
    fn a_symbolic_link_is_refused() {
        let base = std::env::temp_dir().join(format!("miles-hash-link-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(base.join("pkg/grpo")).unwrap();
        std::fs::write(base.join("secret.miles"), "const s = 1\n").unwrap();
        std::fs::write(base.join("pkg/x.miles"), "const a = 1\n").unwrap();
        std::os::unix::fs::symlink("../../secret.miles", base.join("pkg/grpo/base.miles")).unwrap();
        match tree(&base.join("pkg")) {
            Err(TreeError::Symlink(p)) => assert_eq!(p, "grpo/base.miles"),
            other => panic!("expected a refused link, got {other:?}"),
        }
        let _ = std::fs::remove_dir_all(&base);
    }
}
