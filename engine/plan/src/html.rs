//! One self-contained page: inline CSS and SVG, no script, no external resource. It draws the
//! GPU map (nodes x GPUs coloured by role), the stage graph, and memory bars against HBM.

use crate::input::Role;
use crate::output::*;
use crate::render::{cluster_line, ranges, role_colour, summary_line};
use crate::units::{count, gb, secs, secs_fine};
use miles_grammar::diag::Severity;
use std::fmt::Write;

fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '&' => o.push_str("&amp;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

const CSS: &str = "body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;margin:24px 32px;color:#1f2937;background:#fafafa}\
h1{font-size:20px;margin:0 0 4px}h2{font-size:15px;margin:28px 0 8px;color:#374151;text-transform:uppercase;letter-spacing:.04em}\
.sub{color:#6b7280;margin-bottom:12px}.card{background:#fff;border:1px solid #e5e7eb;border-radius:8px;padding:14px 16px;margin:8px 0}\
table{border-collapse:collapse}td,th{padding:3px 12px 3px 0;text-align:left;vertical-align:top}th{color:#6b7280;font-weight:500}\
td.n{text-align:right;font-variant-numeric:tabular-nums}.sym{font-family:ui-monospace,monospace;font-weight:700}\
.err{color:#b91c1c}.warn{color:#b45309}.ok{color:#15803d}.legend span{display:inline-block;margin-right:14px}\
.sw{display:inline-block;width:12px;height:12px;border-radius:2px;vertical-align:-1px;margin-right:5px}\
.diag{border-left:4px solid #b91c1c;padding:6px 10px;margin:6px 0;background:#fff}.diag.w{border-color:#d97706}.diag.n{border-color:#2563eb}\
.help{color:#4b5563;font-size:13px;margin-top:4px}.summary{font-weight:600;font-size:15px;margin-top:24px}\
code{font-family:ui-monospace,monospace;font-size:12.5px}";

const ROLES: [Role; 7] = [Role::Rollout, Role::Train, Role::Sft, Role::Teacher, Role::Reward, Role::Eval, Role::Other];

pub fn render_html(p: &Plan) -> String {
    let mut o = String::with_capacity(16 * 1024);
    let _ = write!(
        o,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>miles plan: {}</title><style>{CSS}</style></head><body>",
        esc(&p.recipe)
    );
    let _ = write!(o, "<h1>miles plan: {}</h1><div class=\"sub\">on {}</div>", esc(&p.recipe), esc(&cluster_line(p)));
    let cls = if p.summary.errors > 0 {
        "err"
    } else if p.summary.warnings > 0 {
        "warn"
    } else {
        "ok"
    };
    let _ = write!(o, "<div class=\"summary {cls}\">{}</div>", esc(&summary_line(p)));

    stages_table(&mut o, p);
    crate::render::models::models_html(&mut o, p, esc);
    if !p.gpu_map.is_empty() {
        let _ = write!(o, "<h2>GPU map</h2><div class=\"card\">");
        legend(&mut o);
        gpu_grid(&mut o, p);
        let _ = write!(o, "</div>");
    }
    if !p.graph.nodes.is_empty() {
        let _ = write!(o, "<h2>Stage graph</h2><div class=\"card\">");
        stage_graph(&mut o, p);
        let _ = write!(o, "</div>");
    }
    if !p.memory.is_empty() {
        let _ = write!(o, "<h2>Memory per GPU</h2><div class=\"card\">");
        memory_bars(&mut o, p);
        let _ = write!(o, "</div>");
    }
    estimates(&mut o, p);
    evidence(&mut o, p);
    if !p.diagnostics.is_empty() {
        let _ = write!(o, "<h2>Diagnostics</h2>");
        for d in &p.diagnostics {
            let (c, w) = match d.severity {
                Severity::Error => ("error", ""),
                Severity::Warning => ("warning", " w"),
                Severity::Note => ("note", " n"),
            };
            let _ = write!(o, "<div class=\"diag{w}\"><b>{c}[{}]</b>: {}", d.code, esc(&d.message));
            if let Some(h) = &d.help {
                let _ = write!(o, "<div class=\"help\">help: {}</div>", esc(h));
            }
            let _ = write!(o, "</div>");
        }
    }
    let _ = writeln!(o, "</body></html>");
    o
}

fn legend(o: &mut String) {
    let _ = write!(o, "<div class=\"legend\">");
    for r in ROLES {
        let _ =
            write!(o, "<span><i class=\"sw\" style=\"background:{}\"></i>{}</span>", role_colour(Some(r)), r.as_str());
    }
    let _ = write!(o, "<span><i class=\"sw\" style=\"background:{}\"></i>idle</span></div>", role_colour(None));
}

fn stages_table(o: &mut String, p: &Plan) {
    let _ = write!(o, "<h2>Stages</h2><div class=\"card\"><table><tr><th></th><th>stage</th><th>kind</th><th>model</th><th>where</th><th>layout</th></tr>");
    for s in &p.stages {
        let cls = if s.symbol == "!" { " err" } else { "" };
        let place = match s.placed {
            Where::Host => crate::render::host_words(p),
            Where::Shared => format!("GPUs {} (shared with {})", ranges(&s.ranges), s.shares_with.join(", ")),
            Where::Own => format!("GPUs {}", ranges(&s.ranges)),
        };
        let _ = write!(
            o,
            "<tr><td class=\"sym{cls}\">{}</td><td><i class=\"sw\" style=\"background:{}\"></i><b>{}</b></td><td>{}</td><td>{} {}</td><td>{}</td><td>{}</td></tr>",
            esc(&s.symbol),
            role_colour(Some(s.role)),
            esc(&s.name),
            esc(&s.kind),
            esc(s.model.as_deref().unwrap_or("")),
            esc(s.precision.as_deref().unwrap_or("")),
            esc(&place),
            esc(&s.layout)
        );
    }
    for s in &p.syncs {
        let _ = write!(
            o,
            "<tr><td class=\"sym\">~</td><td><b>{}</b></td><td>weights</td><td>{} &rarr; {}</td><td>{}, {} buckets</td><td>est. {} per update</td></tr>",
            esc(&s.name),
            esc(&s.from),
            esc(&s.to),
            s.how(),
            gb(s.bucket),
            secs(s.estimate.seconds)
        );
    }
    let _ = write!(o, "</table></div>");
}

/// Nodes in rows of up to 16, each node a box of its GPUs. Past 256 nodes one cell stands for a
/// node (coloured by its first GPU), and past 4096 for a block of nodes, so the page stays small
/// on any cluster.
fn gpu_grid(o: &mut String, p: &Plan) {
    let nodes = p.cluster.nodes.max(1);
    let gpn_max = p.cluster.pools.iter().map(|q| q.gpus_per_node).max().unwrap_or(1).max(1);
    let role_at = |gpu: u64| -> Option<Role> {
        // gpu_map is sorted; binary search keeps large maps cheap.
        let i = p.gpu_map.partition_point(|s| s.last < gpu);
        p.gpu_map.get(i).filter(|s| s.first <= gpu).and_then(|s| s.role)
    };
    let first_gpu_of_node = |n: u64| -> Option<(u64, u64)> {
        let q = p.cluster.pools.iter().rev().find(|q| q.first_node <= n)?;
        Some((q.first_gpu + (n - q.first_node) * q.gpus_per_node, q.gpus_per_node))
    };
    if nodes <= 256 {
        let cell = 14u64;
        let node_w = gpn_max.min(8) * (cell + 2) + 8;
        // Rows no wider than ~1100 px.
        let per_row = (1100 / (node_w + 6)).clamp(1, 16).min(nodes);
        let rows_per_node = gpn_max.div_ceil(8);
        let node_h = rows_per_node * (cell + 2) + 22;
        let rows = nodes.div_ceil(per_row);
        let (w, h) = (per_row * (node_w + 6) + 4, rows * (node_h + 6) + 4);
        let _ = write!(o, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" role=\"img\" aria-label=\"GPU map\">");
        for n in 0..nodes {
            let (x0, y0) = ((n % per_row) * (node_w + 6) + 2, (n / per_row) * (node_h + 6) + 2);
            let _ = write!(o, "<rect x=\"{x0}\" y=\"{y0}\" width=\"{node_w}\" height=\"{node_h}\" rx=\"4\" fill=\"#fff\" stroke=\"#d1d5db\"/>");
            let _ =
                write!(o, "<text x=\"{}\" y=\"{}\" font-size=\"10\" fill=\"#6b7280\">node {n}</text>", x0 + 4, y0 + 12);
            if let Some((g0, gpn)) = first_gpu_of_node(n) {
                for k in 0..gpn {
                    let g = g0 + k;
                    let (cx, cy) = (x0 + 4 + (k % 8) * (cell + 2), y0 + 17 + (k / 8) * (cell + 2));
                    let _ = write!(o, "<rect x=\"{cx}\" y=\"{cy}\" width=\"{cell}\" height=\"{cell}\" rx=\"2\" fill=\"{}\"><title>GPU {g}</title></rect>", role_colour(role_at(g)));
                }
            }
        }
        let _ = write!(o, "</svg>");
    } else {
        let block = nodes.div_ceil(4096);
        let cells = nodes.div_ceil(block);
        let per_row = 128u64;
        let cell = 6u64;
        let rows = cells.div_ceil(per_row);
        let (w, h) = (per_row * (cell + 1) + 2, rows * (cell + 1) + 2);
        let _ = write!(o, "<div class=\"sub\">one cell = {} node{}</div>", block, if block == 1 { "" } else { "s" });
        let _ = write!(o, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" role=\"img\" aria-label=\"GPU map\">");
        for c in 0..cells {
            let n = c * block;
            let role = first_gpu_of_node(n).and_then(|(g, _)| role_at(g));
            let _ = write!(
                o,
                "<rect x=\"{}\" y=\"{}\" width=\"{cell}\" height=\"{cell}\" fill=\"{}\"/>",
                1 + (c % per_row) * (cell + 1),
                1 + (c / per_row) * (cell + 1),
                role_colour(role)
            );
        }
        let _ = write!(o, "</svg>");
    }
    let _ = write!(o, "<table style=\"margin-top:8px\">");
    for s in p.gpu_map.iter().take(64) {
        let who = if s.stages.is_empty() { "idle".into() } else { s.stages.join(" + ") };
        let _ = write!(
            o,
            "<tr><td><i class=\"sw\" style=\"background:{}\"></i>{}</td><td>{}</td><td>{}</td></tr>",
            role_colour(s.role),
            crate::render::gpu_range(s.first, s.last),
            crate::render::node_range(s.first_node, s.last_node),
            esc(&who)
        );
    }
    let _ = write!(o, "</table>");
}

/// Columns by longest path over the data edges (weight-sync edges point back and are drawn as
/// dashed arcs under the boxes).
fn stage_graph(o: &mut String, p: &Plan) {
    let g = &p.graph;
    let n = g.nodes.len();
    let idx = |id: &str| g.nodes.iter().position(|x| x.id == id);
    let mut col = vec![0usize; n];
    // Bellman-Ford style relaxation, at most n rounds, so a cycle cannot loop forever.
    for _ in 0..n {
        let mut changed = false;
        for e in g.edges.iter() {
            // A weight edge places its target only when nothing feeds that target data (a
            // `sync` node after `train`); otherwise it points back and is drawn as an arc.
            let data_fed = |t: &str| g.edges.iter().any(|x| !x.weights && x.to == t);
            if e.weights && data_fed(&e.to) {
                continue;
            }
            if let (Some(a), Some(b)) = (idx(&e.from), idx(&e.to)) {
                if col[b] < col[a] + 1 && col[a] + 1 < n {
                    col[b] = col[a] + 1;
                    changed = true;
                }
            }
        }
        if !changed {
            break;
        }
    }
    let mut row = vec![0usize; n];
    let mut per_col = vec![0usize; n.max(1)];
    for i in 0..n {
        row[i] = per_col[col[i]];
        per_col[col[i]] += 1;
    }
    let (bw, bh, gx, gy) = (150usize, 46usize, 80usize, 26usize);
    let cols = col.iter().max().map_or(1, |m| m + 1);
    let rows = per_col.iter().max().copied().unwrap_or(1).max(1);
    let (w, h) = (cols * (bw + gx) + 20, rows * (bh + gy) + 70);
    let pos = |i: usize| (10 + col[i] * (bw + gx), 10 + row[i] * (bh + gy));
    let _ = write!(o, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" role=\"img\" aria-label=\"stage graph\">");
    let _ = write!(o, "<defs><marker id=\"a\" viewBox=\"0 0 10 10\" refX=\"10\" refY=\"5\" markerWidth=\"7\" markerHeight=\"7\" orient=\"auto-start-reverse\"><path d=\"M0,0L10,5L0,10z\" fill=\"#6b7280\"/></marker></defs>");
    for e in &g.edges {
        let (Some(a), Some(b)) = (idx(&e.from), idx(&e.to)) else {
            continue;
        };
        let ((ax, ay), (bx, by)) = (pos(a), pos(b));
        let stroke = if e.weights { "stroke=\"#f97316\" stroke-dasharray=\"5 4\"" } else { "stroke=\"#6b7280\"" };
        if col[b] <= col[a] {
            let (x1, x2) = (ax + bw / 2, bx + bw / 2);
            let y = ay.max(by) + bh;
            let dip = h - 22;
            let _ = write!(o, "<path d=\"M{x1},{y} C{x1},{dip} {x2},{dip} {x2},{}\" fill=\"none\" {stroke} stroke-width=\"1.6\" marker-end=\"url(#a)\"/>", by + bh);
            let _ = write!(
                o,
                "<text x=\"{}\" y=\"{}\" font-size=\"11\" fill=\"#c2410c\" text-anchor=\"middle\">{}</text>",
                (x1 + x2) / 2,
                dip - 2,
                esc(if e.label.is_empty() { "weights" } else { &e.label })
            );
        } else {
            let (x1, y1, x2, y2) = (ax + bw, ay + bh / 2, bx, by + bh / 2);
            let mx = (x1 + x2) / 2;
            let _ = write!(o, "<path d=\"M{x1},{y1} C{mx},{y1} {mx},{y2} {x2},{y2}\" fill=\"none\" {stroke} stroke-width=\"1.4\" marker-end=\"url(#a)\"/>");
            if !e.label.is_empty() {
                let _ = write!(
                    o,
                    "<text x=\"{mx}\" y=\"{}\" font-size=\"10\" fill=\"#6b7280\" text-anchor=\"middle\">{}</text>",
                    (y1 + y2) / 2 - 4,
                    esc(&e.label)
                );
            }
        }
    }
    for (i, nd) in g.nodes.iter().enumerate() {
        let (x, y) = pos(i);
        let c = role_colour(Some(nd.role));
        let _ = write!(o, "<rect x=\"{x}\" y=\"{y}\" width=\"{bw}\" height=\"{bh}\" rx=\"8\" fill=\"#fff\" stroke=\"{c}\" stroke-width=\"2\"/>");
        let _ = write!(o, "<rect x=\"{x}\" y=\"{y}\" width=\"6\" height=\"{bh}\" rx=\"3\" fill=\"{c}\"/>");
        let _ = write!(
            o,
            "<text x=\"{}\" y=\"{}\" font-size=\"13\" font-weight=\"600\" fill=\"#111827\">{}</text>",
            x + 14,
            y + 19,
            esc(&nd.id)
        );
        let sub = p.stages.iter().find(|s| s.name == nd.id).map_or(nd.label.clone(), |s| {
            if s.gpus > 0 {
                format!("{} · {} GPUs", nd.label, s.gpus)
            } else {
                format!("{} · host", nd.label)
            }
        });
        let _ =
            write!(o, "<text x=\"{}\" y=\"{}\" font-size=\"11\" fill=\"#6b7280\">{}</text>", x + 14, y + 36, esc(&sub));
    }
    let _ = write!(o, "</svg>");
}

fn item_colour(name: &str) -> &'static str {
    match name {
        "weights" => "#2563eb",
        "adapters" => "#0ea5e9",
        "gradients" => "#7c3aed",
        "optimizer" => "#dc2626",
        "activations" => "#f59e0b",
        "critic_weights" => "#60a5fa",
        "critic_gradients" => "#c084fc",
        "critic_optimizer" => "#f87171",
        "critic_activations" => "#fbbf24",
        "teacher_weights" => "#93c5fd",
        "teacher_activations" => "#fde68a",
        "lora_dropout" => "#fcd34d",
        "reference" => "#93c5fd",
        "pretrain_optimizer" => "#fca5a5",
        "trajectories" => "#10b981",
        "eval_trajectory" => "#6ee7b7",
        "classifier" | "judge" => "#a3e635",
        "stream_buffer" => "#fb7185",
        "kv_cache" => "#10b981",
        _ => "#94a3b8",
    }
}

/// One bar per stage: items stacked, scaled so the larger of need and capacity fills the width;
/// a line marks the usable HBM.
fn memory_bars(o: &mut String, p: &Plan) {
    let width = 640.0;
    for m in &p.memory {
        let scale = width / (m.total.max(m.capacity).max(1) as f64);
        let _ = write!(
            o,
            "<div style=\"margin:8px 0 2px\"><b>{}</b>{} on {}: {} of {} usable {}</div>",
            esc(&m.stage),
            m.ranks.as_ref().map_or(String::new(), |r| format!(
                " per trainer rank ({} ranks, zero = {}; {} in all)",
                r.ranks,
                esc(&r.zero),
                gb(r.all_ranks)
            )),
            esc(&m.device),
            gb(m.total),
            gb(m.usable),
            if m.fits {
                "<span class=\"ok\">fits</span>".to_string()
            } else {
                "<span class=\"err\">does not fit</span>".to_string()
            }
        );
        let _ = write!(o, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"30\">", width as u64 + 10);
        let mut x = 0.0;
        for it in m.items.iter().filter(|i| i.bytes > 0) {
            let w = it.bytes as f64 * scale;
            let _ = write!(
                o,
                "<rect x=\"{x:.1}\" y=\"4\" width=\"{w:.1}\" height=\"20\" fill=\"{}\"><title>{} {}</title></rect>",
                item_colour(&it.name),
                esc(&it.name),
                gb(it.bytes)
            );
            x += w;
        }
        let ux = m.usable as f64 * scale;
        let _ = write!(o, "<line x1=\"{ux:.1}\" y1=\"0\" x2=\"{ux:.1}\" y2=\"30\" stroke=\"#111827\" stroke-width=\"2\" stroke-dasharray=\"3 2\"/></svg>");
        let _ = write!(o, "<div class=\"legend\" style=\"font-size:12px\">");
        for it in &m.items {
            let _ = write!(
                o,
                "<span><i class=\"sw\" style=\"background:{}\"></i>{} {}</span>",
                item_colour(&it.name),
                esc(&it.name),
                gb(it.bytes)
            );
        }
        let _ = write!(o, "</div>");
    }
}

/// Every estimate with what it rests on, and the count per kind (docs/plan.md, "Evidence").
fn evidence(o: &mut String, p: &Plan) {
    let Some(summary) = crate::evidence::summary(p) else { return };
    let _ = write!(o, "<h2>Evidence</h2><div class=\"card\"><table>");
    for (kind, source, names) in crate::render::evidence_groups(p) {
        let _ =
            write!(o, "<tr><th>{}</th><td><b>{}</b>: {}</td></tr>", kind.label(), esc(&names.join(", ")), esc(&source));
    }
    let _ = write!(o, "<tr><th>in all</th><td>{}</td></tr></table></div>", esc(&summary));
}

fn estimates(o: &mut String, p: &Plan) {
    if p.step.is_none() && p.syncs.is_empty() && p.batch.is_none() && p.rollouts.is_empty() {
        return;
    }
    let _ = write!(o, "<h2>Estimates</h2><div class=\"card\"><table>");
    for r in &p.rollouts {
        let _ = write!(
            o,
            "<tr><th>{}</th><td>{} engines x {} GPUs; KV {} tokens = {} sequences per engine; ~{} tokens/s</td></tr>",
            esc(&r.stage),
            r.engines,
            r.gpus_per_engine,
            count(r.kv_tokens_per_engine),
            r.sequences_per_engine,
            count(r.tokens_per_s.per_s as u64)
        );
        if let Some(t) = &r.throttle {
            let fix = t.fix.as_ref().map(|f| {
                let cost = f.cost.as_ref().map(|c| format!("; {c}")).unwrap_or_default();
                format!("<br>fix: {}{cost}", esc(&crate::plan::throttle::fix_line(f)))
            });
            let _ = write!(
                o,
                "<tr><th>{} held back</th><td>the step waits for it: {}{}</td></tr>",
                esc(&r.stage),
                esc(&crate::plan::throttle::limit_line(t)),
                fix.unwrap_or_default()
            );
        }
    }
    for s in &p.syncs {
        let alts: Vec<String> =
            s.alternatives.iter().map(|a| format!("{} {}", a.transport.as_str(), secs(a.seconds))).collect();
        let _ = write!(
            o,
            "<tr><th>{}</th><td>{} by {}: {} per update{}</td></tr>",
            esc(&s.name),
            gb(s.bytes),
            s.how(),
            secs(s.estimate.seconds),
            if alts.is_empty() { String::new() } else { format!(" (vs {})", alts.join(", ")) }
        );
    }
    if let Some(st) = &p.step {
        let _ = write!(
            o,
            "<tr><th>step</th><td>{} ({}): rollout {}, {}train {}{}{}{}, offload {}, sync {}</td></tr>",
            secs(st.step.seconds),
            st.mode.as_str(),
            secs(st.rollout_s),
            if st.teacher_stage_s > 0.0 { format!("teacher {}, ", secs(st.teacher_stage_s)) } else { String::new() },
            secs(st.train_s),
            if st.critic_s > 0.0 { format!(" (critic {})", secs(st.critic_s)) } else { String::new() },
            if st.teacher_s > 0.0 { format!(" (teacher {})", secs(st.teacher_s)) } else { String::new() },
            st.data_parallel.as_ref().map_or(String::new(), |d| format!(
                " (collectives of {} ranks, zero = {}: {}; the busiest rank trains {} of {} micro-batches)",
                d.ranks,
                esc(&d.zero),
                secs_fine(d.collective_s),
                d.micro_batches_per_rank,
                d.micro_batches
            )),
            secs(st.offload_s),
            secs(st.sync_s)
        );
    }
    if let Some(d) = &p.diffusion {
        diffusion_rows(o, d);
    }
    if let Some(b) = &p.batch {
        let _ = write!(
            o,
            "<tr><th>batch</th><td>{} prompts x {} samples = {} = global batch {} x {} step(s) per rollout{}</td></tr>",
            b.rollout_batch,
            b.samples_per_prompt,
            b.samples_per_rollout,
            b.global_batch,
            b.steps_per_rollout,
            if b.epochs > 1 { format!(", {} epochs", b.epochs) } else { String::new() }
        );
    }
    if let Some(b) = &p.buffer {
        let _ = write!(
            o,
            "<tr><th>buffer</th><td>up to {} groups, {} trajectories, {} host memory</td></tr>",
            b.capacity_groups,
            b.trajectories,
            gb(b.bytes)
        );
    }
    let _ = write!(o, "</table></div>");
}

/// A diffusion recipe's phases, one-off costs and batch arithmetic (docs/plan.md, "Diffusion RL").
fn diffusion_rows(o: &mut String, d: &DiffusionReport) {
    let b = &d.batch;
    let n = b.micro_groups_per_step;
    let _ = write!(
        o,
        "<tr><th>denoise</th><td>{}: {n} micro-groups x {} ({} steps x {} images x {} row(s))</td></tr>",
        secs(d.denoise.seconds),
        secs(d.denoise_micro_group_s),
        b.denoising_steps,
        b.micro_group,
        b.forwards_per_step
    );
    if let Some(r) = &d.reward {
        let _ = write!(
            o,
            "<tr><th>reward</th><td>{}: {n} micro-groups x {} on the reward thread</td></tr>",
            secs(r.seconds),
            secs(d.reward_micro_group_s)
        );
    }
    let _ = write!(
        o,
        "<tr><th>rollout</th><td>{} {}: whole batch (n d + n r) {}, streamed (d + (n - 1) max(d, r) + r) {}; reward wait {}</td></tr>",
        secs(d.step.rollout_s),
        if d.streaming { "streamed" } else { "whole batch" },
        secs(d.whole_batch_s),
        secs(d.streamed_s),
        secs(d.step.reward_wait_s)
    );
    if d.train.is_some() {
        let _ = write!(
            o,
            "<tr><th>train</th><td>{}: {n} micro-groups x {} trained steps, forward + backward, AdamW</td></tr>",
            secs(d.step.train_s),
            b.trained_steps
        );
    }
    if let (Some(e), Some(every)) = (&d.eval, d.eval_every) {
        let _ = write!(
            o,
            "<tr><th>eval</th><td>{} per evaluation, every {every} steps (not in the step)</td></tr>",
            secs(e.seconds)
        );
    }
    if d.one_off_s > 0.0 {
        let _ = write!(
            o,
            "<tr><th>once</th><td>{} before RL: pretrain {}, classifiers {}</td></tr>",
            secs(d.one_off_s),
            secs(d.pretrain.as_ref().map_or(0.0, |e| e.seconds)),
            secs(d.classifiers.as_ref().map_or(0.0, |e| e.seconds))
        );
    }
    let _ = write!(
        o,
        "<tr><th>images</th><td>{} conditions x {} samples = {} per step = {n} micro-groups of {}; trajectories {}</td></tr>",
        b.conditions_per_step,
        b.samples_per_condition,
        b.images_per_step,
        b.micro_group,
        gb(b.trajectory_bytes)
    );
}
