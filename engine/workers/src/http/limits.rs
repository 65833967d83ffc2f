//! What one client may ask of `miles serve`, and how long it may take: the bounds that keep one
//! request (or a crowd of them) from exhausting the server's memory or its engine.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The server's bounds, each a `miles serve` flag (named in every refusal it causes).
#[derive(Clone, Debug)]
pub struct Limits {
    /// `n` (completions per prompt) at most (`--max-n`).
    pub max_n: usize,
    /// `max_new_tokens` of one completion at most (`--max-new-tokens`).
    pub max_new_tokens: usize,
    /// Prompts (`input_ids` entries) in one request at most (`--max-prompts`).
    pub max_prompts: usize,
    /// Tokens one request may ask to generate in all, prompts x n x max_new_tokens
    /// (`--max-request-tokens`): the bound on one answer's size.
    pub max_request_tokens: u64,
    /// A request body's bytes at most (`--max-body-bytes`), answered 413 beyond.
    pub max_body_bytes: usize,
    /// Requests generating (or waiting for the engine, body read) at once (`--max-concurrent`).
    pub max_concurrent: usize,
    /// Requests admitted at once, reading their body, queued or generating (`--max-pending`);
    /// beyond it a request is answered 503 at once. Bodies held at once are at most
    /// max_pending x max_body_bytes.
    pub max_pending: usize,
    /// How long a request waits in the queue for a generation slot before a 503 (`--queue-timeout`).
    pub queue_timeout: Duration,
    /// How long a body may take to arrive, from the end of the headers (`--body-timeout`): 408.
    pub body_timeout: Duration,
    /// How long a `/generate` request may take in all, queue included (`--request-timeout`): 504.
    pub request_timeout: Duration,
    /// How long a request's headers may take to arrive, and a kept-alive connection may sit idle
    /// (`--header-timeout`): the connection is closed after it.
    pub header_timeout: Duration,
    /// Connections served at once (`--max-connections`): beyond it the server stops accepting
    /// and new connections wait in the kernel's backlog until one ends (idle ones end at
    /// `--header-timeout`), so a crowd of sockets cannot exhaust tasks or file descriptors.
    pub max_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_n: 256,
            max_new_tokens: 32_768,
            max_prompts: 4096,
            max_request_tokens: 1 << 22,
            max_body_bytes: 32 << 20,
            max_concurrent: 4,
            max_pending: 128,
            queue_timeout: Duration::from_secs(300),
            body_timeout: Duration::from_secs(30),
            request_timeout: Duration::from_secs(900),
            header_timeout: Duration::from_secs(30),
            max_connections: 1024,
        }
    }
}

/// A refusal: the HTTP status and the message (which names the flag that sets the bound).
pub(super) type Refusal = (u16, String);

impl Limits {
    /// The bounds of one `/generate` request, checked before it reaches the engine: `prompts`
    /// with one max_new_tokens each, `n` completions of each.
    pub(super) fn check(&self, prompts: &[Vec<u32>], max_new_tokens: &[usize], n: usize) -> Result<(), String> {
        if prompts.is_empty() || prompts.iter().any(Vec::is_empty) {
            return Err("a prompt is empty: `input_ids` must hold token ids".into());
        }
        if prompts.len() > self.max_prompts {
            return Err(format!(
                "{} prompts in one request; this server takes at most {} (--max-prompts)",
                prompts.len(),
                self.max_prompts
            ));
        }
        if n > self.max_n {
            return Err(format!("n = {n}; this server takes at most {} (--max-n)", self.max_n));
        }
        if let Some(m) = max_new_tokens.iter().copied().find(|&m| m > self.max_new_tokens) {
            return Err(format!(
                "max_new_tokens = {m}; this server takes at most {} (--max-new-tokens)",
                self.max_new_tokens
            ));
        }
        // Saturating: a sum past u64 is past any bound.
        let total = max_new_tokens.iter().fold(0u64, |t, &m| t.saturating_add((m as u64).saturating_mul(n as u64)));
        if total > self.max_request_tokens {
            return Err(format!(
                "this request asks for up to {total} new tokens (prompts x n x max_new_tokens); this server takes \
                 at most {} in one request (--max-request-tokens): send smaller batches or raise it",
                self.max_request_tokens
            ));
        }
        Ok(())
    }
}

fn too_large(l: &Limits) -> Refusal {
    (413, format!("the request body is over {} bytes (--max-body-bytes)", l.max_body_bytes))
}

/// A request's body, within the limits: 413 past `max_body_bytes` (at once from Content-Length,
/// else as the bytes arrive, so no more than the limit is ever held), 408 past `body_timeout`
/// (a slow body cannot hold a slot for ever).
pub(super) async fn read_body(req: axum::extract::Request, l: &Limits) -> Result<Vec<u8>, Refusal> {
    use tokio_stream::StreamExt;
    let declared = req
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > l.max_body_bytes as u64) {
        return Err(too_large(l));
    }
    let mut out = Vec::with_capacity(declared.unwrap_or(0) as usize);
    let mut body = req.into_body().into_data_stream();
    let deadline = tokio::time::Instant::now() + l.body_timeout;
    loop {
        match tokio::time::timeout_at(deadline, body.next()).await {
            Err(_) => {
                return Err((
                    408,
                    format!(
                        "the request body did not arrive within {:.1} s (--body-timeout)",
                        l.body_timeout.as_secs_f64()
                    ),
                ))
            }
            Ok(None) => return Ok(out),
            Ok(Some(Err(e))) => return Err((400, format!("reading the request body: {e}"))),
            Ok(Some(Ok(chunk))) => {
                if out.len() + chunk.len() > l.max_body_bytes {
                    return Err(too_large(l));
                }
                out.extend_from_slice(&chunk);
            }
        }
    }
}

/// One admitted request, counted until it ends (dropped).
pub(super) struct Pending(Arc<AtomicUsize>);

impl Pending {
    /// Admits a request if fewer than `max_pending` are; else a 503 at once (a crowd beyond the
    /// bound costs a refusal, not memory).
    pub(super) fn admit(count: &Arc<AtomicUsize>, l: &Limits) -> Result<Pending, Refusal> {
        if count.fetch_add(1, Ordering::SeqCst) >= l.max_pending {
            count.fetch_sub(1, Ordering::SeqCst);
            return Err((
                503,
                format!("{} requests are already admitted (--max-pending); retry shortly", l.max_pending),
            ));
        }
        Ok(Pending(count.clone()))
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Waits up to `queue_timeout` for one of `slots` (`what`, for the message: the generation slots
/// of `--max-concurrent`, or the one weight load); 503 after.
pub(super) async fn slot(slots: &Arc<Semaphore>, l: &Limits, what: &str) -> Result<OwnedSemaphorePermit, Refusal> {
    match tokio::time::timeout(l.queue_timeout, slots.clone().acquire_owned()).await {
        Ok(Ok(p)) => Ok(p),
        _ => Err((
            503,
            format!("no {what} freed within {:.1} s (--queue-timeout); retry shortly", l.queue_timeout.as_secs_f64()),
        )),
    }
}

/// Whether a Host header names this machine's loopback: `localhost`, an address in 127.0.0.0/8
/// or `[::1]`, each with an optional port. What a server without a key answers to: a page that
/// rebinds its own name to 127.0.0.1 still sends its own name as Host (DNS-rebinding defence).
pub fn host_is_loopback(host: &str) -> bool {
    let port_ok =
        |p: Option<&str>| p.is_none_or(|p| !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()));
    if let Some(rest) = host.strip_prefix('[') {
        let Some((ip, after)) = rest.split_once(']') else { return false };
        let port = match after {
            "" => None,
            a => match a.strip_prefix(':') {
                Some(p) => Some(p),
                None => return false,
            },
        };
        return port_ok(port)
            && ip
                .parse::<Ipv6Addr>()
                .is_ok_and(|a| a.is_loopback() || a.to_ipv4_mapped().is_some_and(|v| v.is_loopback()));
    }
    let (name, port) = match host.split_once(':') {
        Some((n, p)) => (n, Some(p)),
        None => (host, None),
    };
    port_ok(port) && (name.eq_ignore_ascii_case("localhost") || name.parse::<Ipv4Addr>().is_ok_and(|a| a.is_loopback()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_host_headers() {
        for h in [
            "localhost",
            "LOCALHOST:30000",
            "127.0.0.1",
            "127.0.0.1:1",
            "127.255.0.9:65535",
            "[::1]",
            "[::1]:8080",
            "[::ffff:127.0.0.1]:5",
        ] {
            assert!(host_is_loopback(h), "{h}");
        }
        for h in [
            "",
            "evil.example",
            "localhost.evil.example",
            "localhost:",
            "localhost:x",
            "localhost:80:80",
            "127.0.0.1.nip.io",
            "10.0.0.1",
            "0.0.0.0",
            "[::2]",
            "[::1",
            "[::1]x",
            "[::1]:",
            "127.1",
            "localhost:123456",
        ] {
            assert!(!host_is_loopback(h), "{h}");
        }
    }

    #[test]
    fn request_bounds_name_their_flag() {
        let l = Limits { max_n: 4, max_new_tokens: 10, max_prompts: 3, max_request_tokens: 60, ..Limits::default() };
        assert!(l.check(&[vec![1], vec![2]], &[10, 10], 3).is_ok());
        let e = |p: &[Vec<u32>], m: &[usize], n| l.check(p, m, n).unwrap_err();
        assert!(e(&[vec![1]], &[1], 5).contains("--max-n"));
        assert!(e(&[vec![1]], &[11], 1).contains("--max-new-tokens"));
        assert!(e(&vec![vec![1]; 4], &[1; 4], 1).contains("--max-prompts"));
        assert!(e(&vec![vec![1]; 3], &[10; 3], 3).contains("--max-request-tokens"));
        assert!(e(&[], &[], 1).contains("empty"));
        assert!(e(&[vec![1], vec![]], &[1, 1], 1).contains("empty"));
        let huge = Limits { max_n: usize::MAX, max_new_tokens: usize::MAX, ..l.clone() };
        assert!(huge.check(&[vec![1]], &[usize::MAX], usize::MAX).unwrap_err().contains("--max-request-tokens"));
    }
}
