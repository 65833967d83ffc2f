//! The batch arithmetic: rollout_batch x samples_per_prompt = global_batch x steps_per_rollout,
//! with a missing term derived and a contradiction reported (E0405).

use super::Ctx;
use crate::input::*;
use crate::output::*;
use miles_grammar::diag::ErrorCode;

pub(super) fn resolve_batch(cx: &mut Ctx) -> Option<BatchReport> {
    let b = &cx.input.batch;
    let v = |x: &Option<Spanned<u64>>| x.map(|s| s.value);
    let (rb, spp, gb_, spr) =
        (v(&b.rollout_batch), v(&b.samples_per_prompt), v(&b.global_batch), v(&b.steps_per_rollout));
    for (name, f) in [
        ("rollout_batch", &b.rollout_batch),
        ("samples_per_prompt", &b.samples_per_prompt),
        ("global_batch", &b.global_batch),
        ("steps_per_rollout", &b.steps_per_rollout),
    ] {
        if let Some(s) = f {
            if s.value == 0 {
                cx.error(ErrorCode::E0405, format!("{name} is 0"), s.span, "must be at least 1", None);
                return None;
            }
        }
    }
    // rollout_batch x samples_per_prompt = global_batch x steps_per_rollout; derive a missing one.
    let (rb, spp, gb_, spr, derived) = match (rb, spp, gb_, spr) {
        (Some(a), Some(b2), Some(c), Some(d)) => (a, b2, c, d, None),
        (Some(a), Some(b2), Some(c), None) => {
            let prod = a.saturating_mul(b2);
            if prod % c != 0 {
                cx.error(
                    ErrorCode::E0405,
                    format!("global_batch {c} does not divide rollout_batch x samples_per_prompt = {prod}"),
                    b.global_batch.and_then(|s| s.span),
                    "steps_per_rollout would not be whole",
                    Some(format!("pick a global_batch that divides {prod}")),
                );
                return None;
            }
            (a, b2, c, prod / c, Some("steps_per_rollout"))
        }
        (Some(a), Some(b2), None, Some(d)) => {
            let prod = a.saturating_mul(b2);
            if prod % d != 0 {
                cx.error(
                    ErrorCode::E0405,
                    format!("steps_per_rollout {d} does not divide rollout_batch x samples_per_prompt = {prod}"),
                    b.steps_per_rollout.and_then(|s| s.span),
                    "global_batch would not be whole",
                    None,
                );
                return None;
            }
            (a, b2, prod / d, d, Some("global_batch"))
        }
        (Some(a), Some(b2), None, None) => (a, b2, a.saturating_mul(b2), 1, Some("global_batch")),
        (None, Some(b2), Some(c), Some(d)) if c.saturating_mul(d) % b2 == 0 => {
            (c.saturating_mul(d) / b2, b2, c, d, Some("rollout_batch"))
        }
        (Some(a), None, Some(c), Some(d)) if c.saturating_mul(d) % a == 0 => {
            (a, c.saturating_mul(d) / a, c, d, Some("samples_per_prompt"))
        }
        _ => return None,
    };
    if rb.saturating_mul(spp) != gb_.saturating_mul(spr) {
        cx.error(
            ErrorCode::E0405,
            format!(
                "rollout_batch x samples_per_prompt = {} but global_batch x steps_per_rollout = {}",
                rb.saturating_mul(spp),
                gb_.saturating_mul(spr)
            ),
            b.global_batch.and_then(|s| s.span),
            "these must be equal",
            Some("every sample generated in a rollout step must be trained on exactly once".into()),
        );
    }
    let train = cx.input.stages.iter().find_map(|s| s.trainer.as_ref());
    let tokens_per_step = train.map(|t| gb_.saturating_mul(t.seq_len.value));
    Some(BatchReport {
        rollout_batch: rb,
        samples_per_prompt: spp,
        global_batch: gb_,
        steps_per_rollout: spr,
        epochs: b.epochs.map_or(1, |e| e.value.max(1)),
        derived: derived.map(String::from),
        samples_per_rollout: rb.saturating_mul(spp),
        micro_batches_per_step: None,
        tokens_per_step,
    })
}
