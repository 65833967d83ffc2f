//! LoRA on a trainer rank: the adapters by name and size, and the full fine-tune the rank would
//! hold without them (docs/lora.md).

use super::memory::Rank;
use crate::input::*;
use crate::model;
use crate::output::*;
use crate::units::params as param_count;

/// The adapters by name and size, and the full fine-tune this rank would hold without them.
pub(super) fn lora_report(m: &ModelSpec, on: &Rank, lo: &Lora) -> LoraReport {
    let rank = lo.rank.value;
    let adapters = lo.adapters.value.max(1);
    let targets: Vec<TargetParams> = lo
        .target_modules
        .iter()
        .map(|&tm| {
            let p = model::lora_target_params(m, tm, rank);
            let wrapped: f64 = model::lora_instances(m, tm).iter().map(|i| i.0).sum();
            TargetParams {
                module: tm.as_str().into(),
                params: (p.routed + p.other) as u64,
                wrapped_layers: wrapped as u64,
                on_experts: p.routed > 0.0,
            }
        })
        .collect();
    let per_adapter: u64 = targets.iter().map(|x| x.params).sum();
    let params = per_adapter.saturating_mul(adapters);
    let names: Vec<&str> = lo.target_modules.iter().map(|x| x.short()).collect();
    let experts = if targets.iter().any(|x| x.on_experts) {
        format!(" (MLP on all {} routed experts)", m.experts)
    } else {
        String::new()
    };
    let summary = format!(
        "{adapters} adapter{} x {} rank {rank} x {} layers{experts}: {} params{}",
        if adapters == 1 { "" } else { "s" },
        names.join(","),
        m.layers,
        param_count(params),
        if adapters > 1 { format!(" ({} each)", param_count(per_adapter)) } else { String::new() }
    );
    let full = Trainer { lora: None, ..on.t.clone() };
    let f = Rank { t: &full, ..*on }.mem(m);
    LoraReport {
        rank,
        adapters,
        target_modules: lo.target_modules.iter().map(|x| x.as_str().to_string()).collect(),
        targets,
        params_per_adapter: per_adapter,
        params,
        sync_bytes: (params as f64 * on.l.precision.bytes()) as u64,
        summary,
        init: lo.init.clone(),
        init_line: lo.init.as_ref().map(|dir| format!("LoRA from {dir} (rank {rank}, targets {})", names.join(", "))),
        full_finetune: FullFinetune {
            weights: f.policy.weights as u64,
            gradients: f.policy.gradients as u64,
            optimizer: f.policy.optimizer as u64,
            total: f.on_gpu(on.t.optimizer_offload.value) as u64,
        },
    }
}
