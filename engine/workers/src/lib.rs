//! Distributed stages of miles: each stage instance (a rollout engine, a trainer) can run as its
//! own `miles worker` process, on this machine or a cluster, driven by the controller over gRPC.
//!
//! - [`pb`]: the worker protocol (proto/worker.proto).
//! - [`worker`]: the server a worker process runs, hosting any `RolloutEngine` or `Trainer`.
//! - [`remote`]: the controller's clients, which implement the same traits, so the executor drives
//!   remote stages exactly as local ones.
//! - [`transport`], [`delta`], [`wire`]: weight transports (broadcast, p2p, disk-delta) and their
//!   verified byte format; [`nccl`]: broadcast and p2p GPU to GPU (the `nccl` channel).
//! - [`launcher`]: how worker processes are started (local processes, Slurm, Ray).
//! - [`auth`], [`tls`]: the run's token and, beyond loopback, TLS under the run's own certificate.
//! - [`http`]: the SGLang-compatible HTTP rollout API (`miles serve`) and its client.

pub mod auth;
pub mod delta;
pub mod nccl;
pub mod tls;
pub mod transport;
pub mod wire;

pub mod pb {
    #![allow(clippy::all, clippy::pedantic)]
    tonic::include_proto!("miles.worker.v1");
}

pub mod backend;
pub mod convert;
pub mod http;
pub mod launcher;
pub mod remote;
pub mod worker;

/// A worker died, stopped answering within its deadline, or could not be reached.
pub const E_WORKER: &str = "E0513";
/// A weight transfer failed (a checksum did not match, a version did not arrive).
pub const E_TRANSFER: &str = "E0514";
/// A call or stream without the run's token was refused.
pub const E_AUTH: &str = "E0515";
/// A launcher could not start the run's workers (sbatch, Ray, a process).
pub const E_LAUNCH: &str = "E0516";
