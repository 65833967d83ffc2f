//! Environments of multi-turn (agentic) episodes: `reset(task) -> observation`, then
//! `step(action) -> observation, reward?, terminated/truncated` until the episode ends. Built-in
//! ones in Rust (`calculator`), an external program speaking JSON lines over stdin/stdout
//! (`jsonl`), and an HTTP service speaking OpenEnv's protocol (`openenv`). `episode` drives
//! episodes against one: turn limits, timeouts, concurrency, tool calls parsed from the model's
//! output (`tools`), and the TITO session (crate::session) that keeps the token ids as sampled.
//! An environment's fault ends its episode with an [`EndReason`], never the run. See
//! docs/agents.md.

pub mod calculator;
pub mod demo;
pub mod episode;
pub mod faults;
pub mod jsonl;
pub mod openenv;
pub mod reported;
pub mod spec;
pub mod tools;
mod ws;

pub use calculator::Calculator;
pub use episode::{
    run_episodes, Episode, EpisodeLimits, EpisodePrompt, EpisodeResult, OnEnvError, RewardMode, TurnSample,
};
pub use jsonl::JsonlEnv;
pub use openenv::OpenEnv;
pub use spec::EnvSpec;
pub use tools::{ToolCall, ToolFormat};

use serde::Serialize;
use std::fmt;
use std::time::Duration;

/// What `reset` is given: one row of the data set.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Task {
    /// Unique within the run (e.g. "step12/g3/s1"); the environment keys its state by it.
    pub episode: String,
    /// The prompt as the data file gave it (a string or chat messages).
    pub prompt: serde_json::Value,
    /// The label field of the row (`null` when none).
    pub label: serde_json::Value,
    /// The other fields of the row.
    pub metadata: serde_json::Value,
    /// Seed of this episode (an environment with randomness uses it).
    pub seed: u64,
}

/// The agent's action of one turn: the decoded text, and the tool calls parsed from it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Action {
    pub text: String,
    pub tool_calls: Vec<ToolCall>,
}

/// What `step` returns. `terminated`: the task reached an end (solved, failed); `truncated`: the
/// environment cut the episode short (its own step limit).
#[derive(Debug, Clone, PartialEq)]
pub struct StepResult {
    pub observation: String,
    pub reward: Option<f32>,
    pub terminated: bool,
    pub truncated: bool,
}

/// Why an environment call failed; it ends the episode with the matching reason.
#[derive(Debug, Clone, PartialEq)]
pub enum EnvFault {
    /// No answer within the turn's or the episode's deadline.
    Timeout(String),
    /// The process exited or the connection broke.
    Crashed(String),
    /// The answer was not what the protocol says.
    Malformed(String),
    /// The environment answered with an error of its own.
    Error(String),
    /// The environment refused the episode a session (an OpenEnv server at its
    /// `max_concurrent_envs`); the message names the server's cap when it said it.
    Refused(String),
}

impl EnvFault {
    pub fn reason(&self) -> EndReason {
        match self {
            EnvFault::Timeout(_) => EndReason::EnvTimeout,
            EnvFault::Crashed(_) => EndReason::EnvCrashed,
            EnvFault::Malformed(_) => EndReason::EnvMalformed,
            EnvFault::Error(_) => EndReason::EnvError,
            EnvFault::Refused(_) => EndReason::EnvRefused,
        }
    }

    pub fn what(&self) -> &str {
        match self {
            EnvFault::Timeout(s)
            | EnvFault::Crashed(s)
            | EnvFault::Malformed(s)
            | EnvFault::Error(s)
            | EnvFault::Refused(s) => s,
        }
    }
}

impl fmt::Display for EnvFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.reason().name(), self.what())
    }
}

/// An environment serving many episodes at once (each keyed by `Task::episode`): the episode
/// driver calls it from several threads. `timeout` bounds one call.
pub trait Environment: Send + Sync {
    fn name(&self) -> &str;
    /// Starts the episode; its first observation (what the model is first shown).
    fn reset(&self, task: &Task, timeout: Duration) -> Result<String, EnvFault>;
    fn step(&self, episode: &str, action: &Action, timeout: Duration) -> Result<StepResult, EnvFault>;
    /// The episode is over (ended normally or not): free its state. Best effort, never fails.
    fn close(&self, episode: &str);
    /// Keep the environment's own log (a `command_env` program's stderr) in `dir`, appended
    /// across restarts; an environment without one ignores it.
    fn keep_log_in(&self, _dir: &std::path::Path) {}
    /// The next turn of a gold episode (what an expert would say), given the observations so far
    /// (the first one, then one per earlier turn), its tool calls written in `format` (the one the
    /// episode driver parses): SFT warms a policy up on these before RL.
    /// `None`: this environment has no demonstrations.
    fn demonstrate(&self, _task: &Task, _observations: &[String], _format: ToolFormat) -> Option<String> {
        None
    }
    /// The tools this environment answers, as chat templates take them (`tools=`: a JSON list of
    /// OpenAI-style function schemas, as text so that its key order is the one rendered). With
    /// the Hermes tool format the template shows them to the model in the system turn
    /// (`tools::chat_codec`). `None`: none declared.
    fn tools(&self) -> Option<String> {
        None
    }
}

/// Why an episode ended: `rollout/episode_end/<name>` counts them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EndReason {
    /// The environment said `terminated`.
    Done,
    /// The environment said `truncated`.
    Truncated,
    /// The episode's turn limit was reached.
    MaxTurns,
    /// The model's turn hit `max_new_tokens` (a path that ended by length is not extended).
    Length,
    /// The next observation would not fit in the context.
    ContextOverflow,
    /// The episode's deadline passed.
    EpisodeTimeout,
    EnvTimeout,
    EnvCrashed,
    EnvMalformed,
    EnvError,
    /// The environment refused the episode a session (a server at its cap of sessions).
    EnvRefused,
    /// A plug-in layer's program (`agent_program`, `rollout_program`) exited non-zero or could
    /// not start.
    ProgramFailed,
    /// A program outlived the stage's `timeout`, or an outside process did not finish its
    /// session (`external_agents`) in time.
    ProgramTimeout,
    /// A program exited 0 without a finite reward on its last stdout line.
    NoReward,
}

impl EndReason {
    pub const ALL: [EndReason; 14] = [
        EndReason::Done,
        EndReason::Truncated,
        EndReason::MaxTurns,
        EndReason::Length,
        EndReason::ContextOverflow,
        EndReason::EpisodeTimeout,
        EndReason::EnvTimeout,
        EndReason::EnvCrashed,
        EndReason::EnvMalformed,
        EndReason::EnvError,
        EndReason::EnvRefused,
        EndReason::ProgramFailed,
        EndReason::ProgramTimeout,
        EndReason::NoReward,
    ];

    pub fn name(self) -> &'static str {
        match self {
            EndReason::Done => "done",
            EndReason::Truncated => "truncated",
            EndReason::MaxTurns => "max_turns",
            EndReason::Length => "length",
            EndReason::ContextOverflow => "context_overflow",
            EndReason::EpisodeTimeout => "episode_timeout",
            EndReason::EnvTimeout => "env_timeout",
            EndReason::EnvCrashed => "env_crashed",
            EndReason::EnvMalformed => "env_malformed",
            EndReason::EnvError => "env_error",
            EndReason::EnvRefused => "env_refused",
            EndReason::ProgramFailed => "program_failed",
            EndReason::ProgramTimeout => "program_timeout",
            EndReason::NoReward => "no_reward",
        }
    }

    /// The environment failed (as opposed to the episode ending by its rules or limits): the
    /// recipe's `on_env_error` decides drop or score.
    pub fn is_fault(self) -> bool {
        matches!(
            self,
            EndReason::EnvTimeout
                | EndReason::EnvCrashed
                | EndReason::EnvMalformed
                | EndReason::EnvError
                | EndReason::EnvRefused
                | EndReason::ProgramFailed
                | EndReason::ProgramTimeout
                | EndReason::NoReward
        )
    }

    /// The metric name: `rollout/episode_end/<reason>`.
    pub fn metric(self) -> String {
        format!("rollout/episode_end/{}", self.name())
    }
}
