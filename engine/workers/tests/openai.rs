//! The OpenAI-compatible session server (`OpenAiServer`, the `ChatServer` of `miles run`) over
//! real sockets on loopback, a chat hub with the qwen3 fixture tokenizer and a scripted engine:
//! chat by URL and by header, SSE streaming, a client that disconnects mid-stream, keys.

use miles_runtime::chat::{ChatServer, Hub, HubConfig, SessionInfo};
use miles_runtime::env::tools::ToolFormat;
use miles_runtime::session::Rule;
use miles_runtime::tasks::TokenId;
use miles_runtime::tokenize::{HfTokenizer, Tokenizer};
use miles_runtime::*;
use miles_workers::http::{request_with_key, OpenAiServer};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const KEY: &str = "s3cret-key";
const T: Duration = Duration::from_secs(30);

/// Answers every row with `answer` (canonical ids, then `<|im_end|>`).
struct Echo {
    ids: Vec<TokenId>,
}

impl RolloutEngine for Echo {
    fn generate(&mut self, prompts: &[Vec<TokenId>], n: usize, _: &SamplingParams) -> Result<Vec<Sample>, RunError> {
        Ok((0..prompts.len() * n)
            .map(|k| Sample {
                prompt_index: k / n,
                response: self.ids.clone(),
                logprobs: vec![-0.5; self.ids.len()],
                finish: FinishReason::Stop,
                weight_version: 3,
                routing: None,
            })
            .collect())
    }
    fn weight_version(&self) -> u64 {
        3
    }
    fn load_weights(&mut self, _: &WeightSnapshot) -> Result<(), RunError> {
        Ok(())
    }
}

struct Fixture {
    hub: Arc<Hub>,
    stop: Arc<AtomicBool>,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn fixture() -> Fixture {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/hf/qwen3");
    let h = HfTokenizer::load(&dir).unwrap();
    let mut ids = h.encode("Hello there, friend.", false).unwrap();
    ids.push(h.special().end_of_turn.unwrap());
    let mut defaults = SamplingParams::plain(32, 1);
    defaults.stop_tokens = h.special().stop.clone();
    let config = HubConfig {
        model_name: "qwen3-fixture".into(),
        tool_format: ToolFormat::Hermes,
        rule: Rule::Branching,
        max_context: 4096,
        max_new_tokens: 32,
        defaults,
        max_sessions: 4,
        pinned: false,
    };
    let hub = Arc::new(Hub::new(Arc::new(Tokenizer::Hf(Box::new(h))), config).unwrap());
    hub.open("ep1", SessionInfo::default()).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let (pump_hub, pump_stop) = (hub.clone(), stop.clone());
    std::thread::spawn(move || {
        let mut engine = Echo { ids };
        while !pump_stop.load(Ordering::SeqCst) {
            pump_hub.serve_pending(&mut engine, Duration::from_millis(10)).unwrap();
        }
    });
    Fixture { hub, stop }
}

/// A raw HTTP/1.1 POST; the whole answer as text (headers and body).
fn raw_post(addr: &str, path: &str, headers: &[(&str, &str)], body: &Value) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    let body = body.to_string();
    let mut head = format!("POST {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n", body.len());
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    s.write_all(format!("{head}\r\n{body}").as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

fn auth() -> String {
    format!("Bearer {KEY}")
}

fn messages() -> Value {
    json!([{"role": "user", "content": "Say hello."}])
}

/// The `data:` events of an SSE answer.
fn events(answer: &str) -> Vec<String> {
    answer.lines().filter_map(|l| l.strip_prefix("data: ")).map(str::to_string).collect()
}

#[test]
fn chat_by_url_and_header_with_keys() {
    let f = fixture();
    let server = OpenAiServer::default().start(f.hub.clone(), "127.0.0.1:0", KEY).unwrap();
    let base = server.base_url();
    let (code, models) = request_with_key("GET", &format!("{base}/v1/models"), None, T, Some(KEY)).unwrap();
    assert_eq!((code, models["data"][0]["id"].as_str()), (200, Some("qwen3-fixture")));
    // Keys: none and a wrong one are 401, /health is open.
    for key in [None, Some("wrong")] {
        let (code, _) = request_with_key("GET", &format!("{base}/v1/models"), None, T, key).unwrap();
        assert_eq!(code, 401, "{key:?}");
    }
    let (code, _) = request_with_key("GET", &format!("{base}/health"), None, T, None).unwrap();
    assert_eq!(code, 200);
    // By URL: an OpenAI SDK's base_url = .../sessions/ep1/v1.
    let url = format!("{base}/sessions/ep1/v1/chat/completions");
    let (code, a) = request_with_key("POST", &url, Some(&json!({"messages": messages()})), T, Some(KEY)).unwrap();
    assert_eq!(code, 200, "{a}");
    assert_eq!(a["choices"][0]["message"]["content"], "Hello there, friend.");
    // By header, continuing the same session.
    let mut conv = messages().as_array().unwrap().clone();
    conv.push(a["choices"][0]["message"].clone());
    conv.push(json!({"role": "user", "content": "Again."}));
    let addr = base.trim_start_matches("http://");
    let out = raw_post(
        addr,
        "/v1/chat/completions",
        &[("Authorization", &auth()), ("X-Miles-Session", "ep1")],
        &json!({"messages": conv}),
    );
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    let rec = f.hub.record("ep1").unwrap();
    assert_eq!((rec.turns, rec.branches), (2, 0));
    assert_eq!(rec.session.checkpoints[1].parent, Some(0));
    let (code, s) = request_with_key("GET", &format!("{base}/v1/sessions/ep1"), None, T, Some(KEY)).unwrap();
    assert_eq!((code, s["turns"].as_u64()), (200, Some(2)));
    // An unknown session, and the external layer's routes without one.
    let (code, e) = request_with_key(
        "POST",
        &format!("{base}/sessions/nope/v1/chat/completions"),
        Some(&json!({"messages": messages()})),
        T,
        Some(KEY),
    )
    .unwrap();
    assert_eq!((code, e["error"]["code"].as_str()), (404, Some("session_not_found")));
    let (code, e) = request_with_key("POST", &format!("{base}/v1/sessions"), Some(&json!({})), T, Some(KEY)).unwrap();
    assert_eq!(code, 404, "{e}");
    // Dropping the server stops it.
    drop(server);
    assert!(TcpStream::connect(addr).is_err());
}

#[test]
fn streams_as_sse_and_a_client_that_disconnects_loses_nothing() {
    let f = fixture();
    let server = OpenAiServer::default().start(f.hub.clone(), "127.0.0.1:0", KEY).unwrap();
    let addr = server.base_url().trim_start_matches("http://").to_string();
    let body = json!({"messages": messages(), "stream": true, "stream_options": {"include_usage": true}});
    let out = raw_post(&addr, "/sessions/ep1/v1/chat/completions", &[("Authorization", &auth())], &body);
    assert!(out.contains("content-type: text/event-stream"), "{out}");
    let ev = events(&out);
    assert_eq!(ev.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = ev[..ev.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    assert!(chunks.iter().all(|c| c["object"] == "chat.completion.chunk"));
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String =
        chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect::<Vec<_>>().concat();
    assert_eq!(text, "Hello there, friend.");
    assert!(chunks.iter().any(|c| c["choices"][0]["finish_reason"] == "stop"));
    assert!(chunks.last().unwrap()["usage"]["completion_tokens"].as_u64().unwrap() > 0);
    // A client that reads a few bytes and hangs up: the turn is recorded, the server goes on.
    let before = f.hub.record("ep1").unwrap().turns;
    {
        let mut s = TcpStream::connect(&addr).unwrap();
        let b = body.to_string();
        let head = format!(
            "POST /sessions/ep1/v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nAuthorization: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}",
            auth(),
            b.len()
        );
        s.write_all(head.as_bytes()).unwrap();
        let mut first = [0u8; 16];
        s.read_exact(&mut first).unwrap();
    }
    let until = Instant::now() + T;
    while f.hub.record("ep1").unwrap().turns == before {
        assert!(Instant::now() < until, "the disconnected client's turn was not recorded");
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = raw_post(
        &addr,
        "/sessions/ep1/v1/chat/completions",
        &[("Authorization", &auth())],
        &json!({"messages": messages()}),
    );
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert_eq!(f.hub.record("ep1").unwrap().turns, before + 2);
}
