//! The source cache (`$MILES_HOME`, else `$XDG_CACHE_HOME/miles`, else `~/.cache/miles`):
//! `git/<url hash>.git` bare mirrors and `src/<name>-<commit>-<url hash>/` exported trees.
//! Every entry is written under a temporary name and renamed into place, so a failed or
//! interrupted fetch never leaves a half-written entry that a later build would trust.

use crate::{git, hash};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

#[derive(Clone, Debug)]
pub struct Cache {
    pub home: PathBuf,
}

static TMP: AtomicU32 = AtomicU32::new(0);

fn tmp_sibling(path: &Path) -> PathBuf {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    path.with_file_name(format!(".{name}.tmp.{}.{}", std::process::id(), TMP.fetch_add(1, Ordering::Relaxed)))
}

impl Cache {
    pub fn from_env() -> Cache {
        let home = if let Some(h) = std::env::var_os("MILES_HOME") {
            PathBuf::from(h)
        } else if let Some(x) = std::env::var_os("XDG_CACHE_HOME") {
            PathBuf::from(x).join("miles")
        } else {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| ".".into())).join(".cache/miles")
        };
        Cache { home }
    }

    fn db_path(&self, url: &str) -> PathBuf {
        self.home.join("git").join(format!("{}.git", hash::short(url)))
    }

    /// The bare mirror of `url`, cloned when absent and fetched again when `refresh`. A URL
    /// outside `url::check`'s forms never reaches git.
    pub fn db(&self, url: &str, refresh: bool) -> Result<PathBuf, String> {
        crate::url::check(url)?;
        let db = self.db_path(url);
        if db.exists() {
            if refresh {
                git::run(
                    Some(&db),
                    &["fetch", "--quiet", "--force", "--tags", "--", url, "+refs/heads/*:refs/heads/*"],
                )?;
            }
            return Ok(db);
        }
        std::fs::create_dir_all(db.parent().unwrap_or(&self.home)).map_err(|e| e.to_string())?;
        let tmp = tmp_sibling(&db);
        let tmp_s = tmp.to_string_lossy().into_owned();
        let r = git::run(None, &["clone", "--quiet", "--bare", "--", url, &tmp_s]);
        if let Err(e) = r {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(e);
        }
        if std::fs::rename(&tmp, &db).is_err() {
            // Another process put it there first; theirs is as good as ours.
            let _ = std::fs::remove_dir_all(&tmp);
        }
        Ok(db)
    }

    /// The bare mirror of `url` if the cache holds one; never clones (an editor's build).
    pub fn cached_db(&self, url: &str) -> Option<PathBuf> {
        Some(self.db_path(url)).filter(|d| d.is_dir())
    }

    /// The exported files of `commit` if the cache holds them; never fetches.
    pub fn cached_source(&self, name: &str, url: &str, commit: &str) -> Option<PathBuf> {
        self.source_path(name, url, commit).ok().filter(|d| d.is_dir())
    }

    /// Where the files of `commit` go: only a package name and a full commit id (both checked
    /// here, whatever the caller read them from) become part of the path.
    pub fn source_path(&self, name: &str, url: &str, commit: &str) -> Result<PathBuf, String> {
        if !crate::manifest::valid_name(name) {
            return Err(format!("`{name}` is not a package name"));
        }
        if !git::is_commit_id(commit) {
            return Err(format!("`{commit}` is not a full commit id"));
        }
        Ok(self.home.join("src").join(format!("{name}-{}-{}", &commit[..12], hash::short(url))))
    }

    /// The files of `commit` of `url`, exported once into the cache.
    pub fn source(&self, name: &str, url: &str, commit: &str) -> Result<PathBuf, String> {
        let dest = self.source_path(name, url, commit)?;
        if dest.is_dir() {
            return Ok(dest);
        }
        let mut db = self.db(url, false)?;
        if git::commit_of(&db, commit).is_err() {
            db = self.db(url, true)?;
            git::commit_of(&db, commit).map_err(|_| format!("commit {commit} is not in {url}"))?;
        }
        std::fs::create_dir_all(dest.parent().unwrap_or(&self.home)).map_err(|e| e.to_string())?;
        let tmp = tmp_sibling(&dest);
        let tar = tmp.with_extension("tar");
        let result = (|| {
            std::fs::create_dir_all(&tmp).map_err(|e| e.to_string())?;
            git::run(Some(&db), &["archive", "--format=tar", "-o", &tar.to_string_lossy(), commit])?;
            run_tar(&tar, &tmp)?;
            read_only(&tmp)?;
            std::fs::rename(&tmp, &dest).map_err(|e| e.to_string())
        })();
        let _ = std::fs::remove_file(&tar);
        if let Err(e) = result {
            let _ = std::fs::remove_dir_all(&tmp);
            if dest.is_dir() {
                return Ok(dest);
            }
            return Err(e);
        }
        Ok(dest)
    }
}

/// Marks every file of an exported source read-only: an editor that opens a dependency's file
/// (go to definition) cannot change what `miles.lock`'s hash pins. The directories stay writable,
/// so the entry can still be deleted to fetch it again.
fn read_only(dir: &Path) -> Result<(), String> {
    let mut files = Vec::new();
    crate::hash::walk(dir, dir, &mut files).map_err(|e| e.to_string())?;
    for rel in files {
        let path = dir.join(&rel);
        let mut perm = std::fs::metadata(&path).map_err(|e| e.to_string())?.permissions();
        perm.set_readonly(true);
        std::fs::set_permissions(&path, perm).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}

fn run_tar(tar: &Path, into: &Path) -> Result<(), String> {
    let out = std::process::Command::new("tar")
        .arg("-xf")
        .arg(tar)
        .arg("-C")
        .arg(into)
        .output()
        .map_err(|e| format!("cannot start tar: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lock's commit and name reach a path only when they are a full commit id and a package
    /// name: a short or multi-byte commit is an error, not a panic, and `../` never joins.
    #[test]
    fn source_paths_take_only_names_and_full_commits() {
        let cache = Cache { home: PathBuf::from("/nonexistent/miles-home") };
        let full = "0123456789abcdef0123456789abcdef01234567";
        let p = cache.source_path("platform", "file:///x", full).expect("valid");
        assert!(p.ends_with(format!("platform-0123456789ab-{}", hash::short("file:///x"))), "{}", p.display());
        for (name, commit) in [
            ("platform", "abc"),
            ("platform", "aaaaaaaaaaa\u{e9}"),
            ("platform", ""),
            ("../../etc", full),
            ("a/b", full),
        ] {
            assert!(cache.source_path(name, "file:///x", commit).is_err(), "{name} {commit}");
            assert!(cache.cached_source(name, "file:///x", commit).is_none());
            assert!(cache.source(name, "file:///x", commit).is_err());
        }
    }

    /// Option-looking and transport-helper URLs are refused before git runs: the command they
    /// carry leaves no file behind.
    #[test]
    fn hostile_urls_never_reach_git() {
        let dir = std::env::temp_dir().join(format!("miles-cache-urls-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("tmp");
        let cache = Cache { home: dir.join("home") };
        let marker = dir.join("ran");
        let m = marker.display();
        for url in [format!("--upload-pack=touch {m}"), format!("ext::sh -c touch% {m}"), format!("-u touch {m}")] {
            for refresh in [false, true] {
                let e = cache.db(&url, refresh).expect_err(&url);
                assert!(e.contains("option") || e.contains("transport helper"), "{url}: {e}");
            }
            assert!(!marker.exists(), "{url} ran a command");
        }
        assert!(!cache.home.join("git").exists(), "nothing was written to the cache");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
