//! A run's environment settings (the run spec's `env`, docs/agents.md), as plain data: which
//! environment and its own settings, an episode's limits and reward rules, and the TITO rule of
//! its sessions. `env::spec` builds the environment and the episode driver's limits from them.

use crate::RunError;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EnvSpec {
    Calculator(CalculatorSpec),
    Jsonl(JsonlSpec),
    #[serde(rename = "openenv")]
    OpenEnv(OpenEnvSpec),
    /// The plug-in layers (`agent`, docs/agents.md): the user's program plays each episode
    /// through the run's chat server.
    AgentProgram(ProgramSpec),
    /// ... one program per group of sessions.
    RolloutProgram(ProgramSpec),
    /// ... sessions opened and finished by an outside process over HTTP.
    ExternalAgents(ExternalSpec),
}

impl EnvSpec {
    /// Whether this is a plug-in layer: episodes are played by programs through the chat server,
    /// not turn by turn by the episode driver.
    pub fn is_layer(&self) -> bool {
        matches!(self, EnvSpec::AgentProgram(_) | EnvSpec::RolloutProgram(_) | EnvSpec::ExternalAgents(_))
    }
}

/// An `agent_program` or `rollout_program`: the user's program (`agent::program`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProgramSpec {
    pub name: String,
    /// Program and arguments, not through a shell: `["python3", "agent.py"]`.
    pub command: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<PathBuf>,
    /// Names of the run's environment variables the program also gets (`child::ChildEnv`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pass_env: Vec<String>,
}

/// `external_agents`: where the run's chat server listens for an outside process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExternalSpec {
    pub name: String,
    /// `host:port`; port 0 picks a free one.
    #[serde(default = "default_bind")]
    pub bind: String,
}

fn default_bind() -> String {
    "127.0.0.1:0".into()
}

/// A run whose rollouts are multi-turn episodes against an environment (the run spec's `env`):
/// which environment, and the limits and reward rules of an episode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvRunSpec {
    pub env: EnvSpec,
    #[serde(default = "default_max_turns")]
    pub max_turns: usize,
    #[serde(default = "default_turn_timeout_s")]
    pub turn_timeout_s: f64,
    #[serde(default = "default_episode_timeout_s")]
    pub episode_timeout_s: f64,
    /// Environment calls in flight at once.
    #[serde(default = "default_concurrency")]
    pub concurrency: usize,
    #[serde(default)]
    pub tool_format: ToolFormat,
    #[serde(default)]
    pub reward: RewardMode,
    #[serde(default)]
    pub on_env_error: OnEnvError,
    /// The TITO rule of each episode's session (`linear` unless the recipe's `tito` says).
    #[serde(default)]
    pub session: Rule,
    /// Compact a full context to the first observation and the last this many turns, instead of
    /// ending the episode (`None`). Needs `session = branching`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compact_keep_turns: Option<usize>,
    /// The reward at or above which an episode counts as solved (`env_reward.solved_at`):
    /// held-out `eval/accuracy` and `rollout/solved_frac`.
    #[serde(default = "default_solved_at", skip_serializing_if = "is_default_solved_at")]
    pub solved_at: f64,
    /// What the first turn is shown of a data row whose prompt is a chat (`env_reward.prompt`).
    #[serde(default, skip_serializing_if = "EpisodePrompt::is_default")]
    pub prompt: EpisodePrompt,
}

fn default_solved_at() -> f64 {
    1.0
}
fn is_default_solved_at(x: &f64) -> bool {
    *x == 1.0
}

impl super::RunSpec {
    /// The reward at or above which a sample counts as solved: the environment's `solved_at`
    /// in a run of episodes, else 1 (an exact answer).
    pub fn solved_at(&self) -> f64 {
        self.env.as_ref().map_or(1.0, |e| e.solved_at)
    }

    /// The success rule in words, as the console and `miles report` print it.
    pub fn solved_rule(&self) -> String {
        match &self.env {
            Some(e) => format!("solved: episode reward >= {} (env_reward.solved_at)", figure(e.solved_at)),
            None => "solved: reward >= 1".into(),
        }
    }
}

/// The share of `rewards` at or above `at`: held-out success and `rollout/solved_frac`.
pub fn solved_frac(rewards: impl IntoIterator<Item = f64>, at: f64) -> f64 {
    let (mut n, mut solved) = (0usize, 0usize);
    for r in rewards {
        n += 1;
        solved += usize::from(r >= at);
    }
    solved as f64 / n.max(1) as f64
}

/// A threshold as a recipe writes it: 1, 0.5.
fn figure(x: f64) -> String {
    let t = format!("{x:.4}");
    t.trim_end_matches('0').trim_end_matches('.').to_string()
}

fn default_max_turns() -> usize {
    4
}
fn default_turn_timeout_s() -> f64 {
    30.0
}
fn default_episode_timeout_s() -> f64 {
    600.0
}
fn default_concurrency() -> usize {
    16
}

impl EnvRunSpec {
    /// Checks the episode settings, and returns the turn and the episode timeouts: every error
    /// the episode driver's limits (`env::spec`) can give, so a spec validates without them.
    pub(crate) fn timeouts(&self) -> Result<(Duration, Duration), RunError> {
        let secs = |name: &str, s: f64| {
            std::time::Duration::try_from_secs_f64(s).ok().filter(|d| !d.is_zero()).ok_or_else(|| {
                RunError::new(
                    crate::E_SPEC,
                    format!("run spec field `env.{name}`: must be a positive number of seconds"),
                )
            })
        };
        if self.max_turns == 0 || self.concurrency == 0 {
            return Err(RunError::new(
                crate::E_SPEC,
                "run spec field `env.max_turns`/`env.concurrency`: must be at least 1",
            ));
        }
        if self.compact_keep_turns.is_some() && self.session != Rule::Branching {
            return Err(RunError::new(
                crate::E_SPEC,
                "run spec field `env.compact_keep_turns`: compaction needs `env.session = branching` (a compacted context does not extend the last turn)",
            ));
        }
        Ok((secs("turn_timeout_s", self.turn_timeout_s)?, secs("episode_timeout_s", self.episode_timeout_s)?))
    }
}

/// The built-in `calculator` environment's settings (`env::calculator`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CalculatorSpec {
    /// Digits of each operand of a generated question (1..=6).
    pub digits: u32,
    /// Reward of each well-formed tool call (0 = only the answer counts).
    pub tool_reward: f32,
    /// Share of the demonstrations that call the tool; the others answer at once (right, as if
    /// by heart). A policy that cannot multiply then learns from RL that the tool pays.
    pub demo_tool_rate: f32,
}

impl Default for CalculatorSpec {
    fn default() -> Self {
        CalculatorSpec { digits: 2, tool_reward: 0.0, demo_tool_rate: 1.0 }
    }
}

/// A `jsonl` environment: the user's program (`env::jsonl`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonlSpec {
    pub name: String,
    /// Program and arguments, not through a shell: `["python3", "env.py"]`.
    #[serde(rename = "command")]
    pub argv: Vec<String>,
    #[serde(default)]
    pub cwd: Option<PathBuf>,
    /// Names of the run's environment variables the program also gets (`child::ChildEnv`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pass_env: Vec<String>,
}

/// An `openenv` environment: an HTTP service speaking OpenEnv's protocol (`env::openenv`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenEnvSpec {
    pub name: String,
    /// Base URL of the server: `http://host:port` or `https://...` (`ws://` and `wss://` are
    /// accepted too).
    pub url: String,
    /// Field of the action object the model's text goes in (`None`: the first tool call's
    /// arguments are the action).
    #[serde(default)]
    pub action_field: Option<String>,
    /// Field of the observation object shown to the model (`None`: its only string field, else
    /// the object as JSON).
    #[serde(default)]
    pub observation_field: Option<String>,
}

/// The format of the tool calls the episode driver parses from the model's output (`env::tools`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolFormat {
    /// `<tool>name args</tool>`; the arguments are the text after the name.
    #[default]
    Tag,
    /// `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Qwen2.5/Qwen3, Hermes).
    Hermes,
}

/// How an episode's reward is made from the environment's per-step rewards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RewardMode {
    /// The last reward the environment gave (0 when none).
    #[default]
    Final,
    /// The sum of every step's reward.
    Sum,
}

/// What an episode's first turn is shown when its data row's prompt is a chat (system and user
/// messages); a row with a plain string prompt shows the reset observation alone whatever this
/// says (the environment was given the string in `reset`). docs/agents.md, "The first prompt".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EpisodePrompt {
    /// The row's messages, then the reset observation as a user message.
    #[default]
    Append,
    /// The row's messages with its last user message's content replaced by the observation.
    Replace,
    /// The reset observation alone, as the only user message (the row is the environment's).
    ObservationOnly,
}

impl EpisodePrompt {
    pub fn is_default(&self) -> bool {
        *self == EpisodePrompt::Append
    }

    /// The recipe's name of it (`env_reward.prompt`).
    pub fn name(self) -> &'static str {
        match self {
            EpisodePrompt::Append => "append",
            EpisodePrompt::Replace => "replace",
            EpisodePrompt::ObservationOnly => "observation_only",
        }
    }
}

/// What an episode ended by an environment fault trains on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnEnvError {
    /// Leaves the batch (its group keeps the others).
    #[default]
    Drop,
    /// Trains on the reward so far (0 under `final` when none came).
    Score,
}

/// The TITO rule of an episode's session (`session`): `linear` (one growing context) or
/// `branching` (a turn attaches to the deepest checkpoint whose message path is a prefix).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Rule {
    #[default]
    Linear,
    Branching,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue #42: "solved" was reward >= 1 with no setting; an environment whose rewards never
    /// reach 1 showed 0% forever. The rule is `env_reward.solved_at`, 1 by default.
    #[test]
    fn the_success_rule_is_a_setting_with_a_stated_default() {
        let json = r#"{"env": {"type": "calculator"}}"#;
        let e: EnvRunSpec = serde_json::from_str(json).unwrap();
        assert_eq!(e.solved_at, 1.0);
        // The default is not written, so a spec without the setting reads as before.
        assert!(!serde_json::to_string(&e).unwrap().contains("solved_at"));
        let e: EnvRunSpec = serde_json::from_str(r#"{"env": {"type": "calculator"}, "solved_at": 0.5}"#).unwrap();
        assert_eq!(e.solved_at, 0.5);
        // Echo rewards of 0.3 and 0.8: none reaches 1, one reaches 0.5.
        assert_eq!(solved_frac([0.3, 0.8], 1.0), 0.0);
        assert_eq!(solved_frac([0.3, 0.8], e.solved_at), 0.5);
        assert_eq!(solved_frac([], 1.0), 0.0);
    }
}
