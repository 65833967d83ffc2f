//! The sockets between the trainer and the engines: connecting to an engine, reading its verdict,
//! and whether a target is on this host.

use super::conn::Conn;
use super::Target;
use crate::tls::{RunTls, TlsMode};
use std::io::{self, BufRead, BufReader, Read};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// Connects to an engine's receiver (over TLS when `tls` wants it for `addr`: beyond loopback, or
/// forced) and runs the hello, in which each side proves it holds the run's token without sending
/// it (`crate::auth::prove`; the receiver reads nothing else before: `transport/accept.rs`). A
/// refusal, or an engine that cannot prove the token or show the run's certificate, is a
/// `PermissionDenied` error saying why.
pub(crate) fn connect(addr: &str, token: &str, timeout: Duration, tls: TlsMode) -> io::Result<Conn> {
    let s = connect_raw(addr, timeout)?;
    let mut c = match tls.wanted(addr) {
        true => {
            let cfg = RunTls::derive(token).and_then(|t| t.stream_client()).map_err(io::Error::other)?;
            Conn::client_tls(s, cfg).map_err(|e| match e.kind() {
                // A certificate other than the run's, or not TLS at all: not this run's engine.
                io::ErrorKind::InvalidData => io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!("no TLS session under this run's certificate ({e}); nothing was sent"),
                ),
                _ => e,
            })?
        }
        false => Conn::Plain(s),
    };
    crate::auth::prove(&mut c, token)?;
    Ok(c)
}

/// What a failed connection to an engine says: refused (the engine's reason) or unreachable.
pub(crate) fn connect_error(addr: &str, e: &io::Error) -> String {
    match e.kind() {
        io::ErrorKind::PermissionDenied => format!("{addr} refused the stream: {e}"),
        _ => format!("{addr} unreachable or too slow: {e}"),
    }
}

fn connect_raw(addr: &str, timeout: Duration) -> io::Result<TcpStream> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, format!("{addr} resolves to no address"));
    for a in addr.to_socket_addrs()? {
        match TcpStream::connect_timeout(&a, timeout) {
            Ok(s) => {
                s.set_write_timeout(Some(timeout))?;
                s.set_read_timeout(Some(timeout))?;
                s.set_nodelay(true)?;
                return Ok(s);
            }
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// Reads the engine's one-line verdict: "ok" or "err <why>".
pub(super) fn read_verdict(s: impl Read) -> io::Result<Result<(), String>> {
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line)?;
    let line = line.trim_end();
    if line == "ok" {
        Ok(Ok(()))
    } else if let Some(why) = line.strip_prefix("err ") {
        Ok(Err(why.to_string()))
    } else {
        Ok(Err(format!("no verdict from the engine (got {line:?}): it closed the connection")))
    }
}

pub(super) fn is_loopback(t: &Target) -> bool {
    t.data_addr.to_socket_addrs().map(|mut a| a.all(|x| x.ip().is_loopback())).unwrap_or(false)
}

pub(super) fn all_loopback(targets: &[Target]) -> bool {
    targets.iter().all(is_loopback)
}
