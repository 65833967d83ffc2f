//! Which environment a run uses, as the run spec names it, and building it.

use super::calculator::CalculatorSpec;
use super::jsonl::JsonlSpec;
use super::openenv::OpenEnvSpec;
use super::{Calculator, Environment, JsonlEnv, OpenEnv};
use crate::RunError;

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EnvSpec {
    Calculator(CalculatorSpec),
    Jsonl(JsonlSpec),
    #[serde(rename = "openenv")]
    OpenEnv(OpenEnvSpec),
}

/// A run whose rollouts are multi-turn episodes against an environment (the run spec's `env`):
/// which environment, and the limits and reward rules of an episode.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
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
    pub tool_format: super::ToolFormat,
    #[serde(default)]
    pub reward: super::RewardMode,
    #[serde(default)]
    pub on_env_error: super::OnEnvError,
    /// The TITO rule of each episode's session (`linear` unless the recipe's `tito` says).
    #[serde(default)]
    pub session: crate::session::Rule,
    /// Compact a full context to the first observation and the last this many turns, instead of
    /// ending the episode (`None`). Needs `session = branching`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compact_keep_turns: Option<usize>,
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
    /// The episode driver's limits; `max_context` is the model's longest sequence.
    pub fn limits(&self, max_context: usize) -> Result<super::EpisodeLimits, RunError> {
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
        if self.compact_keep_turns.is_some() && self.session != crate::session::Rule::Branching {
            return Err(RunError::new(
                crate::E_SPEC,
                "run spec field `env.compact_keep_turns`: compaction needs `env.session = branching` (a compacted context does not extend the last turn)",
            ));
        }
        Ok(super::EpisodeLimits {
            max_turns: self.max_turns,
            turn_timeout: secs("turn_timeout_s", self.turn_timeout_s)?,
            episode_timeout: secs("episode_timeout_s", self.episode_timeout_s)?,
            max_context,
            concurrency: self.concurrency,
            tool_format: self.tool_format,
            reward: self.reward,
            on_env_error: self.on_env_error,
            rule: self.session,
            compact: self.compact_keep_turns,
        })
    }

    /// Characters a character-level tokenizer needs for this environment's observations.
    pub fn alphabet(&self) -> &'static str {
        match self.env {
            EnvSpec::Calculator(_) => super::calculator::ALPHABET,
            _ => "",
        }
    }
}

impl EnvSpec {
    /// The environment, ready for episodes (an external program starts on its first call).
    pub fn build(&self) -> Result<Box<dyn Environment>, RunError> {
        Ok(match self {
            EnvSpec::Calculator(s) => Box::new(Calculator::new(s.clone())),
            EnvSpec::Jsonl(s) => Box::new(JsonlEnv::new(s.clone())?),
            EnvSpec::OpenEnv(s) => Box::new(OpenEnv::new(s.clone())?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_each_kind() {
        assert_eq!(EnvSpec::Calculator(CalculatorSpec::default()).build().unwrap().name(), "calculator");
        let j = JsonlSpec { name: "j".into(), argv: vec!["python3".into()], cwd: None };
        assert_eq!(EnvSpec::Jsonl(j).build().unwrap().name(), "j");
        let o = OpenEnvSpec {
            name: "o".into(),
            url: "http://127.0.0.1:1".into(),
            action_field: None,
            observation_field: None,
        };
        assert_eq!(EnvSpec::OpenEnv(o.clone()).build().unwrap().name(), "o");
        let bad = OpenEnvSpec { url: "https://x".into(), ..o };
        let e = EnvSpec::OpenEnv(bad).build().err().expect("https is refused");
        assert!(e.message.contains("https is not supported"), "{}", e.message);
    }
}
