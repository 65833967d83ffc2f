//! The diffusion process's memory, item by item, and the weight syncs it prices.

use super::*;
use crate::evidence::Evidence;

/// Memory of the one process, item by item, checked against the host's (E0401).
pub(super) fn plan_memory(
    cx: &mut Ctx,
    d: &Diffusion,
    host: &HostSpec,
    sh: &Shape,
    cls_params: u64,
    memory: &mut Vec<MemoryReport>,
) {
    let a = &cx.input.assumptions;
    let items = memory_items(d, sh, a, cls_params);
    let total: u64 = items.iter().map(|i| i.bytes).sum();
    let usable = host.memory as f64 * a.usable_hbm;
    let fits = (total as f64) <= usable;
    let row_stage = d.train.as_ref().map_or(d.rollout.stage.clone(), |tr| tr.stage.clone());
    if !fits {
        let mut diag = Diagnostic::error(
            ErrorCode::E0401,
            format!(
                "{row_stage} does not fit in host memory: {} for the diffusion process, {} has {} usable",
                gb_fixed(total as f64),
                host.name,
                gb_fixed(usable)
            ),
        )
        .with_help("fewer conditions_per_step or samples_per_condition, fewer denoising steps, or a smaller denoiser");
        if let Some(sp) = cx.input.stages.iter().find(|s| s.name == row_stage).and_then(|s| s.span) {
            diag = diag.with_primary(sp, format!("needs {}", gb_fixed(total as f64)));
        }
        cx.diags.push(diag);
    }
    memory.push(MemoryReport {
        stage: row_stage,
        role: if d.train.is_some() { Role::Train } else { Role::Rollout },
        device: host.name.clone(),
        capacity: host.memory,
        usable: usable as u64,
        items,
        total,
        fits,
        offload: None,
        lora: None,
        ranks: None,
    });
}

/// The process's rows: the denoiser's weights, gradients and AdamW state, the KL reference, the
/// classifiers, the step's trajectories, the evaluation's, the larger of RL's and pretraining's
/// activations, and the process's resident base.
pub(super) fn memory_items(d: &Diffusion, sh: &Shape, a: &Assumptions, cls_params: u64) -> Vec<MemItem> {
    let m = &d.model;
    let (t, mg, f, images) = (sh.t, sh.mg, sh.f, sh.images);
    let s2 = m.side * m.side;
    let p = m.params as f64;
    let traj = trajectory_bytes(m, images, t);
    let scale = a.embedded_autograd_scale;
    let rl_act = scale * trained_step_graph(m, mg as f64, sh.two, sh.kl).bytes;
    let pre_act =
        d.pretrain.as_ref().map_or(0.0, |pr| scale * 4.0 * pr.batch as f64 * (forward_elements(m) + 6.0 * s2 as f64));
    let judge = d.eval.as_ref().is_some_and(|e| e.judge_steps > 0);
    let mut items = vec![
        MemItem {
            name: "weights".into(),
            bytes: (4.0 * p) as u64,
            note: format!(
                "denoiser fp32, {} params (the record's); the sampler reads them: no engine copy",
                param_count(m.params)
            ),
        },
        MemItem {
            name: "gradients".into(),
            bytes: (4.0 * p) as u64,
            note: "FP32, accumulated over the trained steps".into(),
        },
        MemItem {
            name: "optimizer".into(),
            bytes: (8.0 * p) as u64,
            note: "AdamW's two moments, 8 B/param (fp32 weights are their own master copy)".into(),
        },
        MemItem {
            name: "classifier".into(),
            bytes: 4 * cls_params,
            note: format!(
                "reward classifier fp32, {} params: conv 1->8->16 3x3, fc 64, {} classes",
                param_count(cls_params),
                m.conditions
            ),
        },
    ];
    if sh.kl {
        items.insert(
            3,
            MemItem {
                name: "reference".into(),
                bytes: (4.0 * p) as u64,
                note: "frozen fp32 copy of the pretrained denoiser (kl_coef > 0); its forward runs per trained step"
                    .into(),
            },
        );
    }
    if judge {
        items.push(MemItem {
            name: "judge".into(),
            bytes: 4 * cls_params,
            note: "a second classifier of the same shape (image_eval.judge_steps > 0)".into(),
        });
    }
    items.push(MemItem {
        name: "trajectories".into(),
        bytes: traj as u64,
        note: format!(
            "{images} images x ({} latents + {t} means) x {s2} px x 4 B + {t} f64 log-probs, kept until training ends",
            t + 1
        ),
    });
    if let Some(e) = &d.eval {
        items.push(MemItem {
            name: "eval_trajectory".into(),
            bytes: trajectory_bytes(m, e.samples, t) as u64,
            note: format!("{} held-out images, sampled after training while the step's trajectories live", e.samples),
        });
    }
    items.push(MemItem {
        name: "activations".into(),
        bytes: rl_act.max(pre_act) as u64,
        note: if pre_act > rl_act {
            format!(
                "pretraining's graph: {} images x ({:.0} + 6 side^2) fp32 elements, x{scale} for backward (RL's trained step: {:.2} MB)",
                d.pretrain.as_ref().map_or(0, |p| p.batch),
                forward_elements(m),
                rl_act / 1e6
            )
        } else {
            format!(
                "one trained step's graph of {mg} images x {f} row(s) at a time (backward per step), fp32, x{scale} for backward"
            )
        },
    });
    items.push(MemItem {
        name: "embedded_process".into(),
        bytes: a.embedded_process_bytes as u64,
        note: "libtorch, runtime and task data resident (measured)".into(),
    });
    items
}

/// The recipe's weight syncs, priced at nothing: the sampler reads the trained denoiser.
pub(super) fn weight_syncs(input: &PlanInput, m: &DenoiserSpec) -> Vec<SyncReport> {
    let p = m.params as f64;
    input
        .syncs
        .iter()
        .map(|s| SyncReport {
            name: s.name.clone(),
            from: s.from.clone(),
            to: s.to.clone(),
            transport: s.transport.value,
            channel: s.channel,
            bucket: s.bucket.value,
            bytes: (4.0 * p) as u64,
            lora: false,
            estimate: Estimate {
                seconds: 0.0,
                assumptions: vec![
                    "the diffusion run samples from the trained denoiser itself (run.rs): nothing is copied".into(),
                ],
                evidence: Evidence::derived("nothing moves"),
            },
            alternatives: Vec::new(),
        })
        .collect()
}
