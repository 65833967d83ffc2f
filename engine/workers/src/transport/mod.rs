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
//!
//! Files: this one holds the kinds, the configuration, targets, reports, errors, the
//! [`TransferPlan`] and [`publisher`]; `publish` the trainer's [`StreamPublisher`], `receive` the
//! engine's [`Receiver`], `accept` the receiver's door (the token proved first, TLS where
//! wanted, bounded handshakes and streams), `conn` a stream's connection (plaintext or TLS), `shm`
//! the shared-memory files and their readers, `tcp` the socket helpers.

mod accept;
mod conn;
mod publish;
mod receive;
mod shm;
mod tcp;

#[cfg(test)]
mod security_tests;

pub(crate) use conn::Conn;
pub use publish::StreamPublisher;
pub use receive::Receiver;
pub(crate) use tcp::{connect, connect_error};

use crate::tls::TlsMode;
use crate::wire::{self, Faults};
use miles_runtime::WeightSnapshot;
use std::ops::Range;
use std::path::PathBuf;
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
    /// When a stream is encrypted: to an engine beyond loopback, or always (`crate::tls`).
    pub tls: TlsMode,
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
            tls: TlsMode::Auto,
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
    use miles_runtime::NamedTensor;

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

    pub(super) fn targets(rx: &[Receiver]) -> Vec<Target> {
        rx.iter()
            .enumerate()
            .map(|(i, r)| Target { worker_id: format!("rollout-{i}"), data_addr: r.addr().to_string() })
            .collect()
    }
}
