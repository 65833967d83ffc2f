//! A rollout the recipe holds back (E0412, a note): the step waits for the rollout while its
//! engines decode fewer sequences than their KV caches hold, because fully_async's
//! `max_concurrent`, the engine's own `max_concurrent` or a small rollout batch (sync,
//! one_step_off) keeps them below it. The fix is priced by planning the recipe again with the
//! changed value, not guessed: the smallest value past which the step would not shorten (the KV
//! slots filled, or training, or a compute-bound decode, setting the step).

use super::plan_once;
use crate::input::*;
use crate::output::*;
use crate::units::secs;
use miles_grammar::diag::{Diagnostic, ErrorCode, Severity, Span};

/// A value within this share of the best one (the KV slots filled) is as good.
const AS_GOOD: f64 = 0.01;
/// A fix is offered when it shortens the time per optimizer step by at least this share.
const WORTH_IT: f64 = 0.05;

/// The setting that holds the engines below their KV caches.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Limit {
    /// fully_async's `max_concurrent`: samples in flight across the fleet.
    Schedule,
    /// The engine's `max_concurrent`: requests per engine.
    Engine,
    /// The rollout batch, spread over the engines (sync, one_step_off).
    Batch,
}

/// Adds the note and the rollout's `throttle` report to a plan whose rollout is held back.
pub(super) fn advise(input: &PlanInput, p: &mut Plan) {
    let Some((report, span)) = throttle(input, p) else { return };
    p.diagnostics.push(diagnostic(&report, p, span));
    p.summary.notes += 1;
    if let Some(r) = p.rollouts.first_mut() {
        r.throttle = Some(report);
    }
}

/// The rollout stage the step is priced with (the first), its engine, and whether the step waits
/// for it.
fn throttle(input: &PlanInput, p: &Plan) -> Option<(ThrottleReport, Option<Span>)> {
    if p.summary.errors > 0 {
        return None;
    }
    let (r, step, b) = (p.rollouts.first()?, p.step.as_ref()?, p.batch.as_ref()?);
    let st = input.stages.iter().find(|s| s.name == r.stage)?;
    let e = st.engine.as_ref()?;
    let (kv, d, engines) = (r.sequences_per_engine, r.decode_batch, r.engines.max(1));
    if d == 0 || d >= kv || !waits_for_rollout(step) {
        return None;
    }
    let schedule_mc = input.schedule.max_concurrent.filter(|_| input.schedule.mode.value == ScheduleMode::FullyAsync);
    let share = schedule_mc.map_or(b.samples_per_rollout, |m| m.value).div_ceil(engines);
    let (limit, value, span) = match (e.max_concurrent, schedule_mc) {
        (Some(m), _) if m.value < share => (Limit::Engine, m.value, m.span),
        (_, Some(m)) => (Limit::Schedule, m.value, m.span.or(input.schedule.mode.span)),
        // The train stage's `rollout_batch` where the recipe sets it, else the rollout stage.
        _ => (Limit::Batch, b.rollout_batch, input.batch.rollout_batch.and_then(|x| x.span)),
    };
    let report = ThrottleReport {
        limit: match limit {
            Limit::Schedule => "max_concurrent",
            Limit::Engine => "engine.max_concurrent",
            Limit::Batch => "rollout_batch",
        }
        .into(),
        value,
        engines,
        in_flight_per_engine: d,
        kv_sequences_per_engine: kv,
        fix: fix(input, p, limit, &r.stage, share),
    };
    // Only advice that pays: a note without a fix would say nothing to do.
    report.fix.as_ref()?;
    Some((report, span.or(e.max_concurrent.and_then(|m| m.span)).or(st.span)))
}

/// Whether the rollout is the longest phase: it sets an overlapped step, and is the larger part
/// of a step whose phases run one after another.
fn waits_for_rollout(s: &StepReport) -> bool {
    s.rollout_s > s.train_s + s.offload_s && s.rollout_s > s.teacher_stage_s
}

/// The plan with the limit raised to `x`: sequences per engine (Schedule, Engine), or the rollout
/// batch's multiple (Batch, the global batch unchanged, so more optimizer steps per rollout).
fn replan(input: &PlanInput, p: &Plan, limit: Limit, stage: &str, x: u64) -> Option<(Plan, Vec<Setting>)> {
    let (r, b) = (p.rollouts.first()?, p.batch.as_ref()?);
    let mut i = input.clone();
    let mut settings = Vec::new();
    let engine_mc = |i: &mut PlanInput, per_engine: u64, settings: &mut Vec<Setting>| {
        let e = i.stages.iter_mut().find(|s| s.name == stage).and_then(|s| s.engine.as_mut());
        if let Some(m) = e.and_then(|e| e.max_concurrent.as_mut()).filter(|m| m.value < per_engine) {
            m.value = per_engine;
            settings.push(Setting { field: "engine.max_concurrent".into(), value: per_engine });
        }
    };
    match limit {
        Limit::Schedule => {
            let m = i.schedule.max_concurrent.as_mut()?;
            m.value = x.checked_mul(r.engines)?;
            settings.push(Setting { field: "max_concurrent".into(), value: m.value });
            engine_mc(&mut i, x, &mut settings);
        }
        Limit::Engine => engine_mc(&mut i, x, &mut settings),
        Limit::Batch => {
            let rollout_batch = b.rollout_batch.checked_mul(x)?;
            let steps = b.steps_per_rollout.checked_mul(x)?;
            let keep = |s: Option<Spanned<u64>>, v: u64| Some(Spanned { value: v, span: s.and_then(|s| s.span) });
            i.batch.rollout_batch = keep(i.batch.rollout_batch, rollout_batch);
            i.batch.steps_per_rollout = keep(i.batch.steps_per_rollout, steps);
            i.batch.global_batch = keep(i.batch.global_batch, b.global_batch);
            i.batch.samples_per_prompt = keep(i.batch.samples_per_prompt, b.samples_per_prompt);
            settings.push(Setting { field: "rollout_batch".into(), value: rollout_batch });
            settings.push(Setting { field: "steps_per_rollout".into(), value: steps });
        }
    }
    let q = plan_once(&i);
    (q.summary.errors == 0 && q.step.is_some()).then_some((q, settings))
}

/// Seconds per optimizer step: the step over the optimizer steps it takes, so a larger rollout
/// batch (more optimizer steps a rollout step) compares with the recipe's.
fn per_optimizer_step(q: &Plan) -> Option<f64> {
    let (s, b) = (q.step.as_ref()?, q.batch.as_ref()?);
    Some(s.step.seconds / (b.steps_per_rollout * b.epochs).max(1) as f64)
}

/// The value to set: the smallest within `AS_GOOD` of the best (the KV slots filled), found by
/// bisection over plans of the recipe with that value.
/// `share`: the sequences per engine the schedule's `max_concurrent` or the rollout batch allow,
/// up to which the engine's own limit may rise alone.
fn fix(input: &PlanInput, p: &Plan, limit: Limit, stage: &str, share: u64) -> Option<ThrottleFix> {
    let (r, b, step) = (p.rollouts.first()?, p.batch.as_ref()?, p.step.as_ref()?);
    let (kv, engines) = (r.sequences_per_engine, r.engines.max(1));
    let (lo, hi) = match limit {
        Limit::Schedule => (r.decode_batch + 1, kv),
        Limit::Engine => (r.decode_batch + 1, kv.min(share)),
        // Whole multiples of the rollout batch whose samples per engine fit the KV slots (and
        // the engine's own limit, which would bind next).
        Limit::Batch => {
            let e = input.stages.iter().find(|s| s.name == stage)?.engine.as_ref()?;
            let slots = e.max_concurrent.map_or(kv, |m| m.value.min(kv)).saturating_mul(engines);
            (2, slots / b.samples_per_rollout.max(1))
        }
    };
    if lo > hi {
        return None;
    }
    let now = per_optimizer_step(p)?;
    let filled = replan(input, p, limit, stage, hi)?.0;
    let best = per_optimizer_step(&filled)?;
    if best > now * (1.0 - WORTH_IT) {
        return None;
    }
    // Where the best still waits for the rollout, below the KV slots, another limit stops it:
    // up to that limit every sequence shortens the step.
    let fs = filled.step.as_ref()?;
    let slots = match limit {
        Limit::Batch => kv.saturating_mul(engines) / b.samples_per_rollout.max(1),
        _ => kv,
    };
    let other_limit = hi < slots && waits_for_rollout(fs);
    // Else the time per optimizer step falls as the engines fill (more tokens per decode step)
    // until training or a compute-bound decode sets it: the smallest value as good as the best.
    let (mut lo, mut hi) = (if other_limit { hi } else { lo }, hi);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        match replan(input, p, limit, stage, mid).and_then(|(q, _)| per_optimizer_step(&q)) {
            Some(t) if t <= best * (1.0 + AS_GOOD) => hi = mid,
            _ => lo = mid + 1,
        }
    }
    let (q, settings) = replan(input, p, limit, stage, hi)?;
    let (qs, qr) = (q.step.as_ref()?, q.rollouts.first()?);
    let bound = if hi == slots && qr.decode_batch >= kv {
        format!("fills the {kv} KV slots per engine")
    } else if hi == slots {
        format!("as many whole rollout batches as the {kv} KV slots per engine hold")
    } else if !waits_for_rollout(fs) {
        format!("more would not shorten the step: training ({}) then sets it", secs(fs.train_s + fs.offload_s))
    } else if other_limit && limit == Limit::Batch {
        "the engine's max_concurrent bounds more samples per engine".into()
    } else if other_limit {
        match input.schedule.max_concurrent.filter(|_| input.schedule.mode.value == ScheduleMode::FullyAsync) {
            Some(m) => format!("max_concurrent = {} over {engines} engines bounds more", m.value),
            None => "the rollout batch bounds more samples per engine".into(),
        }
    } else {
        "more would not shorten the step: decoding more sequences together gains little more".into()
    };
    let cost = match (limit, input.schedule.mode.value) {
        (Limit::Batch, _) => Some(format!(
            "{} optimizer steps per rollout instead of {}: the later ones train further off-policy",
            b.steps_per_rollout * hi,
            b.steps_per_rollout
        )),
        (_, ScheduleMode::FullyAsync) => Some(format!(
            "staleness grows: {} samples in flight instead of {}, more of them spanning a weight update{}",
            qr.decode_batch * engines,
            r.decode_batch * engines,
            match input.schedule.max_staleness {
                Some(s) => format!(" (max_staleness {} still bounds what trains)", s.value),
                None => String::new(),
            }
        )),
        _ => None,
    };
    Some(ThrottleFix {
        settings,
        in_flight_per_engine: qr.decode_batch,
        samples_factor: if limit == Limit::Batch { hi } else { 1 },
        rollout_s: step.rollout_s,
        rollout_s_after: qs.rollout_s,
        step_s: step.step.seconds,
        step_s_after: qs.step.seconds,
        per_optimizer_step_s: now,
        per_optimizer_step_s_after: per_optimizer_step(&q)?,
        bound,
        cost,
    })
}

/// The limit as one line: `max_concurrent = 64 over 4 engines: 16 of 81 KV slots per engine in use`.
pub fn limit_line(t: &ThrottleReport) -> String {
    let what = match t.limit.as_str() {
        "max_concurrent" => format!("max_concurrent = {} over {} engines", t.value, t.engines),
        "engine.max_concurrent" => format!("the engine's max_concurrent = {}", t.value),
        _ => format!("rollout_batch = {} spread over {} engines", t.value, t.engines),
    };
    format!("{what}: {} of {} KV slots per engine in use", t.in_flight_per_engine, t.kv_sequences_per_engine)
}

/// The fix as one line: `max_concurrent = 324 (81 per engine): rollout 54.1 s -> 25.3 s, step
/// 54.9 s -> 26.1 s (fills the 81 KV slots per engine)`.
pub fn fix_line(f: &ThrottleFix) -> String {
    let set: Vec<String> = f.settings.iter().map(|s| format!("{} = {}", s.field, s.value)).collect();
    let mut line = format!(
        "{} ({} per engine): rollout {} -> {}",
        set.join(", "),
        f.in_flight_per_engine,
        secs(f.rollout_s),
        secs(f.rollout_s_after)
    );
    if f.samples_factor > 1 {
        line.push_str(&format!(
            " for {}x the samples, per optimizer step {} -> {}",
            f.samples_factor,
            secs(f.per_optimizer_step_s),
            secs(f.per_optimizer_step_s_after)
        ));
    } else {
        line.push_str(&format!(", step {} -> {}", secs(f.step_s), secs(f.step_s_after)));
    }
    line.push_str(&format!(" ({})", f.bound));
    line
}

fn diagnostic(t: &ThrottleReport, p: &Plan, span: Option<Span>) -> Diagnostic {
    let stage = p.rollouts.first().map_or("rollout", |r| r.stage.as_str());
    let mut d = Diagnostic {
        severity: Severity::Note,
        ..Diagnostic::error(
            ErrorCode::E0412,
            format!("{stage}: the step waits for the rollout, held back by {}", limit_line(t)),
        )
    };
    if let Some(sp) = span {
        d = d.with_primary(
            sp,
            format!(
                "{} sequences per engine where the KV cache holds {}",
                t.in_flight_per_engine, t.kv_sequences_per_engine
            ),
        );
    }
    if let Some(f) = &t.fix {
        let cost = f.cost.as_ref().map(|c| format!("; {c}")).unwrap_or_default();
        d = d.with_help(format!("set {}{cost}", fix_line(f)));
    }
    d
}

#[cfg(test)]
mod tests;
