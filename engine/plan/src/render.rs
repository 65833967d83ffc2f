//! Text and JSON forms of a plan. The text reads like `terraform plan`: one line per stage with a
//! symbol, then memory, the GPU map, weight sync, time, batch arithmetic, diagnostics and a
//! summary line.

mod evidence;
pub(crate) use evidence::groups as evidence_groups;
mod memory;
pub(crate) mod models;

use crate::input::{PlacementMode, Role, ScheduleMode};
use crate::output::*;
use crate::plan::throttle;
use crate::units::{count, gb, gb_fixed, secs, secs_fine};
use miles_grammar::diag::Severity;
use std::fmt::Write;

pub(crate) fn ranges(rs: &[GpuRange]) -> String {
    rs.iter()
        .map(|r| if r.first == r.last { r.first.to_string() } else { format!("{}-{}", r.first, r.last) })
        .collect::<Vec<_>>()
        .join(", ")
}

pub(crate) fn role_counts(p: &Plan) -> String {
    let mut parts: Vec<String> = p
        .summary
        .by_role
        .iter()
        .map(|r| format!("{} {}", r.gpus, r.roles.iter().map(|x| x.as_str()).collect::<Vec<_>>().join("+")))
        .collect();
    if p.summary.idle_gpus > 0 {
        parts.push(format!("{} idle", p.summary.idle_gpus));
    }
    if parts.is_empty() {
        match resolved_gpu(p) {
            Some(gpu) => format!("host only, computing on {gpu}"),
            None => "host only".into(),
        }
    } else {
        parts.join(", ")
    }
}

pub(crate) fn cluster_line(p: &Plan) -> String {
    let c = &p.cluster;
    if c.pools.is_empty() {
        return format!("{} (CPU only{})", c.name, c.host.as_ref().map(|h| format!(", {h}")).unwrap_or_default());
    }
    // Pools of the same GPU kind print once (a cluster listed node by node stays one line).
    let mut kinds: Vec<(&str, u64, u64)> = Vec::new();
    for q in &c.pools {
        match kinds.iter_mut().find(|k| k.0 == q.gpu) {
            Some(k) => k.1 += q.nodes * q.gpus_per_node,
            None => kinds.push((q.gpu.as_str(), q.nodes * q.gpus_per_node, q.hbm)),
        }
    }
    let pools: Vec<String> = kinds.iter().map(|(g, n, hbm)| format!("{n} x {g}, {} HBM each", gb(*hbm))).collect();
    format!("{} ({}; {} node{})", c.name, pools.join(" + "), c.nodes, if c.nodes == 1 { "" } else { "s" })
}

pub fn summary_line(p: &Plan) -> String {
    let s = &p.summary;
    format!(
        "Plan: {} stages on {} GPUs ({}); {} error{}, {} warning{}{}.",
        s.stages,
        s.gpus,
        role_counts(p),
        s.errors,
        if s.errors == 1 { "" } else { "s" },
        s.warnings,
        if s.warnings == 1 { "" } else { "s" },
        match s.notes {
            0 => String::new(),
            1 => ", 1 note".into(),
            n => format!(", {n} notes"),
        }
    )
}

/// The host, and the GPU its embedded process computes on where a `local` cluster's `device`
/// resolved to one.
pub(crate) fn host_words(p: &Plan) -> String {
    match resolved_gpu(p) {
        Some(gpu) => format!("host ({gpu})"),
        None => "host".into(),
    }
}

fn resolved_gpu(p: &Plan) -> Option<&str> {
    p.device.as_ref().and_then(|d| d.resolved.as_deref()).filter(|r| r.starts_with("cuda"))
}

/// Where a stage runs, in words.
fn place_words(p: &Plan, s: &StagePlan) -> String {
    match s.placed {
        Where::Host => host_words(p),
        _ if s.ranges.is_empty() => "-".into(),
        _ => {
            let first = s.ranges.first().map_or(0, |r| r.first);
            let last = s.ranges.last().map_or(0, |r| r.last);
            let node = |g: u64| {
                p.gpu_map
                    .iter()
                    .find(|sl| sl.first <= g && g <= sl.last)
                    .map(|sl| {
                        sl.first_node + (g - sl.first) * (sl.last_node - sl.first_node + 1) / (sl.last - sl.first + 1)
                    })
                    .unwrap_or(0)
            };
            let (n0, n1) = (node(first), node(last));
            format!("GPUs {} ({})", ranges(&s.ranges), node_range(n0, n1))
        }
    }
}

/// The whole plan as text: [`render_sections`], the findings, and the summary line.
pub fn render_text(p: &Plan) -> String {
    let mut o = render_sections(p);
    o.push_str(&render_diagnostics(p));
    let _ = writeln!(o, "\n{}", summary_line(p));
    o
}

/// Everything but the findings and the summary line (a caller with the sources at hand renders
/// the findings with their source lines).
pub fn render_sections(p: &Plan) -> String {
    let mut o = String::new();
    header(&mut o, p);
    stage_lines(&mut o, p);
    models::models_text(&mut o, p);
    memory::memory_section(&mut o, p);
    rollout_section(&mut o, p);
    gpu_map_section(&mut o, p);
    sync_section(&mut o, p);
    colocation_section(&mut o, p);
    if let Some(d) = &p.diffusion {
        diffusion_text(&mut o, d, p.step.as_ref());
    } else if let Some(st) = &p.step {
        step_section(&mut o, p, st);
    }
    batch_section(&mut o, p);
    episodes_section(&mut o, p);
    evidence::evidence_section(&mut o, p);
    o
}

/// The header: recipe and cluster, placement, and the device a `local` cluster resolved to.
fn header(o: &mut String, p: &Plan) {
    let _ = writeln!(o, "miles plan: {} on {}", p.recipe, cluster_line(p));
    let _ = writeln!(
        o,
        "placement: {}",
        if p.placement == PlacementMode::Colocated { "colocated" } else { "disaggregated" }
    );
    if let Some(d) = &p.device {
        let _ = writeln!(o, "device: {} ({})", d.resolved.as_deref().unwrap_or("unresolved"), d.why);
        for g in &d.gpus {
            let _ = writeln!(o, "  gpu {g}");
        }
    }
    let _ = writeln!(o);
}

/// One line per stage and weight sync, terraform-style, and the schedule's.
fn stage_lines(o: &mut String, p: &Plan) {
    let w_name =
        p.stages.iter().map(|s| s.name.len()).chain(p.syncs.iter().map(|s| s.name.len())).max().unwrap_or(4).max(8);
    for s in &p.stages {
        let what = [Some(s.kind.as_str()), s.model.as_deref(), s.precision.as_deref()]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join(" ");
        let mut line = format!("  {} {:w_name$}  {:34}  {:26}", s.symbol, s.name, what, place_words(p, s));
        if !s.layout.is_empty() {
            line.push_str("  ");
            line.push_str(&s.layout);
        }
        if !s.shares_with.is_empty() {
            let _ = write!(line, "  (shares with {})", s.shares_with.join(", "));
        }
        let _ = writeln!(o, "{}", line.trim_end());
    }
    for s in &p.syncs {
        let alts: Vec<String> =
            s.alternatives.iter().map(|a| format!("{} {}", a.transport.as_str(), secs(a.seconds))).collect();
        let _ = writeln!(
            o,
            "  ~ {:w_name$}  weights {} -> {}, {}, {} buckets  est. {} per update{} {}",
            s.name,
            s.from,
            s.to,
            s.how(),
            gb(s.bucket),
            secs(s.estimate.seconds),
            if alts.is_empty() { String::new() } else { format!(" ({})", alts.join(", ")) },
            s.estimate.evidence.tag()
        );
    }
    if let Some(st) = &p.step {
        let _ = writeln!(
            o,
            "  = {:w_name$}  {}{}",
            "schedule",
            st.mode.as_str(),
            p.buffer.as_ref().and_then(|b| b.max_staleness).map(|s| format!(", max staleness {s}")).unwrap_or_default()
        );
    }
}

/// Each rollout stage's engines, KV cache and throughput.
fn rollout_section(o: &mut String, p: &Plan) {
    if !p.rollouts.is_empty() {
        let _ = writeln!(o, "\nRollout");
        for r in &p.rollouts {
            let _ = writeln!(
                o,
                "  {}: {} engine(s) x {} GPUs; KV cache {} tokens per engine = {} sequences{}",
                r.stage,
                r.engines,
                r.gpus_per_engine,
                count(r.kv_tokens_per_engine),
                r.sequences_per_engine,
                r.requested_concurrent.map(|c| format!(" (asked {c})")).unwrap_or_default()
            );
            let _ = writeln!(
                o,
                "    est. {} tokens/s at {} concurrent per engine {}",
                count(r.tokens_per_s.per_s as u64),
                r.decode_batch,
                r.tokens_per_s.evidence.tag()
            );
            if let Some(t) = &r.rollout_time {
                let _ = writeln!(o, "    est. {} per rollout batch {}", secs(t.seconds), t.evidence.tag());
            }
            if let Some(t) = &r.throttle {
                let _ = writeln!(o, "    the step waits for it, held back by {}", throttle::limit_line(t));
                if let Some(f) = &t.fix {
                    let _ = writeln!(o, "    fix: {}", throttle::fix_line(f));
                    if let Some(c) = &f.cost {
                        let _ = writeln!(o, "      {c}");
                    }
                }
            }
        }
    }
}

/// "node 3" for one node, "nodes 0-7" for several: the text plan's and the HTML map's wording.
pub(crate) fn node_range(first: u64, last: u64) -> String {
    if first == last {
        format!("node {first}")
    } else {
        format!("nodes {first}-{last}")
    }
}

/// "GPU 3" or "GPUs 0-7", likewise.
pub(crate) fn gpu_range(first: u64, last: u64) -> String {
    if first == last {
        format!("GPU {first}")
    } else {
        format!("GPUs {first}-{last}")
    }
}

/// Which stages occupy which GPUs and nodes.
fn gpu_map_section(o: &mut String, p: &Plan) {
    if !p.gpu_map.is_empty() {
        let _ = writeln!(o, "\nGPU map");
        for s in &p.gpu_map {
            let gpus = gpu_range(s.first, s.last);
            let nodes = node_range(s.first_node, s.last_node);
            let who = if s.stages.is_empty() { "(idle)".to_string() } else { s.stages.join(" + ") };
            let _ = writeln!(o, "  {:16} {:14} {}", gpus, nodes, who);
        }
    }
}

/// Each weight sync's bytes, transport, estimate and assumptions.
fn sync_section(o: &mut String, p: &Plan) {
    if !p.syncs.is_empty() {
        let _ = writeln!(o, "\nWeight sync");
        for s in &p.syncs {
            let _ = writeln!(
                o,
                "  {}: {} of {} {} -> {} by {}: est. {} {}",
                s.name,
                gb(s.bytes),
                if s.lora { "adapters" } else { "weights" },
                s.from,
                s.to,
                s.how(),
                secs(s.estimate.seconds),
                s.estimate.evidence.tag()
            );
            for a in &s.estimate.assumptions {
                let _ = writeln!(o, "    - {a}");
            }
        }
    }
}

/// Colocated placement: both actors resident, or the idle one evicted each step.
fn colocation_section(o: &mut String, p: &Plan) {
    if let Some(c) = &p.colocation {
        let _ = writeln!(o, "\nColocated placement");
        let _ = writeln!(
            o,
            "  both resident: {} per GPU of {} usable: {}",
            gb_fixed(c.resident_bytes as f64),
            gb_fixed(c.usable_bytes as f64),
            if c.fits_resident { "fits, no eviction" } else { "does not fit, the idle actor is evicted" }
        );
        let _ = writeln!(
            o,
            "  {}: {} per GPU, offload {} + reload {}{}",
            if c.fits_resident { "eviction (not needed)" } else { "eviction per step" },
            gb_fixed(c.offload_bytes as f64),
            secs(c.offload_s),
            secs(c.reload_s),
            c.share_of_step.map_or(String::new(), |s| format!(" = {:.1}% of the step", s * 100.0))
        );
        for a in &c.switch.assumptions {
            let _ = writeln!(o, "    - {a}");
        }
    }
}

/// The time per step, phase by phase (a language-model recipe's; `diffusion_text` has a
/// diffusion recipe's).
fn step_section(o: &mut String, p: &Plan, st: &StepReport) {
    let _ = writeln!(o, "\nTime per step (estimates)");
    match st.dynamic_rounds {
        Some(n) => {
            let _ = writeln!(
                o,
                "  rollout   {:>8}  (one round; dynamic sampling: up to {n} rounds, {})",
                secs(st.rollout_s),
                secs(st.rollout_s * n as f64)
            );
        }
        None => {
            let _ = writeln!(o, "  rollout   {:>8}", secs(st.rollout_s));
        }
    }
    if st.teacher_stage_s > 0.0 {
        let _ = writeln!(
            o,
            "  teacher   {:>8}  (the teacher stage on its own GPUs: a no-grad forward over the batch)",
            secs(st.teacher_stage_s)
        );
    }
    let _ = writeln!(o, "  train     {:>8}  ({} per optimizer step)", secs(st.train_s), secs(st.train_step.seconds));
    if st.critic_s > 0.0 {
        let _ = writeln!(o, "    critic  {:>8}  (in train: values + value loss of the PPO critic)", secs(st.critic_s));
    }
    if let Some(d) = &st.data_parallel {
        let _ = writeln!(
            o,
            "    dp      {:>8}  (in train: collectives of {} ranks, zero = {}: {} per optimizer step; the busiest rank trains {} of {} micro-batch{})",
            secs_fine(d.collective_s),
            d.ranks,
            d.zero,
            secs_fine(d.collective.seconds),
            d.micro_batches_per_rank,
            d.micro_batches,
            if d.micro_batches == 1 { "" } else { "es" }
        );
    }
    if st.teacher_s > 0.0 {
        let _ = writeln!(
            o,
            "    teacher {:>8}  (of train: the teacher stage's no-grad forward, before the trainer's passes)",
            secs(st.teacher_s)
        );
    }
    if st.offload_s > 0.0 {
        let _ = writeln!(o, "  offload   {:>8}", secs(st.offload_s));
    }
    if st.switch_s > 0.0 {
        let _ = writeln!(o, "  evict     {:>8}  (colocated: offload + reload of the idle actor)", secs(st.switch_s));
    }
    let _ = writeln!(o, "  sync      {:>8}", secs(st.sync_s));
    let _ = writeln!(
        o,
        "  step      {:>8}  {}{} {}",
        secs(st.step.seconds),
        st.mode.as_str(),
        if st.mode == ScheduleMode::Sync {
            format!(" (overlapped: {})", secs(st.async_step_s))
        } else {
            format!(" (synchronous: {})", secs(st.sync_step_s))
        },
        st.step.evidence.tag()
    );
    if let Some(l) = &p.lengths {
        let _ = writeln!(o, "  lengths   {}", lengths_line(l));
    }
}

/// The batch arithmetic and the buffer.
fn batch_section(o: &mut String, p: &Plan) {
    if let Some(b) = &p.batch {
        let _ = writeln!(o, "\nBatch");
        let _ = writeln!(
            o,
            "  {} prompts x {} samples = {} samples = global batch {} x {} step{} per rollout{}{}",
            b.rollout_batch,
            b.samples_per_prompt,
            b.samples_per_rollout,
            b.global_batch,
            b.steps_per_rollout,
            if b.steps_per_rollout == 1 { "" } else { "s" },
            if b.epochs > 1 {
                format!(", {} epochs: {} optimizer steps", b.epochs, b.epochs * b.steps_per_rollout)
            } else {
                String::new()
            },
            b.derived.as_ref().map(|d| format!(" ({d} derived)")).unwrap_or_default()
        );
        if let Some(t) = b.tokens_per_step {
            let _ = writeln!(o, "  {} tokens per optimizer step", count(t));
        }
    }
    if let Some(b) = &p.buffer {
        let _ = writeln!(
            o,
            "  buffer: up to {} groups = {} trajectories x {} tokens = {} host memory{}",
            b.capacity_groups,
            b.trajectories,
            count(b.tokens_per_trajectory),
            gb(b.bytes),
            match (b.r3_bytes_per_trajectory, b.r3_bytes_per_token) {
                (Some(r), Some(t)) => format!(" (R3 {} per trajectory, {t} B per token)", small_bytes(r)),
                (Some(r), None) => format!(" (R3 {} per trajectory)", small_bytes(r)),
                _ => " (R3 off)".into(),
            }
        );
    }
}

/// Multi-turn episodes: their lengths and prefill.
fn episodes_section(o: &mut String, p: &Plan) {
    if let Some(e) = &p.episodes {
        let _ = writeln!(o, "\nEpisodes ({} environment)", e.env);
        // The turns that fit the context, as the lengths line prices them; max_turns beside.
        let turns = match e.max_context.filter(|_| e.turns < e.max_turns && e.compactions == 0) {
            Some(c) => format!(
                "{} turn{} (max_turns {}; a {} does not fit the model's {c}-token context)",
                e.turns,
                if e.turns == 1 { "" } else { "s" },
                e.max_turns,
                ordinal(e.turns + 1)
            ),
            None => format!("{} turn{}", e.turns, if e.turns == 1 { "" } else { "s" }),
        };
        let source = if e.observation_stated {
            " (observation_tokens)"
        } else if e.observation_assumed {
            " (assumed: env_reward's observation_tokens states it)"
        } else {
            ""
        };
        let _ = writeln!(
            o,
            "  up to {turns} x {} sampled tokens, {} observation tokens between turns{source}: up to {} tokens per episode",
            count(e.turn_tokens),
            count(e.observation_tokens),
            count(e.tokens_per_episode)
        );
        // What the model reads first (env_reward's prompt), bounded as sent by max_prompt_tokens.
        let first = match e.prompt.as_str() {
            "replace" => "a chat row's messages with the reset observation as their user message",
            "observation_only" => "the reset observation alone",
            _ => "a chat row's messages, then the reset observation",
        };
        let _ = writeln!(
            o,
            "  first prompt: {first} (env_reward's prompt = {}), at most {} tokens as sent (max_prompt_tokens)",
            e.prompt,
            count(e.prompt_tokens)
        );
        let _ = writeln!(
            o,
            "  prefill per episode: {} tokens with TITO (the prefix cache holds), {} re-tokenising each turn",
            count(e.prefill_tito),
            count(e.prefill_retokenize)
        );
        if e.compactions > 0 {
            let _ = writeln!(
                o,
                "  the context fills: {} compaction(s) per episode, each a new TITO chain prefilled whole",
                e.compactions
            );
        }
        let _ = writeln!(
            o,
            "  solved: an episode whose reward is >= {} (env_reward's solved_at): eval/accuracy, rollout/solved_frac",
            reward_figure(e.solved_at)
        );
    }
}

/// A reward threshold as a user wrote it: 1, 0.5, 0.25.
fn reward_figure(x: f64) -> String {
    let t = format!("{x:.4}");
    t.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// "second", "third"... for the turn that does not fit (a number past the tenth).
fn ordinal(n: u64) -> String {
    const WORDS: [&str; 9] = ["second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth", "tenth"];
    match n {
        2..=10 => WORDS[(n - 2) as usize].to_string(),
        _ => format!("turn {n}"),
    }
}

/// A diffusion recipe's time per phase, one-off costs and batch arithmetic (docs/plan.md,
/// "Diffusion RL").
fn diffusion_text(o: &mut String, d: &DiffusionReport, st: Option<&StepReport>) {
    let b = &d.batch;
    let n = b.micro_groups_per_step;
    let _ = writeln!(o, "\nTime per step (estimates; diffusion RL, one libtorch thread)");
    let _ = writeln!(
        o,
        "  denoise   {:>8}  {} micro-group{} x {}: {} steps x {} images x {} row{}",
        secs(d.denoise.seconds),
        n,
        if n == 1 { "" } else { "s" },
        secs(d.denoise_micro_group_s),
        b.denoising_steps,
        b.micro_group,
        b.forwards_per_step,
        if b.forwards_per_step == 1 { "" } else { "s (classifier-free guidance)" }
    );
    if let Some(r) = &d.reward {
        let _ = writeln!(
            o,
            "  reward    {:>8}  {} micro-group{} x {} ({})",
            secs(r.seconds),
            n,
            if n == 1 { "" } else { "s" },
            secs(d.reward_micro_group_s),
            if d.reward_process { "reward worker process" } else { "reward thread" }
        );
    }
    let (used, other) = if d.streaming { ("streamed", "whole batch") } else { ("whole batch", "streamed") };
    let _ = writeln!(o, "  rollout   {:>8}  {used}", secs(d.step.rollout_s));
    let _ =
        writeln!(o, "    whole batch {:>8}  n d + n r: every micro-group scored after the last", secs(d.whole_batch_s));
    let _ = writeln!(
        o,
        "    streamed    {:>8}  d + (n - 1) max(d, r) + r: k scored while k + 1 denoises",
        secs(d.streamed_s)
    );
    let _ = writeln!(
        o,
        "    reward wait {:>8}  after denoising ends ({other}: {})",
        secs(d.step.reward_wait_s),
        secs(if d.streaming { d.whole_batch_s } else { d.streamed_s } - d.denoise.seconds)
    );
    if d.train.is_some() {
        let _ = writeln!(
            o,
            "  train     {:>8}  {} micro-groups x {} trained steps: forward + backward, AdamW",
            secs(d.step.train_s),
            n,
            b.trained_steps
        );
    }
    if let Some(st) = st {
        let _ = writeln!(o, "  sync      {:>8}  (the sampler reads the trained denoiser)", secs(st.sync_s));
    }
    let _ = writeln!(o, "  step      {:>8}  rollout + train, synchronous", secs(d.step.step_s));
    if let (Some(e), Some(every)) = (&d.eval, d.eval_every) {
        let _ = writeln!(
            o,
            "  eval      {:>8}  per evaluation, every {every} steps and at step 0 (not in the step)",
            secs(e.seconds)
        );
    }
    if d.one_off_s > 0.0 {
        let _ = writeln!(o, "  once      {:>8}  before the first RL step (not in the step)", secs(d.one_off_s));
        if let Some(e) = &d.pretrain {
            let _ = writeln!(
                o,
                "    pretrain    {:>8}  {}",
                secs(e.seconds),
                e.assumptions.first().map_or("", |s| s.as_str())
            );
        }
        if let Some(e) = &d.classifiers {
            let _ = writeln!(
                o,
                "    classifiers {:>8}  {}",
                secs(e.seconds),
                e.assumptions.first().map_or("", |s| s.as_str())
            );
        }
    }
    let _ = writeln!(o, "\nBatch");
    let _ = writeln!(
        o,
        "  {} conditions x {} samples = {} images per step = {} micro-group{} of {}; {} denoising steps, {} trained per image",
        b.conditions_per_step,
        b.samples_per_condition,
        b.images_per_step,
        n,
        if n == 1 { "" } else { "s" },
        b.micro_group,
        b.denoising_steps,
        b.trained_steps
    );
    let _ = writeln!(o, "  trajectories: {} host memory per step", gb(b.trajectory_bytes));
    let _ = writeln!(o, "\nAssumptions");
    let sections = [
        ("denoise", Some(&d.denoise)),
        ("reward", d.reward.as_ref()),
        ("train", d.train.as_ref()),
        ("eval", d.eval.as_ref()),
    ];
    for (name, e) in sections {
        if let Some(e) = e {
            for a in &e.assumptions {
                let _ = writeln!(o, "  - {name}: {a}");
            }
        }
    }
    if let Some(st) = st {
        for a in &st.step.assumptions {
            let _ = writeln!(o, "  - step: {a}");
        }
    }
    for (name, e) in [("pretrain", d.pretrain.as_ref()), ("classifiers", d.classifiers.as_ref())] {
        if let Some(e) = e {
            for a in e.assumptions.iter().skip(1) {
                let _ = writeln!(o, "  - {name}: {a}");
            }
        }
    }
}

/// The lengths the step's time is priced at: the recipe's means (a planning assumption, time
/// only) or the bounds, which memory is always sized for.
fn lengths_line(l: &LengthReport) -> String {
    let fig = |x: f64| if x.fract() == 0.0 { format!("{x:.0}") } else { format!("{x:.1}") };
    let one = |name: &str, v: f64, max: f64, stated: bool, unit: &str, field: &str| {
        if stated {
            format!("{name} {} of {}{unit} ({field})", fig(v), fig(max))
        } else {
            format!("{name} {}{unit}", fig(max))
        }
    };
    // A bound the model's context cut names the recipe's figure and the cut.
    let cut = |part: String, field: &str, asked: Option<u64>, now: f64| match (asked, &l.capped) {
        (Some(a), Some(c)) if (a as f64) > now => {
            format!("{part} ({field} {a}, capped by the model's max_len {})", c.max_len)
        }
        _ => part,
    };
    let mut parts = vec![
        cut(
            one("prompt", l.prompt_tokens, l.max_prompt_tokens, l.prompt_stated, " tokens", "mean_prompt_tokens"),
            "max_prompt_tokens",
            l.capped.as_ref().map(|c| c.max_prompt_tokens),
            l.max_prompt_tokens,
        ),
        cut(
            one(
                if l.turns.is_some() { "response per turn" } else { "response" },
                l.response_tokens,
                l.max_response_tokens,
                l.response_stated,
                " tokens",
                "mean_response_tokens",
            ),
            "max_new_tokens",
            l.capped.as_ref().map(|c| c.max_new_tokens),
            l.max_response_tokens,
        ),
    ];
    if let (Some(t), Some(max)) = (l.turns, l.max_turns) {
        parts.push(one("turns", t, max, l.turns_stated, "", "mean_turns"));
    }
    let stated = l.prompt_stated || l.response_stated || l.turns_stated;
    let fields = if l.turns.is_some() {
        "generate's mean_response_tokens, mean_prompt_tokens, env_reward's mean_turns"
    } else {
        "generate's mean_response_tokens, mean_prompt_tokens"
    };
    if stated {
        format!("{}: time at the recipe's expected lengths, memory at the bounds", parts.join(", "))
    } else {
        format!("{}: upper bounds (a recipe may state expected ones: {fields})", parts.join(", "))
    }
}

/// Bytes as `gb` writes them, with kB below 0.1 MB (a small model's R3 data per trajectory).
fn small_bytes(bytes: u64) -> String {
    if bytes < 100_000 {
        format!("{:.1} kB", bytes as f64 / 1e3)
    } else {
        gb(bytes)
    }
}

/// The plan's findings as brief text lines (`error[E0401]: ...` and help).
pub fn render_diagnostics(p: &Plan) -> String {
    let mut o = String::new();
    if !p.diagnostics.is_empty() {
        let _ = writeln!(o);
        for d in &p.diagnostics {
            let sev = match d.severity {
                Severity::Error => "error",
                Severity::Warning => "warning",
                Severity::Note => "note",
            };
            let _ = writeln!(o, "{sev}[{}]: {}", d.code, d.message);
            if let Some(h) = &d.help {
                let _ = writeln!(o, "  = help: {h}");
            }
        }
    }
    o
}

/// The plan as JSON (`format_version` first).
pub fn render_json(p: &Plan) -> String {
    // Serialising plain structs of numbers and strings cannot fail; keep the signature total.
    serde_json::to_string_pretty(p)
        .unwrap_or_else(|e| format!("{{\"format_version\": {FORMAT_VERSION}, \"error\": \"{e}\"}}"))
}

/// The plan as JSON with its `diagnostics` replaced by `located`: the same findings as the
/// CLI's `check --format json` writes them (path, line and column, which only the caller's
/// source map knows), so tools read one shape from both verbs.
pub fn render_json_located(p: &Plan, located: serde_json::Value) -> String {
    let mut v = match serde_json::to_value(p) {
        Ok(v) => v,
        Err(_) => return render_json(p),
    };
    if let Some(o) = v.as_object_mut() {
        o.insert("diagnostics".into(), located);
    }
    serde_json::to_string_pretty(&v).unwrap_or_else(|_| render_json(p))
}

pub(crate) fn role_colour(r: Option<Role>) -> &'static str {
    match r {
        Some(Role::Rollout) => "#3b82f6",
        Some(Role::Train) => "#f97316",
        Some(Role::Sft) => "#eab308",
        Some(Role::Reward) => "#22c55e",
        Some(Role::Eval) => "#a855f7",
        Some(Role::Teacher) => "#0ea5e9",
        Some(Role::Other) => "#64748b",
        None => "#e5e7eb",
    }
}
