//! The trainer's parallel layout against the GPUs it was given: TP x PP x CP x DP must be the
//! stage's GPU count and EP must divide TP x CP x DP (E0404); a TP group should stay inside one
//! NVLink domain (E0406).

use crate::input::*;
use crate::model::Layout;
use crate::plan::placement::trainer_unit;
use crate::plan::Ctx;
use miles_grammar::diag::ErrorCode;
use miles_grammar::diag::Span;

/// The layout the trainer runs on `gpus` devices with `dp` replicas; `None` (and E0404) when it
/// does not match them.
pub(super) fn check_layout(cx: &mut Ctx, st: &Stage, t: &Trainer, gpus: u64, dp: u64) -> Option<Layout> {
    if dp == 0 || trainer_unit(t).saturating_mul(dp) != gpus {
        cx.error(
            ErrorCode::E0404,
            format!(
                "{}: TP{} x PP{} x CP{} x DP{} = {} but the stage has {gpus} GPUs",
                st.name,
                t.tp.value,
                t.pp.value,
                t.cp.value,
                dp,
                trainer_unit(t).saturating_mul(dp)
            ),
            t.dp.and_then(|d| d.span).or(st.gpus.and_then(|g| g.span)).or(st.span),
            "layout does not match the GPUs",
            Some(format!("the GPU count must be a multiple of tp x pp x cp = {}", trainer_unit(t))),
        );
        return None;
    }
    let l = Layout {
        backend: t.backend.value,
        tp: t.tp.value,
        pp: t.pp.value,
        cp: t.cp.value,
        ep: t.ep.value,
        dp,
        // The embedded trainer keeps fp32 weights, gradients and Adam state: its `precision` is
        // its GEMMs' (`TrainMem::gemm_casts`, `embedded::train_step`).
        precision: if t.backend.value == Backend::Embedded { Precision::Fp32 } else { t.precision.value },
    };
    if l.backend == Backend::Megatron && !(l.tp * l.cp * l.dp).is_multiple_of(l.etp() * l.ep) {
        cx.error(
            ErrorCode::E0404,
            format!("{}: EP{} does not divide TP x CP x DP = {}", st.name, l.ep, l.tp * l.cp * l.dp),
            t.ep.span.or(st.span),
            "experts cannot be placed",
            None,
        );
        return None;
    }
    Some(l)
}

/// E0406 when a TP group's all-reduces would cross the scale-out network: TP larger than the
/// NVLink domain, or a TP that does not divide it on a stage wider than one domain (groups laid
/// out in order then straddle domains). Within one domain a non-dividing TP only idles GPUs.
pub(in crate::plan) fn tp_domain_warning(
    cx: &mut Ctx,
    st: &Stage,
    what: &str,
    tp: u64,
    span: Option<Span>,
    g: &GpuSpec,
    stage_gpus: u64,
) {
    let domain = g.scaleup_domain.max(1);
    if tp > domain || (!domain.is_multiple_of(tp.max(1)) && stage_gpus > domain) {
        cx.warning(
            ErrorCode::E0406,
            format!("{}: {what} TP{tp} spans NVLink domains of {domain} {} GPUs", st.name, g.name),
            span.or(st.span),
            "tensor-parallel traffic crosses the scale-out network",
            Some(format!("keep TP a divisor of {domain}; use PP, EP or more engines for the rest")),
        );
    }
}
