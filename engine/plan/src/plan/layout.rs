//! Parallel layouts checked before placement: no zero degree, EP divides the experts, an
//! engine's DP and EP divide its TP (E0404), every GPU stage has a model and no embedded trainer
//! is put on GPUs (E0409), and a model-running kind the planner does not know is named (E0410).

use super::Ctx;
use crate::input::*;
use miles_grammar::diag::ErrorCode;

pub(super) fn validate_layouts(cx: &mut Ctx) {
    let input = cx.input;
    for st in &input.stages {
        if let Some(t) = &st.trainer {
            let degrees = [
                ("tp", t.tp),
                ("pp", t.pp),
                ("cp", t.cp),
                ("ep", t.ep),
                ("micro_batch", t.micro_batch),
                ("seq_len", t.seq_len),
            ];
            no_zeros(cx, st, degrees.into_iter().chain(t.dp.map(|d| ("dp", d))));
            if let Some(m) = &st.model {
                // Layers that do not split evenly over PP are fine (Megatron sizes the first
                // and last stages separately); the plan sizes the largest stage.
                if t.ep.value > 1 && m.experts % t.ep.value != 0 {
                    cx.error(
                        ErrorCode::E0404,
                        format!("{}: {} experts do not split over EP{}", st.name, m.experts, t.ep.value),
                        t.ep.span.or(st.span),
                        "EP must divide the expert count",
                        None,
                    );
                }
            }
        }
        if let Some(e) = &st.engine {
            no_zeros(cx, st, [("tp", e.tp), ("dp", e.dp), ("ep", e.ep)]);
            if e.tp.value > 0 && (e.tp.value % e.dp.value.max(1) != 0 || e.tp.value % e.ep.value.max(1) != 0) {
                cx.error(
                    ErrorCode::E0404,
                    format!(
                        "{}: engine DP{} and EP{} must divide its TP{}",
                        st.name, e.dp.value, e.ep.value, e.tp.value
                    ),
                    e.dp.span.or(e.ep.span).or(st.span),
                    "an engine spans tp GPUs; dp and ep partition them",
                    None,
                );
            }
            if e.engines.is_some_and(|n| n.value == 0) {
                cx.error(
                    ErrorCode::E0404,
                    format!("{}: 0 engines", st.name),
                    e.engines.and_then(|n| n.span).or(st.span),
                    "must be at least 1",
                    None,
                );
            }
            if !(e.mem_fraction.value > 0.0 && e.mem_fraction.value <= 1.0) {
                cx.error(
                    ErrorCode::E0404,
                    format!("{}: mem_fraction {} is not in (0, 1]", st.name, e.mem_fraction.value),
                    e.mem_fraction.span.or(st.span),
                    "share of HBM",
                    None,
                );
            }
        }
        if st.trainer.is_none() && st.engine.is_none() && st.model.is_some() && !KNOWN_KINDS.contains(&st.kind.as_str())
        {
            cx.warning(
                ErrorCode::E0410,
                format!(
                    "{}: stage kind `{}` runs {} but the planner does not know the kind: no GPUs, memory or time planned for it",
                    st.name,
                    st.kind,
                    st.model.as_ref().map_or("a model", |m| m.name.as_str())
                ),
                st.span,
                "planned on the host, with nothing counted",
                Some("give its model GPUs of its own outside the plan, or serve it behind `http_reward`".into()),
            );
        }
        if embedded_on_gpus(cx.total_gpus, st) {
            cx.error(
                ErrorCode::E0409,
                format!(
                    "{}: the embedded trainer runs on the host CPU in fp32; cluster {} has {} GPUs and the stage names no GPU backend",
                    st.name, input.cluster.name, cx.total_gpus
                ),
                st.trainer.as_ref().and_then(|t| t.backend.span).or(st.span),
                "not planned: no GPU backend",
                Some("set backend = fsdp { gpus = ... } or megatron { gpus = ..., tp = ... }".into()),
            );
        }
        if (st.trainer.is_some() || st.engine.is_some()) && st.model.is_none() {
            cx.error(
                ErrorCode::E0409,
                format!("{}: no model to plan with", st.name),
                st.span,
                "this stage's model is unknown",
                Some("give the stage a model from std/models or a `llm { ... }` record".into()),
            );
        }
    }
}

/// A trainer on the embedded backend (the CPU trainer of `local` clusters) in a recipe on GPUs:
/// the planner does not pretend it trains on the GPUs (E0409; std's grpo and ppo refuse it too).
pub(super) fn embedded_on_gpus(total_gpus: u64, st: &Stage) -> bool {
    total_gpus > 0 && st.trainer.as_ref().is_some_and(|t| t.backend.value == Backend::Embedded)
}

/// Reports each of `fields` that is 0 (E0404).
fn no_zeros(cx: &mut Ctx, st: &Stage, fields: impl IntoIterator<Item = (&'static str, Spanned<u64>)>) {
    for (name, f) in fields {
        if f.value == 0 {
            cx.error(
                ErrorCode::E0404,
                format!("{}: {name} is 0", st.name),
                f.span.or(st.span),
                "must be at least 1",
                None,
            );
        }
    }
}

pub(super) fn layout_ok(t: &Trainer) -> bool {
    t.tp.value > 0
        && t.pp.value > 0
        && t.cp.value > 0
        && t.ep.value > 0
        && t.micro_batch.value > 0
        && t.seq_len.value > 0
        && t.dp.is_none_or(|d| d.value > 0)
}

pub(super) fn engine_ok(e: &Engine) -> bool {
    e.tp.value > 0
        && e.dp.value > 0
        && e.ep.value > 0
        && e.tp.value.is_multiple_of(e.dp.value)
        && e.tp.value.is_multiple_of(e.ep.value)
        && e.engines.is_none_or(|n| n.value > 0)
        && e.mem_fraction.value > 0.0
        && e.mem_fraction.value <= 1.0
}
