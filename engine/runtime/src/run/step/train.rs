//! One RL step's training, as both executors run it: the learning rates, training with a
//! non-finite check, the wall-time limit, and the step's metrics columns.

use crate::backend::{lr_at, TrainStats, Trainer};
use crate::sample::Trajectory;
use crate::spec::{RunOptions, RunSpec};
use crate::{RunError, E_NONFINITE, E_TIMEOUT};
use serde_json::{json, Map, Value};
use std::path::PathBuf;
use std::time::Instant;

/// Refuses to start step `step + 1` after the run's wall-time limit (`--max-wall`).
pub(crate) fn check_wall_time(opts: &RunOptions, started: Instant, step: u64) -> Result<(), RunError> {
    match opts.max_wall {
        Some(limit) if started.elapsed() > limit => Err(RunError::new(
            E_TIMEOUT,
            format!("the run's wall-time limit ({:.0} s) expired after step {step}", limit.as_secs_f64()),
        )
        .with_help("resume with --resume to continue from the last checkpoint")),
        _ => Ok(()),
    }
}

/// The learning rate of each optimizer step of RL step `step` (1-based): `epochs` passes over the
/// batch, each of `optimizer_steps_per_rl_step` steps, every one a step of the schedule (whose
/// total counts them all).
pub(crate) fn step_lrs(spec: &RunSpec, step: u64) -> Vec<f64> {
    let per_step = (spec.optimizer_steps_per_rl_step() * spec.train.epochs.max(1)) as u64;
    let total = per_step * spec.steps;
    (0..per_step).map(|j| lr_at(&spec.train, (step - 1) * per_step + j, total)).collect()
}

/// One RL training step; a NaN/infinite loss or gradient stops the run (E0505) naming the last
/// good checkpoint.
pub(crate) fn train_checked(
    trainer: &mut dyn Trainer,
    batch: &[Trajectory],
    lrs: &[f64],
    temperature: f64,
    step: u64,
    last_ckpt: &Option<PathBuf>,
) -> Result<TrainStats, RunError> {
    let ts = trainer.train_rl(batch, lrs, temperature).map_err(|e| {
        if e.code == E_NONFINITE {
            non_finite(step, last_ckpt)
        } else {
            e
        }
    })?;
    if !ts.loss.is_finite() || !ts.grad_norm.is_finite() {
        return Err(non_finite(step, last_ckpt));
    }
    Ok(ts)
}

/// The `train/*` columns of a step's metrics row.
pub(crate) fn insert_train_stats(row: &mut Map<String, Value>, ts: &TrainStats, lrs: &[f64]) {
    row.insert("train/loss".into(), json!(ts.loss));
    row.insert("train/grad_norm".into(), json!(ts.grad_norm));
    row.insert("train/entropy".into(), json!(ts.entropy));
    row.insert("train/clip_frac".into(), json!(ts.clip_frac));
    row.insert("train/kl".into(), json!(ts.kl));
    row.insert("train/logp_diff".into(), json!(ts.logp_diff));
    row.insert("train/rollout_kl".into(), json!(ts.rollout_kl));
    row.insert("train/tis_weight".into(), json!(ts.tis_weight));
    row.insert("train/lr".into(), json!(lrs.last().copied().unwrap_or(0.0)));
    row.insert("train/tokens".into(), json!(ts.tokens));
    if let Some(f) = ts.mis_masked {
        row.insert("train/mis_masked".into(), json!(f));
    }
    // Several passes over the batch: each pass's clip fraction and drift from the behaviour
    // policy (1-based: `train/epoch1/...` is the first pass).
    for (k, e) in ts.epochs.iter().enumerate() {
        let p = format!("train/epoch{}/", k + 1);
        row.insert(format!("{p}clip_frac"), json!(e.clip_frac));
        row.insert(format!("{p}approx_kl"), json!(e.approx_kl));
        row.insert(format!("{p}approx_kl_k3"), json!(e.approx_kl_k3));
        row.insert(format!("{p}max_abs_log_ratio"), json!(e.max_abs_log_ratio));
    }
    if let Some(o) = &ts.opd {
        row.insert("opd/reverse_kl".into(), json!(o.reverse_kl));
        row.insert("opd/teacher_logp".into(), json!(o.teacher_logp));
        row.insert("opd/share".into(), json!(o.opd_share));
        row.insert("opd/teacher_restarts".into(), json!(o.teacher_restarts));
    }
    if let Some(m) = &ts.moe {
        insert_moe_stats(row, m);
    }
    if let Some(c) = &ts.critic {
        row.insert("critic/value_loss".into(), json!(c.value_loss));
        row.insert("critic/value_mean".into(), json!(c.value_mean));
        row.insert("critic/return_mean".into(), json!(c.return_mean));
        row.insert("critic/explained_variance".into(), json!(c.explained_variance));
        row.insert("critic/grad_norm".into(), json!(c.grad_norm));
        row.insert("critic/clip_frac".into(), json!(c.clip_frac));
    }
}

/// `moe/*` and `r3/*`: load per layer, the load-balancing loss, the route mismatch (overall and
/// per layer) and what the recorded routing cost.
fn insert_moe_stats(row: &mut Map<String, Value>, m: &crate::MoeStats) {
    row.insert("moe/aux_loss".into(), json!(m.aux_loss));
    for (i, l) in m.load_max.iter().enumerate() {
        row.insert(format!("moe/load_max/{i}"), json!(l));
    }
    if !m.route_mismatch.is_empty() {
        let mean = m.route_mismatch.iter().sum::<f64>() / m.route_mismatch.len() as f64;
        row.insert("r3/route_mismatch".into(), json!(mean));
        for (i, f) in m.route_mismatch.iter().enumerate() {
            row.insert(format!("r3/route_mismatch/{i}"), json!(f));
        }
        let mean = m.router_disagreement.iter().sum::<f64>() / m.router_disagreement.len().max(1) as f64;
        row.insert("r3/router_disagreement".into(), json!(mean));
        row.insert("r3/flip_logp_diff".into(), json!(m.flip_logp_diff));
        row.insert("r3/flip_tokens".into(), json!(m.flip_tokens));
        row.insert("r3/replayed".into(), json!(m.replayed as u8));
        row.insert("r3/bytes".into(), json!(m.r3_bytes));
        row.insert("r3/tokens".into(), json!(m.r3_tokens));
        row.insert("r3/dropped".into(), json!(m.r3_dropped));
    }
}

/// Seconds a step spent in each phase.
pub(crate) struct StepTimes {
    /// Generation (async: seconds the engine was busy since the last step).
    pub(crate) gen_s: f64,
    pub(crate) reward_s: f64,
    /// The teacher stage's scoring (on-policy distillation); 0 without one.
    pub(crate) teacher_s: f64,
    pub(crate) train_s: f64,
    pub(crate) sync_s: f64,
    pub(crate) step_s: f64,
}

/// The `perf/*` columns of a step's metrics row: where the step's time goes (bench/peers profiles
/// it): generation, scoring and advantages, training (split by the backend into log-prob
/// recompute, forward, backward, optimizer), and the token counts behind the rates. step_s minus
/// these is orchestration (and eval).
pub(crate) fn insert_perf(
    row: &mut Map<String, Value>,
    ts: &TrainStats,
    t: &StepTimes,
    gen_tokens: u64,
    trained: usize,
    sync_bytes: usize,
) {
    row.insert("perf/gen_tokens_per_s".into(), json!(gen_tokens as f64 / t.gen_s.max(1e-9)));
    row.insert("perf/train_tokens_per_s".into(), json!(trained as f64 / t.train_s.max(1e-9)));
    row.insert("perf/sync_s".into(), json!(t.sync_s));
    row.insert("perf/sync_bytes".into(), json!(sync_bytes));
    row.insert("perf/gen_s".into(), json!(t.gen_s));
    row.insert("perf/reward_s".into(), json!(t.reward_s));
    if t.teacher_s > 0.0 {
        row.insert("perf/teacher_s".into(), json!(t.teacher_s));
    }
    row.insert("perf/train_s".into(), json!(t.train_s));
    row.insert("perf/logprob_s".into(), json!(ts.logprob_s));
    row.insert("perf/forward_s".into(), json!(ts.forward_s));
    row.insert("perf/backward_s".into(), json!(ts.backward_s));
    row.insert("perf/optimizer_s".into(), json!(ts.optimizer_s));
    row.insert("perf/gen_tokens".into(), json!(gen_tokens));
    row.insert("perf/trained_tokens".into(), json!(trained));
    row.insert("perf/step_s".into(), json!(t.step_s));
    // The high-water mark so far, so the last row is the run's peak (`miles report` compares it
    // with the plan's memory).
    if let Some(b) = peak_rss_bytes() {
        row.insert("perf/peak_rss_bytes".into(), json!(b));
    }
    // A data-parallel trainer: time in exchanges and waiting for the slowest rank (the max over
    // ranks of each) and each rank's peak RSS, which `perf/peak_rss_bytes` (the controller's own
    // process) does not see.
    if ts.collective_s > 0.0 {
        row.insert("perf/collective_s".into(), json!(ts.collective_s));
    }
    if ts.rank_wait_s > 0.0 {
        row.insert("perf/rank_wait_s".into(), json!(ts.rank_wait_s));
    }
    if let Some(max) = ts.rank_peak_rss.iter().max() {
        row.insert("perf/rank_peak_rss_bytes_max".into(), json!(max));
        for (r, b) in ts.rank_peak_rss.iter().enumerate() {
            row.insert(format!("perf/rank_peak_rss_bytes/{r}"), json!(b));
        }
    }
}

/// This process's peak resident set size in bytes (getrusage), none where it is unavailable.
#[cfg(unix)]
pub fn peak_rss_bytes() -> Option<u64> {
    // SAFETY: getrusage only writes into the zeroed struct we own.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return None;
    }
    let raw = u64::try_from(u.ru_maxrss).ok()?;
    // Linux reports kilobytes, macOS bytes.
    Some(if cfg!(target_os = "macos") { raw } else { raw * 1024 })
}

#[cfg(not(unix))]
pub fn peak_rss_bytes() -> Option<u64> {
    None
}

pub(crate) fn non_finite(step: u64, last: &Option<PathBuf>) -> RunError {
    let kept = match last {
        Some(d) => format!("the last good checkpoint is {}", d.display()),
        None => "no checkpoint was written before it".to_string(),
    };
    RunError::new(E_NONFINITE, format!("loss or gradient became NaN/infinite at step {step}; the run stopped ({kept})"))
        .with_help("lower train.lr, set train.grad_clip, or set train.tis_cap")
}

pub(crate) fn count_flat_groups(rewards: &[f32], groups: &[usize]) -> usize {
    let mut first: std::collections::BTreeMap<usize, (f32, bool)> = Default::default();
    for (&r, &g) in rewards.iter().zip(groups) {
        let e = first.entry(g).or_insert((r, true));
        if e.0 != r {
            e.1 = false;
        }
    }
    first.values().filter(|v| v.1).count()
}

#[cfg(test)]
mod tests {
    use crate::spec::{Decay, RunSpec};

    /// `epochs` passes make epochs x per-step optimizer steps per RL step, each a step of the
    /// schedule: a linear decay over 2 RL steps x 2 passes x 2 steps = 8 steps, from lr = 0.8 to 0,
    /// is 0.8 x (1 - k/8) at step k: 0.8, 0.7, ..., 0.1.
    #[test]
    fn step_lrs_count_every_pass() {
        let mut s = RunSpec::from_json(include_str!("../../../tests/data/tiny.json")).unwrap();
        s.steps = 2;
        s.train.lr = 0.8;
        s.train.warmup_steps = 0;
        s.train.decay = Decay::Linear;
        s.train.min_lr_ratio = 0.0;
        s.train.global_batch = s.rollout.rollout_batch * s.rollout.samples_per_prompt / 2;
        s.train.micro_batch = 1;
        assert_eq!(s.optimizer_steps_per_rl_step(), 2);
        assert_eq!(super::step_lrs(&s, 1).len(), 2, "one pass: the steps per RL step");
        s.train.epochs = 2;
        let (a, b) = (super::step_lrs(&s, 1), super::step_lrs(&s, 2));
        let want = |k: usize| 0.8 * (1.0 - k as f64 / 8.0);
        assert_eq!(a.len(), 4);
        for (k, lr) in a.iter().chain(&b).enumerate() {
            assert!((lr - want(k)).abs() < 1e-12, "step {k}: {lr} vs {}", want(k));
        }
    }

    /// A data-parallel trainer's collective seconds and ranks' peaks become columns; one process
    /// (zero, empty) adds none.
    #[test]
    fn data_parallel_columns_only_for_a_group() {
        let t = super::StepTimes { gen_s: 1.0, reward_s: 0.0, teacher_s: 0.0, train_s: 1.0, sync_s: 0.0, step_s: 2.0 };
        let mut row = serde_json::Map::new();
        super::insert_perf(&mut row, &crate::backend::TrainStats::default(), &t, 1, 1, 0);
        assert!(!row.keys().any(|k| k.contains("collective") || k.contains("rank_peak")), "{row:?}");
        let ts = crate::backend::TrainStats {
            collective_s: 0.25,
            rank_wait_s: 0.5,
            rank_peak_rss: vec![300, 500],
            ..Default::default()
        };
        let mut row = serde_json::Map::new();
        super::insert_perf(&mut row, &ts, &t, 1, 1, 0);
        assert_eq!(row["perf/collective_s"], 0.25);
        assert_eq!(row["perf/rank_wait_s"], 0.5);
        assert_eq!(row["perf/rank_peak_rss_bytes_max"], 500);
        assert_eq!(row["perf/rank_peak_rss_bytes/0"], 300);
        assert_eq!(row["perf/rank_peak_rss_bytes/1"], 500);
        // The statistics travel as JSON (the worker protocol): one process's stay as they were.
        let one = serde_json::to_value(crate::backend::TrainStats::default()).unwrap();
        assert!(one.get("collective_s").is_none() && one.get("rank_peak_rss").is_none());
        let back: crate::backend::TrainStats = serde_json::from_value(serde_json::to_value(&ts).unwrap()).unwrap();
        assert_eq!(back, ts);
    }

    #[cfg(unix)]
    #[test]
    fn peak_rss_is_at_least_a_touched_buffer() {
        let buf = vec![1u8; 8 << 20];
        let peak = super::peak_rss_bytes().expect("getrusage");
        assert!(peak >= buf.len() as u64, "{peak}");
        assert!(buf.iter().all(|&b| b == 1));
    }
}
