//! OpenEnv environments against a real server built with `openenv-core` 0.3
//! (tests/fixtures/envs/openenv_guess.py), started here on 127.0.0.1. The Python with
//! `openenv-core` installed is `$MILES_OPENENV_PYTHON`, else /opt/miles-openenv/bin/python
//! (scripts/setup-test-deps.sh installs it); without it the test says it skipped.

use miles_runtime::env::faults::Faults;
use miles_runtime::env::openenv::{OpenEnv, OpenEnvSpec};
use miles_runtime::env::{
    run_episodes, Action, EndReason, EnvFault, Environment, EpisodeLimits, OnEnvError, Task, TurnSample,
};
use miles_runtime::session::ChatCodec;
use miles_runtime::tasks::{CharTokenizer, TokenId, EOS};
use miles_runtime::tokenize::Tokenizer;
use miles_runtime::FinishReason;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn python() -> Option<String> {
    let py = std::env::var("MILES_OPENENV_PYTHON").unwrap_or_else(|_| "/opt/miles-openenv/bin/python".into());
    let ok = Command::new(&py).args(["-c", "import openenv.core.env_server"]).stderr(Stdio::null()).status();
    ok.is_ok_and(|s| s.success()).then_some(py)
}

fn healthy(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else { return false };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let req = format!("GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n");
    let mut out = String::new();
    s.write_all(req.as_bytes()).is_ok() && s.read_to_string(&mut out).is_ok() && out.contains("healthy")
}

fn start() -> Option<(Server, u16)> {
    start_capped(16)
}

/// A server that accepts at most `cap` sessions at once (openenv-core's `max_concurrent_envs`).
fn start_capped(cap: usize) -> Option<(Server, u16)> {
    let Some(py) = python() else {
        eprintln!("skipped: no Python with openenv-core (set MILES_OPENENV_PYTHON or run scripts/setup-test-deps.sh)");
        return None;
    };
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/envs/openenv_guess.py");
    let child =
        Command::new(py).arg(script).arg(port.to_string()).arg(cap.to_string()).stdout(Stdio::null()).spawn().unwrap();
    let server = Server(child);
    // Importing openenv (FastAPI, gradio) takes tens of seconds on a loaded machine.
    let deadline = Instant::now() + Duration::from_secs(180);
    while !healthy(port) {
        assert!(Instant::now() < deadline, "the OpenEnv server did not come up within 180 s");
        std::thread::sleep(Duration::from_millis(250));
    }
    Some((server, port))
}

fn task(i: u64) -> Task {
    Task {
        episode: format!("e{i}"),
        prompt: serde_json::Value::Null,
        label: serde_json::Value::Null,
        metadata: serde_json::json!({}),
        seed: i,
    }
}

fn act(text: &str) -> Action {
    Action { text: text.into(), tool_calls: vec![] }
}

#[test]
fn episodes_against_a_real_openenv_server() {
    let Some((_server, port)) = start() else { return };
    let env = OpenEnv::new(OpenEnvSpec {
        name: "guess".into(),
        url: format!("http://127.0.0.1:{port}"),
        action_field: Some("message".into()),
        observation_field: Some("text".into()),
    })
    .unwrap();
    let t = Duration::from_secs(20);

    // One episode, step by step: the session keeps its state across steps.
    assert_eq!(env.reset(&task(3), t).unwrap(), "guess a digit (e3)");
    let r = env.step("e3", &act("5"), t).unwrap();
    assert_eq!((r.observation.as_str(), r.reward, r.terminated, r.truncated), ("lower", Some(0.0), false, false));
    let r = env.step("e3", &act("it is 3"), t).unwrap();
    assert_eq!((r.observation.as_str(), r.reward, r.terminated), ("right", Some(1.0), true));
    env.close("e3");

    // Many episodes at once over one server, each in its own session.
    std::thread::scope(|s| {
        for i in 10..18u64 {
            let env = &env;
            s.spawn(move || {
                let id = format!("e{i}");
                env.reset(&task(i), t).unwrap();
                let r = env.step(&id, &act(&(i % 10).to_string()), t).unwrap();
                assert!(r.terminated && r.reward == Some(1.0), "{id}: {r:?}");
                env.close(&id);
            });
        }
    });

    // Faults end the episode with a reason; the server goes on.
    env.reset(&task(4), t).unwrap();
    match env.step("e4", &act("crash"), t) {
        Err(EnvFault::Error(m)) => assert!(m.contains("EXECUTION_ERROR") && m.contains("boom"), "{m}"),
        other => panic!("{other:?}"),
    }
    env.close("e4");
    env.reset(&task(5), t).unwrap();
    assert!(matches!(env.step("e5", &act("hang"), Duration::from_millis(500)), Err(EnvFault::Timeout(_))));
    env.close("e5");
    assert!(matches!(env.step("nobody", &act("1"), t), Err(EnvFault::Error(_))));

    // The episode driver against it: a policy that searches the digit from the feedback.
    let tok = Tokenizer::Char(CharTokenizer::new("0123456789 abcdefghijklmnopqrstuvwxyz()".chars()));
    let Tokenizer::Char(chars) = &tok else { unreachable!() };
    let codec = ChatCodec::new(&tok, None).unwrap();
    let decode = |ids: &[TokenId]| -> String {
        ids.iter()
            .filter_map(|&id| "0123456789 abcdefghijklmnopqrstuvwxyz()".chars().find(|&c| chars.id(c) == Some(id)))
            .collect()
    };
    let mut policy = |ctxs: &[Vec<TokenId>]| -> Result<Vec<TurnSample>, miles_runtime::RunError> {
        Ok(ctxs
            .iter()
            .map(|c| {
                // Binary search over the feedback so far.
                let text = decode(c);
                let (mut lo, mut hi) = (0u32, 9u32);
                let mut last = None;
                for w in text.split(' ') {
                    if let Some(d) = w.chars().next().and_then(|ch| ch.to_digit(10)).filter(|_| w.len() == 1) {
                        last = Some(d);
                    }
                    let w = w.trim_start_matches(|ch: char| ch.is_ascii_digit());
                    match (w, last) {
                        ("higher", Some(d)) => lo = d + 1,
                        ("lower", Some(d)) => hi = d.saturating_sub(1),
                        _ => {}
                    }
                }
                let mut ids = chars.encode(&format!(" {} ", (lo + hi) / 2)).unwrap();
                ids.push(EOS);
                let n = ids.len();
                TurnSample {
                    ids,
                    logprobs: vec![0.0; n],
                    versions: vec![1; n],
                    finish: FinishReason::Stop,
                    routing: None,
                }
            })
            .collect())
    };
    let limits = EpisodeLimits { max_turns: 6, concurrency: 4, turn_timeout: t, ..EpisodeLimits::default() };
    let tasks: Vec<Task> = (20..26).map(task).collect();
    let rs = run_episodes(&env, &tasks, &codec, &limits, &mut policy).unwrap();
    for r in &rs {
        assert_eq!(
            (r.end, r.reward, r.retokenize_mismatch),
            (EndReason::Done, 1.0, 0),
            "{}: {:?}",
            r.task.episode,
            r.fault
        );
        assert!(r.turns <= 4);
    }
}

/// Issue #41: a server that accepts one session at once refuses the others; each refused episode
/// ends `env_refused` (not `env_error`), its message names the server's cap, and the step's warning
/// line says so.
#[test]
fn a_session_refused_at_the_servers_cap_is_named() {
    let Some((_server, port)) = start_capped(1) else { return };
    let url = format!("http://127.0.0.1:{port}");
    let env = OpenEnv::new(OpenEnvSpec {
        name: "guess".into(),
        url: url.clone(),
        action_field: Some("message".into()),
        observation_field: Some("text".into()),
    })
    .unwrap();
    let tok = Tokenizer::Char(CharTokenizer::new("0123456789 abcdefghijklmnopqrstuvwxyz()".chars()));
    let codec = ChatCodec::new(&tok, None).unwrap();
    let Tokenizer::Char(chars) = &tok else { unreachable!() };
    // Guesses 0..9 in turn: the one episode the server serves ends `done` within 10 turns.
    let mut turn = 0u32;
    let mut policy = |ctxs: &[Vec<TokenId>]| -> Result<Vec<TurnSample>, miles_runtime::RunError> {
        let guess = turn % 10;
        turn += 1;
        Ok(ctxs
            .iter()
            .map(|_| {
                let mut ids = chars.encode(&format!(" {guess} ")).unwrap();
                ids.push(EOS);
                let n = ids.len();
                TurnSample {
                    ids,
                    logprobs: vec![0.0; n],
                    versions: vec![1; n],
                    finish: FinishReason::Stop,
                    routing: None,
                }
            })
            .collect())
    };
    let t = Duration::from_secs(20);
    let limits = EpisodeLimits { max_turns: 10, concurrency: 4, turn_timeout: t, ..EpisodeLimits::default() };
    let tasks: Vec<Task> = (30..34).map(task).collect();
    let rs = run_episodes(&env, &tasks, &codec, &limits, &mut policy).unwrap();
    let refused: Vec<_> = rs.iter().filter(|r| r.end == EndReason::EnvRefused).collect();
    assert_eq!(refused.len(), 3, "{:?}", rs.iter().map(|r| (r.end, r.fault.clone())).collect::<Vec<_>>());
    let what = refused[0].fault.clone().unwrap_or_default();
    assert!(what.contains(&format!("the server at ws://127.0.0.1:{port}/ws accepts 1 session(s) at once")), "{what}");
    assert!(what.contains("CAPACITY_REACHED"), "{what}");
    let f = Faults::of(&rs, OnEnvError::Drop);
    let line = f.warning("step 1").unwrap();
    assert!(line.starts_with("step 1: 3 of 4 episodes faulted (env_refused 3: \"the server at ws://"), "{line}");
}
