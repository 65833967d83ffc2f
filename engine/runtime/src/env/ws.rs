//! A minimal blocking WebSocket client (RFC 6455) for OpenEnv's `/ws` sessions: plain `ws://`
//! over the shared HTTP client's connection, text messages, masked client frames, fragmented
//! server messages, ping answered with pong. Every read and write has a deadline. No tokio.

use crate::http_client::{self, Url};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The largest message read.
const MAX_MESSAGE: usize = 64 << 20;

#[derive(Debug, Clone, PartialEq)]
pub struct WsError {
    pub what: String,
    pub timed_out: bool,
}

fn err(what: impl Into<String>) -> WsError {
    WsError { what: what.into(), timed_out: false }
}

pub struct WebSocket {
    stream: TcpStream,
    /// Bytes read past the last frame (or the handshake).
    buf: Vec<u8>,
    mask_state: u64,
}

/// Mask keys need not be secret here (no proxy to poison): a counter mixed with the clock.
fn next_seed() -> u64 {
    static N: AtomicU64 = AtomicU64::new(0x9E37_79B9_7F4A_7C15);
    let t =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
    N.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed) ^ t
}

fn base64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in bytes.chunks(3) {
        let n = (c[0] as u32) << 16 | (*c.get(1).unwrap_or(&0) as u32) << 8 | *c.get(2).unwrap_or(&0) as u32;
        for k in 0..4 {
            if k <= c.len() {
                out.push(A[(n >> (18 - 6 * k) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

impl WebSocket {
    /// Opens `url` (`http://host:port/path`, the HTTP form of `ws://`) within `timeout`.
    pub fn connect(url: &Url, timeout: Duration) -> Result<WebSocket, WsError> {
        let deadline = Instant::now() + timeout;
        let stream = http_client::connect(url, deadline, timeout)
            .map_err(|e| WsError { what: e.what, timed_out: e.timed_out })?;
        let _ = stream.set_nodelay(true);
        let mut ws = WebSocket { stream, buf: Vec::new(), mask_state: next_seed() };
        let key: Vec<u8> = (0..2).flat_map(|_| ws.next_mask_u64().to_le_bytes()).collect();
        let head = format!(
            "GET {} HTTP/1.1\r\nHost: {}:{}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {}\r\nSec-WebSocket-Version: 13\r\n\r\n",
            url.path,
            url.host,
            url.port,
            base64(&key)
        );
        ws.write_all(head.as_bytes(), deadline)?;
        let end = loop {
            if let Some(i) = ws.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            if ws.buf.len() > 64 << 10 {
                return Err(err("handshake answer too long"));
            }
            ws.fill(deadline)?;
        };
        let head = String::from_utf8_lossy(&ws.buf[..end]).into_owned();
        let status = head.split_whitespace().nth(1).unwrap_or("");
        if status != "101" {
            let first = head.lines().next().unwrap_or("").to_string();
            return Err(err(format!("the server refused the WebSocket upgrade: {first}")));
        }
        ws.buf.drain(..end);
        Ok(ws)
    }

    fn next_mask_u64(&mut self) -> u64 {
        // xorshift64*
        let mut x = self.mask_state | 1;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.mask_state = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn left(deadline: Instant) -> Result<Duration, WsError> {
        deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or(WsError { what: "no answer in time".into(), timed_out: true })
    }

    fn io(e: std::io::Error) -> WsError {
        let timed_out = matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut);
        WsError { what: if timed_out { "no answer in time".into() } else { e.to_string() }, timed_out }
    }

    fn write_all(&mut self, bytes: &[u8], deadline: Instant) -> Result<(), WsError> {
        self.stream.set_write_timeout(Some(Self::left(deadline)?)).map_err(Self::io)?;
        self.stream.write_all(bytes).map_err(Self::io)
    }

    fn fill(&mut self, deadline: Instant) -> Result<(), WsError> {
        let mut chunk = [0u8; 16 << 10];
        loop {
            self.stream.set_read_timeout(Some(Self::left(deadline)?)).map_err(Self::io)?;
            match self.stream.read(&mut chunk) {
                Ok(0) => return Err(err("the server closed the connection")),
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    return Ok(());
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Self::io(e)),
            }
        }
    }

    fn take(&mut self, n: usize, deadline: Instant) -> Result<Vec<u8>, WsError> {
        while self.buf.len() < n {
            self.fill(deadline)?;
        }
        Ok(self.buf.drain(..n).collect())
    }

    fn send_frame(&mut self, opcode: u8, payload: &[u8], deadline: Instant) -> Result<(), WsError> {
        let mut f = vec![0x80 | opcode];
        match payload.len() {
            n if n < 126 => f.push(0x80 | n as u8),
            n if n <= u16::MAX as usize => {
                f.push(0x80 | 126);
                f.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                f.push(0x80 | 127);
                f.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        let mask = (self.next_mask_u64() as u32).to_be_bytes();
        f.extend_from_slice(&mask);
        f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        self.write_all(&f, deadline)
    }

    pub fn send_text(&mut self, text: &str, deadline: Instant) -> Result<(), WsError> {
        self.send_frame(0x1, text.as_bytes(), deadline)
    }

    /// The next whole text message (control frames are handled on the way).
    pub fn recv_text(&mut self, deadline: Instant) -> Result<String, WsError> {
        let mut message = Vec::new();
        loop {
            let h = self.take(2, deadline)?;
            let (fin, opcode, masked) = (h[0] & 0x80 != 0, h[0] & 0x0f, h[1] & 0x80 != 0);
            let len = match h[1] & 0x7f {
                126 => u16::from_be_bytes(self.take(2, deadline)?.try_into().expect("2 bytes")) as usize,
                127 => u64::from_be_bytes(self.take(8, deadline)?.try_into().expect("8 bytes")) as usize,
                n => n as usize,
            };
            if len > MAX_MESSAGE || message.len() + len > MAX_MESSAGE {
                return Err(err(format!("a message longer than {MAX_MESSAGE} bytes")));
            }
            let mask = if masked { Some(self.take(4, deadline)?) } else { None };
            let mut payload = self.take(len, deadline)?;
            if let Some(m) = mask {
                payload.iter_mut().enumerate().for_each(|(i, b)| *b ^= m[i % 4]);
            }
            match opcode {
                0x0..=0x2 => {
                    message.extend_from_slice(&payload);
                    if fin {
                        return String::from_utf8(message).map_err(|_| err("a message that is not UTF-8"));
                    }
                }
                0x8 => {
                    let code = payload.get(..2).map(|c| u16::from_be_bytes([c[0], c[1]])).unwrap_or(1005);
                    let reason = String::from_utf8_lossy(payload.get(2..).unwrap_or(&[])).into_owned();
                    return Err(err(format!("the server closed the session ({code} {reason})")));
                }
                0x9 => self.send_frame(0xA, &payload, deadline)?,
                0xA => {}
                o => return Err(err(format!("a frame with unknown opcode {o}"))),
            }
        }
    }

    /// Says goodbye (best effort, short deadline).
    pub fn close(&mut self) {
        let _ = self.send_frame(0x8, &1000u16.to_be_bytes(), Instant::now() + Duration::from_millis(200));
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_base64() {
        assert_eq!(base64(b"hello"), "aGVsbG8=");
        assert_eq!(base64(b"hell"), "aGVsbA==");
        assert_eq!(base64(b"hel"), "aGVs");
        assert_eq!(base64(&[0u8; 16]).len(), 24);
    }
}
