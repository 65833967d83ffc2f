//! The NCCL channel of broadcast (and p2p, which sends every unsharded engine the whole snapshot
//! anyway): the payload goes GPU to GPU through one NCCL communicator, the trainer rank 0 and the
//! engines ranks 1..=n; the control connection of each engine (a weight stream's connection, TLS
//! where wanted: `transport/conn.rs`) carries the rest.
//!
//! ```text
//! trainer                                     engine k (rank k)
//!   header { nccl: id, rank k, sizes } ──────▶  library and GPU checked
//!                                      ◀──────  "ready <GPU UUID>" (or "err <why>": the verdict)
//!   every GPU distinct? "go"           ──────▶
//!   join (rank 0)                    ◀─NCCL─▶   join (rank k)        bounded by the timeout
//!   per chunk: host → pinned → GPU, ncclBroadcast → GPU → pinned → the stream reader
//!                                      ◀──────  verdict (bucket and tensor CRCs, as over TCP)
//! ```
//!
//! The stream through NCCL is the usual body (buckets with CRC-32s, then the trailer), cut into
//! chunks of `bucket_bytes`: an engine verifies and assembles it exactly as a TCP stream. Each rank
//! uses its process's GPU [`miles_cuda::nccl::device_ordinal`] (`MILES_CUDA_DEVICE`, else the
//! first visible one). A communicator lives for one publish (its setup is paid per version).

use crate::transport::{Conn, Receiver, Target, TransferError, TransferReport, TransportConfig};
use crate::wire::{self, Header, NcclHeader, StreamError};
use miles_cuda::nccl::{self as cn, Comm, UniqueId};
use miles_runtime::WeightSnapshot;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::time::{Duration, Instant};

/// Why NCCL cannot run in this process, as the recipe's author should read it.
fn unavailable(side: &str, reason: &str) -> String {
    format!(
        "the `weights` stage's channel = nccl needs the CUDA driver, a GPU and NCCL on the {side}: {reason}; \
         use channel = tcp or shm (or auto)"
    )
}

/// The trainer's side: delivers `snap` to every target through NCCL and collects the verdicts.
/// `stream` is the publisher's reused buffer for the serialized body.
pub(crate) fn publish(
    cfg: &TransportConfig,
    snap: &WeightSnapshot,
    targets: &[Target],
    full: Option<String>,
    stream: &mut Vec<u8>,
    started: Instant,
) -> Result<TransferReport, TransferError> {
    let trainer_err = |message: String| TransferError { worker_id: "trainer".into(), message };
    cn::available().map_err(|e| trainer_err(unavailable("trainer", &e.reason)))?;
    let ordinal = cfg.gpu.map_or_else(cn::device_ordinal, Ok).map_err(|e| trainer_err(e.reason))?;
    let my_gpu = cn::gpu_uuid(ordinal).map_err(|e| trainer_err(unavailable("trainer", &e.reason)))?;
    let id = UniqueId::new().map_err(|e| trainer_err(e.reason))?;
    let chunk = cfg.bucket_bytes.max(1 << 16) as usize;

    stream.clear();
    let n = snap.tensors.len();
    let (buckets, _) = wire::write_tensors(stream, snap, 0..n, cfg.bucket_bytes, full, cfg.faults)
        .map_err(|e| trainer_err(format!("cannot serialize the weights: {e}")))?;

    // Every engine connected and told its rank before any joins (as over shared memory: one that
    // cannot be reached fails the publish before the others have done anything of this version).
    // Each connection is read through its buffer and written through `get_mut` (nothing is
    // written while a read is buffered ahead of it: the engine speaks only when asked).
    let mut readers = Vec::with_capacity(targets.len());
    for t in targets {
        let s = crate::transport::connect(&t.data_addr, &cfg.token, cfg.timeout, cfg.tls).map_err(|e| {
            TransferError { worker_id: t.worker_id.clone(), message: crate::transport::connect_error(&t.data_addr, &e) }
        })?;
        readers.push(BufReader::new(s));
    }
    let ranks = targets.len() as u32 + 1;
    for (k, (t, s)) in targets.iter().zip(readers.iter_mut()).enumerate() {
        let mut h = Header::whole(&cfg.token, snap, cfg.bucket_bytes);
        h.nccl = Some(NcclHeader {
            id: id.to_hex(),
            rank: k as u32 + 1,
            ranks,
            stream_bytes: stream.len() as u64,
            chunk_bytes: chunk as u64,
            trainer_gpu: my_gpu.clone(),
        });
        let mut head = Vec::new();
        wire::write_header(&mut head, &h).and_then(|_| s.get_mut().write_all(&head)).map_err(|e| TransferError {
            worker_id: t.worker_id.clone(),
            message: format!("{} unreachable or too slow: {e}", t.data_addr),
        })?;
    }
    // Each engine answers "ready <its GPU>" once its own library and GPU checks pass.
    let mut gpus: Vec<(String, String)> = vec![("the trainer".into(), my_gpu)];
    for (t, r) in targets.iter().zip(readers.iter_mut()) {
        let line = read_line(r).map_err(|e| TransferError {
            worker_id: t.worker_id.clone(),
            message: format!(
                "{} did not answer the NCCL handshake within {:.0} s: {e}",
                t.data_addr,
                cfg.timeout.as_secs_f64()
            ),
        })?;
        let Some(gpu) = line.strip_prefix("ready ") else {
            let why = line.strip_prefix("err ").unwrap_or(&line).to_string();
            return Err(TransferError { worker_id: t.worker_id.clone(), message: why });
        };
        if let Some((other, _)) = gpus.iter().find(|(_, g)| g == gpu) {
            return Err(TransferError {
                worker_id: t.worker_id.clone(),
                message: same_gpu(&format!("{} and {other}", t.worker_id), gpu),
            });
        }
        gpus.push((t.worker_id.clone(), gpu.to_string()));
    }
    for (t, s) in targets.iter().zip(readers.iter_mut()) {
        s.get_mut().write_all(b"go\n").map_err(|e| TransferError {
            worker_id: t.worker_id.clone(),
            message: format!("{} unreachable or too slow: {e}", t.data_addr),
        })?;
    }
    let secs = cfg.timeout.as_secs_f64();
    let mut comm = match Comm::join(&id, 0, ranks, ordinal, chunk, cfg.timeout) {
        Ok(c) => c,
        Err(e) => {
            return Err(blame(targets, &mut readers, &e, &format!("join the NCCL communicator within {secs:.0} s")))
        }
    };
    for c in stream.chunks(chunk) {
        if let Err(e) = comm.send(c, cfg.timeout) {
            drop(comm);
            return Err(blame(targets, &mut readers, &e, &format!("receive an NCCL broadcast within {secs:.0} s")));
        }
    }
    drop(comm);
    for (t, r) in targets.iter().zip(readers.iter_mut()) {
        match read_line(r) {
            Ok(l) if l == "ok" => {}
            Ok(l) => {
                let why = l
                    .strip_prefix("err ")
                    .map(str::to_string)
                    .unwrap_or_else(|| format!("no verdict from the engine (got {l:?})"));
                return Err(TransferError { worker_id: t.worker_id.clone(), message: why });
            }
            Err(e) => {
                return Err(TransferError {
                    worker_id: t.worker_id.clone(),
                    message: format!("{} gave no verdict within {secs:.0} s: {e}", t.data_addr),
                });
            }
        }
    }
    let report = TransferReport {
        transport: format!("{}/nccl", cfg.kind.name()),
        version: snap.version,
        targets: targets.len() as u32,
        buckets,
        bytes: (snap.bytes() * targets.len()) as u64,
        ..Default::default()
    };
    Ok(report.finish(started))
}

/// A failed join or broadcast: the engine whose verdict says why (briefly waited for), else, on a
/// timeout, every engine of the communicator (NCCL does not say which rank is missing).
fn blame(targets: &[Target], readers: &mut [BufReader<Conn>], e: &cn::CommError, what: &str) -> TransferError {
    for (t, r) in targets.iter().zip(readers.iter_mut()) {
        let _ = r.get_ref().tcp().set_read_timeout(Some(Duration::from_millis(500)));
        if let Ok(l) = read_line(r) {
            if let Some(why) = l.strip_prefix("err ") {
                return TransferError { worker_id: t.worker_id.clone(), message: why.to_string() };
            }
        }
    }
    let names: Vec<&str> = targets.iter().map(|t| t.worker_id.as_str()).collect();
    if e.timed_out {
        TransferError {
            worker_id: names.join(", "),
            message: format!("{} did not {what} (trainer: {e})", names.join(", ")),
        }
    } else {
        TransferError { worker_id: "trainer".into(), message: format!("NCCL failed: {e}") }
    }
}

/// Two ranks found on one GPU (`who`: both, named), which NCCL refuses.
fn same_gpu(who: &str, gpu: &str) -> String {
    format!(
        "NCCL cannot put two ranks on one GPU: {who} are both on {gpu} (a one-GPU machine cannot use channel = nccl); \
         give each process its own GPU (CUDA_VISIBLE_DEVICES or MILES_CUDA_DEVICE), or use channel = shm or tcp"
    )
}

fn read_line(r: &mut impl BufRead) -> io::Result<String> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the connection closed"));
    }
    Ok(line.trim_end().to_string())
}

/// An engine's side, after the header `h` arrived on `sock`: checks, "ready", waits for "go",
/// joins, reads the body from the broadcasts and verifies it (the verdict is the caller's).
pub(crate) fn receive(
    rx: &Receiver,
    h: &Header,
    n: &NcclHeader,
    sock: &mut BufReader<&mut Conn>,
) -> Result<(), String> {
    cn::available().map_err(|e| unavailable("rollout engine", &e.reason))?;
    let ordinal = rx.gpu().map_or_else(cn::device_ordinal, Ok).map_err(|e| e.reason)?;
    let gpu = cn::gpu_uuid(ordinal).map_err(|e| unavailable("rollout engine", &e.reason))?;
    if gpu == n.trainer_gpu {
        return Err(same_gpu("this engine and the trainer", &gpu));
    }
    let id = UniqueId::from_hex(&n.id).ok_or("bad stream: the NCCL id is not 256 hex characters")?;
    sock.get_mut().write_all(format!("ready {gpu}\n").as_bytes()).map_err(|e| format!("the trainer vanished: {e}"))?;
    match read_line(sock) {
        Ok(l) if l == "go" => {}
        Ok(l) => return Err(format!("the trainer cancelled the NCCL transfer (got {l:?})")),
        Err(e) => return Err(format!("the trainer cancelled the NCCL transfer ({e})")),
    }
    let timeout = rx.timeout();
    let secs = timeout.as_secs_f64();
    let chunk = n.chunk_bytes.max(1) as usize;
    let mut comm = Comm::join(&id, n.rank, n.ranks, ordinal, chunk, timeout).map_err(|e| {
        format!("version {}: did not join the NCCL communicator within {secs:.0} s: {e}; not loaded", h.version)
    })?;
    let mut r =
        NcclReader { comm: &mut comm, buf: Vec::new(), pos: 0, left: n.stream_bytes, chunk, timeout, failed: None };
    let res = rx.receive_body(&mut r, h);
    // A corrupted stream still takes every broadcast of this version: the other ranks wait on it.
    let drained = r.drain();
    match (res, drained, r.failed.take()) {
        (_, _, Some(e)) => Err(format!("version {}: an NCCL broadcast failed: {e}; not loaded", h.version)),
        (Err(StreamError::Corrupt(m)), _, None) => Err(m),
        (Err(StreamError::Io(e)), _, None) => {
            Err(format!("version {}: the NCCL stream is unreadable: {e}; not loaded", h.version))
        }
        (Ok(()), Err(e), None) => Err(format!("version {}: an NCCL broadcast failed: {e}; not loaded", h.version)),
        (Ok(()), Ok(()), None) => Ok(()),
    }
}

/// The body as a byte stream received chunk by chunk from rank 0: a chunk is received only when
/// the reader needs a byte of it, and [`NcclReader::drain`] receives whatever was left.
struct NcclReader<'a> {
    comm: &'a mut Comm,
    buf: Vec<u8>,
    pos: usize,
    /// Stream bytes not yet received.
    left: u64,
    chunk: usize,
    timeout: Duration,
    /// A failed broadcast: the communicator is aborted and nothing more is received.
    failed: Option<cn::CommError>,
}

impl NcclReader<'_> {
    fn next(&mut self) -> Result<(), cn::CommError> {
        let n = (self.left.min(self.chunk as u64)) as usize;
        self.buf.resize(n, 0);
        self.pos = 0;
        if let Err(e) = self.comm.recv(&mut self.buf, self.timeout) {
            self.failed = Some(e.clone());
            return Err(e);
        }
        self.left -= n as u64;
        Ok(())
    }

    fn drain(&mut self) -> Result<(), cn::CommError> {
        while self.left > 0 && self.failed.is_none() {
            self.next()?;
        }
        Ok(())
    }
}

impl Read for NcclReader<'_> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if out.is_empty() {
            return Ok(0);
        }
        if self.pos == self.buf.len() {
            if self.left == 0 || self.failed.is_some() {
                return Ok(0);
            }
            self.next().map_err(|e| io::Error::other(e.reason))?;
        }
        let k = out.len().min(self.buf.len() - self.pos);
        out[..k].copy_from_slice(&self.buf[self.pos..self.pos + k]);
        self.pos += k;
        Ok(k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::{Channel, StreamPublisher, TransportKind, WeightPublisher};

    /// Runs on every machine. Where the CUDA driver, a GPU or NCCL is missing (as on CI), the
    /// first publish fails naming the missing library and the stage's field, with no panic and
    /// without touching the engine. On one GPU both ranks would share it: refused, named. With two
    /// GPUs it moves two versions to an engine thread on GPU 1 (the trainer on GPU 0, both ranks
    /// in this process) and checks them bit for bit, then a corrupted bucket is refused.
    #[test]
    fn nccl_channel_names_the_missing_library_or_broadcasts_between_two_gpus() {
        let rx = Receiver::start_on_gpu("127.0.0.1:0", "tok", 1).unwrap();
        let mut cfg = TransportConfig::new(TransportKind::Broadcast, "tok");
        cfg.bucket_bytes = 1 << 16;
        cfg.channel = Channel::Nccl;
        cfg.timeout = Duration::from_secs(30);
        cfg.verify_full = true;
        cfg.gpu = Some(0);
        let t = vec![Target { worker_id: "rollout-0".into(), data_addr: rx.addr().to_string() }];
        let snap = crate::transport::tests::snap(1, &[40000, 3, 70000]);
        let _ = &snap;
        let gpus = miles_cuda::devices().map(|g| g.len()).unwrap_or(0);
        match cn::available() {
            Err(why) => {
                let e = StreamPublisher::new(cfg).publish(&snap, &t).unwrap_err();
                assert_eq!(e.worker_id, "trainer");
                assert!(e.message.contains("channel = nccl"), "{e}");
                assert!(e.message.contains("libnccl.so.2") || e.message.contains("libcuda.so"), "{e}");
                assert!(rx.take(1, Duration::from_millis(100)).is_err());
                eprintln!("skipped the NCCL transfer: {why}");
            }
            Ok(_) if gpus < 2 => {
                // One GPU: the engine asks for GPU 1, which is not there; on the trainer's GPU
                // the handshake refuses (the next test's case).
                let e = StreamPublisher::new(cfg).publish(&snap, &t).unwrap_err();
                assert_eq!(e.worker_id, "rollout-0");
                assert!(e.message.contains("GPU 1 does not exist"), "{e}");
                eprintln!("skipped the NCCL transfer: {gpus} GPU visible, NCCL needs one per rank");
            }
            Ok(_) => {
                let mut p = StreamPublisher::new(cfg.clone());
                for v in 1..=2 {
                    let s = crate::transport::tests::snap(v, &[40000, 3, 70000]);
                    let rep = p.publish(&s, &t).unwrap();
                    assert_eq!(rep.transport, "broadcast/nccl");
                    assert_eq!(rep.bytes, s.bytes() as u64);
                    assert_eq!(rx.take(v, Duration::from_secs(10)).unwrap(), s);
                }
                cfg.faults.corrupt_bucket = Some(1);
                let e = StreamPublisher::new(cfg).publish(&crate::transport::tests::snap(3, &[40000]), &t).unwrap_err();
                assert_eq!(e.worker_id, "rollout-0");
                assert!(e.message.contains("bucket 1 failed its CRC-32"), "{e}");
            }
        }
    }

    /// Two ranks on one GPU are refused by the handshake, naming both, before NCCL is joined.
    #[test]
    fn nccl_refuses_two_ranks_on_one_gpu() {
        if let Err(why) = cn::available() {
            eprintln!("skipped: {why}");
            return;
        }
        let rx = Receiver::start_on_gpu("127.0.0.1:0", "tok", 0).unwrap();
        let mut cfg = TransportConfig::new(TransportKind::Broadcast, "tok");
        cfg.channel = Channel::Nccl;
        cfg.gpu = Some(0);
        cfg.timeout = Duration::from_secs(20);
        let t = vec![Target { worker_id: "rollout-0".into(), data_addr: rx.addr().to_string() }];
        let t0 = Instant::now();
        let e = StreamPublisher::new(cfg).publish(&crate::transport::tests::snap(1, &[1000]), &t).unwrap_err();
        assert_eq!(e.worker_id, "rollout-0");
        assert!(e.message.contains("two ranks on one GPU"), "{e}");
        assert!(t0.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn a_reader_receives_nothing_past_the_stream() {
        // The chunk arithmetic every rank repeats: the same count and sizes on each side.
        let chunks = |total: u64, chunk: u64| {
            (0..total.div_ceil(chunk)).map(|k| chunk.min(total - k * chunk)).collect::<Vec<_>>()
        };
        assert_eq!(chunks(10, 4), vec![4, 4, 2]);
        assert_eq!(chunks(8, 4), vec![4, 4]);
        assert!(chunks(0, 4).is_empty());
    }
}
