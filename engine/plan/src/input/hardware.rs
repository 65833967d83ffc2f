//! The hardware a plan places stages on: clusters, node pools, GPUs (`schema gpu`) and hosts.

use super::*;

/// The machines a recipe runs on: node pools of one GPU kind each (several pools make a mixed
/// cluster; GPU ids are numbered pool by pool), or a CPU-only host when `pools` is empty.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Cluster {
    pub name: String,
    #[serde(default)]
    pub pools: Vec<NodePool>,
    /// The CPU-only machine of a `local` cluster (and the host side of GPU nodes, when known).
    #[serde(default)]
    pub host: Option<HostSpec>,
    #[serde(default, serialize_with = "opt_span", deserialize_with = "de_opt_span")]
    pub span: Option<Span>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodePool {
    pub gpu: GpuSpec,
    pub nodes: Spanned<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Arch {
    Ampere,
    Hopper,
    Blackwell,
    Cdna3,
    Cdna4,
    Cpu,
}

/// `schema gpu` in stdlib/std/hardware.miles.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GpuSpec {
    pub name: String,
    pub arch: Arch,
    /// HBM capacity, bytes.
    pub hbm: u64,
    /// HBM bandwidth, bytes/s.
    pub hbm_bandwidth: f64,
    /// Dense BF16 tensor throughput, FLOP/s.
    pub bf16: f64,
    /// Dense FP8 tensor throughput, FLOP/s; `None` where the GPU has no FP8 arithmetic.
    #[serde(default)]
    pub fp8: Option<f64>,
    /// Dense FP4 tensor throughput, FLOP/s.
    #[serde(default)]
    pub fp4: Option<f64>,
    /// GPUs in one NVLink / xGMI domain.
    pub scaleup_domain: u64,
    /// NVLink / xGMI bandwidth per GPU, one direction, bytes/s.
    pub scaleup_bandwidth: f64,
    /// Scale-out (InfiniBand / RoCE) bandwidth per GPU, one direction, bytes/s.
    pub network_bandwidth: f64,
    pub gpus_per_node: u64,
    /// GPU <-> host memory bandwidth per GPU (PCIe or NVLink-C2C), one direction, bytes/s.
    pub host_link_bandwidth: f64,
    /// Host (CPU) memory per node, bytes.
    #[serde(default)]
    pub host_memory: Option<u64>,
    /// Local NVMe read bandwidth per node, bytes/s.
    #[serde(default)]
    pub disk_bandwidth: Option<f64>,
}

/// `schema host` in stdlib/std/hardware.miles: a CPU-only machine.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HostSpec {
    pub name: String,
    pub cpus: u64,
    /// Bytes.
    pub memory: u64,
    /// Bytes/s.
    pub memory_bandwidth: f64,
    /// FP32 throughput of all cores, FLOP/s.
    #[serde(default)]
    pub fp32: Option<f64>,
}
