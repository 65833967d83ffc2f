//! A `local` cluster's `device`: which device a run on this machine computes on, from what the
//! recipe asks and the GPUs the caller found (docs/gpu.md). A recipe that needs a GPU the machine
//! lacks is E0518 here, before anything starts; `auto` falls back to the CPU and says why. A
//! GPU it resolves to prices the embedded backend's step (`Ctx::gpu`, plan/gpu.rs).

use super::gpu::Gpu;
use super::Ctx;
use crate::input::{Backend, MachineGpus, Precision};
use crate::output::DeviceReport;
use miles_grammar::diag::ErrorCode;

pub(super) fn plan_device(cx: &mut Ctx) -> Option<DeviceReport> {
    let report = resolve(cx)?;
    if report.resolved.as_deref() == Some("cpu") {
        warn_bf16_without_instructions(cx);
    }
    Some(report)
}

/// E0411: a `precision = bf16` embedded trainer or engine on a CPU the caller found without
/// AVX512-BF16 or AMX, where libtorch emulates bf16 GEMMs more slowly than fp32.
fn warn_bf16_without_instructions(cx: &mut Ctx) {
    if cx.input.device.as_ref().and_then(|d| d.cpu_bf16) != Some(false) {
        return;
    }
    let mut found = Vec::new();
    for st in &cx.input.stages {
        if let Some(t) = st.trainer.as_ref().filter(|t| t.backend.value == Backend::Embedded) {
            if t.precision.value == Precision::Bf16 {
                found.push((st.name.clone(), "embedded_trainer", t.precision.span));
            }
        }
        if let Some(e) = st.engine.as_ref().filter(|e| e.embedded && e.precision.value == Precision::Bf16) {
            found.push((st.name.clone(), "embedded_engine", e.precision.span));
        }
    }
    for (stage, schema, span) in found {
        cx.warning(
            ErrorCode::E0411,
            format!("{stage}: `{schema} {{ precision = bf16 }}` on a CPU without AVX512-BF16 or AMX: libtorch emulates bf16 GEMMs there, slower than fp32"),
            span,
            "bf16 on this CPU",
            Some("set precision = fp32 on this machine (the plan's bf16 step time assumes a CPU with bf16 instructions)".into()),
        );
    }
}

fn resolve(cx: &mut Ctx) -> Option<DeviceReport> {
    let d = cx.input.device.as_ref()?;
    let asked = d.asked.value.clone();
    let lines = |m: &MachineGpus| {
        m.gpus
            .iter()
            .map(|g| format!("{}: {}, {:.1} GiB, {}", g.index, g.name, g.memory as f64 / (1u64 << 30) as f64, g.sm))
            .collect::<Vec<_>>()
    };
    let report = |resolved: Option<&str>, why: String, gpus: Vec<String>| DeviceReport {
        asked: asked.clone(),
        resolved: resolved.map(str::to_string),
        why,
        gpus,
    };
    if asked == "cpu" {
        return Some(report(Some("cpu"), "device = cpu".into(), Vec::new()));
    }
    if let Some(why) = &d.cpu_only {
        return Some(report(Some("cpu"), format!("device = {asked}: {why}"), Vec::new()));
    }
    let Some(m) = &d.machine else {
        return Some(report(None, format!("device = {asked}: the machine's GPUs were not looked at"), Vec::new()));
    };
    let usable = m.unavailable.is_none() && !m.gpus.is_empty();
    let missing = || match &m.unavailable {
        Some(why) => why.clone(),
        None => "the CUDA driver shows no GPU (check CUDA_VISIBLE_DEVICES)".into(),
    };
    match (asked.as_str(), usable) {
        (_, true) => {
            // The embedded backend's step is priced on this GPU (plan/embedded.rs at plan/gpu.rs's rates).
            let g = Gpu::new(&m.gpus[0]);
            let why = format!("device = {asked}: {}", priced_note(cx, &g));
            cx.gpu = Some(g);
            Some(report(Some("cuda:0"), why, lines(m)))
        }
        ("cuda", false) => {
            let found = m.gpus.len();
            cx.error(
                ErrorCode::E0518,
                format!("the recipe computes on a GPU (device = cuda): it needs 1 GPU, and this machine has {found}"),
                d.asked.span,
                "asks for a GPU",
                Some(format!(
                    "{}; set `device = auto` to use the CPU where there is no GPU, or `device = cpu`",
                    missing()
                )),
            );
            Some(report(None, format!("device = cuda, but {}", missing()), lines(m)))
        }
        _ => Some(report(Some("cpu"), format!("device = auto: {}", missing()), lines(m))),
    }
}

/// What the device line says of a GPU's pricing: its name, where its peaks come from, the peak
/// and efficiency of each precision the embedded stages compute in, and that none of it is
/// measured.
fn priced_note(cx: &Ctx, g: &Gpu) -> String {
    let a = &cx.input.assumptions;
    let mut used = Vec::new();
    for st in &cx.input.stages {
        let trainer = st.trainer.as_ref().filter(|t| t.backend.value == Backend::Embedded).map(|t| t.precision.value);
        let engine = st.engine.as_ref().filter(|e| e.embedded).map(|e| e.precision.value);
        for p in trainer.into_iter().chain(engine) {
            let p = if p == Precision::Fp32 { Precision::Fp32 } else { Precision::Bf16 };
            if !used.contains(&p) {
                used.push(p);
            }
        }
    }
    if used.is_empty() {
        used.push(Precision::Fp32);
    }
    let gemms: Vec<String> = used.iter().map(|&p| g.gemm_note(a, p)).collect();
    format!(
        "{}; the step time below is priced for it ({}: {}, {}, {:.0} us per op): datasheet assumptions, not yet measured on a GPU",
        g.name,
        g.source(),
        gemms.join(", "),
        g.hbm_note(a),
        a.embedded_gpu_kernel_s * 1e6
    )
}
