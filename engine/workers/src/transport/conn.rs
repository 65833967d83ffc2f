//! A weight stream's connection: plaintext TCP, or TLS under the run's certificate
//! (`crate::tls`) when the engine listens beyond loopback or TLS is forced. Senders and receivers
//! read and write it as any stream, after the hello (`crate::auth`) has run inside it.

use crate::tls::SERVER_NAME;
use rustls::{ClientConnection, ServerConnection, StreamOwned};
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;

pub(crate) enum Conn {
    Plain(TcpStream),
    /// The trainer's side of a TLS stream.
    Client(Box<StreamOwned<ClientConnection, TcpStream>>),
    /// The engine's side: the handshake was done asynchronously (`accept.rs`), the rest blocks.
    Server(Box<StreamOwned<ServerConnection, TcpStream>>),
}

impl Conn {
    /// The socket under the stream (timeouts, addresses).
    pub(crate) fn tcp(&self) -> &TcpStream {
        match self {
            Conn::Plain(s) => s,
            Conn::Client(s) => &s.sock,
            Conn::Server(s) => &s.sock,
        }
    }

    /// TLS as a client of the run's certificate alone; the handshake is done here, bounded by
    /// `sock`'s timeouts, so a failure names TLS rather than the first write.
    pub(crate) fn client_tls(mut sock: TcpStream, cfg: Arc<rustls::ClientConfig>) -> io::Result<Conn> {
        let name = rustls::pki_types::ServerName::try_from(SERVER_NAME).map_err(io::Error::other)?;
        let mut c = ClientConnection::new(cfg, name).map_err(io::Error::other)?;
        while c.is_handshaking() {
            c.complete_io(&mut sock)?;
        }
        Ok(Conn::Client(Box::new(StreamOwned::new(c, sock))))
    }
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = if matches!(self, Conn::Plain(_)) { "plaintext" } else { "TLS" };
        write!(f, "{kind} weight stream with {:?}", self.tcp().peer_addr().ok())
    }
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Conn::Plain(s) => s.read(buf),
            Conn::Client(s) => s.read(buf),
            Conn::Server(s) => s.read(buf),
        }
    }
}

impl Write for Conn {
    /// On the wire when it returns, as on a plain socket: TLS records are flushed at once (rustls
    /// ignores a failed send inside `write` and would report it only on the next call).
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Conn::Plain(s) => s.write(buf),
            Conn::Client(s) => {
                let n = s.write(buf)?;
                s.flush().map(|()| n)
            }
            Conn::Server(s) => {
                let n = s.write(buf)?;
                s.flush().map(|()| n)
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Conn::Plain(s) => s.flush(),
            Conn::Client(s) => s.flush(),
            Conn::Server(s) => s.flush(),
        }
    }
}
