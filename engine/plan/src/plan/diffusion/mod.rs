//! Diffusion RL on the embedded backend (docs/plan.md, "Diffusion RL"): one process pretrains a
//! denoiser, trains the reward classifier (and the judge), then per RL step denoises
//! `conditions_per_step x samples_per_condition` images in micro-groups, scores each micro-group
//! on a reward thread (streamed while the next denoises, or after the batch) and recomputes the
//! trained denoising steps with gradients (engine/tch/src/diffusion). Memory is itemised like
//! the embedded trainer's; time uses the CPU model of `embedded.rs` (`time::work_seconds`: FLOPs at
//! `embedded_flops_per_s`, ops at `embedded_kernel_s`, bytes at `embedded_bytes_per_s`). The op
//! and element counts below are read off the engine's code, as `embedded::LAYER_KERNELS` is.

use super::embedded::{self, ADAM_BYTES_PER_PARAM, ADAM_KERNELS_PER_TENSOR, LOSS_KERNELS};
use super::Ctx;
use crate::evidence::{sources, Evidence};
use crate::input::*;
use crate::output::*;
use crate::time::{self, work_seconds, Work};
use crate::units::{bytes_fixed, gb_fixed, params as param_count};
use miles_grammar::diag::Diagnostic;
use miles_grammar::diag::ErrorCode;

mod memory;
mod phases;
#[cfg(test)]
mod tests;
mod work;

use memory::*;
use phases::*;
pub(crate) use work::*;

fn work_note(w: &Work, per: &str) -> String {
    format!("{:.3e} matmul FLOPs, {:.0} ops, {} written {per}", w.flops, w.kernels, bytes_fixed(w.bytes))
}

fn ms(s: f64) -> String {
    format!("{:.1} ms", s * 1e3)
}

/// What the planner adds for a diffusion recipe: its report, its step, and the weight syncs it
/// prices (the sampler reads the trained denoiser itself).
pub(super) struct Planned {
    pub(super) report: DiffusionReport,
    pub(super) step: StepReport,
    pub(super) syncs: Vec<SyncReport>,
}

/// A diffusion step's figures, as every phase reads them.
struct Shape {
    /// Denoising steps T.
    t: u64,
    /// Images per micro-group.
    mg: u64,
    samples_per_condition: u64,
    conditions: u64,
    images: u64,
    /// Micro-groups per step.
    n: u64,
    /// Classifier-free guidance's two rows per image and step.
    two: bool,
    /// Denoiser rows per image and step.
    f: u64,
    /// Denoising steps trained per image.
    trained: u64,
    kl: bool,
}

impl Shape {
    fn of(d: &Diffusion) -> Shape {
        let t = d.rollout.steps.max(1);
        let mg = d.rollout.micro_group.max(1);
        let spc = d.rollout.samples_per_condition.max(1);
        let conditions = d.train.as_ref().map_or(1, |tr| tr.conditions_per_step.max(1));
        let images = conditions * spc;
        Shape {
            t,
            mg,
            samples_per_condition: spc,
            conditions,
            images,
            n: images.div_ceil(mg),
            two: two_terms(d.rollout.guidance),
            f: forwards_per_step(d.rollout.guidance),
            trained: d.train.as_ref().and_then(|tr| tr.train_steps).unwrap_or(t).clamp(1, t),
            kl: d.train.as_ref().is_some_and(|tr| tr.kl_coef > 0.0),
        }
    }
}

/// Plans a diffusion recipe on a CPU host; `None` on a GPU cluster (the embedded backend runs
/// on the host CPU only).
pub(super) fn plan_diffusion(cx: &mut Ctx, d: &Diffusion, memory: &mut Vec<MemoryReport>) -> Option<Planned> {
    let input = cx.input;
    let host = input.cluster.host.as_ref().filter(|_| input.cluster.pools.is_empty())?;
    let r = embedded::rate(&input.assumptions);
    let m = &d.model;
    let sh = Shape::of(d);
    let cls_params = classifier_params(m.side, m.conditions);

    let (denoise, d_s) = denoise_time(d, &sh, &r);
    let reward = reward_time(d, &sh, &r, host, cls_params);
    let r_s = reward.as_ref().map_or(0.0, |x| x.1);
    let streaming = d.reward.as_ref().is_some_and(|rw| rw.streaming);
    let (whole, streamed) = rollout_times(sh.n, d_s, r_s);
    let rollout_s = if streaming { streamed } else { whole };
    let train = train_time(d, &sh, &r);
    let train_s = train.as_ref().map_or(0.0, |e| e.seconds);
    let step_s = rollout_s + train_s;
    let eval = eval_time(d, &sh, &r);
    let pretrain = pretrain_time(d, &r);
    let classifiers = classifiers_time(d, &r, cls_params);
    let one_off_s = pretrain.as_ref().map_or(0.0, |e| e.seconds) + classifiers.as_ref().map_or(0.0, |e| e.seconds);

    plan_memory(cx, d, host, &sh, cls_params, memory);
    let syncs = weight_syncs(input, m);
    let notes = vec![
        "the diffusion run is synchronous: rollout (denoise + rewards), then training; no weight copy".into(),
        format!(
            "rollout: {} micro-groups, d = {} to denoise, r = {} to score each: whole batch n d + n r = {}, streamed d + (n - 1) max(d, r) + r = {}; the recipe {}",
            sh.n,
            ms(d_s),
            ms(r_s),
            ms(whole),
            ms(streamed),
            if streaming { "streams" } else { "scores after the batch" }
        ),
        "one libtorch thread for denoising and training (a recipe cannot set threads, so the plan assumes 1)".into(),
    ];
    let train_step = train.clone().unwrap_or(Estimate {
        seconds: 0.0,
        assumptions: Vec::new(),
        evidence: Evidence::derived("no training"),
    });
    let step = StepReport {
        mode: input.schedule.mode.value,
        rollout_s,
        dynamic_rounds: None,
        train_s,
        train_step,
        critic_s: 0.0,
        teacher_s: 0.0,
        teacher_stage_s: 0.0,
        sync_s: 0.0,
        offload_s: 0.0,
        switch_s: 0.0,
        sync_step_s: step_s,
        async_step_s: step_s,
        step: Estimate { seconds: step_s, assumptions: notes, evidence: Evidence::measured(sources::CPU_RATES) },
        data_parallel: None,
    };
    let report = DiffusionReport {
        model: m.name(),
        params: m.params,
        batch: DiffusionBatch {
            conditions_per_step: sh.conditions,
            samples_per_condition: sh.samples_per_condition,
            images_per_step: sh.images,
            micro_group: sh.mg,
            micro_groups_per_step: sh.n,
            denoising_steps: sh.t,
            trained_steps: sh.trained,
            forwards_per_step: sh.f,
            trajectory_bytes: trajectory_bytes(m, sh.images, sh.t) as u64,
        },
        step: DiffusionStep {
            rollout_s,
            denoise_s: denoise.seconds,
            reward_wait_s: rollout_s - denoise.seconds,
            train_s,
            step_s,
        },
        denoise,
        denoise_micro_group_s: d_s,
        reward: reward.map(|x| x.0),
        reward_micro_group_s: r_s,
        streaming,
        reward_process: d.reward.as_ref().is_some_and(|r| r.process),
        whole_batch_s: whole,
        streamed_s: streamed,
        train,
        eval,
        eval_every: d.eval.as_ref().map(|e| e.every),
        pretrain,
        classifiers,
        one_off_s,
    };
    Some(Planned { report, step, syncs })
}
