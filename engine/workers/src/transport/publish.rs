//! The trainer's side of broadcast and p2p: [`StreamPublisher`] sends each part of a snapshot over
//! TCP (one connection per route, all concurrent), through shared memory, or hands it to NCCL.

use super::shm::{shm_dir, ShmFile, ShmRoute, ShmWriter};
use super::tcp::{all_loopback, connect, connect_error, is_loopback, read_verdict};
use super::{
    Channel, Target, TransferError, TransferPlan, TransferReport, TransportConfig, TransportKind, WeightPublisher,
};
use crate::wire::{self, Header};
use miles_runtime::WeightSnapshot;
use std::io::{self, BufWriter, Write};
use std::time::Instant;

/// Broadcast and p2p over sockets (or shared memory).
pub struct StreamPublisher {
    pub cfg: TransportConfig,
    /// Shared-memory files kept (and mapped) between versions, one per part; unmapped and closed
    /// when the publisher goes.
    pub(super) shm: Vec<ShmFile>,
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
                message: connect_error(&target.data_addr, &e),
            }
        };
        let mut socks = Vec::with_capacity(plan.routes.len());
        for &(_, t) in &plan.routes {
            socks.push(connect(&targets[t].data_addr, &cfg.token, cfg.timeout, cfg.tls).map_err(unreachable(t))?);
        }
        let mut routes: Vec<Vec<ShmRoute>> = plan.shards.iter().map(|_| Vec::new()).collect();
        for (&(s, t), mut sock) in plan.routes.iter().zip(socks) {
            let mut h = Header::part(&cfg.token, snap, cfg.bucket_bytes, (s as u32, parts), std::iter::empty());
            h.shm_path = Some(self.shm[s].path.clone());
            h.shm_notices = true;
            let mut head = Vec::new();
            wire::write_header(&mut head, &h).map_err(unreachable(t))?;
            // An engine that vanishes now fails alone (its verdict names it); the others go on.
            let failed = sock.write_all(&head).err();
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
        for r in routes.iter_mut().flatten() {
            let target = &targets[r.target];
            let res = match (read_verdict(&mut r.sock), &r.failed) {
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
                            let mut sock = connect(&target.data_addr, &cfg.token, cfg.timeout, cfg.tls)?;
                            // Framing is buffered; payload chunks (CHUNK bytes, CRC'd in cache right
                            // before) go from the tensors to the socket with no copy in between.
                            let mut w = BufWriter::with_capacity(64 << 10, &mut sock);
                            let h = Header::part(&cfg.token, snap, cfg.bucket_bytes, (s as u32, parts), range.clone());
                            wire::write_header(&mut w, &h)?;
                            let buckets =
                                wire::write_tensors(&mut w, snap, range, cfg.bucket_bytes, full.cloned(), cfg.faults)?
                                    .0;
                            w.flush()?;
                            drop(w);
                            Ok(read_verdict(&mut sock)?.map(|_| buckets))
                        })();
                        (t, res.unwrap_or_else(|e| Err(connect_error(&target.data_addr, &e))))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::tests::{snap, targets};
    use crate::transport::Receiver;
    use std::io::Read;
    use std::net::TcpListener;
    use std::time::Duration;

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
    /// (the controller drops a dead engine and publishes again: tests/e2e/distributed.rs).
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
    #[test]
    fn engine_vanishing_mid_bucket_is_named_and_bounded() {
        // A fake engine that takes the hello, reads a little of the stream and hangs up.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let eng = std::thread::spawn(move || {
            let (c, _) = l.accept().unwrap();
            let mut c = crate::auth::answer_hello(c, "tok").unwrap();
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
