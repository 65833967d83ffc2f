//! The planner's memory per rank beside each training stage, as an inlay hint. This glue lives
//! here because the compiler cannot depend on the planner (the planner depends on the compiler);
//! it returns the IDE layer's plain `InlayHint`, converted to LSP like the others.

use miles_compiler::ide::{hint_offset, Analysis, InlayHint};
use miles_compiler::FileId;
use miles_plan::{MemoryReport, Role};

/// One hint per training stage of every recipe in `file`: bytes per rank, of the device's
/// capacity, and whether it fits.
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
            out.push(InlayHint { offset, label: label(m), tooltip: Some(tooltip(m)) });
        }
    }
    out
}

fn gb(bytes: u64) -> String {
    let g = bytes as f64 / 1e9;
    if g >= 100.0 {
        format!("{g:.0} GB")
    } else if g >= 1.0 {
        format!("{g:.1} GB")
    } else {
        format!("{:.0} MB", bytes as f64 / 1e6)
    }
}

fn label(m: &MemoryReport) -> String {
    let fits = if m.fits { "" } else { ", does not fit" };
    format!("{} per rank of {} {}{fits}", gb(m.total), gb(m.usable), m.device)
}

fn tooltip(m: &MemoryReport) -> String {
    let mut lines = vec![format!("memory per rank of `{}` (miles plan)", m.stage)];
    for item in &m.items {
        lines.push(format!("{}: {}", item.name, gb(item.bytes)));
    }
    lines.push(format!("total {} of {} usable ({} capacity)", gb(m.total), gb(m.usable), gb(m.capacity)));
    lines.join("\n")
}
