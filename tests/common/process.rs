//! Processes a test starts. Each starts in a session of its own (and so as the leader of its own
//! process group), and its guard kills every process of that session (the `miles` started, the
//! `miles-engine` it started, the workers, verifiers and environments that one started, each of
//! which a run puts in a process group of its own, issue #35) and reaps it on drop, also when the
//! test fails: a panic unwinds through the drop. So no test leaves a server or a worker behind,
//! and a test can ask what a run left running.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The `miles` binary of this build, with plain (colourless) output.
pub fn miles() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_miles"));
    c.env("NO_COLOR", "1");
    c
}

/// A scratch directory for one test, emptied first.
pub fn temp_dir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("miles-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

/// A started process and its session, killed and reaped when dropped.
pub struct Proc {
    child: Child,
    what: String,
}

impl Proc {
    /// Starts `cmd` as the leader of a new session and process group (stdin from /dev/null
    /// unless set).
    pub fn spawn(cmd: &mut Command) -> Proc {
        let what = format!("{:?}", cmd);
        // SAFETY: setsid(2) is async-signal-safe; in the forked child it cannot fail (the child
        // is not a group leader yet).
        let cmd = unsafe {
            cmd.pre_exec(|| {
                libc::setsid();
                Ok(())
            })
        };
        let child = cmd.spawn().unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
        Proc { child, what }
    }

    pub fn id(&self) -> u32 {
        self.child.id()
    }

    pub fn child(&mut self) -> &mut Child {
        &mut self.child
    }

    /// Whether the process has ended.
    pub fn exited(&mut self) -> bool {
        !matches!(self.child.try_wait(), Ok(None))
    }

    /// Waits at most `limit` for the process to end and for its piped output; past the limit,
    /// the group is killed and the test fails.
    pub fn wait_output(&mut self, limit: Duration) -> Output {
        let start = Instant::now();
        let readers = [self.child.stdout.take().map(read_all), self.child.stderr.take().map(read_all)];
        let status = loop {
            if let Some(s) = self.child.try_wait().expect("try_wait") {
                break s;
            }
            if start.elapsed() > limit {
                self.kill_group();
                panic!("{} ran over {:.0} s", self.what, limit.as_secs_f64());
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let [out, err] = readers.map(|r| {
            let Some(rx) = r else { return Vec::new() };
            let left = limit.saturating_sub(start.elapsed()).max(Duration::from_secs(1));
            rx.recv_timeout(left).unwrap_or_else(|_| {
                // Someone it started still holds the pipe: name it before cleaning up.
                let held = self.left_behind();
                self.kill_group();
                panic!("{} exited but left {held:?} holding its output", self.what)
            })
        });
        Output { status, stdout: out, stderr: err }
    }

    /// Waits at most `limit` for the process to end (its output not piped).
    pub fn wait(&mut self, limit: Duration) -> ExitStatus {
        self.wait_output(limit).status
    }

    /// Processes of the session still alive (pid and command line), once the leader has ended:
    /// what the run started and did not end.
    pub fn left_behind(&self) -> Vec<String> {
        session_members(self.child.id()).into_iter().map(|m| m.line).collect()
    }

    /// Waits (at most `limit`) until `ready()` holds and a process of the group has `needle` in
    /// its command line, then kills that one with SIGKILL and returns its pid: a worker killed
    /// mid-run, the run itself left to carry on.
    pub fn sigkill_member_when(&self, needle: &str, limit: Duration, ready: impl Fn() -> bool) -> i32 {
        let start = Instant::now();
        let pid = loop {
            assert!(start.elapsed() < limit, "{}: no `{needle}` in the session once ready", self.what);
            let member = self.left_behind().into_iter().find(|m| m.contains(needle));
            if let (true, Some(m)) = (ready(), member) {
                break m.split_whitespace().next().and_then(|p| p.parse::<i32>().ok()).expect("a pid");
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        // SAFETY: kill(2) on a pid read from /proc a moment ago, in the session this guard started.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
        }
        pid
    }

    /// Kills the leader's group and every process group of its session (a run's children have
    /// groups of their own).
    fn kill_group(&mut self) {
        let mut groups = vec![self.child.id() as i32];
        groups.extend(session_members(self.child.id()).into_iter().map(|m| m.pgrp));
        groups.sort_unstable();
        groups.dedup();
        for g in groups {
            // SAFETY: kill(2) with a negative pid signals a process group of the session this
            // guard created.
            unsafe {
                libc::kill(-g, libc::SIGKILL);
            }
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill_group();
        let _ = self.child.wait();
    }
}

/// Runs `cmd` to its end within `limit`, with its output piped and collected.
pub fn output(cmd: &mut Command, limit: Duration) -> Output {
    Proc::spawn(cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped())).wait_output(limit)
}

/// The built `miles` with `args`, to its end (at most five minutes).
pub fn run_miles(args: &[&str]) -> Output {
    output(miles().args(args), Duration::from_secs(300))
}

/// `miles run RECIPE --out OUT` with one libtorch thread and no progress bar, to its end within
/// `limit`.
pub fn run_recipe(recipe: &std::path::Path, out: &std::path::Path, limit: Duration) -> Output {
    let (r, o) = (recipe.to_str().unwrap_or_default(), out.to_str().unwrap_or_default());
    output(miles().args(["run", r, "--out", o, "--threads", "1", "--progress", "off"]), limit)
}

/// A command's stdout then stderr, as text (what an assertion message shows).
pub fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn read_all(mut r: impl Read + Send + 'static) -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = r.read_to_end(&mut v);
        let _ = tx.send(v);
    });
    rx
}

/// A live process of a session: its process group and `pid cmdline`.
struct Member {
    pgrp: i32,
    line: String,
}

/// Live (not zombie) processes whose session is `sid`, from /proc.
fn session_members(sid: u32) -> Vec<Member> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    let mut out = Vec::new();
    for e in dir.flatten() {
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else { continue };
        // pid (comm) state ppid pgrp session ...; comm may hold spaces and parentheses.
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else { continue };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.len() < 4 || fields[0] == "Z" || fields[3].parse::<u32>().ok() != Some(sid) {
            continue;
        }
        let Ok(pgrp) = fields[2].parse::<i32>() else { continue };
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        out.push(Member { pgrp, line: format!("{} {}", e.file_name().to_string_lossy(), cmdline.trim()) });
    }
    out
}
