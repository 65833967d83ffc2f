//! Which environment a run uses, as the run spec names it, and building it.

use super::calculator::CalculatorSpec;
use super::jsonl::JsonlSpec;
use super::openenv::OpenEnvSpec;
use super::{Calculator, Environment, JsonlEnv, OpenEnv};
use crate::RunError;

#[derive(Debug, Clone, PartialEq)]
pub enum EnvSpec {
    Calculator(CalculatorSpec),
    Jsonl(JsonlSpec),
    OpenEnv(OpenEnvSpec),
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
