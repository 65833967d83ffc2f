//! The content hash of a package's sources: SHA-256 over every file's relative path and bytes, in
//! sorted order, so the same tree hashes the same on every machine (`.git` is left out).

use sha2::{Digest, Sha256};
use std::path::Path;

/// `sha256:` and 64 hex digits.
pub fn tree(root: &Path) -> std::io::Result<String> {
    let mut files = Vec::new();
    walk(root, root, &mut files)?;
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

/// Relative paths (with `/`) of every regular file under `dir`, skipping `.git`.
pub fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        if name == ".git" {
            continue;
        }
        let path = entry.path();
        let ty = entry.file_type()?;
        if ty.is_dir() {
            walk(root, &path, out)?;
        } else if ty.is_file() {
            let rel = path.strip_prefix(root).unwrap_or(&path);
            out.push(rel.components().map(|c| c.as_os_str().to_string_lossy()).collect::<Vec<_>>().join("/"));
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
}
