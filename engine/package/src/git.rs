//! Git through the `git` command line: every call has a timeout, never prompts, may use only
//! the protocols of `url::GIT_PROTOCOLS`, and gets URLs and paths after `--` (callers check
//! URLs with `url::check` and commit ids with `is_commit_id` first).

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long one git command may take (`MILES_GIT_TIMEOUT` seconds; default 300).
fn timeout() -> Duration {
    let secs = std::env::var("MILES_GIT_TIMEOUT").ok().and_then(|s| s.parse().ok()).unwrap_or(300);
    Duration::from_secs(secs)
}

/// Runs `git ARGS` (in `dir` when given); its stdout, or its stderr's last line as the error.
pub fn run(dir: Option<&Path>, args: &[&str]) -> Result<String, String> {
    let mut cmd = Command::new("git");
    if let Some(d) = dir {
        cmd.current_dir(d);
    }
    cmd.args(args)
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_ASKPASS", "true")
        .env("GIT_ALLOW_PROTOCOL", crate::url::GIT_PROTOCOLS)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|e| format!("cannot start git: {e}"))?;
    // Readers on their own threads, so a full pipe never blocks the child while we wait.
    let mut out = child.stdout.take();
    let mut err = child.stderr.take();
    let out_t = std::thread::spawn(move || {
        let mut s = Vec::new();
        if let Some(o) = out.as_mut() {
            let _ = o.read_to_end(&mut s);
        }
        s
    });
    let err_t = std::thread::spawn(move || {
        let mut s = Vec::new();
        if let Some(e) = err.as_mut() {
            let _ = e.read_to_end(&mut s);
        }
        s
    });
    let deadline = Instant::now() + timeout();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if Instant::now() > deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("`git {}` took longer than {}s", args.join(" "), timeout().as_secs()));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => return Err(e.to_string()),
        }
    };
    let stdout = out_t.join().unwrap_or_default();
    let stderr = err_t.join().unwrap_or_default();
    if status.success() {
        Ok(String::from_utf8_lossy(&stdout).into_owned())
    } else {
        let e = String::from_utf8_lossy(&stderr);
        let line = e.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("failed").trim();
        Err(line.to_string())
    }
}

/// Tags of a (bare) repository with the commit each points at.
pub fn tags(db: &Path) -> Result<Vec<(String, String)>, String> {
    let out = run(Some(db), &["for-each-ref", "refs/tags", "--format=%(refname:short) %(objectname) %(*objectname)"])?;
    Ok(out
        .lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let name = it.next()?;
            let obj = it.next()?;
            // An annotated tag names the tag object; the commit is the peeled one.
            let commit = it.next().unwrap_or(obj);
            Some((name.to_string(), commit.to_string()))
        })
        .collect())
}

/// Whether `s` is a full commit id: 40 lowercase hex digits (SHA-1), or 64 (SHA-256
/// repositories). Only such ids reach a cache path or a git command line from `miles.lock`.
pub fn is_commit_id(s: &str) -> bool {
    matches!(s.len(), 40 | 64) && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The commit a ref (branch, tag or revision prefix) names in `db`.
pub fn commit_of(db: &Path, reference: &str) -> Result<String, String> {
    // A reference git would read as an option is no reference (refs never start with `-`).
    if reference.starts_with('-') {
        return Err(format!("`{reference}` is not a reference"));
    }
    run(Some(db), &["rev-parse", "--verify", "--quiet", &format!("{reference}^{{commit}}")])
        .map(|s| s.trim().to_string())
        .map_err(|_| format!("no `{reference}` in the repository"))
}

/// Whether `commit` is `tip` or one of its ancestors in `db` (a locked commit of a branch).
pub fn is_ancestor(db: &Path, commit: &str, tip: &str) -> bool {
    !tip.starts_with('-') && run(Some(db), &["merge-base", "--is-ancestor", commit, tip]).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commit_ids_are_full_lowercase_hex() {
        assert!(is_commit_id(&"a".repeat(40)) && is_commit_id(&"0".repeat(64)));
        for bad in ["", "abc", &"a".repeat(41), &"A".repeat(40), &"g".repeat(40), "aaaaaaaaaaa\u{e9}"] {
            assert!(!is_commit_id(bad), "{bad}");
        }
    }
}
