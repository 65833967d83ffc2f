//! What a plug-in layer's program reported beside an episode's reward (its `metrics` and
//! `metadata`), and the step's `agent/<name>` columns read from it. Here, below `agent`, because
//! an `EpisodeResult` carries it and the episode metrics write it (docs/agents.md).

use super::episode::EpisodeResult;

/// Most `agent/<name>` columns a step's metrics row gets; names past it (in name order) are
/// counted in `rollout/agent_metrics_dropped` rather than written.
pub const MAX_STEP_METRICS: usize = 64;

/// What an episode keeps of its answer beside the reward (`EpisodeResult::reported`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Reported {
    pub metrics: Vec<(String, f64)>,
    pub metadata: Option<serde_json::Value>,
}

/// The step's `agent/<name>` columns: each metric's mean over the episodes that reported it
/// (a faulted episode reports none), at most [`MAX_STEP_METRICS`] names in name order, the
/// number of names past them as `rollout/agent_metrics_dropped`. Empty when no program reported.
pub fn metrics(results: &[EpisodeResult]) -> Vec<(String, f64)> {
    let mut count: std::collections::BTreeMap<&str, usize> = Default::default();
    let reported = || results.iter().filter_map(|r| r.reported.as_deref()).flat_map(|p| p.metrics.iter());
    for (name, _) in reported() {
        *count.entry(name).or_default() += 1;
    }
    let mut mean: std::collections::BTreeMap<&str, f64> = Default::default();
    for (name, x) in reported() {
        // Each term divided first: the mean of finite numbers stays finite (a sum may not).
        *mean.entry(name).or_default() += x / count[name.as_str()] as f64;
    }
    let dropped = mean.len().saturating_sub(MAX_STEP_METRICS);
    let mut m: Vec<(String, f64)> =
        mean.into_iter().take(MAX_STEP_METRICS).map(|(n, x)| (format!("agent/{n}"), x)).collect();
    if dropped > 0 {
        m.push(("rollout/agent_metrics_dropped".into(), dropped as f64));
    }
    m
}
