//! A program the run speaks to in lines of text (a `command_reward`, a `jsonl` environment):
//! started without a shell, its stdin fed by a writer thread (a program that stops reading blocks
//! no caller), its stdout read line by line on a thread of its own (each line at most
//! `MAX_LINE` bytes, so a runaway answer cannot fill memory), and the last few KiB of its stderr
//! kept to quote when it fails. It is started by `child::spawn` (its own process group, its
//! environment an allow-list, dead with the run) and killed with its group when the `LineChild`
//! is dropped.

use crate::child::{ChildEnv, GroupChild};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex};

/// How much of the program's stderr a failure quotes.
pub const STDERR_TAIL: usize = 2048;
/// The longest line read from the program.
pub const MAX_LINE: u64 = 64 << 20;

pub struct LineChild {
    pub child: GroupChild,
    /// Lines to the program's stdin (the newline is added).
    pub stdin: Sender<String>,
    stderr: Arc<Mutex<String>>,
}

/// Why the program's stdout ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StdoutEnd {
    /// End of file: the program closed it or exited.
    Closed,
    /// A line longer than `MAX_LINE`.
    TooLong,
    Unreadable(String),
}

impl StdoutEnd {
    /// What a failure message says; `closed` names the end of file ("exited", "closed its stdout").
    pub fn describe(&self, closed: &str) -> String {
        match self {
            StdoutEnd::Closed => closed.to_string(),
            StdoutEnd::TooLong => format!("answered a line longer than {MAX_LINE} bytes"),
            StdoutEnd::Unreadable(e) => format!("stdout unreadable: {e}"),
        }
    }
}

impl LineChild {
    /// Starts `argv` in `cwd` with `env`. Each stdout line goes to `on_line` (which returns false
    /// to stop reading); when stdout ends, `on_end` gets why and the program's stderr tail so far.
    pub fn spawn(
        argv: &[String],
        cwd: Option<&Path>,
        env: &ChildEnv,
        on_line: impl FnMut(String) -> bool + Send + 'static,
        on_end: impl FnOnce(StdoutEnd, &StderrTail) + Send + 'static,
    ) -> std::io::Result<LineChild> {
        Self::spawn_logged(argv, cwd, env, None, on_line, on_end)
    }

    /// `spawn`, also appending the program's whole stderr to `log` (when given).
    pub fn spawn_logged(
        argv: &[String],
        cwd: Option<&Path>,
        env: &ChildEnv,
        log: Option<StderrLog>,
        mut on_line: impl FnMut(String) -> bool + Send + 'static,
        on_end: impl FnOnce(StdoutEnd, &StderrTail) + Send + 'static,
    ) -> std::io::Result<LineChild> {
        let (program, args) = argv.split_first().ok_or_else(|| std::io::Error::other("no program given"))?;
        let mut cmd = Command::new(program);
        cmd.args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        if let Some(dir) = cwd {
            cmd.current_dir(dir);
        }
        let mut child = crate::child::spawn(cmd, env)?;
        // Without its pipes the child is dropped here, which kills it.
        let (Some(stdin), Some(stdout), Some(stderr)) = child.take_stdio() else {
            return Err(std::io::Error::other("no pipes to the program"));
        };
        let (tx, rx) = mpsc::channel::<String>();
        std::thread::spawn(move || {
            let mut stdin = stdin;
            for line in rx {
                let ok =
                    stdin.write_all(line.as_bytes()).and_then(|_| stdin.write_all(b"\n")).and_then(|_| stdin.flush());
                if ok.is_err() {
                    break;
                }
            }
        });
        let tail = StderrTail(Arc::new(Mutex::new(String::new())));
        let keep = tail.clone();
        let mut log = log;
        if let Some(l) = log.as_mut() {
            // One line naming the start, so that restarts are told apart in the log.
            let cmd = crate::quote::truncate(&argv.join(" ").replace('\n', " "), 120);
            l.append(format!("--- miles: `{cmd}` started (process {}) ---\n", child.id()).as_bytes());
        }
        std::thread::spawn(move || {
            let mut err = BufReader::new(stderr);
            let mut buf = [0u8; 4096];
            while let Ok(n) = err.read(&mut buf) {
                if n == 0 {
                    break;
                }
                keep.push(&String::from_utf8_lossy(&buf[..n]));
                if let Some(l) = log.as_mut() {
                    l.append(&buf[..n]);
                }
            }
        });
        let seen = tail.clone();
        std::thread::spawn(move || {
            let mut out = BufReader::new(stdout);
            let end = loop {
                let mut buf = Vec::new();
                match (&mut out).take(MAX_LINE).read_until(b'\n', &mut buf) {
                    Ok(0) => break StdoutEnd::Closed,
                    Ok(_) if !buf.ends_with(b"\n") && buf.len() as u64 >= MAX_LINE => break StdoutEnd::TooLong,
                    Ok(_) => {
                        if !on_line(String::from_utf8_lossy(&buf).into_owned()) {
                            return;
                        }
                    }
                    Err(e) => break StdoutEnd::Unreadable(e.to_string()),
                }
            };
            on_end(end, &seen);
        });
        Ok(LineChild { child, stdin: tx, stderr: tail.0 })
    }

    /// The last `STDERR_TAIL` bytes or so of the program's stderr, trimmed.
    pub fn stderr_tail(&self) -> String {
        StderrTail(self.stderr.clone()).text()
    }
}

/// Starts `argv` as a worker that answers in JSON lines: each stdout line parsed as `T` (a line
/// that is not one is an `Err` naming why), and when stdout ends one last `Err` saying how, with the
/// program's stderr tail. The workers of a run's stages (a diffusion reward, a teacher) use it:
/// `miles-engine` itself, given the engine's environment (`ChildEnv::engine`).
pub fn spawn_json_lines<T: serde::de::DeserializeOwned + Send + 'static>(
    argv: &[String],
) -> std::io::Result<(LineChild, mpsc::Receiver<Result<T, String>>)> {
    let (tx, rx) = mpsc::channel();
    let end = tx.clone();
    let child = LineChild::spawn(
        argv,
        None,
        &ChildEnv::engine(),
        move |line| {
            let parsed =
                serde_json::from_str::<T>(&line).map_err(|e| format!("answered a line that is not a reply: {e}"));
            tx.send(parsed).is_ok()
        },
        move |why, tail| {
            let _ = end.send(Err(tail.quote_after(why.describe("exited"))));
        },
    )?;
    Ok((child, rx))
}

/// A file a program's stderr is appended to, across restarts of the program, bounded: past `cap`
/// bytes it becomes `<file>.1` (replacing an older one) and a new file starts, so at most twice
/// `cap` is kept. A log is best effort: a write that fails is given up on, once, with a warning
/// (the run does not stop for its log; the stderr tail is still quoted in errors).
pub struct StderrLog {
    path: std::path::PathBuf,
    cap: u64,
    failed: bool,
}

/// The default bound of a stderr log.
pub const STDERR_LOG_CAP: u64 = 8 << 20;

impl StderrLog {
    pub fn new(path: std::path::PathBuf, cap: u64) -> StderrLog {
        StderrLog { path, cap, failed: false }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn append(&mut self, bytes: &[u8]) {
        if self.failed {
            return;
        }
        if let Err(e) = self.try_append(bytes) {
            self.failed = true;
            eprintln!(
                "warning: cannot append to {} ({e}); the program's stderr is not logged further",
                self.path.display()
            );
        }
    }

    fn try_append(&self, bytes: &[u8]) -> std::io::Result<()> {
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let len = std::fs::metadata(&self.path).map(|m| m.len()).unwrap_or(0);
        if len > 0 && len + bytes.len() as u64 > self.cap {
            let mut old = self.path.clone().into_os_string();
            old.push(".1");
            std::fs::rename(&self.path, old)?;
        }
        let mut f = std::fs::OpenOptions::new().create(true).append(true).open(&self.path)?;
        f.write_all(bytes)
    }
}

/// The end of a program's stderr, shared with the thread that reads it.
#[derive(Clone)]
pub struct StderrTail(Arc<Mutex<String>>);

impl StderrTail {
    fn push(&self, text: &str) {
        let mut t = self.0.lock().unwrap_or_else(|p| p.into_inner());
        t.push_str(text);
        if t.len() > 2 * STDERR_TAIL {
            let cut = t.len() - STDERR_TAIL;
            let cut = (cut..t.len()).find(|&i| t.is_char_boundary(i)).unwrap_or(t.len());
            t.drain(..cut);
        }
    }

    pub fn text(&self) -> String {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).trim_end().to_string()
    }

    /// `what`, followed by the stderr's last words when there are any.
    pub fn quote_after(&self, what: String) -> String {
        let last = self.text();
        if last.is_empty() {
            what
        } else {
            format!("{what}; stderr ends: {}", crate::quote::truncate_tail(&last, 400))
        }
    }
}
