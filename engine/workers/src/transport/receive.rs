//! The rollout engine's side of broadcast and p2p: [`Receiver`] accepts streams (over TCP, shared
//! memory or NCCL), verifies and assembles their parts, and hands a version over when activated.

use super::conn::Conn;
use super::shm::{sealed_shmem, Mapping, ShmMap, ShmReader};
use crate::tls::{RunTls, TlsMode};
use crate::wire::{self, Header, StreamError};
use miles_runtime::{NamedTensor, WeightSnapshot};
use std::collections::{BTreeMap, HashMap};
use std::io::{self, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// A snapshot being assembled from its parts.
struct Partial {
    tensors: Vec<Option<NamedTensor>>,
    parts_seen: Vec<bool>,
    full_sha256: Option<String>,
}

#[derive(Default)]
struct State {
    partial: HashMap<u64, Partial>,
    /// Complete (verified) or failed versions, newest kept.
    done: BTreeMap<u64, Result<WeightSnapshot, String>>,
    /// Buffers of the last loaded snapshot, by tensor index: the next one is received into them
    /// (a fresh buffer fills at page-fault speed, several times slower than a reused one).
    pool: HashMap<u32, Vec<f32>>,
    bytes_received: u64,
}

/// The rollout engine's side of broadcast and p2p: accepts streams on `data_addr`, verifies and
/// assembles them, and hands a version over when the controller activates it.
#[derive(Clone)]
pub struct Receiver {
    inner: Arc<(Mutex<State>, Condvar)>,
    addr: SocketAddr,
    /// The run's public tag, which every header must carry (`crate::auth::run_tag`).
    run: String,
    /// Streams must come over TLS (bound beyond loopback, or forced).
    tls_only: bool,
    /// Bound on every read and write of a connection (a sender that stalls or vanishes mid-bucket
    /// fails its version after this long, named).
    timeout: Duration,
    /// Publishers' sealed shared-memory files, mapped once and kept between versions.
    maps: Arc<Mutex<Vec<ShmMap>>>,
    /// NCCL: this engine's GPU ordinal (None: `MILES_CUDA_DEVICE`, else 0).
    gpu: Option<u32>,
}

impl Receiver {
    /// Listens on `bind` (loopback unless configured otherwise; port 0 picks one); TLS-only
    /// beyond loopback.
    pub fn start(bind: &str, token: &str) -> io::Result<Receiver> {
        Receiver::start_opts(bind, token, Duration::from_secs(60), None, TlsMode::Auto)
    }

    /// [`Receiver::start`], TLS-only also on loopback when `tls` is [`TlsMode::Always`].
    pub fn start_with_tls(bind: &str, token: &str, tls: TlsMode) -> io::Result<Receiver> {
        Receiver::start_opts(bind, token, Duration::from_secs(60), None, tls)
    }

    /// [`Receiver::start`] with another bound on each read of a stream.
    pub fn start_with_timeout(bind: &str, token: &str, timeout: Duration) -> io::Result<Receiver> {
        Receiver::start_opts(bind, token, timeout, None, TlsMode::Auto)
    }

    /// [`Receiver::start`] whose NCCL rank uses GPU `ordinal` (two ranks in one process).
    pub fn start_on_gpu(bind: &str, token: &str, ordinal: u32) -> io::Result<Receiver> {
        Receiver::start_opts(bind, token, Duration::from_secs(60), Some(ordinal), TlsMode::Auto)
    }

    fn start_opts(bind: &str, token: &str, timeout: Duration, gpu: Option<u32>, tls: TlsMode) -> io::Result<Receiver> {
        let run_tls = RunTls::derive(token).and_then(|t| t.stream_server()).map_err(io::Error::other)?;
        let listener = TcpListener::bind(bind)?;
        let addr = listener.local_addr()?;
        let r = Receiver {
            inner: Arc::new((Mutex::new(State::default()), Condvar::new())),
            addr,
            run: crate::auth::run_tag(token),
            tls_only: tls.wanted(&addr.to_string()),
            timeout,
            maps: Arc::default(),
            gpu,
        };
        let me = r.clone();
        let door = super::accept::Door {
            token: Arc::new(token.into()),
            tls: run_tls,
            tls_only: r.tls_only,
            limits: super::accept::Limits::for_timeout(timeout),
        };
        super::accept::spawn(listener, door, move |c| me.serve(c))?;
        Ok(r)
    }

    /// Whether streams must come over TLS.
    pub fn tls_only(&self) -> bool {
        self.tls_only
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The bound on each read of a stream (and, over NCCL, on joining and each broadcast).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    pub(crate) fn gpu(&self) -> Option<u32> {
        self.gpu
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn serve(&self, mut sock: Conn) {
        let timeout = Some(self.timeout);
        let _ = sock.tcp().set_read_timeout(timeout);
        let _ = sock.tcp().set_write_timeout(timeout);
        let verdict = match self.receive(&mut sock) {
            Ok(()) => "ok\n".to_string(),
            Err(e) => format!("err {}\n", e.replace('\n', " ")),
        };
        let _ = sock.write_all(verdict.as_bytes());
    }

    fn receive(&self, sock: &mut Conn) -> Result<(), String> {
        let mut r = BufReader::with_capacity(256 << 10, sock);
        // The sender proved the token before this connection got here (accept.rs); the header
        // must be of this run too.
        let h = wire::read_header(&mut r).map_err(|e| format!("bad stream: {e}"))?;
        if h.run != self.run {
            return Err("refused: the stream belongs to another run".into());
        }
        let res = match (&h.shm_path, &h.nccl) {
            (_, Some(n)) => crate::nccl::receive(self, &h, n, &mut r),
            (Some(p), None) => self.receive_shm(p, &h, &mut r),
            (None, None) => self.receive_body(&mut r, &h).map_err(|e| match e {
                StreamError::Io(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                    format!(
                        "version {} part {}: the sender stalled mid-transfer (nothing for {:.1} s); not loaded",
                        h.version,
                        h.part,
                        self.timeout.as_secs_f64()
                    )
                }
                StreamError::Io(e) => {
                    format!("version {} part {}: the sender vanished mid-transfer ({e}); not loaded", h.version, h.part)
                }
                StreamError::Corrupt(m) => m,
            }),
        };
        if let Err(e) = &res {
            // A failed part fails its version: the controller's activate reports it at once.
            let mut st = self.lock();
            st.partial.remove(&h.version);
            st.done.insert(h.version, Err(e.clone()));
            self.inner.1.notify_all();
        }
        res
    }

    /// Shared memory: the published file is read in place. Each chunk goes from the tmpfs pages
    /// straight into this engine's reused tensor buffers (the one copy) and is CRC'd there while
    /// in cache (the one verification pass, serving bucket and tensor CRCs). With notices
    /// (`shm_notices`) only bytes the publisher has announced as written are read, while it writes
    /// the rest. The file is read through a kept mapping only when it is a memfd sealed against
    /// shrinking (checked here, not trusted from the header): a file truncated under a mapping
    /// kills the reader with SIGBUS. Any other file is read with `pread`, where a short read is a
    /// named error that leaves the loaded weights alone.
    fn receive_shm(&self, p: &str, h: &Header, sock: &mut BufReader<&mut Conn>) -> Result<(), String> {
        let f = std::fs::File::open(p).map_err(|e| format!("cannot open the shared-memory snapshot {p}: {e}"))?;
        let map = if h.shm_notices && sealed_shmem(&f) {
            Some(self.map_of(&f, h.version).map_err(|e| format!("cannot map the shared-memory snapshot {p}: {e}"))?)
        } else {
            None
        };
        let mut r = ShmReader {
            f,
            map,
            maps: &self.maps,
            version: h.version,
            pos: 0,
            ready: if h.shm_notices { 0 } else { u64::MAX },
            notices: h.shm_notices.then_some(sock),
            timeout: self.timeout,
        };
        let inner = wire::read_header(&mut r)
            .map_err(|e| format!("shared-memory snapshot {p} is unreadable (truncated or torn: {e}); not loaded"))?;
        if inner.version != h.version || inner.part != h.part || inner.run != self.run {
            return Err(format!(
                "shared-memory snapshot {p} holds version {} part {}, not {} {}; not loaded",
                inner.version, inner.part, h.version, h.part
            ));
        }
        self.receive_body(&mut r, &inner).map_err(|e| match e {
            StreamError::Io(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                format!("shared-memory snapshot {p} is truncated (version {}); not loaded", h.version)
            }
            StreamError::Io(e) => {
                format!("cannot read the shared-memory snapshot {p} (version {}): {e}; not loaded", h.version)
            }
            StreamError::Corrupt(m) => format!("shared-memory snapshot {p}: {m}"),
        })
    }

    /// The kept mapping of `f` (mapped now if new or grown). Mappings not used by the last two
    /// versions are dropped: a gone publisher's memory is freed two versions later.
    fn map_of(&self, f: &std::fs::File, version: u64) -> io::Result<Arc<Mapping>> {
        use std::os::unix::fs::MetadataExt;
        let m = f.metadata()?;
        let (key, size) = ((m.dev(), m.ino()), m.len() as usize);
        let mut maps = self.maps.lock().unwrap_or_else(|p| p.into_inner());
        maps.retain(|e| e.key == key || e.last + 1 >= version);
        if let Some(e) = maps.iter_mut().find(|e| e.key == key) {
            e.last = e.last.max(version);
            if e.map.len >= size {
                return Ok(e.map.clone());
            }
            e.map = Arc::new(Mapping::new(f, size)?);
            return Ok(e.map.clone());
        }
        let map = Arc::new(Mapping::new(f, size)?);
        maps.push(ShmMap { key, map: map.clone(), last: version });
        Ok(map)
    }

    pub(crate) fn receive_body<R: Read>(&self, r: &mut R, h: &Header) -> Result<(), StreamError> {
        let mut tensors: Vec<NamedTensor> = {
            let mut st = self.lock();
            h.tensors
                .iter()
                .map(|m| {
                    let mut data = st.pool.remove(&m.index).unwrap_or_default();
                    data.resize(m.elems(), 0.0);
                    NamedTensor { name: m.name.clone(), shape: m.shape.clone(), data }
                })
                .collect()
        };
        let mut dst: Vec<&mut [u8]> = tensors.iter_mut().map(|t| wire::as_bytes_mut(&mut t.data)).collect();
        let lens: Vec<usize> = dst.iter().map(|d| d.len()).collect();
        let (trailer, _, crcs) = wire::read_payload(r, h, &lens, &mut wire::Direct(&mut dst))?;
        // Per-tensor CRCs of what was assembled, computed in the same pass as the buckets'.
        let names: Vec<&str> = tensors.iter().map(|t| t.name.as_str()).collect();
        wire::verify_crcs(h.version, &trailer, &names, &crcs).map_err(StreamError::Corrupt)?;
        self.finish_part(h, tensors, trailer).map_err(StreamError::Corrupt)
    }

    fn finish_part(&self, h: &Header, tensors: Vec<NamedTensor>, trailer: wire::Trailer) -> Result<(), String> {
        let bytes: u64 = tensors.iter().map(|t| t.data.len() as u64 * 4).sum();
        let mut st = self.lock();
        st.bytes_received += bytes;
        if st.done.get(&h.version).is_some_and(|d| d.is_err()) {
            return Err(format!("version {} already failed in another part", h.version));
        }
        let p = st.partial.entry(h.version).or_insert_with(|| Partial {
            tensors: (0..h.total_tensors).map(|_| None).collect(),
            parts_seen: vec![false; h.parts as usize],
            full_sha256: None,
        });
        if p.tensors.len() != h.total_tensors as usize || p.parts_seen.len() != h.parts as usize {
            return Err(format!("version {}: parts disagree on the snapshot's shape", h.version));
        }
        for (m, t) in h.tensors.iter().zip(tensors) {
            p.tensors[m.index as usize] = Some(t);
        }
        if let Some(x) = trailer.full_sha256 {
            p.full_sha256 = Some(x);
        }
        if let Some(s) = p.parts_seen.get_mut(h.part as usize) {
            *s = true;
        }
        if p.parts_seen.iter().all(|&s| s) {
            let p = st.partial.remove(&h.version).unwrap_or_else(|| unreachable!());
            let tensors: Option<Vec<NamedTensor>> = p.tensors.into_iter().collect();
            let result = match tensors {
                None => Err(format!("version {}: every part arrived but tensors are missing", h.version)),
                Some(tensors) => match &p.full_sha256 {
                    Some(want) if wire::full_digest(&tensors) != *want => Err(format!(
                        "version {}: the whole-weights SHA-256 differs from the trainer's; not loaded",
                        h.version
                    )),
                    _ => Ok(WeightSnapshot { version: h.version, tensors }),
                },
            };
            let failed = result.as_ref().err().cloned();
            st.done.insert(h.version, result);
            // Keep only the newest few versions.
            while st.done.len() > 2 {
                let first = *st.done.keys().next().unwrap_or(&0);
                st.done.remove(&first);
            }
            self.inner.1.notify_all();
            if let Some(e) = failed {
                return Err(e);
            }
        }
        Ok(())
    }

    /// The verified snapshot of `version`, waiting at most `timeout` for it to arrive.
    pub fn take(&self, version: u64, timeout: Duration) -> Result<WeightSnapshot, String> {
        let deadline = Instant::now() + timeout;
        let mut st = self.lock();
        loop {
            if let Some(r) = st.done.remove(&version) {
                return r;
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(format!(
                    "weights of version {version} did not arrive within {:.0} s",
                    timeout.as_secs_f64()
                ));
            }
            st = self.inner.1.wait_timeout(st, deadline - now).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    /// Gives a loaded snapshot's buffers back for the next transfer.
    pub fn recycle(&self, snap: WeightSnapshot) {
        let mut st = self.lock();
        for (i, t) in snap.tensors.into_iter().enumerate() {
            st.pool.insert(i as u32, t.data);
        }
    }

    pub fn bytes_received(&self) -> u64 {
        self.lock().bytes_received
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::tests::{snap, targets};
    use crate::transport::{Channel, StreamPublisher, TransportConfig, TransportKind, WeightPublisher};
    use crate::wire::Faults;
    use std::io::BufRead;
    use std::net::TcpStream;

    #[test]
    fn corrupted_bucket_is_detected_and_not_loaded() {
        let rx = Receiver::start("127.0.0.1:0", "tok").unwrap();
        let mut cfg = TransportConfig::new(TransportKind::Broadcast, "tok");
        cfg.bucket_bytes = 4096;
        cfg.channel = Channel::Tcp;
        cfg.faults.corrupt_bucket = Some(2);
        let e = StreamPublisher::new(cfg).publish(&snap(3, &[10000]), &targets(std::slice::from_ref(&rx))).unwrap_err();
        assert_eq!(e.worker_id, "rollout-0");
        assert!(e.message.contains("bucket 2 failed its CRC-32"), "{e}");
        let e = rx.take(3, Duration::from_secs(1)).unwrap_err();
        assert!(e.contains("not loaded"), "{e}");
    }

    #[test]
    fn stream_without_the_run_token_is_refused() {
        let rx = Receiver::start("127.0.0.1:0", "right").unwrap();
        let mut cfg = TransportConfig::new(TransportKind::Broadcast, "wrong");
        cfg.channel = Channel::Tcp;
        let e = StreamPublisher::new(cfg).publish(&snap(1, &[100]), &targets(std::slice::from_ref(&rx))).unwrap_err();
        assert!(e.message.contains("refused"), "{e}");
        assert!(rx.take(1, Duration::from_millis(200)).is_err());
    }
    /// Sends `head` (and `body`, raw bytes after it) to `rx` as a sender would, then reads the
    /// verdict unless `hang_up` (the sender vanishes).
    fn send_raw(rx: &Receiver, head: &Header, body: &[u8], hang_up: bool) -> Option<String> {
        let mut s =
            crate::transport::connect(&rx.addr().to_string(), "tok", Duration::from_secs(10), TlsMode::Auto).unwrap();
        wire::write_header(&mut s, head).unwrap();
        s.write_all(body).unwrap();
        if hang_up {
            return None;
        }
        s.tcp().set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut line = String::new();
        BufReader::new(&mut s).read_line(&mut line).unwrap();
        Some(line)
    }

    /// A whole stream (header and body) of `snap` as bytes.
    fn stream_bytes(snap: &WeightSnapshot) -> (Header, Vec<u8>) {
        let h = Header::whole("tok", snap, 8192);
        let mut buf = Vec::new();
        wire::write_header(&mut buf, &h).unwrap();
        wire::write_tensors(&mut buf, snap, 0..snap.tensors.len(), 8192, None, Faults::default()).unwrap();
        (h, buf)
    }

    #[test]
    fn truncated_shared_memory_snapshot_is_refused_and_named() {
        let rx = Receiver::start("127.0.0.1:0", "tok").unwrap();
        let mut cfg = TransportConfig::new(TransportKind::Broadcast, "tok");
        cfg.bucket_bytes = 8192;
        cfg.channel = Channel::Shm;
        let mut p = StreamPublisher::new(cfg);
        let v1 = snap(1, &[5000, 7000]);
        p.publish(&v1, &targets(std::slice::from_ref(&rx))).unwrap();
        let loaded = rx.take(1, Duration::from_secs(5)).unwrap();
        // Version 2's file is cut short (a torn write, a full /dev/shm).
        let v2 = snap(2, &[5000, 7000]);
        let (h, bytes) = stream_bytes(&v2);
        let path = std::env::temp_dir().join(format!("miles-test-trunc-{}", std::process::id()));
        std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
        let mut head = h.clone();
        head.tensors.clear();
        head.shm_path = Some(path.to_string_lossy().into_owned());
        let verdict = send_raw(&rx, &head, &[], false).unwrap();
        assert!(verdict.starts_with("err ") && verdict.contains("truncated"), "{verdict}");
        let e = rx.take(2, Duration::from_secs(1)).unwrap_err();
        assert!(e.contains("shared-memory snapshot") && e.contains("not loaded"), "{e}");
        // The engine still holds version 1, and the next good version goes through.
        assert_eq!(loaded, v1);
        rx.recycle(loaded);
        let v3 = snap(3, &[5000, 7000]);
        p.publish(&v3, &targets(std::slice::from_ref(&rx))).unwrap();
        assert_eq!(rx.take(3, Duration::from_secs(5)).unwrap(), v3);
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn corrupted_shared_memory_snapshot_is_refused_and_named() {
        let rx = Receiver::start("127.0.0.1:0", "tok").unwrap();
        let mut cfg = TransportConfig::new(TransportKind::Broadcast, "tok");
        cfg.bucket_bytes = 4096;
        cfg.channel = Channel::Shm;
        cfg.faults.corrupt_bucket = Some(1);
        let e = StreamPublisher::new(cfg).publish(&snap(4, &[10000]), &targets(std::slice::from_ref(&rx))).unwrap_err();
        assert_eq!(e.worker_id, "rollout-0");
        assert!(
            e.message.contains("shared-memory snapshot") && e.message.contains("bucket 1 failed its CRC-32"),
            "{e}"
        );
        assert!(rx.take(4, Duration::from_secs(1)).unwrap_err().contains("not loaded"));
    }

    #[test]
    fn sender_vanishing_mid_bucket_fails_the_version_at_once() {
        let rx = Receiver::start("127.0.0.1:0", "tok").unwrap();
        let (h, bytes) = stream_bytes(&snap(5, &[20000]));
        let head_len = 4 + serde_json::to_vec(&h).unwrap().len();
        // The header, a bucket length and half of that bucket; then the connection closes.
        send_raw(&rx, &h, &bytes[head_len..head_len + 8 + 4096], true);
        let t0 = Instant::now();
        let e = rx.take(5, Duration::from_secs(10)).unwrap_err();
        assert!(e.contains("vanished mid-transfer") && e.contains("not loaded"), "{e}");
        assert!(t0.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn sender_stalling_mid_bucket_is_bounded() {
        let rx = Receiver::start_with_timeout("127.0.0.1:0", "tok", Duration::from_millis(300)).unwrap();
        let (h, bytes) = stream_bytes(&snap(6, &[20000]));
        let head_len = 4 + serde_json::to_vec(&h).unwrap().len();
        let mut s =
            crate::transport::connect(&rx.addr().to_string(), "tok", Duration::from_secs(10), TlsMode::Auto).unwrap();
        s.write_all(&bytes[..head_len + 8 + 4096]).unwrap();
        let t0 = Instant::now();
        let e = rx.take(6, Duration::from_secs(10)).unwrap_err();
        assert!(e.contains("stalled mid-transfer"), "{e}");
        assert!(t0.elapsed() < Duration::from_secs(5));
        drop(s);
    }

    /// Threads of this process whose name starts with `prefix` (Linux: /proc/self/task).
    fn threads_named(prefix: &str) -> usize {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("comm")).ok())
            .filter(|n| n.starts_with(prefix))
            .count()
    }

    /// A client without the token that sends a 64 MB header (and keeps sending) is answered and
    /// dropped after the hello: its 32 MB never get read, nothing is allocated for them.
    #[test]
    fn a_huge_header_without_the_token_is_dropped_after_the_hello() {
        let rx = Receiver::start("127.0.0.1:0", "tok").unwrap();
        // A 64 MB header where the hello should be; a hello followed by a made-up proof.
        let guessed = [crate::auth::HELLO_MAGIC.as_slice(), &[7u8; crate::auth::NONCE + crate::auth::PROOF]].concat();
        for first in [(64u32 << 20).to_le_bytes().to_vec(), guessed] {
            let mut s = TcpStream::connect(rx.addr()).unwrap();
            s.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut flood = first.clone();
            flood.resize(32 << 20, b'{');
            let t0 = Instant::now();
            let e = s.write_all(&flood).unwrap_err();
            assert!(
                matches!(e.kind(), io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset),
                "the receiver kept reading: {e}"
            );
            assert!(t0.elapsed() < Duration::from_secs(5));
        }
        assert_eq!(rx.bytes_received(), 0);
        // The refusal names itself to a client that waits for it.
        let e = crate::transport::connect(&rx.addr().to_string(), "wrong", Duration::from_secs(5), TlsMode::Auto)
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        assert!(e.to_string().contains("did not prove that it holds this run's token"), "{e}");
    }

    #[test]
    fn a_connection_without_a_hello_is_refused_after_the_handshake_deadline() {
        let rx = Receiver::start_with_timeout("127.0.0.1:0", "tok", Duration::from_millis(300)).unwrap();
        let s = TcpStream::connect(rx.addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut line = String::new();
        BufReader::new(&s).read_line(&mut line).unwrap();
        assert!(line.starts_with("err refused: no hello within 0.3 s"), "{line}");
    }

    /// A thousand idle connections take no thread each and do not keep the trainer out: the
    /// oldest handshakes are evicted and a real transfer goes through while they stay open.
    #[test]
    fn a_thousand_idle_connections_take_no_threads_and_a_transfer_still_succeeds() {
        let rx = Receiver::start("127.0.0.1:0", "tok").unwrap();
        let before = std::fs::read_dir("/proc/self/task").unwrap().count();
        let idle: Vec<TcpStream> = (0..1000).map(|_| TcpStream::connect(rx.addr()).unwrap()).collect();
        std::thread::sleep(Duration::from_millis(200));
        let after = std::fs::read_dir("/proc/self/task").unwrap().count();
        // Other tests run beside this one and start threads of their own: the bound is loose,
        // far below one thread per connection.
        assert!(after < before + 200, "{before} threads before, {after} with 1000 idle connections");
        assert!(threads_named("weights-rx-conn") <= 32);
        let mut cfg = TransportConfig::new(TransportKind::Broadcast, "tok");
        cfg.channel = Channel::Tcp;
        let s = snap(8, &[3000, 500]);
        StreamPublisher::new(cfg).publish(&s, &targets(std::slice::from_ref(&rx))).unwrap();
        assert_eq!(rx.take(8, Duration::from_secs(5)).unwrap(), s);
        drop(idle);
    }

    /// Authenticated streams are bounded too: beyond the limit a sender is told the engine is busy,
    /// and the slots come back when those streams end.
    #[test]
    fn authenticated_streams_beyond_the_bound_are_refused_busy() {
        let rx = Receiver::start_with_timeout("127.0.0.1:0", "tok", Duration::from_secs(5)).unwrap();
        let addr = rx.addr().to_string();
        let limit = super::super::accept::Limits::for_timeout(Duration::from_secs(5)).streams;
        let held: Vec<_> = (0..limit)
            .map(|_| crate::transport::connect(&addr, "tok", Duration::from_secs(5), TlsMode::Auto).unwrap())
            .collect();
        let e = crate::transport::connect(&addr, "tok", Duration::from_secs(5), TlsMode::Auto).unwrap_err();
        assert!(e.to_string().contains("busy"), "{e}");
        drop(held);
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut cfg = TransportConfig::new(TransportKind::Broadcast, "tok");
        cfg.channel = Channel::Tcp;
        let mut p = StreamPublisher::new(cfg);
        let s = snap(9, &[100]);
        while let Err(e) = p.publish(&s, &targets(std::slice::from_ref(&rx))) {
            assert!(Instant::now() < deadline, "the slots did not come back: {e}");
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(rx.take(9, Duration::from_secs(5)).unwrap(), s);
    }
}
