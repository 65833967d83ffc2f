//! `http_reward`: POSTs batches to a reward service (a reward model server, a sandbox, a judge).
//! A batch from the executor is cut into requests of at most `batch_size` samples, at most
//! `concurrency` in flight; each request has its own deadline and is retried (with backoff) up to
//! `retries` times after a connection failure, a timeout, HTTP 429 or 5xx. The body of a request
//! and of its answer is the batch protocol of reward/protocol.rs. A group reward (`group`) sends
//! one request per group of the batch instead (reward/group.rs), never splitting a group.

use super::group::{self, Unit};
use super::protocol::{self, BatchFault};
use super::{settle_all, BatchReward, OnRewardError, RewardFailure, RewardInput, RewardOutcome};
use crate::http_client::{self, Answer, Client, Url};
use crate::{RunError, E_SPEC};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

#[derive(Debug, Clone, PartialEq)]
pub struct HttpSpec {
    pub name: String,
    /// `http://host:port/path` or `https://...`.
    pub url: String,
    /// Requests in flight at once (>= 1).
    pub concurrency: usize,
    /// Samples per request (>= 1).
    pub batch_size: usize,
    /// Deadline of one request: connect, send and the whole answer.
    pub timeout: Duration,
    /// Further tries of a request after a transient failure.
    pub retries: u32,
    pub on_error: OnRewardError,
    /// One request per group, one score per member (`group_http_reward`; `batch_size` unused).
    pub group: bool,
}

pub struct HttpReward {
    spec: HttpSpec,
    url: Url,
    next_id: AtomicU64,
    /// Requests tried again after a transient failure, over the run (a metric).
    pub retried: AtomicU64,
}

impl HttpReward {
    pub fn new(spec: HttpSpec) -> Result<HttpReward, RunError> {
        let bad = |what: String| RunError::new(E_SPEC, format!("reward `{}`: {what}", spec.name));
        let url = http_client::parse_url(&spec.url).map_err(|e| bad(format!("`url` {}: {e}", spec.url)))?;
        if spec.concurrency == 0 || spec.batch_size == 0 {
            return Err(bad("`concurrency` and `batch_size` must be at least 1".into()));
        }
        Ok(HttpReward { spec, url, next_id: AtomicU64::new(0), retried: AtomicU64::new(0) })
    }

    /// One request with its retries, for the samples of `unit`; a fault fails all of them (named
    /// with the group, for a group).
    fn request(&self, all: &[RewardInput], unit: &Unit) -> Vec<Result<f32, RewardFailure>> {
        let members: Vec<&RewardInput> = unit.members.iter().map(|&i| &all[i]).collect();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let body = match &unit.group {
            Some(g) => group::request(id, g, &members),
            None => protocol::request(id, &members),
        };
        let items: Vec<RewardInput> = members.into_iter().cloned().collect();
        let fail = |mut fault: BatchFault| {
            if let Some(g) = &unit.group {
                fault.what = format!("group {g}: {}", fault.what);
            }
            fault.fail_all(&self.spec.name, &items)
        };
        let mut tries = 0;
        loop {
            tries += 1;
            match Client::shared().request(&self.url, Some(&body), self.spec.timeout, None).and_then(Answer::ok) {
                Ok(answer) => return protocol::parse_answer(&self.spec.name, id, &items, &answer).unwrap_or_else(fail),
                Err(e) if e.retry && tries <= self.spec.retries => {
                    self.retried.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(50 << tries.min(6)));
                }
                Err(e) => {
                    let what = format!("POST {}: {} (after {tries} tries)", self.spec.url, e.what);
                    return fail(if e.timed_out { BatchFault::timeout(what) } else { BatchFault::new(what) });
                }
            }
        }
    }
}

impl BatchReward for HttpReward {
    fn name(&self) -> &str {
        &self.spec.name
    }

    fn score_batch(&mut self, items: &[RewardInput]) -> Result<Vec<RewardOutcome>, RunError> {
        let units =
            if self.spec.group { group::groups(items) } else { group::chunks(items.len(), self.spec.batch_size) };
        let mut results: Vec<Option<Result<f32, RewardFailure>>> = vec![None; items.len()];
        let this = &*self;
        // Waves of at most `concurrency` requests; each thread's request has its own deadline,
        // so a wave ends within (retries + 1) * (timeout + backoff).
        for wave in units.chunks(self.spec.concurrency) {
            let answers: Vec<_> = std::thread::scope(|s| {
                let handles: Vec<_> = wave.iter().map(|u| s.spawn(move || this.request(items, u))).collect();
                handles.into_iter().map(|h| h.join()).collect()
            });
            for (unit, a) in wave.iter().zip(answers) {
                let answered = a.unwrap_or_else(|_| {
                    let chunk: Vec<RewardInput> = unit.members.iter().map(|&i| items[i].clone()).collect();
                    BatchFault::new("the request thread panicked").fail_all(&self.spec.name, &chunk)
                });
                for (&i, r) in unit.members.iter().zip(answered) {
                    results[i] = Some(r);
                }
            }
        }
        // Every sample is in exactly one unit; `score_responses` checks the count besides.
        settle_all(self.spec.on_error, results.into_iter().flatten().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reward::input;
    use serde_json::{json, Value};
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::TcpListener;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;

    /// A reward service on 127.0.0.1: scores 1 when response == label. `behave(n)` for the n-th
    /// request (from 0) picks: "ok", "500", "sleep", "wrong_id", "nan".
    struct Server {
        url: String,
        max_in_flight: Arc<AtomicUsize>,
        requests: Arc<AtomicUsize>,
    }

    fn serve(behave: fn(usize) -> &'static str) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/score", listener.local_addr().unwrap());
        let in_flight = Arc::new(AtomicUsize::new(0));
        let max_in_flight = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(AtomicUsize::new(0));
        let (fl, mx, rq) = (in_flight.clone(), max_in_flight.clone(), requests.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                let (fl, mx, rq) = (fl.clone(), mx.clone(), rq.clone());
                std::thread::spawn(move || {
                    let now = fl.fetch_add(1, Ordering::SeqCst) + 1;
                    mx.fetch_max(now, Ordering::SeqCst);
                    let n = rq.fetch_add(1, Ordering::SeqCst);
                    let mut r = BufReader::new(conn.try_clone().unwrap());
                    let mut len = 0;
                    loop {
                        let mut line = String::new();
                        r.read_line(&mut line).unwrap();
                        if line == "\r\n" {
                            break;
                        }
                        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                            len = v.trim().parse().unwrap();
                        }
                    }
                    let mut body = vec![0; len];
                    r.read_exact(&mut body).unwrap();
                    let req: Value = serde_json::from_slice(&body).unwrap();
                    // A group request holds the label once and the members' responses.
                    let mut scores: Vec<f64> = match req.get("responses") {
                        Some(rs) => rs
                            .as_array()
                            .unwrap()
                            .iter()
                            .map(|r| if r["response"] == req["label"] { 1.0 } else { 0.0 })
                            .collect(),
                        None => req["samples"]
                            .as_array()
                            .unwrap()
                            .iter()
                            .map(|s| if s["response"] == s["label"] { 1.0 } else { 0.0 })
                            .collect(),
                    };
                    if behave(n) == "short" {
                        scores.pop();
                    }
                    std::thread::sleep(Duration::from_millis(50));
                    let (status, answer) = match behave(n) {
                        "500" => ("500 Internal Server Error", "model not loaded".to_string()),
                        "sleep" => {
                            std::thread::sleep(Duration::from_secs(3));
                            ("200 OK", String::new())
                        }
                        "wrong_id" => ("200 OK", json!({"id": 99, "scores": scores}).to_string()),
                        "nan" => ("200 OK", format!("{{\"id\":{},\"scores\":[NaN]}}", req["id"])),
                        _ => ("200 OK", json!({"id": req["id"], "scores": scores}).to_string()),
                    };
                    fl.fetch_sub(1, Ordering::SeqCst);
                    let _ = write!(
                        conn,
                        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{answer}",
                        answer.len()
                    );
                });
            }
        });
        Server { url, max_in_flight, requests }
    }

    fn reward(url: &str, on_error: OnRewardError, timeout_ms: u64, retries: u32) -> HttpReward {
        HttpReward::new(HttpSpec {
            name: "rm".into(),
            url: url.into(),
            concurrency: 2,
            batch_size: 2,
            timeout: Duration::from_millis(timeout_ms),
            retries,
            on_error,
            group: false,
        })
        .unwrap()
    }

    fn batch(n: usize) -> Vec<RewardInput> {
        (0..n).map(|i| input(&format!("s{i}"), if i % 2 == 0 { "4" } else { "5" }, json!("4"))).collect()
    }

    #[test]
    fn batches_are_split_and_concurrency_is_bounded() {
        let srv = serve(|_| "ok");
        let mut r = reward(&srv.url, OnRewardError::Stop, 5000, 0);
        let out = r.score_batch(&batch(7)).unwrap();
        let scores: Vec<f32> = out.iter().map(|o| o.reward().unwrap()).collect();
        assert_eq!(scores, vec![1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0]);
        assert_eq!(srv.requests.load(Ordering::SeqCst), 4);
        assert!(srv.max_in_flight.load(Ordering::SeqCst) <= 2);
    }

    #[test]
    fn server_errors_are_retried() {
        let srv = serve(|n| if n == 0 { "500" } else { "ok" });
        let mut r = reward(&srv.url, OnRewardError::Stop, 5000, 2);
        let out = r.score_batch(&batch(2)).unwrap();
        assert_eq!(out, vec![RewardOutcome::Score(1.0), RewardOutcome::Score(0.0)]);
        assert_eq!(r.retried.load(Ordering::SeqCst), 1);
        let srv = serve(|_| "500");
        let mut r = reward(&srv.url, OnRewardError::Stop, 5000, 1);
        let e = r.score_batch(&batch(1)).unwrap_err();
        assert_eq!(
            e.message,
            format!("reward `rm` failed on sample s0: POST {}: HTTP 500: model not loaded (after 2 tries)", srv.url)
        );
    }

    #[test]
    fn timeouts_malformed_answers_and_dead_services_follow_the_policy() {
        let srv = serve(|_| "sleep");
        let mut r = reward(&srv.url, OnRewardError::Stop, 300, 0);
        let t0 = std::time::Instant::now();
        let e = r.score_batch(&batch(1)).unwrap_err();
        assert!(t0.elapsed() < Duration::from_secs(2));
        assert_eq!(e.code, crate::E_TIMEOUT);
        assert!(e.message.contains("no answer within 0.3s (after 1 tries)"), "{e}");
        let srv = serve(|_| "wrong_id");
        let out = reward(&srv.url, OnRewardError::Drop, 5000, 0).score_batch(&batch(2)).unwrap();
        assert!(
            matches!(&out[1], RewardOutcome::Dropped(f) if f.sample_id == "s1" && f.what.starts_with("answered id 99 to request 0"))
        );
        let srv = serve(|_| "nan");
        let out = reward(&srv.url, OnRewardError::Zero, 5000, 0).score_batch(&batch(1)).unwrap();
        assert!(matches!(&out[0], RewardOutcome::Zeroed(f) if f.what.starts_with("answered text that is not JSON")));
        // Nothing listens there any more.
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let out =
            reward(&format!("http://127.0.0.1:{port}/"), OnRewardError::Zero, 1000, 1).score_batch(&batch(1)).unwrap();
        assert!(
            matches!(&out[0], RewardOutcome::Zeroed(f) if f.what.contains("cannot connect") && f.what.ends_with("(after 2 tries)")),
            "{out:?}"
        );
    }

    #[test]
    fn a_group_service_gets_one_request_per_group_and_fails_it_whole() {
        // Two groups of 3, interleaved; `batch_size` does not cut a group.
        let items: Vec<RewardInput> = (0..6)
            .map(|i| RewardInput {
                group: i % 2,
                ..input(&format!("step0/p{}/s{}", i % 2, i / 2), if i == 4 { "4" } else { "5" }, json!("4"))
            })
            .collect();
        let group =
            |url: &str, on_error| HttpReward::new(HttpSpec { group: true, ..reward(url, on_error, 5000, 0).spec });
        let srv = serve(|_| "ok");
        let out = group(&srv.url, OnRewardError::Stop).unwrap().score_batch(&items).unwrap();
        let scores: Vec<f32> = out.iter().map(|o| o.reward().unwrap()).collect();
        assert_eq!(scores, vec![0.0, 0.0, 0.0, 0.0, 1.0, 0.0]);
        assert_eq!(srv.requests.load(Ordering::SeqCst), 2);
        // One score too few fails that group's members alone, naming the group.
        let srv = serve(|n| if n == 0 { "short" } else { "ok" });
        let out = group(&srv.url, OnRewardError::Drop).unwrap().score_batch(&items).unwrap();
        let dropped: Vec<&str> = out
            .iter()
            .filter_map(|o| match o {
                RewardOutcome::Dropped(f) => Some(f.what.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(dropped.len(), 3, "{out:?}");
        assert!(dropped[0].starts_with("group step0/p"), "{}", dropped[0]);
        assert!(dropped[0].contains("answered 2 scores for 3 samples"), "{}", dropped[0]);
    }

    #[test]
    fn bad_settings() {
        let spec = |url: &str| HttpSpec {
            name: "rm".into(),
            url: url.into(),
            concurrency: 1,
            batch_size: 1,
            timeout: Duration::from_secs(1),
            retries: 0,
            on_error: OnRewardError::Stop,
            group: false,
        };
        let e = HttpReward::new(spec("ftp://rm/score")).err().unwrap();
        assert_eq!(e.message, "reward `rm`: `url` ftp://rm/score: must start with http:// or https://");
        // https is served (http_client's tests hold the TLS server).
        assert!(HttpReward::new(spec("https://rm/score")).unwrap().url.secure);
    }
}
