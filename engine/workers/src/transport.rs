//! Weight transports between processes: the trainer's side ([`WeightPublisher`]) and the rollout
//! engine's side ([`Receiver`] for streams, [`crate::delta::DeltaReceiver`] for disk deltas).
//!
//! - **broadcast**: the whole snapshot goes to every engine, in buckets, one connection per engine,
//!   all concurrent; over TCP, or through one shared-memory file when every engine is on this host.
//! - **p2p**: a [`TransferPlan`] splits the snapshot into trainer shards and maps each shard to the
//!   engine ranks that need it; every (shard, rank) route is its own concurrent connection.
//! - **disk-delta**: [`crate::delta`].
//!
//! Broadcast and p2p go over a [`Channel`]: TCP, shared memory, or NCCL ([`crate::nccl`]), the
//! `weights` stage's `channel` (auto: shared memory when every engine is on this host).
//!
//! The executor (and later the asynchronous runtime) sees only [`WeightPublisher::publish`] and a
//! [`TransferReport`]: which transport runs is the recipe's `weights` stage's choice.

use crate::wire::{self, Faults, Header, StreamError};
use miles_runtime::{NamedTensor, WeightSnapshot};
use std::collections::{BTreeMap, HashMap};
use std::io::{self, BufRead, BufReader, BufWriter, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::ops::Range;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportKind {
    Broadcast,
    P2p,
    DiskDelta,
}

impl TransportKind {
    pub fn parse(s: &str) -> Option<TransportKind> {
        match s {
            "broadcast" => Some(TransportKind::Broadcast),
            "p2p" => Some(TransportKind::P2p),
            "disk_delta" | "disk-delta" => Some(TransportKind::DiskDelta),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            TransportKind::Broadcast => "broadcast",
            TransportKind::P2p => "p2p",
            TransportKind::DiskDelta => "disk_delta",
        }
    }
}

/// How a stream reaches an engine on the same host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channel {
    Tcp,
    /// One shared-memory file (a sealed memfd, opened by the engines through /proc) written once
    /// and read by every engine while it is written; the socket carries the header and "written up
    /// to byte N" notices. Needs every target on this host, in the same PID namespace.
    Shm,
    /// Shared memory when every target address is loopback, TCP otherwise.
    Auto,
    /// GPU to GPU through one NCCL communicator of the trainer and the engines ([`crate::nccl`]);
    /// the socket carries the header, a handshake and the verdict.
    Nccl,
}

impl Channel {
    /// The `weights` stage's `channel` (`""`: auto, for requests from older controllers).
    pub fn parse(s: &str) -> Option<Channel> {
        match s {
            "" | "auto" => Some(Channel::Auto),
            "tcp" => Some(Channel::Tcp),
            "shm" => Some(Channel::Shm),
            "nccl" => Some(Channel::Nccl),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Channel::Tcp => "tcp",
            Channel::Shm => "shm",
            Channel::Auto => "auto",
            Channel::Nccl => "nccl",
        }
    }
}

#[derive(Debug, Clone)]
pub struct TransportConfig {
    pub kind: TransportKind,
    pub bucket_bytes: u64,
    /// Also compare a SHA-256 over the whole weights after assembly.
    pub verify_full: bool,
    /// p2p: trainer shards (0 = one per target, at most 4).
    pub shards: usize,
    pub channel: Channel,
    /// NCCL: this process's GPU ordinal (None: `MILES_CUDA_DEVICE`, else 0).
    pub gpu: Option<u32>,
    pub token: String,
    /// Bound on connecting, on each write and on waiting for an engine's verdict.
    pub timeout: Duration,
    pub faults: Faults,
}

impl TransportConfig {
    pub fn new(kind: TransportKind, token: impl Into<String>) -> Self {
        TransportConfig {
            kind,
            bucket_bytes: 512 << 20,
            verify_full: false,
            shards: 0,
            channel: Channel::Auto,
            gpu: None,
            token: token.into(),
            timeout: Duration::from_secs(60),
            faults: Faults::default(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Target {
    pub worker_id: String,
    pub data_addr: String,
}

#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct TransferReport {
    pub transport: String,
    pub version: u64,
    /// Payload bytes delivered, all targets together.
    pub bytes: u64,
    pub seconds: f64,
    pub gb_per_s: f64,
    pub targets: u32,
    pub buckets: u32,
}

impl TransferReport {
    pub fn finish(mut self, started: Instant) -> Self {
        self.seconds = started.elapsed().as_secs_f64();
        self.gb_per_s = self.bytes as f64 / self.seconds.max(1e-9) / 1e9;
        self
    }
}

/// A failed transfer: which engine, and why.
#[derive(Debug, Clone)]
pub struct TransferError {
    pub worker_id: String,
    pub message: String,
}

impl std::fmt::Display for TransferError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "weight transfer to {}: {}", self.worker_id, self.message)
    }
}

/// The trainer's side of a weight transport.
pub trait WeightPublisher: Send {
    fn name(&self) -> &'static str;
    /// Delivers `snap` to every target and waits until each has verified what arrived.
    fn publish(&mut self, snap: &WeightSnapshot, targets: &[Target]) -> Result<TransferReport, TransferError>;
}

/// Which trainer shard goes to which engine rank.
#[derive(Debug, Clone, PartialEq)]
pub struct TransferPlan {
    pub shards: Vec<Range<usize>>,
    /// (shard, target index) pairs; every route is one concurrent transfer.
    pub routes: Vec<(usize, usize)>,
}

impl TransferPlan {
    /// `needs(target, tensor)`: whether that engine rank holds that tensor (every tensor for an
    /// unsharded engine; a slice of them under tensor or expert parallelism).
    pub fn build(
        snap: &WeightSnapshot,
        targets: usize,
        shards: usize,
        needs: &dyn Fn(usize, usize) -> bool,
    ) -> TransferPlan {
        let shards = wire::shard_ranges(snap, shards);
        let mut routes = Vec::new();
        for (s, r) in shards.iter().enumerate() {
            for t in 0..targets {
                if r.clone().any(|i| needs(t, i)) {
                    routes.push((s, t));
                }
            }
        }
        TransferPlan { shards, routes }
    }
}

/// Broadcast and p2p over sockets (or shared memory).
pub struct StreamPublisher {
    pub cfg: TransportConfig,
    /// Shared-memory files kept (and mapped) between versions, one per part; unmapped and closed
    /// when the publisher goes.
    shm: Vec<ShmFile>,
    /// Distinguishes this publisher's files from another's in the same process.
    id: u64,
    /// NCCL: the serialized body, reused between versions.
    nccl_stream: Vec<u8>,
}

impl StreamPublisher {
    pub fn new(cfg: TransportConfig) -> Self {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        StreamPublisher {
            cfg,
            shm: Vec::new(),
            id: NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            nccl_stream: Vec::new(),
        }
    }
}

impl StreamPublisher {
    /// [`WeightPublisher::publish`] through shared memory (see there).
    fn publish_shm(
        &mut self,
        snap: &WeightSnapshot,
        targets: &[Target],
        plan: &TransferPlan,
        full: Option<String>,
        started: Instant,
    ) -> Result<TransferReport, TransferError> {
        let cfg = &self.cfg;
        let parts = plan.shards.len() as u32;
        let trainer_err = |message: String| TransferError { worker_id: "trainer".into(), message };
        while self.shm.len() < plan.shards.len() {
            let name = format!("miles-{}-{}-p{}", std::process::id(), self.id, self.shm.len());
            let f =
                ShmFile::create(&name).map_err(|e| trainer_err(format!("cannot create shared memory {name}: {e}")))?;
            self.shm.push(f);
        }
        // Each file is sized for its whole stream before any engine opens it: payload, 12 bytes
        // per bucket, header and trailer entries per tensor (it grows only for a larger snapshot;
        // an engine maps what it finds when it opens the file and again when notices pass that).
        for (s, r) in plan.shards.iter().enumerate() {
            let payload: usize = r.clone().map(|i| snap.tensors[i].data.len() * 4).sum();
            let buckets = payload.div_ceil(cfg.bucket_bytes.max(4096) as usize);
            let f = &mut self.shm[s];
            f.reserve(payload + 12 * buckets + 256 * r.len() + (64 << 10))
                .map_err(|e| trainer_err(format!("cannot size shared memory {}: {e}", f.path)))?;
        }
        // Every engine is connected, then every one gets its header, before the first byte is
        // written. Connections first: an engine that cannot be reached fails the publish before
        // any other engine has read a header of this version, so the others hold no failure of it
        // and the version can be published again to the engines that are left.
        let unreachable = |t: usize| {
            let target = &targets[t];
            move |e: io::Error| TransferError {
                worker_id: target.worker_id.clone(),
                message: format!("{} unreachable or too slow: {e}", target.data_addr),
            }
        };
        let mut socks = Vec::with_capacity(plan.routes.len());
        for &(_, t) in &plan.routes {
            socks.push(connect(&targets[t].data_addr, cfg.timeout).map_err(unreachable(t))?);
        }
        let mut routes: Vec<Vec<ShmRoute>> = plan.shards.iter().map(|_| Vec::new()).collect();
        for (&(s, t), sock) in plan.routes.iter().zip(socks) {
            let mut h = Header::part(&cfg.token, snap, cfg.bucket_bytes, (s as u32, parts), std::iter::empty());
            h.shm_path = Some(self.shm[s].path.clone());
            h.shm_notices = true;
            let mut head = Vec::new();
            wire::write_header(&mut head, &h).map_err(unreachable(t))?;
            // An engine that vanishes now fails alone (its verdict names it); the others go on.
            let failed = (&sock).write_all(&head).err();
            routes[s].push(ShmRoute { target: t, sock, failed });
        }
        let mut report = TransferReport {
            transport: format!("{}/shm", cfg.kind.name()),
            version: snap.version,
            targets: targets.len() as u32,
            ..Default::default()
        };
        for (s, r) in plan.shards.iter().enumerate() {
            let h = Header::part(&cfg.token, snap, cfg.bucket_bytes, (s as u32, parts), r.clone());
            let mut w = ShmWriter { shm: &mut self.shm[s], routes: &mut routes[s], pos: 0, notified: 0 };
            let res = (|| -> io::Result<u32> {
                wire::write_header(&mut w, &h)?;
                let (b, _) = wire::write_tensors(&mut w, snap, r.clone(), cfg.bucket_bytes, full.clone(), cfg.faults)?;
                if w.pos > w.notified {
                    w.notify()?;
                }
                Ok(b)
            })();
            match res {
                Ok(b) => report.buckets += b,
                // Every engine of this part stopped reading: their verdicts say why.
                Err(_) if w.routes.iter().all(|r| r.failed.is_some()) => {}
                Err(e) => return Err(trainer_err(format!("cannot write shared memory {}: {e}", w.shm.path))),
            }
        }
        // Verdicts, each bounded by the socket's timeout; the first failure (in route order) is
        // reported, as for TCP.
        let mut first_err: Option<TransferError> = None;
        for r in routes.iter().flatten() {
            let target = &targets[r.target];
            let res = match (read_verdict(&r.sock), &r.failed) {
                (Ok(v), _) => v,
                (Err(e), None) => Err(format!("{} unreachable or too slow: {e}", target.data_addr)),
                (Err(_), Some(e)) => Err(format!("{} unreachable or too slow: {e}", target.data_addr)),
            };
            if let (Err(message), None) = (res, &first_err) {
                first_err = Some(TransferError { worker_id: target.worker_id.clone(), message });
            }
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        let per_target: usize = snap.tensors.iter().map(|t| t.data.len() * 4).sum();
        report.bytes = (per_target * targets.len()) as u64;
        Ok(report.finish(started))
    }
}

/// The publisher's shared-memory file of one part: a memfd sealed against shrinking (so an engine
/// may map it: its pages can never vanish under the mapping), or a /dev/shm file where memfds are
/// unavailable (engines then read it with `pread`). Mapped once, writable, pages resident: a
/// version is memcpy'd into it, with no page faults and no per-version syscalls but the notices.
struct ShmFile {
    file: std::fs::File,
    /// What an engine opens: /proc/<pid>/fd/<n> of the memfd, or the /dev/shm path.
    path: String,
    /// The /dev/shm fallback is removed when the publisher goes (a memfd goes with its last fd).
    unlink: Option<PathBuf>,
    map: *mut u8,
    len: usize,
}

// SAFETY: the mapping is owned by this value alone (only the owning publisher writes through it).
unsafe impl Send for ShmFile {}

impl ShmFile {
    fn create(name: &str) -> io::Result<ShmFile> {
        use std::os::fd::{AsRawFd, FromRawFd};
        let cname = std::ffi::CString::new(name).map_err(io::Error::other)?;
        // SAFETY: plain syscall on a valid C string; the fd is owned by the File right after.
        let fd = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
        let (file, path, unlink) = if fd >= 0 {
            // SAFETY: fd is a fresh descriptor nobody else owns.
            let file = unsafe { std::fs::File::from_raw_fd(fd) };
            // Growing stays allowed (a larger snapshot); shrinking never (an engine's mapping),
            // and nobody may add or remove seals afterwards.
            // SAFETY: fcntl on our own valid fd.
            if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK | libc::F_SEAL_SEAL) } != 0
            {
                return Err(io::Error::last_os_error());
            }
            let path = format!("/proc/{}/fd/{}", std::process::id(), file.as_raw_fd());
            (file, path, None)
        } else {
            let dir = shm_dir().ok_or_else(|| io::Error::other("shared memory needs memfd_create or /dev/shm"))?;
            let p = dir.join(name);
            let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&p)?;
            (file, p.to_string_lossy().into_owned(), Some(p))
        };
        Ok(ShmFile { file, path, unlink, map: std::ptr::null_mut(), len: 0 })
    }

    /// Makes the file and its mapping at least `len` bytes (grown by a quarter at a time).
    fn reserve(&mut self, len: usize) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        if len <= self.len {
            return Ok(());
        }
        let len = len.max(self.len + self.len / 4).next_multiple_of(2 << 20);
        self.file.set_len(len as u64)?;
        self.unmap();
        // SAFETY: a fresh shared mapping of our own file, `len` bytes long (just sized so).
        // MAP_POPULATE: the pages are allocated and mapped once here, not faulted per version.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                self.file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        self.map = p as *mut u8;
        self.len = len;
        Ok(())
    }

    fn unmap(&mut self) {
        if !self.map.is_null() {
            // SAFETY: map/len are exactly what mmap returned; no slice into it outlives a call.
            unsafe { libc::munmap(self.map as *mut libc::c_void, self.len) };
            self.map = std::ptr::null_mut();
            self.len = 0;
        }
    }
}

impl Drop for ShmFile {
    fn drop(&mut self) {
        self.unmap();
        if let Some(p) = &self.unlink {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// One engine connection of a shared-memory publish: its header went out first, notices follow.
struct ShmRoute {
    target: usize,
    sock: TcpStream,
    /// The first failed notice: this engine stopped reading (its verdict says why).
    failed: Option<io::Error>,
}

/// Writes a part's stream into its mapped file and, every [`wire::READY_NOTICE`] bytes, tells
/// each engine how far it may read: the engines copy bucket k while this writes bucket k+1.
struct ShmWriter<'a> {
    shm: &'a mut ShmFile,
    routes: &'a mut [ShmRoute],
    pos: usize,
    notified: usize,
}

impl ShmWriter<'_> {
    fn notify(&mut self) -> io::Result<()> {
        let n = (self.pos as u64).to_le_bytes();
        for r in self.routes.iter_mut().filter(|r| r.failed.is_none()) {
            if let Err(e) = (&r.sock).write_all(&n) {
                r.failed = Some(e);
            }
        }
        self.notified = self.pos;
        if self.routes.iter().all(|r| r.failed.is_some()) {
            return Err(io::Error::new(io::ErrorKind::BrokenPipe, "every engine of this part stopped reading"));
        }
        Ok(())
    }
}

impl Write for ShmWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let end = self.pos + buf.len();
        self.shm.reserve(end)?;
        // Plain stores (not streaming ones): the engine copies these bytes a few MB behind, while
        // they may still be in the shared cache (measured: streaming stores made it slower).
        // SAFETY: [pos, end) lies inside the mapping (just reserved); `buf` is ours, not in it.
        unsafe { std::ptr::copy_nonoverlapping(buf.as_ptr(), self.shm.map.add(self.pos), buf.len()) };
        self.pos = end;
        if self.pos - self.notified >= wire::READY_NOTICE {
            self.notify()?;
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

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
fn read_verdict(s: &TcpStream) -> io::Result<Result<(), String>> {
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

fn is_loopback(t: &Target) -> bool {
    t.data_addr.to_socket_addrs().map(|mut a| a.all(|x| x.ip().is_loopback())).unwrap_or(false)
}

fn all_loopback(targets: &[Target]) -> bool {
    targets.iter().all(is_loopback)
}

fn shm_dir() -> Option<PathBuf> {
    let d = PathBuf::from("/dev/shm");
    d.is_dir().then_some(d)
}

impl WeightPublisher for StreamPublisher {
    fn name(&self) -> &'static str {
        self.cfg.kind.name()
    }

    fn publish(&mut self, snap: &WeightSnapshot, targets: &[Target]) -> Result<TransferReport, TransferError> {
        let started = Instant::now();
        let cfg = &self.cfg;
        let n = snap.tensors.len();
        let shards = match cfg.kind {
            TransportKind::P2p if cfg.shards == 0 => targets.len().clamp(1, 4),
            TransportKind::P2p => cfg.shards,
            _ => 1,
        };
        let plan = TransferPlan::build(snap, targets.len(), shards, &|_, _| true);
        let parts = plan.shards.len() as u32;
        let full = cfg.verify_full.then(|| wire::full_digest(&snap.tensors));
        let use_shm = match cfg.channel {
            Channel::Shm => {
                // Forced: an engine elsewhere is an error, not a silent fall-back to TCP.
                if let Some(t) = targets.iter().find(|t| !is_loopback(t)) {
                    return Err(TransferError {
                        worker_id: t.worker_id.clone(),
                        message: format!(
                            "channel = shm needs every engine on this host, but {} is at {}, not a loopback \
                             address; use channel = tcp (or auto, which picks shared memory only where it can)",
                            t.worker_id, t.data_addr
                        ),
                    });
                }
                true
            }
            Channel::Tcp => false,
            Channel::Auto => all_loopback(targets) && shm_dir().is_some(),
            // Every unsharded engine needs the whole snapshot: p2p over NCCL is one broadcast.
            Channel::Nccl if !targets.is_empty() => {
                let mut buf = std::mem::take(&mut self.nccl_stream);
                let res = crate::nccl::publish(cfg, snap, targets, full, &mut buf, started);
                self.nccl_stream = buf;
                return res;
            }
            Channel::Nccl => false,
        } && !targets.is_empty();

        // Shared memory, pipelined: every engine gets its header first, then the publisher
        // writes each part once into its mapped file and notices on the sockets tell the engines
        // how far they may copy. No engine reads a version that is not yet notified, and the last
        // publish waited for every verdict, so rewriting the file in place races with no reader
        // (a reader checks the version in the file's header anyway).
        if use_shm {
            return self.publish_shm(snap, targets, &plan, full, started);
        }
        let results: Vec<(usize, Result<u32, String>)> = std::thread::scope(|sc| {
            let handles: Vec<_> = plan
                .routes
                .iter()
                .map(|&(s, t)| {
                    let range = plan.shards[s].clone();
                    let target = &targets[t];
                    let full = full.as_ref();
                    sc.spawn(move || {
                        let res = (|| -> io::Result<Result<u32, String>> {
                            let sock = connect(&target.data_addr, cfg.timeout)?;
                            // Framing is buffered; payload chunks (CHUNK bytes, CRC'd in cache right
                            // before) go from the tensors to the socket with no copy in between.
                            let mut w = BufWriter::with_capacity(64 << 10, &sock);
                            let h = Header::part(&cfg.token, snap, cfg.bucket_bytes, (s as u32, parts), range.clone());
                            wire::write_header(&mut w, &h)?;
                            let buckets =
                                wire::write_tensors(&mut w, snap, range, cfg.bucket_bytes, full.cloned(), cfg.faults)?
                                    .0;
                            drop(w);
                            Ok(read_verdict(&sock)?.map(|_| buckets))
                        })();
                        (t, res.unwrap_or_else(|e| Err(format!("{} unreachable or too slow: {e}", target.data_addr))))
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or((usize::MAX, Err("sender thread panicked".into()))))
                .collect()
        });
        let mut report = TransferReport {
            transport: format!("{}/tcp", cfg.kind.name()),
            version: snap.version,
            targets: targets.len() as u32,
            ..Default::default()
        };
        for (t, r) in results {
            match r {
                Ok(b) => report.buckets += b,
                Err(message) => {
                    let worker_id = targets.get(t).map(|x| x.worker_id.clone()).unwrap_or_else(|| "?".into());
                    return Err(TransferError { worker_id, message });
                }
            }
        }
        let per_target: usize = (0..n).map(|i| snap.tensors[i].data.len() * 4).sum();
        report.bytes = (per_target * targets.len()) as u64;
        Ok(report.finish(started))
    }
}

/// Whether `f` is a tmpfs memfd sealed against shrinking: mapped, its pages cannot vanish (no
/// SIGBUS), and it is not hugetlbfs (whose faults may SIGBUS when the pool runs dry).
fn sealed_shmem(f: &std::fs::File) -> bool {
    use std::os::fd::AsRawFd;
    // SAFETY: fcntl and fstatfs on a valid fd into a zeroed struct of the right type.
    unsafe {
        let seals = libc::fcntl(f.as_raw_fd(), libc::F_GET_SEALS);
        let mut st: libc::statfs = std::mem::zeroed();
        seals >= 0
            && seals & libc::F_SEAL_SHRINK != 0
            && libc::fstatfs(f.as_raw_fd(), &mut st) == 0
            && st.f_type == libc::TMPFS_MAGIC
    }
}

/// A read-only shared mapping of a whole sealed memfd.
struct Mapping {
    ptr: *const u8,
    len: usize,
}

// SAFETY: the mapping is only read (through `ptr::copy`), never freed while an Arc holds it.
unsafe impl Send for Mapping {}
unsafe impl Sync for Mapping {}

impl Mapping {
    fn new(f: &std::fs::File, len: usize) -> io::Result<Mapping> {
        use std::os::fd::AsRawFd;
        if len == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the file is empty"));
        }
        // SAFETY: a fresh read-only mapping of `len` bytes of a file at least that long that can
        // no longer shrink (sealed), so every page stays backed. MAP_POPULATE: mapped once here
        // rather than faulted in during every version's copy.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                f.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping { ptr: p as *const u8, len })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: exactly what mmap returned; the last Arc is gone.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

struct ShmMap {
    /// (device, inode) of the file.
    key: (u64, u64),
    map: Arc<Mapping>,
    /// The newest version read through it.
    last: u64,
}

/// Reads a published shared-memory stream: from the kept mapping or with `pread`, never past
/// what the publisher's notices announced (with notices) or the file's end (without).
struct ShmReader<'a, 'b> {
    f: std::fs::File,
    map: Option<Arc<Mapping>>,
    maps: &'a Mutex<Vec<ShmMap>>,
    version: u64,
    pos: u64,
    /// Bytes the publisher has written (u64::MAX without notices: the whole file).
    ready: u64,
    notices: Option<&'a mut BufReader<&'b TcpStream>>,
    timeout: Duration,
}

impl ShmReader<'_, '_> {
    /// Waits (bounded by the socket's timeout) until the publisher announces bytes past `pos`.
    fn wait_ready(&mut self) -> io::Result<()> {
        let Some(sock) = self.notices.as_mut() else { return Ok(()) };
        while self.ready <= self.pos {
            let mut n = [0u8; 8];
            sock.read_exact(&mut n).map_err(|e| match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("the publisher stalled mid-transfer (nothing for {:.1} s)", self.timeout.as_secs_f64()),
                ),
                _ => io::Error::other(format!("the publisher vanished mid-transfer ({e})")),
            })?;
            self.ready = self.ready.max(u64::from_le_bytes(n));
            // Notices already here: take the newest at once.
            while sock.buffer().len() >= 8 {
                sock.read_exact(&mut n)?;
                self.ready = self.ready.max(u64::from_le_bytes(n));
            }
        }
        if let Some(old) = self.map.clone() {
            if self.ready > old.len as u64 {
                // The file grew (a larger snapshot): map it again, whole.
                let size = self.f.metadata()?.len();
                if size < self.ready {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("the publisher announced byte {} of a {size}-byte file", self.ready),
                    ));
                }
                let m = Arc::new(Mapping::new(&self.f, size as usize)?);
                let mut maps = self.maps.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(e) = maps.iter_mut().find(|e| Arc::ptr_eq(&e.map, &old)) {
                    e.map = m.clone();
                    e.last = e.last.max(self.version);
                }
                self.map = Some(m);
            }
        }
        Ok(())
    }
}

impl Read for ShmReader<'_, '_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        if self.pos >= self.ready {
            self.wait_ready()?;
        }
        let n = buf.len().min((self.ready - self.pos).min(usize::MAX as u64) as usize);
        let k = match &self.map {
            Some(m) => {
                // wait_ready keeps `ready` within the mapping.
                // SAFETY: [pos, pos + n) lies inside the mapping of a file that cannot shrink;
                // the publisher has finished writing those bytes (notified) and does not touch
                // them again in this version. What was copied is verified (CRC) in `buf`.
                unsafe { std::ptr::copy_nonoverlapping(m.ptr.add(self.pos as usize), buf.as_mut_ptr(), n) };
                n
            }
            None => {
                use std::os::unix::fs::FileExt;
                self.f.read_at(&mut buf[..n], self.pos)?
            }
        };
        self.pos += k as u64;
        Ok(k)
    }
}

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
    token: Arc<String>,
    /// Bound on every read and write of a connection (a sender that stalls or vanishes mid-bucket
    /// fails its version after this long, named).
    timeout: Duration,
    /// Publishers' sealed shared-memory files, mapped once and kept between versions.
    maps: Arc<Mutex<Vec<ShmMap>>>,
    /// NCCL: this engine's GPU ordinal (None: `MILES_CUDA_DEVICE`, else 0).
    gpu: Option<u32>,
}

impl Receiver {
    /// Listens on `bind` (loopback unless configured otherwise; port 0 picks one).
    pub fn start(bind: &str, token: &str) -> io::Result<Receiver> {
        Receiver::start_with_timeout(bind, token, Duration::from_secs(60))
    }

    /// [`Receiver::start`] with another bound on each read of a stream.
    pub fn start_with_timeout(bind: &str, token: &str, timeout: Duration) -> io::Result<Receiver> {
        Receiver::start_opts(bind, token, timeout, None)
    }

    /// [`Receiver::start`] whose NCCL rank uses GPU `ordinal` (two ranks in one process).
    pub fn start_on_gpu(bind: &str, token: &str, ordinal: u32) -> io::Result<Receiver> {
        Receiver::start_opts(bind, token, Duration::from_secs(60), Some(ordinal))
    }

    fn start_opts(bind: &str, token: &str, timeout: Duration, gpu: Option<u32>) -> io::Result<Receiver> {
        let listener = TcpListener::bind(bind)?;
        let addr = listener.local_addr()?;
        let r = Receiver {
            inner: Arc::new((Mutex::new(State::default()), Condvar::new())),
            addr,
            token: Arc::new(token.into()),
            timeout,
            maps: Arc::default(),
            gpu,
        };
        let me = r.clone();
        std::thread::Builder::new().name("weights-rx".into()).spawn(move || {
            for conn in listener.incoming().flatten() {
                let me = me.clone();
                let _ = std::thread::Builder::new().name("weights-rx-conn".into()).spawn(move || me.serve(conn));
            }
        })?;
        Ok(r)
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

    fn serve(&self, sock: TcpStream) {
        let timeout = Some(self.timeout);
        let _ = sock.set_read_timeout(timeout);
        let _ = sock.set_write_timeout(timeout);
        let verdict = match self.receive(&sock) {
            Ok(()) => "ok\n".to_string(),
            Err(e) => format!("err {}\n", e.replace('\n', " ")),
        };
        let _ = (&sock).write_all(verdict.as_bytes());
    }

    fn receive(&self, sock: &TcpStream) -> Result<(), String> {
        let mut r = BufReader::with_capacity(256 << 10, sock);
        let h = wire::read_header(&mut r).map_err(|e| format!("bad stream: {e}"))?;
        // Constant-time enough: the token is compared whole before anything else is read.
        if !crate::auth::token_eq(&h.token, &self.token) {
            return Err("refused: the stream does not carry this run's token".into());
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
    fn receive_shm(&self, p: &str, h: &Header, sock: &mut BufReader<&TcpStream>) -> Result<(), String> {
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
        if inner.version != h.version || inner.part != h.part || !crate::auth::token_eq(&inner.token, &self.token) {
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

/// The publisher for a transport kind.
pub fn publisher(cfg: TransportConfig, delta_dir: Option<PathBuf>) -> Box<dyn WeightPublisher> {
    match cfg.kind {
        TransportKind::DiskDelta => {
            Box::new(crate::delta::DeltaPublisher::new(delta_dir.unwrap_or_else(|| PathBuf::from("weights")), cfg))
        }
        _ => Box::new(StreamPublisher::new(cfg)),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn snap(version: u64, elems: &[usize]) -> WeightSnapshot {
        WeightSnapshot {
            version,
            tensors: elems
                .iter()
                .enumerate()
                .map(|(i, &n)| NamedTensor {
                    name: format!("model.layers.{i}.weight"),
                    shape: vec![n],
                    data: (0..n).map(|k| ((k * 31 + i * 7 + version as usize) % 1000) as f32 * 1e-3).collect(),
                })
                .collect(),
        }
    }

    fn targets(rx: &[Receiver]) -> Vec<Target> {
        rx.iter()
            .enumerate()
            .map(|(i, r)| Target { worker_id: format!("rollout-{i}"), data_addr: r.addr().to_string() })
            .collect()
    }

    fn run(kind: TransportKind, channel: Channel, engines: usize) {
        let rx: Vec<Receiver> = (0..engines).map(|_| Receiver::start("127.0.0.1:0", "tok").unwrap()).collect();
        let mut cfg = TransportConfig::new(kind, "tok");
        cfg.bucket_bytes = 8192;
        cfg.channel = channel;
        cfg.verify_full = true;
        let mut p = StreamPublisher::new(cfg);
        for v in 1..=2 {
            let s = snap(v, &[5000, 3, 20000, 7000]);
            let rep = p.publish(&s, &targets(&rx)).unwrap();
            assert_eq!(rep.bytes, 32003 * 4 * engines as u64);
            for r in &rx {
                let got = r.take(v, Duration::from_secs(5)).unwrap();
                assert_eq!(got, s);
                r.recycle(got);
            }
        }
    }

    #[test]
    fn shared_memory_grows_with_the_snapshot_and_serves_p2p_parts() {
        let rx: Vec<Receiver> = (0..2).map(|_| Receiver::start("127.0.0.1:0", "tok").unwrap()).collect();
        let mut cfg = TransportConfig::new(TransportKind::P2p, "tok");
        cfg.bucket_bytes = 1 << 20;
        cfg.channel = Channel::Shm;
        let mut p = StreamPublisher::new(cfg);
        // The second version is larger than the files sized for the first: they grow, and each
        // engine maps them again.
        for (v, elems) in [(1, vec![1000, 2000]), (2, vec![1_500_000, 1_200_000]), (3, vec![1000, 2000])] {
            let s = snap(v, &elems);
            p.publish(&s, &targets(&rx)).unwrap();
            for r in &rx {
                let got = r.take(v, Duration::from_secs(10)).unwrap();
                assert_eq!(got, s);
                r.recycle(got);
            }
        }
        // The engines read through a mapping: the publisher's files are sealed memfds.
        assert!(p.shm.iter().all(|f| f.unlink.is_none() && sealed_shmem(&f.file)), "memfd expected");
        let plain = std::env::temp_dir().join(format!("miles-test-plain-{}", std::process::id()));
        std::fs::write(&plain, b"x").unwrap();
        assert!(!sealed_shmem(&std::fs::File::open(&plain).unwrap()));
        let _ = std::fs::remove_file(&plain);
    }

    #[test]
    fn broadcast_tcp_to_three_engines() {
        run(TransportKind::Broadcast, Channel::Tcp, 3);
    }

    #[test]
    fn broadcast_shm_to_two_engines() {
        run(TransportKind::Broadcast, Channel::Shm, 2);
    }

    #[test]
    fn p2p_routes_shards_concurrently() {
        run(TransportKind::P2p, Channel::Tcp, 3);
        let s = snap(1, &[10, 10, 10, 10]);
        // An engine rank that holds only even tensors gets no route for a shard of odd ones.
        let plan = TransferPlan::build(&s, 2, 4, &|t, i| t == 0 || i % 2 == 0);
        assert_eq!(plan.routes, vec![(0, 0), (0, 1), (1, 0), (2, 0), (2, 1), (3, 0)]);
    }

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

    #[test]
    fn unreachable_engine_is_named() {
        let cfg = TransportConfig {
            timeout: Duration::from_millis(500),
            ..TransportConfig::new(TransportKind::Broadcast, "t")
        };
        let t = vec![Target { worker_id: "rollout-9".into(), data_addr: "127.0.0.1:1".into() }];
        let e = StreamPublisher::new(cfg).publish(&snap(1, &[10]), &t).unwrap_err();
        assert_eq!(e.worker_id, "rollout-9");
    }

    /// A forced shared-memory channel with an engine on another host fails at once, naming the
    /// engine and its address, and sends nothing to the engines on this host (no fall-back).
    #[test]
    fn a_forced_shm_channel_refuses_an_engine_on_another_host() {
        let live = Receiver::start("127.0.0.1:0", "t").unwrap();
        let mut cfg = TransportConfig::new(TransportKind::Broadcast, "t");
        cfg.channel = Channel::Shm;
        let mut t = targets(std::slice::from_ref(&live));
        t.push(Target { worker_id: "rollout-1".into(), data_addr: "10.1.2.3:7000".into() });
        let t0 = Instant::now();
        let e = StreamPublisher::new(cfg).publish(&snap(1, &[100]), &t).unwrap_err();
        assert_eq!(e.worker_id, "rollout-1");
        assert!(e.message.contains("channel = shm") && e.message.contains("10.1.2.3:7000"), "{e}");
        assert!(t0.elapsed() < Duration::from_secs(2));
        assert!(live.take(1, Duration::from_millis(100)).is_err());
        assert_eq!(live.bytes_received(), 0);
    }

    /// The recipe's `channel` as the worker protocol carries it; a forced tcp never uses shared
    /// memory, even with every engine on this host (where auto does).
    #[test]
    fn the_recipe_channel_is_parsed_and_forces_the_stream() {
        for c in [Channel::Auto, Channel::Tcp, Channel::Shm, Channel::Nccl] {
            assert_eq!(Channel::parse(c.name()), Some(c));
        }
        assert_eq!(Channel::parse(""), Some(Channel::Auto));
        assert_eq!(Channel::parse("infiniband"), None);
        let rx = Receiver::start("127.0.0.1:0", "t").unwrap();
        for (c, want) in [(Channel::Tcp, "broadcast/tcp"), (Channel::Shm, "broadcast/shm")] {
            let mut cfg = TransportConfig::new(TransportKind::Broadcast, "t");
            cfg.channel = c;
            let rep = StreamPublisher::new(cfg).publish(&snap(1, &[100]), &targets(std::slice::from_ref(&rx))).unwrap();
            assert_eq!(rep.transport, want);
            rx.recycle(rx.take(1, Duration::from_secs(5)).unwrap());
        }
    }

    /// Over shared memory an unreachable engine fails the publish before the live one reads a
    /// header of that version, so the same version published again to the engines left loads
    /// (the controller drops a dead engine and publishes again: tests/distributed.rs).
    #[test]
    fn an_unreachable_engine_leaves_the_version_publishable_to_the_others_over_shm() {
        let live = Receiver::start("127.0.0.1:0", "t").unwrap();
        let mut cfg = TransportConfig {
            timeout: Duration::from_millis(500),
            ..TransportConfig::new(TransportKind::Broadcast, "t")
        };
        cfg.channel = Channel::Shm;
        let mut p = StreamPublisher::new(cfg);
        let s = snap(7, &[1000]);
        let mut t = targets(std::slice::from_ref(&live));
        t.push(Target { worker_id: "rollout-9".into(), data_addr: "127.0.0.1:1".into() });
        assert_eq!(p.publish(&s, &t).unwrap_err().worker_id, "rollout-9");
        t.pop();
        p.publish(&s, &t).unwrap();
        assert_eq!(live.take(7, Duration::from_secs(10)).unwrap(), s);
    }

    /// Sends `head` (and `body`, raw bytes after it) to `rx` as a sender would, then reads the
    /// verdict unless `hang_up` (the sender vanishes).
    fn send_raw(rx: &Receiver, head: &Header, body: &[u8], hang_up: bool) -> Option<String> {
        let mut s = TcpStream::connect(rx.addr()).unwrap();
        wire::write_header(&mut s, head).unwrap();
        s.write_all(body).unwrap();
        if hang_up {
            return None;
        }
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut line = String::new();
        BufReader::new(&s).read_line(&mut line).unwrap();
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
        let mut s = TcpStream::connect(rx.addr()).unwrap();
        s.write_all(&bytes[..head_len + 8 + 4096]).unwrap();
        let t0 = Instant::now();
        let e = rx.take(6, Duration::from_secs(10)).unwrap_err();
        assert!(e.contains("stalled mid-transfer"), "{e}");
        assert!(t0.elapsed() < Duration::from_secs(5));
        drop(s);
    }

    #[test]
    fn engine_vanishing_mid_bucket_is_named_and_bounded() {
        // A fake engine that reads a little of the stream and hangs up.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let eng = std::thread::spawn(move || {
            let (mut c, _) = l.accept().unwrap();
            let mut buf = vec![0u8; 64 << 10];
            let _ = c.read_exact(&mut buf);
        });
        let mut cfg = TransportConfig::new(TransportKind::Broadcast, "tok");
        cfg.channel = Channel::Tcp;
        cfg.timeout = Duration::from_secs(2);
        let t = vec![Target { worker_id: "rollout-3".into(), data_addr: addr }];
        let t0 = Instant::now();
        let e = StreamPublisher::new(cfg).publish(&snap(1, &[4 << 20]), &t).unwrap_err();
        assert_eq!(e.worker_id, "rollout-3");
        assert!(e.message.contains("unreachable or too slow"), "{e}");
        assert!(t0.elapsed() < Duration::from_secs(10));
        eng.join().unwrap();
    }
}
