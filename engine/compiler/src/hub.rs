//! The local Hugging Face Hub cache, read offline: `hf { repo = "ORG/NAME", revision }` names a
//! model the way users do, and this resolves it to the snapshot directory huggingface_hub wrote,
//! by huggingface_hub's own rules (its `constants.py` and `try_to_load_from_cache`):
//!
//! - the cache root is `HF_HUB_CACHE`, else `HUGGINGFACE_HUB_CACHE` (the older name), else
//!   `$HF_HOME/hub`, else `$XDG_CACHE_HOME/huggingface/hub`, else `~/.cache/huggingface/hub`,
//!   with `~` and `$VAR` expanded as `os.path.expanduser` / `expandvars` do;
//! - repository `ORG/NAME` lives in `models--ORG--NAME/`;
//! - a revision that names a file under `refs/` (a branch or tag: `main`, `v1.0`, `pr/1`) is
//!   the commit hash that file holds; any other revision is a snapshot name (a commit hash);
//! - the files are `snapshots/<commit>/<file>`, usually symbolic links into `blobs/`.
//!
//! Pure: the environment comes in as a lookup function (the CLI and the language server pass
//! the process's), the files through the `FileSystem`. Nothing here downloads: a model that is
//! not in the cache is an error that says how to download it.

use crate::fs::{join, FileSystem};

/// The cache root from environment variables (`var` looks one up; empty counts as unset, as
/// the shell's `VAR=` usually means), or None when not even a home directory is known.
pub fn cache_root(var: &dyn Fn(&str) -> Option<String>) -> Option<String> {
    let get = |k: &str| var(k).filter(|v| !v.is_empty());
    let expand = |p: String| expand_vars(&expand_user(&p, &get), &get);
    if let Some(p) = get("HF_HUB_CACHE").or_else(|| get("HUGGINGFACE_HUB_CACHE")) {
        return Some(expand(p));
    }
    let home = match get("HF_HOME") {
        Some(h) => expand(h),
        None => {
            let xdg = get("XDG_CACHE_HOME").or_else(|| get("HOME").map(|h| format!("{h}/.cache")))?;
            expand(format!("{xdg}/huggingface"))
        }
    };
    Some(format!("{}/hub", home.trim_end_matches('/')))
}

/// `~` or `~/...` at the start, as `os.path.expanduser` (with `HOME`).
fn expand_user(p: &str, get: &dyn Fn(&str) -> Option<String>) -> String {
    match (p.strip_prefix('~'), get("HOME")) {
        (Some(rest), Some(home)) if rest.is_empty() || rest.starts_with('/') => format!("{home}{rest}"),
        _ => p.to_string(),
    }
}

/// `$NAME` and `${NAME}`, as `os.path.expandvars`: an unset variable stays as written.
fn expand_vars(p: &str, get: &dyn Fn(&str) -> Option<String>) -> String {
    let mut out = String::new();
    let mut rest = p;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        let (name, len) = match after.strip_prefix('{') {
            Some(b) => match b.find('}') {
                Some(j) => (&b[..j], j + 2),
                None => ("", 0),
            },
            None => {
                let n = after.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(after.len());
                (&after[..n], n)
            }
        };
        match get(name).filter(|_| !name.is_empty()) {
            Some(v) => out.push_str(&v),
            None => out.push_str(&rest[i..i + 1 + len]),
        }
        rest = &after[len..];
    }
    out.push_str(rest);
    out
}

/// Why a repository did not resolve: the message (naming where it looked) and what to do.
#[derive(Clone, Debug, PartialEq)]
pub struct HubError {
    pub message: String,
    pub help: String,
}

/// `models--ORG--NAME`: huggingface_hub's folder name for a model repository.
pub fn repo_folder(repo: &str) -> Result<String, String> {
    let parts: Vec<&str> = repo.split('/').collect();
    let ok_part = |p: &&str| {
        !p.is_empty() && *p != "." && *p != ".." && p.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    };
    if parts.len() > 2 || !parts.iter().all(ok_part) {
        return Err(format!(
            "`{repo}` is not a Hub repository id: write \"ORG/NAME\" (letters, digits, `-`, `_`, `.`)"
        ));
    }
    Ok(format!("models--{}", parts.join("--")))
}

fn download_help(repo: &str, revision: &str) -> String {
    let rev = if revision == "main" { String::new() } else { format!(" --revision {revision}") };
    format!(
        "download it while online: `hf download {repo}{rev}` (or `huggingface-cli download {repo}{rev}`), \
         then run offline; set HF_HUB_CACHE or HF_HOME if the cache lives elsewhere"
    )
}

/// The snapshot directory of `repo` at `revision` under the cache `root`, after checking that
/// the files a run reads there are not dangling links (an interrupted download).
pub fn resolve(fs: &dyn FileSystem, root: &str, repo: &str, revision: &str) -> Result<String, HubError> {
    let err = |message: String| HubError { message, help: download_help(repo, revision) };
    let folder = repo_folder(repo)
        .map_err(|m| HubError { message: m, help: "for example repo = \"Qwen/Qwen3-0.6B\"".into() })?;
    let repo_dir = join(root, &folder);
    if !fs.is_dir(&repo_dir) {
        return Err(err(format!("`{repo}` is not in the Hugging Face cache: no {repo_dir}")));
    }
    if revision.is_empty() || revision.split('/').any(|s| s.is_empty() || s == "." || s == "..") {
        return Err(HubError {
            message: format!("revision \"{revision}\" is not a branch, tag or commit"),
            help: "revision = \"main\" (the default), a tag, or a 40-character commit hash".into(),
        });
    }
    let ref_file = join(&repo_dir, &format!("refs/{revision}"));
    let commit = match fs.read(&ref_file) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes).trim().to_string();
            if text.is_empty() || text.contains(['/', '\\']) || text == "." || text == ".." {
                return Err(err(format!("{ref_file} does not hold a commit hash")));
            }
            text
        }
        Err(_) => revision.to_string(),
    };
    let snapshot = join(&repo_dir, &format!("snapshots/{commit}"));
    if !fs.is_dir(&snapshot) {
        let refs = fs.list_dir(&join(&repo_dir, "refs"));
        let snaps = fs.list_dir(&join(&repo_dir, "snapshots"));
        let listed = |v: &[String]| if v.is_empty() { "none".to_string() } else { v.join(", ") };
        let message = if commit == revision {
            format!(
                "`{repo}` has no revision \"{revision}\" in the Hugging Face cache: no {ref_file} and no {snapshot} \
                 (refs: {}; snapshots: {})",
                listed(&refs),
                listed(&snaps)
            )
        } else {
            format!("{ref_file} says commit {commit}, but {snapshot} is not there (an incomplete download)")
        };
        return Err(err(message));
    }
    check_files(fs, &snapshot).map_err(err)?;
    Ok(snapshot)
}

/// The files a run reads from a snapshot, where present, must not be dangling links.
fn check_files(fs: &dyn FileSystem, dir: &str) -> Result<(), String> {
    let mut files: Vec<String> = ["config.json", "model.safetensors", "model.safetensors.index.json", "tokenizer.json"]
        .map(str::to_string)
        .to_vec();
    files.extend(["tokenizer_config.json", "generation_config.json"].map(str::to_string));
    let index = join(dir, "model.safetensors.index.json");
    if let Ok(bytes) = fs.read(&index) {
        // The shards the index names; a malformed index is the loader's error to report.
        if let Ok(serde_json::Value::Object(o)) = serde_json::from_slice::<serde_json::Value>(&bytes) {
            let mut shards: Vec<String> = o
                .get("weight_map")
                .and_then(|m| m.as_object())
                .map(|m| m.values().filter_map(|v| v.as_str().map(str::to_string)).collect())
                .unwrap_or_default();
            shards.sort();
            shards.dedup();
            files.extend(shards.into_iter().filter(|s| !s.contains("..")));
        }
    }
    for f in files {
        let path = join(dir, &f);
        if let Some(target) = fs.read_link(&path) {
            if !fs.exists(&path) {
                return Err(format!(
                    "{path} is a link to {target}, which is missing (an interrupted download left the snapshot incomplete)"
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::MemoryFs;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn cache_root_follows_huggingface_hub() {
        let root = |pairs: &[(&str, &str)]| cache_root(&env(pairs));
        assert_eq!(root(&[("HOME", "/h")]), Some("/h/.cache/huggingface/hub".into()));
        assert_eq!(root(&[("HOME", "/h"), ("XDG_CACHE_HOME", "/x")]), Some("/x/huggingface/hub".into()));
        assert_eq!(root(&[("HOME", "/h"), ("XDG_CACHE_HOME", "/x"), ("HF_HOME", "/f/")]), Some("/f/hub".into()));
        assert_eq!(root(&[("HF_HOME", "/f"), ("HUGGINGFACE_HUB_CACHE", "/old")]), Some("/old".into()));
        assert_eq!(
            root(&[("HF_HOME", "/f"), ("HUGGINGFACE_HUB_CACHE", "/old"), ("HF_HUB_CACHE", "/c")]),
            Some("/c".into())
        );
        // `~` and `$VAR`, as expanduser / expandvars; an unset variable stays.
        assert_eq!(root(&[("HOME", "/h"), ("HF_HOME", "~/hf")]), Some("/h/hf/hub".into()));
        assert_eq!(root(&[("D", "/d"), ("HF_HUB_CACHE", "${D}/c/$D/$NOPE")]), Some("/d/c//d/$NOPE".into()));
        // Empty is unset; no home at all: unknown.
        assert_eq!(root(&[("HOME", "/h"), ("HF_HUB_CACHE", "")]), Some("/h/.cache/huggingface/hub".into()));
        assert_eq!(root(&[]), None);
    }

    #[test]
    fn repo_folders() {
        assert_eq!(repo_folder("Qwen/Qwen3-0.6B").unwrap(), "models--Qwen--Qwen3-0.6B");
        assert_eq!(repo_folder("gpt2").unwrap(), "models--gpt2");
        for bad in ["a/b/c", "../x", "a/", "", "a b/c"] {
            assert!(repo_folder(bad).is_err(), "{bad}");
        }
    }

    const HASH: &str = "0123456789abcdef0123456789abcdef01234567";

    /// A cache as huggingface_hub writes one: refs/main, snapshot files linked into blobs/.
    fn cache() -> MemoryFs {
        let fs = MemoryFs::new();
        let repo = "hub/models--tiny--qwen3";
        fs.insert(&format!("{repo}/refs/main"), HASH.as_bytes().to_vec());
        fs.insert(&format!("{repo}/blobs/c0"), b"{}".to_vec());
        fs.insert(&format!("{repo}/blobs/w0"), b"weights".to_vec());
        fs.link(&format!("{repo}/snapshots/{HASH}/config.json"), "../../blobs/c0");
        fs.link(&format!("{repo}/snapshots/{HASH}/model.safetensors"), "../../blobs/w0");
        fs
    }

    #[test]
    fn resolves_refs_and_commits() {
        let fs = cache();
        let want = format!("hub/models--tiny--qwen3/snapshots/{HASH}");
        assert_eq!(resolve(&fs, "hub", "tiny/qwen3", "main"), Ok(want.clone()));
        assert_eq!(resolve(&fs, "hub", "tiny/qwen3", HASH), Ok(want.clone()));
        assert_eq!(fs.read(&format!("{want}/config.json")).unwrap(), b"{}");
    }

    #[test]
    fn says_what_is_missing() {
        let fs = cache();
        let e = resolve(&fs, "hub", "tiny/llama", "main").unwrap_err();
        assert_eq!(e.message, "`tiny/llama` is not in the Hugging Face cache: no hub/models--tiny--llama");
        assert!(e.help.contains("hf download tiny/llama`"), "{}", e.help);
        let e = resolve(&fs, "hub", "tiny/qwen3", "v2").unwrap_err();
        assert!(e.message.contains("has no revision \"v2\""), "{}", e.message);
        assert!(e.message.contains(&format!("refs: main; snapshots: {HASH}")), "{}", e.message);
        assert!(e.help.contains("hf download tiny/qwen3 --revision v2"), "{}", e.help);
        for bad in ["../x", ".", "a//b"] {
            let e = resolve(&fs, "hub", "tiny/qwen3", bad).unwrap_err();
            assert!(e.message.contains("is not a branch"), "{}", e.message);
        }
    }

    #[test]
    fn dangling_links_are_named() {
        let fs = cache();
        fs.remove("hub/models--tiny--qwen3/blobs/w0");
        let e = resolve(&fs, "hub", "tiny/qwen3", "main").unwrap_err();
        assert_eq!(
            e.message,
            format!(
                "hub/models--tiny--qwen3/snapshots/{HASH}/model.safetensors is a link to ../../blobs/w0, which is \
                 missing (an interrupted download left the snapshot incomplete)"
            )
        );
    }

    #[test]
    fn a_ref_to_a_missing_snapshot() {
        let fs = cache();
        fs.insert("hub/models--tiny--qwen3/refs/v1", b"feedface".to_vec());
        let e = resolve(&fs, "hub", "tiny/qwen3", "v1").unwrap_err();
        assert!(e.message.contains("refs/v1 says commit feedface, but"), "{}", e.message);
    }

    /// The real disk, with real symbolic links, as `miles check` sees a cache.
    #[cfg(unix)]
    #[test]
    fn on_disk_with_symlinks() {
        let root = std::env::temp_dir().join(format!("miles-hub-{}", std::process::id()));
        let repo = root.join("models--tiny--qwen3");
        let snap = repo.join("snapshots").join(HASH);
        std::fs::create_dir_all(&snap).unwrap();
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        std::fs::create_dir_all(repo.join("blobs")).unwrap();
        std::fs::write(repo.join("refs/main"), HASH).unwrap();
        std::fs::write(repo.join("blobs/c0"), "{}").unwrap();
        std::os::unix::fs::symlink("../../blobs/c0", snap.join("config.json")).unwrap();
        std::os::unix::fs::symlink("../../blobs/gone", snap.join("tokenizer.json")).unwrap();
        let disk = crate::fs::DiskFs;
        let r = root.to_string_lossy().to_string();
        let e = resolve(&disk, &r, "tiny/qwen3", "main").unwrap_err();
        assert!(e.message.ends_with("tokenizer.json is a link to ../../blobs/gone, which is missing (an interrupted download left the snapshot incomplete)"), "{}", e.message);
        std::fs::remove_file(snap.join("tokenizer.json")).unwrap();
        assert_eq!(resolve(&disk, &r, "tiny/qwen3", "main"), Ok(snap.to_string_lossy().to_string()));
        std::fs::remove_dir_all(&root).unwrap();
    }
}
