//! The client against real sockets on 127.0.0.1: plain servers written here byte by byte (so a
//! test controls exactly what arrives and when) and an HTTPS one under a self-signed
//! certificate made by rcgen.

use super::*;
use serde_json::json;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

/// A self-signed certificate for 127.0.0.1: its DER (to trust) and a rustls server's settings.
pub(crate) fn self_signed() -> (Vec<u8>, Arc<rustls::ServerConfig>) {
    let ck = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
    let cert = ck.cert.der().to_vec();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(ck.key_pair.serialize_der().into());
    let config = rustls::ServerConfig::builder_with_provider(ring())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.clone().into()], key)
        .unwrap();
    (cert, Arc::new(config))
}

/// Reads one request: its head (as text) and its body (by Content-Length).
pub(crate) fn read_request(s: &mut impl Read) -> (String, Vec<u8>) {
    let mut raw = Vec::new();
    let mut b = [0u8; 1];
    while !raw.ends_with(b"\r\n\r\n") {
        if s.read(&mut b).unwrap_or(0) == 0 {
            break;
        }
        raw.push(b[0]);
    }
    let head = String::from_utf8_lossy(&raw).into_owned();
    let len = head
        .lines()
        .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse().unwrap()))
        .unwrap_or(0);
    let mut body = vec![0; len];
    s.read_exact(&mut body).unwrap();
    (head, body)
}

/// A server on 127.0.0.1 handing each connection to `handle` on its own thread; its port.
pub(crate) fn serve(handle: fn(TcpStream)) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for c in listener.incoming().flatten() {
            std::thread::spawn(move || handle(c));
        }
    });
    port
}

fn url(port: u16) -> Url {
    parse_url(&format!("http://127.0.0.1:{port}/score")).unwrap()
}

fn short() -> Client {
    Client::new(Roots::WebPki, MAX_ANSWER)
}

#[test]
fn urls() {
    let u = parse_url("http://127.0.0.1:8000/score?x=1").unwrap();
    assert_eq!(u, Url { secure: false, host: "127.0.0.1".into(), port: 8000, path: "/score?x=1".into() });
    assert_eq!(parse_url("http://rm").unwrap(), Url { secure: false, host: "rm".into(), port: 80, path: "/".into() });
    let s = parse_url("https://rm/x").unwrap();
    assert_eq!((s.secure, s.port, s.http(), s.ws()), (true, 443, "https://rm:443/x".into(), "wss://rm:443/x".into()));
    let v6 = parse_url("http://[::1]:9/").unwrap();
    assert_eq!((v6.host.as_str(), v6.port, v6.http()), ("[::1]", 9, "http://[::1]:9/".into()));
    assert_eq!(parse_url("rm:80").unwrap_err(), "must start with http:// or https://");
    assert_eq!(parse_url("ftp://rm/").unwrap_err(), "must start with http:// or https://");
    assert_eq!(parse_url("http://rm:x/").unwrap_err(), "bad port `x`");
    assert_eq!(parse_url("http://rm:/").unwrap_err(), "bad port ``");
    assert!(parse_url("http://r m/").unwrap_err().starts_with("is not a URL"));
    assert_eq!(parse_url("http://u:p@rm/").unwrap_err(), "must not carry credentials (user@host)");
}

#[test]
fn statuses_are_classified() {
    let a = |status: u16| Answer { status, body: " busy ".into() };
    assert_eq!(a(204).ok().unwrap(), " busy ");
    assert_eq!(a(503).ok().unwrap_err(), HttpError { what: "HTTP 503: busy".into(), retry: true, timed_out: false });
    assert!(a(429).ok().unwrap_err().retry);
    assert_eq!(a(404).ok().unwrap_err(), HttpError { what: "HTTP 404: busy".into(), retry: false, timed_out: false });
    assert_eq!(Answer { status: 200, body: String::new() }.json(), Value::Null);
    assert_eq!(Answer { status: 200, body: "[1]".into() }.json(), json!([1]));
    assert_eq!(Answer { status: 200, body: "nope".into() }.json(), json!("nope"));
}

#[test]
fn json_round_trips_with_a_key_and_chunked_answers() {
    let port = serve(|mut c| {
        let (head, body) = read_request(&mut c);
        let echo = json!({"head": head, "body": String::from_utf8(body).unwrap()}).to_string();
        // Chunked, in two pieces: the answer's length is not known in advance.
        let (a, b) = echo.split_at(echo.len() / 2);
        let _ = write!(
            c,
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{a}\r\n{:x}\r\n{b}\r\n0\r\n\r\n",
            a.len(),
            b.len()
        );
    });
    let u = format!("http://127.0.0.1:{port}/generate");
    let (status, v) = post_json(&u, &json!({"n": 1}), Duration::from_secs(5), Some("s3cr3t")).unwrap();
    assert_eq!(status, 200);
    let head = v["head"].as_str().unwrap().to_ascii_lowercase();
    assert!(head.starts_with("post /generate http/1.1\r\n"), "{head}");
    assert!(head.contains("authorization: bearer s3cr3t\r\n") && head.contains("content-type: application/json"));
    assert_eq!(v["body"], json!(r#"{"n":1}"#));
    let (_, v) = get_json(&u, Duration::from_secs(5), None).unwrap();
    let head = v["head"].as_str().unwrap().to_ascii_lowercase();
    assert!(head.starts_with("get /generate http/1.1\r\n") && !head.contains("authorization"), "{head}");
    // A key that could break the header is refused before anything is sent, and not shown.
    let e = post_json(&u, &json!({}), Duration::from_secs(5), Some("a\r\nX-Evil: 1")).unwrap_err();
    assert_eq!(e.what, format!("{u}: the API key must be printable ASCII without spaces"));
    assert!(!e.retry);
}

#[test]
fn redirects_are_not_followed() {
    let port = serve(|mut c| {
        read_request(&mut c);
        let _ = c.write_all(b"HTTP/1.1 302 Found\r\nLocation: http://10.255.255.1/\r\nContent-Length: 0\r\n\r\n");
    });
    let a = short().request(&url(port), Some("{}"), Duration::from_secs(5), None).unwrap();
    assert_eq!(a.status, 302);
    assert_eq!(a.ok().unwrap_err().what, "HTTP 302: ");
}

#[test]
fn a_dripping_answer_ends_at_the_deadline() {
    // One byte a second: each read is quick, the whole answer never is.
    let head = serve(|mut c| {
        read_request(&mut c);
        for b in b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok" {
            if c.write_all(&[*b]).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    });
    let body = serve(|mut c| {
        read_request(&mut c);
        let _ = c.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n");
        for _ in 0..100 {
            if c.write_all(b"x").is_err() {
                return;
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    });
    for (port, what) in [(head, "no answer within 1.5s"), (body, "no answer within 1.5s (receiving)")] {
        let t0 = Instant::now();
        let e = short().request(&url(port), Some("{}"), Duration::from_millis(1500), None).unwrap_err();
        let took = t0.elapsed();
        assert!(took >= Duration::from_millis(1400) && took < Duration::from_secs(3), "{took:?}");
        assert_eq!(e, HttpError { what: what.into(), retry: true, timed_out: true });
    }
}

#[test]
fn a_silent_server_ends_at_the_deadline() {
    let port = serve(|mut c| {
        read_request(&mut c);
        std::thread::sleep(Duration::from_secs(30));
    });
    let t0 = Instant::now();
    let e = short().request(&url(port), None, Duration::from_millis(800), None).unwrap_err();
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    assert!(e.timed_out && e.retry, "{e:?}");
}

static WRITTEN: AtomicUsize = AtomicUsize::new(0);

#[test]
fn answers_over_the_cap_are_refused_without_reading_them() {
    // Announced: refused from its Content-Length, before any of the body is read.
    let announced = serve(|mut c| {
        read_request(&mut c);
        let _ = c.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100000000000\r\n\r\n");
        std::thread::sleep(Duration::from_secs(30));
    });
    let client = Client::new(Roots::WebPki, 1 << 10);
    let t0 = Instant::now();
    let e = client.request(&url(announced), Some("{}"), Duration::from_secs(10), None).unwrap_err();
    assert!(t0.elapsed() < Duration::from_secs(3));
    assert_eq!(
        e,
        HttpError {
            what: "answer of 100000000000 bytes is longer than 1024 bytes".into(),
            retry: false,
            timed_out: false
        }
    );
    // Unannounced (read to the close): refused at the first byte past the cap; the server could
    // not write its 256 MB.
    let endless = serve(|mut c| {
        read_request(&mut c);
        let _ = c.write_all(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n");
        let chunk = [b'x'; 64 << 10];
        for _ in 0..4096 {
            if c.write_all(&chunk).is_err() {
                return;
            }
            WRITTEN.fetch_add(chunk.len(), Ordering::SeqCst);
        }
    });
    let t0 = Instant::now();
    let e = client.request(&url(endless), Some("{}"), Duration::from_secs(10), None).unwrap_err();
    assert!(t0.elapsed() < Duration::from_secs(3));
    assert_eq!(e, HttpError { what: "answer longer than 1024 bytes".into(), retry: false, timed_out: false });
    std::thread::sleep(Duration::from_millis(200));
    assert!(WRITTEN.load(Ordering::SeqCst) < 64 << 20, "{}", WRITTEN.load(Ordering::SeqCst));
}

#[test]
fn an_endless_answer_head_is_refused() {
    let port = serve(|mut c| {
        read_request(&mut c);
        // One header line that never ends.
        let _ = c.write_all(b"HTTP/1.1 200 OK\r\nX-Filler: ");
        for _ in 0..100_000 {
            if c.write_all(&[b'y'; 1024]).is_err() {
                return;
            }
        }
    });
    let t0 = Instant::now();
    let e = short().request(&url(port), Some("{}"), Duration::from_secs(10), None).unwrap_err();
    assert!(t0.elapsed() < Duration::from_secs(3));
    assert_eq!(e, HttpError { what: "answer head longer than 65536 bytes".into(), retry: false, timed_out: false });
}

#[test]
fn dead_services_are_transient_and_named() {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    for scheme in ["http", "https"] {
        let u = format!("{scheme}://127.0.0.1:{port}/x");
        let e = post_json(&u, &json!({}), Duration::from_secs(2), None).unwrap_err();
        assert!(e.what.starts_with(&format!("{u}: cannot connect")) && e.retry && !e.timed_out, "{e:?}");
    }
    let e = get_json("ws://h/", Duration::from_secs(1), None).unwrap_err();
    assert_eq!(e.what, "ws://h/: must start with http:// or https://");
}

/// An HTTPS server for one request under `config`, answering `{"tls": true}`.
fn serve_tls(config: Arc<rustls::ServerConfig>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for c in listener.incoming().flatten() {
            let config = config.clone();
            std::thread::spawn(move || {
                let _ = c.set_read_timeout(Some(Duration::from_secs(5)));
                let mut s = rustls::StreamOwned::new(rustls::ServerConnection::new(config).unwrap(), c);
                let (head, _) = read_request(&mut s);
                if head.is_empty() {
                    return;
                }
                let body = r#"{"tls":true}"#;
                let _ = write!(s, "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}", body.len());
                let _ = s.flush();
            });
        }
    });
    port
}

#[test]
fn https_with_a_trusted_root_and_refused_without_it() {
    let (cert, config) = self_signed();
    let port = serve_tls(config);
    let u = parse_url(&format!("https://127.0.0.1:{port}/score")).unwrap();
    let trusting = Client::new(Roots::Only(vec![cert]), MAX_ANSWER);
    let a = trusting.request(&u, Some("{}"), Duration::from_secs(5), None).unwrap();
    assert_eq!((a.status, a.json()), (200, json!({"tls": true})));
    // Mozilla's roots do not vouch for a self-signed certificate: refused, and not retried.
    let e = short().request(&u, Some("{}"), Duration::from_secs(5), None).unwrap_err();
    assert!(e.what.starts_with("TLS: ") && e.what.contains("UnknownIssuer") && !e.retry, "{e:?}");
}
