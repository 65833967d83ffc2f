//! The plan's Evidence section: every estimate grouped by what it rests on, and the line that
//! counts them (docs/plan.md, "Evidence").

use crate::evidence::{self, EvidenceKind};
use crate::output::Plan;
use std::fmt::Write;

/// Estimates of one kind and source, in the order the plan prints them.
pub(crate) fn groups(p: &Plan) -> Vec<(EvidenceKind, String, Vec<String>)> {
    let mut out: Vec<(EvidenceKind, String, Vec<String>)> = Vec::new();
    for (name, e) in evidence::of_plan(p) {
        match out.iter_mut().find(|(k, s, _)| *k == e.kind && *s == e.source) {
            Some(g) => g.2.push(name),
            None => out.push((e.kind, e.source.clone(), vec![name])),
        }
    }
    // Strongest first, as the summary counts them; stable within a kind.
    out.sort_by_key(|(k, _, _)| EvidenceKind::ALL.iter().position(|x| x == k));
    out
}

pub(super) fn evidence_section(o: &mut String, p: &Plan) {
    let Some(summary) = evidence::summary(p) else { return };
    let _ = writeln!(o, "\nEvidence (what each estimate rests on)");
    for (kind, source, names) in groups(p) {
        let _ = writeln!(o, "  {:13}  {}: {source}", kind.label(), names.join(", "));
    }
    let _ = writeln!(o, "  {summary}");
}
