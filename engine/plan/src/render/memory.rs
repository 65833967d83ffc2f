//! The trainer's and engines' memory per rank, item by item, with the verdict, LoRA's full
//! fine-tune, the offload, and a data-parallel trainer's ranks.

use crate::output::Plan;
use crate::units::{gb, secs};
use std::fmt::Write;

/// Memory per rank, item by item, with the verdict, LoRA's full fine-tune and the offload.
pub(super) fn memory_section(o: &mut String, p: &Plan) {
    if !p.memory.is_empty() {
        let _ = writeln!(o, "\nMemory per rank (one GPU, or the host on a CPU-only cluster)");
        for m in &p.memory {
            match &m.ranks {
                // One rank's worker process of several on the machine, with its share of it.
                Some(r) => {
                    let _ = writeln!(
                        o,
                        "  {} per trainer rank ({} ranks, zero = {}; {}: {} capacity, {} usable per rank)",
                        m.stage,
                        r.ranks,
                        r.zero,
                        m.device,
                        gb(m.capacity),
                        gb(m.usable)
                    );
                }
                None => {
                    let _ = writeln!(
                        o,
                        "  {} ({}: {} capacity, {} usable)",
                        m.stage,
                        m.device,
                        gb(m.capacity),
                        gb(m.usable)
                    );
                }
            }
            // 16 columns of names, wider only where a name needs it (PPO's `critic_activations`).
            let w = m.items.iter().map(|i| i.name.len()).max().unwrap_or(0).max(16);
            for it in &m.items {
                let _ = writeln!(o, "    {:w$} {:>9}  {}", it.name, gb(it.bytes), it.note);
            }
            let verdict = if m.fits {
                format!("fits, {} free", gb(m.usable.saturating_sub(m.total)))
            } else if m.total > m.usable {
                format!("DOES NOT FIT: over by {}", gb(m.total - m.usable))
            } else {
                "DOES NOT FIT".into()
            };
            let _ = writeln!(o, "    {:w$} {:>9}  {}", "total", gb(m.total), verdict);
            if let Some(r) = &m.ranks {
                let _ =
                    writeln!(o, "    {:w$} {:>9}  {} ranks x the total above", "all ranks", gb(r.all_ranks), r.ranks);
            }
            if let Some(l) = &m.lora {
                let f = &l.full_finetune;
                let _ = writeln!(
                    o,
                    "    {:w$} {:>9}  a full fine-tune: weights {}, gradients {}, optimizer {}",
                    "without LoRA",
                    gb(f.total),
                    gb(f.weights),
                    gb(f.gradients),
                    gb(f.optimizer)
                );
                if let Some(line) = &l.init_line {
                    let _ = writeln!(o, "    {:w$} {:>9}  {line}", "init", "");
                }
            }
            if let Some(off) = &m.offload {
                let _ = writeln!(
                    o,
                    "    {:w$} {:>9}  est. {} per optimizer step",
                    off.mode,
                    gb(off.bytes_per_gpu),
                    secs(off.per_step.seconds)
                );
            }
        }
    }
}
