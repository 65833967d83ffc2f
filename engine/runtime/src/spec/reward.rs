//! A run's reward stage (the run spec's `reward`, docs/rewards.md), as plain data: a built-in
//! verifier, a command or an HTTP service (per sample, or per group with `group`), the task's exact
//! match inside a combination, or a weighted combination of these; and what each does with a
//! sample it cannot score. `reward::spec` builds the reward from it. A spec written before group
//! rewards and combinations reads unchanged: `group` defaults to false and is not written then.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum RewardSpec {
    /// A built-in verifier: `kind` is math, exact, normalised, regex (with `pattern`) or
    /// json_schema (with an optional `schema`).
    Verifier {
        name: String,
        kind: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pattern: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        schema: Option<serde_json::Value>,
        #[serde(default)]
        on_error: OnRewardError,
    },
    /// `command_reward { command, timeout, on_error, pass_env }`.
    Command {
        name: String,
        command: Vec<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cwd: Option<PathBuf>,
        #[serde(default = "default_timeout_s")]
        timeout_s: f64,
        #[serde(default)]
        on_error: OnRewardError,
        /// Names of the run's environment variables the program also gets (`child::ChildEnv`).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        pass_env: Vec<String>,
        /// `group_command_reward`: one request per group, one score per member.
        #[serde(default, skip_serializing_if = "is_false")]
        group: bool,
    },
    /// `http_reward { url, concurrency, batch_size, timeout, retries, on_error }`.
    Http {
        name: String,
        url: String,
        #[serde(default = "default_concurrency")]
        concurrency: usize,
        #[serde(default = "default_batch_size")]
        batch_size: usize,
        #[serde(default = "default_timeout_s")]
        timeout_s: f64,
        #[serde(default = "default_retries")]
        retries: u32,
        #[serde(default)]
        on_error: OnRewardError,
        /// `group_http_reward`: one request per group, one score per member.
        #[serde(default, skip_serializing_if = "is_false")]
        group: bool,
    },
    /// `exact_match` as a part of a combination (alone, a run's exact match is `reward: null`).
    ExactMatch {
        name: String,
        #[serde(default)]
        partial_credit: bool,
    },
    /// `combine { parts, weights }`: each sample's reward is the weighted sum of its parts'.
    Combine { name: String, parts: Vec<RewardSpec>, weights: Vec<f64> },
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn default_timeout_s() -> f64 {
    60.0
}
fn default_concurrency() -> usize {
    8
}
fn default_batch_size() -> usize {
    32
}
fn default_retries() -> u32 {
    2
}

/// What a reward stage does with a sample it could not score.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnRewardError {
    /// The sample leaves the batch (its GRPO group keeps the others); counted in `reward/dropped`.
    Drop,
    /// The sample scores 0; counted in `reward/zeroed`, never silently.
    Zero,
    /// The run stops with an error naming the stage, the sample and what the reward returned.
    #[default]
    Stop,
}
