//! The time of each phase of a diffusion run at the host's rates: denoising, scoring,
//! training, evaluation, pretraining and the classifiers' training.

use super::*;
use crate::evidence::{sources, Evidence};

/// step's estimate and one micro-group's seconds.
pub(super) fn denoise_time(d: &Diffusion, sh: &Shape, r: &time::Rate) -> (Estimate, f64) {
    let m = &d.model;
    let (n, mg, t, f, two) = (sh.n, sh.mg, sh.t, sh.f, sh.two);
    let dmg = denoise_micro_group(m, mg as f64, t as f64, two);
    let d_s = work_seconds(&dmg, r);
    let denoise_work = dmg.scale(n as f64);
    let denoise = Estimate {
        seconds: d_s * n as f64,
        assumptions: vec![
            format!(
                "{n} micro-group(s) x {mg} images x {t} denoising steps, {f} denoiser row(s) per image and step{}",
                if two {
                    format!(" (classifier-free guidance {}: conditional + null rows)", d.rollout.guidance)
                } else {
                    String::new()
                }
            ),
            format!(
                "denoiser row: 2 x {} params FLOPs (the record's params), {:.0} ops (DENOISER_KERNELS {} + {} per block x {}), {:.0} fp32 elements written (9.5 hidden + 6 hidden per block + side^2)",
                param_count(m.params),
                DENOISER_KERNELS + DENOISER_BLOCK_KERNELS * m.layers as f64,
                DENOISER_KERNELS,
                DENOISER_BLOCK_KERNELS,
                m.layers,
                forward_elements(m)
            ),
            format!(
                "per step and micro-group: guidance {} ops + 5 side^2 per image, posterior mean {} ops + 7 side^2, noise and log-prob {} + {} per image ops + 6 side^2; per micro-group x_T, clamp, finiteness {} + {} per image ops + 3 side^2 (ddpm.rs, run.rs)",
                if two { GUIDED_EPS_KERNELS } else { 1.0 },
                POSTERIOR_MEAN_KERNELS,
                NOISE_KERNELS + LOGPROB_KERNELS,
                NOISE_KERNELS_PER_IMAGE,
                MICRO_GROUP_KERNELS,
                NOISE_KERNELS_PER_IMAGE
            ),
            format!(
                "{}; {} per micro-group; the Rust RNG's normals not counted",
                work_note(&denoise_work, "per RL step"),
                ms(d_s)
            ),
            embedded::rate_note(r),
        ], evidence: Evidence::measured(sources::CPU_RATES) };
    (denoise, d_s)
}

/// Scoring: per micro-group on the reward thread. Returns the step's estimate and one
/// micro-group's seconds (its compute and the recipe's stand-in latency).
pub(super) fn reward_time(
    d: &Diffusion,
    sh: &Shape,
    r: &time::Rate,
    host: &HostSpec,
    cls_params: u64,
) -> Option<(Estimate, f64)> {
    let m = &d.model;
    let (n, mg) = (sh.n, sh.mg);
    d.reward.as_ref().map(|rw| {
        let mut w = classifier_forward(m.side, m.conditions, mg as f64);
        if rw.analytic {
            w = w + analytic(m, mg as f64);
        }
        let compute = work_seconds(&w, r);
        let per = compute + rw.extra_cost_s;
        let mut notes = vec![
            format!(
                "per micro-group of {mg}: classifier ({} params; {:.3e} FLOPs per image, convolutions at the matmul rate; {} ops, reward.rs `score`){}: {}",
                param_count(cls_params),
                classifier_flops(m.side, m.conditions),
                CLASSIFIER_KERNELS,
                if rw.analytic { format!(" + analytic ({ANALYTIC_KERNELS} ops, a pixel copy)") } else { String::new() },
                ms(compute)
            ),
            format!("extra_cost {} slept per micro-group (the recipe's stand-in latency)", ms(rw.extra_cost_s)),
            format!(
                "{n} micro-group(s): {}; on the reward stage's one libtorch thread",
                work_note(&w.scale(n as f64), "per RL step")
            ),
        ];
        if rw.streaming && host.cpus < 2 {
            notes.push(format!(
                "cpus = {}: the reward thread's compute shares the core with denoising (not modelled; only its sleep overlaps for certain)",
                host.cpus
            ));
        }
        (Estimate { seconds: per * n as f64, assumptions: notes, evidence: Evidence::measured(sources::CPU_RATES) }, per)
    })
}

/// Training: per micro-group and trained step, forward + backward (+ reference), then AdamW.
pub(super) fn train_time(d: &Diffusion, sh: &Shape, r: &time::Rate) -> Option<Estimate> {
    let m = &d.model;
    let (n, mg, t, f, two, kl, trained) = (sh.n, sh.mg, sh.t, sh.f, sh.two, sh.kl, sh.trained);
    d.train.as_ref().map(|tr| {
        let per = trained_step(m, mg as f64, two, kl);
        let opt = adam(denoiser_tensors(m), m.params as f64);
        let w = per.scale((n * trained) as f64)
            + opt
            + Work { kernels: n as f64, ..Work::default() };
        let graph = trained_step_graph(m, mg as f64, two, kl);
        Estimate {
            seconds: work_seconds(&w, r),
            assumptions: vec![
                format!(
                    "{n} micro-group(s) x {trained} trained step(s) of {t} x {mg} images: the step's mean with gradients ({f} row(s) per image), log-prob ({LOGPROB_KERNELS} ops), clipped loss ({LOSS_KERNELS} ops, embedded.rs LOSS_KERNELS){}; backward 2x its FLOPs, ops and bytes",
                    if kl { format!(" + KL ({KL_KERNELS} ops)") } else { String::new() }
                ),
                if kl {
                    format!("kl_coef {}: the frozen reference's no-grad mean per trained step (same rows)", tr.kl_coef)
                } else {
                    "kl_coef 0: no reference forward".into()
                },
                format!(
                    "AdamW: {} ops x {:.0} tensors, {} B per parameter (as embedded.rs)",
                    ADAM_KERNELS_PER_TENSOR,
                    denoiser_tensors(m),
                    ADAM_BYTES_PER_PARAM
                ),
                format!("{}; one trained step's graph {:.2} MB", work_note(&w, "per RL step"), graph.bytes / 1e6),
                embedded::rate_note(r),
            ], evidence: Evidence::measured(sources::CPU_RATES) }
    })
}

/// Once per evaluation, outside the step: the held-out images denoised, scored and judged.
pub(super) fn eval_time(d: &Diffusion, sh: &Shape, r: &time::Rate) -> Option<Estimate> {
    let m = &d.model;
    let (t, two) = (sh.t, sh.two);
    let judge = d.eval.as_ref().is_some_and(|e| e.judge_steps > 0);
    d.eval.as_ref().map(|e| {
        let k = e.samples.max(1) as f64;
        let mut w = denoise_micro_group(m, k, t as f64, two) + classifier_forward(m.side, m.conditions, k);
        if d.reward.as_ref().is_some_and(|rw| rw.analytic) {
            w = w + analytic(m, k);
        }
        if judge {
            w = w + classifier_forward(m.side, m.conditions, k);
        }
        let extra = d.reward.as_ref().map_or(0.0, |rw| rw.extra_cost_s);
        Estimate {
            seconds: work_seconds(&w, r) + extra,
            assumptions: vec![
                format!(
                    "{} held-out images denoised at once ({t} steps), scored (extra_cost once){}; every {} steps and at step 0, not in the step time",
                    e.samples,
                    if judge { " and judged" } else { "" },
                    e.every
                ),
                format!("{}; the grid SVG and the checkpoint write not counted", work_note(&w, "per evaluation")),
            ], evidence: Evidence::measured(sources::CPU_RATES) }
    })
}

/// Once, before RL: the denoiser's pretraining.
pub(super) fn pretrain_time(d: &Diffusion, r: &time::Rate) -> Option<Estimate> {
    let m = &d.model;
    d.pretrain.as_ref().map(|p| {
        let w = pretrain_step(m, p.batch as f64).scale(p.steps as f64);
        Estimate {
            seconds: work_seconds(&w, r),
            assumptions: vec![
                format!(
                    "{} steps x {} images: forward + denoising loss ({PRETRAIN_LOSS_KERNELS} ops, 6 side^2 per image) + backward (2x) + AdamW; the domain's images (drawn in Rust) not counted",
                    p.steps, p.batch
                ),
                work_note(&w, "in all"),
            ], evidence: Evidence::measured(sources::CPU_RATES) }
    })
}

/// Once, before RL: the reward classifier's and the judge's training.
pub(super) fn classifiers_time(d: &Diffusion, r: &time::Rate, cls_params: u64) -> Option<Estimate> {
    let m = &d.model;
    let cls_steps = d.reward.as_ref().and_then(|rw| rw.classifier_steps).unwrap_or(0);
    let judge_steps = d.eval.as_ref().map_or(0, |e| e.judge_steps);
    (cls_steps + judge_steps > 0).then(|| {
        let b = CLASSIFIER_BATCH as f64;
        let fwd = classifier_forward(m.side, m.conditions, b);
        let step = fwd + embedded::backward(fwd) + adam(CLS_TENSORS, cls_params as f64);
        let w = step.scale((cls_steps + judge_steps) as f64);
        Estimate {
            seconds: work_seconds(&w, r),
            assumptions: vec![
                format!(
                    "{} x {CLASSIFIER_BATCH} images: forward + backward (2x) + Adam over {CLS_TENSORS} tensors; the domain's images not counted",
                    match (cls_steps, judge_steps) {
                        (0, j) => format!("judge {j} steps"),
                        (c, 0) => format!("reward classifier {c} steps"),
                        (c, j) => format!("reward classifier {c} + judge {j} steps"),
                    }
                ),
                work_note(&w, "in all"),
            ], evidence: Evidence::measured(sources::CPU_RATES) }
    })
}
