//! `command_reward`: a user's program, in any language, started once and kept alive. Each batch
//! is one request line on its stdin; it answers one line on its stdout (reward/protocol.rs). Its
//! stderr is kept (the last few KiB) to quote when it fails. A batch that times out, a program
//! that exits or answers malformed output fails that batch under the stage's policy; the program
//! is then killed (with everything it started: its process group) and started afresh for the
//! next batch. It is killed so when the reward is dropped, and dies with the run (`child`). Its
//! environment is `child::BASE_ENV` and the stage's `pass_env` names, nothing else. A group
//! reward (`group`) sends one request per group of the batch instead (reward/group.rs), one after
//! the other; a group that fails fails alone, and the next group restarts the program.

use super::group::{self, Unit};
use super::protocol::{self, BatchFault};
use super::{settle_all, BatchReward, OnRewardError, RewardFailure, RewardInput, RewardOutcome};
use crate::child::{ChildEnv, GroupChild};
use crate::line_child::{LineChild, StdoutEnd};
use crate::RunError;
use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::Duration;

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
    /// Names of the run's environment variables the program also gets (`pass_env`).
    pub pass_env: Vec<String>,
    /// One request per group, one score per member (`group_command_reward`).
    pub group: bool,
}

pub struct CommandReward {
    spec: CommandSpec,
    env: ChildEnv,
    running: Option<Running>,
    next_id: u64,
    /// How many times the program was started (1 in a healthy run).
    pub starts: u64,
}

struct Running {
    program: LineChild,
    /// Answer lines, or why stdout ended early (an end of file just disconnects).
    lines: Receiver<Result<String, String>>,
}

impl CommandReward {
    pub fn new(spec: CommandSpec) -> Result<CommandReward, RunError> {
        if spec.argv.is_empty() {
            return Err(RunError::new(crate::E_SPEC, format!("reward `{}`: `command` is empty", spec.name)));
        }
        let env = ChildEnv::program(&spec.pass_env)
            .map_err(|why| RunError::new(crate::E_SPEC, format!("reward `{}`: `pass_env`: {why}", spec.name)))?;
        Ok(CommandReward { spec, env, running: None, next_id: 0, starts: 0 })
    }

    fn start(&mut self) -> Result<Running, RunError> {
        let (tx, lines) = mpsc::channel();
        let end_tx = tx.clone();
        let program = LineChild::spawn(
            &self.spec.argv,
            self.spec.cwd.as_deref(),
            &self.env,
            move |line| tx.send(Ok(line)).is_ok(),
            move |end, _| {
                if end != StdoutEnd::Closed {
                    let _ = end_tx.send(Err(end.describe("closed its stdout")));
                }
            },
        )
        // A program that cannot start at all is a setting to fix, whatever the policy.
        .map_err(|e| {
            RunError::new(
                super::E_REWARD,
                format!("reward `{}`: cannot start `{}`: {e}", self.spec.name, self.spec.argv.join(" ")),
            )
            .with_help("`command` is a program and its arguments, run without a shell; check the program is on PATH")
        })?;
        self.starts += 1;
        Ok(Running { program, lines })
    }

    /// One round trip for the samples of `unit`; a fault fails all of them (named with the group,
    /// for a group). The program is left running only after a well-formed exchange.
    fn exchange(&mut self, all: &[RewardInput], unit: &Unit) -> Result<Vec<Result<f32, RewardFailure>>, RunError> {
        if self.running.is_none() {
            self.running = Some(self.start()?);
        }
        let id = self.next_id;
        self.next_id += 1;
        let name = self.spec.name.clone();
        let timeout = self.spec.timeout;
        let members: Vec<&RewardInput> = unit.members.iter().map(|&i| &all[i]).collect();
        let line = match &unit.group {
            Some(g) => group::request(id, g, &members),
            None => protocol::request(id, &members),
        };
        let items: Vec<RewardInput> = members.into_iter().cloned().collect();
        let items = &items[..];
        let run = self.running.as_mut().expect("started above");
        let answer = match run.program.stdin.send(line) {
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
                if let Some(g) = &unit.group {
                    fault.what = format!("group {g}: {}", fault.what);
                }
                let mut run = self.running.take().expect("started above");
                // Give an exiting program a moment so its status and last words are known.
                let status = wait_briefly(&mut run.program.child);
                if let Some(status) = status {
                    fault.what = format!("exited ({status}) — {}", fault.what);
                }
                let tail = run.program.stderr_tail();
                if !tail.is_empty() {
                    fault.what = format!("{}; stderr ends: {}", fault.what, super::truncate_tail(&tail, 400));
                }
                drop(run);
                Ok(fault.fail_all(&name, items))
            }
        }
    }
}

fn wait_briefly(child: &mut GroupChild) -> Option<std::process::ExitStatus> {
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
        let units = if self.spec.group { group::groups(items) } else { group::chunks(items.len(), items.len()) };
        let mut results: Vec<Option<Result<f32, RewardFailure>>> = vec![None; items.len()];
        for unit in &units {
            for (&i, r) in unit.members.iter().zip(self.exchange(items, unit)?) {
                results[i] = Some(r);
            }
        }
        // Every sample is in exactly one unit; `score_responses` checks the count besides.
        settle_all(self.spec.on_error, results.into_iter().flatten().collect())
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
            pass_env: vec![],
            group: false,
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
    fn a_group_program_gets_one_request_per_group_and_fails_it_whole() {
        let rank = format!("{}/../../recipes/rewards/rank.py", env!("CARGO_MANIFEST_DIR"));
        let group = |mode: &str, on_error| {
            CommandReward::new(CommandSpec {
                name: "rank".into(),
                argv: vec!["python3".into(), rank.clone(), mode.into()],
                cwd: None,
                timeout: Duration::from_secs(20),
                on_error,
                pass_env: vec![],
                group: true,
            })
            .unwrap()
        };
        // Groups 0 and 1 interleaved: each is ranked on its own (its best 1, its second 0.5).
        let items: Vec<RewardInput> = [(0, "s0", "4"), (1, "t0", "7"), (0, "s1", "5"), (1, "t1", "8"), (1, "t2", "9")]
            .into_iter()
            .map(|(g, id, label)| RewardInput { group: g, ..input(id, "7", json!(label)) })
            .collect();
        let mut r = group("ok", OnRewardError::Stop);
        let out = r.score_batch(&items).unwrap();
        assert_eq!(out.iter().map(|o| o.reward().unwrap()).collect::<Vec<_>>(), [1.0, 1.0, 0.5, 0.5, 0.0]);
        assert_eq!(r.starts, 1);
        // One score too few: every member of that group fails, named with the group; the
        // program is started afresh for the next group.
        let mut r = group("count", OnRewardError::Zero);
        let out = r.score_batch(&items).unwrap();
        assert!(out.iter().all(|o| matches!(o, RewardOutcome::Zeroed(_))), "{out:?}");
        assert!(what(&out[1]).starts_with("zero: group t0...: answered 2 scores for 3 samples"), "{}", what(&out[1]));
        assert_eq!(r.starts, 2);
    }

    #[test]
    fn a_missing_program_stops_whatever_the_policy() {
        let mut r = CommandReward::new(CommandSpec {
            name: "judge".into(),
            argv: vec!["/nonexistent/verifier".into()],
            cwd: None,
            timeout: Duration::from_secs(1),
            on_error: OnRewardError::Zero,
            pass_env: vec![],
            group: false,
        })
        .unwrap();
        let e = r.score_batch(&batch()[..1]).unwrap_err();
        assert!(e.message.starts_with("reward `judge`: cannot start `/nonexistent/verifier`"), "{e}");
    }

    /// A verifier that starts a grandchild (`sleep 1000`, as a verifier running model-written
    /// code would), writes its pid to `pids`, then answers every batch (`ok`) or none (`hang`).
    fn spawning(mode: &str, pids: &std::path::Path, timeout_ms: u64) -> CommandReward {
        const PY: &str = r#"
import json, subprocess, sys
g = subprocess.Popen(["sleep", "1000"])
open(sys.argv[2], "w").write(str(g.pid))
for line in sys.stdin:
    req = json.loads(line)
    if sys.argv[1] == "ok":
        print(json.dumps({"id": req["id"], "scores": [1.0 for _ in req["samples"]]}), flush=True)
"#;
        CommandReward::new(CommandSpec {
            name: "judge".into(),
            argv: vec!["python3".into(), "-c".into(), PY.into(), mode.into(), pids.display().to_string()],
            cwd: None,
            timeout: Duration::from_millis(timeout_ms),
            on_error: OnRewardError::Zero,
            pass_env: vec![],
            group: false,
        })
        .unwrap()
    }

    #[test]
    fn a_timeout_kills_the_program_with_what_it_started() {
        let dir = crate::child::testing::scratch("cmd-timeout");
        let pids = dir.join("pid");
        let mut r = spawning("hang", &pids, 1500);
        let out = r.score_batch(&batch()[..1]).unwrap();
        assert!(what(&out[0]).contains("no answer within 1.5s"), "{}", what(&out[0]));
        let grandchild = crate::child::testing::read_pid(&pids);
        assert!(crate::child::testing::gone(grandchild), "the verifier's `sleep` ({grandchild}) outlived the timeout");
    }

    #[test]
    fn a_drop_kills_the_program_with_what_it_started() {
        let dir = crate::child::testing::scratch("cmd-drop");
        let pids = dir.join("pid");
        let mut r = spawning("ok", &pids, 20_000);
        assert_eq!(r.score_batch(&batch()[..1]).unwrap(), vec![RewardOutcome::Score(1.0)]);
        let grandchild = crate::child::testing::read_pid(&pids);
        assert!(!crate::child::testing::gone(grandchild));
        drop(r);
        assert!(crate::child::testing::gone(grandchild), "the verifier's `sleep` ({grandchild}) outlived the reward");
    }

    #[test]
    fn the_program_sees_the_allow_list_and_pass_env_not_the_run_secrets() {
        const PY: &str = r#"
import json, os, sys
names = ["MILES_API_KEY", "MILES_RUN_TOKEN", "HOME", "LC_CHILD_TEST", "CHILD_TEST_PASSED", "CHILD_TEST_NOT_PASSED"]
open(sys.argv[1], "w").write(json.dumps({n: os.environ.get(n) for n in names}))
for line in sys.stdin:
    req = json.loads(line)
    print(json.dumps({"id": req["id"], "scores": [1.0 for _ in req["samples"]]}), flush=True)
"#;
        // Names no other test of this process reads or sets.
        std::env::set_var("MILES_API_KEY", "secret-key");
        std::env::set_var("MILES_RUN_TOKEN", "secret-token");
        std::env::set_var("CHILD_TEST_PASSED", "listed");
        std::env::set_var("CHILD_TEST_NOT_PASSED", "unlisted");
        std::env::set_var("LC_CHILD_TEST", "allowed");
        let seen = crate::child::testing::scratch("cmd-env").join("env.json");
        let spec = |pass_env: Vec<String>| CommandSpec {
            name: "judge".into(),
            argv: vec!["python3".into(), "-c".into(), PY.into(), seen.display().to_string()],
            cwd: None,
            timeout: Duration::from_secs(20),
            on_error: OnRewardError::Stop,
            pass_env,
            group: false,
        };
        let mut r = CommandReward::new(spec(vec!["CHILD_TEST_PASSED".into()])).unwrap();
        assert_eq!(r.score_batch(&batch()[..1]).unwrap(), vec![RewardOutcome::Score(1.0)]);
        let env: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&seen).unwrap()).unwrap();
        assert_eq!(env["MILES_API_KEY"], json!(null), "{env}");
        assert_eq!(env["MILES_RUN_TOKEN"], json!(null), "{env}");
        assert_eq!(env["CHILD_TEST_NOT_PASSED"], json!(null), "{env}");
        assert_eq!(env["CHILD_TEST_PASSED"], json!("listed"), "{env}");
        assert_eq!(env["HOME"].as_str(), std::env::var("HOME").ok().as_deref(), "{env}");
        // Allow-listed: `LC_*`. (PATH passes too, but a Python launcher may prepend to it.)
        assert_eq!(env["LC_CHILD_TEST"], json!("allowed"), "{env}");
        // Listed or not, the run's own variables are refused before anything starts.
        for bad in ["MILES_API_KEY", "miles_run_token", "A=B", ""] {
            let e = CommandReward::new(spec(vec![bad.into()])).err().expect(bad);
            assert_eq!(e.code, crate::E_SPEC);
            assert!(e.message.starts_with("reward `judge`: `pass_env`: `"), "{e}");
        }
    }

    #[test]
    fn the_program_is_killed_on_drop() {
        let mut r = reward("ok", OnRewardError::Stop, 20_000);
        r.score_batch(&batch()[..1]).unwrap();
        let pid = r.running.as_ref().unwrap().program.child.id();
        drop(r);
        // Reaped by Drop: no process with that id is ours any more.
        let alive =
            std::fs::read_to_string(format!("/proc/{pid}/status")).map(|s| !s.contains("State:\tZ")).unwrap_or(false);
        assert!(!alive);
    }
}
