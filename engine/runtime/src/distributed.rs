//! How a run is spread over processes: which launcher starts the workers, how many rollout
//! engines, which weight transport, and the failure policy. Absent (`RunSpec::distributed` =
//! None) the run is in-process. Mapped from the recipe's `launcher` setting and `weights` stage.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DistributedSpec {
    pub launcher: LauncherSpec,
    /// Rollout engine processes.
    #[serde(default = "one")]
    pub rollout_workers: usize,
    /// broadcast | p2p | disk_delta.
    #[serde(default = "broadcast")]
    pub transport: String,
    /// broadcast and p2p: auto | tcp | shm | nccl (auto: shared memory when every engine is on
    /// this host, else TCP).
    #[serde(default = "auto")]
    pub channel: String,
    #[serde(default = "bucket")]
    pub bucket_bytes: u64,
    /// Also compare a SHA-256 of the whole weights after each transfer.
    #[serde(default)]
    pub verify_full: bool,
    #[serde(default)]
    pub on_worker_failure: WorkerFailure,
    /// Deadline of one generate/train/checkpoint call.
    #[serde(default = "call_timeout")]
    pub call_timeout_s: f64,
    /// How long workers may take to start and register (a Slurm queue counts).
    #[serde(default = "start_timeout")]
    pub start_timeout_s: f64,
    /// A worker silent for this long is treated as dead.
    #[serde(default = "heartbeat_timeout")]
    pub heartbeat_timeout_s: f64,
    /// Address the controller and workers listen on; loopback unless configured otherwise.
    #[serde(default = "loopback")]
    pub bind_host: String,
    /// Intra-op threads of each worker; 0 = the run's --threads (or the backend default).
    #[serde(default)]
    pub threads: usize,
    /// Rollout through SGLang-compatible servers at these URLs (`engine = sglang { url = ... }`)
    /// instead of engine workers; the trainer runs in-process.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub engine_urls: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum LauncherSpec {
    /// The trainer in the `miles run` process (with `engine_urls`: rollout on HTTP servers).
    InProcess,
    /// Child processes on this machine, each pinned to `cpus_per_worker` CPUs (0 = not pinned).
    LocalProcesses {
        #[serde(default)]
        cpus_per_worker: usize,
    },
    /// One sbatch job, one srun step per worker.
    Slurm {
        #[serde(default)]
        partition: Option<String>,
        #[serde(default)]
        time_limit: Option<String>,
        #[serde(default)]
        gpus_per_engine: u32,
        #[serde(default)]
        gpus_per_trainer: u32,
        #[serde(default)]
        cpus_per_worker: usize,
    },
    /// One Ray job per worker through the Jobs REST API at `address` (http://head:8265).
    Ray {
        address: String,
        #[serde(default)]
        gpus_per_engine: u32,
        #[serde(default)]
        gpus_per_trainer: u32,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkerFailure {
    /// A dead or silent worker stops the run (the last checkpoint is kept; `--resume` goes on).
    #[default]
    Stop,
    /// A lost rollout engine is dropped and its groups regenerated on the others; a lost trainer
    /// still stops the run.
    Continue,
}

fn one() -> usize {
    1
}
fn broadcast() -> String {
    "broadcast".into()
}
fn auto() -> String {
    "auto".into()
}
fn bucket() -> u64 {
    512 << 20
}
fn call_timeout() -> f64 {
    600.0
}
fn start_timeout() -> f64 {
    120.0
}
fn heartbeat_timeout() -> f64 {
    15.0
}
fn loopback() -> String {
    "127.0.0.1".into()
}
