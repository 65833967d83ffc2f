//! A `local` cluster's `device`: which device a run on this machine computes on, from what the
//! recipe asks and the GPUs the caller found (docs/gpu.md). A recipe that needs a GPU the machine
//! lacks is E0518 here, before anything starts; `auto` falls back to the CPU and says why.

use super::Ctx;
use crate::input::MachineGpus;
use crate::output::DeviceReport;

pub(super) fn plan_device(cx: &mut Ctx) -> Option<DeviceReport> {
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
    // The step estimates below are the CPU model's (plan/cpu.rs); a GPU run is not priced yet.
    const UNPRICED: &str = "the step time below is the CPU model's; a run on the GPU is not priced yet";
    match (asked.as_str(), usable) {
        (_, true) => {
            let g = &m.gpus[0];
            Some(report(Some("cuda:0"), format!("device = {asked}: {} ({UNPRICED})", g.name), lines(m)))
        }
        ("cuda", false) => {
            let found = m.gpus.len();
            cx.error(
                "E0518",
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
