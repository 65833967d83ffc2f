//! Which environment a run uses, as the run spec names it (`spec::env`), and building it.

pub use crate::spec::env::{EnvRunSpec, EnvSpec, ExternalSpec, ProgramSpec};

use super::{Calculator, Environment, JsonlEnv, OpenEnv};
use crate::RunError;

impl EnvRunSpec {
    /// The episode driver's limits; `max_context` is the model's longest sequence.
    pub fn limits(&self, max_context: usize) -> Result<super::EpisodeLimits, RunError> {
        let (turn_timeout, episode_timeout) = self.timeouts()?;
        Ok(super::EpisodeLimits {
            max_turns: self.max_turns,
            turn_timeout,
            episode_timeout,
            max_context,
            concurrency: self.concurrency,
            tool_format: self.tool_format,
            reward: self.reward,
            on_env_error: self.on_env_error,
            rule: self.session,
            compact: self.compact_keep_turns,
            prompt: self.prompt,
            // The rollout's `max_prompt_tokens` is the run's, set by `EnvRunner::for_run`.
            max_prompt: None,
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
            // The plug-in layers are no environment the episode driver steps: `run::step::episodes`
            // plays them through `agent`; reaching here is a bug.
            EnvSpec::AgentProgram(_) | EnvSpec::RolloutProgram(_) | EnvSpec::ExternalAgents(_) => {
                return Err(RunError::internal(
                    "a plug-in layer (agent_program, rollout_program, external_agents) is played by its programs, not stepped as an environment",
                ))
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::env::{CalculatorSpec, JsonlSpec, OpenEnvSpec};

    #[test]
    fn builds_each_kind() {
        assert_eq!(EnvSpec::Calculator(CalculatorSpec::default()).build().unwrap().name(), "calculator");
        let j = JsonlSpec { name: "j".into(), argv: vec!["python3".into()], cwd: None, pass_env: vec![] };
        assert_eq!(EnvSpec::Jsonl(j).build().unwrap().name(), "j");
        let o = OpenEnvSpec {
            name: "o".into(),
            url: "http://127.0.0.1:1".into(),
            action_field: None,
            observation_field: None,
        };
        assert_eq!(EnvSpec::OpenEnv(o.clone()).build().unwrap().name(), "o");
        let tls = OpenEnvSpec { url: "https://x".into(), ..o.clone() };
        assert_eq!(EnvSpec::OpenEnv(tls).build().unwrap().name(), "o");
        let bad = OpenEnvSpec { url: "ftp://x".into(), ..o };
        let e = EnvSpec::OpenEnv(bad).build().err().expect("ftp is refused");
        assert!(e.message.contains("must start with http:// or https://"), "{}", e.message);
    }
}
