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
//! started afresh for the next call. Its stderr is kept (the last few KiB) to quote.

pub use crate::spec::env::JsonlSpec;

use super::{Action, EnvFault, Environment, StepResult, Task};
use crate::line_child::LineChild;
use crate::quote::truncate;
use crate::{RunError, E_SPEC};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

type Reply = Result<Value, EnvFault>;

pub struct JsonlEnv {
    spec: JsonlSpec,
    proc: Mutex<Option<Arc<Proc>>>,
    next_id: AtomicU64,
    /// How many times the program was started (1 in a healthy run).
    pub starts: AtomicU64,
}

struct Proc {
    program: Mutex<LineChild>,
    /// Calls waiting for their answer, by request id.
    pending: Arc<Mutex<HashMap<u64, Sender<Reply>>>>,
    /// Why the program is unusable (it exited, its stdout broke); set once.
    dead: Arc<Mutex<Option<String>>>,
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
        Ok(JsonlEnv { spec, proc: Mutex::new(None), next_id: AtomicU64::new(0), starts: AtomicU64::new(0) })
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
        let (p1, p2, d2) = (pending.clone(), pending.clone(), dead.clone());
        let program = LineChild::spawn(
            &self.spec.argv,
            self.spec.cwd.as_deref(),
            move |line| {
                route(&p1, &line);
                true
            },
            move |end, stderr| {
                // Give the exiting program a moment so its last words reach the stderr tail.
                std::thread::sleep(Duration::from_millis(50));
                let what = stderr.quote_after(end.describe("exited"));
                *lock(&d2) = Some(what.clone());
                fail_pending(&p2, &EnvFault::Crashed(what));
            },
        )
        .map_err(|e| EnvFault::Crashed(format!("cannot start `{}`: {e}", self.spec.argv.join(" "))))?;
        self.starts.fetch_add(1, Ordering::Relaxed);
        Ok(Proc { program: Mutex::new(program), pending, dead })
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
                Err(EnvFault::Timeout(format!("no answer within {:.1}s", timeout.as_secs_f64())))
            }
            Err(RecvTimeoutError::Disconnected) => {
                Err(EnvFault::Crashed(lock(&proc.dead).clone().unwrap_or_else(|| "exited".into())))
            }
        }
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
            JsonlEnv::new(JsonlSpec { name: "py".into(), argv: vec![py.into(), "-c".into(), ENV.into()], cwd: None })
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

    #[test]
    fn a_program_that_cannot_start() {
        let env =
            JsonlEnv::new(JsonlSpec { name: "x".into(), argv: vec!["/no/such/program".into()], cwd: None }).unwrap();
        assert!(matches!(env.reset(&task("a"), T), Err(EnvFault::Crashed(m)) if m.starts_with("cannot start")));
        assert!(JsonlEnv::new(JsonlSpec { name: "x".into(), argv: vec![], cwd: None }).is_err());
    }
}
