//! The trainer's step time: FLOPs per token at the GPU's (or host's) peak and the assumed MFU, the
//! critic's and the teacher's shares of it; on a CPU-only host the embedded backend's own model,
//! its rollout and local handoff included (docs/plan.md, "Step time on a CPU host").

use super::memory::Rank;
use super::{peak_flops, CpuSide};
use crate::evidence::{sources, Evidence};
use crate::input::*;
use crate::model::{self, div};
use crate::output::*;
use crate::plan::lengths::{self, Lengths};
use crate::plan::{embedded, Ctx};
use crate::units::params as param_count;

/// A trainer's seconds per optimizer step, and the parts of it the step report shows.
pub(super) struct Step {
    pub(super) step: Estimate,
    /// PPO: the critic's share of `step`.
    pub(super) critic_s: f64,
    /// OPD: the teacher's forward's share of `step`.
    pub(super) teacher_s: f64,
    pub(super) cpu: Option<CpuSide>,
    /// A data-parallel embedded trainer's ranks and collectives (in `step` already).
    pub(super) data_parallel: Option<DataParallelReport>,
}

/// FLOP/s of the device the trainer computes on: its GPU's peak in the layout's precision, or
/// the host's fp32.
pub(super) fn peak(cx: &Ctx, device: Option<&GpuSpec>, on_host: bool, precision: Precision) -> f64 {
    match device {
        Some(g) if !on_host => peak_flops(g, precision),
        _ => cx.input.cluster.host.as_ref().and_then(|h| h.fp32).unwrap_or(0.0),
    }
}

/// Step time from FLOPs and MFU, at the expected sequence of an RL trainer's rollout when the
/// recipe states its lengths (memory stays at seq_len); the embedded backend on a CPU-only host
/// prices its own.
#[allow(clippy::too_many_arguments)]
pub(super) fn trainer_step(
    cx: &Ctx,
    st: &Stage,
    m: &ModelSpec,
    rank: &Rank,
    peak: f64,
    gpus: u64,
    batch: Option<&BatchReport>,
    lora: Option<&LoraReport>,
) -> Step {
    let lengths = if st.role == Role::Train { lengths::plan_lengths(cx) } else { None };
    let gpu = gpu_step(&cx.input.assumptions, m, rank, peak, gpus, lengths.as_ref());
    let cpu_host = cx.input.cluster.host.as_ref().filter(|_| rank.host.is_some());
    match (cpu_host, rank.host) {
        (Some(hs), Some(h)) => {
            let a = &cx.input.assumptions;
            let t = rank.t;
            // Optimizer steps per rollout step: more than one needs the old log-probs' pass.
            let spr = batch.map_or(1, |b| b.steps_per_rollout * b.epochs);
            let on = embedded::On::of(cx);
            let (est, critic_s, teacher_s, data_parallel) = embedded::train_step(
                a,
                on,
                m,
                t,
                rank.global,
                spr,
                rank.critic,
                cx.input.placement.embedded.kl_reference,
                h.entropy_in_loss,
                lengths.as_ref(),
            );
            let rollout = batch.and_then(|b| embedded::rollout(cx, m, b, t.lora.as_ref()));
            let bytes = lora.map_or(m.params as f64 * rank.l.precision.bytes(), |lo| lo.sync_bytes as f64);
            let sync = embedded::sync(a, on, hs, m, t.lora.as_ref(), bytes);
            Step { step: est, critic_s, teacher_s, cpu: Some(CpuSide { rollout, sync }), data_parallel }
        }
        _ => gpu,
    }
}

/// The step on `gpus` devices of `peak` FLOP/s at the assumed MFU: 6 x active parameters per
/// token trained, 2 x for the old log-probs (and 2 x more under full recomputation), attention;
/// PPO's critic and OPD's teacher forward on top.
fn gpu_step(a: &Assumptions, m: &ModelSpec, rank: &Rank, peak: f64, gpus: u64, lengths: Option<&Lengths>) -> Step {
    let (l, t) = (rank.l, rank.t);
    let full = rank.recompute == Recompute::Full;
    let seq = lengths.map_or(t.seq_len.value as f64, |x| x.sequence(t.seq_len.value));
    let attention = (m.heads * m.head_dim) as f64;
    let flops_tok = crate::time::train_flops_per_token(m.active_params as f64, m.layers as f64, seq, attention, full);
    let tokens = rank.global.map_or(0.0, |g| g as f64 * seq);
    let seconds = |per_token: f64| div(tokens * per_token, gpus as f64 * peak * a.train_mfu);
    let step_s = seconds(flops_tok);
    let critic_active = model::critic_spec(m).active_params as f64;
    let critic_tok = if rank.critic {
        crate::time::critic_flops_per_token(critic_active, m.layers as f64, seq, attention, full)
    } else {
        0.0
    };
    let critic_s = seconds(critic_tok);
    // OPD: the teacher's no-grad forward over every token of the step (docs/plan.md).
    let teacher_tok = t.teacher.as_ref().map_or(0.0, |tm| {
        crate::time::teacher_flops_per_token(
            tm.active_params as f64,
            tm.layers as f64,
            seq,
            (tm.heads * tm.head_dim) as f64,
        )
    });
    let teacher_s = seconds(teacher_tok);
    let mut step = Estimate {
        seconds: step_s + critic_s + teacher_s,
        assumptions: vec![
            format!(
                "{:.3e} tokens per optimizer step (global batch x seq {})",
                tokens,
                if seq == t.seq_len.value as f64 {
                    t.seq_len.value.to_string()
                } else {
                    format!("{seq:.1} expected; memory at {}", t.seq_len.value)
                }
            ),
            format!(
                "{:.3e} FLOPs per token: 6 x active + 2 x active (old log-probs){} + attention",
                flops_tok,
                if full { " + 2 x active (recompute)" } else { "" }
            ),
            format!(
                "{} GPUs x {:.0} TFLOP/s {} x MFU {:.0}%",
                gpus,
                peak / 1e12,
                l.precision.as_str(),
                a.train_mfu * 100.0
            ),
        ]
        .into_iter()
        .chain(rank.critic.then(|| {
            format!(
                "critic: {:.3e} FLOPs per token: 2 x {} params (values) + 6 x (value loss fwd + bwd){} + attention: {:.2} s of the step",
                critic_tok,
                param_count(critic_active as u64),
                if full { " + 2 x (recompute)" } else { "" },
                critic_s
            )
        }))
        .chain(t.teacher.as_ref().map(|tm| {
            format!(
                "teacher: {:.3e} FLOPs per token: 2 x {} params ({}, no-grad forward) + attention: {:.2} s of the step",
                teacher_tok,
                param_count(tm.active_params),
                tm.name,
                teacher_s
            )
        }))
        .collect(), evidence: Evidence::assumed(sources::TRAIN_MFU) };
    lengths::note_into(lengths, &mut step.assumptions);
    Step { step, critic_s, teacher_s, cpu: None, data_parallel: None }
}
