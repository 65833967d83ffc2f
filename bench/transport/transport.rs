//! Weight-update time and GB/s per transport at 10 MB, 100 MB and 1 GB with 1, 2 and 4 rollout
//! processes, against references of the same size measured in the same run: single-thread memcpy
//! (for shared memory), a plain loopback TCP copy between two threads (for broadcast/p2p over
//! TCP) and a plain file write + fsync in the same directory as the deltas (for disk-delta).
//!
//!   cargo bench -p miles-workers --bench transport [-- --quick] [--sizes 1GB,100MB] [--engines 1,2]
//!      [--only broadcast/shm]
//!
//! Receivers are separate processes (this binary re-run with MILES_BENCH_RECEIVER set), each
//! with a real `Receiver` (broadcast, p2p) or `DeltaReceiver` (disk-delta). One update = publish
//! plus every engine holding the verified new version (activated), timed end to end. Every update
//! changes every weight (as an RL step does), so disk-delta's delta is as large as the weights.

use miles_runtime::{NamedTensor, WeightSnapshot};
use miles_workers::delta::DeltaReceiver;
use miles_workers::transport::{self, Channel, Receiver, Target, TransportConfig, TransportKind};
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

const TOKEN: &str = "bench-token";

fn receiver_main(kind: &str) {
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    let rx = Receiver::start("127.0.0.1:0", TOKEN).expect("listen");
    let local = std::env::temp_dir().join(format!("miles-bench-local-{}", std::process::id()));
    let mut delta = DeltaReceiver::new(&local, TOKEN).expect("local dir");
    writeln!(out, "{}", rx.addr()).unwrap();
    out.flush().unwrap();
    for line in stdin.lock().lines() {
        let line = line.unwrap();
        let parts: Vec<&str> = line.split_whitespace().collect();
        let res = match parts.as_slice() {
            ["take", v] => rx.take(v.parse().unwrap(), Duration::from_secs(120)).map(|s| rx.recycle(s)),
            ["delta", dir, v] => delta.activate(&PathBuf::from(dir), v.parse().unwrap(), false).map(|_| ()),
            ["quit"] => break,
            _ => Err(format!("bad command {line}")),
        };
        match res {
            Ok(()) => writeln!(out, "ok").unwrap(),
            Err(e) => writeln!(out, "err {e}").unwrap(),
        }
        out.flush().unwrap();
    }
    let _ = std::fs::remove_dir_all(&local);
    let _ = kind;
}

struct Rx {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    addr: String,
}

impl Rx {
    fn spawn() -> Rx {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .env("MILES_BENCH_RECEIVER", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut addr = String::new();
        stdout.read_line(&mut addr).unwrap();
        Rx { child, stdin, stdout, addr: addr.trim().to_string() }
    }
    fn send(&mut self, cmd: &str) {
        writeln!(self.stdin, "{cmd}").unwrap();
        self.stdin.flush().unwrap();
    }
    fn wait_ok(&mut self) {
        let mut l = String::new();
        self.stdout.read_line(&mut l).unwrap();
        assert_eq!(l.trim(), "ok", "receiver: {l}");
    }
}

impl Drop for Rx {
    fn drop(&mut self) {
        self.send("quit");
        let _ = self.child.wait();
    }
}

fn snapshot(bytes: usize, version: u64) -> WeightSnapshot {
    let n = bytes / 4 / 8;
    WeightSnapshot {
        version,
        tensors: (0..8)
            .map(|i| NamedTensor {
                name: format!("model.layers.{i}.mlp.weight"),
                shape: vec![n],
                data: (0..n).map(|k| ((k * 7 + i) % 1013) as f32 * 1e-3).collect(),
            })
            .collect(),
    }
}

/// Changes every weight a little, as an optimizer step does.
fn step(s: &mut WeightSnapshot) {
    s.version += 1;
    for t in &mut s.tensors {
        for x in &mut t.data {
            *x += 1e-4;
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn memcpy_gbps(bytes: usize) -> f64 {
    let src = vec![1u8; bytes];
    let mut dst = vec![0u8; bytes];
    dst.copy_from_slice(&src); // fault the pages in first
    let t: Vec<f64> = (0..5)
        .map(|_| {
            let t0 = Instant::now();
            dst.copy_from_slice(std::hint::black_box(&src));
            std::hint::black_box(&dst);
            t0.elapsed().as_secs_f64()
        })
        .collect();
    bytes as f64 / median(t) / 1e9
}

/// A plain socket copy of `bytes` between two threads over loopback: one `write_all` of a
/// preallocated buffer, one `read_exact` into another; median of 5.
fn loopback_tcp_gbps(bytes: usize) -> f64 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let reader = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut dst = vec![0u8; bytes];
        dst.fill(1); // fault the pages in first
        let mut ack = [0u8; 1];
        for _ in 0..6 {
            std::io::Read::read_exact(&mut s, &mut dst).unwrap();
            s.write_all(&ack).unwrap();
            ack[0] = ack[0].wrapping_add(dst[bytes / 2]);
        }
    });
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_nodelay(true).unwrap();
    let src = vec![7u8; bytes];
    let mut t = Vec::new();
    for k in 0..6 {
        let t0 = Instant::now();
        s.write_all(&src).unwrap();
        let mut ack = [0u8; 1];
        std::io::Read::read_exact(&mut s, &mut ack).unwrap();
        if k > 0 {
            t.push(t0.elapsed().as_secs_f64());
        }
    }
    reader.join().unwrap();
    bytes as f64 / median(t) / 1e9
}

/// A plain new file of `bytes` written from a preallocated buffer and fsynced, in `dir`; median
/// of 3 after one warm-up.
fn disk_gbps(bytes: usize, dir: &std::path::Path) -> f64 {
    std::fs::create_dir_all(dir).unwrap();
    let src = vec![3u8; bytes];
    let mut t = Vec::new();
    for k in 0..4 {
        let p = dir.join(format!("ref-{k}"));
        let t0 = Instant::now();
        let mut f = std::fs::File::create(&p).unwrap();
        f.write_all(&src).unwrap();
        f.sync_all().unwrap();
        drop(f);
        if k > 0 {
            t.push(t0.elapsed().as_secs_f64());
        }
        std::fs::remove_file(&p).unwrap();
    }
    bytes as f64 / median(t) / 1e9
}

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned()
}

fn main() {
    if std::env::var("MILES_BENCH_RECEIVER").is_ok() {
        receiver_main("rx");
        return;
    }
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    // `--only broadcast/shm` measures one transport.
    let only = arg(&args, "--only");
    let all_sizes: &[(usize, &str, usize)] = if quick {
        &[(10 << 20, "10 MB", 3)]
    } else {
        &[(10 << 20, "10 MB", 7), (100 << 20, "100 MB", 5), (1 << 30, "1 GB", 5)]
    };
    let size_filter = arg(&args, "--sizes");
    let sizes: Vec<(usize, &str, usize)> = all_sizes
        .iter()
        .copied()
        .filter(|(_, l, _)| size_filter.as_ref().is_none_or(|f| f.split(',').any(|x| x == l.replace(' ', ""))))
        .collect();
    let engines: Vec<usize> = match arg(&args, "--engines") {
        Some(e) => e.split(',').map(|x| x.parse().expect("--engines 1,2,4")).collect(),
        None if quick => vec![1, 2],
        None => vec![1, 2, 4],
    };
    let kinds: &[(&str, TransportKind, Channel)] = &[
        ("broadcast/tcp", TransportKind::Broadcast, Channel::Tcp),
        ("broadcast/shm", TransportKind::Broadcast, Channel::Shm),
        ("p2p/tcp", TransportKind::P2p, Channel::Tcp),
        ("disk_delta", TransportKind::DiskDelta, Channel::Tcp),
    ];
    let ref_dir = std::env::temp_dir().join(format!("miles-bench-ref-{}", std::process::id()));
    println!("load before: {}", std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim());
    println!(
        "| size | engines | transport | update (median) | GB/s delivered | GB/s per engine | reference | reference GB/s | ratio (per engine / reference) |"
    );
    println!("|---:|---:|---|---:|---:|---:|---|---:|---:|");
    for &(bytes, label, reps) in &sizes {
        // References of the same size, in this run.
        let mc = memcpy_gbps(bytes);
        let tcp = loopback_tcp_gbps(bytes);
        let disk = disk_gbps(bytes, &ref_dir);
        let _ = std::fs::remove_dir_all(&ref_dir);
        for &n in &engines {
            let mut rxs: Vec<Rx> = (0..n).map(|_| Rx::spawn()).collect();
            let targets: Vec<Target> = rxs
                .iter()
                .enumerate()
                .map(|(i, r)| Target { worker_id: format!("rollout-{i}"), data_addr: r.addr.clone() })
                .collect();
            for &(name, kind, channel) in kinds {
                if only.as_ref().is_some_and(|o| o != name) {
                    continue;
                }
                let dir = std::env::temp_dir().join(format!("miles-bench-delta-{}", std::process::id()));
                let _ = std::fs::remove_dir_all(&dir);
                let mut cfg = TransportConfig::new(kind, TOKEN);
                cfg.bucket_bytes = 64 << 20;
                cfg.channel = channel;
                let mut p = transport::publisher(cfg, Some(dir.clone()));
                let mut snap = snapshot(bytes, 0);
                let mut times = Vec::new();
                // One warm-up update (buffers, the first full file for disk-delta), then `reps`.
                for k in 0..=reps {
                    step(&mut snap);
                    let t0 = Instant::now();
                    p.publish(&snap, &targets).unwrap_or_else(|e| panic!("{name}: {e}"));
                    for r in rxs.iter_mut() {
                        if kind == TransportKind::DiskDelta {
                            r.send(&format!("delta {} {}", dir.display(), snap.version));
                        } else {
                            r.send(&format!("take {}", snap.version));
                        }
                    }
                    for r in rxs.iter_mut() {
                        r.wait_ok();
                    }
                    if k > 0 {
                        times.push(t0.elapsed().as_secs_f64());
                    }
                }
                let t = median(times);
                let delivered = (bytes * n) as f64;
                let (rname, r) = match (kind, channel) {
                    (TransportKind::DiskDelta, _) => ("disk write+fsync", disk),
                    (_, Channel::Shm) => ("memcpy", mc),
                    _ => ("loopback TCP", tcp),
                };
                let per = bytes as f64 / t / 1e9;
                println!(
                    "| {label} | {n} | {name} | {:.1} ms | {:.2} | {:.2} | {rname} | {r:.2} | {:.0}% |",
                    t * 1e3,
                    delivered / t / 1e9,
                    per,
                    100.0 * per / r
                );
                let _ = std::fs::remove_dir_all(&dir);
            }
            drop(rxs);
        }
    }
    println!("load after: {}", std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim());
}
