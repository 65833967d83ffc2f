//! `command_reward`: a user's program, in any language, started once and kept alive. Each batch
//! is one request line on its stdin; it answers one line on its stdout (reward/protocol.rs). Its
//! stderr is kept (the last few KiB) to quote when it fails. A batch that times out, a program
//! that exits or answers malformed output fails that batch under the stage's policy; the program
//! is then killed and started afresh for the next batch. It is killed when the reward is dropped.

use super::protocol::{self, BatchFault};
use super::{settle_all, BatchReward, OnRewardError, RewardInput, RewardOutcome};
use crate::RunError;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How much of the program's stderr a failure quotes.
const STDERR_TAIL: usize = 2048;
/// The longest answer line read (a line past it fails the batch instead of filling memory).
const MAX_LINE: u64 = 64 << 20;

#[derive(Debug, Clone, PartialEq)]
pub struct CommandSpec {
    /// The stage name (failures and metrics name it).
    pub name: String,
    /// Program and arguments, not through a shell: `["python3", "verify.py"]`.
    pub argv: Vec<String>,
    /// Working directory of the program (the run's directory when `None`).
    pub cwd: Option<PathBuf>,
    /// Longest wait for one batch's answer, from sending the request.
    pub timeout: Duration,
    pub on_error: OnRewardError,
}

pub struct CommandReward {
    spec: CommandSpec,
    running: Option<Running>,
    next_id: u64,
    /// How many times the program was started (1 in a healthy run).
    pub starts: u64,
}

struct Running {
    child: Child,
    /// Request lines go through a writer thread so a program that stops reading cannot block us.
    requests: Sender<String>,
    lines: Receiver<Result<String, String>>,
    stderr: Arc<Mutex<String>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl CommandReward {
    pub fn new(spec: CommandSpec) -> Result<CommandReward, RunError> {
        if spec.argv.is_empty() {
            return Err(RunError::new(crate::E_SPEC, format!("reward `{}`: `command` is empty", spec.name)));
        }
        Ok(CommandReward { spec, running: None, next_id: 0, starts: 0 })
    }

    fn start(&mut self) -> Result<Running, RunError> {
        let mut cmd = Command::new(&self.spec.argv[0]);
        cmd.args(&self.spec.argv[1..]).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        if let Some(dir) = &self.spec.cwd {
            cmd.current_dir(dir);
        }
        // A program that cannot start at all is a setting to fix, whatever the policy.
        let mut child = cmd.spawn().map_err(|e| {
            RunError::new(
                super::E_REWARD,
                format!("reward `{}`: cannot start `{}`: {e}", self.spec.name, self.spec.argv.join(" ")),
            )
            .with_help("`command` is a program and its arguments, run without a shell; check the program is on PATH")
        })?;
        self.starts += 1;
        let (stdin, stdout, stderr) = match (child.stdin.take(), child.stdout.take(), child.stderr.take()) {
            (Some(i), Some(o), Some(e)) => (i, o, e),
            _ => {
                return Err(RunError::new(
                    super::E_REWARD,
                    format!("reward `{}`: no pipes to the program", self.spec.name),
                ))
            }
        };
        let (requests, rx_req) = mpsc::channel::<String>();
        std::thread::spawn(move || {
            let mut stdin = stdin;
            for line in rx_req {
                if stdin
                    .write_all(line.as_bytes())
                    .and_then(|_| stdin.write_all(b"\n"))
                    .and_then(|_| stdin.flush())
                    .is_err()
                {
                    break;
                }
            }
        });
        let (tx_lines, lines) = mpsc::channel();
        std::thread::spawn(move || {
            let mut out = BufReader::new(stdout);
            loop {
                let mut buf = Vec::new();
                match (&mut out).take(MAX_LINE).read_until(b'\n', &mut buf) {
                    Ok(0) => break,
                    Ok(_) if !buf.ends_with(b"\n") && buf.len() as u64 >= MAX_LINE => {
                        let _ = tx_lines.send(Err(format!("answered a line longer than {MAX_LINE} bytes")));
                        break;
                    }
                    Ok(_) => {
                        let line = String::from_utf8_lossy(&buf).into_owned();
                        if tx_lines.send(Ok(line)).is_err() {
                            break;
                        }
                    }
                    Err(e) => {
                        let _ = tx_lines.send(Err(format!("stdout unreadable: {e}")));
                        break;
                    }
                }
            }
        });
        let tail = Arc::new(Mutex::new(String::new()));
        let keep = tail.clone();
        std::thread::spawn(move || {
            let mut err = BufReader::new(stderr);
            let mut buf = [0u8; 4096];
            while let Ok(n) = err.read(&mut buf) {
                if n == 0 {
                    break;
                }
                if let Ok(mut t) = keep.lock() {
                    t.push_str(&String::from_utf8_lossy(&buf[..n]));
                    if t.len() > 2 * STDERR_TAIL {
                        let cut = t.len() - STDERR_TAIL;
                        let cut = (cut..t.len()).find(|&i| t.is_char_boundary(i)).unwrap_or(t.len());
                        t.drain(..cut);
                    }
                }
            }
        });
        Ok(Running { child, requests, lines, stderr: tail })
    }

    /// One round trip; `Err` fails every sample of the batch. The program is left running only
    /// after a well-formed exchange.
    fn exchange(&mut self, items: &[RewardInput]) -> Result<Vec<Result<f32, super::RewardFailure>>, RunError> {
        if self.running.is_none() {
            self.running = Some(self.start()?);
        }
        let id = self.next_id;
        self.next_id += 1;
        let name = self.spec.name.clone();
        let timeout = self.spec.timeout;
        let run = self.running.as_mut().expect("started above");
        let answer = match run.requests.send(protocol::request(id, items)) {
            Err(_) => Err(BatchFault::new("its stdin is closed")),
            Ok(()) => match run.lines.recv_timeout(timeout) {
                Ok(Ok(line)) => protocol::parse_answer(&name, id, items, &line),
                Ok(Err(e)) => Err(BatchFault::new(e)),
                Err(RecvTimeoutError::Timeout) => {
                    Err(BatchFault::timeout(format!("no answer within {:.1}s", timeout.as_secs_f64())))
                }
                Err(RecvTimeoutError::Disconnected) => Err(BatchFault::new("closed its stdout")),
            },
        };
        match answer {
            Ok(scores) => Ok(scores),
            Err(mut fault) => {
                let mut run = self.running.take().expect("started above");
                // Give an exiting program a moment so its status and last words are known.
                let status = wait_briefly(&mut run.child);
                if let Some(status) = status {
                    fault.what = format!("exited ({status}) — {}", fault.what);
                }
                let tail = run.stderr.lock().map(|t| t.trim_end().to_string()).unwrap_or_default();
                if !tail.is_empty() {
                    fault.what = format!("{}; stderr ends: {}", fault.what, super::truncate_tail(&tail, 400));
                }
                drop(run);
                Ok(fault.fail_all(&name, items))
            }
        }
    }
}

fn wait_briefly(child: &mut Child) -> Option<std::process::ExitStatus> {
    for _ in 0..20 {
        if let Ok(Some(s)) = child.try_wait() {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}

impl BatchReward for CommandReward {
    fn name(&self) -> &str {
        &self.spec.name
    }

    fn score_batch(&mut self, items: &[RewardInput]) -> Result<Vec<RewardOutcome>, RunError> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        let results = self.exchange(items)?;
        settle_all(self.spec.on_error, results)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reward::{input, RewardOutcome};
    use serde_json::json;

    fn fixture() -> String {
        format!("{}/../../tests/fixtures/rewards/verify.py", env!("CARGO_MANIFEST_DIR"))
    }

    fn reward(mode: &str, on_error: OnRewardError, timeout_ms: u64) -> CommandReward {
        CommandReward::new(CommandSpec {
            name: "judge".into(),
            argv: vec!["python3".into(), fixture(), mode.into()],
            cwd: None,
            timeout: Duration::from_millis(timeout_ms),
            on_error,
        })
        .unwrap()
    }

    fn batch() -> Vec<RewardInput> {
        vec![
            input("s0", "the answer is \\boxed{42}", json!("42")),
            input("s1", "#### 41", json!("42")),
            input("s2", "crash", json!("1")),
        ]
    }

    fn what(o: &RewardOutcome) -> String {
        match o {
            RewardOutcome::Score(s) => format!("{s}"),
            RewardOutcome::Zeroed(f) => format!("zero: {}", f.what),
            RewardOutcome::Dropped(f) => format!("drop {}: {}", f.sample_id, f.what),
        }
    }

    #[test]
    fn a_python_verifier_scores_batches_and_stays_alive() {
        let mut r = reward("ok", OnRewardError::Stop, 20_000);
        let b = batch();
        let out = r.score_batch(&b[..2]).unwrap();
        assert_eq!(out, vec![RewardOutcome::Score(1.0), RewardOutcome::Score(0.0)]);
        let out = r.score_batch(&b[..1]).unwrap();
        assert_eq!(out, vec![RewardOutcome::Score(1.0)]);
        assert_eq!(r.starts, 1);
    }

    #[test]
    fn a_crash_is_named_with_the_exit_status_and_stderr_then_restarts() {
        let mut r = reward("ok", OnRewardError::Drop, 20_000);
        let out = r.score_batch(&batch()).unwrap();
        let w = what(&out[2]);
        assert!(w.starts_with("drop s2: exited (exit status: 3) — closed its stdout; stderr ends:"), "{w}");
        assert!(w.contains("verifier asked to crash"), "{w}");
        let out = r.score_batch(&batch()[..1]).unwrap();
        assert_eq!(out, vec![RewardOutcome::Score(1.0)]);
        assert_eq!(r.starts, 2);
    }

    #[test]
    fn malformed_answers_and_timeouts_follow_the_policy() {
        let mut r = reward("nan", OnRewardError::Zero, 20_000);
        let out = r.score_batch(&batch()[..1]).unwrap();
        assert!(what(&out[0]).starts_with("zero: answered text that is not JSON"), "{}", what(&out[0]));
        let mut r = reward("wrong_id", OnRewardError::Stop, 20_000);
        let e = r.score_batch(&batch()[..1]).unwrap_err();
        assert_eq!(e.code, crate::reward::E_REWARD);
        assert!(e.message.starts_with("reward `judge` failed on sample s0: answered id 1000 to request 0"), "{e}");
        let mut r = reward("sleep", OnRewardError::Stop, 300);
        let t0 = std::time::Instant::now();
        let e = r.score_batch(&batch()[..1]).unwrap_err();
        assert!(t0.elapsed() < Duration::from_secs(10));
        assert_eq!(e.code, crate::E_TIMEOUT);
        assert!(e.message.contains("no answer within 0.3s"), "{e}");
        let mut r = reward("count", OnRewardError::Drop, 20_000);
        let out = r.score_batch(&batch()[..2]).unwrap();
        assert!(what(&out[1]).starts_with("drop s1: answered 1 scores for 2 samples"), "{}", what(&out[1]));
    }

    #[test]
    fn a_missing_program_stops_whatever_the_policy() {
        let mut r = CommandReward::new(CommandSpec {
            name: "judge".into(),
            argv: vec!["/nonexistent/verifier".into()],
            cwd: None,
            timeout: Duration::from_secs(1),
            on_error: OnRewardError::Zero,
        })
        .unwrap();
        let e = r.score_batch(&batch()[..1]).unwrap_err();
        assert!(e.message.starts_with("reward `judge`: cannot start `/nonexistent/verifier`"), "{e}");
    }

    #[test]
    fn the_program_is_killed_on_drop() {
        let mut r = reward("ok", OnRewardError::Stop, 20_000);
        r.score_batch(&batch()[..1]).unwrap();
        let pid = r.running.as_ref().unwrap().child.id();
        drop(r);
        // Reaped by Drop: no process with that id is ours any more.
        let alive =
            std::fs::read_to_string(format!("/proc/{pid}/status")).map(|s| !s.contains("State:\tZ")).unwrap_or(false);
        assert!(!alive);
    }
}
