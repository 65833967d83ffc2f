//! From a [`PlanInput`] to a [`Plan`]. Work is proportional to the number of stages, node pools
//! and GPU ranges, never to the number of GPUs, so a 100,000-GPU cluster plans as fast as a
//! small one (bench/plan/).

use crate::input::*;
use crate::output::*;
use miles_grammar::diag::ErrorCode;
use miles_grammar::diag::{Diagnostic, Span};
use placement::{trainer_unit, Placed};
use trainer::TrainFacts;

pub use colocate::OFFLOAD_LINK_EFFICIENCY;

mod batch;
mod colocate;
mod data_parallel;
mod device;
mod diffusion;
mod embedded;
mod episodes;
mod gpu;
mod layout;
mod lengths;
mod placement;
mod rollout;
mod step;
mod sync;
mod teacher;
pub mod throttle;
mod trainer;

/// One pool with its place in the GPU and node numbering.
struct Pool<'a> {
    gpu: &'a GpuSpec,
    first_gpu: u64,
    first_node: u64,
    gpus: u64,
}

/// What every step of the planner reads, and the diagnostics it has reported so far.
struct Ctx<'a> {
    input: &'a PlanInput,
    pools: Vec<Pool<'a>>,
    total_gpus: u64,
    diags: Vec<Diagnostic>,
    /// The GPU the embedded process computes on, where a `local` cluster's `device` resolved to
    /// cuda:0 (`device::plan_device`); `None`: the host's CPU.
    gpu: Option<gpu::Gpu>,
}

impl<'a> Ctx<'a> {
    fn error(&mut self, code: ErrorCode, msg: String, span: Option<Span>, label: &str, help: Option<String>) {
        self.report(Diagnostic::error(code, msg), span, label, help);
    }
    fn warning(&mut self, code: ErrorCode, msg: String, span: Option<Span>, label: &str, help: Option<String>) {
        self.report(Diagnostic::warning(code, msg), span, label, help);
    }
    fn report(&mut self, mut d: Diagnostic, span: Option<Span>, label: &str, help: Option<String>) {
        if let Some(sp) = span {
            d = d.with_primary(sp, label);
        }
        if let Some(h) = help {
            d = d.with_help(h);
        }
        self.diags.push(d);
    }
    fn errors(&self) -> usize {
        self.diags.iter().filter(|d| d.is_error()).count()
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

/// Runs the planner. Never panics; problems are in `Plan::diagnostics`.
pub fn plan(input: &PlanInput) -> Plan {
    let mut p = plan_once(input);
    // Advice that plans the recipe again with a changed value (E0412).
    throttle::advise(input, &mut p);
    p
}

/// One plan of `input`, without the advice that re-plans it.
fn plan_once(input: &PlanInput) -> Plan {
    let (pools, total_gpus, nodes, early) = number_pools(input);
    let mut cx = Ctx { input, pools, total_gpus, diags: early, gpu: None };

    let device = device::plan_device(&mut cx);
    let batch = batch::resolve_batch(&mut cx);
    let episodes = episodes::plan_episodes(&cx);
    layout::validate_layouts(&mut cx);
    let placed = placement::place(&mut cx);
    let Stages { mut stages, mut memory, rollouts, train_facts, teacher_stage_s, mut occupied } =
        plan_stages(&mut cx, &placed, batch.as_ref());

    let mut syncs = sync::plan_syncs(&mut cx, &placed, &train_facts, &rollouts);
    // A diffusion recipe: its one embedded process, step and (copy-free) weight syncs.
    let diffusion = input.placement.diffusion.as_ref().and_then(|d| {
        let planned = diffusion::plan_diffusion(&mut cx, d, &mut memory)?;
        label_diffusion_stages(d, &mut stages);
        Some(planned)
    });
    let mut colocation = colocate::plan_colocation(&cx, &memory);
    let mut step =
        step::plan_step(&cx, batch.as_ref(), &train_facts, teacher_stage_s, &rollouts, &syncs, colocation.as_ref());
    let diffusion = diffusion.map(|d| {
        if syncs.is_empty() {
            syncs = d.syncs;
        }
        step = step.take().or(Some(d.step));
        d.report
    });
    if let (Some(c), Some(st)) = (colocation.as_mut(), step.as_ref()) {
        c.share_of_step = Some(crate::model::div(c.switch.seconds, st.step.seconds));
    }
    let buffer = step::plan_buffer(&cx, batch.as_ref());
    let seq_len = input.stages.iter().filter(|s| s.role == Role::Train).find_map(|s| s.trainer.as_ref());
    let lengths = lengths::plan_lengths(&cx).map(|l| l.report(seq_len.map(|t| t.seq_len.value)));
    // An eval stage on the rollout's engines occupies what they do.
    for (i, st) in input.stages.iter().enumerate() {
        if st.role == Role::Eval && st.gpus.is_none() {
            if let Some(r) = input.stages.iter().position(|s| s.role == Role::Rollout) {
                occupied[i].ranges = occupied[r].ranges.clone();
            }
        }
    }
    let gpu_map = placement::gpu_map(&cx, &occupied);
    let by_role = gpus_by_role(input, &gpu_map);
    // GPUs no stage occupies; under colocation a GPU no engine fits on still trains, and the
    // map shows it as the trainer's alone.
    let idle_gpus = gpu_map.iter().filter(|s| s.stages.is_empty()).map(|s| s.last - s.first + 1).sum::<u64>();
    let errors = cx.errors();
    let diagnostics = std::mem::take(&mut cx.diags);
    let warnings = diagnostics.iter().filter(|d| d.severity == miles_grammar::diag::Severity::Warning).count();
    Plan {
        format_version: FORMAT_VERSION,
        recipe: input.recipe.clone(),
        cluster: cluster_summary(&cx, nodes),
        placement: input.placement.mode.value,
        summary: Summary {
            stages: input.stages.len() + input.syncs.len(),
            gpus: cx.total_gpus,
            by_role,
            idle_gpus,
            errors,
            warnings,
            notes: 0,
        },
        stages,
        gpu_map,
        memory,
        rollouts,
        syncs,
        step,
        batch,
        episodes,
        lengths,
        buffer,
        colocation,
        diffusion,
        device,
        models: input.models.clone(),
        graph: input.graph.clone(),
        diagnostics,
    }
}

/// The cluster's pools, numbered GPU by GPU and node by node (E0404 for a GPU kind with no GPUs
/// per node). Returns the pools, the GPUs and the nodes in all, and those diagnostics.
fn number_pools(input: &PlanInput) -> (Vec<Pool<'_>>, u64, u64, Vec<Diagnostic>) {
    let mut pools = Vec::with_capacity(input.cluster.pools.len());
    let (mut gpu, mut node) = (0u64, 0u64);
    let mut early = Vec::new();
    for p in &input.cluster.pools {
        if p.gpu.gpus_per_node == 0 {
            let mut d = Diagnostic::error(ErrorCode::E0404, format!("GPU kind {} has 0 GPUs per node", p.gpu.name));
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
    (pools, gpu, node, early)
}

/// What the stages' own steps produce, in stage order.
struct Stages {
    stages: Vec<StagePlan>,
    memory: Vec<MemoryReport>,
    rollouts: Vec<RolloutReport>,
    train_facts: Vec<TrainFacts>,
    /// An OPD teacher on GPUs of its own: its seconds per optimizer step.
    teacher_stage_s: f64,
    /// What the GPU map draws: an engine stage occupies only the GPUs its engines span.
    occupied: Vec<Placed>,
}

/// Each stage's line, and its trainer, engine or teacher planned where it was placed.
fn plan_stages(cx: &mut Ctx, placed: &[Placed], batch: Option<&BatchReport>) -> Stages {
    let input = cx.input;
    let mut out = Stages {
        stages: Vec::with_capacity(input.stages.len()),
        memory: Vec::new(),
        rollouts: Vec::new(),
        train_facts: Vec::new(),
        teacher_stage_s: 0.0,
        occupied: placed.to_vec(),
    };
    for (i, st) in input.stages.iter().enumerate() {
        let pl = &placed[i];
        let errors_before = cx.errors();
        let mut layout = String::new();
        if let Some(t) = &st.trainer {
            layout = plan_trainer_stage(cx, st, t, pl, batch, &mut out);
        }
        if let Some(e) = &st.engine {
            layout = plan_engine_stage(cx, i, st, e, pl, batch, &mut out);
        }
        if let (Some(job), Where::Own) = (&st.teacher, pl.placed) {
            layout = format!("teacher TP{}", pl.gpus());
            if !pl.error {
                out.teacher_stage_s += teacher::plan_teacher(cx, st, job, pl, batch, &mut out.memory).unwrap_or(0.0);
            }
        }
        let has_error = pl.error || cx.errors() > errors_before;
        out.stages.push(stage_line(st, pl, has_error, layout));
    }
    out
}

/// A trainer stage: its layout as the stage line shows it, and its memory and step.
fn plan_trainer_stage(
    cx: &mut Ctx,
    st: &Stage,
    t: &Trainer,
    pl: &Placed,
    batch: Option<&BatchReport>,
    out: &mut Stages,
) -> String {
    let gpus = pl.trainer_gpus();
    let dp = t.dp.map(|d| d.value).unwrap_or_else(|| gpus / trainer_unit(t).max(1));
    let layout = if t.backend.value == Backend::Embedded {
        match &t.data_parallel {
            Some(d) => format!("embedded trainer x {} ranks (zero = {})", d.ranks.value, d.zero.value.as_str()),
            None => "embedded trainer".to_string(),
        }
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
        if let Some(f) = trainer::plan_trainer(cx, st, t, pl, dp, batch, &mut out.memory) {
            out.train_facts.push(f);
        }
    }
    layout
}

/// An engine stage: its engines as the stage line shows them (with the GPUs no whole engine fits
/// on), the GPUs they occupy, and its memory and rollout.
fn plan_engine_stage(
    cx: &mut Ctx,
    i: usize,
    st: &Stage,
    e: &Engine,
    pl: &Placed,
    batch: Option<&BatchReport>,
    out: &mut Stages,
) -> String {
    let gpus = pl.gpus();
    let engines = e.engines.map(|n| n.value).unwrap_or_else(|| gpus / e.tp.value.max(1));
    let mut layout = if pl.placed == Where::Host {
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
    // GPUs no whole engine fits on (TP not dividing them) stay idle during rollout.
    let unused = if pl.placed == Where::Host { 0 } else { gpus.saturating_sub(engines.saturating_mul(e.tp.value)) };
    if unused > 0 && e.tp.value > 0 && engines > 0 && !pl.error {
        layout.push_str(&format!(" ({unused} GPU{} unused)", if unused == 1 { "" } else { "s" }));
        out.occupied[i].ranges = placement::first_gpus(&pl.ranges, engines.saturating_mul(e.tp.value));
    }
    if !pl.error && pl.placed != Where::Shared {
        if let Some(r) = rollout::plan_engine(cx, st, e, pl, engines, batch, &mut out.memory) {
            out.rollouts.push(r);
        }
    }
    layout
}

/// A stage's line: its symbol, where it runs and its layout.
fn stage_line(st: &Stage, pl: &Placed, has_error: bool, layout: String) -> StagePlan {
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
    StagePlan {
        name: st.name.clone(),
        kind: st.kind.clone(),
        role: st.role,
        symbol: symbol.to_string(),
        placed: pl.placed,
        gpus: if pl.placed == Where::Host { 0 } else { pl.gpus() },
        ranges: pl.ranges.clone(),
        shares_with: pl.shares_with.clone(),
        model: st.model.as_ref().map(|m| m.name.clone()),
        precision,
        layout,
    }
}

/// GPUs per set of roles, from the map, so colocated GPUs are counted once.
fn gpus_by_role(input: &PlanInput, gpu_map: &[GpuSlice]) -> Vec<RoleGpus> {
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
    by_role
}

fn cluster_summary(cx: &Ctx, nodes: u64) -> ClusterSummary {
    let input = cx.input;
    ClusterSummary {
        name: input.cluster.name.clone(),
        gpus: cx.total_gpus,
        nodes,
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
    }
}

/// A diffusion recipe's stage lines: the denoiser they run and where in the one process.
fn label_diffusion_stages(d: &Diffusion, stages: &mut [StagePlan]) {
    let model = d.model.name();
    let streamed = d.reward.as_ref().is_some_and(|r| r.streaming);
    for s in stages.iter_mut() {
        let layout = if d.pretrain.as_ref().is_some_and(|p| p.stage == s.name) {
            "embedded trainer, once before RL".to_string()
        } else if d.rollout.stage == s.name {
            "embedded sampler (the trainer's process)".to_string()
        } else if d.reward.as_ref().is_some_and(|r| r.stage == s.name) {
            let on =
                if d.reward.as_ref().is_some_and(|r| r.process) { "reward worker process" } else { "reward thread" };
            format!("{on}, {}", if streamed { "streamed" } else { "after the batch" })
        } else if d.train.as_ref().is_some_and(|t| t.stage == s.name) {
            "embedded trainer".to_string()
        } else if let Some(e) = d.eval.as_ref().filter(|e| e.stage == s.name) {
            format!("every {} steps", e.every)
        } else {
            continue;
        };
        if s.role != Role::Reward {
            s.model = Some(model.clone());
        }
        s.layout = layout;
    }
}

fn backend_name(b: Backend) -> &'static str {
    match b {
        Backend::Megatron => "megatron",
        Backend::Fsdp => "fsdp",
        Backend::Embedded => "embedded",
    }
}
