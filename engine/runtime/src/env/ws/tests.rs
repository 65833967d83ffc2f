//! The client against tungstenite servers on 127.0.0.1 (plain and under a self-signed
//! certificate), and against servers that drip, stay silent, refuse or send too much.

use super::*;
use crate::http_client::{parse_url, Roots, MAX_ANSWER};
use std::io::Write;
use std::net::TcpListener;

/// A server on 127.0.0.1 handing each connection to `handle` on its own thread (the HTTP
/// client's test server); its `/ws` URL.
fn serve(handle: fn(TcpStream)) -> Url {
    let port = crate::http_client::tests::serve(handle);
    parse_url(&format!("http://127.0.0.1:{port}/ws")).unwrap()
}

/// Echoes text messages, each after a ping.
fn echo<S: Read + Write>(mut ws: tungstenite::WebSocket<S>) {
    while let Ok(m) = ws.read() {
        if let Message::Text(t) = m {
            let _ = ws.send(Message::Ping(Vec::new().into()));
            let _ = ws.send(Message::text(format!("echo {}", t.as_str())));
        }
    }
}

fn secs(s: u64) -> Instant {
    Instant::now() + Duration::from_secs(s)
}

#[test]
fn text_round_trips_over_ws() {
    let url = serve(|c| echo(tungstenite::accept(c).unwrap()));
    let mut ws = WebSocket::connect(&url, Duration::from_secs(5)).unwrap();
    for m in ["hello", "again"] {
        ws.send_text(m, secs(5)).unwrap();
        assert_eq!(ws.recv_text(secs(5)).unwrap(), format!("echo {m}"));
    }
    ws.close();
}

#[test]
fn text_round_trips_over_wss_with_a_trusted_root() {
    let (cert, config) = crate::http_client::tests::self_signed();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for c in listener.incoming().flatten() {
            let config = config.clone();
            std::thread::spawn(move || {
                let tls = rustls::StreamOwned::new(rustls::ServerConnection::new(config).unwrap(), c);
                if let Ok(ws) = tungstenite::accept(tls) {
                    echo(ws)
                }
            });
        }
    });
    let url = parse_url(&format!("https://127.0.0.1:{port}/ws")).unwrap();
    let trusting = Client::new(Roots::Only(vec![cert]), MAX_ANSWER);
    let mut ws = WebSocket::connect_with(&trusting, &url, Duration::from_secs(5)).unwrap();
    ws.send_text("over tls", secs(5)).unwrap();
    assert_eq!(ws.recv_text(secs(5)).unwrap(), "echo over tls");
    // Mozilla's roots do not vouch for the self-signed certificate.
    let e = WebSocket::connect(&url, Duration::from_secs(5)).err().unwrap();
    assert!(e.what.starts_with("TLS: ") && e.what.contains("UnknownIssuer"), "{e:?}");
}

#[test]
fn a_message_over_the_cap_is_refused() {
    let url = serve(|c| {
        let mut ws = tungstenite::accept(c).unwrap();
        let _ = ws.send(Message::text("x".repeat(4096)));
        std::thread::sleep(Duration::from_secs(2));
    });
    let small = Client::new(Roots::WebPki, 1024);
    let mut ws = WebSocket::connect_with(&small, &url, Duration::from_secs(5)).unwrap();
    let e = ws.recv_text(secs(5)).unwrap_err();
    assert!(e.what.contains("longer than 1024") && !e.timed_out, "{e:?}");
}

#[test]
fn a_dripping_or_silent_server_ends_at_the_deadline() {
    // After the handshake, one byte of a frame a second.
    let drip = serve(|c| {
        let mut ws = tungstenite::accept(c).unwrap();
        for b in [0x81u8, 5, b'h', b'e', b'l', b'l', b'o'] {
            if ws.get_mut().write_all(&[b]).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    });
    let mut ws = WebSocket::connect(&drip, Duration::from_secs(5)).unwrap();
    let t0 = Instant::now();
    let e = ws.recv_text(Instant::now() + Duration::from_millis(1500)).unwrap_err();
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    assert_eq!(e, late());
    // Accepts the connection, never answers the handshake.
    let silent = serve(|_c| std::thread::sleep(Duration::from_secs(30)));
    let t0 = Instant::now();
    let e = WebSocket::connect(&silent, Duration::from_millis(800)).err().unwrap();
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    assert_eq!(e, late());
}

#[test]
fn refusals_and_closes_are_named() {
    let refuse = serve(|mut c| {
        let mut b = [0u8; 4096];
        let _ = c.read(&mut b);
        let _ = c.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n");
    });
    let e = WebSocket::connect(&refuse, Duration::from_secs(5)).err().unwrap();
    assert_eq!(e.what, "the server refused the WebSocket upgrade: HTTP 404 Not Found");
    let closing = serve(|c| {
        let mut ws = tungstenite::accept(c).unwrap();
        let frame = tungstenite::protocol::CloseFrame { code: 1011u16.into(), reason: "bye".into() };
        let _ = ws.close(Some(frame));
        let _ = ws.flush();
        std::thread::sleep(Duration::from_secs(1));
    });
    let mut ws = WebSocket::connect(&closing, Duration::from_secs(5)).unwrap();
    assert_eq!(ws.recv_text(secs(5)).unwrap_err().what, "the server closed the session (1011 bye)");
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let dead = parse_url(&format!("http://127.0.0.1:{port}/ws")).unwrap();
    let e = WebSocket::connect(&dead, Duration::from_secs(2)).err().unwrap();
    assert!(e.what.starts_with(&format!("cannot connect to 127.0.0.1:{port}")), "{e:?}");
}
