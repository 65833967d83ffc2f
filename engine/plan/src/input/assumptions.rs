//! What the planner assumes where nothing is measured: the embedded process's rates and sizes.

use super::*;

/// `Assumptions::embedded_process_bytes`' default (see there).
pub const EMBEDDED_PROCESS_BYTES: f64 = 140.0e6;
/// `Assumptions::embedded_autograd_scale`' default (see there).
pub const EMBEDDED_AUTOGRAD_SCALE: f64 = 1.4;

/// `Assumptions::embedded_flops_per_s`' default (see there).
pub const EMBEDDED_FLOPS_PER_S: f64 = 64e9;
/// `Assumptions::embedded_bf16_flops_per_s`' default (see there).
pub const EMBEDDED_BF16_FLOPS_PER_S: f64 = 256e9;
/// `Assumptions::embedded_kernel_s`' default (see there).
pub const EMBEDDED_KERNEL_S: f64 = 5e-6;
/// `Assumptions::embedded_bytes_per_s`' default (see there).
pub const EMBEDDED_BYTES_PER_S: f64 = 2.3e9;
/// `Assumptions::embedded_gpu_gemm_efficiency`' default (see there).
pub const EMBEDDED_GPU_GEMM_EFFICIENCY: f64 = 0.5;
/// `Assumptions::embedded_gpu_kernel_s`' default (see there).
pub const EMBEDDED_GPU_KERNEL_S: f64 = 10e-6;
/// `Assumptions::embedded_gpu_bandwidth_efficiency`' default (see there).
pub const EMBEDDED_GPU_BANDWIDTH_EFFICIENCY: f64 = 0.7;
/// `Assumptions::embedded_gpu_sync_s`' default (see there).
pub const EMBEDDED_GPU_SYNC_S: f64 = 20e-6;

/// `Assumptions::collective_bytes_per_s`' default: c10d's bus bandwidth between trainer processes
/// on one host (Gloo over loopback). Measured with ranks as processes on the 2-core development
/// machine, quiet (`cargo bench -p miles-c10d --bench allreduce`, bench/RESULTS.md "Data-parallel
/// trainers"): 0.8 GB/s median for a 64 MiB buffer (0.6 at 8 MiB, ~1.0 at the best); a
/// 10M-parameter run's 46 MB of gradients all-reduced at 0.98 GB/s.
pub const LOCAL_COLLECTIVE_BYTES_PER_S: f64 = 0.8e9;

/// Modelling constants. Defaults are documented in docs/plan.md with their source.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Assumptions {
    /// Share of HBM a trainer may fill (CUDA context, NCCL buffers, allocator fragmentation).
    pub usable_hbm: f64,
    /// Model FLOP utilisation of the trainer.
    pub train_mfu: f64,
    /// Share of peak HBM bandwidth a decode step reaches.
    pub decode_bandwidth_efficiency: f64,
    /// Share of peak FLOP/s a decode step reaches when compute-bound.
    pub decode_mfu: f64,
    /// Share of link bandwidth a bulk transfer reaches.
    pub link_efficiency: f64,
    /// Share of the GPU-host link an offload to host memory reaches (fitted to Miles §3.2).
    pub offload_link_efficiency: f64,
    /// Weight sync (docs/plan.md, "Weight sync"; the constants below are fitted together to the
    /// eight published layouts): share of a link's rate its transfers reach.
    pub sync_link_efficiency: f64,
    /// Broadcast: the trainer's work per bucket besides the gather's bytes, s.
    pub bucket_prep_s: f64,
    /// Broadcast: bytes by which each hop of NCCL's ring delays a bucket.
    pub ring_step_bytes: f64,
    /// P2P: rate of a trainer rank's loads into its CPU replica of an engine rank, bytes/s.
    pub replica_bytes_per_s: f64,
    /// P2P: fixed cost of one bucket's RDMA writes to one target rank, s.
    pub rdma_write_latency_s: f64,
    /// All-gather across nodes: a rank's cross-node bytes arrive at this many NICs' rate.
    pub gather_nics: f64,
    /// Local NVMe bandwidth per node when the GPU spec gives none, bytes/s.
    pub disk_bandwidth: f64,
    /// Seconds of on-GPU requantisation after each weight update (Kimi K2's FP8 checkpoint
    /// needs ~0.884 s on H100); 0 for most models.
    pub requantize_s: f64,
    /// Bytes the buffer keeps per token of a trajectory besides R3 data: token id (4),
    /// sampling log-prob (4), loss mask (1).
    pub buffer_bytes_per_token: f64,
    /// Tokens an environment's observation adds per turn when the environment does not say
    /// (a tool result or a terminal's output, with the chat template's delimiters).
    pub observation_tokens: u64,
    /// Resident bytes of the embedded process before any model state: libtorch loaded, the
    /// runtime, the task data. Measured: tests/plan_vs_actual.rs's tiny recipe (1 layer, d_model
    /// 32, 17.5k parameters) peaks at 141-144 MB RSS (`perf/peak_rss_bytes`, release build, one
    /// thread), of which its weights, gradients, optimizer state, engine copy and activations
    /// account for 2.3 MB: 139-142 MB, taken as 140 MB.
    pub embedded_process_bytes: f64,
    /// The embedded trainer's peak over the tensors its forward pass keeps for backward
    /// (`model::embedded_activation_bytes`): the backward pass's gradient buffers live beside
    /// them, and glibc keeps freed blocks resident. The one constant calibrated against
    /// `miles run` peaks (docs/plan.md, "The embedded process").
    pub embedded_autograd_scale: f64,
    /// Step time on a CPU host (docs/plan.md, "Step time on a CPU host"), one libtorch thread:
    /// effective FP32 matmul rate, FLOP/s. Measured, not fitted: libtorch matmuls at the laptop
    /// model's own shapes on one thread reached 62-90 GFLOP/s under load (bench/RESULTS.md,
    /// "Profile of a miles GRPO step": 1024x64x176 64.7, 1024x64x64 90.2, 128x64x176 62.1).
    pub embedded_flops_per_s: f64,
    /// The same for bf16 GEMMs (an embedded trainer's or engine's `precision = bf16`): 4 x
    /// `embedded_flops_per_s`, the ratio libtorch's bf16 and fp32 matmuls measured at the 10M
    /// comparison model's shapes on one thread of an AVX512-BF16 CPU (AMD EPYC, Zen 4: 397-428
    /// against 95-100 GFLOP/s, 2026-12-02, bench/RESULTS.md "bf16 GEMMs on the CPU"). A CPU
    /// without AVX512-BF16 or AMX runs them slower than fp32: a machine-dependent figure.
    pub embedded_bf16_flops_per_s: f64,
    /// Fixed cost of one ATen op (dispatch, allocation, autograd bookkeeping), s. Calibrated on
    /// recipes/grpo-laptop.miles (`miles run --set stop=20.steps --threads 1`): its optimizer
    /// phase, ~250 ops on tiny tensors, took a median 1.30 ms: ~5 us per op. (Fitting this and
    /// `embedded_bytes_per_s` to its rollout and train medians alone gives a negative cost.)
    pub embedded_kernel_s: f64,
    /// Rate at which the non-matmul ops write their FP32 outputs, bytes/s (elementwise ops,
    /// copies, softmax over 1 MB-sized tensors on one thread). Fitted on grpo-laptop alone, the
    /// same 20 steps: rollout + train medians 24.7 + 134.6 ms against the model's FLOP and op
    /// terms (51.9 ms) leave 107 ms for 249 MB written: 2.3 GB/s.
    pub embedded_bytes_per_s: f64,
    /// Step time of the embedded backend on a GPU (`local { device }` resolved to cuda:0;
    /// docs/plan.md, "Step time on a GPU"): the share of the GPU's dense datasheet peak its GEMMs
    /// reach (`plan/gpu.rs`: the bf16 tensor-core peak for `precision = bf16`, the fp32
    /// non-tensor-core peak for fp32, as libtorch leaves TF32 off for matmuls). An assumption,
    /// not measured: no GPU run of miles has been measured yet.
    pub embedded_gpu_gemm_efficiency: f64,
    /// Cost of one ATen op on a GPU, s: eager libtorch from Rust launches each kernel from the
    /// host (dispatch, allocation, the launch), ~10 us, the bound of a small model whose kernels
    /// are shorter. An assumption, not measured.
    pub embedded_gpu_kernel_s: f64,
    /// Share of the GPU's datasheet HBM bandwidth the non-matmul ops reach. An assumption, not
    /// measured.
    pub embedded_gpu_bandwidth_efficiency: f64,
    /// A sampled token's device-to-host read of the logits on a GPU (docs/gpu.md: sampling reads
    /// each step's logits back to the host), s: a synchronising copy, ~20 us. An assumption, not
    /// measured.
    pub embedded_gpu_sync_s: f64,
    /// Data-parallel embedded trainers (docs/plan.md, "Data-parallel embedded trainers"): the
    /// bus bandwidth of c10d's collectives between the trainer processes, bytes/s, in nccl-tests'
    /// convention (an all-reduce of S bytes over N ranks takes 2 (N - 1) / N x S / it, a
    /// broadcast S / it). `LOCAL_COLLECTIVE_BYTES_PER_S`.
    pub collective_bytes_per_s: f64,
    /// `generate.mean_prompt_tokens`: the recipe's expected prompt length, tokens. A planning
    /// assumption the recipe states, for time only: prefill and trained tokens are priced at it,
    /// memory (KV cache, activations, buffer) stays sized for max_prompt_tokens. `None`: the
    /// bound (docs/plan.md, "Expected lengths").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mean_prompt_tokens: Option<f64>,
    /// `generate.mean_response_tokens`: the expected response length (per turn in an episode),
    /// tokens; like `mean_prompt_tokens`, time only. `None`: max_new_tokens.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mean_response_tokens: Option<f64>,
}

impl Default for Assumptions {
    fn default() -> Assumptions {
        Assumptions {
            usable_hbm: 0.92,
            train_mfu: 0.30,
            decode_bandwidth_efficiency: 0.70,
            decode_mfu: 0.40,
            link_efficiency: 0.80,
            offload_link_efficiency: crate::plan::OFFLOAD_LINK_EFFICIENCY,
            sync_link_efficiency: crate::time::SYNC_LINK_EFFICIENCY,
            bucket_prep_s: crate::time::BUCKET_PREP_S,
            ring_step_bytes: crate::time::RING_STEP_BYTES,
            replica_bytes_per_s: crate::time::REPLICA_BYTES_PER_S,
            rdma_write_latency_s: crate::time::RDMA_WRITE_LATENCY_S,
            gather_nics: crate::time::GATHER_NICS,
            disk_bandwidth: 25e9,
            requantize_s: 0.0,
            buffer_bytes_per_token: 9.0,
            observation_tokens: 512,
            embedded_process_bytes: EMBEDDED_PROCESS_BYTES,
            embedded_autograd_scale: EMBEDDED_AUTOGRAD_SCALE,
            embedded_flops_per_s: EMBEDDED_FLOPS_PER_S,
            embedded_bf16_flops_per_s: EMBEDDED_BF16_FLOPS_PER_S,
            embedded_kernel_s: EMBEDDED_KERNEL_S,
            embedded_bytes_per_s: EMBEDDED_BYTES_PER_S,
            embedded_gpu_gemm_efficiency: EMBEDDED_GPU_GEMM_EFFICIENCY,
            embedded_gpu_kernel_s: EMBEDDED_GPU_KERNEL_S,
            embedded_gpu_bandwidth_efficiency: EMBEDDED_GPU_BANDWIDTH_EFFICIENCY,
            embedded_gpu_sync_s: EMBEDDED_GPU_SYNC_S,
            collective_bytes_per_s: LOCAL_COLLECTIVE_BYTES_PER_S,
            mean_prompt_tokens: None,
            mean_response_tokens: None,
        }
    }
}
