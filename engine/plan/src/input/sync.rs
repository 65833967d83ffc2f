//! Weight syncs, the schedule and the batch arithmetic.

use super::*;

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
    /// `sync { filter = drop_flat }`: DAPO's dynamic sampling, at most this many generation
    /// rounds per step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dynamic_rounds: Option<u64>,
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
    /// Passes over each rollout batch (the trainer's `epochs`); None: one.
    #[serde(default)]
    pub epochs: Option<Spanned<u64>>,
}
