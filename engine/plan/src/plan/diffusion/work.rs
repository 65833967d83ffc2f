//! The work a diffusion step does, counted from the engine's code (engine/tch/src/diffusion):
//! FLOPs, ATen ops and bytes of each denoiser forward, sampler step, trained step, pretraining
//! step and classifier pass.

use super::*;

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
pub(super) const CLS_C1: u64 = 8;
pub(super) const CLS_C2: u64 = 16;
pub(super) const CLS_HIDDEN: u64 = 64;
/// Tensors of a classifier (two convs and two linear layers, weight and bias each).
pub(super) const CLS_TENSORS: f64 = 8.0;

pub(super) fn pixels(m: &DenoiserSpec) -> f64 {
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
pub(super) fn step_mean(m: &DenoiserSpec, images: f64, two: bool) -> Work {
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
pub(super) fn adam(tensors: f64, params: f64) -> Work {
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
pub(super) fn pooled(side: u64) -> (u64, u64) {
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
pub(super) fn analytic(m: &DenoiserSpec, images: f64) -> Work {
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
