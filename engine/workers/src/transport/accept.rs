//! The weight receiver's door. Every connection first runs the hello, in which the sender proves
//! it holds the run's token without sending it (`crate::auth`); the receiver reads at most
//! `auth::MAX_HELLO` bytes of it, within a short deadline, before it reads a header or gives the
//! connection a thread. A connection that opens with a TLS record gets a TLS session under the
//! run's certificate first (the hello runs inside it); a plaintext one is refused when the
//! receiver is TLS-only (bound beyond loopback, or TLS forced). Handshakes, TLS ones included, wait
//! on one thread (an async task each, no thread), at most [`Limits::pending`] at a time: a new
//! connection beyond that evicts the oldest handshake, so a flood of idle connections neither
//! exhausts threads nor keeps out the trainer, whose hello follows its connect at once.
//! Authenticated streams get a thread each, at most [`Limits::streams`] at a time (a trainer opens
//! one per route: a handful).

use super::conn::Conn;
use std::collections::VecDeque;
use std::io;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{timeout, timeout_at, Instant};

#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    /// How long a connection may take to send its hello (its TLS handshake included).
    pub handshake: Duration,
    /// Connections waiting for their hello.
    pub pending: usize,
    /// Authenticated streams being received (one thread each).
    pub streams: usize,
}

impl Limits {
    /// The receiver's bounds for a stream read timeout of `timeout`.
    pub(super) fn for_timeout(timeout: Duration) -> Limits {
        Limits { handshake: timeout.min(Duration::from_secs(10)), pending: 128, streams: 32 }
    }
}

/// Who may come in, and how.
pub(super) struct Door {
    pub token: Arc<String>,
    /// The run's TLS, derived from the token.
    pub tls: Arc<rustls::ServerConfig>,
    /// Plaintext is refused: the receiver listens beyond loopback, or TLS is forced.
    pub tls_only: bool,
    pub limits: Limits,
}

type Serve = Arc<dyn Fn(Conn) + Send + Sync>;

/// The first byte of a TLS connection (a handshake record); no hello starts with it.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// Accepts connections on `listener` on a thread of its own for the life of the process, and
/// runs `serve` on a thread per authenticated connection.
pub(super) fn spawn(
    listener: std::net::TcpListener,
    door: Door,
    serve: impl Fn(Conn) + Send + Sync + 'static,
) -> io::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_io().enable_time().build()?;
    listener.set_nonblocking(true)?;
    let listener = {
        let _in_rt = rt.enter();
        tokio::net::TcpListener::from_std(listener)?
    };
    let serve: Serve = Arc::new(serve);
    std::thread::Builder::new()
        .name("weights-rx".into())
        .spawn(move || rt.block_on(accept_loop(listener, Arc::new(door), serve)))?;
    Ok(())
}

async fn accept_loop(listener: tokio::net::TcpListener, door: Arc<Door>, serve: Serve) {
    let streams = Arc::new(Semaphore::new(door.limits.streams));
    let mut pending: VecDeque<tokio::task::JoinHandle<()>> = VecDeque::new();
    loop {
        let sock = match listener.accept().await {
            Ok((s, _)) => s,
            // Out of descriptors (a flood): wait instead of spinning on the error.
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        pending.retain(|h| !h.is_finished());
        if pending.len() >= door.limits.pending {
            if let Some(oldest) = pending.pop_front() {
                oldest.abort();
            }
        }
        pending.push_back(tokio::spawn(handshake(sock, door.clone(), streams.clone(), serve.clone())));
    }
}

/// Opens TLS when the connection asks for it, checks the hello, answers "ok" or "err <why>", and
/// hands an authenticated connection to a thread of its own (holding one of the stream slots until
/// it is done).
async fn handshake(mut sock: tokio::net::TcpStream, door: Arc<Door>, streams: Arc<Semaphore>, serve: Serve) {
    let deadline = Instant::now() + door.limits.handshake;
    let mut first = [0u8; 1];
    let tls = match timeout_at(deadline, sock.peek(&mut first)).await {
        Ok(Ok(1..)) => first[0] == TLS_HANDSHAKE_RECORD,
        // Closed or failed before its first byte: nobody to answer.
        Ok(_) => return,
        Err(_) => {
            let why = format!("err {}\n", no_hello(&door));
            let _ = timeout(door.limits.handshake, sock.write_all(why.as_bytes())).await;
            return;
        }
    };
    if tls {
        let acceptor = tokio_rustls::TlsAcceptor::from(door.tls.clone());
        // No session (not TLS after all, or another run's client): nothing to answer in.
        let Ok(Ok(s)) = timeout_at(deadline, acceptor.accept(sock)).await else { return };
        let Some((s, permit)) = authenticate(s, &door, deadline, &streams).await else { return };
        let (sock, session) = s.into_inner();
        if let Some(sock) = blocking(sock) {
            start(Conn::Server(Box::new(rustls::StreamOwned::new(session, sock))), permit, serve);
        }
    } else if door.tls_only {
        // Read the plaintext hello (bounded) so that the close is orderly and the sender reads why.
        let mut hello = [0u8; crate::auth::HELLO_MAGIC.len() + crate::auth::NONCE];
        let _ = timeout_at(deadline, sock.read_exact(&mut hello)).await;
        let why = "err refused: this engine takes weights over TLS only (it listens beyond loopback, or \
                   MILES_TLS=always); the sender spoke plaintext\n";
        let _ = timeout(door.limits.handshake, sock.write_all(why.as_bytes())).await;
    } else if let Some((s, permit)) = authenticate(sock, &door, deadline, &streams).await {
        if let Some(s) = blocking(s) {
            start(Conn::Plain(s), permit, serve);
        }
    }
}

fn no_hello(door: &Door) -> String {
    format!("refused: no hello within {:.1} s", door.limits.handshake.as_secs_f64())
}

/// The hello on `s` and the answer to it; the stream and its slot when the sender is let in.
async fn authenticate<S: AsyncRead + AsyncWrite + Unpin>(
    mut s: S,
    door: &Door,
    deadline: Instant,
    streams: &Arc<Semaphore>,
) -> Option<(S, OwnedSemaphorePermit)> {
    let checked = timeout_at(deadline, crate::auth::check_hello(&mut s, &door.token))
        .await
        .unwrap_or_else(|_| Err(no_hello(door)));
    let verdict = checked.and_then(|()| {
        streams.clone().try_acquire_owned().map_err(|_| {
            format!("busy: this engine is receiving {} weight streams already; try again", door.limits.streams)
        })
    });
    let answer = match &verdict {
        Ok(_) => "ok\n".to_string(),
        Err(why) => format!("err {why}\n"),
    };
    let sent = timeout(door.limits.handshake, async {
        s.write_all(answer.as_bytes()).await?;
        s.flush().await
    })
    .await;
    match (verdict, sent) {
        (Ok(permit), Ok(Ok(()))) => Some((s, permit)),
        _ => None,
    }
}

/// The socket made blocking again, for the stream's own thread.
fn blocking(sock: tokio::net::TcpStream) -> Option<std::net::TcpStream> {
    let sock = sock.into_std().ok()?;
    sock.set_nonblocking(false).ok()?;
    Some(sock)
}

fn start(conn: Conn, permit: OwnedSemaphorePermit, serve: Serve) {
    // A failed spawn drops the closure, and with it the permit.
    let _ = std::thread::Builder::new().name("weights-rx-conn".into()).spawn(move || {
        serve(conn);
        drop(permit);
    });
}
