//! One RL step (rollout, training, offload and sync, overlapped or not by the schedule) and
//! the rollout buffer's size.

use super::trainer::TrainFacts;
use super::Ctx;
use crate::evidence::{sources, Evidence};
use crate::input::*;
use crate::model;
use crate::output::*;

pub(super) fn plan_step(
    cx: &Ctx,
    batch: Option<&BatchReport>,
    trains: &[TrainFacts],
    teacher_stage_s: f64,
    rollouts: &[RolloutReport],
    syncs: &[SyncReport],
    colocation: Option<&ColocationReport>,
) -> Option<StepReport> {
    let b = batch?;
    let t = trains.first()?;
    // A GPU engine's rollout, else the embedded engine's on a CPU host.
    let cpu = t.cpu.as_ref();
    let rollout = match rollouts.first() {
        Some(r) => r.rollout_time.clone()?,
        None => cpu?.rollout.clone()?,
    };
    let rollout_s = rollout.seconds;
    // Every pass over the batch takes steps_per_rollout optimizer steps.
    let spr = (b.steps_per_rollout * b.epochs) as f64;
    let train_s = t.step.seconds * spr;
    let offload_s = t.offload_s * spr;
    let sync_s = match (syncs.first(), cpu) {
        (Some(s), _) => s.estimate.seconds,
        (None, Some(c)) if !cx.input.syncs.is_empty() => c.sync.seconds,
        _ => 0.0,
    };
    let colocated = cx.input.placement.mode.value == PlacementMode::Colocated;
    let switch_s = colocation.map_or(0.0, |c| c.switch.seconds);
    // A teacher on GPUs of its own scores a batch before it trains: after the rollout when in
    // step, on its own pool beside both when generation and training overlap.
    let teacher_stage_s = teacher_stage_s * spr;
    let sync_step_s = rollout_s + teacher_stage_s + train_s + offload_s + sync_s + switch_s;
    // Colocated stages alternate, so nothing overlaps whatever the schedule says.
    let async_step_s =
        if colocated { sync_step_s } else { rollout_s.max(train_s + offload_s).max(teacher_stage_s) + sync_s };
    let mode = cx.input.schedule.mode.value;
    let seconds = if mode == ScheduleMode::Sync { sync_step_s } else { async_step_s };
    // The step is as strong as the weakest part it adds.
    let teacher = Evidence::assumed(sources::TRAIN_MFU);
    let sync_evidence = match (syncs.first(), cpu) {
        (Some(s), _) => Some(&s.estimate.evidence),
        (None, Some(c)) if !cx.input.syncs.is_empty() => Some(&c.sync.evidence),
        _ => None,
    };
    let evidence = Evidence::weakest(
        [
            Some(("rollout", &rollout.evidence)),
            Some(("train step", &t.step.evidence)),
            sync_evidence.map(|e| ("sync", e)),
            t.offload_evidence.as_ref().map(|e| ("optimizer offload", e)),
            colocation.filter(|_| switch_s > 0.0).map(|c| ("eviction", &c.switch.evidence)),
            (teacher_stage_s > 0.0).then_some(("teacher stage", &teacher)),
        ]
        .into_iter()
        .flatten(),
    );
    Some(StepReport {
        mode,
        rollout_s,
        dynamic_rounds: cx.input.schedule.dynamic_rounds,
        train_s,
        train_step: t.step.clone(),
        critic_s: t.critic_s * spr,
        teacher_s: t.teacher_s * spr,
        teacher_stage_s,
        sync_s,
        offload_s,
        switch_s,
        sync_step_s,
        async_step_s,
        step: Estimate {
            seconds,
            assumptions: vec![
                if mode == ScheduleMode::Sync || colocated {
                    "rollout, training, optimizer streaming and weight update run one after another".into()
                } else {
                    "generation overlaps training; the weight update pauses generation".into()
                },
                match b.epochs {
                    1 => format!("{} optimizer step(s) per rollout step", b.steps_per_rollout),
                    e => format!(
                        "{} optimizer steps per rollout step: {e} epochs x {} step(s)",
                        e * b.steps_per_rollout,
                        b.steps_per_rollout
                    ),
                },
                if colocated {
                    format!("colocated: {:.1} s per step evicting and reloading the idle actor", switch_s)
                } else {
                    "disaggregated: no eviction".into()
                },
            ]
            .into_iter()
            .chain(cpu.into_iter().flat_map(|c| {
                let rollout = rollout.assumptions.iter().map(|x| format!("rollout: {x}"));
                let sync = c.sync.assumptions.iter().map(|x| format!("sync: {x}"));
                rollout.chain(sync).collect::<Vec<_>>()
            }))
            .collect(),
            evidence,
        },
        data_parallel: t.data_parallel.clone(),
    })
}

pub(super) fn plan_buffer(cx: &Ctx, batch: Option<&BatchReport>) -> Option<BufferReport> {
    let b = batch?;
    let input = cx.input;
    let st = input.stages.iter().find(|s| s.role == Role::Rollout && s.engine.is_some())?;
    let e = st.engine.as_ref()?;
    let tokens = e.prompt_len.value.saturating_add(e.response_len.value);
    let staleness = input.schedule.max_staleness.map(|s| s.value);
    let capacity = match (input.schedule.buffer_capacity, input.schedule.mode.value) {
        (Some(c), _) => c.value,
        (None, ScheduleMode::Sync) => b.rollout_batch,
        (None, ScheduleMode::OneStepOff) => 2 * b.rollout_batch,
        // Groups older than max_staleness are dropped, so at most that many steps' worth wait.
        (None, ScheduleMode::FullyAsync) => staleness.unwrap_or(1).saturating_add(1).saturating_mul(b.rollout_batch),
    };
    let trajectories = capacity.saturating_mul(b.samples_per_prompt);
    let r3 = st.model.as_ref().filter(|_| input.r3.value).map(|m| {
        let id = model::route_id_bytes(m, input.r3_id_bytes);
        (model::r3_bytes(m, tokens, id), model::r3_bytes_per_token(m, id))
    });
    let per = tokens as f64 * input.assumptions.buffer_bytes_per_token + r3.map_or(0.0, |r| r.0);
    Some(BufferReport {
        max_staleness: staleness,
        capacity_groups: capacity,
        trajectories,
        tokens_per_trajectory: tokens,
        bytes_per_trajectory: per as u64,
        r3_bytes_per_trajectory: r3.map(|x| x.0 as u64),
        r3_bytes_per_token: r3.map(|x| x.1 as u64),
        bytes: (per * trajectories as f64) as u64,
    })
}
