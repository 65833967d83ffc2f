//! One run of a plug-in layer's program (`agent_program`, `rollout_program`): started through
//! `line_child` (its own process group, an environment cleared to an allow-list plus
//! `pass_env`), given its input as one JSON line on stdin (then end of file), polled by the
//! run's serving loop, killed with its group at its deadline; and the protocol of its answer,
//! the last non-empty stdout line (`{"reward": x}` or `{"rewards": [...]}`, with optional
//! numeric `metrics` and free-form `metadata`; any other field is refused by name). Faults name
//! the program briefly (`brief`) and quote its stderr's tail.

use crate::child::ChildEnv;
use crate::env::EndReason;
use crate::line_child::{LineChild, StderrTail};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long an exited program's stdout may take to reach its end (a grandchild holding the pipe
/// open must not hold the episode). 2 s lost a failing program's stderr from its fault once, on
/// a 2-core machine at load 11 (the reader thread had not run yet); 5 s costs only a program
/// whose grandchild keeps the pipe open.
const DRAIN: Duration = Duration::from_secs(5);

/// Why a program's run gives no reward: the episode's end reason and what happened, with the
/// stderr's last words.
#[derive(Debug, Clone, PartialEq)]
pub struct Fault {
    pub reason: EndReason,
    pub what: String,
}

impl Fault {
    fn new(reason: EndReason, what: impl Into<String>) -> Fault {
        Fault { reason, what: what.into() }
    }
}

/// What the program printed: the last non-empty line, and whether stdout has ended.
#[derive(Default)]
struct Stdout {
    last: Option<String>,
    ended: bool,
}

/// A started program.
pub struct Program {
    child: LineChild,
    out: Arc<Mutex<Stdout>>,
    tail: Arc<Mutex<Option<StderrTail>>>,
    deadline: Instant,
    /// When it exited, and how (`None`: still running).
    exited: Option<(Instant, Option<i32>)>,
    what: String,
}

impl Program {
    /// Starts `argv` with `env` and writes `input` as one line to its stdin, then closes it. An
    /// error is a program that cannot start (a fault of its episode, not of the run).
    pub fn start(
        argv: &[String],
        cwd: Option<&Path>,
        env: &ChildEnv,
        input: &serde_json::Value,
        timeout: Duration,
    ) -> Result<Program, Fault> {
        let out = Arc::new(Mutex::new(Stdout::default()));
        let tail = Arc::new(Mutex::new(None));
        let (o, e, t) = (out.clone(), out.clone(), tail.clone());
        let mut child = LineChild::spawn(
            argv,
            cwd,
            env,
            move |line| {
                if !line.trim().is_empty() {
                    lock(&o).last = Some(line.trim().to_string());
                }
                true
            },
            move |_, stderr| {
                *lock(&t) = Some(stderr.clone());
                lock(&e).ended = true;
            },
        )
        .map_err(|err| Fault::new(EndReason::ProgramFailed, format!("cannot start `{}`: {err}", brief(argv))))?;
        let _ = child.stdin.send(input.to_string());
        // Dropping the only sender ends the writer thread, which closes the program's stdin.
        child.stdin = std::sync::mpsc::channel().0;
        Ok(Program { child, out, tail, deadline: Instant::now() + timeout, exited: None, what: brief(argv) })
    }

    /// `None` while it runs; else its last stdout line, or the fault that ended it. Past its
    /// deadline it is killed with its group.
    pub fn poll(&mut self, now: Instant) -> Option<Result<String, Fault>> {
        if self.exited.is_none() {
            match self.child.child.try_wait() {
                Ok(Some(status)) => self.exited = Some((now, status.code())),
                Ok(None) if now >= self.deadline => {
                    self.child.child.kill();
                    return Some(Err(Fault::new(
                        EndReason::ProgramTimeout,
                        self.quote(format!("`{}` was still running at its deadline and was killed", self.what)),
                    )));
                }
                Ok(None) => return None,
                Err(e) => return Some(Err(Fault::new(EndReason::ProgramFailed, format!("`{}`: {e}", self.what)))),
            }
        }
        let (at, code) = self.exited?;
        let (ended, last) = {
            let o = lock(&self.out);
            (o.ended, o.last.clone())
        };
        if !ended && now.duration_since(at) < DRAIN {
            return None;
        }
        Some(match code {
            Some(0) => last.ok_or_else(|| {
                Fault::new(EndReason::NoReward, self.quote(format!("`{}` exited 0 and printed nothing", self.what)))
            }),
            Some(c) => {
                Err(Fault::new(EndReason::ProgramFailed, self.quote(format!("`{}` exited with status {c}", self.what))))
            }
            None => {
                Err(Fault::new(EndReason::ProgramFailed, self.quote(format!("`{}` was killed by a signal", self.what))))
            }
        })
    }

    /// Kills the program and what it started.
    pub fn kill(&mut self) {
        self.child.child.kill();
    }

    fn quote(&self, what: String) -> String {
        match lock(&self.tail).as_ref() {
            Some(t) => t.quote_after(what),
            None => {
                let last = self.child.stderr_tail();
                if last.is_empty() {
                    what
                } else {
                    format!("{what}; stderr ends: {}", crate::quote::truncate_tail(&last, 400))
                }
            }
        }
    }
}

/// Longest part of a command line after its program that a message quotes, in characters.
const BRIEF_ARGS: usize = 60;

/// A program as a fault message names it: `argv[0]` (at most 120 characters) and the rest of
/// its command line cut to [`BRIEF_ARGS`] characters with its full size, whitespace folded. A
/// program started as `python -c <5 KB source>` must not bury its stderr under its own source.
pub fn brief(argv: &[String]) -> String {
    let fold = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    let Some((first, rest)) = argv.split_first() else { return "(no command)".into() };
    let first = crate::quote::truncate(&fold(first), 120);
    if rest.is_empty() {
        return first;
    }
    let rest = fold(&rest.join(" "));
    match rest.char_indices().nth(BRIEF_ARGS) {
        None => format!("{first} {rest}"),
        Some((i, _)) => format!("{first} {}… (+{} bytes)", &rest[..i], rest.len() - i),
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Most metrics one episode may report (each becomes a column of the metrics row).
pub const MAX_METRICS: usize = 32;
/// Longest metric name, in bytes.
pub const MAX_METRIC_NAME: usize = 64;
/// Largest `metadata`, as compact JSON bytes (samples.jsonl shows it whole).
pub const MAX_METADATA: usize = 16 << 10;

/// What one episode's program (or outside process) reported: its reward, numeric metrics (the
/// step's means are `agent/<name>` columns) and free-form metadata (kept in samples.jsonl).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Answer {
    pub reward: f32,
    pub metrics: Vec<(String, f64)>,
    pub metadata: Option<serde_json::Value>,
}

pub use crate::env::reported::Reported;

impl Answer {
    /// The metrics and metadata, `None` when it reported neither.
    pub fn reported(&self) -> Option<Reported> {
        (!self.metrics.is_empty() || self.metadata.is_some())
            .then(|| Reported { metrics: self.metrics.clone(), metadata: self.metadata.clone() })
    }

    /// An answer from a JSON object holding exactly `reward` and optionally `metrics` and
    /// `metadata` (external_agents' finish body; `null` is none). The error names the field.
    pub fn from_object(v: &serde_json::Value) -> Result<Answer, String> {
        only_keys(v, &["reward", "metrics", "metadata"])?;
        Ok(Answer {
            reward: finite(v.get("reward"), "`reward`").map_err(|f| f.what)?,
            metrics: metrics_of(v.get("metrics"), "metrics")?,
            metadata: metadata_of(v.get("metadata"), "metadata")?,
        })
    }
}

/// `v` is an object with no key outside `keys`: a misspelt `metric` is refused by name rather
/// than dropped.
fn only_keys(v: &serde_json::Value, keys: &[&str]) -> Result<(), String> {
    let Some(m) = v.as_object() else {
        return Err(format!("the answer must be a JSON object, not {}", crate::quote::truncate(&v.to_string(), 80)));
    };
    match m.keys().find(|k| !keys.contains(&k.as_str())) {
        None => Ok(()),
        Some(k) => Err(format!(
            "unknown field {:?} (an answer holds {})",
            crate::quote::truncate(k, 40),
            keys.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", ")
        )),
    }
}

/// An agent program's answer: `{"reward": x, "metrics": {...}?, "metadata": ...?}` on its last
/// stdout line.
pub fn parse_reward(last: &str) -> Result<Answer, Fault> {
    let v = answer(last, "reward")?;
    Answer::from_object(&v).map_err(|what| Fault::new(EndReason::NoReward, what))
}

/// A rollout program's answer: `{"rewards": [...]}`, one finite number per session; optionally
/// `"metrics"` and `"metadata"`, lists with one entry per session too.
pub fn parse_rewards(last: &str, sessions: usize) -> Result<Vec<Answer>, Fault> {
    let v = answer(last, "rewards")?;
    let no_reward = |what: String| Fault::new(EndReason::NoReward, what);
    only_keys(&v, &["rewards", "metrics", "metadata"]).map_err(no_reward)?;
    let list = |key: &str| -> Result<Option<&Vec<serde_json::Value>>, Fault> {
        let l = match v.get(key) {
            None | Some(serde_json::Value::Null) if key != "rewards" => return Ok(None),
            Some(serde_json::Value::Array(l)) => l,
            _ => return Err(no_reward(format!("`{key}` is not a list"))),
        };
        if l.len() != sessions {
            return Err(no_reward(format!("`{key}` has {} entries for {sessions} sessions", l.len())));
        }
        Ok(Some(l))
    };
    let (rewards, metrics, metadata) =
        (list("rewards")?.unwrap_or(&Vec::new()).clone(), list("metrics")?, list("metadata")?);
    let mut out = Vec::with_capacity(sessions);
    for (i, r) in rewards.iter().enumerate() {
        out.push(Answer {
            reward: finite(Some(r), &format!("`rewards[{i}]`"))?,
            metrics: metrics_of(metrics.map(|m| &m[i]), &format!("metrics[{i}]")).map_err(no_reward)?,
            metadata: metadata_of(metadata.map(|m| &m[i]), &format!("metadata[{i}]")).map_err(no_reward)?,
        });
    }
    Ok(out)
}

/// Reported metrics: absent, `null`, or an object of at most [`MAX_METRICS`] names (1 to 64 of
/// `A-Z a-z 0-9 _ . - /`) to finite numbers. `key` names the field in the error.
pub fn metrics_of(v: Option<&serde_json::Value>, key: &str) -> Result<Vec<(String, f64)>, String> {
    let m = match v {
        None | Some(serde_json::Value::Null) => return Ok(Vec::new()),
        Some(serde_json::Value::Object(m)) => m,
        Some(other) => {
            return Err(format!(
                "`{key}` must be an object of numbers, not {}",
                crate::quote::truncate(&other.to_string(), 80)
            ))
        }
    };
    if m.len() > MAX_METRICS {
        return Err(format!("`{key}` has {} entries; an episode reports at most {MAX_METRICS}", m.len()));
    }
    let mut out = Vec::with_capacity(m.len());
    for (name, x) in m {
        let ok = !name.is_empty()
            && name.len() <= MAX_METRIC_NAME
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.-/".contains(&b));
        if !ok {
            return Err(format!(
                "`{key}`: metric name {:?} must be 1 to {MAX_METRIC_NAME} characters of A-Z a-z 0-9 _ . - /",
                crate::quote::truncate(name, 80)
            ));
        }
        match x.as_f64() {
            Some(f) if f.is_finite() => out.push((name.clone(), f)),
            _ => {
                return Err(format!(
                    "`{key}.{name}` is not a finite number: {}",
                    crate::quote::truncate(&x.to_string(), 80)
                ))
            }
        }
    }
    Ok(out)
}

/// Reported metadata: any JSON (`null` and absent are none) of at most [`MAX_METADATA`] bytes.
pub fn metadata_of(v: Option<&serde_json::Value>, key: &str) -> Result<Option<serde_json::Value>, String> {
    match v {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(m) => {
            let n = m.to_string().len();
            if n > MAX_METADATA {
                return Err(format!("`{key}` is {n} bytes of JSON; at most {MAX_METADATA} are kept"));
            }
            Ok(Some(m.clone()))
        }
    }
}

/// The last line as a JSON object holding `key`.
fn answer(last: &str, key: &str) -> Result<serde_json::Value, Fault> {
    match serde_json::from_str::<serde_json::Value>(last) {
        Ok(v) if v.get(key).is_some() => Ok(v),
        _ => Err(Fault::new(
            EndReason::NoReward,
            format!("the last line of stdout is not {{\"{key}\": ...}}: {}", crate::quote::truncate(last, 200)),
        )),
    }
}

/// A reward: a finite number (`null`, a string, NaN or an infinity are no reward).
pub fn finite(v: Option<&serde_json::Value>, what: &str) -> Result<f32, Fault> {
    match v.and_then(serde_json::Value::as_f64) {
        Some(x) if x.is_finite() && (x as f32).is_finite() => Ok(x as f32),
        _ => Err(Fault::new(
            EndReason::NoReward,
            format!("{what} is not a finite number: {}", v.map_or("missing".into(), |v| v.to_string())),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agent_reward_line_is_the_last_json_line() {
        let a = parse_reward(r#"{"reward": 0.5, "metrics": {"calls": 2}}"#).unwrap();
        assert_eq!(a.reward, 0.5);
        assert_eq!(a.metrics, vec![("calls".to_string(), 2.0)]);
        assert_eq!(parse_reward(r#"{"reward": 1}"#).unwrap().reward, 1.0);
        for bad in
            [r#"{"reward": "1"}"#, r#"{"reward": null}"#, r#"{"reward": 1e400}"#, r#"{"score": 1}"#, "done", "1.0"]
        {
            let f = parse_reward(bad).expect_err(bad);
            assert_eq!(f.reason, EndReason::NoReward, "{bad}");
        }
        // f64 finite but not as f32: no reward.
        assert_eq!(parse_reward(r#"{"reward": 1e39}"#).unwrap_err().reason, EndReason::NoReward);
    }

    /// "Never accept and ignore": numeric metrics are kept, anything else in `metrics` is no
    /// reward with the offending key named; `metadata` is kept as given, bounded.
    #[test]
    fn metrics_must_be_numbers_and_metadata_is_kept() {
        let a = parse_reward(r#"{"reward": 1, "metrics": {"calls": 2, "cost.usd": 0.5}, "metadata": {"k": [1]}}"#);
        let a = a.unwrap();
        assert_eq!(a.metrics, vec![("calls".to_string(), 2.0), ("cost.usd".to_string(), 0.5)]);
        assert_eq!(a.metadata, Some(serde_json::json!({"k": [1]})));
        assert_eq!(parse_reward(r#"{"reward": 1, "metrics": null}"#).unwrap().metrics, vec![]);
        let too_many: serde_json::Map<_, _> = (0..=MAX_METRICS).map(|i| (format!("m{i}"), 1.into())).collect();
        let big = "x".repeat(MAX_METADATA);
        for (bad, says) in [
            (r#"{"reward": 1, "metrics": {"calls": "two"}}"#.to_string(), "`metrics.calls`"),
            (r#"{"reward": 1, "metrics": {"ok": true}}"#.into(), "`metrics.ok`"),
            (r#"{"reward": 1, "metrics": {"a b": 1}}"#.into(), "metric name"),
            (r#"{"reward": 1, "metrics": [1]}"#.into(), "`metrics` must be an object"),
            (serde_json::json!({"reward": 1, "metrics": too_many}).to_string(), "at most"),
            (serde_json::json!({"reward": 1, "metadata": big}).to_string(), "`metadata`"),
        ] {
            let f = parse_reward(&bad).expect_err(&bad);
            assert_eq!(f.reason, EndReason::NoReward, "{bad}");
            assert!(f.what.contains(says), "{says}: {}", f.what);
        }
        // A rollout program: one metrics object (and metadata) per session, or none.
        let g = parse_rewards(r#"{"rewards": [1, 0], "metrics": [{"t": 1}, {"t": 3}], "metadata": [null, 7]}"#, 2);
        let g = g.unwrap();
        assert_eq!((g[0].metrics.clone(), g[1].metrics.clone()), (vec![("t".into(), 1.0)], vec![("t".into(), 3.0)]));
        assert_eq!((g[0].metadata.clone(), g[1].metadata.clone()), (None, Some(serde_json::json!(7))));
        let short = parse_rewards(r#"{"rewards": [1, 0], "metrics": [{"t": 1}]}"#, 2).unwrap_err();
        assert!(short.what.contains("`metrics` has 1 entries for 2 sessions"), "{}", short.what);
        let bad = parse_rewards(r#"{"rewards": [1, 0], "metrics": [{"t": 1}, {"t": "x"}]}"#, 2).unwrap_err();
        assert!(bad.what.contains("`metrics[1].t`"), "{}", bad.what);
    }

    /// A field the protocol does not have is refused by name (a misspelt `metric` would
    /// otherwise vanish); what an episode keeps is its metrics and metadata, none when empty.
    #[test]
    fn unknown_fields_are_refused_and_reports_are_kept() {
        for (bad, says) in [
            (r#"{"reward": 1, "metric": {"calls": 2}}"#, "unknown field \"metric\""),
            (r#"{"reward": 1, "score": 1}"#, "unknown field \"score\""),
        ] {
            let f = parse_reward(bad).expect_err(bad);
            assert_eq!(f.reason, EndReason::NoReward);
            assert!(f.what.contains(says) && f.what.contains("`metadata`"), "{}", f.what);
        }
        let f = parse_rewards(r#"{"rewards": [1], "meta": [1]}"#, 1).unwrap_err();
        assert!(f.what.contains("unknown field \"meta\""), "{}", f.what);
        assert_eq!(parse_reward(r#"{"reward": 1}"#).unwrap().reported(), None);
        let a = parse_reward(r#"{"reward": 1, "metadata": "m"}"#).unwrap();
        assert_eq!(a.reported(), Some(Reported { metrics: vec![], metadata: Some(serde_json::json!("m")) }));
        // external_agents' finish body, by the same rules.
        let a = Answer::from_object(&serde_json::json!({"reward": 0.5, "metrics": {"n": 3}})).unwrap();
        assert_eq!((a.reward, a.metrics), (0.5, vec![("n".to_string(), 3.0)]));
        assert!(Answer::from_object(&serde_json::json!([1])).unwrap_err().contains("JSON object"));
        assert!(Answer::from_object(&serde_json::json!({"reward": 1, "extra": 1})).unwrap_err().contains("\"extra\""));
        assert!(Answer::from_object(&serde_json::json!({"metrics": {}})).unwrap_err().contains("`reward`"));
    }

    /// A program is named by its first word and a cut rest, whitespace folded.
    #[test]
    fn a_program_is_named_briefly() {
        let argv = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(brief(&argv(&["python3", "agent.py", "--fast"])), "python3 agent.py --fast");
        assert_eq!(brief(&argv(&["/bin/agent"])), "/bin/agent");
        assert_eq!(brief(&[]), "(no command)");
        let source = format!("import sys\n{}", "x = 1\n".repeat(1000));
        let b = brief(&argv(&["python", "-c", &source, "mod"]));
        assert!(b.starts_with("python -c import sys x = 1 x = 1"), "{b}");
        assert!(b.len() < 120 && b.ends_with("bytes)") && !b.contains('\n'), "{b}");
    }

    #[test]
    fn a_rollout_program_returns_one_reward_per_session() {
        let rewards = |a: Vec<Answer>| a.iter().map(|a| a.reward).collect::<Vec<_>>();
        assert_eq!(rewards(parse_rewards(r#"{"rewards": [1, 0.25]}"#, 2).unwrap()), vec![1.0, 0.25]);
        let short = parse_rewards(r#"{"rewards": [1]}"#, 2).unwrap_err();
        assert!(short.what.contains("`rewards` has 1 entries for 2 sessions"), "{}", short.what);
        let nan = parse_rewards(r#"{"rewards": [1, "x"]}"#, 2).unwrap_err();
        assert!(nan.what.contains("rewards[1]"), "{}", nan.what);
        assert_eq!(parse_rewards(r#"{"rewards": 3}"#, 1).unwrap_err().reason, EndReason::NoReward);
    }

    fn run(script: &str, timeout_ms: u64) -> Result<String, Fault> {
        let argv = vec!["python3".to_string(), "-c".to_string(), script.to_string()];
        let env = ChildEnv::program(&[]).unwrap();
        let input = serde_json::json!({"task": {"prompt": "2*3="}});
        let mut p = Program::start(&argv, None, &env, &input, Duration::from_millis(timeout_ms))?;
        let limit = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(r) = p.poll(Instant::now()) {
                return r;
            }
            assert!(Instant::now() < limit, "the program's run never ended");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn program_faults_end_the_episode_with_a_reason_and_the_stderr_tail() {
        // The task arrives on stdin; the last non-empty line is the answer.
        let ok = run("import json,sys; t=json.load(sys.stdin); print('thinking'); print(json.dumps({'reward': len(t['task']['prompt'])})); print()", 20_000);
        assert_eq!(parse_reward(&ok.unwrap()).unwrap().reward, 4.0);
        let failed = run("import sys; sys.stderr.write('Traceback: boom\\n'); sys.exit(1)", 20_000).unwrap_err();
        assert_eq!(failed.reason, EndReason::ProgramFailed);
        assert!(failed.what.contains("exited with status 1") && failed.what.contains("boom"), "{}", failed.what);
        let hung = run("import time; time.sleep(1000)", 500).unwrap_err();
        assert_eq!(hung.reason, EndReason::ProgramTimeout);
        assert!(hung.what.contains("killed"), "{}", hung.what);
        let silent = run("pass", 20_000).unwrap_err();
        assert_eq!(silent.reason, EndReason::NoReward);
        // A program started as `python3 -c <5 KB source>` is named briefly: the message holds
        // the stderr's last words, not the source.
        let long = format!("import sys\n{}sys.stderr.write('fatal: no model\\n'); sys.exit(2)", "pass\n".repeat(1000));
        let f = run(&long, 20_000).unwrap_err();
        assert!(f.what.starts_with("`python3 -c import sys pass pass"), "{}", f.what);
        assert!(f.what.contains("exited with status 2") && f.what.contains("fatal: no model"), "{}", f.what);
        assert!(f.what.len() < 300, "{} bytes: {}", f.what.len(), f.what);
        let missing = Program::start(
            &["/nonexistent/agent".into()],
            None,
            &ChildEnv::program(&[]).unwrap(),
            &serde_json::json!({}),
            Duration::from_secs(1),
        );
        assert_eq!(missing.err().map(|f| f.reason), Some(EndReason::ProgramFailed));
    }
}
