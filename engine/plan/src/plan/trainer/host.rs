//! The embedded backend on a CPU-only host: the trainer shares one process with the rollout
//! engine (and a snapshot evaluation's engine, and a KL reference), and its activations are
//! libtorch's, not Megatron's (docs/plan.md, "The embedded process").

use crate::input::*;
use crate::plan::Ctx;

#[derive(Clone, Copy, Debug)]
pub(super) struct EmbeddedHost {
    /// Other copies of the weights in the process, each named; like the process's fixed base,
    /// counted on the first embedded trainer only (an SFT warm-up and the RL trainer that follows
    /// it are one trainer in one process).
    copies: [Option<&'static str>; 3],
    /// The engines' copies' precision (the rollout and snapshot-eval engines sample in their own:
    /// an embedded engine in bf16 holds half of an fp32 copy); None: the trainer's.
    engine_precision: Option<Precision>,
    pub(super) entropy_in_loss: bool,
    pub(super) autograd_scale: f64,
    pub(super) process_bytes: f64,
}

impl EmbeddedHost {
    /// `ranks`: the trainer is data-parallel, its ranks worker processes of their own; the
    /// engines are then the rollout workers' (not this process's), the KL reference the rank's.
    pub(super) fn new(cx: &Ctx, first: bool, ranks: bool) -> EmbeddedHost {
        let input = cx.input;
        let e = input.placement.embedded;
        let rollout = !ranks && input.stages.iter().any(|s| s.role == Role::Rollout);
        // An async schedule runs evaluation on an engine of its own when `mode = snapshot`; a
        // sync one evaluates on the rollout engine.
        let eval_engine = !ranks && e.eval_snapshot && input.schedule.mode.value != ScheduleMode::Sync;
        let engine_precision = input
            .stages
            .iter()
            .filter(|s| s.role == Role::Rollout)
            .find_map(|s| s.engine.as_ref())
            .map(|e| e.precision.value);
        EmbeddedHost {
            engine_precision,
            copies: if first {
                [
                    rollout.then_some("rollout engine"),
                    eval_engine.then_some("snapshot eval engine"),
                    e.kl_reference.then_some("KL reference"),
                ]
            } else {
                [None; 3]
            },
            entropy_in_loss: e.entropy_in_loss,
            autograd_scale: input.assumptions.embedded_autograd_scale,
            process_bytes: if first { input.assumptions.embedded_process_bytes } else { 0.0 },
        }
    }

    pub(super) fn copy_names(&self) -> Vec<&'static str> {
        self.copies.iter().flatten().copied().collect()
    }

    /// Bytes of the copies of `weights` (held in `trainer`'s precision), each in its own.
    pub(super) fn copy_bytes(&self, weights: f64, trainer: Precision) -> f64 {
        let engine = self.engine_precision.unwrap_or(trainer);
        let engines = self.copies[..2].iter().flatten().count() as f64;
        let others = self.copies[2..].iter().flatten().count() as f64;
        weights * (engines * engine.bytes() / trainer.bytes() + others)
    }

    /// The copies as the plan names them: `1 x fp32: rollout engine`, with the engines' own
    /// precision where it is not the trainer's.
    pub(super) fn copy_note(&self, trainer: Precision) -> String {
        let names = self.copy_names();
        match self.engine_precision.filter(|p| *p != trainer) {
            None => format!("{} x {}: {}", names.len(), trainer.as_str(), names.join(", ")),
            Some(e) => {
                let label = |(i, c): (usize, &Option<&'static str>)| {
                    c.map(|n| format!("{n} ({})", if i < 2 { e.as_str() } else { trainer.as_str() }))
                };
                let labels: Vec<String> = self.copies.iter().enumerate().filter_map(label).collect();
                format!("{} copies: {}", names.len(), labels.join(", "))
            }
        }
    }
}
