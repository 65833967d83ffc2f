//! The load of `miles serve`'s load test, shared by the bench (bench/serve-load/load.rs, against a
//! real `miles serve`) and its short mode (engine/workers/tests/serve.rs, against a fake engine):
//! `clients` threads each sending well-formed `/generate` requests back to back, one prober
//! timing `GET /health`, and one hostile request a second (a huge `n`, a huge body, a slow body,
//! ...), each on its own thread. Bounded: nothing new starts after `duration`, and every request
//! has a timeout.

use miles_workers::http::request;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Clone, Debug)]
pub struct Config {
    /// `http://host:port` of the server.
    pub base: String,
    pub clients: usize,
    pub duration: Duration,
    /// A well-formed request's prompt (token ids the model knows), `n` and `max_new_tokens`.
    pub prompt: Vec<u32>,
    pub n: u64,
    pub max_new_tokens: u64,
    pub hostile_every: Duration,
    pub health_every: Duration,
    /// How long a slow body takes to send (past the server's --body-timeout).
    pub slow_body_for: Duration,
    /// The longest any one request may take before it counts as lost.
    pub request_timeout: Duration,
}

impl Config {
    pub fn new(base: &str) -> Config {
        Config {
            base: base.trim_end_matches('/').to_string(),
            clients: 100,
            duration: Duration::from_secs(60),
            prompt: vec![5, 6, 12, 7, 13],
            n: 4,
            max_new_tokens: 3,
            hostile_every: Duration::from_secs(1),
            health_every: Duration::from_millis(10),
            slow_body_for: Duration::from_secs(40),
            request_timeout: Duration::from_secs(120),
        }
    }

    fn addr(&self) -> &str {
        self.base.trim_start_matches("http://")
    }
}

/// One hostile request: what it was, the status it got (0: the connection closed with no
/// answer), the statuses that count as refused, and how long the answer took.
#[derive(Clone, Debug)]
pub struct Hostile {
    pub kind: &'static str,
    pub status: u16,
    pub expected: Vec<u16>,
    pub took: Duration,
}

#[derive(Debug, Default)]
pub struct Report {
    pub well_formed_sent: u64,
    pub well_formed_ok: u64,
    /// Each well-formed request not answered 200: its status or error.
    pub well_formed_failed: Vec<String>,
    pub completions: u64,
    /// Latency of each /health answer, in the order sent.
    pub health: Vec<Duration>,
    pub health_failed: u64,
    pub hostile: Vec<Hostile>,
    pub wall: Duration,
}

impl Report {
    /// The `q` quantile (0..=1) of the health latencies.
    pub fn health_quantile(&self, q: f64) -> Duration {
        let mut h = self.health.clone();
        h.sort();
        h.get(((h.len().max(1) - 1) as f64 * q).round() as usize).copied().unwrap_or_default()
    }

    pub fn markdown(&self, cfg: &Config) -> String {
        let ms = |d: Duration| format!("{:.1} ms", d.as_secs_f64() * 1e3);
        let mut s = format!(
            "{} clients for {:.0} s (all answered {:.1} s after the start), n = {}, max_new_tokens = {}, \
             one hostile request every {:.1} s\n\n\
             | measure | value |\n|---|---:|\n\
             | well-formed requests sent | {} |\n| well-formed requests answered 200 | {} |\n\
             | well-formed requests lost | {} |\n| completions returned | {} |\n\
             | /health probes (one per {} ms) | {} |\n| /health median | {} |\n| /health p99 | {} |\n\
             | /health max | {} |\n| /health failures | {} |\n\n",
            cfg.clients,
            cfg.duration.as_secs_f64(),
            self.wall.as_secs_f64(),
            cfg.n,
            cfg.max_new_tokens,
            cfg.hostile_every.as_secs_f64(),
            self.well_formed_sent,
            self.well_formed_ok,
            self.well_formed_sent - self.well_formed_ok,
            self.completions,
            cfg.health_every.as_millis(),
            self.health.len(),
            ms(self.health_quantile(0.5)),
            ms(self.health_quantile(0.99)),
            ms(self.health_quantile(1.0)),
            self.health_failed,
        );
        s.push_str("| hostile request | sent | statuses | answered within (max) |\n|---|---:|---|---:|\n");
        let mut kinds: Vec<&str> = self.hostile.iter().map(|h| h.kind).collect();
        kinds.dedup();
        kinds.sort();
        kinds.dedup();
        for k in kinds {
            let hs: Vec<&Hostile> = self.hostile.iter().filter(|h| h.kind == k).collect();
            let mut codes: Vec<u16> = hs.iter().map(|h| h.status).collect();
            codes.sort();
            let mut counted: Vec<String> = Vec::new();
            for c in &codes {
                let label = if *c == 0 { "closed".to_string() } else { c.to_string() };
                let n = codes.iter().filter(|x| *x == c).count();
                let row = format!("{label} x{n}");
                if !counted.contains(&row) {
                    counted.push(row);
                }
            }
            let max = hs.iter().map(|h| h.took).max().unwrap_or_default();
            s.push_str(&format!("| {k} | {} | {} | {} |\n", hs.len(), counted.join(", "), ms(max)));
        }
        if !self.well_formed_failed.is_empty() {
            s.push_str(&format!("\nlost: {:?}\n", &self.well_formed_failed[..self.well_formed_failed.len().min(10)]));
        }
        s
    }
}

/// Runs the load; returns once every request it started has ended.
pub fn run(cfg: &Config) -> Report {
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let ok = Arc::new(AtomicU64::new(0));
    let completions = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(Mutex::new(Vec::new()));
    let t0 = Instant::now();
    let clients: Vec<_> = (0..cfg.clients)
        .map(|c| {
            let (cfg, stop, sent, ok, completions, failed) =
                (cfg.clone(), stop.clone(), sent.clone(), ok.clone(), completions.clone(), failed.clone());
            std::thread::spawn(move || {
                let url = format!("{}/generate", cfg.base);
                let mut k = 0u64;
                while !stop.load(Ordering::SeqCst) {
                    let body = json!({
                        "input_ids": [cfg.prompt],
                        "sampling_params": {"n": cfg.n, "max_new_tokens": cfg.max_new_tokens, "sampling_seed": c as u64 * 1_000_000 + k},
                        "return_logprob": true,
                    });
                    k += 1;
                    sent.fetch_add(1, Ordering::SeqCst);
                    match request("POST", &url, Some(&body), cfg.request_timeout) {
                        Ok((200, v)) if v.as_array().map(Vec::len) == Some(cfg.n as usize) => {
                            ok.fetch_add(1, Ordering::SeqCst);
                            completions.fetch_add(cfg.n, Ordering::SeqCst);
                        }
                        Ok((200, v)) if cfg.n == 1 && v.get("output_ids").is_some() => {
                            ok.fetch_add(1, Ordering::SeqCst);
                            completions.fetch_add(1, Ordering::SeqCst);
                        }
                        Ok((code, v)) => failed.lock().unwrap().push(format!("{code}: {}", short(&v))),
                        Err(e) => failed.lock().unwrap().push(e),
                    }
                }
            })
        })
        .collect();
    let prober = {
        let (cfg, stop) = (cfg.clone(), stop.clone());
        std::thread::spawn(move || {
            let (mut lat, mut bad) = (Vec::new(), 0u64);
            let url = format!("{}/health", cfg.base);
            while !stop.load(Ordering::SeqCst) {
                let t = Instant::now();
                match request("GET", &url, None, Duration::from_secs(10)) {
                    Ok((200, _)) => lat.push(t.elapsed()),
                    _ => bad += 1,
                }
                std::thread::sleep(cfg.health_every.saturating_sub(t.elapsed()));
            }
            (lat, bad)
        })
    };
    let mut hostile = Vec::new();
    let mut i = 0;
    while t0.elapsed() < cfg.duration {
        let cfg2 = cfg.clone();
        hostile.push(std::thread::spawn(move || attack(&cfg2, i)));
        i += 1;
        std::thread::sleep(cfg.hostile_every.min(cfg.duration.saturating_sub(t0.elapsed())));
    }
    stop.store(true, Ordering::SeqCst);
    for c in clients {
        let _ = c.join();
    }
    let (health, health_failed) = prober.join().unwrap_or_default();
    let hostile = hostile.into_iter().filter_map(|h| h.join().ok()).collect();
    let failed = std::mem::take(&mut *failed.lock().unwrap());
    Report {
        well_formed_sent: sent.load(Ordering::SeqCst),
        well_formed_ok: ok.load(Ordering::SeqCst),
        well_formed_failed: failed,
        completions: completions.load(Ordering::SeqCst),
        health,
        health_failed,
        hostile,
        wall: t0.elapsed(),
    }
}

fn short(v: &Value) -> String {
    let s = v.to_string();
    s.chars().take(200).collect()
}

/// The `i`th hostile request (they take turns).
fn attack(cfg: &Config, i: usize) -> Hostile {
    let t = Instant::now();
    let json_head = |len: usize| {
        format!("POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n")
    };
    let (kind, status, expected): (&'static str, u16, Vec<u16>) = match i % 6 {
        0 => {
            let b = json!({"input_ids": [cfg.prompt], "sampling_params": {"n": 1_000_000_000u64}}).to_string();
            ("n = 10^9", send(cfg, &format!("{}{b}", json_head(b.len())), &[]), vec![400])
        }
        1 => {
            // Declares 1 GiB and starts sending it: refused from the headers.
            let mb = vec![b'1'; 1 << 20];
            let pieces: Vec<(&[u8], Duration)> = (0..8).map(|_| (&mb[..], Duration::ZERO)).collect();
            ("1 GiB body (Content-Length)", send(cfg, &json_head(1 << 30), &pieces), vec![413, 0])
        }
        2 => {
            // No length: 72 MiB chunked (past the default --max-body-bytes), cut at the limit.
            let chunk = format!("{:x}\r\n{}\r\n", 1 << 20, "1".repeat(1 << 20)).into_bytes();
            let pieces: Vec<(&[u8], Duration)> = (0..72).map(|_| (&chunk[..], Duration::ZERO)).collect();
            let head = "POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
            ("72 MiB body (chunked)", send(cfg, head, &pieces), vec![413, 0])
        }
        3 => {
            // One byte a second of a 1000-byte body: cut by the server's --body-timeout.
            let steps = cfg.slow_body_for.as_secs().max(1) as usize;
            let pieces: Vec<(&[u8], Duration)> = (0..steps).map(|_| (&b" "[..], Duration::from_secs(1))).collect();
            ("slow body (1 byte/s)", send(cfg, &json_head(1000), &pieces), vec![408])
        }
        4 => {
            let b =
                json!({"input_ids": vec![cfg.prompt.clone(); 100], "sampling_params": {"max_new_tokens": 1u64 << 40}})
                    .to_string();
            ("max_new_tokens = 2^40", send(cfg, &format!("{}{b}", json_head(b.len())), &[]), vec![400])
        }
        _ => {
            let head = "GET /model_info HTTP/1.1\r\nHost: rebind.evil.example\r\nConnection: close\r\n\r\n";
            ("Host: rebind.evil.example", send(cfg, head, &[]), vec![403])
        }
    };
    Hostile { kind, status, expected, took: t.elapsed() }
}

/// Sends `head` and then the pieces (each after its pause) until the server answers or closes;
/// returns the status (0: closed with no answer).
fn send(cfg: &Config, head: &str, pieces: &[(&[u8], Duration)]) -> u16 {
    let Ok(mut s) = TcpStream::connect(cfg.addr()) else { return 0 };
    let _ = s.set_read_timeout(Some(cfg.slow_body_for + Duration::from_secs(30)));
    let _ = s.set_write_timeout(Some(Duration::from_secs(30)));
    if s.write_all(head.as_bytes()).is_err() {
        return status_of(&mut s);
    }
    for (p, pause) in pieces {
        std::thread::sleep(*pause);
        if s.write_all(p).is_err() {
            break;
        }
        // An answer already there ends the sending (a refusal comes before the body is read).
        s.set_nonblocking(true).ok();
        let mut peek = [0u8; 1];
        let answered = matches!(s.peek(&mut peek), Ok(n) if n > 0);
        s.set_nonblocking(false).ok();
        if answered {
            break;
        }
    }
    status_of(&mut s)
}

fn status_of(s: &mut TcpStream) -> u16 {
    let mut buf = [0u8; 64];
    let mut got = Vec::new();
    while got.len() < 12 {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&got).split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0)
}
