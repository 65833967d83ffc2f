//! A data-parallel trainer's rows of "Plan vs actual" (docs/plan.md, "Data-parallel embedded
//! trainers"): the collectives per step, planned against the mean of the run's
//! `perf/collective_s`, and each trainer rank's peak RSS against the plan's memory per rank. The
//! controller's `perf/peak_rss_bytes` is not a rank's: the ranks are worker processes of their
//! own, which report their peaks (VmHWM) through the trainer's statistics.

use super::Run;
use serde_json::Value;

/// The run's column of each rank's peak RSS so far, and of the largest (engine/runtime's
/// `insert_perf`).
const RANK_RSS_MAX: &str = "perf/rank_peak_rss_bytes_max";
const RANK_RSS: &str = "perf/rank_peak_rss_bytes/";
/// Seconds of a trainer call in collectives, the slowest rank's.
const COLLECTIVE_S: &str = "perf/collective_s";
/// The ranks' skew: time at the barrier before each exchange, which the plan does not model.
const WAIT_S: &str = "perf/rank_wait_s";

/// The plan's per-rank memory row of a data-parallel trainer: its per-rank total, ranks and ZeRO.
fn rank_row(plan: &Value) -> Option<(f64, u64, String)> {
    plan.get("memory")?.as_array()?.iter().find_map(|m| {
        let r = m.get("ranks").filter(|r| r.is_object())?;
        let zero = r.get("zero").and_then(|z| z.as_str()).unwrap_or("none").to_string();
        Some((m.get("total")?.as_f64()?, r.get("ranks")?.as_u64()?, zero))
    })
}

/// Whether a `memory` row of the plan is a data-parallel trainer rank's (a process of its own,
/// not the one `perf/peak_rss_bytes` measures).
pub(super) fn is_rank_row(m: &Value) -> bool {
    m.get("ranks").is_some_and(|r| r.is_object())
}

/// The rows, empty when neither the plan nor the run is data-parallel.
pub(super) fn rank_rows(plan: &Value, run: &Run) -> String {
    let planned = rank_row(plan);
    let collective_plan = plan.pointer("/step/data_parallel/collective_s").and_then(|v| v.as_f64());
    let col = |k: &str| run.series.get(k).map(|s| s.iter().map(|p| p.1).collect::<Vec<_>>()).unwrap_or_default();
    let collective = col(COLLECTIVE_S);
    let rank_max = col(RANK_RSS_MAX).into_iter().reduce(f64::max);
    if planned.is_none() && collective_plan.is_none() && collective.is_empty() && rank_max.is_none() {
        return String::new();
    }
    let ms = |x: Option<f64>| x.map(|v| format!("{:.2} ms", v * 1e3)).unwrap_or_else(|| "-".into());
    let mb = |x: Option<f64>| x.map(|v| format!("{:.1} MB", v / 1e6)).unwrap_or_else(|| "-".into());
    let ratio = |m: Option<f64>, p: Option<f64>| match (m, p) {
        (Some(m), Some(p)) if p > 0.0 && (m / p).is_finite() => format!("x{:.2}", m / p),
        _ => "-".into(),
    };
    let what = planned.as_ref().map_or_else(String::new, |(_, n, z)| format!(", {n} ranks, zero = {z}"));
    let mean = (!collective.is_empty()).then(|| collective.iter().sum::<f64>() / collective.len() as f64);
    let mut s = format!(
        "| collectives per step (mean{what}) | {} | {} | {} |\n",
        ms(collective_plan),
        ms(mean),
        ratio(mean, collective_plan)
    );
    let wait = col(WAIT_S);
    if !wait.is_empty() {
        let w = wait.iter().sum::<f64>() / wait.len() as f64;
        s.push_str(&format!(
            "| waiting for the slowest rank per step (mean; not planned) | - | {} | - |\n",
            ms(Some(w))
        ));
    }
    let per_rank = planned.as_ref().map(|p| p.0);
    s.push_str(&format!(
        "| peak RSS per trainer rank (the largest) | {} | {} | {} |\n",
        mb(per_rank),
        mb(rank_max),
        ratio(rank_max, per_rank)
    ));
    // Each rank apart: under ZeRO-1 rank 0 also gathers the moments while it writes a checkpoint.
    let ranks = planned.as_ref().map_or(0, |p| p.1);
    let seen = run.series.keys().filter_map(|k| k.strip_prefix(RANK_RSS)?.parse::<u64>().ok()).max();
    for r in 0..ranks.max(seen.map_or(0, |m| m + 1)) {
        let peak = col(&format!("{RANK_RSS}{r}")).into_iter().reduce(f64::max);
        s.push_str(&format!(
            "| peak RSS, trainer rank {r} | {} | {} | {} |\n",
            mb(per_rank),
            mb(peak),
            ratio(peak, per_rank)
        ));
    }
    s.push_str("(data-parallel: the plan prices the bytes of a rollout step's collectives, the gradients' all-reduce and ZeRO-1's broadcast, at c10d's bus bandwidth; the run measures a rank's time inside them (the statistics' reduction too), the largest over ranks, its wait for the slowest rank apart (a barrier before each exchange); peak RSS per rank is each trainer process's VmHWM; the controller's memory row leaves the ranks out)\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn plan() -> Value {
        serde_json::json!({
            "format_version": 2,
            "cluster": {"host": "laptop"},
            "memory": [{"device": "laptop", "total": 2e8,
                        "ranks": {"ranks": 2, "zero": "optimizer", "all_ranks": 4e8}}],
            "step": {"rollout_s": 1.0, "train_s": 1.0, "sync_s": 0.0, "step": {"seconds": 2.0},
                     "data_parallel": {"collective_s": 0.002}},
        })
    }

    /// The mean of the run's collectives against the plan's, each rank's peak against the plan's
    /// per-rank total, and the largest.
    #[test]
    fn collectives_and_rank_peaks_beside_the_plan() {
        let mut series = BTreeMap::new();
        series.insert(COLLECTIVE_S.to_string(), vec![(1.0, 0.003), (2.0, 0.005)]);
        series.insert(RANK_RSS_MAX.to_string(), vec![(1.0, 2.1e8), (2.0, 2.4e8)]);
        series.insert(format!("{RANK_RSS}0"), vec![(1.0, 2.1e8), (2.0, 2.4e8)]);
        series.insert(format!("{RANK_RSS}1"), vec![(1.0, 1.9e8), (2.0, 2.0e8)]);
        let run = Run { label: "a".into(), series, skipped: vec![] };
        let t = rank_rows(&plan(), &run);
        assert!(
            t.contains("| collectives per step (mean, 2 ranks, zero = optimizer) | 2.00 ms | 4.00 ms | x2.00 |"),
            "{t}"
        );
        assert!(t.contains("| peak RSS per trainer rank (the largest) | 200.0 MB | 240.0 MB | x1.20 |"), "{t}");
        assert!(t.contains("| peak RSS, trainer rank 0 | 200.0 MB | 240.0 MB | x1.20 |"), "{t}");
        assert!(t.contains("| peak RSS, trainer rank 1 | 200.0 MB | 200.0 MB | x1.00 |"), "{t}");
        // The controller's row leaves the rank out: only the host's other rows are its.
        assert!(is_rank_row(&plan()["memory"][0]));
        // Through the whole table: the controller's memory row has no plan to set against.
        let whole = super::super::plan_vs_actual("a", &plan(), &run);
        assert!(whole.contains("| memory (plan vs peak RSS) | - | - | - |"), "{whole}");
        assert!(whole.contains("| peak RSS, trainer rank 1 |"), "{whole}");
    }

    /// A run without the ranks' columns shows "-" measured; a plan and a run without data
    /// parallelism add no rows.
    #[test]
    fn missing_columns_and_single_process_runs() {
        let run = Run { label: "a".into(), series: BTreeMap::new(), skipped: vec![] };
        let t = rank_rows(&plan(), &run);
        assert!(t.contains("| collectives per step (mean, 2 ranks, zero = optimizer) | 2.00 ms | - | - |"), "{t}");
        assert!(t.contains("| peak RSS, trainer rank 1 | 200.0 MB | - | - |"), "{t}");
        let one = serde_json::json!({"format_version": 2, "memory": [{"device": "laptop", "total": 2e8}]});
        assert_eq!(rank_rows(&one, &run), "");
        assert!(!is_rank_row(&one["memory"][0]));
    }
}
