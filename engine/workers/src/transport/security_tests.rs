//! What crosses the socket of a weight stream, seen from a tap between the trainer and the engine:
//! no token (challenge-response), no replay, no impostor engine, and with TLS no weight bytes; a
//! TLS-only engine refuses plaintext and other runs.

use super::tests::{snap, targets};
use super::{Channel, Receiver, StreamPublisher, Target, TransportConfig, TransportKind, WeightPublisher};
use crate::tls::TlsMode;
use miles_runtime::WeightSnapshot;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const TOKEN: &str = "s3cret-run-token-0123456789abcdef";

/// A TCP proxy in front of `to` for one connection, recording what each side sent.
struct Tap {
    addr: String,
    /// Sender to receiver.
    up: Arc<Mutex<Vec<u8>>>,
    /// Receiver to sender.
    down: Arc<Mutex<Vec<u8>>>,
}

impl Tap {
    fn new(to: SocketAddr) -> Tap {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let (up, down) = (Arc::new(Mutex::new(Vec::new())), Arc::new(Mutex::new(Vec::new())));
        let (u, d) = (up.clone(), down.clone());
        std::thread::spawn(move || {
            // Bounded: a test that never connects leaves no thread behind for long.
            l.set_nonblocking(true).unwrap();
            let deadline = Instant::now() + Duration::from_secs(20);
            let client = loop {
                match l.accept() {
                    Ok((c, _)) => break c,
                    Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
                    Err(_) => return,
                }
            };
            client.set_nonblocking(false).unwrap();
            let server = TcpStream::connect(to).unwrap();
            pump(client.try_clone().unwrap(), server.try_clone().unwrap(), u);
            pump(server, client, d);
        });
        Tap { addr, up, down }
    }

    fn up(&self) -> Vec<u8> {
        self.up.lock().unwrap().clone()
    }

    fn down(&self) -> Vec<u8> {
        self.down.lock().unwrap().clone()
    }
}

/// Copies `from` to `to` on a thread, recording each chunk before it is forwarded.
fn pump(mut from: TcpStream, mut to: TcpStream, rec: Arc<Mutex<Vec<u8>>>) {
    std::thread::spawn(move || {
        from.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut buf = vec![0u8; 64 << 10];
        while let Ok(n @ 1..) = from.read(&mut buf) {
            rec.lock().unwrap().extend_from_slice(&buf[..n]);
            if to.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = to.shutdown(std::net::Shutdown::Write);
    });
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

fn tcp_cfg(kind: TransportKind) -> TransportConfig {
    let mut cfg = TransportConfig::new(kind, TOKEN);
    cfg.channel = Channel::Tcp;
    cfg.bucket_bytes = 8192;
    cfg
}

fn via(tap: &Tap) -> Vec<Target> {
    vec![Target { worker_id: "rollout-0".into(), data_addr: tap.addr.clone() }]
}

/// Neither the hello nor the header carries the token: a passive listener learns nothing that
/// would let it authenticate (nor derive the run's TLS key).
#[test]
fn no_token_byte_crosses_the_socket() {
    let rx = Receiver::start("127.0.0.1:0", TOKEN).unwrap();
    let tap = Tap::new(rx.addr());
    let s = snap(1, &[3000, 70]);
    StreamPublisher::new(tcp_cfg(TransportKind::Broadcast)).publish(&s, &via(&tap)).unwrap();
    assert_eq!(rx.take(1, Duration::from_secs(5)).unwrap(), s);
    let (up, down) = (tap.up(), tap.down());
    assert!(up.len() > 12000, "the weights went through the tap ({} bytes)", up.len());
    assert!(!contains(&up, TOKEN.as_bytes()), "the sender wrote the token");
    assert!(!contains(&down, TOKEN.as_bytes()), "the receiver wrote the token");
}

/// Everything a sender wrote, replayed on a new connection, is refused: the receiver's nonce is
/// new, so the recorded proof answers another challenge. Nothing is loaded a second time.
#[test]
fn a_recorded_stream_replayed_is_refused() {
    let rx = Receiver::start("127.0.0.1:0", TOKEN).unwrap();
    let tap = Tap::new(rx.addr());
    let s = snap(2, &[500]);
    StreamPublisher::new(tcp_cfg(TransportKind::Broadcast)).publish(&s, &via(&tap)).unwrap();
    assert_eq!(rx.take(2, Duration::from_secs(5)).unwrap(), s);
    let recorded = tap.up();
    let mut c = TcpStream::connect(rx.addr()).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // The receiver may hang up before it has read everything: the answer is what counts.
    let _ = c.write_all(&recorded);
    let mut answer = Vec::new();
    let _ = c.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.contains("err refused"), "{answer}");
    assert!(!answer.lines().any(|l| l == "ok"), "the replay was accepted: {answer}");
    assert!(rx.take(2, Duration::from_millis(300)).is_err(), "the replayed version was loaded again");
}

/// An engine that does not hold the token cannot prove it: the sender stops after its hello and
/// sends neither a proof nor a byte of weights.
#[test]
fn a_sender_streams_nothing_to_an_impostor_engine() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let fake = std::thread::spawn(move || {
        let (mut c, _) = l.accept().unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut hello = [0u8; crate::auth::HELLO_MAGIC.len() + crate::auth::NONCE];
        c.read_exact(&mut hello).unwrap();
        // A well-formed challenge whose proof is made up.
        c.write_all(format!("challenge {} {}\n", "ab".repeat(32), "cd".repeat(32)).as_bytes()).unwrap();
        let mut rest = Vec::new();
        let _ = c.read_to_end(&mut rest);
        rest.len()
    });
    let t = vec![Target { worker_id: "rollout-0".into(), data_addr: addr }];
    let e = StreamPublisher::new(tcp_cfg(TransportKind::Broadcast)).publish(&snap(1, &[1000]), &t).unwrap_err();
    assert!(e.message.contains("did not prove that it holds this run's token"), "{e}");
    assert_eq!(fake.join().unwrap(), 0, "the sender wrote past its hello");
}

fn tls_cfg(kind: TransportKind, channel: Channel) -> TransportConfig {
    let mut cfg = tcp_cfg(kind);
    cfg.channel = channel;
    cfg.tls = TlsMode::Always;
    cfg
}

/// A tensor whose bytes are a pattern no TLS record would show by chance.
fn marked(version: u64) -> WeightSnapshot {
    let mut s = snap(version, &[4096, 300]);
    for (k, x) in s.tensors[0].data.iter_mut().enumerate() {
        *x = f32::from_bits(0x4d49_4c00 | (k as u32 & 0xff));
    }
    s
}

/// TLS forced on loopback: the weights arrive bit for bit (broadcast and p2p over TCP, and the
/// shared-memory channel, whose control socket is then TLS), and a tap between the two sees
/// neither the token nor a run of weight bytes.
#[test]
fn forced_tls_delivers_identical_weights_and_shows_none_on_the_wire() {
    let rx = Receiver::start_with_tls("127.0.0.1:0", TOKEN, TlsMode::Always).unwrap();
    assert!(rx.tls_only());
    let tap = Tap::new(rx.addr());
    let s = marked(1);
    let rep = StreamPublisher::new(tls_cfg(TransportKind::Broadcast, Channel::Tcp)).publish(&s, &via(&tap)).unwrap();
    assert_eq!(rep.transport, "broadcast/tcp");
    let got = rx.take(1, Duration::from_secs(5)).unwrap();
    assert_eq!(got, s);
    let up = tap.up();
    assert_eq!(up.first(), Some(&0x16), "the stream did not open with a TLS handshake");
    let weights = crate::wire::as_bytes(&s.tensors[0].data[..16]).to_vec();
    assert!(!contains(&up, &weights), "weight bytes crossed in the clear");
    assert!(up.len() > s.bytes(), "the weights went through the tap ({} bytes)", up.len());
    assert!(!contains(&up, TOKEN.as_bytes()) && !contains(&tap.down(), TOKEN.as_bytes()));
    rx.recycle(got);
    for (v, kind, channel) in [(2, TransportKind::P2p, Channel::Tcp), (3, TransportKind::Broadcast, Channel::Shm)] {
        let s = marked(v);
        let mut p = StreamPublisher::new(tls_cfg(kind, channel));
        p.publish(&s, &targets(std::slice::from_ref(&rx))).unwrap();
        let got = rx.take(v, Duration::from_secs(5)).unwrap();
        assert_eq!(got, s, "{kind:?} over {channel:?}");
        rx.recycle(got);
    }
}

/// A TLS-only engine refuses a plaintext sender, saying why, and loads nothing; a TLS sender of
/// another run fails on the certificate before its hello.
#[test]
fn a_tls_engine_refuses_plaintext_and_other_runs() {
    let rx = Receiver::start_with_tls("127.0.0.1:0", TOKEN, TlsMode::Always).unwrap();
    let t = targets(std::slice::from_ref(&rx));
    let e = StreamPublisher::new(tcp_cfg(TransportKind::Broadcast)).publish(&snap(1, &[100]), &t).unwrap_err();
    assert!(e.message.contains("refused") && e.message.contains("TLS only"), "{e}");
    let mut other = tls_cfg(TransportKind::Broadcast, Channel::Tcp);
    other.token = "another-run".into();
    let e = StreamPublisher::new(other).publish(&snap(1, &[100]), &t).unwrap_err();
    assert!(e.message.contains("no TLS session under this run's certificate"), "{e}");
    assert!(rx.take(1, Duration::from_millis(200)).is_err());
    assert_eq!(rx.bytes_received(), 0);
    // Beyond loopback a receiver is TLS-only without being told.
    assert!(Receiver::start("0.0.0.0:0", TOKEN).unwrap().tls_only());
    assert!(!Receiver::start("127.0.0.1:0", TOKEN).unwrap().tls_only());
}
