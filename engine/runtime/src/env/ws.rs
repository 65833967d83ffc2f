//! A blocking WebSocket client for OpenEnv's `/ws` sessions, over `tungstenite`: `ws://` or
//! `wss://` (rustls, the trust of the HTTP client, `http_client::Client::tls`), text messages, a
//! bound on a message's and a frame's size, pings answered. Every read and write has a deadline:
//! the socket under tungstenite re-arms its timeout to what is left of the current deadline
//! before each read and write, so a server that drips a message a byte at a time ends there too.
//! No tokio.

use crate::http_client::{Client, Url};
use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tungstenite::client::IntoClientRequest;
use tungstenite::protocol::WebSocketConfig;
use tungstenite::stream::MaybeTlsStream;
use tungstenite::{Connector, HandshakeError, Message};

/// The largest message (and frame) read.
pub const MAX_MESSAGE: usize = 64 << 20;

#[derive(Debug, Clone, PartialEq)]
pub struct WsError {
    pub what: String,
    pub timed_out: bool,
    /// The server refused the upgrade as busy (HTTP 429 or 503): a session cap, not a crash.
    pub refused: bool,
}

fn err(what: impl Into<String>) -> WsError {
    WsError { what: what.into(), timed_out: false, refused: false }
}

fn late() -> WsError {
    WsError { what: "no answer in time".into(), timed_out: true, refused: false }
}

/// A TCP stream whose every read and write ends by a deadline shared with its owner (a timeout
/// is `TimedOut`, never `WouldBlock`, which tungstenite would take for a non-blocking socket).
struct DeadlineStream {
    tcp: TcpStream,
    deadline: Arc<Mutex<Instant>>,
}

impl DeadlineStream {
    fn left(&self) -> io::Result<Duration> {
        let at = *self.deadline.lock().unwrap_or_else(|p| p.into_inner());
        at.checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or_else(|| io::Error::new(io::ErrorKind::TimedOut, "deadline passed"))
    }

    fn timed(r: io::Result<usize>) -> io::Result<usize> {
        r.map_err(|e| match e.kind() {
            io::ErrorKind::WouldBlock => io::Error::new(io::ErrorKind::TimedOut, "deadline passed"),
            _ => e,
        })
    }
}

impl Read for DeadlineStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.tcp.set_read_timeout(Some(self.left()?))?;
        Self::timed(self.tcp.read(buf))
    }
}

impl Write for DeadlineStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.tcp.set_write_timeout(Some(self.left()?))?;
        Self::timed(self.tcp.write(buf))
    }

    fn flush(&mut self) -> io::Result<()> {
        self.tcp.flush()
    }
}

pub struct WebSocket {
    ws: tungstenite::WebSocket<MaybeTlsStream<DeadlineStream>>,
    deadline: Arc<Mutex<Instant>>,
}

/// A TCP connection to `url`'s host by `deadline`.
fn connect_tcp(url: &Url, deadline: Instant) -> Result<TcpStream, WsError> {
    let host = url.host.trim_start_matches('[').trim_end_matches(']');
    let addrs: Vec<_> =
        (host, url.port).to_socket_addrs().map_err(|e| err(format!("cannot resolve {}: {e}", url.host)))?.collect();
    let mut last = None;
    for a in addrs {
        let left = deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero()).ok_or_else(late)?;
        match TcpStream::connect_timeout(&a, left) {
            Ok(s) => return Ok(s),
            Err(e) if e.kind() == io::ErrorKind::TimedOut => return Err(late()),
            Err(e) => last = Some(e),
        }
    }
    Err(err(format!(
        "cannot connect to {}:{}: {}",
        url.host,
        url.port,
        last.map(|e| e.to_string()).unwrap_or_else(|| "no address".into())
    )))
}

fn ws_error(e: tungstenite::Error) -> WsError {
    use tungstenite::error::{CapacityError, Error as E};
    match e {
        E::Io(io) if matches!(io.kind(), io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock) => late(),
        E::Io(io) if crate::http_client::tls_failure(&io).is_some() => err(format!("TLS: {io}")),
        E::Io(io) => err(io.to_string()),
        E::ConnectionClosed | E::AlreadyClosed => err("the server closed the connection"),
        E::Http(r) => {
            let busy = matches!(r.status().as_u16(), 429 | 503);
            WsError { refused: busy, ..err(format!("the server refused the WebSocket upgrade: HTTP {}", r.status())) }
        }
        E::Capacity(CapacityError::MessageTooLong { size, max_size }) => {
            err(format!("a message of {size} bytes, longer than {max_size}"))
        }
        E::Tls(t) => err(format!("TLS: {t}")),
        other => err(other.to_string()),
    }
}

impl WebSocket {
    /// Opens `url` (`http://` or `https://`, the HTTP form of `ws://` and `wss://`) within
    /// `timeout`, trusting what the shared HTTP client trusts.
    pub fn connect(url: &Url, timeout: Duration) -> Result<WebSocket, WsError> {
        Self::connect_with(Client::shared(), url, timeout)
    }

    /// `connect`, with `client`'s trust and message cap.
    pub fn connect_with(client: &Client, url: &Url, timeout: Duration) -> Result<WebSocket, WsError> {
        let at = Instant::now() + timeout;
        let tcp = connect_tcp(url, at)?;
        let _ = tcp.set_nodelay(true);
        let deadline = Arc::new(Mutex::new(at));
        let stream = DeadlineStream { tcp, deadline: deadline.clone() };
        let request = url.ws().into_client_request().map_err(ws_error)?;
        let connector = if url.secure { Connector::Rustls(client.tls().map_err(err)?) } else { Connector::Plain };
        let cap = client.max_answer().min(MAX_MESSAGE);
        let config = WebSocketConfig::default().max_message_size(Some(cap)).max_frame_size(Some(cap));
        let ws = match tungstenite::client_tls_with_config(request, stream, Some(config), Some(connector)) {
            Ok((ws, _)) => ws,
            Err(HandshakeError::Failure(e)) => return Err(ws_error(e)),
            // Not reached: the stream blocks (up to the deadline), it never asks to be called again.
            Err(HandshakeError::Interrupted(_)) => return Err(late()),
        };
        Ok(WebSocket { ws, deadline })
    }

    fn until(&mut self, deadline: Instant) {
        *self.deadline.lock().unwrap_or_else(|p| p.into_inner()) = deadline;
    }

    pub fn send_text(&mut self, text: &str, deadline: Instant) -> Result<(), WsError> {
        self.until(deadline);
        self.ws.send(Message::text(text)).map_err(ws_error)
    }

    /// The next whole text message (pings are answered on the way; a binary message is taken as
    /// text when it is UTF-8).
    pub fn recv_text(&mut self, deadline: Instant) -> Result<String, WsError> {
        self.until(deadline);
        loop {
            match self.ws.read().map_err(ws_error)? {
                Message::Text(t) => return Ok(t.as_str().to_string()),
                Message::Binary(b) => {
                    return String::from_utf8(b.to_vec()).map_err(|_| err("a message that is not UTF-8"))
                }
                Message::Close(f) => {
                    let (code, reason) =
                        f.map(|f| (u16::from(f.code), f.reason.to_string())).unwrap_or((1005, String::new()));
                    return Err(err(format!("the server closed the session ({code} {reason})")));
                }
                Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => {}
            }
        }
    }

    /// Says goodbye (best effort, short deadline).
    pub fn close(&mut self) {
        self.until(Instant::now() + Duration::from_millis(200));
        let _ = self.ws.close(None);
        let _ = self.ws.flush();
    }
}

#[cfg(test)]
mod tests;
