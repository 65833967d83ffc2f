//! What a step's environment faults were, told honestly: how many of its episodes faulted, why
//! (each reason with its count and the first message, which for a crashed program quotes its
//! stderr), and what the recipe's `on_env_error` did with them. The console's warning line, the
//! headline reward's note and the metrics row's `rollout/faulted*` columns are all read from one
//! [`Faults`], so they cannot disagree. See docs/agents.md, "In a run".

use super::episode::{EpisodeResult, OnEnvError};
use super::EndReason;
use crate::quote::truncate;
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// The longest first message quoted per reason (a crash's message carries a stderr tail).
const QUOTE: usize = 300;

/// A step's (or a run of groups') episodes as the fault policy saw them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Faults {
    pub episodes: usize,
    /// Episodes that ended by an environment fault.
    pub faulted: usize,
    /// Of those, the ones left out of training (`on_env_error = drop`).
    pub dropped: usize,
    /// Per fault reason: its episodes and the first one's message.
    pub reasons: BTreeMap<EndReason, (usize, String)>,
    pub policy: OnEnvError,
}

impl Faults {
    pub fn new(policy: OnEnvError) -> Faults {
        Faults { policy, ..Faults::default() }
    }

    pub fn of(results: &[EpisodeResult], policy: OnEnvError) -> Faults {
        let mut f = Faults::new(policy);
        for r in results {
            f.count(r);
        }
        f
    }

    /// Adds one finished episode.
    pub fn count(&mut self, r: &EpisodeResult) {
        self.episodes += 1;
        if !r.end.is_fault() {
            return;
        }
        self.faulted += 1;
        if r.training_reward(self.policy).is_none() {
            self.dropped += 1;
        }
        let e = self.reasons.entry(r.end).or_insert((0, String::new()));
        e.0 += 1;
        if e.1.is_empty() {
            e.1 = r.fault.clone().unwrap_or_default();
        }
    }

    /// Adds `other`'s episodes (a run has one fault policy: `other`'s is kept).
    pub fn merge(&mut self, other: &Faults) {
        self.policy = other.policy;
        self.episodes += other.episodes;
        self.faulted += other.faulted;
        self.dropped += other.dropped;
        for (reason, (n, first)) in &other.reasons {
            let e = self.reasons.entry(*reason).or_insert((0, String::new()));
            e.0 += n;
            if e.1.is_empty() {
                e.1 = first.clone();
            }
        }
    }

    /// `env_crashed 57: "exited (status 3); stderr ends: ..."; env_timeout 2: "..."`.
    pub fn reasons_text(&self) -> String {
        let quoted = |s: &str| if s.is_empty() { String::new() } else { format!(": {:?}", truncate(s, QUOTE)) };
        let parts: Vec<String> =
            self.reasons.iter().map(|(r, (n, first))| format!("{} {n}{}", r.name(), quoted(first))).collect();
        parts.join("; ")
    }

    /// What the fault policy did with the faulted episodes.
    fn policy_text(&self) -> String {
        match self.policy {
            OnEnvError::Drop => "dropped from training (on_env_error = drop)".into(),
            OnEnvError::Score if self.dropped > 0 => format!(
                "trained on the reward each had so far, {} with no turn to train on left out (on_env_error = score)",
                self.dropped
            ),
            OnEnvError::Score => "trained on the reward each had so far (on_env_error = score)".into(),
        }
    }

    /// The console's warning line for `what` (`step 3`), when any episode faulted.
    pub fn warning(&self, what: &str) -> Option<String> {
        (self.faulted > 0).then(|| {
            format!(
                "{what}: {} of {} episodes faulted ({}); {}",
                self.faulted,
                self.episodes,
                self.reasons_text(),
                self.policy_text()
            )
        })
    }

    /// Said after the headline reward (`reward 1.000 over 7 trained, 57 dropped`), so that a mean
    /// over the survivors is never shown as the step's; empty when nothing faulted.
    pub fn reward_note(&self) -> String {
        if self.faulted == 0 {
            return String::new();
        }
        match self.dropped {
            0 => format!(" over {} episodes, {} faulted", self.episodes, self.faulted),
            d => format!(" over {} trained, {d} dropped", self.episodes - d),
        }
    }

    /// The metrics row's columns: `rollout/episodes`, `rollout/faulted` and `rollout/dropped`,
    /// `rollout/faulted_frac` (of the step's episodes), and `rollout/faults` (the reasons with
    /// their first messages, text; only when something faulted).
    pub fn columns(&self) -> Vec<(String, Value)> {
        let mut c = vec![
            ("rollout/episodes".to_string(), json!(self.episodes)),
            ("rollout/faulted".to_string(), json!(self.faulted)),
            ("rollout/dropped".to_string(), json!(self.dropped)),
            ("rollout/faulted_frac".to_string(), json!(self.faulted as f64 / self.episodes.max(1) as f64)),
        ];
        if self.faulted > 0 {
            c.push(("rollout/faults".to_string(), json!(self.reasons_text())));
        }
        c
    }

    /// The reasons, without their messages (what the console's rate limit compares).
    pub fn kinds(&self) -> Vec<EndReason> {
        self.reasons.keys().copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::Task;
    use crate::session::{Rule, Session};

    fn result(end: EndReason, fault: Option<&str>, reward: f32) -> EpisodeResult {
        EpisodeResult {
            task: Task { episode: "e".into(), prompt: Value::Null, label: Value::Null, metadata: Value::Null, seed: 0 },
            session: Session::new(Rule::Linear),
            reward,
            end,
            fault: fault.map(str::to_string),
            turns: 1,
            tool_calls: 0,
            bad_tool_calls: 0,
            observation_tokens: 0,
            retokenize_mismatch: 0,
            compactions: 0,
            reported: None,
        }
    }

    /// The newcomer's case (issue #41): 57 of 64 episodes crashed, the survivors all solved.
    fn crashed_57_of_64(policy: OnEnvError) -> Faults {
        let mut rs: Vec<EpisodeResult> =
            (0..57).map(|_| result(EndReason::EnvCrashed, Some("exited (status 3); stderr ends: boom"), 0.0)).collect();
        rs.extend((0..7).map(|_| result(EndReason::Done, None, 1.0)));
        Faults::of(&rs, policy)
    }

    #[test]
    fn the_warning_names_the_share_the_reason_and_the_policy() {
        let f = crashed_57_of_64(OnEnvError::Drop);
        assert_eq!(
            f.warning("step 3").unwrap(),
            "step 3: 57 of 64 episodes faulted (env_crashed 57: \"exited (status 3); stderr ends: boom\"); \
             dropped from training (on_env_error = drop)"
        );
        assert_eq!(f.reward_note(), " over 7 trained, 57 dropped");
        let s = crashed_57_of_64(OnEnvError::Score);
        assert!(s.warning("step 3").unwrap().ends_with("trained on the reward each had so far (on_env_error = score)"));
        assert_eq!(s.reward_note(), " over 64 episodes, 57 faulted");
        let clean = Faults::of(&[result(EndReason::Done, None, 1.0)], OnEnvError::Drop);
        assert_eq!((clean.warning("step 1"), clean.reward_note()), (None, String::new()));
    }

    #[test]
    fn columns_and_merging_count_every_episode() {
        let mut f = crashed_57_of_64(OnEnvError::Drop);
        let mut other = Faults::new(OnEnvError::Drop);
        other.count(&result(EndReason::EnvTimeout, Some("no answer within 1.0s"), 0.0));
        f.merge(&other);
        let cols: BTreeMap<String, Value> = f.columns().into_iter().collect();
        assert_eq!(cols["rollout/faulted"], json!(58));
        assert_eq!(cols["rollout/dropped"], json!(58));
        assert_eq!(cols["rollout/faulted_frac"], json!(58.0 / 65.0));
        assert_eq!(
            cols["rollout/faults"],
            json!("env_timeout 1: \"no answer within 1.0s\"; env_crashed 57: \"exited (status 3); stderr ends: boom\"")
        );
        assert!(cols["rollout/faults"].as_str().unwrap().contains("env_crashed 57"), "{cols:?}");
        assert_eq!(f.kinds(), vec![EndReason::EnvTimeout, EndReason::EnvCrashed]);
    }
}
