//! The planner's input: plain data that the compiler fills from a checked recipe and the
//! hardware/model catalogs (`stdlib/std/hardware.miles`, `stdlib/std/models.miles`).
//!
//! Units are SI base units throughout: bytes, bytes per second, FLOP per second, seconds,
//! tokens. Field names of [`GpuSpec`], [`HostSpec`] and [`ModelSpec`] are the field names of the
//! `schema gpu`, `schema host` and `schema llm` declarations in those catalogs, so the compiler can
//! map a record field by field.

use miles_grammar::diag::Span;
use serde::{Deserialize, Serialize};

pub use miles_grammar::diag::Spanned;
use miles_grammar::spanned::{deserialize_opt_span as de_opt_span, serialize_opt_span as opt_span};

/// Everything `miles plan` needs to know about one recipe.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlanInput {
    /// The recipe's name, for the header line.
    pub recipe: String,
    pub cluster: Cluster,
    /// The recipe's stages in source order (weight-sync stages go in `syncs`).
    pub stages: Vec<Stage>,
    /// The stage graph, for drawing only: the compiler's nodes and edges, weight-sync edges included.
    #[serde(default)]
    pub graph: Graph,
    #[serde(default)]
    pub placement: Placement,
    #[serde(default)]
    pub syncs: Vec<WeightSync>,
    #[serde(default)]
    pub schedule: Schedule,
    #[serde(default)]
    pub batch: Batch,
    /// R3 (rollout routing replay): the engine records every token's routed experts and returns
    /// them with the trajectory (`record_routing`, on with `routing_replay`).
    #[serde(default)]
    pub r3: Spanned<bool>,
    /// Bytes of one recorded expert id (`routing_dtype`: u8 1, u16 2, i32 4); `None`: the
    /// smallest type that holds the expert count (`model::route_id_bytes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub r3_id_bytes: Option<u64>,
    /// Multi-turn episodes, when an environment scores the rollout (`env_reward`).
    #[serde(default)]
    pub episodes: Option<Episodes>,
    /// Modelling constants; every estimate lists the ones it used.
    #[serde(default)]
    pub assumptions: Assumptions,
    /// A `local` cluster's `device` and, where the CLI looked, the machine's GPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<DeviceInput>,
}

/// What a `local` cluster asks of the machine (`device`) and what the machine has. The planner is
/// pure: the caller discovers the GPUs (`miles plan` through the CUDA driver) and passes them in.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceInput {
    /// cpu, cuda or auto, as the recipe says.
    pub asked: Spanned<String>,
    /// The machine's GPUs; `None`: not looked at (the recipe asked for the CPU).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<MachineGpus>,
    /// Why the recipe computes on the CPU whatever it asks (a diffusion recipe's denoiser);
    /// `auto` then resolves to the CPU without looking at the machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_only: Option<String>,
    /// Whether this machine's CPU has bf16 GEMM instructions (AVX512-BF16 or AMX); `None`: not
    /// looked at. Without them a `precision = bf16` embedded stage runs, slowly (E0411).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_bf16: Option<bool>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MachineGpus {
    pub gpus: Vec<MachineGpu>,
    /// Why no GPU can be used (no driver, none visible), in words; `None` when `gpus` are usable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unavailable: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MachineGpu {
    pub index: u32,
    pub name: String,
    /// Bytes.
    pub memory: u64,
    /// Compute capability as `sm_90`.
    pub sm: String,
}

/// A rollout whose samples are multi-turn episodes: up to `max_turns` sampled turns of the
/// rollout's `max_new_tokens`, each but the last followed by an observation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Episodes {
    /// The environment's schema (`calculator`, `openenv`...).
    pub env: String,
    pub max_turns: Spanned<u64>,
    /// Tokens one observation adds; `None`: `assumptions.observation_tokens`.
    #[serde(default)]
    pub observation_tokens: Option<u64>,
    /// The rollout's max_prompt_tokens and max_new_tokens (per turn).
    pub prompt_tokens: u64,
    pub turn_tokens: u64,
    /// `env_reward.compact`: a full context is compacted to the prompt and this many last turns
    /// (`None`: the episode ends when its context is full).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compact_keep_turns: Option<u64>,
    /// `env_reward.mean_turns`: the turns an episode is expected to play, a planning assumption
    /// for time only (memory stays sized for the longest episode); `None`: every turn that fits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean_turns: Option<Spanned<f64>>,
}

impl Episodes {
    pub fn observation(&self, a: &Assumptions) -> u64 {
        self.observation_tokens.unwrap_or(a.observation_tokens)
    }

    /// Tokens of the longest episode: the prompt, every turn, the observations between turns;
    /// at most `max_context` (the model's) when known.
    pub fn tokens(&self, a: &Assumptions, max_context: Option<u64>) -> u64 {
        let t = self.max_turns.value.max(1);
        let n = self.prompt_tokens + t * self.turn_tokens + (t - 1) * self.observation(a);
        max_context.filter(|&c| c > 0).map_or(n, |c| n.min(c))
    }
}

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

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Attention {
    Mha,
    Gqa,
    Mla,
}

/// `schema llm` in stdlib/std/models.miles.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelSpec {
    pub name: String,
    /// Total parameters.
    pub params: u64,
    /// Parameters used per token (equal to `params` for dense models).
    pub active_params: u64,
    pub layers: u64,
    /// Leading layers with a dense MLP in an MoE model.
    #[serde(default)]
    pub dense_layers: u64,
    pub hidden_size: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
    pub vocab: u64,
    /// Routed experts per MoE layer; 0 for a dense model.
    #[serde(default)]
    pub experts: u64,
    /// Routed experts per token.
    #[serde(default)]
    pub top_k: u64,
    /// Tokens.
    pub max_context: u64,
    pub attention: Attention,
    /// MLA: width of the compressed KV latent that the KV cache stores.
    #[serde(default)]
    pub kv_lora_rank: Option<u64>,
    /// MLA: width of the decoupled rotary key, also cached.
    #[serde(default)]
    pub qk_rope_head_dim: Option<u64>,
    /// DSA: tokens each query attends to (`None`: dense attention).
    #[serde(default)]
    pub sparse_topk: Option<u64>,
    /// DSA: width of the indexer key cached per token and layer.
    #[serde(default)]
    pub index_head_dim: Option<u64>,
    /// Seconds of on-GPU requantisation the engines need after each weight update (Kimi K2:
    /// 0.884 s, Miles Tab. 8); `None`: `assumptions.requantize_s`.
    #[serde(default)]
    pub update_requantize_s: Option<f64>,
    /// Width of a dense layer's MLP (`d_ff`, Hugging Face's `intermediate_size`), where the model
    /// record gives it (`transformer`, `hf`; `schema llm` has no such field): LoRA on the MLP.
    /// `None`: derived from the parameter count (docs/plan.md, "LoRA").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intermediate_size: Option<u64>,
    /// Whether the LM head shares the token embedding's matrix (`transformer`: no; `hf`: its
    /// config.json's `tie_word_embeddings`; `schema llm` has no such field). `None`: unknown.
    /// Sizes PPO's critic, which drops the LM head (docs/plan.md, "PPO").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tied_embeddings: Option<bool>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Rollout,
    Train,
    Reward,
    Eval,
    Sft,
    /// An OPD teacher stage (`teacher_logprobs`).
    Teacher,
    Other,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Rollout => "rollout",
            Role::Train => "train",
            Role::Reward => "reward",
            Role::Eval => "eval",
            Role::Sft => "sft",
            Role::Teacher => "teacher",
            Role::Other => "other",
        }
    }
    /// Roles that run a trainer (and so hold gradients and optimizer state).
    pub fn trains(self) -> bool {
        matches!(self, Role::Train | Role::Sft)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Stage {
    /// The binding name in the recipe (`rollout`, `train`...).
    pub name: String,
    /// The stage kind (`generate`, `grpo`, `sft`, `terminal_bench`...).
    pub kind: String,
    pub role: Role,
    #[serde(default)]
    pub model: Option<ModelSpec>,
    /// GPUs asked for; `None` lets the planner decide (see docs/plan.md, "Placement").
    #[serde(default)]
    pub gpus: Option<Spanned<GpuRequest>>,
    /// For rollout and eval stages that run an inference engine.
    #[serde(default)]
    pub engine: Option<Engine>,
    /// For train and sft stages.
    #[serde(default)]
    pub trainer: Option<Trainer>,
    /// An OPD teacher stage on GPUs of its own (`teacher_logprobs { gpus = N }`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub teacher: Option<TeacherJob>,
    #[serde(default, serialize_with = "opt_span", deserialize_with = "de_opt_span")]
    pub span: Option<Span>,
}

/// What a teacher stage on GPUs of its own scores per optimizer step, read off the trainer it
/// feeds: that trainer's sequences, micro-batches and compute precision.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TeacherJob {
    pub seq_len: u64,
    pub micro_batch: u64,
    pub precision: Precision,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum GpuRequest {
    /// This many GPUs, taken in order from the free ones.
    Count(u64),
    /// GPU ids `first..=last` (ids number pools in order, nodes in order within a pool).
    Range { first: u64, last: u64 },
    /// Let the planner size it.
    #[default]
    Auto,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Precision {
    Fp32,
    Bf16,
    Fp16,
    Fp8Blockwise,
    Mxfp8,
    Nvfp4,
}

impl Precision {
    /// Bytes per stored weight (block scales of the 8- and 4-bit formats included).
    pub fn bytes(self) -> f64 {
        match self {
            Precision::Fp32 => 4.0,
            Precision::Bf16 | Precision::Fp16 => 2.0,
            // One FP32 scale per 128x128 block: 4 / 16384 bytes per weight.
            Precision::Fp8Blockwise => 1.0 + 4.0 / 16384.0,
            // One E8M0 scale per 32 weights.
            Precision::Mxfp8 => 1.0 + 1.0 / 32.0,
            // One E4M3 scale per 16 weights (the per-tensor FP32 scale is negligible).
            Precision::Nvfp4 => 0.5 + 1.0 / 16.0,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Bf16 => "bf16",
            Precision::Fp16 => "fp16",
            Precision::Fp8Blockwise => "fp8_blockwise",
            Precision::Mxfp8 => "mxfp8",
            Precision::Nvfp4 => "nvfp4",
        }
    }
}

/// An inference engine fleet (SGLang semantics: an engine spans `tp` GPUs; data-parallel
/// attention and expert parallelism partition those GPUs, they do not add to them).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Engine {
    /// Number of engines; `None`: as many as fit in the stage's GPUs.
    #[serde(default)]
    pub engines: Option<Spanned<u64>>,
    pub tp: Spanned<u64>,
    #[serde(default = "one")]
    pub dp: Spanned<u64>,
    #[serde(default = "one")]
    pub ep: Spanned<u64>,
    pub precision: Spanned<Precision>,
    /// The embedded engine (`embedded_engine`): its `precision` is what its CPU GEMMs run in.
    #[serde(default)]
    pub embedded: bool,
    /// KV-cache element type; `None`: bf16.
    #[serde(default)]
    pub kv_precision: Option<Spanned<Precision>>,
    /// Share of HBM the engine may use for weights plus KV cache (SGLang `mem_fraction_static`).
    #[serde(default = "default_mem_fraction")]
    pub mem_fraction: Spanned<f64>,
    /// Concurrent requests per engine the recipe asks for.
    #[serde(default)]
    pub max_concurrent: Option<Spanned<u64>>,
    /// Share of prompt tokens found in the prefix cache (`None`: each context prefilled once).
    #[serde(default)]
    pub prefix_cache_hit: Option<Spanned<f64>>,
    /// Tokens.
    pub prompt_len: Spanned<u64>,
    /// Tokens.
    pub response_len: Spanned<u64>,
}

fn one() -> Spanned<u64> {
    Spanned::new(1)
}
fn default_mem_fraction() -> Spanned<f64> {
    Spanned::new(0.85)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    Megatron,
    Fsdp,
    /// The in-process libtorch trainer (one process, no sharding).
    Embedded,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Recompute {
    Full,
    Selective,
    /// `off` in std/prelude's `Recompute`.
    #[serde(alias = "none")]
    Off,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OptimizerOffload {
    /// `on_gpu` in std/prelude's `OptimizerOffload`.
    #[serde(alias = "none")]
    OnGpu,
    Cpu,
    StreamFromDisk,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Trainer {
    pub backend: Spanned<Backend>,
    #[serde(default = "one")]
    pub tp: Spanned<u64>,
    #[serde(default = "one")]
    pub pp: Spanned<u64>,
    #[serde(default = "one")]
    pub cp: Spanned<u64>,
    #[serde(default = "one")]
    pub ep: Spanned<u64>,
    /// `None`: the stage's GPUs divided by tp x pp x cp.
    #[serde(default)]
    pub dp: Option<Spanned<u64>>,
    pub precision: Spanned<Precision>,
    #[serde(default = "one")]
    pub micro_batch: Spanned<u64>,
    /// Tokens per sample (prompt + response).
    pub seq_len: Spanned<u64>,
    pub recompute: Spanned<Recompute>,
    pub optimizer_offload: Spanned<OptimizerOffload>,
    /// Low-rank adapters (`lora = lora { ... }`): the base is frozen; only adapters train and sync.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora: Option<Lora>,
    /// On-policy distillation (`opd = opd { teacher = ... }` on `grpo`/`ppo`): the model of the
    /// teacher stage the trainer reads, frozen, run forward over every trajectory beside the
    /// trainer (docs/plan.md, "On-policy distillation: the teacher"). `None`: no distillation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub teacher: Option<ModelSpec>,
    /// The teacher stage runs in a worker process of its own (`process = true`): its memory is
    /// that process's, not this rank's; its forward still precedes the trainer's each step.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub teacher_process: bool,
}

/// A linear layer LoRA wraps in every transformer layer (std/prelude's `LoraTarget`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LoraTarget {
    QProj,
    KProj,
    VProj,
    OProj,
    GateProj,
    UpProj,
    DownProj,
}

impl LoraTarget {
    pub const ALL: [LoraTarget; 7] = [
        LoraTarget::QProj,
        LoraTarget::KProj,
        LoraTarget::VProj,
        LoraTarget::OProj,
        LoraTarget::GateProj,
        LoraTarget::UpProj,
        LoraTarget::DownProj,
    ];
    /// The module's name (PEFT's `target_modules`).
    pub fn as_str(self) -> &'static str {
        match self {
            LoraTarget::QProj => "q_proj",
            LoraTarget::KProj => "k_proj",
            LoraTarget::VProj => "v_proj",
            LoraTarget::OProj => "o_proj",
            LoraTarget::GateProj => "gate_proj",
            LoraTarget::UpProj => "up_proj",
            LoraTarget::DownProj => "down_proj",
        }
    }
    pub fn from_name(s: &str) -> Option<LoraTarget> {
        LoraTarget::ALL.into_iter().find(|t| t.as_str() == s)
    }
    /// The short name plans print (`q` for `q_proj`).
    pub fn short(self) -> &'static str {
        self.as_str().trim_end_matches("_proj")
    }
    /// An MLP projection (on the routed experts of an MoE model).
    pub fn is_mlp(self) -> bool {
        matches!(self, LoraTarget::GateProj | LoraTarget::UpProj | LoraTarget::DownProj)
    }
}

/// std/prelude's `schema lora`, as far as memory and weight sync depend on it (`alpha` does not).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Lora {
    pub rank: Spanned<u64>,
    /// Adapters trained at once on the one frozen base (multi-LoRA).
    #[serde(default = "one")]
    pub adapters: Spanned<u64>,
    /// The wrapped modules; `None` in JSON: the stdlib's default (the attention projections).
    #[serde(default = "default_lora_targets")]
    pub target_modules: Vec<LoraTarget>,
    /// Dropout on each wrapped layer's input to its adapter (PEFT's `lora_dropout`), in 0..1.
    /// Above 0 the backward pass keeps the dropped copy of every wrapped layer's input
    /// (docs/plan.md, "LoRA"). Absent in JSON: 0; not written when 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub dropout: f64,
    /// Where the recipe wrote `lora { ... }`.
    #[serde(default, serialize_with = "opt_span", deserialize_with = "de_opt_span")]
    pub span: Option<Span>,
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

/// PEFT's common choice for Llama-family models, std/prelude's default: q, k, v, o.
pub fn default_lora_targets() -> Vec<LoraTarget> {
    vec![LoraTarget::QProj, LoraTarget::KProj, LoraTarget::VProj, LoraTarget::OProj]
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum PlacementMode {
    /// Rollout and training alternate on the same GPUs.
    Colocated,
    /// Separate GPU pools.
    #[default]
    Disaggregated,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Default)]
pub struct Placement {
    pub mode: Spanned<PlacementMode>,
    /// On a CPU-only host every stage shares the one embedded process: what it holds there
    /// besides the trainer, from the recipe (docs/plan.md, "The embedded process"). Absent in
    /// JSON: nothing extra; not written when so.
    #[serde(default, skip_serializing_if = "EmbeddedExtras::is_none")]
    pub embedded: EmbeddedExtras,
    /// A diffusion RL recipe (std/stages `denoise` on a `denoiser`): the embedded backend runs
    /// its every stage in one process, which the planner itemises instead of a language model's
    /// trainer and engine (docs/plan.md, "Diffusion RL"). Absent in JSON: not a diffusion recipe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diffusion: Option<Diffusion>,
}

/// A diffusion RL recipe as the planner needs it: the denoiser's sizes and the figures of its
/// stages (std/stages `denoise_pretrain`, `denoise`, `image_reward`, `diffusion_grpo`,
/// `image_eval`); each stage but the rollout is optional.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Diffusion {
    pub model: DenoiserSpec,
    #[serde(default)]
    pub pretrain: Option<DenoisePretrain>,
    pub rollout: DenoiseRollout,
    #[serde(default)]
    pub reward: Option<ImageReward>,
    #[serde(default)]
    pub train: Option<DiffusionTrainer>,
    #[serde(default)]
    pub eval: Option<ImageEval>,
}

/// std/prelude's `schema denoiser`: an MLP over the flattened side x side image.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DenoiserSpec {
    pub side: u64,
    /// Condition classes K (the embedding has K + 1 rows: the last is the null condition).
    pub conditions: u64,
    pub hidden: u64,
    /// Residual hidden blocks.
    pub layers: u64,
    /// The record's `params` (the stdlib counts them from the sizes).
    pub params: u64,
}

impl DenoiserSpec {
    /// The name stage lines print: `denoiser 16x16 h256 x2`.
    pub fn name(&self) -> String {
        format!("denoiser {}x{} h{} x{}", self.side, self.side, self.hidden, self.layers)
    }
}

/// `denoise_pretrain`: `steps` batches of `batch` domain images before RL.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DenoisePretrain {
    pub stage: String,
    pub steps: u64,
    pub batch: u64,
}

/// `denoise`: the DDPM sampler.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DenoiseRollout {
    pub stage: String,
    /// Denoising steps T.
    pub steps: u64,
    /// Classifier-free guidance weight: other than 0 and 1, two denoiser rows per image and step.
    pub guidance: f64,
    pub samples_per_condition: u64,
    pub micro_group: u64,
}

/// `image_reward`: the classifier (trained before RL unless loaded), an analytic term, the
/// stand-in latency per micro-group, and whether micro-groups are scored while the next denoises.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ImageReward {
    pub stage: String,
    pub streaming: bool,
    /// `extra_cost`, seconds per scored micro-group.
    #[serde(default)]
    pub extra_cost_s: f64,
    /// Training steps of the classifier the run trains; `None`: loaded (`classifier = "..."`).
    #[serde(default)]
    pub classifier_steps: Option<u64>,
    /// An analytic property is scored too.
    #[serde(default)]
    pub analytic: bool,
    /// Scored in a worker process of its own (`process = true`) rather than a thread; the time
    /// model is the same (a pipe's copy of a micro-group's pixels is not counted).
    #[serde(default)]
    pub process: bool,
}

/// `diffusion_grpo`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DiffusionTrainer {
    pub stage: String,
    pub conditions_per_step: u64,
    /// Denoising steps trained per image; `None`: all T.
    #[serde(default)]
    pub train_steps: Option<u64>,
    #[serde(default)]
    pub kl_coef: f64,
}

/// `image_eval`: every `every` RL steps (step 0 included), `samples` held-out images and the
/// judge (a second classifier trained for `judge_steps`, 0: none).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ImageEval {
    pub stage: String,
    pub every: u64,
    pub samples: u64,
    pub judge_steps: u64,
}

/// What the embedded backend holds in its one process besides the trainer's own state, read from
/// the recipe: each is a further copy of the weights, or tensors kept for the backward pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(default)]
pub struct EmbeddedExtras {
    /// `kl_coef > 0` on the trainer: a frozen reference copy of the policy (`freeze_reference`).
    pub kl_reference: bool,
    /// `evaluate { mode = snapshot }`: under an async schedule, a batch engine of its own.
    pub eval_snapshot: bool,
    /// `entropy_coef > 0`: the entropy's exp(log p) [tokens, vocab] is kept for the backward pass.
    pub entropy_in_loss: bool,
}

impl EmbeddedExtras {
    pub fn is_none(&self) -> bool {
        *self == EmbeddedExtras::default()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Transport {
    Broadcast,
    P2p,
    DiskDelta,
    Local,
}

impl Transport {
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::Broadcast => "broadcast",
            Transport::P2p => "p2p",
            Transport::DiskDelta => "disk_delta",
            Transport::Local => "local",
        }
    }
}

/// What carries broadcast and p2p between processes (`weights.channel`); auto is not shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum WeightChannel {
    #[default]
    Auto,
    Tcp,
    Shm,
    Nccl,
}

impl WeightChannel {
    pub fn as_str(self) -> &'static str {
        match self {
            WeightChannel::Auto => "auto",
            WeightChannel::Tcp => "tcp",
            WeightChannel::Shm => "shm",
            WeightChannel::Nccl => "nccl",
        }
    }
    pub fn is_auto(&self) -> bool {
        *self == WeightChannel::Auto
    }
}

/// `weights(from -> to) { transport = ..., channel = ..., bucket = ... }`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WeightSync {
    pub name: String,
    /// The train stage's name.
    pub from: String,
    /// The rollout stage's name.
    pub to: String,
    pub transport: Spanned<Transport>,
    #[serde(default, skip_serializing_if = "WeightChannel::is_auto")]
    pub channel: WeightChannel,
    /// Bytes per bucket.
    pub bucket: Spanned<u64>,
    #[serde(default, serialize_with = "opt_span", deserialize_with = "de_opt_span")]
    pub span: Option<Span>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ScheduleMode {
    #[default]
    Sync,
    OneStepOff,
    FullyAsync,
}

impl ScheduleMode {
    pub fn as_str(self) -> &'static str {
        match self {
            ScheduleMode::Sync => "sync",
            ScheduleMode::OneStepOff => "one_step_off",
            ScheduleMode::FullyAsync => "fully_async",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Default)]
pub struct Schedule {
    pub mode: Spanned<ScheduleMode>,
    #[serde(default)]
    pub max_staleness: Option<Spanned<u64>>,
    /// Groups the buffer may hold.
    #[serde(default)]
    pub buffer_capacity: Option<Spanned<u64>>,
    /// Samples in flight across the fleet (fully_async's `max_concurrent`).
    #[serde(default)]
    pub max_concurrent: Option<Spanned<u64>>,
}

/// The four batch figures; the planner derives a missing one from the other three.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Default)]
pub struct Batch {
    /// Prompts per rollout step.
    #[serde(default)]
    pub rollout_batch: Option<Spanned<u64>>,
    #[serde(default)]
    pub samples_per_prompt: Option<Spanned<u64>>,
    /// Samples per optimizer step.
    #[serde(default)]
    pub global_batch: Option<Spanned<u64>>,
    #[serde(default)]
    pub steps_per_rollout: Option<Spanned<u64>>,
}

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
    /// Weight sync: fixed cost of one broadcast bucket, s (fitted to Table 8; docs/plan.md).
    pub bucket_latency_s: f64,
    /// Weight sync: fixed cost per layer of a P2P or disk-delta update, s (fitted to Table 8).
    pub p2p_layer_s: f64,
    /// NCCL's ring step, bytes (NCCL_BUFFSIZE / NCCL_STEPS).
    pub nccl_chunk_bytes: f64,
    /// Latency of one NCCL ring hop beyond its chunk's transfer, s.
    pub nccl_hop_latency_s: f64,
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
            bucket_latency_s: crate::time::BUCKET_LATENCY_S,
            p2p_layer_s: crate::time::P2P_LAYER_S,
            nccl_chunk_bytes: crate::time::NCCL_CHUNK_BYTES,
            nccl_hop_latency_s: crate::time::NCCL_HOP_LATENCY_S,
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
            mean_prompt_tokens: None,
            mean_response_tokens: None,
        }
    }
}

/// The stage graph as the compiler sees it, passed through for drawing.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Default)]
pub struct Graph {
    pub nodes: Vec<GraphNode>,
    pub edges: Vec<GraphEdge>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GraphNode {
    /// The stage name (matches `Stage::name` or `WeightSync::name`).
    pub id: String,
    /// What to print in the box (`grpo`, `generate`...).
    pub label: String,
    pub role: Role,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GraphEdge {
    pub from: String,
    pub to: String,
    /// The port or channel (`Trajectories`, `weights`).
    #[serde(default)]
    pub label: String,
    /// A weight-sync edge (drawn dashed, may point backwards).
    #[serde(default)]
    pub weights: bool,
}

/// The std/stages kinds the planner places (rewards and checkpoints run on the host by design).
pub(crate) const KNOWN_KINDS: &[&str] = &[
    "sft",
    "teacher_logprobs",
    "generate",
    "exact_match",
    "verify",
    "command_reward",
    "http_reward",
    "env_reward",
    "grpo",
    "ppo",
    "weights",
    "evaluate",
    "checkpoint",
    "denoise_pretrain",
    "denoise",
    "image_reward",
    "diffusion_grpo",
    "image_eval",
];
