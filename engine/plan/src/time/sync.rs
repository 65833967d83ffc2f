//! Weight sync, built from what each transport does (docs/plan.md, "Weight sync"): the trainer's
//! TP/EP all-gather, NCCL's ring or the RDMA writes, the engines' serialised loads. Bytes move at
//! the hardware catalog's bandwidths; five constants of the mechanism are fitted, once, to the
//! eight published layouts of the Miles/SGLang P2P measurements (`tests::published`), none per row.

use crate::evidence::{sources, Evidence};
use crate::model::div;
use crate::output::Estimate;
use crate::units::{bytes_fixed, gb_fixed, gbs};

/// Share of a link's rate that weight-sync transfers reach (fitted with the constants below).
pub const SYNC_LINK_EFFICIENCY: f64 = 0.9;
/// Broadcast: the trainer's work per bucket besides the all-gather's bytes, s: the TP/EP gather
/// calls, the conversion to the engine's names and layout, the update call to every engine.
/// It stalls the engines only when no other pipeline stage has a bucket ready (PP = 1).
pub const BUCKET_PREP_S: f64 = 0.019;
/// Broadcast: bytes by which each ring hop delays a bucket (the pipeline fill of NCCL's ring:
/// one step of ~512 KiB per channel (NCCL_BUFFSIZE / NCCL_STEPS) over ~10 channels). What makes
/// a broadcast slower the more rollout GPUs it reaches.
pub const RING_STEP_BYTES: f64 = 5.4e6;
/// P2P: rate at which a trainer rank loads gathered tensors into its CPU replica of an engine
/// rank (device-to-host copy and the engine's own `load_weights` on the host), bytes/s.
pub const REPLICA_BYTES_PER_S: f64 = 4.5e9;
/// P2P: fixed cost of one bucket's RDMA writes to one target rank (post, complete, notify), s.
pub const RDMA_WRITE_LATENCY_S: f64 = 0.0026;
/// All-gather across nodes: a rank's cross-node bytes arrive at this many times its own NIC's
/// rate (NCCL routes part of them through the rail peers' NICs).
pub const GATHER_NICS: f64 = 2.0;

/// What a weight update moves, and over how wide a fleet.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct SyncShape {
    /// Bytes of the converted model as the engines receive it (with LoRA: the adapters).
    pub bytes: f64,
    /// The same weights in the trainer's precision: what its all-gather moves before the
    /// conversion (Kimi K2: BF16 gathered, FP8 sent).
    pub gather_bytes: f64,
    /// Share of the bytes in routed experts, gathered over the EP group (the rest over TP).
    pub routed_share: f64,
    /// What moves, in words: `weights`, or `adapter weights` under LoRA.
    pub what: &'static str,
    pub bucket: f64,
    pub train_gpus: u64,
    /// Pipeline stages: each has its own source (broadcast) or sources (P2P).
    pub train_pp: u64,
    /// Ways a dense tensor is split (TP; FSDP's data-parallel ranks) and the EP group.
    pub train_tp: u64,
    pub train_ep: u64,
    pub engines: u64,
    /// GPUs (ranks) of one engine: TP, with EP inside it.
    pub gpus_per_engine: u64,
    /// Whether trainer and engines share one NVLink domain (one node): the broadcast ring then
    /// never leaves NVLink.
    pub one_domain: bool,
    /// Scale-out bandwidth per GPU, bytes/s.
    pub network_bw: f64,
    /// NVLink / xGMI bandwidth per GPU, bytes/s.
    pub scaleup_bw: f64,
    /// GPUs and local disk bandwidth per node (disk-delta).
    pub gpus_per_node: u64,
    pub disk_bw: f64,
    /// HBM bandwidth (local handoff).
    pub hbm_bw: f64,
    pub link_efficiency: f64,
    pub bucket_prep_s: f64,
    pub ring_step_bytes: f64,
    pub replica_bytes_per_s: f64,
    pub rdma_write_latency_s: f64,
    pub gather_nics: f64,
    pub requantize_s: f64,
}

impl SyncShape {
    fn rollout_gpus(&self) -> u64 {
        self.engines * self.gpus_per_engine
    }
    fn pp(&self) -> u64 {
        self.train_pp.max(1)
    }
    /// Buckets of one pipeline stage: each stage buckets its own layers.
    fn stage_buckets(&self) -> f64 {
        div(self.bytes / self.pp() as f64, self.bucket).ceil().max(1.0)
    }
    fn net(&self) -> f64 {
        self.network_bw * self.link_efficiency
    }
    fn nvlink(&self) -> f64 {
        self.scaleup_bw * self.link_efficiency
    }
    /// Nodes one EP group spans (Megatron puts EP's ranks next to each other when expert TP is 1).
    fn ep_nodes(&self) -> u64 {
        self.train_ep.max(1).div_ceil(self.gpus_per_node.max(1))
    }
    /// Seconds for every rank of a gather group to receive the rest of `x` trainer bytes: the
    /// dense part over TP, the routed experts over EP; what crosses nodes does so at
    /// `gather_nics` x one NIC, the rest over NVLink.
    fn gather_s(&self, x: f64) -> f64 {
        let tp = self.train_tp.max(1) as f64;
        let dense_path = if self.train_tp <= self.gpus_per_node.max(1) { self.nvlink() } else { self.net() };
        let dense = div((1.0 - self.routed_share) * x * (1.0 - 1.0 / tp), dense_path);
        let (ep, nodes) = (self.train_ep.max(1) as f64, self.ep_nodes() as f64);
        let routed = self.routed_share * x;
        let experts = div(routed * (1.0 - 1.0 / nodes), self.gather_nics * self.net())
            + div(routed / nodes * (1.0 - nodes / ep), self.nvlink());
        dense + experts
    }
}

/// The engines' requantisation after an update, when the model's catalog entry gives one.
fn requantize_note(s: &SyncShape) -> Option<String> {
    (s.requantize_s > 0.0).then(|| format!("engines requantise for {:.3} s after the update", s.requantize_s))
}

/// NCCL broadcast (Miles' default): per pipeline stage, the stage's head rank all-gathers each
/// bucket's TP/EP shards, converts them, and broadcasts the full tensors over one ring through
/// every rollout GPU; each rank keeps its slice. The engines take one bucket at a time (their
/// model-update lock), so the stages' rings share them: the update lasts the longer of the
/// engines' serial work, B / link + buckets x ring fill, and one stage's chain, its buckets x
/// (prepare + broadcast). The ring leaves through the head rank's one NIC (NVLink when all of
/// it is in one node).
pub(crate) fn broadcast(s: &SyncShape) -> Estimate {
    let one_node = s.one_domain;
    let bw = if one_node { s.nvlink() } else { s.net() };
    let ranks = s.rollout_gpus() + 1;
    let stage_buckets = s.stage_buckets();
    let buckets = stage_buckets * s.pp() as f64;
    let fill = (ranks - 1) as f64 * div(s.ring_step_bytes, bw);
    let transfer = div(s.bytes, bw);
    let engines = transfer + buckets * fill;
    let per_bucket = div(transfer, buckets) + fill;
    let prep = s.gather_s(div(s.gather_bytes, buckets)) + s.bucket_prep_s;
    let chain = stage_buckets * (prep + per_bucket);
    let seconds = engines.max(chain) + s.requantize_s;
    let bound = if chain > engines {
        format!(
            "one stage's chain binds: {stage_buckets} bucket(s) x ({:.1} ms prepare + {:.1} ms broadcast) = {chain:.1} s (the engines' serial work {engines:.1} s)",
            prep * 1e3,
            per_bucket * 1e3
        )
    } else {
        format!(
            "the engines' serial work binds ({engines:.1} s); each stage prepares its next bucket ({:.1} ms) while the others broadcast",
            prep * 1e3
        )
    };
    Estimate {
        seconds,
        assumptions: vec![
            format!(
                "{} of {} in {} bucket(s) of {}, from {} head rank(s) (one per pipeline stage)",
                bytes_fixed(s.bytes),
                s.what,
                buckets,
                gb_fixed(s.bucket),
                s.pp()
            ),
            format!(
                "every rollout GPU receives all of it through the head rank's {} at {}: {transfer:.1} s",
                if one_node { "NVLink" } else { "NIC" },
                gbs(bw)
            ),
            format!(
                "ring fill per bucket: {} hops x {} step at {}: {:.1} ms ({:.1} s in all)",
                ranks - 1,
                bytes_fixed(s.ring_step_bytes),
                gbs(bw),
                fill * 1e3,
                buckets * fill
            ),
            format!(
                "per bucket the head rank gathers {} x {} shards (TP or FSDP x EP) and prepares it: {:.1} ms",
                s.train_tp.max(1),
                s.train_ep.max(1),
                prep * 1e3
            ),
            bound,
        ]
        .into_iter()
        .chain(requantize_note(s))
        .collect(),
        evidence: Evidence::fitted(sources::SYNC),
    }
}

/// P2P (RDMA): every trainer rank all-gathers its stage as for a broadcast, loads the slices of
/// the engine ranks it serves into a CPU replica of such a rank, and writes each slice to its
/// targets by RDMA through its own NIC. The transfer plan gives each of a stage's sources
/// targets / sources engine ranks (identical ranks of different engines share one replica).
/// The sources work at once; the update lasts one source's work.
pub(crate) fn p2p(s: &SyncShape) -> Estimate {
    let pp = s.pp() as f64;
    let sources = (s.train_gpus / s.pp()).max(1);
    let tp = s.gpus_per_engine.max(1);
    let targets = s.rollout_gpus().div_ceil(sources);
    let distinct = if sources < tp { tp.div_ceil(sources) } else { 1 };
    let shard = div(s.bytes / pp, tp as f64);
    let gather = s.gather_s(s.gather_bytes / pp);
    let replica = div(distinct as f64 * shard, s.replica_bytes_per_s);
    let send = targets as f64 * shard;
    let receive = div(s.bytes, tp as f64);
    let busiest = send.max(receive);
    let write = div(busiest, s.net());
    let sessions = s.stage_buckets() * targets as f64 * s.rdma_write_latency_s;
    let seconds = gather + replica + write + sessions + s.requantize_s;
    Estimate {
        seconds,
        assumptions: vec![
            format!(
                "{} trainer rank(s) per stage ({} stage(s)) write to {} engine(s) of {} rank(s): {} target(s) per source",
                sources,
                s.pp(),
                s.engines,
                tp,
                targets
            ),
            format!(
                "each rank all-gathers its stage ({} in the trainer's precision): {gather:.1} s",
                bytes_fixed(s.gather_bytes / pp)
            ),
            format!(
                "CPU replica: {} distinct slice(s) of {} at {:.1} GB/s: {replica:.1} s",
                distinct,
                bytes_fixed(shard),
                s.replica_bytes_per_s / 1e9
            ),
            format!(
                "busiest NIC moves {} (send {}, receive {}) by RDMA at {}: {write:.1} s",
                bytes_fixed(busiest),
                bytes_fixed(send),
                bytes_fixed(receive),
                gbs(s.net())
            ),
            format!(
                "{} bucket(s) x {} target(s) x {:.1} ms per RDMA session: {sessions:.1} s",
                s.stage_buckets(),
                targets,
                s.rdma_write_latency_s * 1e3
            ),
        ]
        .into_iter()
        .chain(requantize_note(s))
        .collect(), evidence: Evidence::fitted(sources::SYNC) }
}

/// Disk delta: trainer nodes write a delta (assumed as large as the weights: RL touches every
/// parameter), every rollout node reads what its engines need and loads it bucket by bucket.
pub(crate) fn disk_delta(s: &SyncShape) -> Estimate {
    let gpn = s.gpus_per_node.max(1) as f64;
    let train_nodes = div(s.train_gpus as f64, gpn).ceil().max(1.0);
    let write = div(s.bytes, train_nodes * s.disk_bw);
    // A rollout node hosts gpn / tp engines (or 1/(tp/gpn) of one); each engine needs the whole model.
    let engine_share_per_node = div(gpn, s.gpus_per_engine as f64);
    let read_bytes = s.bytes * engine_share_per_node;
    let read = div(read_bytes, (s.net() * gpn).min(s.disk_bw).max(1.0));
    let buckets = div(s.bytes, s.bucket).ceil().max(1.0);
    let load = buckets * s.bucket_prep_s;
    let seconds = write + read + load + s.requantize_s;
    Estimate {
        seconds,
        assumptions: vec![
            format!("delta = full {} ({}), checksummed, no compression", s.what, bytes_fixed(s.bytes)),
            format!("written by {} trainer nodes at {} each", train_nodes, gbs(s.disk_bw)),
            format!("each rollout node reads {} at the slower of its disk and network", bytes_fixed(read_bytes)),
            format!(
                "engines load it in {} buckets x {:.1} ms (the broadcast's per-bucket preparation)",
                buckets,
                s.bucket_prep_s * 1e3
            ),
        ]
        .into_iter()
        .chain(requantize_note(s))
        .collect(),
        evidence: Evidence::fitted(sources::SYNC),
    }
}

/// Colocated handoff: the trainer's shard is copied into the engine's memory on the same GPU,
/// one bucket at a time.
pub(crate) fn local(s: &SyncShape) -> Estimate {
    let per_gpu = div(s.bytes, s.gpus_per_engine as f64);
    let buckets = div(per_gpu, s.bucket).ceil().max(1.0);
    let seconds = buckets * s.bucket_prep_s + div(2.0 * per_gpu, s.hbm_bw) + s.requantize_s;
    Estimate {
        seconds,
        assumptions: vec![
            format!("{} per GPU copied in HBM (read + write)", bytes_fixed(per_gpu)),
            format!("{} buckets x {:.1} ms (the broadcast's per-bucket preparation)", buckets, s.bucket_prep_s * 1e3),
        ],
        evidence: Evidence::fitted(sources::SYNC),
    }
}

#[cfg(test)]
mod tests;
