//! Diffusion RL's math against hand-computed values (the arithmetic is written out beside each
//! check), and the sampler's properties: seeded, batch-independent rows, and log-probabilities
//! that a recomputation under the same weights reproduces.

use miles_runtime::rng::Rng;
use miles_runtime::TrainSpec;
use miles_tch::diffusion::ddpm::{
    gaussian_logprob, pretrain_loss, sample, step_logprob, SampleParams, Schedule, ScheduleKind,
};
use miles_tch::diffusion::model::{Denoiser, DenoiserConfig};
use miles_tch::diffusion::rl::{
    accumulate_rl_gradients, choose_steps, clipped_loss, gaussian_kl, group_advantages, recompute_logprobs,
    DenoiserAdam, RlLossSpec,
};
use std::f64::consts::PI;
use tch::{Kind, Tensor};

/// Tests run in parallel threads: one intra-op thread each avoids OpenMP oversubscription.
fn one_thread() {
    tch::set_num_threads(1);
}

fn img(v: &[f32], side: i64) -> Tensor {
    Tensor::from_slice(v).view([-1, 1, side, side])
}

fn vals(x: &Tensor) -> Vec<f64> {
    Vec::<f64>::try_from(x.to_kind(Kind::Double).reshape([-1])).unwrap()
}

fn close(a: &[f64], b: &[f64], tol: f64) {
    assert_eq!(a.len(), b.len(), "{a:?} vs {b:?}");
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() <= tol, "{a:?} vs {b:?}");
    }
}

fn small() -> DenoiserConfig {
    DenoiserConfig { side: 4, conditions: 3, hidden: 16, layers: 2 }
}

fn train_spec() -> TrainSpec {
    serde_json::from_str(r#"{"lr": 0.003, "micro_batch": 8, "global_batch": 8}"#).unwrap()
}

#[test]
fn gaussian_logprob_of_a_2x2_step_by_hand() {
    one_thread();
    // mean (0, 0.5, -0.5, 1), x (0.1, 0.5, -0.3, 0.6), sigma 0.5:
    // diffs 0.1, 0, 0.2, -0.4 -> squares 0.01 + 0 + 0.04 + 0.16 = 0.21; / (2 * 0.25) = 0.42.
    // 4 pixels x (ln 0.5 + ln(2 pi) / 2) = 4 x (-0.693147 + 0.918939) = 0.903165.
    // log p = -0.42 - 0.903165 = -1.323165.
    let mean = img(&[0.0, 0.5, -0.5, 1.0], 2);
    let x = img(&[0.1, 0.5, -0.3, 0.6], 2);
    let lp = gaussian_logprob(&x, &mean, 0.5);
    assert_eq!(lp.size(), vec![1]);
    let by_hand = -0.21 / (2.0 * 0.25) - 4.0 * (0.5f64.ln() + 0.5 * (2.0 * PI).ln());
    close(&vals(&lp), &[by_hand], 1e-6);
    close(&vals(&lp), &[-1.323165], 1e-6);
    // 1x1, x at the mean, sigma 1: -ln(2 pi) / 2 = -0.918939. Two rows, each its own sum.
    let lp = gaussian_logprob(&img(&[0.3, 1.3], 1), &img(&[0.3, 0.3], 1), 1.0);
    close(&vals(&lp), &[-0.918939, -0.5 - 0.918939], 1e-6);
}

#[test]
fn schedules_by_hand() {
    // Linear over T = 50: betas from 1e-4 x 1000/50 = 0.002 to 0.02 x 1000/50 = 0.4, step 0.398 / 49.
    // alpha_bar[2] = (1 - 0.002)(1 - 0.0101224)(1 - 0.0182449) = 0.998 x 0.9898776 x 0.9817551
    //             = 0.9698737.
    let s = Schedule::new(ScheduleKind::Linear, 50).unwrap();
    close(&s.betas[..3], &[0.002, 0.010122449, 0.018244898], 1e-8);
    close(&[s.betas[49]], &[0.4], 1e-12);
    close(&[s.alpha_bar[2]], &[0.998 * (1.0 - 0.002 - 0.398 / 49.0) * (1.0 - 0.002 - 0.796 / 49.0)], 1e-12);
    close(&[s.alpha_bar[2]], &[0.9698737], 1e-7);
    // Posterior variance at t = 1: (1 - 0.998) / (1 - 0.9878978) x 0.0101224 = 0.0016728; sigma at
    // eta 0.5 is 0.5 sqrt(0.0016728). At t = 0 the floor: 0.5 sqrt(beta[0]) = 0.5 sqrt(0.002).
    close(&[s.posterior_variance(1)], &[0.002 / (1.0 - 0.9878977959) * 0.010122449], 1e-8);
    close(&[s.sigma(1, 0.5)], &[0.5 * 0.0016728273f64.sqrt()], 1e-8);
    close(&[s.sigma(0, 0.5)], &[0.5 * 0.002f64.sqrt()], 1e-12);
    // Linear over T = 20 reaches 0.02 * 50 = 1.0, clipped to 0.999.
    assert_eq!(*Schedule::linear(20).unwrap().betas.last().unwrap(), 0.999);
    // Cosine over T = 2: alpha_bar[0] = cos^2((0.5 + 0.008) / 1.008 x pi/2) / cos^2(0.008 / 1.008 x pi/2)
    //   = cos^2(0.79160) / cos^2(0.012467) = 0.493766 / 0.999845 = 0.493844.
    let c = Schedule::cosine(2).unwrap();
    close(&[c.alpha_bar[0]], &[0.493844], 1e-6);
}

#[test]
fn ratio_and_clipping_on_three_samples_by_hand() {
    one_thread();
    // r = 1.5, 0.7, 1.1; A = +1, -1, -2; clip 0.2.
    //   A=+1, r=1.5: max(-1.5, -1.2) = -1.2 (clipped)
    //   A=-1, r=0.7: max(0.7, 0.8)   =  0.8 (clipped)
    //   A=-2, r=1.1: max(2.2, 2.2)   =  2.2 (inside the band: not clipped)
    // loss = (-1.2 + 0.8 + 2.2) / 3 = 0.6; clip_frac = 2/3. Only the unclipped term has a
    // gradient: d/d logp_new of -A r / 3 = 2 x 1.1 / 3 = 0.733333.
    let old = Tensor::from_slice(&[-3.0f64, -1.0, 0.5]);
    let new = (&old + Tensor::from_slice(&[1.5f64.ln(), 0.7f64.ln(), 1.1f64.ln()])).detach().set_requires_grad(true);
    let adv = Tensor::from_slice(&[1.0f32, -1.0, -2.0]);
    let (loss, frac) = clipped_loss(&new, &old, &adv, 0.2);
    close(&vals(&loss), &[0.6], 1e-6);
    close(&[frac], &[2.0 / 3.0], 1e-12);
    loss.backward();
    close(&vals(&new.grad()), &[0.0, 0.0, 2.0 * 1.1 / 3.0], 1e-6);
}

#[test]
fn group_advantages_of_two_groups_by_hand() {
    // Group 0: 1, 2, 3 -> mean 2, sample std sqrt((1 + 0 + 1) / 2) = 1 -> -1, 0, 1 (/ (1 + 1e-6)).
    // Group 1: 4, 8 -> mean 6, sample std sqrt((4 + 4) / 1) = 2.828427 -> -0.707107, 0.707107.
    let r = [1.0, 4.0, 2.0, 8.0, 3.0];
    let g = [0, 1, 0, 1, 0];
    let a: Vec<f64> = group_advantages(&r, &g, true).iter().map(|&x| x as f64).collect();
    let h = 2.0 / 8f64.sqrt();
    close(&a, &[-1.0, -h, 0.0, h, 1.0], 1e-5);
    let a: Vec<f64> = group_advantages(&r, &g, false).iter().map(|&x| x as f64).collect();
    close(&a, &[-1.0, -2.0, 0.0, 2.0, 1.0], 0.0);
}

#[test]
fn gaussian_kl_by_hand() {
    // new (1, 1, 1, 1) vs ref (0, 0, 0, 1), sigma 0.5: (1 + 1 + 1 + 0) / (2 x 0.25) = 6.
    let kl = gaussian_kl(&img(&[1.0, 1.0, 1.0, 1.0], 2), &img(&[0.0, 0.0, 0.0, 1.0], 2), 0.5);
    close(&vals(&kl), &[6.0], 1e-6);
}

#[test]
fn sample_is_seeded_and_rows_do_not_depend_on_their_batch() {
    one_thread();
    let m = Denoiser::init(&small(), 11).unwrap();
    let s = Schedule::cosine(6).unwrap();
    let p = |seed| SampleParams { guidance: 2.5, eta: 1.0, seed };
    let a = sample(&m, &[0, 1, 3], &s, p(5)).unwrap();
    let b = sample(&m, &[0, 1, 3], &s, p(5)).unwrap();
    let c = sample(&m, &[0, 1, 3], &s, p(6)).unwrap();
    assert_eq!((a.latents.len(), a.log_probs.len(), a.means.len()), (7, 6, 6));
    assert_eq!(a.timesteps, vec![5, 4, 3, 2, 1, 0]);
    assert!(a.latents.iter().zip(&b.latents).all(|(x, y)| x.equal(y)));
    assert!(a.log_probs.iter().zip(&b.log_probs).all(|(x, y)| x.equal(y)));
    assert!(!a.latents[0].equal(&c.latents[0]) && !a.latents[6].equal(&c.latents[6]));
    // Row 0 alone: the same stream, so the same image (up to the batch's float reduction order).
    let solo = sample(&m, &[0], &s, p(5)).unwrap();
    let d = (solo.latents[6].get(0) - a.latents[6].get(0)).abs().max().double_value(&[]);
    assert!(d < 1e-4, "row 0 alone differs by {d}");
    assert_eq!(a.images().size(), vec![3, 1, 4, 4]);
    assert!(a.images().abs().max().double_value(&[]) <= 1.0);
}

#[test]
fn step_logprob_reproduces_the_recorded_logprob() {
    one_thread();
    let m = Denoiser::init(&small(), 12).unwrap();
    let s = Schedule::cosine(5).unwrap();
    for guidance in [1.0, 0.0, 3.0] {
        let traj = sample(&m, &[2, 0, 3, 1], &s, SampleParams { guidance, eta: 0.8, seed: 9 }).unwrap();
        for k in 0..traj.steps() {
            let (x_t, x_prev, t) = traj.transition(k);
            let lp = step_logprob(&m, x_t, x_prev, t, &traj.cond, &s, guidance, 0.8).unwrap();
            let d = (&lp - &traj.log_probs[k]).abs().max().double_value(&[]);
            assert!(d < 1e-4, "guidance {guidance} step {k}: {d}");
        }
        let all = recompute_logprobs(&m, &traj, &[0, 2, 4], &s).unwrap();
        assert_eq!(all.size(), vec![4, 3]);
        let rec = Tensor::stack(&[&traj.log_probs[0], &traj.log_probs[2], &traj.log_probs[4]], 1);
        assert!((all - rec).abs().max().double_value(&[]) < 1e-4);
    }
}

#[test]
fn an_rl_step_raises_the_logprob_of_the_better_images() {
    one_thread();
    let m = Denoiser::init(&small(), 13).unwrap();
    m.set_requires_grad(true);
    let reference = m.deep_copy();
    let s = Schedule::cosine(4).unwrap();
    let traj = sample(&m, &[1, 1, 1, 1], &s, SampleParams { guidance: 1.0, eta: 1.0, seed: 3 }).unwrap();
    let adv = Tensor::from_slice(&[1.0f32, -1.0, 1.0, -1.0]);
    let steps = choose_steps(traj.steps(), None, 0, 0);
    let spec = RlLossSpec { clip: 0.2, kl_coef: 0.1 };
    let st = accumulate_rl_gradients(&m, Some(&reference), &traj, &adv, &steps, &s, spec).unwrap();
    // Unchanged weights: r = 1, loss = mean(-A) = 0, nothing clipped, no KL.
    close(&[st.loss, st.clip_frac, st.kl], &[0.0, 0.0, 0.0], 1e-6);
    let mut opt = DenoiserAdam::new(&m, train_spec());
    let norm = opt.step(&m, 1e-3).unwrap();
    assert!(norm > 0.0 && norm.is_finite());
    let after = recompute_logprobs(&m, &traj, &steps, &s).unwrap().sum_dim_intlist(1, false, Kind::Double);
    let before = Tensor::stack(&traj.log_probs, 1).sum_dim_intlist(1, false, Kind::Double);
    let gain = vals(&(after - before));
    // The step ascends sum_i A_i log p_i (Adam's first step is sign(gradient) x lr, a descent
    // direction of the loss): the better images gain log-probability relative to the worse ones.
    let ascent = gain[0] - gain[1] + gain[2] - gain[3];
    assert!(ascent > 0.0, "{gain:?}");
    let st = accumulate_rl_gradients(&m, Some(&reference), &traj, &adv, &steps, &s, spec).unwrap();
    assert!(st.kl > 0.0 && st.loss < 0.0, "{st:?}");
}

/// Two classes of 8x8 images: class 0 bright on the left half, class 1 bright on the top half.
fn tiny_dataset() -> (Tensor, Vec<i64>) {
    let side = 8;
    let mut data = Vec::new();
    let mut cond = Vec::new();
    for i in 0..8 {
        let c = i % 2;
        for y in 0..side {
            for x in 0..side {
                let on = if c == 0 { x < side / 2 } else { y < side / 2 };
                data.push(if on { 0.8f32 } else { -0.8 });
            }
        }
        cond.push(c as i64);
    }
    (img(&data, side as i64), cond)
}

#[test]
fn pretraining_on_a_tiny_dataset_lowers_the_loss() {
    one_thread();
    let cfg = DenoiserConfig { side: 8, conditions: 2, hidden: 64, layers: 1 };
    let m = Denoiser::init(&cfg, 21).unwrap();
    m.set_requires_grad(true);
    let s = Schedule::cosine(10).unwrap();
    let (x0, cond) = tiny_dataset();
    // The same draws (timesteps, noise, null conditions) before and after: only the weights change.
    let eval = |m: &Denoiser| -> f64 {
        let _g = tch::no_grad_guard();
        let mut rng = Rng::new(77);
        (0..8).map(|_| pretrain_loss(m, &s, &x0, &cond, &mut rng, 0.1).unwrap().double_value(&[])).sum::<f64>() / 8.0
    };
    let before = eval(&m);
    let mut opt = DenoiserAdam::new(&m, train_spec());
    let mut rng = Rng::new(1);
    for _ in 0..300 {
        let loss = pretrain_loss(&m, &s, &x0, &cond, &mut rng, 0.1).unwrap();
        loss.backward();
        opt.step(&m, 3e-3).unwrap();
    }
    let after = eval(&m);
    assert_eq!(opt.steps(), 300);
    assert!(after < 0.5 * before, "loss {before} -> {after}");
}

/// `cargo test -p miles-tch --test integration diffusion_math::sample_timing -- --ignored
/// --nocapture`: sampler time at the default size (16x16, 10 classes, hidden 256, 2 blocks),
/// B = 32, T = 20, one thread.
#[test]
#[ignore]
fn sample_timing_b32_t20() {
    one_thread();
    let m = Denoiser::init(&DenoiserConfig::default(), 0).unwrap();
    let s = Schedule::cosine(20).unwrap();
    let cond: Vec<i64> = (0..32).map(|i| i % 10).collect();
    for guidance in [1.0, 3.0] {
        let _ = sample(&m, &cond, &s, SampleParams { guidance, eta: 1.0, seed: 0 }).unwrap();
        let t0 = std::time::Instant::now();
        let n = 5;
        for seed in 0..n {
            let _ = sample(&m, &cond, &s, SampleParams { guidance, eta: 1.0, seed }).unwrap();
        }
        let ms = t0.elapsed().as_secs_f64() * 1000.0 / n as f64;
        println!("sample B=32 T=20 guidance {guidance}: {ms:.1} ms ({} params)", m.num_params());
    }
}
