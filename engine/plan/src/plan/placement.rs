//! Placement: which GPUs each stage gets (explicit ranges, then counts, then an even split of
//! the rest), colocated groups sharing one range, and the GPU map drawn from the result.

use super::layout::{embedded_on_gpus, engine_ok, layout_ok};
use super::Ctx;
use crate::input::*;
use crate::model::div;
use crate::output::*;
use miles_grammar::diag::ErrorCode;

/// Free GPU ids as sorted half-open intervals.
struct Free(Vec<(u64, u64)>);

impl Free {
    fn total(&self) -> u64 {
        self.0.iter().map(|(a, b)| b - a).sum()
    }
    /// Takes `first..=last` if every id in it is free.
    fn take_range(&mut self, first: u64, last: u64) -> bool {
        let end = match last.checked_add(1) {
            Some(e) if first <= last => e,
            _ => return false,
        };
        let Some(i) = self.0.iter().position(|&(a, b)| a <= first && end <= b) else {
            return false;
        };
        let (a, b) = self.0[i];
        let mut parts = Vec::with_capacity(2);
        if a < first {
            parts.push((a, first));
        }
        if end < b {
            parts.push((end, b));
        }
        self.0.splice(i..=i, parts);
        true
    }
    /// Takes the `n` lowest free ids.
    fn take_count(&mut self, n: u64) -> Option<Vec<GpuRange>> {
        if n == 0 || self.total() < n {
            return None;
        }
        let mut left = n;
        let mut out = Vec::new();
        while left > 0 {
            let (a, b) = self.0[0];
            let k = (b - a).min(left);
            out.push(GpuRange { first: a, last: a + k - 1 });
            left -= k;
            if a + k == b {
                self.0.remove(0);
            } else {
                self.0[0].0 = a + k;
            }
        }
        Some(out)
    }
}

/// GPUs one data-parallel replica of a trainer spans: tp x pp x cp.
pub(super) fn trainer_unit(t: &Trainer) -> u64 {
    t.tp.value.saturating_mul(t.pp.value).saturating_mul(t.cp.value)
}

#[derive(Clone, Debug)]
pub(super) struct Placed {
    pub(super) placed: Where,
    pub(super) ranges: Vec<GpuRange>,
    pub(super) shares_with: Vec<String>,
    pub(super) error: bool,
}

impl Placed {
    /// GPUs in the stage's ranges.
    pub(super) fn gpus(&self) -> u64 {
        self.ranges.iter().map(|r| r.len()).sum()
    }
    /// Devices a trainer spreads over: a trainer on a CPU-only host is one.
    pub(super) fn trainer_gpus(&self) -> u64 {
        if self.placed == Where::Host {
            1
        } else {
            self.gpus()
        }
    }
}

pub(super) fn place(cx: &mut Ctx) -> Vec<Placed> {
    let input = cx.input;
    let mut out: Vec<Placed> = input
        .stages
        .iter()
        .map(|st| Placed { placed: Where::Host, ranges: Vec::new(), shares_with: Vec::new(), error: invalid(cx, st) })
        .collect();
    if cx.total_gpus == 0 {
        refuse_gpus(cx, &mut out);
        return out;
    }
    let mut free = Free(vec![(0, cx.total_gpus)]);
    place_colocated(cx, &mut free, &mut out);
    let auto = place_requested(cx, &mut free, &mut out);
    split_rest(cx, &mut free, &mut out, &auto);
    // Eval stages without GPUs of their own evaluate on the first rollout stage's engines.
    if let Some(r) = input.stages.iter().position(|s| s.role == Role::Rollout) {
        for (i, st) in input.stages.iter().enumerate() {
            if st.role == Role::Eval && st.gpus.is_none() {
                out[i].ranges = out[r].ranges.clone();
                out[i].placed = if out[i].ranges.is_empty() { Where::Host } else { Where::Shared };
                out[i].shares_with = vec![input.stages[r].name.clone()];
            }
        }
    }
    out
}

/// A stage the layout checks refused, or one with a trainer or engine but no model: placed
/// nowhere.
fn invalid(cx: &Ctx, st: &Stage) -> bool {
    st.trainer.as_ref().is_some_and(|t| !layout_ok(t))
        || st.engine.as_ref().is_some_and(|e| !engine_ok(e))
        || ((st.trainer.is_some() || st.engine.is_some()) && st.model.is_none())
        || embedded_on_gpus(cx.total_gpus, st)
}

/// A trainer that runs on GPUs: an embedded trainer on a GPU cluster (E0409) stays on the host.
fn gpu_trainer(cx: &Ctx, st: &Stage) -> bool {
    st.trainer.is_some() && !embedded_on_gpus(cx.total_gpus, st)
}

fn uses_gpu(cx: &Ctx, st: &Stage) -> bool {
    gpu_trainer(cx, st) || st.engine.is_some() || st.gpus.is_some_and(|g| g.value != GpuRequest::Auto)
}

/// A stage of the colocated group: rollout, train and SFT stages with an engine or a GPU trainer.
fn colocated(cx: &Ctx, st: &Stage) -> bool {
    cx.input.placement.mode.value == PlacementMode::Colocated
        && matches!(st.role, Role::Rollout | Role::Train | Role::Sft)
        && (gpu_trainer(cx, st) || st.engine.is_some())
}

/// A cluster without GPUs: E0403 for each stage that asks for GPUs, or that needs a device and
/// has no host either.
fn refuse_gpus(cx: &mut Ctx, out: &mut [Placed]) {
    let input = cx.input;
    for (i, st) in input.stages.iter().enumerate() {
        if st.gpus.is_some_and(|g| g.value != GpuRequest::Auto) {
            let span = st.gpus.and_then(|g| g.span).or(st.span);
            cx.error(
                ErrorCode::E0403,
                format!("{} asks for GPUs but cluster {} has none", st.name, input.cluster.name),
                span,
                "no GPU to give",
                None,
            );
            out[i].error = true;
        } else if uses_gpu(cx, st) && input.cluster.host.is_none() {
            cx.error(
                ErrorCode::E0403,
                format!("{}: cluster {} has neither GPUs nor a host", st.name, input.cluster.name),
                input.cluster.span.or(st.span),
                "nothing to run on",
                None,
            );
            out[i].error = true;
        }
    }
}

/// The colocated group: one shared range, the first explicit request among them or every GPU.
fn place_colocated(cx: &mut Ctx, free: &mut Free, out: &mut [Placed]) {
    let input = cx.input;
    let group: Vec<usize> = (0..input.stages.len()).filter(|&i| colocated(cx, &input.stages[i])).collect();
    if group.is_empty() {
        return;
    }
    let req = group.iter().find_map(|&i| input.stages[i].gpus.filter(|g| g.value != GpuRequest::Auto).map(|g| (i, g)));
    let ranges = match req {
        Some((i, g)) => take(cx, free, &input.stages[i], g),
        None => free.take_count(cx.total_gpus),
    };
    let names: Vec<String> = group.iter().map(|&i| input.stages[i].name.clone()).collect();
    for (k, &i) in group.iter().enumerate() {
        match &ranges {
            Some(r) => {
                out[i].ranges = r.clone();
                out[i].placed = if k == 0 { Where::Own } else { Where::Shared };
                out[i].shares_with = names.iter().filter(|x| **x != input.stages[i].name).cloned().collect();
            }
            None => out[i].error = true,
        }
    }
}

/// Explicit ranges, then explicit or derived counts. Returns the stages left to the automatic
/// split.
fn place_requested(cx: &mut Ctx, free: &mut Free, out: &mut [Placed]) -> Vec<usize> {
    let input = cx.input;
    let mut auto: Vec<usize> = Vec::new();
    for pass in 0..2 {
        for (i, st) in input.stages.iter().enumerate() {
            if colocated(cx, st) || !uses_gpu(cx, st) && st.gpus.is_none() {
                continue;
            }
            if st.role == Role::Eval && st.gpus.is_none() {
                continue; // shares the rollout engines, below
            }
            let req = st.gpus.map(|g| g.value);
            let derived = derived_count(st);
            match (pass, req) {
                (0, Some(GpuRequest::Range { .. })) | (1, Some(GpuRequest::Count(_))) => {
                    let g = st.gpus.unwrap_or_default();
                    match take(cx, free, st, g) {
                        Some(r) => (out[i].ranges, out[i].placed) = (r, Where::Own),
                        None => out[i].error = true,
                    }
                }
                (1, None | Some(GpuRequest::Auto)) => match derived {
                    Some(k) if !out[i].error => match free.take_count(k) {
                        Some(r) => (out[i].ranges, out[i].placed) = (r, Where::Own),
                        None => {
                            let left = free.total();
                            cx.error(
                                ErrorCode::E0403,
                                format!("{} needs {k} GPUs, {left} are left", st.name),
                                st.span,
                                "not enough GPUs",
                                Some(format!(
                                    "cluster {} has {} GPUs; give fewer to other stages or add nodes",
                                    input.cluster.name, cx.total_gpus
                                )),
                            );
                            out[i].error = true;
                        }
                    },
                    _ => auto.push(i),
                },
                _ => {}
            }
        }
    }
    auto
}

/// Splits what is left evenly among the automatic stages, rounded down to each one's unit.
fn split_rest(cx: &mut Ctx, free: &mut Free, out: &mut [Placed], auto: &[usize]) {
    let left = free.total();
    let k = auto.iter().filter(|&&i| !out[i].error).count() as u64;
    for &i in auto {
        if out[i].error {
            continue;
        }
        let st = &cx.input.stages[i];
        let unit = st.trainer.as_ref().map(trainer_unit).or(st.engine.as_ref().map(|e| e.tp.value)).unwrap_or(1).max(1);
        let share = div(left as f64, k as f64) as u64 / unit * unit;
        match free.take_count(share) {
            Some(r) if share > 0 => (out[i].ranges, out[i].placed) = (r, Where::Own),
            _ => {
                cx.error(
                    ErrorCode::E0403,
                    format!("no GPUs left for {} (needs multiples of {unit})", st.name),
                    st.span,
                    "placed automatically",
                    Some("give the stages explicit `gpus = N` or add nodes".into()),
                );
                out[i].error = true;
            }
        }
    }
}

/// The first `n` GPUs of `ranges`, in order (all of them when they hold fewer).
pub(super) fn first_gpus(ranges: &[GpuRange], n: u64) -> Vec<GpuRange> {
    let mut left = n;
    let mut out = Vec::new();
    for r in ranges {
        if left == 0 {
            break;
        }
        let k = r.len().min(left);
        out.push(GpuRange { first: r.first, last: r.first + k - 1 });
        left -= k;
    }
    out
}

/// GPUs a stage's own layout implies: tp x pp x cp x dp for a trainer with dp set, engines x tp
/// for an engine fleet with a count.
fn derived_count(st: &Stage) -> Option<u64> {
    if let Some(t) = &st.trainer {
        return t.dp.map(|d| trainer_unit(t).saturating_mul(d.value));
    }
    if let Some(e) = &st.engine {
        return e.engines.map(|n| n.value.saturating_mul(e.tp.value));
    }
    None
}

fn take(cx: &mut Ctx, free: &mut Free, st: &Stage, g: Spanned<GpuRequest>) -> Option<Vec<GpuRange>> {
    let span = g.span.or(st.span);
    match g.value {
        GpuRequest::Range { first, last } => {
            if first > last || last >= cx.total_gpus {
                cx.error(
                    ErrorCode::E0403,
                    format!(
                        "{}: GPUs {first}-{last} are not in cluster {} (GPUs 0-{})",
                        st.name,
                        cx.input.cluster.name,
                        cx.total_gpus.saturating_sub(1)
                    ),
                    span,
                    "out of range",
                    None,
                );
                return None;
            }
            if free.take_range(first, last) {
                Some(vec![GpuRange { first, last }])
            } else {
                cx.error(
                    ErrorCode::E0403,
                    format!("{}: GPUs {first}-{last} overlap another stage's", st.name),
                    span,
                    "already taken",
                    Some("disaggregated stages need disjoint GPUs; use `placement = colocated` to share".into()),
                );
                None
            }
        }
        GpuRequest::Count(k) => match free.take_count(k) {
            Some(r) => Some(r),
            None => {
                let left = free.total();
                cx.error(
                    ErrorCode::E0403,
                    format!("{} asks for {k} GPUs, {left} are left", st.name),
                    span,
                    "not enough GPUs",
                    Some(format!("cluster {} has {} GPUs in all", cx.input.cluster.name, cx.total_gpus)),
                );
                None
            }
        },
        GpuRequest::Auto => free.take_count(free.total()),
    }
}

pub(super) fn gpu_map(cx: &Ctx, placed: &[Placed]) -> Vec<GpuSlice> {
    if cx.total_gpus == 0 {
        return Vec::new();
    }
    let mut cuts: Vec<u64> = vec![0, cx.total_gpus];
    for p in placed {
        for r in &p.ranges {
            cuts.push(r.first);
            cuts.push(r.last + 1);
        }
    }
    for p in &cx.pools {
        cuts.push(p.first_gpu);
    }
    cuts.sort_unstable();
    cuts.dedup();
    let mut out: Vec<GpuSlice> = Vec::with_capacity(cuts.len());
    for w in cuts.windows(2) {
        let (a, b) = (w[0], w[1]);
        if a >= b || a >= cx.total_gpus {
            continue;
        }
        let mut stages = Vec::new();
        let mut role = None;
        for (i, p) in placed.iter().enumerate() {
            if p.ranges.iter().any(|r| r.first <= a && a <= r.last) {
                let st = &cx.input.stages[i];
                stages.push(st.name.clone());
                if role.is_none() || st.role.trains() {
                    role = Some(st.role);
                }
            }
        }
        let slice =
            GpuSlice { first: a, last: b - 1, first_node: cx.node_of(a), last_node: cx.node_of(b - 1), stages, role };
        // Merge with the previous slice when the occupants are the same (pool cuts only).
        if let Some(prev) = out.last_mut() {
            if prev.stages == slice.stages
                && prev.last + 1 == slice.first
                && cx.pool_of(prev.first).map(|p| p.gpu.name.as_str())
                    == cx.pool_of(slice.first).map(|p| p.gpu.name.as_str())
            {
                prev.last = slice.last;
                prev.last_node = slice.last_node;
                continue;
            }
        }
        out.push(slice);
    }
    out
}
