//! PPO's critic: GAE and the clipped value loss against hand-computed values, a critic that
//! learns the values of a fixed batch, per-token advantages reaching the policy, and an exact
//! resume of policy, critic and both optimizers.

use crate::common;

use miles_runtime::tasks::EOS;
use miles_runtime::{PpoSpec, TrainSpec, Trainer, Trajectory};
use miles_tch::critic::{gae, value_loss, whiten};
use miles_tch::model::Policy;
use miles_tch::train::TchTrainer;
use tch::Tensor;

fn close(a: &[f32], b: &[f32], tol: f32) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() <= tol, "{a:?} vs {b:?}");
    }
}

#[test]
fn gae_and_value_loss_by_hand() {
    // values 0.5, 0.2, 0.1; reward 1 at the last token; gamma 0.9, lambda 0.8.
    // delta_2 = 1 - 0.1 = 0.9;  delta_1 = 0.9*0.1 - 0.2 = -0.11;  delta_0 = 0.9*0.2 - 0.5 = -0.32
    // A_2 = 0.9;  A_1 = -0.11 + 0.72*0.9 = 0.538;  A_0 = -0.32 + 0.72*0.538 = 0.06736
    let (a, r) = gae(&[0.5, 0.2, 0.1], 1.0, 0.9, 0.8);
    close(&a, &[0.06736, 0.538, 0.9], 1e-6);
    close(&r, &[0.56736, 0.738, 1.0], 1e-6);
    // gamma = lambda = 1: every advantage is the reward minus the token's value (Monte Carlo).
    let (a, _) = gae(&[0.5, 0.2, 0.1], 1.0, 1.0, 1.0);
    close(&a, &[0.5, 0.8, 0.9], 1e-6);
    // Clipped value loss: v_old 0, ret 1, clip 0.2. v = 0.5: max((0.5-1)^2, (0.2-1)^2)/2 = 0.32
    // (clipped); v = 0.1: max(0.81, 0.81)/2 = 0.405 (not clipped: inside the range).
    let t = |v: &[f32]| Tensor::from_slice(v);
    let (l, c) = value_loss(&t(&[0.5, 0.1]), &t(&[0.0, 0.0]), &t(&[1.0, 1.0]), 0.2);
    close(&Vec::<f32>::try_from(l).unwrap(), &[0.32, 0.405], 1e-6);
    close(&Vec::<f32>::try_from(c).unwrap(), &[1.0, 0.0], 0.0);
    // No clipping at 0: plain squared error.
    let (l, _) = value_loss(&t(&[0.5]), &t(&[0.0]), &t(&[1.0]), 0.0);
    close(&Vec::<f32>::try_from(l).unwrap(), &[0.125], 1e-7);
    // Whitening over trained tokens only: the masked token does not count.
    let mut adv = vec![vec![1.0, 3.0], vec![100.0]];
    whiten(&mut adv, &[&[1.0, 1.0], &[0.0]]);
    close(&adv[0], &[-1.0, 1.0], 1e-6);
}

fn spec() -> TrainSpec {
    let mut s: TrainSpec = serde_json::from_str(r#"{"lr": 0.01, "micro_batch": 2, "global_batch": 4}"#).unwrap();
    s.ppo = Some(PpoSpec { critic_lr: 0.01, gamma: 1.0, lambda: 0.95, value_clip: 0.2, rollout_logprobs: false });
    s
}

fn batch() -> Vec<Trajectory> {
    let traj = |p: Vec<u32>, r: Vec<u32>, reward: f32| common::trajectory(p, r, reward, 0.0);
    vec![
        traj(vec![1, 5], vec![6, 7, EOS], 1.0),
        traj(vec![1, 8], vec![9, EOS], 0.0),
        traj(vec![1, 5], vec![4, 4, 4, EOS], 0.0),
        traj(vec![1, 8], vec![3, EOS], 1.0),
    ]
}

#[test]
fn ppo_critic_learns_values_and_resumes_exactly() {
    tch::set_num_threads(1);
    let cfg = common::tiny_config(0.5);
    let mut tr = TchTrainer::new(Policy::init(&cfg, 3), spec());
    // First step: values start at 0, so token j of n has the return lambda^(n-1-j) R (gamma 1)
    // and the value loss is the token mean of half its square.
    let first = tr.train_rl(&batch(), &[0.01], 1.0).unwrap();
    let c = first.critic.clone().expect("PPO reports its critic");
    assert_eq!(c.value_mean, 0.0);
    let tokens: f64 = batch().iter().map(|t| t.response.len() as f64).sum();
    let want = batch()
        .iter()
        .map(|t| {
            let n = t.response.len() as i32;
            (0..n).map(|j| 0.5 * (0.95f64.powi(n - 1 - j) * t.reward as f64).powi(2)).sum::<f64>()
        })
        .sum::<f64>()
        / tokens;
    assert!((c.value_loss - want).abs() < 1e-6, "{} vs {want}", c.value_loss);
    let mut last = c.value_loss;
    for _ in 0..40 {
        last = tr.train_rl(&batch(), &[0.01], 1.0).unwrap().critic.unwrap().value_loss;
    }
    assert!(last < 0.3 * c.value_loss, "the critic learns the batch's values: {} -> {last}", c.value_loss);
    // The policy moved (per-token advantages reached the loss), and its weight updates are the
    // policy's alone (no critic tensors).
    let w = tr.export_weights().unwrap();
    assert!(w.tensors.iter().all(|t| !t.name.starts_with("critic.")));
    // Save, load into a fresh trainer, one more step each: identical, bit for bit.
    let dir = std::env::temp_dir().join(format!("miles-ppo-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    Trainer::save(&tr, &dir).unwrap();
    assert!(dir.join("critic.safetensors").exists() && dir.join("critic_optimizer.safetensors").exists());
    let mut back = TchTrainer::new(Policy::init(&cfg, 77), spec());
    Trainer::load(&mut back, &dir).unwrap();
    let (a, b) = (tr.train_rl(&batch(), &[0.01], 1.0).unwrap(), back.train_rl(&batch(), &[0.01], 1.0).unwrap());
    assert_eq!(a.loss.to_bits(), b.loss.to_bits());
    assert_eq!(a.critic.unwrap().value_loss.to_bits(), b.critic.unwrap().value_loss.to_bits());
    assert_eq!(tr.export_full_weights().unwrap(), back.export_full_weights().unwrap());
    // `rollout_logprobs`: the behaviour policy is the sampler's, so the ratio starts away from 1
    // (the batch says -2 per token) and clipping shows.
    let mut s = spec();
    s.ppo.as_mut().unwrap().rollout_logprobs = true;
    let mut r = TchTrainer::new(Policy::init(&cfg, 3), s);
    let st = r.train_rl(&batch(), &[0.01], 1.0).unwrap();
    assert!(st.clip_frac > 0.0, "{}", st.clip_frac);
    assert_eq!(first.clip_frac, 0.0);
    let _ = std::fs::remove_dir_all(&dir);
}
