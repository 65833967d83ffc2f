//! From a [`PlanInput`] to a [`Plan`]. Work is proportional to the number of stages, node pools
//! and GPU ranges, never to the number of GPUs, so a 100,000-GPU cluster plans as fast as a
//! small one (bench/plan/).

use crate::input::*;
use crate::model::{self, div, Layout};
use crate::output::*;
use crate::time::{self, DecodeShape, SyncShape};
use miles_grammar::diag::{Diagnostic, Span};

/// One pool with its place in the GPU and node numbering.
struct Pool<'a> {
    gpu: &'a GpuSpec,
    first_gpu: u64,
    first_node: u64,
    gpus: u64,
}

struct Ctx<'a> {
    input: &'a PlanInput,
    pools: Vec<Pool<'a>>,
    total_gpus: u64,
    diags: Vec<Diagnostic>,
}

fn gb(bytes: f64) -> String {
    format!("{:.1} GB", bytes / 1e9)
}

impl<'a> Ctx<'a> {
    fn error(&mut self, code: &'static str, msg: String, span: Option<Span>, label: &str, help: Option<String>) {
        let mut d = Diagnostic::error(code, msg);
        if let Some(sp) = span {
            d = d.with_primary(sp, label);
        }
        if let Some(h) = help {
            d = d.with_help(h);
        }
        self.diags.push(d);
    }
    fn warning(&mut self, code: &'static str, msg: String, span: Option<Span>, label: &str, help: Option<String>) {
        let mut d = Diagnostic::warning(code, msg);
        if let Some(sp) = span {
            d = d.with_primary(sp, label);
        }
        if let Some(h) = help {
            d = d.with_help(h);
        }
        self.diags.push(d);
    }

    fn pool_of(&self, gpu: u64) -> Option<&Pool<'a>> {
        // Pools are sorted by first GPU; binary search keeps node-by-node clusters linear overall.
        let i = self.pools.partition_point(|p| p.first_gpu + p.gpus <= gpu);
        self.pools.get(i).filter(|p| gpu >= p.first_gpu && gpu < p.first_gpu + p.gpus)
    }

    fn node_of(&self, gpu: u64) -> u64 {
        match self.pool_of(gpu) {
            Some(p) => p.first_node + (gpu - p.first_gpu) / p.gpu.gpus_per_node.max(1),
            None => 0,
        }
    }

    /// The GPU kind with the least HBM among those the ranges touch (a stage that spans a mixed
    /// cluster must fit on its smallest GPU).
    fn device(&self, ranges: &[GpuRange]) -> Option<&'a GpuSpec> {
        let mut best: Option<&'a GpuSpec> = None;
        for r in ranges {
            for p in &self.pools {
                let overlaps = p.gpus > 0 && r.first < p.first_gpu + p.gpus && r.last >= p.first_gpu;
                if overlaps && best.is_none_or(|b| p.gpu.hbm < b.hbm) {
                    best = Some(p.gpu);
                }
            }
        }
        best
    }
}

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

/// A checked trainer layout, or why it cannot be used.
fn trainer_unit(t: &Trainer) -> u64 {
    t.tp.value.saturating_mul(t.pp.value).saturating_mul(t.cp.value)
}

#[derive(Clone, Debug)]
struct Placed {
    placed: Where,
    ranges: Vec<GpuRange>,
    shares_with: Vec<String>,
    error: bool,
}

fn range_count(ranges: &[GpuRange]) -> u64 {
    ranges.iter().map(|r| r.len()).sum()
}

/// Runs the planner. Never panics; problems are in `Plan::diagnostics`.
pub fn plan(input: &PlanInput) -> Plan {
    let mut pools = Vec::with_capacity(input.cluster.pools.len());
    let (mut gpu, mut node) = (0u64, 0u64);
    let mut early = Vec::new();
    for p in &input.cluster.pools {
        if p.gpu.gpus_per_node == 0 {
            let mut d = Diagnostic::error("E0404", format!("GPU kind {} has 0 GPUs per node", p.gpu.name));
            if let Some(sp) = p.nodes.span {
                d = d.with_primary(sp, "these nodes hold no GPU");
            }
            early.push(d);
        }
        let gpus = p.nodes.value.saturating_mul(p.gpu.gpus_per_node);
        pools.push(Pool { gpu: &p.gpu, first_gpu: gpu, first_node: node, gpus });
        gpu = gpu.saturating_add(gpus);
        node = node.saturating_add(p.nodes.value);
    }
    let mut cx = Ctx { input, pools, total_gpus: gpu, diags: early };

    let batch = resolve_batch(&mut cx);
    validate_layouts(&mut cx);
    let placed = place(&mut cx);

    let mut stages = Vec::with_capacity(input.stages.len());
    let mut memory = Vec::new();
    let mut rollouts = Vec::new();
    let mut train_facts: Vec<TrainFacts> = Vec::new();
    for (i, st) in input.stages.iter().enumerate() {
        let pl = &placed[i];
        let errors_before = cx.diags.iter().filter(|d| d.is_error()).count();
        let mut layout = String::new();
        if let Some(t) = &st.trainer {
            let gpus = if pl.placed == Where::Host { 1 } else { range_count(&pl.ranges) };
            let dp = t.dp.map(|d| d.value).unwrap_or_else(|| gpus / trainer_unit(t).max(1));
            layout = if t.backend.value == Backend::Embedded {
                "embedded trainer".to_string()
            } else {
                format!(
                    "{} TP{} PP{} CP{} EP{} DP{}",
                    backend_name(t.backend.value),
                    t.tp.value,
                    t.pp.value,
                    t.cp.value,
                    t.ep.value,
                    dp
                )
            };
            if !pl.error {
                if let Some(f) = plan_trainer(&mut cx, st, t, pl, dp, batch.as_ref(), &mut memory) {
                    train_facts.push(f);
                }
            }
        }
        if let Some(e) = &st.engine {
            let gpus = range_count(&pl.ranges);
            let engines = e.engines.map(|n| n.value).unwrap_or_else(|| gpus / e.tp.value.max(1));
            layout = if pl.placed == Where::Host {
                // On a CPU-only host the embedded engine runs in the trainer's process.
                "embedded engine".to_string()
            } else {
                format!("{} engine{} x TP{}", engines, if engines == 1 { "" } else { "s" }, e.tp.value)
            };
            if e.dp.value > 1 {
                layout.push_str(&format!(" DP{}", e.dp.value));
            }
            if e.ep.value > 1 {
                layout.push_str(&format!(" EP{}", e.ep.value));
            }
            if !pl.error && pl.placed != Where::Shared {
                if let Some(r) = plan_engine(&mut cx, st, e, pl, engines, batch.as_ref(), &mut memory) {
                    rollouts.push(r);
                }
            }
        }
        let has_error = pl.error || cx.diags.iter().filter(|d| d.is_error()).count() > errors_before;
        let symbol = if has_error {
            "!"
        } else {
            match pl.placed {
                Where::Own => "+",
                Where::Shared => "~",
                Where::Host => "=",
            }
        };
        let precision = st
            .engine
            .as_ref()
            .map(|e| e.precision.value.as_str().to_string())
            .or_else(|| st.trainer.as_ref().map(|t| t.precision.value.as_str().to_string()));
        stages.push(StagePlan {
            name: st.name.clone(),
            kind: st.kind.clone(),
            role: st.role,
            symbol: symbol.to_string(),
            placed: pl.placed,
            gpus: if pl.placed == Where::Host { 0 } else { range_count(&pl.ranges) },
            ranges: pl.ranges.clone(),
            shares_with: pl.shares_with.clone(),
            model: st.model.as_ref().map(|m| m.name.clone()),
            precision,
            layout,
        });
    }

    let syncs = plan_syncs(&mut cx, &placed, &train_facts, &rollouts);
    let step = plan_step(&cx, batch.as_ref(), &train_facts, &rollouts, &syncs);
    let buffer = plan_buffer(&cx, batch.as_ref());
    let gpu_map = gpu_map(&cx, &placed);

    // GPUs per set of roles, from the map, so colocated GPUs are counted once.
    let mut by_role: Vec<RoleGpus> = Vec::new();
    for sl in gpu_map.iter().filter(|s| !s.stages.is_empty()) {
        let mut roles: Vec<Role> = Vec::new();
        for name in &sl.stages {
            if let Some(st) = input.stages.iter().find(|s| &s.name == name) {
                if !roles.contains(&st.role) {
                    roles.push(st.role);
                }
            }
        }
        let n = sl.last - sl.first + 1;
        match by_role.iter_mut().find(|r| r.roles == roles) {
            Some(r) => r.gpus += n,
            None => by_role.push(RoleGpus { roles, gpus: n }),
        }
    }
    let idle_gpus = gpu_map.iter().filter(|s| s.stages.is_empty()).map(|s| s.last - s.first + 1).sum();
    let diagnostics = std::mem::take(&mut cx.diags);
    let errors = diagnostics.iter().filter(|d| d.is_error()).count();
    let warnings = diagnostics.len() - errors;
    let cluster = ClusterSummary {
        name: input.cluster.name.clone(),
        gpus: cx.total_gpus,
        nodes: node,
        pools: cx
            .pools
            .iter()
            .zip(&input.cluster.pools)
            .map(|(p, ip)| PoolSummary {
                gpu: p.gpu.name.clone(),
                nodes: ip.nodes.value,
                gpus_per_node: p.gpu.gpus_per_node,
                first_gpu: p.first_gpu,
                first_node: p.first_node,
                hbm: p.gpu.hbm,
            })
            .collect(),
        host: input.cluster.host.as_ref().map(|h| h.name.clone()),
    };
    Plan {
        format_version: FORMAT_VERSION,
        recipe: input.recipe.clone(),
        cluster,
        placement: input.placement.mode.value,
        summary: Summary {
            stages: input.stages.len() + input.syncs.len(),
            gpus: cx.total_gpus,
            by_role,
            idle_gpus,
            errors,
            warnings,
        },
        stages,
        gpu_map,
        memory,
        rollouts,
        syncs,
        step,
        batch,
        buffer,
        graph: input.graph.clone(),
        diagnostics,
    }
}

fn backend_name(b: Backend) -> &'static str {
    match b {
        Backend::Megatron => "megatron",
        Backend::Fsdp => "fsdp",
        Backend::Embedded => "embedded",
    }
}

// ---- batch -------------------------------------------------------------------------------------

fn resolve_batch(cx: &mut Ctx) -> Option<BatchReport> {
    let b = &cx.input.batch;
    let v = |x: &Option<Spanned<u64>>| x.map(|s| s.value);
    let (rb, spp, gb_, spr) =
        (v(&b.rollout_batch), v(&b.samples_per_prompt), v(&b.global_batch), v(&b.steps_per_rollout));
    for (name, f) in [
        ("rollout_batch", &b.rollout_batch),
        ("samples_per_prompt", &b.samples_per_prompt),
        ("global_batch", &b.global_batch),
        ("steps_per_rollout", &b.steps_per_rollout),
    ] {
        if let Some(s) = f {
            if s.value == 0 {
                cx.error("E0405", format!("{name} is 0"), s.span, "must be at least 1", None);
                return None;
            }
        }
    }
    // rollout_batch x samples_per_prompt = global_batch x steps_per_rollout; derive a missing one.
    let (rb, spp, gb_, spr, derived) = match (rb, spp, gb_, spr) {
        (Some(a), Some(b2), Some(c), Some(d)) => (a, b2, c, d, None),
        (Some(a), Some(b2), Some(c), None) => {
            let prod = a.saturating_mul(b2);
            if prod % c != 0 {
                cx.error(
                    "E0405",
                    format!("global_batch {c} does not divide rollout_batch x samples_per_prompt = {prod}"),
                    b.global_batch.and_then(|s| s.span),
                    "steps_per_rollout would not be whole",
                    Some(format!("pick a global_batch that divides {prod}")),
                );
                return None;
            }
            (a, b2, c, prod / c, Some("steps_per_rollout"))
        }
        (Some(a), Some(b2), None, Some(d)) => {
            let prod = a.saturating_mul(b2);
            if prod % d != 0 {
                cx.error(
                    "E0405",
                    format!("steps_per_rollout {d} does not divide rollout_batch x samples_per_prompt = {prod}"),
                    b.steps_per_rollout.and_then(|s| s.span),
                    "global_batch would not be whole",
                    None,
                );
                return None;
            }
            (a, b2, prod / d, d, Some("global_batch"))
        }
        (Some(a), Some(b2), None, None) => (a, b2, a.saturating_mul(b2), 1, Some("global_batch")),
        (None, Some(b2), Some(c), Some(d)) if c.saturating_mul(d) % b2 == 0 => {
            (c.saturating_mul(d) / b2, b2, c, d, Some("rollout_batch"))
        }
        (Some(a), None, Some(c), Some(d)) if c.saturating_mul(d) % a == 0 => {
            (a, c.saturating_mul(d) / a, c, d, Some("samples_per_prompt"))
        }
        _ => return None,
    };
    if rb.saturating_mul(spp) != gb_.saturating_mul(spr) {
        cx.error(
            "E0405",
            format!(
                "rollout_batch x samples_per_prompt = {} but global_batch x steps_per_rollout = {}",
                rb.saturating_mul(spp),
                gb_.saturating_mul(spr)
            ),
            b.global_batch.and_then(|s| s.span),
            "these must be equal",
            Some("every sample generated in a rollout step must be trained on exactly once".into()),
        );
    }
    let train = cx.input.stages.iter().find_map(|s| s.trainer.as_ref());
    let tokens_per_step = train.map(|t| gb_.saturating_mul(t.seq_len.value));
    Some(BatchReport {
        rollout_batch: rb,
        samples_per_prompt: spp,
        global_batch: gb_,
        steps_per_rollout: spr,
        derived: derived.map(String::from),
        samples_per_rollout: rb.saturating_mul(spp),
        micro_batches_per_step: None,
        tokens_per_step,
    })
}

// ---- layouts -----------------------------------------------------------------------------------

fn validate_layouts(cx: &mut Ctx) {
    let input = cx.input;
    for st in &input.stages {
        if let Some(t) = &st.trainer {
            for (name, f) in [
                ("tp", &t.tp),
                ("pp", &t.pp),
                ("cp", &t.cp),
                ("ep", &t.ep),
                ("micro_batch", &t.micro_batch),
                ("seq_len", &t.seq_len),
            ] {
                if f.value == 0 {
                    cx.error(
                        "E0404",
                        format!("{}: {name} is 0", st.name),
                        f.span.or(st.span),
                        "must be at least 1",
                        None,
                    );
                }
            }
            if let Some(dp) = t.dp {
                if dp.value == 0 {
                    cx.error("E0404", format!("{}: dp is 0", st.name), dp.span.or(st.span), "must be at least 1", None);
                }
            }
            if let Some(m) = &st.model {
                // Layers that do not split evenly over PP are fine (Megatron sizes the first
                // and last stages separately); the plan sizes the largest stage.
                if t.ep.value > 1 && m.experts % t.ep.value != 0 {
                    cx.error(
                        "E0404",
                        format!("{}: {} experts do not split over EP{}", st.name, m.experts, t.ep.value),
                        t.ep.span.or(st.span),
                        "EP must divide the expert count",
                        None,
                    );
                }
            }
        }
        if let Some(e) = &st.engine {
            for (name, f) in [("tp", &e.tp), ("dp", &e.dp), ("ep", &e.ep)] {
                if f.value == 0 {
                    cx.error(
                        "E0404",
                        format!("{}: {name} is 0", st.name),
                        f.span.or(st.span),
                        "must be at least 1",
                        None,
                    );
                }
            }
            if e.tp.value > 0 && (e.tp.value % e.dp.value.max(1) != 0 || e.tp.value % e.ep.value.max(1) != 0) {
                cx.error(
                    "E0404",
                    format!(
                        "{}: engine DP{} and EP{} must divide its TP{}",
                        st.name, e.dp.value, e.ep.value, e.tp.value
                    ),
                    e.dp.span.or(e.ep.span).or(st.span),
                    "an engine spans tp GPUs; dp and ep partition them",
                    None,
                );
            }
            if e.engines.is_some_and(|n| n.value == 0) {
                cx.error(
                    "E0404",
                    format!("{}: 0 engines", st.name),
                    e.engines.and_then(|n| n.span).or(st.span),
                    "must be at least 1",
                    None,
                );
            }
            if !(e.mem_fraction.value > 0.0 && e.mem_fraction.value <= 1.0) {
                cx.error(
                    "E0404",
                    format!("{}: mem_fraction {} is not in (0, 1]", st.name, e.mem_fraction.value),
                    e.mem_fraction.span.or(st.span),
                    "share of HBM",
                    None,
                );
            }
        }
        if (st.trainer.is_some() || st.engine.is_some()) && st.model.is_none() {
            cx.error(
                "E0409",
                format!("{}: no model to plan with", st.name),
                st.span,
                "this stage's model is unknown",
                Some("give the stage a model from std/models or a `llm { ... }` record".into()),
            );
        }
    }
}

fn layout_ok(t: &Trainer) -> bool {
    t.tp.value > 0
        && t.pp.value > 0
        && t.cp.value > 0
        && t.ep.value > 0
        && t.micro_batch.value > 0
        && t.seq_len.value > 0
        && t.dp.is_none_or(|d| d.value > 0)
}

fn engine_ok(e: &Engine) -> bool {
    e.tp.value > 0
        && e.dp.value > 0
        && e.ep.value > 0
        && e.tp.value.is_multiple_of(e.dp.value)
        && e.tp.value.is_multiple_of(e.ep.value)
        && e.engines.is_none_or(|n| n.value > 0)
        && e.mem_fraction.value > 0.0
        && e.mem_fraction.value <= 1.0
}

// ---- placement ---------------------------------------------------------------------------------

fn place(cx: &mut Ctx) -> Vec<Placed> {
    let input = cx.input;
    let n = input.stages.len();
    let mut out: Vec<Placed> =
        vec![Placed { placed: Where::Host, ranges: Vec::new(), shares_with: Vec::new(), error: false }; n];
    for (i, st) in input.stages.iter().enumerate() {
        out[i].error = st.trainer.as_ref().is_some_and(|t| !layout_ok(t))
            || st.engine.as_ref().is_some_and(|e| !engine_ok(e))
            || ((st.trainer.is_some() || st.engine.is_some()) && st.model.is_none());
    }
    let uses_gpu = |st: &Stage| {
        st.trainer.is_some() || st.engine.is_some() || st.gpus.is_some_and(|g| g.value != GpuRequest::Auto)
    };
    if cx.total_gpus == 0 {
        for (i, st) in input.stages.iter().enumerate() {
            if st.gpus.is_some_and(|g| g.value != GpuRequest::Auto) {
                let span = st.gpus.and_then(|g| g.span).or(st.span);
                cx.error(
                    "E0403",
                    format!("{} asks for GPUs but cluster {} has none", st.name, input.cluster.name),
                    span,
                    "no GPU to give",
                    None,
                );
                out[i].error = true;
            } else if uses_gpu(st) && input.cluster.host.is_none() {
                cx.error(
                    "E0403",
                    format!("{}: cluster {} has neither GPUs nor a host", st.name, input.cluster.name),
                    input.cluster.span.or(st.span),
                    "nothing to run on",
                    None,
                );
                out[i].error = true;
            }
        }
        return out;
    }
    let mut free = Free(vec![(0, cx.total_gpus)]);
    let colocated = input.placement.mode.value == PlacementMode::Colocated;
    let co = |st: &Stage| {
        colocated
            && matches!(st.role, Role::Rollout | Role::Train | Role::Sft)
            && (st.trainer.is_some() || st.engine.is_some())
    };

    // Colocated group: one shared range, the first explicit request among them or every GPU.
    let group: Vec<usize> = (0..n).filter(|&i| co(&input.stages[i])).collect();
    if !group.is_empty() {
        let req =
            group.iter().find_map(|&i| input.stages[i].gpus.filter(|g| g.value != GpuRequest::Auto).map(|g| (i, g)));
        let ranges = match req {
            Some((i, g)) => take(cx, &mut free, &input.stages[i], g),
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

    // Explicit ranges, then explicit or derived counts, then the automatic split.
    let mut auto: Vec<usize> = Vec::new();
    for pass in 0..2 {
        for (i, st) in input.stages.iter().enumerate() {
            if co(st) || !uses_gpu(st) && st.gpus.is_none() {
                continue;
            }
            if st.role == Role::Eval && st.gpus.is_none() {
                continue; // shares the rollout engines, below
            }
            let req = st.gpus.map(|g| g.value);
            let derived = derived_count(st);
            match (pass, req) {
                (0, Some(GpuRequest::Range { .. })) => {
                    let g = st.gpus.unwrap_or_default();
                    match take(cx, &mut free, st, g) {
                        Some(r) => (out[i].ranges, out[i].placed) = (r, Where::Own),
                        None => out[i].error = true,
                    }
                }
                (1, Some(GpuRequest::Count(_))) => {
                    let g = st.gpus.unwrap_or_default();
                    match take(cx, &mut free, st, g) {
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
                                "E0403",
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
    // Split what is left evenly among the automatic stages, rounded down to each one's unit.
    let left = free.total();
    let k = auto.iter().filter(|&&i| !out[i].error).count() as u64;
    for &i in &auto {
        if out[i].error {
            continue;
        }
        let st = &input.stages[i];
        let unit = st.trainer.as_ref().map(trainer_unit).or(st.engine.as_ref().map(|e| e.tp.value)).unwrap_or(1).max(1);
        let share = div(left as f64, k as f64) as u64 / unit * unit;
        match free.take_count(share) {
            Some(r) if share > 0 => (out[i].ranges, out[i].placed) = (r, Where::Own),
            _ => {
                cx.error(
                    "E0403",
                    format!("no GPUs left for {} (needs multiples of {unit})", st.name),
                    st.span,
                    "placed automatically",
                    Some("give the stages explicit `gpus = N` or add nodes".into()),
                );
                out[i].error = true;
            }
        }
    }
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
                    "E0403",
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
                    "E0403",
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
                    "E0403",
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

// ---- trainer -----------------------------------------------------------------------------------

#[derive(Clone, Debug)]
struct TrainFacts {
    stage: String,
    gpus: u64,
    pp: u64,
    params: f64,
    layers: u64,
    precision: Precision,
    step: Estimate,
    offload_s: f64,
    network_bw: f64,
    gpus_per_node: u64,
    disk_bw: f64,
}

fn peak_flops(g: &GpuSpec, p: Precision) -> f64 {
    match p {
        Precision::Fp32 => g.bf16 / 2.0,
        Precision::Bf16 | Precision::Fp16 => g.bf16,
        Precision::Fp8Blockwise | Precision::Mxfp8 => g.fp8.unwrap_or(g.bf16),
        Precision::Nvfp4 => g.fp4.or(g.fp8).unwrap_or(g.bf16),
    }
}

struct TrainMem {
    weights: f64,
    gradients: f64,
    optimizer: f64,
    activations: f64,
    stream_buffer: f64,
}

impl TrainMem {
    fn on_gpu(&self, offload: OptimizerOffload) -> f64 {
        let opt = if offload == OptimizerOffload::OnGpu { self.optimizer } else { 0.0 };
        let buf = if offload == OptimizerOffload::StreamFromDisk { self.stream_buffer } else { 0.0 };
        self.weights + self.gradients + opt + self.activations + buf
    }
}

fn train_mem(m: &ModelSpec, l: &Layout, t: &Trainer, global_batch: Option<u64>, recompute: Recompute) -> TrainMem {
    let s = model::state_bytes(m, l);
    let micro = global_batch.map(|g| g / (l.dp * t.micro_batch.value).max(1));
    let act = model::activation_bytes(m, l, t.seq_len.value, t.micro_batch.value, micro, recompute);
    let layers_per_stage = m.layers.div_ceil(l.pp.max(1)).max(1) as f64;
    TrainMem {
        weights: s.weights,
        gradients: s.gradients,
        optimizer: s.optimizer,
        activations: act,
        stream_buffer: 2.0 * s.optimizer / layers_per_stage,
    }
}

fn plan_trainer(
    cx: &mut Ctx,
    st: &Stage,
    t: &Trainer,
    pl: &Placed,
    dp: u64,
    batch: Option<&BatchReport>,
    memory: &mut Vec<MemoryReport>,
) -> Option<TrainFacts> {
    let m = st.model.as_ref()?;
    let a = &cx.input.assumptions;
    let on_host = pl.placed == Where::Host;
    let gpus = if on_host { 1 } else { range_count(&pl.ranges) };
    if dp == 0 || trainer_unit(t).saturating_mul(dp) != gpus {
        cx.error(
            "E0404",
            format!(
                "{}: TP{} x PP{} x CP{} x DP{} = {} but the stage has {gpus} GPUs",
                st.name,
                t.tp.value,
                t.pp.value,
                t.cp.value,
                dp,
                trainer_unit(t).saturating_mul(dp)
            ),
            t.dp.and_then(|d| d.span).or(st.gpus.and_then(|g| g.span)).or(st.span),
            "layout does not match the GPUs",
            Some(format!("the GPU count must be a multiple of tp x pp x cp = {}", trainer_unit(t))),
        );
        return None;
    }
    let l = Layout {
        backend: t.backend.value,
        tp: t.tp.value,
        pp: t.pp.value,
        cp: t.cp.value,
        ep: t.ep.value,
        dp,
        precision: t.precision.value,
    };
    if l.backend == Backend::Megatron && !(l.tp * l.cp * l.dp).is_multiple_of(l.etp() * l.ep) {
        cx.error(
            "E0404",
            format!("{}: EP{} does not divide TP x CP x DP = {}", st.name, l.ep, l.tp * l.cp * l.dp),
            t.ep.span.or(st.span),
            "experts cannot be placed",
            None,
        );
        return None;
    }
    let device = cx.device(&pl.ranges);
    let (dev_name, capacity, usable_share) = match (device, &cx.input.cluster.host) {
        (Some(g), _) if !on_host => (g.name.clone(), g.hbm, a.usable_hbm),
        (_, Some(h)) => (h.name.clone(), h.memory, a.usable_hbm),
        _ => return None,
    };
    let usable = capacity as f64 * usable_share;
    let global = batch.map(|b| b.global_batch);
    let recompute = t.recompute.value;
    let offload = t.optimizer_offload.value;
    let mem = train_mem(m, &l, t, global, recompute);
    let total = mem.on_gpu(offload);
    let fits = total <= usable;

    // Offload cost per optimizer step.
    let gpn = device.map_or(1, |g| g.gpus_per_node.max(1)).min(gpus);
    let eff = a.link_efficiency;
    let host_link = device.map_or(0.0, |g| g.host_link_bandwidth);
    let disk_bw = device.and_then(|g| g.disk_bandwidth).unwrap_or(a.disk_bandwidth);
    let stream_cost = |opt: f64| -> Estimate {
        let per_node = 2.0 * opt * gpn as f64;
        let disk = div(per_node, disk_bw);
        let link = div(2.0 * opt, host_link * eff);
        Estimate {
            seconds: disk.max(link),
            assumptions: vec![
                format!("read + write {} of optimizer state per GPU each step, {} GPUs per node", gb(opt), gpn),
                format!(
                    "node disk {:.0} GB/s; GPU-host link {:.0} GB/s x {:.0}%",
                    disk_bw / 1e9,
                    host_link / 1e9,
                    eff * 100.0
                ),
                "transfers not overlapped with compute (upper bound)".into(),
            ],
        }
    };
    let cpu_cost = |opt: f64| -> Estimate {
        let params = opt / model::optimizer_bytes_per_param(l.precision);
        let bytes = params * (4.0 + l.precision.bytes());
        Estimate {
            seconds: div(bytes, host_link * eff),
            assumptions: vec![
                format!("FP32 gradients down and updated weights up: {} per GPU per step", gb(bytes)),
                format!("GPU-host link {:.0} GB/s x {:.0}%; CPU Adam time not counted", host_link / 1e9, eff * 100.0),
            ],
        }
    };
    let offload_report = match offload {
        OptimizerOffload::OnGpu => None,
        OptimizerOffload::StreamFromDisk => Some(OffloadReport {
            mode: "stream_from_disk".into(),
            bytes_per_gpu: mem.optimizer as u64,
            host_bytes_per_node: 0,
            per_step: stream_cost(mem.optimizer),
        }),
        OptimizerOffload::Cpu => {
            let host = mem.optimizer * gpn as f64;
            if let Some(hm) = device.and_then(|g| g.host_memory) {
                if host > hm as f64 {
                    cx.warning(
                        "E0408",
                        format!(
                            "{}: CPU-offloaded optimizer state needs {} of host memory per node, nodes have {}",
                            st.name,
                            gb(host),
                            gb(hm as f64)
                        ),
                        t.optimizer_offload.span.or(st.span),
                        "offloaded here",
                        Some(
                            "use `optimizer = adam { state = stream_from_disk }`, or more GPUs to shard the state further"
                                .into(),
                        ),
                    );
                }
            }
            Some(OffloadReport {
                mode: "cpu".into(),
                bytes_per_gpu: mem.optimizer as u64,
                host_bytes_per_node: host as u64,
                per_step: cpu_cost(mem.optimizer),
            })
        }
    };

    let opt_note = match offload {
        OptimizerOffload::OnGpu => format!(
            "FP32 master + 2 Adam moments, {} B/param, sharded over {} ranks",
            model::optimizer_bytes_per_param(l.precision),
            optimizer_shards(&l)
        ),
        OptimizerOffload::Cpu => format!("{} kept in host memory", gb(mem.optimizer)),
        OptimizerOffload::StreamFromDisk => format!("{} streamed from disk", gb(mem.optimizer)),
    };
    let mut items = vec![
        MemItem {
            name: "weights".into(),
            bytes: mem.weights as u64,
            note: format!("{} x {} B", l.precision.as_str(), l.precision.bytes()),
        },
        MemItem { name: "gradients".into(), bytes: mem.gradients as u64, note: "FP32 accumulation buffer".into() },
        MemItem {
            name: "optimizer".into(),
            bytes: if offload == OptimizerOffload::OnGpu { mem.optimizer as u64 } else { 0 },
            note: opt_note,
        },
        MemItem {
            name: "activations".into(),
            bytes: mem.activations as u64,
            note: format!(
                "seq {} / CP{}, micro-batch {}, recompute {}",
                t.seq_len.value,
                l.cp,
                t.micro_batch.value,
                recompute_name(recompute)
            ),
        },
    ];
    if offload == OptimizerOffload::StreamFromDisk {
        items.push(MemItem {
            name: "stream_buffer".into(),
            bytes: mem.stream_buffer as u64,
            note: "two layers of optimizer state in flight".into(),
        });
    }
    if !fits {
        let over = total - usable;
        let fixes = train_fixes(cx, m, &l, t, global, &mem, usable, gpus, &stream_cost, &cpu_cost);
        let mut d = Diagnostic::error(
            "E0401",
            format!(
                "{} does not fit in GPU memory: {} per GPU, {} has {} usable ({} x {:.0}%); over by {}",
                st.name,
                gb(total),
                dev_name,
                gb(usable),
                gb(capacity as f64),
                usable_share * 100.0,
                gb(over)
            ),
        )
        .with_help(format!("fixes: {}", fixes.join("; ")));
        if let Some(sp) = st.span {
            d = d.with_primary(sp, format!("needs {} per GPU", gb(total)));
        }
        if offload == OptimizerOffload::OnGpu {
            if let Some(sp) = t.optimizer_offload.span {
                d = d.with_secondary(sp, format!("optimizer state ({}) stays in HBM", gb(mem.optimizer)));
            }
        }
        cx.diags.push(d);
    }
    if let Some(g) = device {
        tp_domain_warning(cx, st, "trainer", l.tp, t.tp.span, g);
    }
    memory.push(MemoryReport {
        stage: st.name.clone(),
        role: st.role,
        device: dev_name,
        capacity,
        usable: usable as u64,
        total: total as u64,
        items,
        fits,
        offload: offload_report.clone(),
    });

    // Step time from FLOPs and MFU.
    let seq = t.seq_len.value as f64;
    let flops_tok = time::train_flops_per_token(
        m.active_params as f64,
        m.layers as f64,
        seq,
        (m.heads * m.head_dim) as f64,
        recompute == Recompute::Full,
    );
    let peak = match device {
        Some(g) if !on_host => peak_flops(g, l.precision),
        _ => cx.input.cluster.host.as_ref().and_then(|h| h.fp32).unwrap_or(0.0),
    };
    let tokens = global.map_or(0.0, |g| g as f64 * seq);
    let step_s = div(tokens * flops_tok, gpus as f64 * peak * a.train_mfu);
    let step = Estimate {
        seconds: step_s,
        assumptions: vec![
            format!("{:.3e} tokens per optimizer step (global batch x seq {})", tokens, t.seq_len.value),
            format!(
                "{:.3e} FLOPs per token: 6 x active + 2 x active (old log-probs){} + attention",
                flops_tok,
                if recompute == Recompute::Full { " + 2 x active (recompute)" } else { "" }
            ),
            format!(
                "{} GPUs x {:.0} TFLOP/s {} x MFU {:.0}%",
                gpus,
                peak / 1e12,
                l.precision.as_str(),
                a.train_mfu * 100.0
            ),
        ],
    };
    Some(TrainFacts {
        stage: st.name.clone(),
        gpus,
        pp: l.pp,
        params: m.params as f64,
        layers: m.layers,
        precision: l.precision,
        step,
        offload_s: offload_report.map_or(0.0, |o| o.per_step.seconds),
        network_bw: device.map_or(0.0, |g| g.network_bandwidth),
        gpus_per_node: device.map_or(1, |g| g.gpus_per_node),
        disk_bw,
    })
}

fn optimizer_shards(l: &Layout) -> u64 {
    match l.backend {
        Backend::Megatron => l.tp * l.pp * l.cp * l.dp,
        Backend::Fsdp => l.dp * l.tp * l.pp * l.cp,
        Backend::Embedded => 1,
    }
}

fn recompute_name(r: Recompute) -> &'static str {
    match r {
        Recompute::Full => "full",
        Recompute::Selective => "selective",
        Recompute::Off => "off",
    }
}

#[allow(clippy::too_many_arguments)]
fn train_fixes(
    cx: &Ctx,
    m: &ModelSpec,
    l: &Layout,
    t: &Trainer,
    global: Option<u64>,
    mem: &TrainMem,
    usable: f64,
    gpus: u64,
    stream_cost: &dyn Fn(f64) -> Estimate,
    cpu_cost: &dyn Fn(f64) -> Estimate,
) -> Vec<String> {
    let mut fixes = Vec::new();
    let offload = t.optimizer_offload.value;
    let verdict = |x: f64| {
        if x <= usable {
            "fits".to_string()
        } else {
            format!("still {} over", gb(x - usable))
        }
    };
    if offload != OptimizerOffload::StreamFromDisk {
        let x = mem.on_gpu(OptimizerOffload::StreamFromDisk);
        fixes.push(format!(
            "`optimizer = adam {{ state = stream_from_disk }}`: {} per GPU ({}), est. +{:.1} s per step",
            gb(x),
            verdict(x),
            stream_cost(mem.optimizer).seconds
        ));
    }
    if offload != OptimizerOffload::Cpu {
        let x = mem.on_gpu(OptimizerOffload::Cpu);
        fixes.push(format!(
            "`optimizer = adam {{ state = cpu }}`: {} per GPU ({}), needs {} host memory per GPU, est. +{:.1} s per step",
            gb(x),
            verdict(x),
            gb(mem.optimizer),
            cpu_cost(mem.optimizer).seconds
        ));
    }
    if l.backend != Backend::Embedded && (offload == OptimizerOffload::OnGpu || l.backend == Backend::Fsdp) {
        // More data-parallel replicas shard the optimizer state (and, under FSDP, everything).
        for k in [2u64, 4, 8, 16] {
            let l2 = Layout { dp: l.dp * k, ..*l };
            let x = train_mem(m, &l2, t, global, t.recompute.value).on_gpu(offload);
            if x <= usable {
                fixes.push(format!("{} GPUs for this stage (DP{}): {} per GPU", gpus * k, l2.dp, gb(x)));
                break;
            }
        }
    }
    if t.recompute.value != Recompute::Full {
        let x = train_mem(m, l, t, global, Recompute::Full).on_gpu(offload);
        fixes.push(format!("`recompute = full`: {} per GPU ({})", gb(x), verdict(x)));
    }
    if l.backend == Backend::Megatron && m.layers >= 2 * l.pp && l.dp.is_multiple_of(2) {
        let l2 = Layout { pp: l.pp * 2, dp: l.dp / 2, ..*l };
        let x = train_mem(m, &l2, t, global, t.recompute.value).on_gpu(offload);
        fixes.push(format!("PP{} DP{} on the same GPUs: {} per GPU ({})", l2.pp, l2.dp, gb(x), verdict(x)));
    }
    let _ = cx;
    fixes
}

fn tp_domain_warning(cx: &mut Ctx, st: &Stage, what: &str, tp: u64, span: Option<Span>, g: &GpuSpec) {
    let domain = g.scaleup_domain.max(1);
    if tp > domain || !domain.is_multiple_of(tp.max(1)) {
        cx.warning(
            "E0406",
            format!("{}: {what} TP{tp} spans NVLink domains of {domain} {} GPUs", st.name, g.name),
            span.or(st.span),
            "tensor-parallel traffic crosses the scale-out network",
            Some(format!("keep TP a divisor of {domain}; use PP, EP or more engines for the rest")),
        );
    }
}

// ---- rollout -----------------------------------------------------------------------------------

fn plan_engine(
    cx: &mut Ctx,
    st: &Stage,
    e: &Engine,
    pl: &Placed,
    engines: u64,
    batch: Option<&BatchReport>,
    memory: &mut Vec<MemoryReport>,
) -> Option<RolloutReport> {
    let m = st.model.as_ref()?;
    let a = cx.input.assumptions.clone();
    let gpus = range_count(&pl.ranges);
    let (tp, dp) = (e.tp.value, e.dp.value);
    if pl.placed == Where::Host || gpus == 0 {
        return None;
    }
    if engines.saturating_mul(tp) > gpus || engines == 0 {
        cx.error(
            "E0404",
            format!(
                "{}: {engines} engines x TP{tp} need {} GPUs, the stage has {gpus}",
                st.name,
                engines.saturating_mul(tp)
            ),
            e.engines.and_then(|n| n.span).or(st.span),
            "engines do not fit the GPUs",
            None,
        );
        return None;
    }
    let g = cx.device(&pl.ranges)?;
    let p = e.precision.value;
    let kvp = e.kv_precision.map_or(Precision::Bf16, |k| k.value);
    let weights = model::rollout_weight_bytes(m, tp, dp, p);
    let budget = g.hbm as f64 * e.mem_fraction.value;
    let kv = budget - weights;
    let group = (tp / dp).max(1);
    let per_token = model::kv_bytes_per_token(m, group, kvp);
    let kv_tokens = if kv > 0.0 { (dp as f64 * div(kv, per_token)).floor() } else { 0.0 };
    let seq = e.prompt_len.value.saturating_add(e.response_len.value);
    let sequences = if seq == 0 { 0 } else { (kv_tokens / seq as f64) as u64 };
    let fits = kv > 0.0 && sequences > 0;
    tp_domain_warning(cx, st, "engine", tp, e.tp.span, g);
    if kv <= 0.0 {
        let mut fixes = Vec::new();
        let mut t2 = tp * 2;
        while t2 <= 64 * tp && t2 <= gpus {
            if model::rollout_weight_bytes(m, t2, dp, p) < 0.8 * budget {
                fixes.push(format!("TP{t2} engines"));
                break;
            }
            t2 *= 2;
        }
        if p.bytes() > 1.1 && g.fp8.is_some() {
            fixes.push(format!(
                "`precision = fp8_blockwise` ({} per GPU)",
                gb(model::rollout_weight_bytes(m, tp, dp, Precision::Fp8Blockwise))
            ));
        }
        if e.mem_fraction.value < 0.9 {
            fixes.push("a larger `mem_fraction`".into());
        }
        cx.error(
            "E0402",
            format!(
                "{}: weights take {} per GPU, more than the engine's {} ({} x mem_fraction {})",
                st.name,
                gb(weights),
                gb(budget),
                gb(g.hbm as f64),
                e.mem_fraction.value
            ),
            e.tp.span.or(st.span),
            "no room left for the KV cache",
            Some(format!("fixes: {}", if fixes.is_empty() { "more GPUs per engine".into() } else { fixes.join("; ") })),
        );
    } else if sequences == 0 {
        cx.error(
            "E0402",
            format!(
                "{}: the KV cache holds {} tokens per engine, one sequence of {} + {} tokens does not fit",
                st.name, kv_tokens, e.prompt_len.value, e.response_len.value
            ),
            e.response_len.span.or(st.span),
            "sequence too long for the KV cache",
            Some("fixes: larger TP, `kv_precision = fp8_blockwise`, shorter responses".into()),
        );
    }
    if let Some(mc) = e.max_concurrent {
        if fits && mc.value > sequences {
            cx.warning(
                "E0407",
                format!(
                    "{}: {} concurrent requests per engine asked, the KV cache holds {} sequences of {} tokens",
                    st.name, mc.value, sequences, seq
                ),
                mc.span.or(st.span),
                "requests beyond this wait or are retracted",
                Some("larger TP or fewer concurrent requests; shorter prompts with prefix caching help too".into()),
            );
        }
    }
    memory.push(MemoryReport {
        stage: st.name.clone(),
        role: st.role,
        device: g.name.clone(),
        capacity: g.hbm,
        usable: budget as u64,
        items: vec![
            MemItem {
                name: "weights".into(),
                bytes: weights as u64,
                note: format!(
                    "{} on TP{tp}{}",
                    p.as_str(),
                    if dp > 1 { format!(" (DP-attention {dp})") } else { String::new() }
                ),
            },
            MemItem {
                name: "kv_cache".into(),
                bytes: kv.max(0.0) as u64,
                note: format!(
                    "{} tokens per engine at {} B/token/GPU",
                    crate::render::count(kv_tokens as u64),
                    per_token
                ),
            },
        ],
        total: (weights + kv.max(0.0)) as u64,
        fits,
        offload: None,
    });
    // Throughput: decode at the batch the KV cache allows (or the recipe asks for, if smaller).
    let decode_batch = e.max_concurrent.map_or(sequences, |mc| mc.value.min(sequences));
    let split = model::param_split(m);
    let ctx_avg = e.prompt_len.value as f64 + e.response_len.value as f64 / 2.0;
    let d = DecodeShape {
        batch: decode_batch as f64,
        dense_weight_bytes: div(split.other, group as f64) * p.bytes(),
        expert_weight_bytes: div(split.routed, tp as f64) * p.bytes(),
        experts_touched: model::experts_touched(m, decode_batch),
        kv_read_bytes: div(decode_batch as f64, dp as f64) * ctx_avg * per_token,
        hbm_bw: g.hbm_bandwidth,
        bw_efficiency: a.decode_bandwidth_efficiency,
        flops: div(2.0 * m.active_params as f64 * decode_batch as f64, tp as f64),
        peak_flops: peak_flops(g, p),
        mfu: a.decode_mfu,
    };
    let (step_s, compute_bound) = time::decode_step_s(&d);
    let engine_tps = div(decode_batch as f64, step_s);
    let fleet_tps = engine_tps * engines as f64;
    let tokens_per_s = Estimate {
        seconds: fleet_tps,
        assumptions: vec![
            format!("{} sequences per engine decode together, average context {:.0} tokens", decode_batch, ctx_avg),
            format!(
                "a step reads {} of weights ({:.0}% of experts touched) + {} of KV per GPU",
                gb(d.dense_weight_bytes + d.expert_weight_bytes * d.experts_touched),
                d.experts_touched * 100.0,
                gb(d.kv_read_bytes)
            ),
            format!(
                "{} HBM {:.1} TB/s x {:.0}%; {}",
                g.name,
                g.hbm_bandwidth / 1e12,
                a.decode_bandwidth_efficiency * 100.0,
                if compute_bound { "compute-bound" } else { "bandwidth-bound" }
            ),
            format!("{:.1} ms per step, {:.0} tokens/s per engine x {} engines", step_s * 1e3, engine_tps, engines),
        ],
    };
    let rollout_time = batch.filter(|_| decode_batch > 0).map(|b| {
        let samples = b.samples_per_rollout as f64;
        let gen = samples * e.response_len.value as f64;
        let prefill = div(
            samples * e.prompt_len.value as f64 * 2.0 * m.active_params as f64,
            gpus as f64 * peak_flops(g, p) * a.train_mfu,
        );
        let waves = div(samples, (decode_batch * engines) as f64).ceil().max(1.0);
        let latency = waves * e.response_len.value as f64 * step_s;
        Estimate {
            seconds: div(gen, fleet_tps).max(latency) + prefill,
            assumptions: vec![
                format!("{} samples x {} response tokens", b.samples_per_rollout, e.response_len.value),
                format!(
                    "at least {} wave(s) of {} decode steps of {:.1} ms",
                    waves,
                    e.response_len.value,
                    step_s * 1e3
                ),
                format!(
                    "prefill {:.1} s at MFU {:.0}%; every response assumed full length",
                    prefill,
                    a.train_mfu * 100.0
                ),
            ],
        }
    });
    Some(RolloutReport {
        stage: st.name.clone(),
        engines,
        gpus_per_engine: tp,
        weights_per_gpu: weights as u64,
        kv_bytes_per_gpu: kv.max(0.0) as u64,
        kv_bytes_per_token: per_token as u64,
        kv_tokens_per_engine: kv_tokens as u64,
        sequences_per_engine: sequences,
        requested_concurrent: e.max_concurrent.map(|m| m.value),
        decode_batch,
        tokens_per_s,
        rollout_time,
    })
}

// ---- weight sync, step, buffer -----------------------------------------------------------------

fn plan_syncs(cx: &mut Ctx, placed: &[Placed], trains: &[TrainFacts], rollouts: &[RolloutReport]) -> Vec<SyncReport> {
    let input = cx.input;
    let a = &input.assumptions;
    let mut out = Vec::new();
    for s in &input.syncs {
        let (Some(t), Some(r)) = (trains.iter().find(|t| t.stage == s.from), rollouts.iter().find(|r| r.stage == s.to))
        else {
            continue; // the stage graph checks name the missing end; nothing to estimate
        };
        let ri = input.stages.iter().position(|x| x.name == s.to);
        let hbm_bw = ri.and_then(|i| cx.device(&placed[i].ranges)).map_or(0.0, |g| g.hbm_bandwidth);
        let network_bw = ri
            .and_then(|i| cx.device(&placed[i].ranges))
            .map_or(t.network_bw, |g| g.network_bandwidth.min(t.network_bw));
        let shape = SyncShape {
            bytes: t.params * t.precision.bytes(),
            layers: t.layers,
            bucket: s.bucket.value.max(1) as f64,
            train_gpus: t.gpus,
            train_pp: t.pp,
            engines: r.engines,
            gpus_per_engine: r.gpus_per_engine,
            network_bw,
            gpus_per_node: t.gpus_per_node,
            disk_bw: t.disk_bw,
            hbm_bw,
            link_efficiency: a.link_efficiency,
            broadcast_layer_s: a.broadcast_layer_s,
            p2p_layer_s: a.p2p_layer_s,
            requantize_s: a.requantize_s,
        };
        let colocated = input.placement.mode.value == PlacementMode::Colocated;
        let est = |tr: Transport| match tr {
            Transport::Broadcast => time::broadcast(&shape),
            Transport::P2p => time::p2p(&shape),
            Transport::DiskDelta => time::disk_delta(&shape),
            Transport::Local => time::local(&shape),
        };
        let chosen = if colocated { Transport::Local } else { s.transport.value };
        let others: &[Transport] =
            if colocated { &[] } else { &[Transport::Broadcast, Transport::P2p, Transport::DiskDelta] };
        out.push(SyncReport {
            name: s.name.clone(),
            from: s.from.clone(),
            to: s.to.clone(),
            transport: chosen,
            bucket: s.bucket.value,
            bytes: shape.bytes as u64,
            estimate: est(chosen),
            alternatives: others
                .iter()
                .filter(|&&x| x != chosen)
                .map(|&x| TransportEstimate { transport: x, seconds: est(x).seconds })
                .collect(),
        });
    }
    out
}

fn plan_step(
    cx: &Ctx,
    batch: Option<&BatchReport>,
    trains: &[TrainFacts],
    rollouts: &[RolloutReport],
    syncs: &[SyncReport],
) -> Option<StepReport> {
    let b = batch?;
    let t = trains.first()?;
    let r = rollouts.first()?;
    let rollout_s = r.rollout_time.as_ref()?.seconds;
    let spr = b.steps_per_rollout as f64;
    let train_s = t.step.seconds * spr;
    let offload_s = t.offload_s * spr;
    let sync_s = syncs.first().map_or(0.0, |s| s.estimate.seconds);
    let colocated = cx.input.placement.mode.value == PlacementMode::Colocated;
    let sync_step_s = rollout_s + train_s + offload_s + sync_s;
    // Colocated stages alternate, so nothing overlaps whatever the schedule says.
    let async_step_s = if colocated { sync_step_s } else { rollout_s.max(train_s + offload_s) + sync_s };
    let mode = cx.input.schedule.mode.value;
    let seconds = if mode == ScheduleMode::Sync { sync_step_s } else { async_step_s };
    Some(StepReport {
        mode,
        rollout_s,
        train_s,
        train_step: t.step.clone(),
        sync_s,
        offload_s,
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
                format!("{} optimizer step(s) per rollout step", b.steps_per_rollout),
            ],
        },
    })
}

fn plan_buffer(cx: &Ctx, batch: Option<&BatchReport>) -> Option<BufferReport> {
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
    let r3 = if input.r3.value { st.model.as_ref().map(|m| model::r3_bytes(m, tokens)) } else { None };
    let per = tokens as f64 * input.assumptions.buffer_bytes_per_token + r3.unwrap_or(0.0);
    Some(BufferReport {
        max_staleness: staleness,
        capacity_groups: capacity,
        trajectories,
        tokens_per_trajectory: tokens,
        bytes_per_trajectory: per as u64,
        r3_bytes_per_trajectory: r3.map(|x| x as u64),
        bytes: (per * trajectories as f64) as u64,
    })
}

// ---- GPU map -----------------------------------------------------------------------------------

fn gpu_map(cx: &Ctx, placed: &[Placed]) -> Vec<GpuSlice> {
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
