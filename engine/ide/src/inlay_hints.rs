//! Inlay hints: the parameters a stage instance leaves at their defaults, and the planner's
//! memory per rank beside each training stage.

use crate::analysis::Analysis;
use miles_grammar::diag::{FileId, Span};
use miles_plan::{gb, MemoryReport, Role};

#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct InlayHint {
    /// Where the hint is drawn (after this byte).
    pub offset: u32,
    pub label: String,
    /// The full text when the label is shortened.
    pub tooltip: Option<String>,
}

/// Hints for the parameters a stage instance leaves at their defaults: one hint at the end of
/// the binding's first line, listing them with their values.
pub fn inlay_hints(a: &Analysis, file: FileId) -> Vec<InlayHint> {
    let text = a.text(file);
    let mut out: Vec<InlayHint> = Vec::new();
    for r in &a.compilation.recipes {
        for node in r.graph.nodes() {
            if node.span.file != file {
                continue;
            }
            let defaults: Vec<String> =
                node.params.iter().filter(|(_, p)| p.defaulted).map(|(k, p)| format!("{k} = {}", p.value)).collect();
            if defaults.is_empty() {
                continue;
            }
            let at = hint_offset(text, node.span);
            if out.iter().any(|h| h.offset == at as u32) {
                continue;
            }
            let full = defaults.join(", ");
            let label = if full.chars().count() > 60 {
                format!("defaults: {}…", full.chars().take(60).collect::<String>())
            } else {
                format!("defaults: {full}")
            };
            out.push(InlayHint { offset: at as u32, label, tooltip: Some(defaults.join("\n")) });
        }
    }
    out.sort_by_key(|h| h.offset);
    out
}

/// Where a hint about a binding goes: the end of its first line, before any trailing comment.
pub fn hint_offset(text: &str, span: Span) -> usize {
    let start = (span.start as usize).min(text.len());
    let end = text[start..].find('\n').map(|i| start + i).unwrap_or(text.len()).min(span.end as usize).max(start);
    let line = &text[start..end];
    match line.find("//") {
        Some(c) => start + line[..c].trim_end().len(),
        None => start + line.trim_end().len(),
    }
}

/// One hint per training stage of every recipe in `file`: bytes per rank, of the device's
/// capacity, and whether it fits. Sizes read as `miles plan` prints them (the planner's `gb`).
pub fn memory_hints(a: &Analysis, file: FileId) -> Vec<InlayHint> {
    let text = a.text(file);
    let mut out = Vec::new();
    for recipe in &a.compilation.recipes {
        // The planner is another crate's code running on every keystroke's result: a bug there
        // must cost this hint, not the editor session.
        let plan = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            miles_plan::plan(&miles_plan::plan_input(recipe))
        }));
        let Ok(plan) = plan else { continue };
        for m in plan.memory.iter().filter(|m| matches!(m.role, Role::Train | Role::Sft)) {
            let Some(node) = recipe.graph.node(&m.stage) else { continue };
            if node.span.file != file {
                continue;
            }
            let offset = hint_offset(text, node.span) as u32;
            if out.iter().any(|h: &InlayHint| h.offset == offset) {
                continue;
            }
            out.push(InlayHint { offset, label: memory_label(m), tooltip: Some(memory_tooltip(m)) });
        }
    }
    out
}

fn memory_label(m: &MemoryReport) -> String {
    let fits = if m.fits { "" } else { ", does not fit" };
    format!("{} per rank of {} {}{fits}", gb(m.total), gb(m.usable), m.device)
}

fn memory_tooltip(m: &MemoryReport) -> String {
    let mut lines = vec![format!("memory per rank of `{}` (miles plan)", m.stage)];
    for item in &m.items {
        lines.push(format!("{}: {}", item.name, gb(item.bytes)));
    }
    lines.push(format!("total {} of {} usable ({} capacity)", gb(m.total), gb(m.usable), gb(m.capacity)));
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use crate::fixture::{at_cursor, line_col, recipe};
    use insta::assert_snapshot;

    fn check(fixture: &str) -> String {
        let (a, file, _) = at_cursor(fixture);
        let mut hints = super::memory_hints(&a, file);
        hints.extend(super::inlay_hints(&a, file));
        hints.sort_by_key(|h| h.offset);
        hints
            .iter()
            .map(|h| {
                let (l, c) = line_col(a.text(file), h.offset as usize);
                format!("{l}:{c} {}\n", h.label)
            })
            .collect()
    }

    #[test]
    fn defaulted_parameters_and_memory_per_rank() {
        // Sizes read as `miles plan` prints them: `20.4 MB`, `0.5 GB` (the hint once said `20 MB`, `500 MB`).
        assert_snapshot!(check(&recipe("")), @r"
        8:33 defaults: batch_invariant = false, engine = embedded_engine {  }, max_…
        12:34 defaults: partial_credit = false
        13:37 0.2 GB per rank of 14.7 GB local
        13:37 defaults: advantage = grpo, aggregation = token, backend = embedded_tr…
        19:37 defaults: bucket = 512.MB, channel = auto, transport = broadcast, veri…
        ");
    }

    #[test]
    fn memory_sizes_use_the_planners_format() {
        assert_eq!(miles_plan::gb(500_000_000), "0.5 GB");
    }
}
