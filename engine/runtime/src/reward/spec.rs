//! A reward stage as the run spec carries it (`spec::reward`), and its construction. The RunSpec
//! holds one (`reward`, a combination holding the others); the executors build it once per run and
//! call [`BatchReward::score_parts`] per batch.

pub use crate::spec::reward::RewardSpec;

use super::combine::{CombinedReward, Part};
use super::{BatchReward, CommandReward, CommandSpec, HttpReward, HttpSpec, TaskReward, Verifier, VerifierReward};
use crate::RunError;
use std::time::Duration;

fn timeout(name: &str, s: f64) -> Result<Duration, RunError> {
    Duration::try_from_secs_f64(s).ok().filter(|d| !d.is_zero()).ok_or_else(|| {
        RunError::new(
            crate::E_SPEC,
            format!("reward `{name}`: `timeout` must be a positive number of seconds, not {s}"),
        )
    })
}

impl RewardSpec {
    pub fn name(&self) -> &str {
        match self {
            RewardSpec::Verifier { name, .. }
            | RewardSpec::Command { name, .. }
            | RewardSpec::Http { name, .. }
            | RewardSpec::ExactMatch { name, .. }
            | RewardSpec::Combine { name, .. } => name,
        }
    }

    /// The reward, ready for its first batch (a command is started on that batch).
    pub fn build(&self) -> Result<Box<dyn BatchReward>, RunError> {
        Ok(match self {
            RewardSpec::Verifier { name, kind, pattern, schema, on_error } => Box::new(VerifierReward {
                name: name.clone(),
                verifier: Verifier::from_settings(kind, pattern.as_deref(), schema.clone())?,
                on_error: *on_error,
            }),
            RewardSpec::Command { name, command, cwd, timeout_s, on_error, pass_env, group } => {
                Box::new(CommandReward::new(CommandSpec {
                    name: name.clone(),
                    argv: command.clone(),
                    cwd: cwd.clone(),
                    timeout: timeout(name, *timeout_s)?,
                    on_error: *on_error,
                    pass_env: pass_env.clone(),
                    group: *group,
                })?)
            }
            RewardSpec::Http { name, url, concurrency, batch_size, timeout_s, retries, on_error, group } => {
                Box::new(HttpReward::new(HttpSpec {
                    name: name.clone(),
                    url: url.clone(),
                    concurrency: *concurrency,
                    batch_size: *batch_size,
                    timeout: timeout(name, *timeout_s)?,
                    retries: *retries,
                    on_error: *on_error,
                    group: *group,
                })?)
            }
            RewardSpec::ExactMatch { partial_credit, .. } => Box::new(TaskReward { partial_credit: *partial_credit }),
            RewardSpec::Combine { name, parts, weights } => {
                if parts.len() != weights.len() {
                    return Err(RunError::new(
                        crate::E_SPEC,
                        format!("reward `{name}`: {} parts but {} weights", parts.len(), weights.len()),
                    ));
                }
                let parts = parts
                    .iter()
                    .zip(weights)
                    .map(|(p, &weight)| Ok(Part { name: p.name().to_string(), reward: p.build()?, weight }))
                    .collect::<Result<Vec<_>, RunError>>()?;
                Box::new(CombinedReward::new(name, parts)?)
            }
        })
    }
}

/// The reward of a run: its reward stage, else the task's exact match. Each executor (and each
/// evaluation thread) builds its own: a command reward is one process per caller.
pub fn build_run_reward(spec: &crate::RunSpec) -> Result<Box<dyn BatchReward>, RunError> {
    match &spec.reward {
        Some(r) => r.build(),
        None => Ok(Box::new(super::TaskReward { partial_credit: spec.task.partial_credit })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reward::{input, OnRewardError, RewardOutcome};
    use serde_json::json;

    #[test]
    fn specs_from_json_with_defaults() {
        let specs: Vec<RewardSpec> = serde_json::from_value(json!([
            {"type": "verifier", "name": "math", "kind": "math", "on_error": "zero"},
            {"type": "command", "name": "judge", "command": ["python3", "v.py"]},
            {"type": "http", "name": "rm", "url": "http://127.0.0.1:9/score", "retries": 0}
        ]))
        .unwrap();
        assert_eq!(
            specs[2],
            RewardSpec::Http {
                name: "rm".into(),
                url: "http://127.0.0.1:9/score".into(),
                concurrency: 8,
                batch_size: 32,
                timeout_s: 60.0,
                retries: 0,
                on_error: OnRewardError::Stop,
                group: false,
            }
        );
        let mut built: Vec<_> = specs.iter().map(|s| s.build().unwrap()).collect();
        assert_eq!(built.iter().map(|b| b.name().to_string()).collect::<Vec<_>>(), ["math", "judge", "rm"]);
        assert_eq!(
            built[0].score_batch(&[input("a", "\\boxed{2}", json!(2))]).unwrap(),
            vec![RewardOutcome::Score(1.0)]
        );
        let bad = RewardSpec::Command {
            name: "judge".into(),
            command: vec!["x".into()],
            cwd: None,
            timeout_s: -1.0,
            on_error: OnRewardError::Stop,
            pass_env: vec![],
            group: false,
        };
        assert_eq!(
            bad.build().err().unwrap().message,
            "reward `judge`: `timeout` must be a positive number of seconds, not -1"
        );
    }
}
