//! Inlay hints: the parameters a stage instance leaves at their defaults, and what the planner
//! says beside the stages: memory per rank of each training stage, each weight sync's time per
//! update with its evidence, a rollout the recipe holds below its KV cache with the fix.

use crate::analysis::Analysis;
use miles_grammar::diag::{FileId, Span};
use miles_plan::{gb, MemoryReport, Plan, Role, SyncReport};

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

/// The planner's hints for every recipe in `file`: one per training stage (bytes per rank, of
/// the device's capacity, whether it fits), one per weight sync (time per update, its evidence,
/// the other transports), one per rollout held below its KV cache (E0412's fix). Sizes and times
/// read as `miles plan` prints them.
pub fn plan_hints(a: &Analysis, file: FileId) -> Vec<InlayHint> {
    let text = a.text(file);
    let mut out = Vec::new();
    for recipe in &a.compilation.recipes {
        // The planner is another crate's code running on every keystroke's result: a bug there
        // must cost these hints, not the editor session.
        let plan = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            miles_plan::plan(&miles_plan::plan_input(recipe))
        }));
        let Ok(plan) = plan else { continue };
        let mut add = |stage: &str, label: String, tooltip: String| {
            let Some(node) = recipe.graph.node(stage) else { return };
            if node.span.file != file {
                return;
            }
            let offset = hint_offset(text, node.span) as u32;
            if !out.iter().any(|h: &InlayHint| h.offset == offset) {
                out.push(InlayHint { offset, label, tooltip: Some(tooltip) });
            }
        };
        for m in plan.memory.iter().filter(|m| matches!(m.role, Role::Train | Role::Sft)) {
            add(&m.stage, memory_label(m), memory_tooltip(m));
        }
        for s in &plan.syncs {
            add(&s.name, sync_label(s), sync_tooltip(s));
        }
        for (stage, label, tooltip) in throttles(&plan) {
            add(&stage, label, tooltip);
        }
    }
    out
}

fn sync_label(s: &SyncReport) -> String {
    let others: Vec<String> =
        s.alternatives.iter().map(|x| format!("{} {}", x.transport.as_str(), miles_plan::secs(x.seconds))).collect();
    let others = if others.is_empty() { String::new() } else { format!(" ({})", others.join(", ")) };
    format!(
        "est. {} per update by {} {}{others}",
        miles_plan::secs(s.estimate.seconds),
        s.how(),
        s.estimate.evidence.tag()
    )
}

fn sync_tooltip(s: &SyncReport) -> String {
    let mut lines = vec![format!("weight sync `{}`: {} by {} (miles plan)", s.name, gb(s.bytes), s.how())];
    lines.extend(s.estimate.assumptions.iter().map(|a| format!("- {a}")));
    lines.push(format!("{}: {}", s.estimate.evidence.kind.label(), s.estimate.evidence.source));
    lines.join("\n")
}

/// A rollout the recipe holds below its KV cache while the step waits for it (E0412).
fn throttles(p: &Plan) -> Vec<(String, String, String)> {
    p.rollouts
        .iter()
        .filter_map(|r| {
            let t = r.throttle.as_ref()?;
            let fix = t.fix.as_ref()?;
            let label = format!(
                "held back: {} of {} KV slots per engine in use",
                t.in_flight_per_engine, t.kv_sequences_per_engine
            );
            let tooltip = format!(
                "the step waits for `{}`, held back by {}\nfix: {}",
                r.stage,
                miles_plan::throttle_limit_line(t),
                miles_plan::throttle_fix_line(fix)
            );
            Some((r.stage.clone(), label, tooltip))
        })
        .collect()
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
        let mut hints = super::plan_hints(&a, file);
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

    /// A GPU recipe: the weight sync's time with its evidence and the other transports, and the
    /// rollout the default max_concurrent holds back (E0412), beside their stages.
    #[test]
    fn weight_sync_and_a_throttled_rollout() {
        let fixture = r#"//- main.miles
import std/hardware { h100 }
import std/models { qwen3_8b }
import std/tasks/arith
cluster fleet = h100 * 16
recipe r on fleet {
    rollout = generate(qwen3_8b) {
        prompts = arith.addition {}
        max_new_tokens = 4096.tokens
        engine = sglang { gpus = 8, tp = 2 }
    }
    reward = exact_match(rollout)
    train = grpo(rollout, reward) { backend = fsdp { gpus = 8 } }
    sync = weights(train -> rollout)
    schedule = fully_async
}
"#;
        let (a, file, _) = at_cursor(fixture);
        let mut hints = super::plan_hints(&a, file);
        hints.sort_by_key(|h| h.offset);
        let hints: Vec<String> = hints
            .iter()
            .map(|h| {
                let (l, c) = line_col(a.text(file), h.offset as usize);
                format!("{l}:{c} {}\n", h.label)
            })
            .collect();
        assert_snapshot!(hints.concat(), @r"
        6:35 held back: 16 of 176 KV slots per engine in use
        12:66 45.2 GB per rank of 73.6 GB H100-80GB
        13:37 est. 1.0 s per update by broadcast [fitted] (p2p 2.1 s, disk_delta 3.9 s)
        ");
        let sync = super::plan_hints(&a, file).into_iter().find(|h| h.label.starts_with("est.")).expect("a sync hint");
        let tip = sync.tooltip.unwrap_or_default();
        assert!(tip.contains("fitted: weight-sync constants fitted"), "{tip}");
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
