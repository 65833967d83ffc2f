//! The sockets between the trainer and the engines: connecting to an engine, reading its verdict,
//! and whether a target is on this host.

use super::Target;
use std::io::{self, BufRead, BufReader};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

pub(crate) fn connect(addr: &str, timeout: Duration) -> io::Result<TcpStream> {
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
pub(super) fn read_verdict(s: &TcpStream) -> io::Result<Result<(), String>> {
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
