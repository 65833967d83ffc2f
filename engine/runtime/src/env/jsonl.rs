//! `jsonl` environments: a user's program, in any language, started once and serving many
//! episodes at once over JSON lines. Each request line carries an `id` the answer line repeats, so
//! answers may come in any order:
//!
//! ```text
//! -> {"id": 1, "op": "reset", "episode": "s0/e3", "task": {"episode": ..., "prompt": ..., "label": ..., "metadata": ..., "seed": 7}}
//! <- {"id": 1, "observation": "37*59=?"}
//! -> {"id": 2, "op": "step", "episode": "s0/e3", "action": {"text": "...", "tool_calls": [{"name": "calc", "arguments": "37*59"}]}}
//! <- {"id": 2, "observation": "<result>2183</result>", "reward": null, "terminated": false, "truncated": false}
//! -> {"id": 3, "op": "close", "episode": "s0/e3"}          (no answer expected)
//! <- {"id": 4, "error": "what went wrong"}                  (ends that episode: env_error)
//! ```
//!
//! A call with no answer in time ends its episode (`env_timeout`); a line that is not JSON or has
//! no `id` fails every waiting episode (`env_malformed`: whose it was cannot be known); a program
//! that exits fails every waiting episode (`env_crashed`, quoting its status and stderr) and is
//! started afresh for the next call. Its stderr is kept (the last few KiB) to quote, and, in a run,
//! appended whole to `OUT/env/<name>.stderr.log` (across restarts; bounded, `STDERR_LOG_CAP`).
//!
//! A program that answers none of `WEDGED_AFTER` calls in a row is wedged: the call that saw it
//! fails (`env_timeout`), the program is killed with everything it started (its process group;
//! the calls still waiting on it fail as `env_crashed`), the console says so, and the next call
//! starts it afresh; at most `MAX_WEDGED_RESTARTS` times a run, after which it is left running
//! and its calls keep timing out. It starts through `child::spawn`: its environment is
//! `child::BASE_ENV` and the recipe's `pass_env`, and it dies with the run.

pub use crate::spec::env::JsonlSpec;

use super::{Action, EnvFault, Environment, StepResult, Task};
use crate::child::ChildEnv;
use crate::line_child::{LineChild, StderrLog, STDERR_LOG_CAP};
use crate::quote::truncate;
use crate::{RunError, E_SPEC};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

type Reply = Result<Value, EnvFault>;

/// Calls in a row the program answers nothing to (each timing out) before it counts as wedged.
pub const WEDGED_AFTER: u32 = 3;
/// Restarts of a wedged program within one run.
pub const MAX_WEDGED_RESTARTS: u32 = 3;

pub struct JsonlEnv {
    spec: JsonlSpec,
    env: ChildEnv,
    proc: Mutex<Option<Arc<Proc>>>,
    next_id: AtomicU64,
    /// How many times the program was started (1 in a healthy run).
    pub starts: AtomicU64,
    /// How many times a wedged program was killed to be started again.
    pub wedged_restarts: AtomicU32,
    /// The console was told that no restart is left.
    gave_up: AtomicBool,
    /// Where the program's stderr is appended (`keep_log_in`), else nowhere but the tail.
    log: Mutex<Option<std::path::PathBuf>>,
}

struct Proc {
    program: Mutex<LineChild>,
    /// Calls waiting for their answer, by request id.
    pending: Arc<Mutex<HashMap<u64, Sender<Reply>>>>,
    /// Why the program is unusable (it exited, its stdout broke); set once.
    dead: Arc<Mutex<Option<String>>>,
    /// Calls that timed out since the program last answered anything.
    silent: Arc<AtomicU32>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Fails every waiting call with `fault`.
fn fail_pending(pending: &Mutex<HashMap<u64, Sender<Reply>>>, fault: &EnvFault) {
    for (_, tx) in lock(pending).drain() {
        let _ = tx.send(Err(fault.clone()));
    }
}

impl JsonlEnv {
    pub fn new(spec: JsonlSpec) -> Result<JsonlEnv, RunError> {
        if spec.argv.is_empty() {
            return Err(RunError::new(E_SPEC, format!("environment `{}`: `command` is empty", spec.name)));
        }
        let env = ChildEnv::program(&spec.pass_env)
            .map_err(|why| RunError::new(E_SPEC, format!("environment `{}`: `pass_env`: {why}", spec.name)))?;
        Ok(JsonlEnv {
            spec,
            env,
            proc: Mutex::new(None),
            next_id: AtomicU64::new(0),
            starts: AtomicU64::new(0),
            wedged_restarts: AtomicU32::new(0),
            gave_up: AtomicBool::new(false),
            log: Mutex::new(None),
        })
    }

    /// The running program, started (again) when there is none or it died.
    fn running(&self) -> Result<Arc<Proc>, EnvFault> {
        let mut slot = lock(&self.proc);
        if let Some(p) = slot.as_ref() {
            if lock(&p.dead).is_none() {
                return Ok(p.clone());
            }
        }
        let p = Arc::new(self.start()?);
        *slot = Some(p.clone());
        Ok(p)
    }

    fn start(&self) -> Result<Proc, EnvFault> {
        let pending: Arc<Mutex<HashMap<u64, Sender<Reply>>>> = Arc::default();
        let dead: Arc<Mutex<Option<String>>> = Arc::default();
        let silent: Arc<AtomicU32> = Arc::default();
        let (p1, p2, d2, s1) = (pending.clone(), pending.clone(), dead.clone(), silent.clone());
        let log_path = lock(&self.log).clone();
        let log = log_path.clone().map(|p| StderrLog::new(p, STDERR_LOG_CAP));
        let program = LineChild::spawn_logged(
            &self.spec.argv,
            self.spec.cwd.as_deref(),
            &self.env,
            log,
            move |line| {
                s1.store(0, Ordering::Relaxed);
                route(&p1, &line);
                true
            },
            move |end, stderr| {
                // Give the exiting program a moment so its last words reach the stderr tail.
                std::thread::sleep(Duration::from_millis(50));
                let mut what = stderr.quote_after(end.describe("exited"));
                if let Some(p) = &log_path {
                    what.push_str(&format!(" (its whole stderr: {})", p.display()));
                }
                *lock(&d2) = Some(what.clone());
                fail_pending(&p2, &EnvFault::Crashed(what));
            },
        )
        .map_err(|e| EnvFault::Crashed(format!("cannot start `{}`: {e}", self.spec.argv.join(" "))))?;
        self.starts.fetch_add(1, Ordering::Relaxed);
        Ok(Proc { program: Mutex::new(program), pending, dead, silent })
    }

    /// One request and its answer (an object without `error`).
    fn call(&self, mut request: Value, timeout: Duration) -> Result<Value, EnvFault> {
        let proc = self.running()?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        request["id"] = json!(id);
        let (tx, rx) = mpsc::channel();
        lock(&proc.pending).insert(id, tx);
        if lock(&proc.program).stdin.send(request.to_string()).is_err() {
            lock(&proc.pending).remove(&id);
            return Err(EnvFault::Crashed("its stdin is closed".into()));
        }
        match rx.recv_timeout(timeout) {
            Ok(Ok(answer)) => match answer.get("error") {
                Some(e) if !e.is_null() => Err(EnvFault::Error(truncate(
                    e.as_str().map(str::to_string).unwrap_or(e.to_string()).as_str(),
                    400,
                ))),
                _ => Ok(answer),
            },
            Ok(Err(fault)) => Err(fault),
            Err(RecvTimeoutError::Timeout) => {
                lock(&proc.pending).remove(&id);
                if proc.silent.fetch_add(1, Ordering::Relaxed) + 1 >= WEDGED_AFTER {
                    self.restart_wedged(&proc);
                }
                Err(EnvFault::Timeout(format!("no answer within {:.1}s", timeout.as_secs_f64())))
            }
            Err(RecvTimeoutError::Disconnected) => {
                Err(EnvFault::Crashed(lock(&proc.dead).clone().unwrap_or_else(|| "exited".into())))
            }
        }
    }
}

impl JsonlEnv {
    /// Kills `proc`, wedged, with its process group, so that the next call starts the program
    /// afresh; unless another call did already, or no restart is left.
    fn restart_wedged(&self, proc: &Arc<Proc>) {
        let mut slot = lock(&self.proc);
        if !slot.as_ref().is_some_and(|p| Arc::ptr_eq(p, proc)) {
            return;
        }
        let (name, pid) = (&self.spec.name, lock(&proc.program).child.id());
        let done = self.wedged_restarts.load(Ordering::Relaxed);
        if done >= MAX_WEDGED_RESTARTS {
            if !self.gave_up.swap(true, Ordering::Relaxed) {
                eprintln!(
                    "miles run: environment `{name}`: its program (process {pid}) answers no call in time; \
                     restarted {MAX_WEDGED_RESTARTS} times already, it is left running and its episodes time out"
                );
            }
            return;
        }
        self.wedged_restarts.store(done + 1, Ordering::Relaxed);
        eprintln!(
            "miles run: environment `{name}`: its program (process {pid}) answered none of the last {WEDGED_AFTER} \
             calls in time; killing it with what it started and starting it again (restart {} of {MAX_WEDGED_RESTARTS})",
            done + 1
        );
        let why = format!("killed by the run: it answered none of {WEDGED_AFTER} calls in a row in time");
        *lock(&proc.dead) = Some(why.clone());
        fail_pending(&proc.pending, &EnvFault::Crashed(why));
        lock(&proc.program).child.kill();
        *slot = None;
    }
}

/// Hands one answer line to the call waiting for its id.
fn route(pending: &Mutex<HashMap<u64, Sender<Reply>>>, line: &str) {
    let line = line.trim();
    if line.is_empty() {
        return;
    }
    let v: Value = match serde_json::from_str(line) {
        Ok(v) => v,
        Err(e) => {
            let f = EnvFault::Malformed(format!("answered a line that is not JSON ({e}): {}", truncate(line, 200)));
            return fail_pending(pending, &f);
        }
    };
    let Some(id) = v.get("id").and_then(Value::as_u64) else {
        let f = EnvFault::Malformed(format!("answered a line without a numeric `id`: {}", truncate(line, 200)));
        return fail_pending(pending, &f);
    };
    // An answer nobody waits for (a call that timed out, a `close`) is dropped.
    if let Some(tx) = lock(pending).remove(&id) {
        let _ = tx.send(Ok(v));
    }
}

/// The fields of a step answer; `done` is taken for `terminated` (OpenEnv's and Gym's old name).
pub(crate) fn step_result(v: &Value) -> Result<StepResult, EnvFault> {
    let observation = match v.get("observation") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => String::new(),
        Some(other) => other.to_string(),
    };
    let reward = match v.get("reward") {
        None | Some(Value::Null) => None,
        Some(r) => Some(
            r.as_f64()
                .filter(|x| x.is_finite())
                .ok_or_else(|| EnvFault::Malformed(format!("`reward` is not a finite number: {r}")))?
                as f32,
        ),
    };
    let flag = |k: &str| -> Result<bool, EnvFault> {
        match v.get(k) {
            None | Some(Value::Null) => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(o) => Err(EnvFault::Malformed(format!("`{k}` is not a boolean: {o}"))),
        }
    };
    Ok(StepResult {
        observation,
        reward,
        terminated: flag("terminated")? || flag("done")?,
        truncated: flag("truncated")?,
    })
}

impl Environment for JsonlEnv {
    fn name(&self) -> &str {
        &self.spec.name
    }

    fn reset(&self, task: &Task, timeout: Duration) -> Result<String, EnvFault> {
        let a = self.call(json!({"op": "reset", "episode": task.episode, "task": task}), timeout)?;
        match a.get("observation") {
            Some(Value::String(s)) => Ok(s.clone()),
            _ => Err(EnvFault::Malformed(format!(
                "a reset answer needs a string `observation`: {}",
                truncate(&a.to_string(), 200)
            ))),
        }
    }

    fn step(&self, episode: &str, action: &Action, timeout: Duration) -> Result<StepResult, EnvFault> {
        step_result(&self.call(json!({"op": "step", "episode": episode, "action": action}), timeout)?)
    }

    fn keep_log_in(&self, dir: &std::path::Path) {
        *lock(&self.log) = Some(dir.join(format!("{}.stderr.log", self.spec.name)));
    }

    fn close(&self, episode: &str) {
        if let Ok(p) = self.running() {
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            let _ = lock(&p.program).stdin.send(json!({"id": id, "op": "close", "episode": episode}).to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::ToolFormat;

    fn python() -> Option<&'static str> {
        ["python3", "python"]
            .into_iter()
            .find(|p| std::process::Command::new(p).arg("-c").arg("pass").status().is_ok_and(|s| s.success()))
    }

    /// A Python environment: `37*59=?`-style echo with misbehaviours picked by the action text.
    const ENV: &str = r#"
import json, os, sys, time, threading
lock = threading.Lock()
def send(o):
    with lock:
        sys.stdout.write(json.dumps(o) + "\n"); sys.stdout.flush()
def handle(r):
    op, a = r["op"], r.get("action", {})
    text = a.get("text", "")
    if op == "reset":
        return send({"id": r["id"], "observation": "hello " + r["task"]["episode"]})
    if op == "close":
        return
    if text == "hang":
        return
    if text == "slow":
        time.sleep(0.3)
    if text == "crash":
        sys.stderr.write("boom\n"); sys.stderr.flush(); os._exit(3)
    if text == "garbage":
        sys.stdout.write("not json\n"); sys.stdout.flush(); return
    if text == "error":
        return send({"id": r["id"], "error": "no such move"})
    if text == "badreward":
        return send({"id": r["id"], "observation": "x", "reward": "high"})
    if text.startswith("getenv "):
        return send({"id": r["id"], "observation": str(os.environ.get(text[7:]))})
    calls = a.get("tool_calls", [])
    send({"id": r["id"], "observation": "saw %s %d" % (text, len(calls)), "reward": 0.5, "done": text == "end"})
for line in sys.stdin:
    r = json.loads(line)
    threading.Thread(target=handle, args=(r,)).start()
"#;

    fn env() -> Option<JsonlEnv> {
        let Some(py) = python() else {
            eprintln!("skipped: no python3 on PATH");
            return None;
        };
        Some(
            JsonlEnv::new(JsonlSpec {
                name: "py".into(),
                argv: vec![py.into(), "-c".into(), ENV.into()],
                cwd: None,
                pass_env: vec![],
            })
            .unwrap(),
        )
    }

    fn task(id: &str) -> Task {
        Task { episode: id.into(), prompt: json!("q"), label: Value::Null, metadata: json!({}), seed: 0 }
    }

    fn act(text: &str) -> Action {
        Action { text: text.into(), tool_calls: ToolFormat::Tag.parse(text).unwrap_or_default() }
    }

    const T: Duration = Duration::from_secs(5);

    #[test]
    fn many_episodes_over_one_process() {
        let Some(env) = env() else { return };
        std::thread::scope(|s| {
            for i in 0..8 {
                let env = &env;
                s.spawn(move || {
                    let id = format!("e{i}");
                    assert_eq!(env.reset(&task(&id), T).unwrap(), format!("hello {id}"));
                    let r = env.step(&id, &act(if i % 2 == 0 { "slow" } else { "<tool>calc 1</tool>" }), T).unwrap();
                    let want = if i % 2 == 0 { "saw slow 0" } else { "saw <tool>calc 1</tool> 1" };
                    assert_eq!(r.observation, want);
                    assert_eq!(r.reward, Some(0.5));
                    assert!(env.step(&id, &act("end"), T).unwrap().terminated);
                    env.close(&id);
                });
            }
        });
        assert_eq!(env.starts.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn faults_end_episodes_not_the_program() {
        let Some(env) = env() else { return };
        env.reset(&task("a"), T).unwrap();
        let short = Duration::from_millis(200);
        assert!(matches!(env.step("a", &act("hang"), short), Err(EnvFault::Timeout(_))));
        assert_eq!(env.step("a", &act("error"), T), Err(EnvFault::Error("no such move".into())));
        assert!(matches!(env.step("a", &act("badreward"), T), Err(EnvFault::Malformed(m)) if m.contains("`reward`")));
        assert!(matches!(env.step("a", &act("garbage"), T), Err(EnvFault::Malformed(m)) if m.contains("not JSON")));
        let crash = env.step("a", &act("crash"), T).unwrap_err();
        assert!(matches!(&crash, EnvFault::Crashed(m) if m.contains("exited") && m.contains("boom")), "{crash:?}");
        // Started afresh for the next call.
        assert_eq!(env.reset(&task("b"), T).unwrap(), "hello b");
        assert_eq!(env.starts.load(Ordering::Relaxed), 2);
    }

    /// Issue #41: a crashed program's stderr is kept whole in the run directory, across restarts,
    /// and the crash's message names where.
    #[test]
    fn the_programs_stderr_is_appended_to_its_log_across_restarts() {
        let Some(env) = env() else { return };
        let dir = std::env::temp_dir().join(format!("miles-env-log-{}", std::process::id()));
        std::fs::remove_dir_all(&dir).ok();
        env.keep_log_in(&dir);
        let log = dir.join("py.stderr.log");
        for round in ["a", "b"] {
            env.reset(&task(round), T).unwrap();
            let crash = env.step(round, &act("crash"), T).unwrap_err();
            let m = crash.what();
            assert!(m.contains("boom") && m.contains(&log.display().to_string()), "{m}");
        }
        let text = std::fs::read_to_string(&log).unwrap();
        assert_eq!(text.lines().filter(|l| *l == "boom").count(), 2, "{text}");
        assert_eq!(text.matches("--- miles: `").count(), 2, "one header per start: {text}");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_stderr_log_is_bounded() {
        let dir = std::env::temp_dir().join(format!("miles-env-log-cap-{}", std::process::id()));
        std::fs::remove_dir_all(&dir).ok();
        let path = dir.join("x.stderr.log");
        let mut log = StderrLog::new(path.clone(), 100);
        for _ in 0..5 {
            log.append(&[b'x'; 40]);
        }
        let len = |p: &std::path::Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
        // 40, 80, then past 100: the 80 become x.stderr.log.1 (twice), and the newest 40 stay.
        assert_eq!((len(&path), len(&dir.join("x.stderr.log.1"))), (40, 80));
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_wedged_program_is_killed_with_what_it_started_and_restarted_a_bounded_number_of_times() {
        let Some(py) = python() else { return };
        // Each start records `PID GRANDCHILD` in DIR/starts; `wedge` blocks its only reader.
        const WEDGING: &str = r#"
import json, os, subprocess, sys, time
g = subprocess.Popen(["sleep", "1000"])
with open(sys.argv[1] + "/starts", "a") as f:
    f.write("%d %d\n" % (os.getpid(), g.pid))
for line in sys.stdin:
    r = json.loads(line)
    if r["op"] == "reset":
        print(json.dumps({"id": r["id"], "observation": "hello " + r["task"]["episode"]}), flush=True)
    elif r["op"] == "step":
        if r["action"]["text"] == "wedge":
            time.sleep(1000)
        print(json.dumps({"id": r["id"], "observation": "ok"}), flush=True)
"#;
        let dir = crate::child::testing::scratch("jsonl-wedged");
        let env = JsonlEnv::new(JsonlSpec {
            name: "py".into(),
            argv: vec![py.into(), "-c".into(), WEDGING.into(), dir.display().to_string()],
            cwd: None,
            pass_env: vec![],
        })
        .unwrap();
        let short = Duration::from_millis(150);
        let started = |n: usize| -> Vec<(u32, u32)> {
            let t0 = std::time::Instant::now();
            loop {
                let text = std::fs::read_to_string(dir.join("starts")).unwrap_or_default();
                let pids: Vec<(u32, u32)> = text
                    .lines()
                    .filter_map(|l| l.split_once(' ').and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?))))
                    .collect();
                if pids.len() >= n || t0.elapsed() > T {
                    return pids;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        };
        for round in 1..=MAX_WEDGED_RESTARTS as usize + 1 {
            let ep = format!("e{round}");
            // The run continues: the program (started afresh after each restart) answers.
            assert_eq!(env.reset(&task(&ep), T).unwrap(), format!("hello {ep}"));
            assert_eq!(env.step(&ep, &act("fine"), T).unwrap().observation, "ok");
            let (pid, grandchild) = started(round)[round - 1];
            // Each call that saw the wedge fails as a timeout: counted, not lost.
            for _ in 0..WEDGED_AFTER {
                assert!(matches!(env.step(&ep, &act("wedge"), short), Err(EnvFault::Timeout(_))));
            }
            let restarted = round <= MAX_WEDGED_RESTARTS as usize;
            assert_eq!(env.wedged_restarts.load(Ordering::Relaxed), round.min(MAX_WEDGED_RESTARTS as usize) as u32);
            if restarted {
                assert!(crate::child::testing::gone(pid), "round {round}: the wedged program {pid} lives");
                assert!(crate::child::testing::gone(grandchild), "round {round}: its `sleep` {grandchild} lives");
            } else {
                // No restart left: it is left running.
                assert!(crate::child::testing::alive(pid) && crate::child::testing::alive(grandchild));
            }
        }
        assert_eq!(env.starts.load(Ordering::Relaxed), MAX_WEDGED_RESTARTS as u64 + 1);
    }

    #[test]
    fn a_program_sees_pass_env_and_not_the_run_secrets() {
        let Some(py) = python() else { return };
        // Names no other test of this process sets differently.
        std::env::set_var("MILES_API_KEY", "secret-key");
        std::env::set_var("CHILD_TEST_PASSED", "listed");
        std::env::set_var("CHILD_TEST_NOT_PASSED", "unlisted");
        let spec = |pass_env: Vec<String>| JsonlSpec {
            name: "py".into(),
            argv: vec![py.into(), "-c".into(), ENV.into()],
            cwd: None,
            pass_env,
        };
        let env = JsonlEnv::new(spec(vec!["CHILD_TEST_PASSED".into()])).unwrap();
        env.reset(&task("a"), T).unwrap();
        let seen = |name: &str| env.step("a", &act(&format!("getenv {name}")), T).unwrap().observation;
        assert_eq!(seen("MILES_API_KEY"), "None");
        assert_eq!(seen("CHILD_TEST_NOT_PASSED"), "None");
        assert_eq!(seen("CHILD_TEST_PASSED"), "listed");
        assert_eq!(seen("HOME"), std::env::var("HOME").unwrap_or("None".into()));
        let e = JsonlEnv::new(spec(vec!["MILES_RUN_TOKEN".into()])).err().expect("refused");
        assert!(
            e.message.starts_with("environment `py`: `pass_env`: `MILES_RUN_TOKEN` is one of the run's own"),
            "{e}"
        );
    }

    #[test]
    fn a_program_that_cannot_start() {
        let env = JsonlEnv::new(JsonlSpec {
            name: "x".into(),
            argv: vec!["/no/such/program".into()],
            cwd: None,
            pass_env: vec![],
        })
        .unwrap();
        assert!(matches!(env.reset(&task("a"), T), Err(EnvFault::Crashed(m)) if m.starts_with("cannot start")));
        assert!(JsonlEnv::new(JsonlSpec { name: "x".into(), argv: vec![], cwd: None, pass_env: vec![] }).is_err());
    }
}
