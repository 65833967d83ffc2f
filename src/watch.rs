//! Re-running a command when the files it read change: `miles check --watch` (and any verb that
//! wants `--watch`: pass a closure that runs once and returns the files it read).
//!
//! Every wait is bounded (the loop wakes at least every `TICK` to see Ctrl-C), changes arriving
//! together are coalesced for `SETTLE`, and Ctrl-C ends the loop with exit code 0.

use notify::{RecursiveMode, Watcher};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

const TICK: Duration = Duration::from_millis(200);
/// Editors save in several steps (write a temp file, rename, touch); wait for them to finish.
const SETTLE: Duration = Duration::from_millis(100);

/// Runs `once`, then again after every change to the files it returned, until Ctrl-C.
pub fn watch(once: impl FnMut() -> Vec<PathBuf>) -> u8 {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    if let Err(e) = ctrlc::set_handler(move || flag.store(true, Ordering::SeqCst)) {
        eprintln!("warning: cannot catch Ctrl-C ({e}); stop with a signal");
    }
    match watch_until(once, &stop, |changed| {
        eprintln!("\n--- {} changed: running again ---", changed.display());
    }) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: cannot watch files: {e}");
            2
        }
    }
}

/// The loop behind `watch`, stoppable through `stop` (for tests and embedding). `on_change` is
/// told which file triggered a re-run.
pub fn watch_until(
    mut once: impl FnMut() -> Vec<PathBuf>,
    stop: &AtomicBool,
    mut on_change: impl FnMut(&Path),
) -> Result<(), String> {
    let (tx, rx) = mpsc::channel::<notify::Result<notify::Event>>();
    let mut watcher = notify::recommended_watcher(move |ev| {
        let _ = tx.send(ev);
    })
    .map_err(|e| e.to_string())?;
    let mut watched_dirs: HashSet<PathBuf> = HashSet::new();
    loop {
        let files: HashSet<PathBuf> = once().into_iter().map(|p| absolute(&p)).collect();
        // Directories, not files: an editor that saves by renaming replaces the watched inode.
        for dir in files.iter().filter_map(|f| f.parent()) {
            if dir.is_dir() && watched_dirs.insert(dir.to_path_buf()) {
                watcher.watch(dir, RecursiveMode::NonRecursive).map_err(|e| format!("{}: {e}", dir.display()))?;
            }
        }
        let changed = loop {
            if stop.load(Ordering::SeqCst) {
                return Ok(());
            }
            match rx.recv_timeout(TICK) {
                Ok(Ok(ev)) if is_edit(&ev.kind) => {
                    if let Some(p) = ev.paths.iter().map(|p| absolute(p)).find(|p| files.contains(p)) {
                        break p;
                    }
                }
                Ok(_) | Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => return Err("the file watcher stopped".into()),
            }
        };
        let until = Instant::now() + SETTLE;
        while let Some(left) = until.checked_duration_since(Instant::now()) {
            if rx.recv_timeout(left).is_err() {
                break;
            }
        }
        if stop.load(Ordering::SeqCst) {
            return Ok(());
        }
        on_change(&changed);
    }
}

fn is_edit(kind: &notify::EventKind) -> bool {
    matches!(kind, notify::EventKind::Create(_) | notify::EventKind::Modify(_) | notify::EventKind::Remove(_))
}

fn absolute(p: &Path) -> PathBuf {
    let joined = if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir().map(|d| d.join(p)).unwrap_or_else(|_| p.to_path_buf())
    };
    // Lexically: the file may not exist (deleted between two runs).
    PathBuf::from(miles_compiler::fs::normalize(&joined.to_string_lossy()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn reruns_on_change_and_stops() {
        let dir = std::env::temp_dir().join(format!("miles-watch-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let file = dir.join("r.miles");
        std::fs::write(&file, "const a = 1\n").expect("write");
        let runs = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (r, s, f) = (runs.clone(), stop.clone(), file.clone());
        let t = std::thread::spawn(move || {
            watch_until(
                || {
                    r.fetch_add(1, Ordering::SeqCst);
                    vec![f.clone()]
                },
                &s,
                |_| {},
            )
        });
        let wait_for = |n: usize| {
            let deadline = Instant::now() + Duration::from_secs(10);
            while runs.load(Ordering::SeqCst) < n && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            runs.load(Ordering::SeqCst)
        };
        assert_eq!(wait_for(1), 1);
        // The watcher is set up after the first run; give it a moment before editing.
        std::thread::sleep(Duration::from_millis(300));
        std::fs::write(&file, "const a = 2\n").expect("write");
        assert!(wait_for(2) >= 2, "no re-run after the edit");
        // Another file in the same directory does not trigger a run.
        let before = runs.load(Ordering::SeqCst);
        std::fs::write(dir.join("other.txt"), "x").expect("write");
        std::thread::sleep(Duration::from_millis(500));
        assert_eq!(runs.load(Ordering::SeqCst), before);
        stop.store(true, Ordering::SeqCst);
        let joined = t.join().map_err(|_| "watch thread panicked".to_string()).and_then(|r| r);
        assert_eq!(joined, Ok(()));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
