//! The faulted episodes of a run with an environment, per step (issue #41): the share of the
//! step's episodes that faulted, how many were dropped from training, and the reasons with their
//! first messages, as metrics.jsonl's `rollout/episodes`, `rollout/faulted`, `rollout/dropped`
//! and `rollout/faults` columns hold them (docs/agents.md, "In a run"). Printed as a table and
//! written as report/faults.html.

use std::path::Path;

/// One step whose episodes faulted.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultRow {
    pub step: u64,
    pub episodes: u64,
    pub faulted: u64,
    pub dropped: u64,
    pub reasons: String,
}

/// The steps of the run in `dir` whose episodes faulted (none for a run without faults, or one
/// written before these columns).
pub fn load(dir: &Path) -> Vec<FaultRow> {
    let Ok(text) = std::fs::read_to_string(dir.join("metrics.jsonl")) else { return Vec::new() };
    let mut rows = Vec::new();
    for line in text.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        let n = |k: &str| v.get(k).and_then(serde_json::Value::as_f64).unwrap_or(0.0) as u64;
        if n("rollout/faulted") == 0 {
            continue;
        }
        rows.push(FaultRow {
            step: n("step"),
            episodes: n("rollout/episodes"),
            faulted: n("rollout/faulted"),
            dropped: n("rollout/dropped"),
            reasons: v.get("rollout/faults").and_then(serde_json::Value::as_str).unwrap_or("").to_string(),
        });
    }
    rows
}

fn share(r: &FaultRow) -> String {
    format!("{} of {} ({:.1}%)", r.faulted, r.episodes, 100.0 * r.faulted as f64 / r.episodes.max(1) as f64)
}

/// A Markdown table of the faulted steps of the run `label`; empty when none faulted.
pub fn table(label: &str, rows: &[FaultRow]) -> String {
    if rows.is_empty() {
        return String::new();
    }
    let mut s = format!(
        "\n{label}: episodes faulted at {} step(s)\n| step | faulted | dropped | reasons (first message each) |\n|---|---|---|---|\n",
        rows.len()
    );
    for r in rows {
        s.push_str(&format!("| {} | {} | {} | {} |\n", r.step, share(r), r.dropped, r.reasons.replace('|', "\\|")));
    }
    s
}

/// The HTML section of the run `label`; empty when none faulted.
pub fn section(label: &str, rows: &[FaultRow]) -> String {
    if rows.is_empty() {
        return String::new();
    }
    let esc = |s: &str| s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;");
    let mut s = format!(
        "<h2>{}</h2>\n<table>\n<tr><th>step</th><th>faulted</th><th>dropped</th><th>reasons (first message each)</th></tr>\n",
        esc(label)
    );
    for r in rows {
        s.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td><code>{}</code></td></tr>\n",
            r.step,
            esc(&share(r)),
            r.dropped,
            esc(&r.reasons)
        ));
    }
    s.push_str("</table>\n");
    s
}

/// The whole page over every run's section (`None` when no run faulted).
pub fn page(sections: &str) -> Option<String> {
    (!sections.is_empty()).then(|| {
        format!(
            "<!doctype html>\n<meta charset=\"utf-8\">\n<meta http-equiv=\"Content-Security-Policy\" content=\"script-src 'none'\">\n<title>miles report: faulted episodes</title>\n<style>body{{font-family:sans-serif}} td,th{{padding:2px 8px;text-align:left;vertical-align:top}}</style>\n<h1>Episodes that ended by an environment fault, per step</h1>\n{sections}"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faulted_steps_are_read_and_shown_with_their_reasons() {
        let dir = std::env::temp_dir().join(format!("miles-report-faults-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("metrics.jsonl"),
            concat!(
                "{\"step\":0,\"eval/accuracy\":0.5}\n",
                "{\"step\":1,\"rollout/episodes\":64,\"rollout/faulted\":57,\"rollout/dropped\":57,",
                "\"rollout/faults\":\"env_crashed 57: \\\"exited <3>|x\\\"\"}\n",
                "{\"step\":2,\"rollout/episodes\":64,\"rollout/faulted\":0,\"rollout/dropped\":0}\n",
            ),
        )
        .unwrap();
        let rows = load(&dir);
        assert_eq!(rows.len(), 1);
        let t = table("run", &rows);
        assert!(t.contains("| 1 | 57 of 64 (89.1%) | 57 | env_crashed 57: \"exited <3>\\|x\" |"), "{t}");
        let h = section("run", &rows);
        assert!(h.contains("<code>env_crashed 57: &quot;exited &lt;3&gt;|x&quot;</code>"), "{h}");
        assert!(page(&h).is_some_and(|p| p.contains("script-src 'none'")));
        assert_eq!((table("run", &[]), page("")), (String::new(), None));
        std::fs::remove_dir_all(&dir).ok();
    }
}
