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
use crate::input::*;
use crate::output::*;
use crate::time::{self, work_seconds, Work};
use crate::units::{bytes_fixed, gb_fixed, params as param_count};
use miles_grammar::diag::Diagnostic;
use miles_grammar::diag::ErrorCode;

/// ATen ops of `Denoiser::forward` (model.rs) outside the blocks: the input view; the timestep
/// sinusoid (to_kind, two unsqueezes, mul, sin, cos, cat) and its linear layer; the input
/// linear, the condition lookup and two adds; the output norm, SiLU, linear and view.
pub const DENOISER_KERNELS: f64 = 17.0;
/// Each residual block: layer norm, SiLU, fc1, SiLU, fc2, the residual add.
pub const DENOISER_BLOCK_KERNELS: f64 = 6.0;
/// `guided_eps` (ddpm.rs) with both terms: two timestep/condition fills, three cats, two
/// narrows and the combination e_u + w (e_c - e_u). With one term (guidance 0 or 1): one fill.
pub const GUIDED_EPS_KERNELS: f64 = 10.0;
/// `posterior_mean`: x0 from eps (mul, sub, div), clamp, c0 x0 + ct x_t (two muls, add).
pub const POSTERIOR_MEAN_KERNELS: f64 = 7.0;
/// `gaussian_logprob`: sub, square, sum, div, sub.
pub const LOGPROB_KERNELS: f64 = 5.0;
/// A sampler step's noise beyond its per-row draws: the cat of the rows, x sigma, + mean.
pub const NOISE_KERNELS: f64 = 3.0;
/// Noise per image: `normals` makes each row's tensor (from_slice, view).
pub const NOISE_KERNELS_PER_IMAGE: f64 = 2.0;
/// Per micro-group outside the steps: x_T's cat, the condition ids, the images' clamp and the
/// finiteness check (isfinite, logical_not, reshape, any, copy out) (ddpm.rs, run.rs).
pub const MICRO_GROUP_KERNELS: f64 = 8.0;
/// `gaussian_kl` (sub, square, sum, div), its mean, x kl_coef and the add to the loss (rl.rs).
pub const KL_KERNELS: f64 = 7.0;
/// `pretrain_loss` (ddpm.rs) besides the forward: the two coefficient columns (from_slice,
/// view each), q_sample's two muls and add, the noise (from_slice, view), the timestep and
/// condition ids, sub, square, mean, and the loss read back.
pub const PRETRAIN_LOSS_KERNELS: f64 = 14.0;
/// `Classifier::score` (reward.rs): to_kind, the index tensor (from_slice, view), two blocks of
/// conv2d, ReLU and max-pool, flatten, linear, ReLU, linear, the temperature, softmax, gather,
/// view; and `finite_rows`' detach, to_kind, contiguous and view.
pub const CLASSIFIER_KERNELS: f64 = 21.0;
/// An analytic reward: `finite_rows`' four ops; the property itself is computed in Rust.
pub const ANALYTIC_KERNELS: f64 = 4.0;
/// Images per classifier training step (run.rs: `train_on_domain(..., 32, ...)`).
pub const CLASSIFIER_BATCH: u64 = 32;
/// The classifier's channels and hidden width (reward.rs `C1`, `C2`, `HIDDEN`).
const CLS_C1: u64 = 8;
const CLS_C2: u64 = 16;
const CLS_HIDDEN: u64 = 64;
/// Tensors of a classifier (two convs and two linear layers, weight and bias each).
const CLS_TENSORS: f64 = 8.0;

fn pixels(m: &DenoiserSpec) -> f64 {
    (m.side * m.side) as f64
}

/// Classifier-free guidance runs the conditional and the null rows (guidance other than 0 and 1).
pub(crate) fn two_terms(guidance: f64) -> bool {
    guidance != 0.0 && guidance != 1.0
}

/// Denoiser rows per image and denoising step.
pub(crate) fn forwards_per_step(guidance: f64) -> u64 {
    if two_terms(guidance) {
        2
    } else {
        1
    }
}

/// Trainable tensors of the denoiser: in, time (weight, bias each), the condition table, 6 per
/// block, the output norm and linear (weight, bias each).
pub(crate) fn denoiser_tensors(m: &DenoiserSpec) -> f64 {
    9.0 + 6.0 * m.layers as f64
}

/// FP32 elements one denoiser row's forward writes: the sinusoid (h/2 three times, the cat h),
/// the time and input linears, the lookup and two adds (7.5 h in all); 6 h per block; the output
/// norm and SiLU (2 h) and the output (S^2).
pub(crate) fn forward_elements(m: &DenoiserSpec) -> f64 {
    let h = m.hidden as f64;
    9.5 * h + 6.0 * h * m.layers as f64 + pixels(m)
}

/// One denoiser forward over `rows` rows: 2 x params FLOPs per row (the record's `params`:
/// biases, norms and the condition table are counted, an upper bound of ~1%).
pub(crate) fn forward(m: &DenoiserSpec, rows: f64) -> Work {
    Work {
        flops: 2.0 * m.params as f64 * rows,
        kernels: DENOISER_KERNELS + DENOISER_BLOCK_KERNELS * m.layers as f64,
        bytes: 4.0 * rows * forward_elements(m),
    }
}

/// The guided noise prediction and posterior mean of `images` images at one step: the forward
/// (two rows per image under guidance), guidance's cats and combination (2 + 3 S^2 per image),
/// the posterior mean (7 S^2 per image).
fn step_mean(m: &DenoiserSpec, images: f64, two: bool) -> Work {
    let s2 = pixels(m);
    let rows = if two { 2.0 } else { 1.0 } * images;
    let guided = if two {
        Work { flops: 0.0, kernels: GUIDED_EPS_KERNELS, bytes: 4.0 * images * 5.0 * s2 }
    } else {
        Work { flops: 0.0, kernels: 1.0, bytes: 0.0 }
    };
    forward(m, rows) + guided + Work { flops: 0.0, kernels: POSTERIOR_MEAN_KERNELS, bytes: 4.0 * images * 7.0 * s2 }
}

/// One sampler step of a micro-group (ddpm.rs `sample`): the mean, the noise (its rows, cat,
/// x sigma, + mean: 4 S^2 per image) and the log-probability (2 S^2 per image).
pub(crate) fn sampler_step(m: &DenoiserSpec, images: f64, two: bool) -> Work {
    step_mean(m, images, two)
        + Work {
            flops: 0.0,
            kernels: NOISE_KERNELS + LOGPROB_KERNELS + NOISE_KERNELS_PER_IMAGE * images,
            bytes: 4.0 * images * 6.0 * pixels(m),
        }
}

/// Denoising one micro-group: T sampler steps, then x_T's noise, the clamp and the finiteness
/// check (3 S^2 per image).
pub(crate) fn denoise_micro_group(m: &DenoiserSpec, images: f64, steps: f64, two: bool) -> Work {
    sampler_step(m, images, two).scale(steps)
        + Work {
            flops: 0.0,
            kernels: MICRO_GROUP_KERNELS + NOISE_KERNELS_PER_IMAGE * images,
            bytes: 4.0 * images * 3.0 * pixels(m),
        }
}

/// The forward of one trained step of one micro-group, whose graph the backward pass walks
/// (rl.rs `accumulate_rl_gradients`): the mean with gradients, the log-probability, the
/// clipped loss (`embedded::LOSS_KERNELS`) and with a KL term its 2 S^2 per image and ops. Its bytes
/// are what autograd keeps until that step's backward.
pub(crate) fn trained_step_graph(m: &DenoiserSpec, images: f64, two: bool, kl: bool) -> Work {
    let s2 = pixels(m);
    step_mean(m, images, two)
        + Work {
            flops: 0.0,
            // The condition ids, the log-prob, the loss, and the loss / steps before backward.
            kernels: 1.0 + LOGPROB_KERNELS + LOSS_KERNELS + 1.0 + if kl { KL_KERNELS } else { 0.0 },
            bytes: 4.0 * images * if kl { 4.0 } else { 2.0 } * s2,
        }
}

/// One trained step of one micro-group: the graph's forward and its backward (2 x its FLOPs,
/// ops and bytes: `embedded::backward`), plus the frozen reference's no-grad mean when kl_coef > 0.
pub(crate) fn trained_step(m: &DenoiserSpec, images: f64, two: bool, kl: bool) -> Work {
    let g = trained_step_graph(m, images, two, kl);
    let reference =
        if kl { step_mean(m, images, two) + Work { kernels: 1.0, ..Work::default() } } else { Work::default() };
    g + embedded::backward(g) + reference
}

/// AdamW over `tensors` tensors of `params` parameters (the trainer's `adam_step`, as
/// `embedded::train_step` counts it).
fn adam(tensors: f64, params: f64) -> Work {
    Work { flops: 0.0, kernels: ADAM_KERNELS_PER_TENSOR * tensors, bytes: ADAM_BYTES_PER_PARAM * params }
}

/// One pretraining step of `batch` images: forward, the denoising loss (6 S^2 per image),
/// backward (2x), AdamW.
pub(crate) fn pretrain_step(m: &DenoiserSpec, batch: f64) -> Work {
    let g =
        forward(m, batch) + Work { flops: 0.0, kernels: PRETRAIN_LOSS_KERNELS, bytes: 4.0 * batch * 6.0 * pixels(m) };
    g + embedded::backward(g) + adam(denoiser_tensors(m), m.params as f64)
}

/// Side after the two 2x2 max-pools (floor, as libtorch's pool and reward.rs's `side / 4`).
fn pooled(side: u64) -> (u64, u64) {
    (side / 2, side / 4)
}

/// Parameters of the reward classifier (reward.rs `param_shapes`): conv 1->8 3x3, conv 8->16
/// 3x3, fc 16 (side/4)^2 -> 64, fc 64 -> conditions, with biases.
pub(crate) fn classifier_params(side: u64, conditions: u64) -> u64 {
    let (_, p2) = pooled(side);
    CLS_C1 * 9
        + CLS_C1
        + CLS_C2 * CLS_C1 * 9
        + CLS_C2
        + CLS_HIDDEN * CLS_C2 * p2 * p2
        + CLS_HIDDEN
        + conditions * CLS_HIDDEN
        + conditions
}

/// FLOPs of the classifier on one image: 2 x multiply-adds of conv1 (9 C1 S^2), conv2
/// (9 C1 C2 (S/2)^2), fc1 (C2 (S/4)^2 x 64) and fc2 (64 K).
pub(crate) fn classifier_flops(side: u64, conditions: u64) -> f64 {
    let (p1, p2) = pooled(side);
    2.0 * (9 * CLS_C1 * side * side
        + 9 * CLS_C1 * CLS_C2 * p1 * p1
        + CLS_C2 * p2 * p2 * CLS_HIDDEN
        + CLS_HIDDEN * conditions) as f64
}

/// Scoring `images` images (reward.rs `score`): FLOPs above, `CLASSIFIER_KERNELS` ops, and the
/// fp32 outputs: the pixel copy (S^2), conv1 and its ReLU (2 C1 S^2), the pool, conv2 and ReLU
/// (C1 + 2 C2 (S/2)^2), the pool (C2 (S/4)^2), fc1 and ReLU (128), fc2, temperature, softmax (3K).
pub(crate) fn classifier_forward(side: u64, conditions: u64, images: f64) -> Work {
    let (p1, p2) = pooled(side);
    let s2 = side * side;
    let elements = s2
        + 2 * CLS_C1 * s2
        + CLS_C1 * p1 * p1
        + 2 * CLS_C2 * p1 * p1
        + CLS_C2 * p2 * p2
        + 2 * CLS_HIDDEN
        + 3 * conditions;
    Work {
        flops: images * classifier_flops(side, conditions),
        kernels: CLASSIFIER_KERNELS,
        bytes: 4.0 * images * elements as f64,
    }
}

/// An analytic term over `images` images: `finite_rows`' ops and its pixel copy.
fn analytic(m: &DenoiserSpec, images: f64) -> Work {
    Work { flops: 0.0, kernels: ANALYTIC_KERNELS, bytes: 4.0 * images * pixels(m) }
}

/// The rollout of `n` micro-groups of denoising time `d` and scoring time `r` each: with every
/// micro-group scored after the last one, n d + n r; streamed (k scored while k + 1 denoises), a
/// two-stage pipeline, d + (n - 1) max(d, r) + r. Returns (whole batch, streamed).
pub(crate) fn rollout_times(n: u64, d: f64, r: f64) -> (f64, f64) {
    if n == 0 {
        return (0.0, 0.0);
    }
    let n = n as f64;
    (n * d + n * r, d + (n - 1.0) * d.max(r) + r)
}

/// Host bytes of `images` trajectories of T steps: (T + 1) latents and T means of S^2 fp32
/// pixels, and T f64 log-probabilities per image (ddpm.rs `Trajectory`).
pub(crate) fn trajectory_bytes(m: &DenoiserSpec, images: u64, steps: u64) -> f64 {
    let (i, t) = (images as f64, steps as f64);
    i * ((2.0 * t + 1.0) * pixels(m) * 4.0 + t * 8.0)
}

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
    let train_step = train.clone().unwrap_or(Estimate { seconds: 0.0, assumptions: Vec::new() });
    let step = StepReport {
        mode: input.schedule.mode.value,
        rollout_s,
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
        step: Estimate { seconds: step_s, assumptions: notes },
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

/// Denoising: n micro-groups of mg images, one after another on the main thread. Returns the
/// step's estimate and one micro-group's seconds.
fn denoise_time(d: &Diffusion, sh: &Shape, r: &time::Rate) -> (Estimate, f64) {
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
        ],
    };
    (denoise, d_s)
}

/// Scoring: per micro-group on the reward thread. Returns the step's estimate and one
/// micro-group's seconds (its compute and the recipe's stand-in latency).
fn reward_time(d: &Diffusion, sh: &Shape, r: &time::Rate, host: &HostSpec, cls_params: u64) -> Option<(Estimate, f64)> {
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
        (Estimate { seconds: per * n as f64, assumptions: notes }, per)
    })
}

/// Training: per micro-group and trained step, forward + backward (+ reference), then AdamW.
fn train_time(d: &Diffusion, sh: &Shape, r: &time::Rate) -> Option<Estimate> {
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
            ],
        }
    })
}

/// Once per evaluation, outside the step: the held-out images denoised, scored and judged.
fn eval_time(d: &Diffusion, sh: &Shape, r: &time::Rate) -> Option<Estimate> {
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
            ],
        }
    })
}

/// Once, before RL: the denoiser's pretraining.
fn pretrain_time(d: &Diffusion, r: &time::Rate) -> Option<Estimate> {
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
            ],
        }
    })
}

/// Once, before RL: the reward classifier's and the judge's training.
fn classifiers_time(d: &Diffusion, r: &time::Rate, cls_params: u64) -> Option<Estimate> {
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
            ],
        }
    })
}

/// Memory of the one process, item by item, checked against the host's (E0401).
fn plan_memory(
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
    });
}

/// The process's rows: the denoiser's weights, gradients and AdamW state, the KL reference, the
/// classifiers, the step's trajectories, the evaluation's, the larger of RL's and pretraining's
/// activations, and the process's resident base.
fn memory_items(d: &Diffusion, sh: &Shape, a: &Assumptions, cls_params: u64) -> Vec<MemItem> {
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
fn weight_syncs(input: &PlanInput, m: &DenoiserSpec) -> Vec<SyncReport> {
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
            },
            alternatives: Vec::new(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// side 4 (16 px), 2 conditions, hidden 8, 1 block. The stdlib's count: 2 x 8 x 16 + 16 +
    /// 64 + 4 x 8 + 3 x 8 + (2 x 64 + 4 x 8) = 552, as model.rs lays it out (in 136, time 72,
    /// cond 24, block 160, out_norm 16, out 144).
    fn tiny() -> DenoiserSpec {
        DenoiserSpec { side: 4, conditions: 2, hidden: 8, layers: 1, params: 552 }
    }

    fn work(flops: f64, kernels: f64, bytes: f64) -> Work {
        Work { flops, kernels, bytes }
    }

    #[test]
    fn denoiser_forward_and_sampler_by_hand() {
        let m = tiny();
        // 9.5 x 8 + 6 x 8 + 16 = 140 elements per row.
        assert_eq!(forward_elements(&m), 140.0);
        // One row: 2 x 552 FLOPs, 17 + 6 ops, 140 x 4 B.
        assert_eq!(forward(&m, 1.0), work(1104.0, 23.0, 560.0));
        // One image under guidance: 2 rows (2208, 23, 1120), guidance (10 ops, 5 x 16 x 4 = 320 B),
        // posterior mean (7, 448 B), noise and log-prob (3 + 5 + 2 ops, 6 x 16 x 4 = 384 B).
        assert_eq!(sampler_step(&m, 1.0, true), work(2208.0, 50.0, 2272.0));
        // Without guidance: one row, one fill, no cats.
        assert_eq!(sampler_step(&m, 1.0, false), work(1104.0, 23.0 + 1.0 + 7.0 + 10.0, 560.0 + 448.0 + 384.0));
        // Two steps, then x_T, clamp and the check (8 + 2 ops, 3 x 16 x 4 = 192 B).
        assert_eq!(denoise_micro_group(&m, 1.0, 2.0, true), work(4416.0, 110.0, 4736.0));
        assert_eq!((forwards_per_step(3.0), forwards_per_step(1.0), forwards_per_step(0.0)), (2, 1, 1));
    }

    #[test]
    fn trained_step_by_hand() {
        let m = tiny();
        // The mean with gradients (2208, 40, 1888) + ids, log-prob, loss, / steps, KL
        // (1 + 5 + 20 + 1 + 7 = 34 ops) and log-prob + KL's 4 x 16 x 4 = 256 B.
        let g = trained_step_graph(&m, 1.0, true, true);
        assert_eq!(g, work(2208.0, 74.0, 2144.0));
        // Forward + backward (3x) + the reference's no-grad mean (2208, 41, 1888).
        assert_eq!(
            trained_step(&m, 1.0, true, true),
            work(3.0 * 2208.0 + 2208.0, 3.0 * 74.0 + 41.0, 3.0 * 2144.0 + 1888.0)
        );
        // No KL: no reference, no KL ops or bytes.
        assert_eq!(trained_step(&m, 1.0, true, false), work(3.0 * 2208.0, 3.0 * 67.0, 3.0 * 2016.0));
        // Pretraining one image: forward (1104, 23, 560) + loss (14 ops, 6 x 16 x 4 = 384 B), x3,
        // + AdamW 12 x 15 tensors and 28 x 552 B.
        assert_eq!(denoiser_tensors(&m), 15.0);
        assert_eq!(pretrain_step(&m, 1.0), work(3.0 * 1104.0, 3.0 * 37.0 + 180.0, 3.0 * 944.0 + 28.0 * 552.0));
    }

    #[test]
    fn classifier_by_hand() {
        // side 4: pools to 2 and 1. conv1 8 x 9 + 8, conv2 16 x 8 x 9 + 16, fc1 64 x 16 + 64,
        // fc2 2 x 64 + 2.
        assert_eq!(classifier_params(4, 2), 80 + 1168 + 1088 + 130);
        // The recipe's 16x16 of 8 classes: fc1 reads 16 x 4 x 4.
        assert_eq!(classifier_params(16, 8), 80 + 1168 + 16_448 + 520);
        // 2 x (9 x 8 x 16 + 9 x 8 x 16 x 4 + 16 x 64 + 64 x 2).
        assert_eq!(classifier_flops(4, 2), 2.0 * (1152.0 + 4608.0 + 1024.0 + 128.0));
        // Elements: 16 + 2 x 8 x 16 + 8 x 4 + 2 x 16 x 4 + 16 + 128 + 6 = 582 per image.
        assert_eq!(classifier_forward(4, 2, 2.0), work(2.0 * 13_824.0, 21.0, 2.0 * 4.0 * 582.0));
    }

    #[test]
    fn streaming_pipeline_both_ways() {
        // Denoising slower than scoring: the reward of each but the last hides behind the next
        // micro-group; whole batch n d + n r.
        assert_eq!(rollout_times(4, 20.0, 5.0), (100.0, 20.0 + 3.0 * 20.0 + 5.0));
        // Scoring slower: the reward thread is the bottleneck, d + (n - 1) r + r.
        assert_eq!(rollout_times(4, 10.0, 15.0), (100.0, 10.0 + 3.0 * 15.0 + 15.0));
        // One micro-group: nothing to overlap.
        assert_eq!(rollout_times(1, 10.0, 15.0), (25.0, 25.0));
        assert_eq!(rollout_times(0, 10.0, 15.0), (0.0, 0.0));
        // Streaming never loses: whole - streamed = (n - 1) min(d, r).
        let (w, s) = rollout_times(5, 7.0, 3.0);
        assert!((w - s - 4.0 * 3.0).abs() < 1e-12);
    }

    #[test]
    fn trajectories_by_hand() {
        // 2 images x ((2 x 3 + 1) x 16 px x 4 B + 3 x 8 B) = 2 x 472.
        assert_eq!(trajectory_bytes(&tiny(), 2, 3), 944.0);
    }

    fn input(extra_cost_s: f64, streaming: bool) -> PlanInput {
        let d = Diffusion {
            model: tiny(),
            pretrain: Some(DenoisePretrain { stage: "pretrain".into(), steps: 10, batch: 4 }),
            rollout: DenoiseRollout {
                stage: "rollout".into(),
                steps: 3,
                guidance: 3.0,
                samples_per_condition: 2,
                micro_group: 2,
            },
            reward: Some(ImageReward {
                stage: "reward".into(),
                streaming,
                extra_cost_s,
                classifier_steps: Some(7),
                analytic: false,
                process: false,
            }),
            train: Some(DiffusionTrainer {
                stage: "train".into(),
                conditions_per_step: 2,
                train_steps: None,
                kl_coef: 0.01,
            }),
            eval: Some(ImageEval { stage: "eval".into(), every: 5, samples: 2, judge_steps: 5 }),
        };
        let stage = |name: &str, kind: &str, role: Role| Stage {
            teacher: None,
            name: name.into(),
            kind: kind.into(),
            role,
            model: None,
            gpus: None,
            engine: None,
            trainer: None,
            span: None,
        };
        PlanInput {
            recipe: "tiny".into(),
            cluster: Cluster {
                name: "laptop".into(),
                pools: Vec::new(),
                host: Some(HostSpec {
                    name: "laptop".into(),
                    cpus: 2,
                    memory: 16_000_000_000,
                    memory_bandwidth: 18e9,
                    fp32: None,
                }),
                span: None,
            },
            device: None,
            stages: vec![
                stage("pretrain", "denoise_pretrain", Role::Train),
                stage("rollout", "denoise", Role::Rollout),
                stage("reward", "image_reward", Role::Reward),
                stage("train", "diffusion_grpo", Role::Train),
                stage("eval", "image_eval", Role::Other),
            ],
            graph: Graph::default(),
            placement: Placement { diffusion: Some(d), ..Placement::default() },
            syncs: Vec::new(),
            schedule: Schedule::default(),
            batch: Batch::default(),
            r3: Spanned::new(false),
            r3_id_bytes: None,
            episodes: None,
            assumptions: Assumptions::default(),
        }
    }

    #[test]
    fn memory_items_by_hand() {
        let p = crate::plan(&input(0.0, true));
        assert_eq!(p.summary.errors, 0, "{:?}", p.diagnostics);
        assert_eq!(p.memory.len(), 1);
        let m = &p.memory[0];
        assert_eq!((m.stage.as_str(), m.device.as_str()), ("train", "laptop"));
        let items: Vec<(&str, u64)> = m.items.iter().map(|i| (i.name.as_str(), i.bytes)).collect();
        // 552 params: 4 B weights, gradients, reference (kl_coef > 0); 8 B for AdamW's moments
        // (the pretraining optimizer is freed before RL).
        // Classifier 2,466 params x 4 B, twice with the judge. Trajectories: 2 conditions x 2
        // samples = 4 images x 472 B (T = 3); the eval's 2 images x 472 B. Activations: one
        // trained step of 2 images under guidance, 4 rows x 140 x 4 + 2 x (320 + 448 + 256) =
        // 4,288 B x 1.4 = 6,003 B (pretraining's 4 images x (140 + 96) x 4 B x 1.4 = 5,286 B is
        // smaller).
        assert_eq!(
            items,
            vec![
                ("weights", 2208),
                ("gradients", 2208),
                ("optimizer", 4416),
                ("reference", 2208),
                ("classifier", 9864),
                ("judge", 9864),
                ("trajectories", 1888),
                ("eval_trajectory", 944),
                ("activations", 6003),
                ("embedded_process", 140_000_000),
            ]
        );
        assert_eq!(m.total, 140_039_603);
        assert!(m.fits);
        // The batch arithmetic, and the one sync priced at nothing.
        let d = p.diffusion.as_ref().expect("diffusion report");
        let b = &d.batch;
        assert_eq!(
            (b.images_per_step, b.micro_groups_per_step, b.denoising_steps, b.trained_steps, b.forwards_per_step),
            (4, 2, 3, 3, 2)
        );
        assert_eq!(p.stages[1].layout, "embedded sampler (the trainer's process)");
        assert_eq!(p.stages[1].model.as_deref(), Some("denoiser 4x4 h8 x1"));
    }

    #[test]
    fn step_phases_follow_the_cpu_model() {
        let a = Assumptions::default();
        let r = embedded::rate(&a);
        let m = tiny();
        let p = crate::plan(&input(0.0, true));
        let d = p.diffusion.as_ref().unwrap();
        // Denoise: 2 micro-groups of 2 images x 3 steps.
        let dmg = work_seconds(&denoise_micro_group(&m, 2.0, 3.0, true), &r);
        assert!((d.denoise_micro_group_s - dmg).abs() < 1e-15);
        assert!((d.step.denoise_s - 2.0 * dmg).abs() < 1e-15);
        // Train FLOPs: 2 micro-groups x 3 steps x (3 x 4 rows + 4 reference rows) x 1104.
        let w = trained_step(&m, 2.0, true, true);
        assert_eq!(w.flops, 16.0 * 1104.0);
        let train = work_seconds(&(w.scale(6.0) + adam(15.0, 552.0) + Work { kernels: 2.0, ..Work::default() }), &r);
        assert!((d.step.train_s - train).abs() < 1e-15);
        // The step is the report's: rollout + train, nothing for sync.
        let st = p.step.as_ref().unwrap();
        assert_eq!(
            (st.rollout_s, st.train_s, st.sync_s, st.step.seconds),
            (d.step.rollout_s, d.step.train_s, 0.0, d.step.step_s)
        );
        assert!((d.step.step_s - d.step.rollout_s - d.step.train_s).abs() < 1e-15);
        assert!((d.step.reward_wait_s - (d.step.rollout_s - d.step.denoise_s)).abs() < 1e-15);
        // One-offs are reported apart from the step.
        assert!(d.pretrain.as_ref().unwrap().seconds > 0.0 && d.one_off_s > d.step.step_s);
    }

    #[test]
    fn streaming_plans_both_ways_with_a_slow_reward() {
        // extra_cost 50 ms per micro-group: scoring is far slower than denoising.
        for streaming in [true, false] {
            let p = crate::plan(&input(0.05, streaming));
            let d = p.diffusion.as_ref().unwrap();
            let (dd, rr) = (d.denoise_micro_group_s, d.reward_micro_group_s);
            assert!(rr > dd && rr >= 0.05);
            assert!((d.whole_batch_s - (2.0 * dd + 2.0 * rr)).abs() < 1e-12);
            assert!((d.streamed_s - (dd + rr + rr)).abs() < 1e-12);
            let want = if streaming { d.streamed_s } else { d.whole_batch_s };
            assert_eq!(d.step.rollout_s, want);
            assert_eq!(p.step.as_ref().unwrap().rollout_s, want);
        }
    }

    #[test]
    fn over_host_memory_is_e0401() {
        let mut i = input(0.0, true);
        if let Some(h) = i.cluster.host.as_mut() {
            h.memory = 100_000_000;
        }
        let p = crate::plan(&i);
        assert!(!p.memory[0].fits);
        assert_eq!(p.diagnostics.iter().map(|d| d.code).collect::<Vec<_>>(), vec!["E0401"]);
    }
}
