//! How generation and training are interleaved (the recipe's `schedule` setting), as run-spec data,
//! and the one resolved configuration the asynchronous executor (`run::async_`) runs.
//!
//! - `sync`: generate a batch, train on it, sync the weights, repeat (`run::sync`).
//! - `one_step_off`: the batch of step n+1 is generated while step n trains, always under the
//!   weights of step n-1 (staleness exactly 1 from step 2 on). Weights are swapped only when no
//!   request is in flight, so a batch never mixes versions.
//! - `fully_async`: generation keeps up to `max_concurrent` samples in flight and refills per
//!   sample or per group, groups wait in a bounded buffer, the trainer draws `rollout_batch` groups
//!   per step; Miles' drop rules (aborted, filtered, stale) decide what is trained.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ScheduleSpec {
    #[default]
    Sync,
    OneStepOff,
    FullyAsync(AsyncSpec),
}

impl ScheduleSpec {
    pub fn is_sync(&self) -> bool {
        matches!(self, ScheduleSpec::Sync)
    }
}

/// Miles' fully asynchronous mode (§2.2, Tables 1-3). Defaults are the prelude's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AsyncSpec {
    /// A group is stale when drawn if (current weight version - its oldest version) exceeds this.
    /// Versions count weight updates pushed to the engines.
    #[serde(default = "two")]
    pub max_staleness: u64,
    /// Samples in flight at once (the engine's slots).
    #[serde(default = "sixty_four")]
    pub max_concurrent: usize,
    #[serde(default)]
    pub refill: Refill,
    /// Groups buffered or in flight before generation stops admitting prompts (and blocks).
    #[serde(default = "two_five_six")]
    pub buffer_capacity: usize,
    /// Training steps between weight updates.
    #[serde(default = "one")]
    pub update_interval: u64,
    #[serde(default)]
    pub pause: PauseMode,
    #[serde(default)]
    pub on_stale: DropAction,
    #[serde(default)]
    pub on_abort: DropAction,
    /// A prompt retried this many times is served before every other (0 = off).
    #[serde(default = "two_u32")]
    pub starvation_retries: u32,
    /// Which finished groups are rejected (always discarded).
    #[serde(default)]
    pub filter: GroupFilter,
    /// Start a group only if it can be trained within max_staleness (AReaL's admission rule);
    /// false = Miles' plain rule: generate until the buffer is full and drop what went stale.
    #[serde(default = "yes")]
    pub staleness_gate: bool,
    /// Longest wait for the other side (groups from generation, room in the buffer, an
    /// evaluation) before the run stops with E0509 naming the stage that stopped answering.
    #[serde(default = "stall_timeout")]
    pub stall_timeout_s: f64,
}

impl Default for AsyncSpec {
    fn default() -> Self {
        AsyncSpec {
            max_staleness: 2,
            max_concurrent: 64,
            refill: Refill::PerSample,
            buffer_capacity: 256,
            update_interval: 1,
            pause: PauseMode::InPlace,
            on_stale: DropAction::Retry,
            on_abort: DropAction::Retry,
            starvation_retries: 2,
            filter: GroupFilter::KeepAll,
            staleness_gate: true,
            stall_timeout_s: 600.0,
        }
    }
}

/// When a free slot gets new work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Refill {
    /// As soon as one sample finishes, the next sample starts in its slot.
    #[default]
    PerSample,
    /// A group starts only when slots for all its samples are free.
    PerGroup,
}

/// What requests in flight do while the engine's weights are swapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PauseMode {
    /// They continue under the new weights; each sample records every version it spanned.
    #[default]
    InPlace,
    /// They are aborted and their prompts retried.
    Retract,
    /// They are aborted and their prompts discarded.
    Abort,
    /// No new request starts; the swap waits until the ones in flight finish (one_step_off).
    Drain,
}

/// What happens to the prompt of a dropped group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DropAction {
    /// Back to the data source, to be generated again.
    #[default]
    Retry,
    Discard,
}

/// The recipe's filter on finished groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GroupFilter {
    #[default]
    KeepAll,
    /// Reject groups whose rewards are all equal: their GRPO advantages are all 0 (no signal).
    DropFlat,
}

/// DAPO's dynamic sampling under the synchronous schedule: groups whose rewards are all equal are
/// dropped and more prompts are generated, up to `max_rounds` generation rounds per step, until
/// the step holds `rollout_batch` groups; short after the last round, the step trains on the
/// groups it has (metrics `rollout/gen_rounds`, `rollout/kept_groups`, `rollout/extra_samples`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DynamicSampling {
    pub max_rounds: u32,
}

/// Where held-out evaluation runs under an asynchronous schedule (Miles Table 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EvalMode {
    /// On the rollout engine: new generation pauses while the requests in flight finish.
    #[default]
    Shared,
    /// On a copy of the weights, by a second engine on its own thread, concurrently.
    Snapshot,
    /// By `eval.command`, given a directory holding the model of that step.
    External,
}

/// The schedule as the asynchronous executor runs it: `one_step_off` is `fully_async` with a whole
/// batch in flight, room for one batch, and swaps only between batches.
pub fn resolve(schedule: &ScheduleSpec, rollout_batch: usize, samples_per_prompt: usize) -> Option<AsyncSpec> {
    match schedule {
        ScheduleSpec::Sync => None,
        ScheduleSpec::OneStepOff => Some(AsyncSpec {
            // Never exceeded by construction (1 from step 2 on); no group is ever dropped as stale.
            max_staleness: u64::MAX,
            max_concurrent: rollout_batch * samples_per_prompt,
            refill: Refill::PerGroup,
            buffer_capacity: rollout_batch,
            update_interval: 1,
            pause: PauseMode::Drain,
            starvation_retries: 0,
            ..AsyncSpec::default()
        }),
        ScheduleSpec::FullyAsync(a) => Some(a.clone()),
    }
}

fn yes() -> bool {
    true
}
fn two() -> u64 {
    2
}
fn two_u32() -> u32 {
    2
}
fn one() -> u64 {
    1
}
fn sixty_four() -> usize {
    64
}
fn two_five_six() -> usize {
    256
}
fn stall_timeout() -> f64 {
    600.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serde_forms() {
        let s: ScheduleSpec = serde_json::from_str(r#"{"type":"sync"}"#).unwrap();
        assert_eq!(s, ScheduleSpec::Sync);
        let s: ScheduleSpec = serde_json::from_str(r#"{"type":"one_step_off"}"#).unwrap();
        assert_eq!(s, ScheduleSpec::OneStepOff);
        let s: ScheduleSpec =
            serde_json::from_str(r#"{"type":"fully_async","max_staleness":1,"on_stale":"discard"}"#).unwrap();
        let ScheduleSpec::FullyAsync(a) = &s else { panic!("{s:?}") };
        assert_eq!(a.max_staleness, 1);
        assert_eq!(a.on_stale, DropAction::Discard);
        assert_eq!(a.max_concurrent, 64);
        let back: ScheduleSpec = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(back, s);
        assert!(serde_json::from_str::<ScheduleSpec>(r#"{"type":"fully_async","max_stale":1}"#).is_err());
    }
}
