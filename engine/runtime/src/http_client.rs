//! A minimal blocking HTTP/1.1 client for JSON POSTs to a service (a reward service, an
//! environment): plain `http://`, one connection per request (`Connection: close`),
//! Content-Length or chunked answers, and one deadline over connect, send and receive. The
//! workspace's HTTP stack (hyper, via tonic) is async and lives in engine/workers; this keeps
//! tokio out of the runtime. `connect` is shared with the WebSocket client of env/ws.rs.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// The largest answer read.
const MAX_ANSWER: usize = 64 << 20;

#[derive(Debug, Clone, PartialEq)]
pub struct Url {
    pub host: String,
    pub port: u16,
    pub path: String,
}

pub fn parse_url(url: &str) -> Result<Url, String> {
    let rest = match url.strip_prefix("http://") {
        Some(r) => r,
        None if url.starts_with("https://") => {
            return Err("https is not supported: serve the reward over plain http on the cluster network".into())
        }
        None => return Err("must start with http://".into()),
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || h.starts_with('[') => {
            (h, p.parse::<u16>().map_err(|_| format!("bad port `{p}`"))?)
        }
        _ => (authority, 80),
    };
    if host.is_empty() {
        return Err("has no host".into());
    }
    Ok(Url { host: host.to_string(), port, path: path.to_string() })
}

/// What went wrong with one request; `retry` says whether another try may succeed.
#[derive(Debug, Clone, PartialEq)]
pub struct HttpError {
    pub what: String,
    pub retry: bool,
    pub timed_out: bool,
}

fn transient(what: String) -> HttpError {
    HttpError { what, retry: true, timed_out: false }
}

/// A TCP connection to `url`'s host within `deadline` (`timeout`, the whole budget, is named in
/// the error).
pub fn connect(url: &Url, deadline: Instant, timeout: Duration) -> Result<TcpStream, HttpError> {
    let addrs: Vec<_> = (url.host.as_str(), url.port)
        .to_socket_addrs()
        .map_err(|e| transient(format!("cannot resolve {}: {e}", url.host)))?
        .collect();
    let mut last = None;
    for a in addrs {
        let left =
            deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero()).ok_or_else(|| HttpError {
                what: format!("no answer within {:.1}s (connecting)", timeout.as_secs_f64()),
                retry: true,
                timed_out: true,
            })?;
        match TcpStream::connect_timeout(&a, left) {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(e),
        }
    }
    Err(transient(format!(
        "cannot connect to {}:{}: {}",
        url.host,
        url.port,
        last.map(|e| e.to_string()).unwrap_or_else(|| "no address".into())
    )))
}

/// POSTs `body` as JSON; the answer body on a 2xx status.
pub fn post_json(url: &Url, body: &str, timeout: Duration) -> Result<String, HttpError> {
    let deadline = Instant::now() + timeout;
    let left = |what: &str| -> Result<Duration, HttpError> {
        deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero()).ok_or_else(|| HttpError {
            what: format!("no answer within {:.1}s ({what})", timeout.as_secs_f64()),
            retry: true,
            timed_out: true,
        })
    };
    let mut stream = connect(url, deadline, timeout)?;
    let head = format!(
        "POST {} HTTP/1.1\r\nHost: {}:{}\r\nContent-Type: application/json\r\nAccept: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        url.path,
        url.host,
        url.port,
        body.len()
    );
    let io = |e: std::io::Error, doing: &str| -> HttpError {
        if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) {
            HttpError {
                what: format!("no answer within {:.1}s ({doing})", timeout.as_secs_f64()),
                retry: true,
                timed_out: true,
            }
        } else {
            transient(format!("{doing}: {e}"))
        }
    };
    stream.set_write_timeout(Some(left("sending")?)).map_err(|e| io(e, "sending"))?;
    stream.write_all(head.as_bytes()).and_then(|_| stream.write_all(body.as_bytes())).map_err(|e| io(e, "sending"))?;
    let mut raw = Vec::new();
    let mut buf = [0u8; 16 << 10];
    loop {
        stream.set_read_timeout(Some(left("receiving")?)).map_err(|e| io(e, "receiving"))?;
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                raw.extend_from_slice(&buf[..n]);
                if raw.len() > MAX_ANSWER {
                    return Err(HttpError {
                        what: format!("answer longer than {MAX_ANSWER} bytes"),
                        retry: false,
                        timed_out: false,
                    });
                }
                if complete(&raw) {
                    break;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io(e, "receiving")),
        }
    }
    let (status, body) = parse_response(&raw).map_err(transient)?;
    match status {
        200..=299 => Ok(body),
        // Busy or broken for now: another try may succeed.
        429 | 500..=599 => Err(transient(format!("HTTP {status}: {}", crate::quote::truncate(body.trim(), 200)))),
        _ => Err(HttpError {
            what: format!("HTTP {status}: {}", crate::quote::truncate(body.trim(), 200)),
            retry: false,
            timed_out: false,
        }),
    }
}

fn header_end(raw: &[u8]) -> Option<usize> {
    raw.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4)
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().skip(1).find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// Whether `raw` holds a whole answer (so a server that keeps the connection open is not waited
/// on until the deadline).
fn complete(raw: &[u8]) -> bool {
    let Some(end) = header_end(raw) else { return false };
    let head = String::from_utf8_lossy(&raw[..end]);
    if let Some(n) = header(&head, "content-length").and_then(|v| v.parse::<usize>().ok()) {
        return raw.len() >= end + n;
    }
    if header(&head, "transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        return raw.ends_with(b"0\r\n\r\n");
    }
    false
}

fn parse_response(raw: &[u8]) -> Result<(u16, String), String> {
    let end = header_end(raw).ok_or_else(|| "connection closed before a whole HTTP answer".to_string())?;
    let head = String::from_utf8_lossy(&raw[..end]).into_owned();
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse::<u16>().ok()).ok_or_else(|| {
        format!("not an HTTP answer: {}", crate::quote::truncate(head.lines().next().unwrap_or(""), 100))
    })?;
    let rest = &raw[end..];
    let body = if let Some(n) = header(&head, "content-length").and_then(|v| v.parse::<usize>().ok()) {
        rest.get(..n).ok_or_else(|| format!("connection closed after {} of {n} body bytes", rest.len()))?.to_vec()
    } else if header(&head, "transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        dechunk(rest)?
    } else {
        rest.to_vec()
    };
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

fn dechunk(mut rest: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let line_end = rest.windows(2).position(|w| w == b"\r\n").ok_or("chunked answer cut short")?;
        let size_text = String::from_utf8_lossy(&rest[..line_end]);
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|_| format!("bad chunk size `{size_text}`"))?;
        rest = &rest[line_end + 2..];
        if size == 0 {
            return Ok(out);
        }
        out.extend_from_slice(rest.get(..size).ok_or("chunked answer cut short")?);
        rest = rest.get(size + 2..).ok_or("chunked answer cut short")?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(
            parse_url("http://127.0.0.1:8000/score").unwrap(),
            Url { host: "127.0.0.1".into(), port: 8000, path: "/score".into() }
        );
        assert_eq!(parse_url("http://rm").unwrap(), Url { host: "rm".into(), port: 80, path: "/".into() });
        assert!(parse_url("https://rm/x").unwrap_err().starts_with("https is not supported"));
        assert_eq!(parse_url("rm:80").unwrap_err(), "must start with http://");
        assert_eq!(parse_url("http://rm:x/").unwrap_err(), "bad port `x`");
    }

    #[test]
    fn answers() {
        let r = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi";
        assert!(complete(r));
        assert_eq!(parse_response(r).unwrap(), (200, "hi".into()));
        let c = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n3;x=1\r\n th\r\n0\r\n\r\n";
        assert!(complete(c));
        assert_eq!(parse_response(c).unwrap(), (200, "hi th".into()));
        assert!(!complete(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhi"));
        assert_eq!(
            parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhi").unwrap_err(),
            "connection closed after 2 of 5 body bytes"
        );
        assert_eq!(parse_response(b"HTTP/1.0 404 Not Found\r\n\r\nnope").unwrap(), (404, "nope".into()));
    }
}
