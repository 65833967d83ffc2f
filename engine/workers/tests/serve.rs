//! `miles serve`'s HTTP server under hostile and heavy use, over real sockets on loopback, with a
//! fake engine (no libtorch): `n` in sampling params, request limits, the explicit body limit,
//! slow bodies, the bounded queue, the whole-request timeout, answers that never wait for the
//! engine, and the Host check that stands in for a key on loopback.

use miles_runtime::tasks::TokenId;
use miles_runtime::*;
use miles_workers::http::{request, serve, Limits, Loader, ServeOptions};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[path = "../../../bench/serve-load/driver.rs"]
mod driver;

/// Sample k of a prompt answers `[seed + k, prompt length]`, so a test can tell which seed and
/// which prompt produced it; each call sleeps `delay` (a long generation holding the engine).
struct Fake {
    version: u64,
    delay: Duration,
    calls: Arc<AtomicUsize>,
}

impl RolloutEngine for Fake {
    fn generate(&mut self, prompts: &[Vec<TokenId>], n: usize, p: &SamplingParams) -> Result<Vec<Sample>, RunError> {
        // A real engine would try to allocate this; the fake refuses, so a test of the limits
        // fails (500, not 400) instead of exhausting the test machine's memory.
        if prompts.len().saturating_mul(n) > 100_000 || p.max_new_tokens > 1_000_000 {
            return Err(RunError::new(E_BACKEND, format!("fake engine: {} x {n} samples", prompts.len())));
        }
        self.calls.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(self.delay);
        Ok((0..prompts.len())
            .flat_map(|i| (0..n).map(move |k| (i, k)))
            .map(|(i, k)| Sample {
                prompt_index: i,
                response: vec![(p.seed + k as u64) as TokenId, prompts[i].len() as TokenId],
                logprobs: vec![-0.5, -0.25],
                finish: FinishReason::Stop,
                weight_version: self.version,
                routing: None,
            })
            .collect())
    }
    fn weight_version(&self) -> u64 {
        self.version
    }
    fn load_weights(&mut self, _: &WeightSnapshot) -> Result<(), RunError> {
        Ok(())
    }
}

struct Server {
    base: String,
    addr: String,
    calls: Arc<AtomicUsize>,
}

/// Starts the server on 127.0.0.1:0 in this process (it serves until the test binary ends).
fn start(limits: Limits, api_key: Option<&str>, delay: Duration) -> Server {
    let dir = std::env::temp_dir().join(format!("miles-serve-test-{}-{}", std::process::id(), next_id()));
    std::fs::create_dir_all(dir.join("model")).unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let loader: Loader = Arc::new(move |_, version| {
        Ok(Box::new(Fake { version, delay, calls: c.clone() }) as Box<dyn RolloutEngine + Send>)
    });
    let opts = ServeOptions {
        bind: "127.0.0.1:0".into(),
        model_path: dir.join("model"),
        weights_dir: Some(dir),
        api_key: api_key.map(String::from),
        limits,
        chat: Err("no tokenizer in this test".into()),
    };
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let r = serve(opts, loader, |a| tx.send(a.to_string()).unwrap());
        panic!("the server ended: {r:?}");
    });
    let addr = rx.recv_timeout(Duration::from_secs(30)).expect("the server did not start");
    Server { base: format!("http://{addr}"), addr, calls }
}

fn next_id() -> usize {
    static N: AtomicUsize = AtomicUsize::new(0);
    N.fetch_add(1, Ordering::SeqCst)
}

const T: Duration = Duration::from_secs(30);

fn post(s: &Server, path: &str, body: &Value) -> (u16, Value) {
    request("POST", &format!("{}{path}", s.base), Some(body), T).unwrap()
}

fn get(s: &Server, path: &str) -> (u16, Value) {
    request("GET", &format!("{}{path}", s.base), None, T).unwrap()
}

/// The error message of a refusal.
fn message(v: &Value) -> &str {
    v["error"]["message"].as_str().unwrap_or("")
}

/// Writes `head` and then each body piece after its pause; returns the status and the answer's
/// text (None: the server closed the connection without an answer).
fn raw(addr: &str, head: &str, pieces: &[(&[u8], Duration)]) -> (Option<u16>, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(head.as_bytes()).unwrap();
    for (p, pause) in pieces {
        std::thread::sleep(*pause);
        if s.write_all(p).is_err() {
            break;
        }
    }
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    (text.split_whitespace().nth(1).and_then(|c| c.parse().ok()), text)
}

#[test]
fn n_in_sampling_params_gives_n_completions_per_prompt_as_sglang_does() {
    let s = start(Limits::default(), None, Duration::ZERO);
    // One parameter set for a batch: prompt-major, n answers per prompt.
    let (code, v) = post(
        &s,
        "/generate",
        &json!({"input_ids": [[5, 6], [7]], "sampling_params": {"n": 3, "sampling_seed": 10, "max_new_tokens": 2}}),
    );
    assert_eq!(code, 200, "{v}");
    let got: Vec<&Value> = v.as_array().unwrap().iter().map(|x| &x["output_ids"]).collect();
    assert_eq!(
        got,
        [&json!([10, 2]), &json!([11, 2]), &json!([12, 2]), &json!([10, 1]), &json!([11, 1]), &json!([12, 1])]
    );
    // One parameter set per prompt, each with n (SGLang wants the same n in all).
    let (code, v) = post(
        &s,
        "/generate",
        &json!({"input_ids": [[5, 6], [7]], "sampling_params": [{"n": 2, "sampling_seed": 4}, {"n": 2, "sampling_seed": 8}]}),
    );
    assert_eq!(code, 200, "{v}");
    let got: Vec<&Value> = v.as_array().unwrap().iter().map(|x| &x["output_ids"]).collect();
    assert_eq!(got, [&json!([4, 2]), &json!([5, 2]), &json!([8, 1]), &json!([9, 1])]);
    let (code, v) = post(&s, "/generate", &json!({"input_ids": [[5], [7]], "sampling_params": [{"n": 2}, {"n": 3}]}));
    assert_eq!(code, 400, "{v}");
    assert!(message(&v).contains("same `n`"), "{v}");
    for bad in [json!(0), json!(-1), json!(1.5), json!("2")] {
        let (code, v) = post(&s, "/generate", &json!({"input_ids": [5], "sampling_params": {"n": bad}}));
        assert_eq!(code, 400, "n = {bad}: {v}");
    }
    // The older client's shape (each prompt repeated n times, seeds counting up) is the same
    // generation: one engine call per prompt, the same answers.
    let before = s.calls.load(Ordering::SeqCst);
    let sp: Vec<Value> = (0..3).map(|k| json!({"sampling_seed": 10 + k})).collect();
    let (code, v) = post(&s, "/generate", &json!({"input_ids": [[5, 6], [5, 6], [5, 6]], "sampling_params": sp}));
    assert_eq!(code, 200, "{v}");
    let got: Vec<&Value> = v.as_array().unwrap().iter().map(|x| &x["output_ids"]).collect();
    assert_eq!(got, [&json!([10, 2]), &json!([11, 2]), &json!([12, 2])]);
    assert_eq!(s.calls.load(Ordering::SeqCst) - before, 1);
    // One prompt, no n: one object, as SGLang answers.
    let (code, v) = post(&s, "/generate", &json!({"input_ids": [5, 6, 7], "sampling_params": {"sampling_seed": 3}}));
    assert_eq!((code, &v["output_ids"]), (200, &json!([3, 3])), "{v}");
}

#[test]
fn one_request_cannot_ask_for_unbounded_work() {
    let limits =
        Limits { max_n: 8, max_new_tokens: 64, max_prompts: 16, max_request_tokens: 1024, ..Limits::default() };
    let s = start(limits, None, Duration::ZERO);
    let cases = [
        (json!({"input_ids": [5], "sampling_params": {"n": 1_000_000_000u64}}), "--max-n"),
        (json!({"input_ids": [5], "sampling_params": {"max_new_tokens": 1_000_000_000u64}}), "--max-new-tokens"),
        (json!({"input_ids": vec![vec![5]; 17], "sampling_params": {"max_new_tokens": 1}}), "--max-prompts"),
        // Each within its own bound, but 16 x 8 x 64 tokens in all.
        (
            json!({"input_ids": vec![vec![5]; 16], "sampling_params": {"n": 8, "max_new_tokens": 64}}),
            "--max-request-tokens",
        ),
        (json!({"input_ids": [[5], []], "sampling_params": {"max_new_tokens": 1}}), "empty"),
        (json!({"input_ids": [], "sampling_params": {"max_new_tokens": 1}}), "empty"),
    ];
    for (body, flag) in cases {
        let (code, v) = post(&s, "/generate", &body);
        assert_eq!(code, 400, "{flag}: {v}");
        assert!(message(&v).contains(flag), "{flag}: {v}");
    }
    assert_eq!(s.calls.load(Ordering::SeqCst), 0, "a refused request reached the engine");
    // At the bounds: answered.
    let (code, v) = post(
        &s,
        "/generate",
        &json!({"input_ids": vec![vec![5]; 2], "sampling_params": {"n": 8, "max_new_tokens": 64}}),
    );
    assert_eq!(code, 200, "{v}");
    assert_eq!(v.as_array().unwrap().len(), 16);
}

#[test]
fn bodies_are_bounded_by_an_explicit_limit_not_axums_two_megabytes() {
    let limits = Limits { max_body_bytes: 4 << 20, ..Limits::default() };
    let s = start(limits, None, Duration::ZERO);
    // 3 MB of well-formed request: over axum's implicit 2 MB, under this server's limit.
    let prompts = vec![vec![123_456u32; 1000]; 450];
    let body = json!({"input_ids": prompts, "sampling_params": {"max_new_tokens": 1}});
    assert!(body.to_string().len() > 2_900_000);
    let (code, v) = post(&s, "/generate", &body);
    assert_eq!(code, 200, "{}", message(&v));
    assert_eq!(v.as_array().unwrap().len(), 450);
    // Over the limit, declared: refused from the headers alone, before the body is sent.
    let t0 = Instant::now();
    let head = format!(
        "POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        1u64 << 40
    );
    let (code, text) = raw(&s.addr, &head, &[]);
    assert_eq!(code, Some(413), "{text}");
    assert!(text.contains("--max-body-bytes"), "{text}");
    assert!(t0.elapsed() < Duration::from_secs(5));
    // Over the limit, chunked (no length to judge by): cut once the limit is passed.
    let head = "POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
    let chunk = format!("{:x}\r\n{}\r\n", 1 << 20, "1".repeat(1 << 20));
    let pieces: Vec<(&[u8], Duration)> = (0..6).map(|_| (chunk.as_bytes(), Duration::ZERO)).collect();
    let (code, text) = raw(&s.addr, head, &pieces);
    assert_eq!(code, Some(413), "{text}");
}

#[test]
fn a_slow_body_is_cut_by_the_body_timeout() {
    let limits = Limits { body_timeout: Duration::from_millis(500), ..Limits::default() };
    let s = start(limits, None, Duration::ZERO);
    let t0 = Instant::now();
    let head =
        "POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n";
    let pieces: Vec<(&[u8], Duration)> = (0..8).map(|_| (&b"{"[..], Duration::from_millis(400))).collect();
    let (code, text) = raw(&s.addr, head, &pieces);
    assert_eq!(code, Some(408), "{text}");
    assert!(text.contains("--body-timeout"), "{text}");
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    // The server is fine afterwards.
    assert_eq!(get(&s, "/health").0, 200);
}

#[test]
fn model_info_and_health_never_wait_for_a_generation() {
    let s = start(Limits::default(), None, Duration::from_millis(2500));
    let base = s.base.clone();
    let long = std::thread::spawn(move || {
        request("POST", &format!("{base}/generate"), Some(&json!({"input_ids": [5]})), T).unwrap()
    });
    std::thread::sleep(Duration::from_millis(300));
    // Two at once: on a two-thread runtime, two handlers blocked on the engine stall everything.
    let probes: Vec<_> = ["/model_info", "/model_info", "/get_server_info", "/health"]
        .into_iter()
        .map(|p| {
            let url = format!("{}{p}", s.base);
            std::thread::spawn(move || {
                let t0 = Instant::now();
                let (code, v) = request("GET", &url, None, T).unwrap();
                (code, v, t0.elapsed())
            })
        })
        .collect();
    for p in probes {
        let (code, v, took) = p.join().unwrap();
        assert_eq!(code, 200, "{v}");
        assert!(took < Duration::from_millis(1000), "answered after {took:?}, behind the generation: {v}");
    }
    assert!(!long.is_finished(), "the generation was meant to be still running");
    assert_eq!(long.join().unwrap().0, 200);
    assert_eq!(get(&s, "/model_info").1["weight_version"], "0");
}

#[test]
fn generations_beyond_the_bound_queue_briefly_then_get_503() {
    let limits =
        Limits { max_concurrent: 1, max_pending: 2, queue_timeout: Duration::from_millis(400), ..Limits::default() };
    let s = start(limits, None, Duration::from_millis(1500));
    let go = |pause: u64| {
        let base = s.base.clone();
        std::thread::sleep(Duration::from_millis(pause));
        std::thread::spawn(move || {
            let t0 = Instant::now();
            let (code, v) = request("POST", &format!("{base}/generate"), Some(&json!({"input_ids": [5]})), T).unwrap();
            (code, v, t0.elapsed())
        })
    };
    let (a, b, c) = (go(0), go(150), go(150));
    let (code, v, took) = c.join().unwrap();
    assert_eq!(code, 503, "beyond --max-pending: refused at once: {v}");
    assert!(message(&v).contains("--max-pending"), "{v}");
    assert!(took < Duration::from_millis(1000), "{took:?}");
    let (code, v, took) = b.join().unwrap();
    assert_eq!(code, 503, "queued past --queue-timeout: {v}");
    assert!(message(&v).contains("--queue-timeout"), "{v}");
    assert!(took < Duration::from_millis(1400), "{took:?}");
    assert_eq!(a.join().unwrap().0, 200);
    assert_eq!(s.calls.load(Ordering::SeqCst), 1);
    // The queue drained: answered again.
    assert_eq!(post(&s, "/generate", &json!({"input_ids": [5]})).0, 200);
}

#[test]
fn a_request_past_its_deadline_is_answered_504_and_frees_the_engine() {
    let limits = Limits { request_timeout: Duration::from_millis(700), ..Limits::default() };
    // Four different prompts: four engine calls of 300 ms, 1.2 s in all.
    let s = start(limits, None, Duration::from_millis(300));
    let t0 = Instant::now();
    let (code, v) = post(&s, "/generate", &json!({"input_ids": [[5], [6], [7], [8]]}));
    assert_eq!(code, 504, "{v}");
    assert!(message(&v).contains("--request-timeout"), "{v}");
    assert!(t0.elapsed() < Duration::from_millis(1100), "{:?}", t0.elapsed());
    // The abandoned generation stops at its next prompt: the engine is soon free again.
    let (code, v) = post(&s, "/generate", &json!({"input_ids": [9]}));
    assert_eq!(code, 200, "{v}");
    assert!(s.calls.load(Ordering::SeqCst) <= 4, "the abandoned request went on to the end");
}

#[test]
fn without_a_key_only_loopback_host_names_are_answered() {
    let s = start(Limits::default(), None, Duration::ZERO);
    let port = s.addr.rsplit_once(':').unwrap().1;
    let ask = |host: &str| {
        let head = format!("GET /model_info HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        raw(&s.addr, &head, &[])
    };
    for host in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        "LocalHost".into(),
        "127.9.8.7".into(),
        format!("[::1]:{port}"),
    ] {
        let (code, text) = ask(&host);
        assert_eq!(code, Some(200), "{host}: {text}");
    }
    // A DNS-rebinding page's requests name the attacker's host; others are not loopback either.
    for host in [
        format!("evil.example:{port}"),
        "localhost.evil.example".into(),
        "10.0.0.1".into(),
        "[::2]:1".into(),
        "127.0.0.1.nip.io".into(),
        "".into(),
    ] {
        let (code, text) = ask(&host);
        assert_eq!(code, Some(403), "{host}: {text}");
        assert!(text.contains("loopback") && text.contains("--api-key"), "{text}");
    }
    let (code, text) = raw(&s.addr, "GET /health HTTP/1.0\r\n\r\n", &[]);
    assert_eq!(code, Some(403), "no Host at all: {text}");
    // With a key, the key is the defence: any Host with the key is answered.
    let k = start(Limits::default(), Some("k-123"), Duration::ZERO);
    let head =
        "GET /model_info HTTP/1.1\r\nHost: evil.example\r\nAuthorization: Bearer k-123\r\nConnection: close\r\n\r\n";
    assert_eq!(raw(&k.addr, head, &[]).0, Some(200));
}

/// The load test's short mode (the bench's full run: bench/serve-load, bench/RESULTS.md): many
/// well-formed clients and a hostile request a second; every well-formed request is answered,
/// every hostile one refused with its code, and /health keeps answering.
#[test]
fn under_load_and_hostile_requests_no_well_formed_request_is_lost() {
    let limits = Limits { body_timeout: Duration::from_secs(2), ..Limits::default() };
    let s = start(limits, None, Duration::from_millis(2));
    let cfg = driver::Config { clients: 40, duration: Duration::from_secs(6), ..driver::Config::new(&s.base) };
    let r = driver::run(&cfg);
    eprintln!("{}", r.markdown(&cfg));
    assert!(r.well_formed_sent > 40, "{r:?}");
    assert_eq!(r.well_formed_sent, r.well_formed_ok, "lost well-formed requests: {r:?}");
    assert!(r.health.len() > 50, "{r:?}");
    assert_eq!(r.health_failed, 0, "{r:?}");
    assert!(r.hostile.len() >= 4, "{r:?}");
    for h in &r.hostile {
        assert!(h.expected.contains(&h.status), "{h:?}");
    }
}

#[test]
fn slow_headers_are_cut_by_the_header_timeout() {
    let limits = Limits { header_timeout: Duration::from_millis(500), ..Limits::default() };
    let s = start(limits, None, Duration::ZERO);
    let t0 = Instant::now();
    let mut c = TcpStream::connect(&s.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    c.write_all(b"GET /health HTTP/1.1\r\nHost: 127").unwrap();
    // The server closes the connection (an answer or not): the read ends, well before 20 s.
    let mut out = Vec::new();
    let _ = c.read_to_end(&mut out);
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "a connection with unfinished headers stayed open {:?}",
        t0.elapsed()
    );
    assert_eq!(get(&s, "/health").0, 200);
}

#[test]
fn connections_beyond_the_bound_wait_unaccepted_until_one_ends() {
    let limits = Limits { max_connections: 2, ..Limits::default() };
    let s = start(limits, None, Duration::ZERO);
    // Two idle connections take both places (a request each, to be sure they were accepted).
    let hold = |_| {
        let mut c = TcpStream::connect(&s.addr).unwrap();
        c.write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut buf = [0u8; 512];
        assert!(c.read(&mut buf).unwrap() > 0, "a held connection is served");
        c
    };
    let held: Vec<TcpStream> = (0..2).map(hold).collect();
    // A third is left in the backlog: connected (the kernel accepts it) but never answered.
    let mut third = TcpStream::connect(&s.addr).unwrap();
    third.write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").unwrap();
    third.set_read_timeout(Some(Duration::from_millis(700))).unwrap();
    let mut buf = [0u8; 512];
    let waited = third.read(&mut buf);
    assert!(
        matches!(&waited, Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut)),
        "the third connection was served past the bound: {waited:?}"
    );
    // One place frees: the waiting connection is accepted and answered.
    drop(held);
    third.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut out = Vec::new();
    let _ = third.read_to_end(&mut out);
    assert!(String::from_utf8_lossy(&out).starts_with("HTTP/1.1 200"), "{}", String::from_utf8_lossy(&out));
}
