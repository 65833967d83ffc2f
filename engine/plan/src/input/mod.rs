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

mod assumptions;
mod hardware;
mod model;
mod placement;
mod stage;
mod sync;

pub use assumptions::*;
pub use hardware::*;
pub use model::*;
pub use placement::*;
pub use stage::*;
pub use sync::*;

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
    /// The rollout's bounds where its model's `max_len` cuts them (`None`: they fit); the
    /// stages' lengths above are already cut.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_cap: Option<ContextCap>,
    /// Modelling constants; every estimate lists the ones it used.
    #[serde(default)]
    pub assumptions: Assumptions,
    /// A `local` cluster's `device` and, where the CLI looked, the machine's GPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<DeviceInput>,
    /// The `hf` models the stages run, as their config.json was read (shown, not sized: the
    /// stages' `ModelSpec`s carry the sizes).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<crate::output::ModelSource>,
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

/// A rollout's bounds that its model's context cuts. A run refuses a prompt set whose longest
/// prompt plus `max_new_tokens` passes `max_len` (E0510), and its sampler stops at `max_len`, so
/// no sequence is longer: prompts are priced at most at max_len - max_new_tokens, responses at
/// most at max_len - 1 (a prompt has a token at least).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ContextCap {
    /// The model's `max_len` (tokens).
    pub max_len: u64,
    /// The recipe's bounds, before the cut.
    pub max_prompt_tokens: u64,
    pub max_new_tokens: u64,
}

impl ContextCap {
    /// (prompt, response) cut to fit `max_len`; `None` when they fit already (or the context is
    /// unknown, 0).
    pub fn of(max_len: u64, prompt: u64, response: u64) -> Option<ContextCap> {
        (max_len > 0 && prompt.saturating_add(response) > max_len).then_some(ContextCap {
            max_len,
            max_prompt_tokens: prompt,
            max_new_tokens: response,
        })
    }

    /// The lengths a run can reach: the response first (the sampler's bound), the prompt in
    /// what is left.
    pub fn lengths(&self) -> (u64, u64) {
        let response = self.max_new_tokens.min(self.max_len.saturating_sub(1));
        (self.max_prompt_tokens.min(self.max_len - response), response)
    }
}

/// A rollout whose samples are multi-turn episodes: up to `max_turns` sampled turns of the
/// rollout's `max_new_tokens`, each but the last followed by an observation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Episodes {
    /// The environment's schema (`calculator`, `openenv`...).
    pub env: String,
    pub max_turns: Spanned<u64>,
    /// Tokens one observation adds: the recipe's `observation_tokens`, else a built-in
    /// environment's own; `None`: `assumptions.observation_tokens`.
    #[serde(default)]
    pub observation_tokens: Option<u64>,
    /// Whether `observation_tokens` is the recipe's (`env_reward.observation_tokens`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub observation_stated: bool,
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
    /// `env_reward.solved_at`: the reward at or above which an episode counts as solved (held-out
    /// `eval/accuracy`, `rollout/solved_frac`); costs nothing, shown so the rule is seen.
    #[serde(default = "one_reward")]
    pub solved_at: f64,
    /// `env_reward.prompt`: what the first turn shows of a chat row (`append`, `replace`,
    /// `observation_only`); `max_prompt_tokens` bounds that first prompt as sent whatever it
    /// says. Costs nothing, shown so that what the model reads is seen.
    #[serde(default = "append")]
    pub prompt: String,
}

fn one_reward() -> f64 {
    1.0
}

fn append() -> String {
    "append".into()
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
