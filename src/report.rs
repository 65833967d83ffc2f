//! `miles report DIR...`: the curves of one or more runs (reward, held-out accuracy, loss,
//! train-rollout divergence, response length; route mismatch and expert load for MoE runs) as SVG
//! files, and a summary table.

use crate::files::write_atomic;
pub use crate::saved_plan::load_plan;

mod faults;
mod ranks;
mod samples;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct Args {
    /// Run directories (each holds a metrics.jsonl); several runs are overlaid.
    #[arg(required = true)]
    pub dirs: Vec<PathBuf>,
    /// Where the SVG files go. Default: DIR/report for one run, ./report for several.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// The curves drawn, by metric name, with their titles.
pub const CHARTS: &[(&str, &str)] = &[
    ("rollout/reward_mean", "reward (mean over rollouts)"),
    ("eval/accuracy", "held-out accuracy (share solved)"),
    ("train/loss", "train loss"),
    ("train/logp_diff", "train-rollout log-prob divergence"),
    ("rollout/response_len", "response length (tokens)"),
    // Drawn for runs with an environment (docs/agents.md, "In a run").
    ("rollout/faulted_frac", "share of episodes that ended by an environment fault"),
    // Drawn for mixture-of-experts runs only (docs/moe.md).
    ("r3/route_mismatch", "R3: share of tokens trained on other experts than sampled"),
    ("r3/router_disagreement", "R3: share of tokens the trainer's router sends elsewhere"),
    ("moe/aux_loss", "MoE load-balancing loss (1 = balanced)"),
    // Drawn for diffusion runs only (docs/recipes/diffusion.md).
    ("eval/reward_mean", "held-out mean reward (diffusion)"),
    ("eval/judge_accuracy", "held-out accuracy of the judge classifier (diffusion)"),
    ("eval/diversity", "held-out sample diversity within a condition (diffusion)"),
];

/// One run's metrics: name -> (step, value) points in file order.
pub struct Run {
    pub label: String,
    pub series: BTreeMap<String, Vec<(f64, f64)>>,
    /// `file:line: why` for every line that was skipped.
    pub skipped: Vec<String>,
}

pub fn load(dir: &Path) -> Result<Run, String> {
    let path = dir.join("metrics.jsonl");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut series: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    let mut skipped = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value = match serde_json::from_str(line) {
            Ok(v) => v,
            Err(e) => {
                // A run killed mid-write leaves a torn last line; report it and go on.
                skipped.push(format!("{}:{}: {e}", path.display(), i + 1));
                continue;
            }
        };
        let Some(obj) = v.as_object() else {
            skipped.push(format!("{}:{}: not a JSON object", path.display(), i + 1));
            continue;
        };
        let Some(step) = obj.get("step").and_then(|s| s.as_f64()) else {
            skipped.push(format!("{}:{}: no `step`", path.display(), i + 1));
            continue;
        };
        for (k, val) in obj {
            if let Some(x) = val.as_f64().filter(|x| x.is_finite()) {
                if k != "step" {
                    series.entry(k.clone()).or_default().push((step, x));
                }
            }
        }
    }
    Ok(Run { label: dir.display().to_string(), series, skipped })
}

pub fn run(args: Args) -> u8 {
    let mut runs = Vec::new();
    for d in &args.dirs {
        match load(d) {
            Ok(r) => runs.push(r),
            Err(e) => {
                eprintln!("error[E0501]: {e}");
                return 1;
            }
        }
    }
    for r in &runs {
        for s in &r.skipped {
            eprintln!("warning: skipped {s}");
        }
    }
    let out = args.out.clone().unwrap_or_else(|| {
        if runs.len() == 1 {
            args.dirs[0].join("report")
        } else {
            PathBuf::from("report")
        }
    });
    if let Err(e) = std::fs::create_dir_all(&out) {
        eprintln!("error: cannot create {}: {e}", out.display());
        return 1;
    }
    let mut written = Vec::new();
    // What counted as solved in each run (its spec.json); one rule for all names the chart.
    let rules: Vec<Option<String>> = args.dirs.iter().map(|d| solved_rule(d)).collect();
    let shared_rule = rules.first().cloned().flatten().filter(|r| rules.iter().all(|x| x.as_ref() == Some(r)));
    for (metric, title) in CHARTS {
        let lines: Vec<(&str, &[(f64, f64)])> =
            runs.iter().filter_map(|r| r.series.get(*metric).map(|s| (r.label.as_str(), s.as_slice()))).collect();
        if lines.is_empty() {
            continue;
        }
        let title = match (&shared_rule, *metric) {
            (Some(rule), "eval/accuracy") => format!("{title}, {rule}"),
            _ => title.to_string(),
        };
        let file = out.join(format!("{}.svg", metric.replace('/', "_")));
        if let Err(e) = write_atomic(&file.to_string_lossy(), svg_chart(&title, &lines).as_bytes()) {
            eprintln!("error: cannot write {}: {e}", file.display());
            return 1;
        }
        written.push(file);
    }
    print!("{}", summary_table(&runs));
    for (r, rule) in runs.iter().zip(&rules) {
        if let Some(rule) = rule.as_ref().filter(|_| r.series.contains_key("eval/accuracy")) {
            println!("{}: eval/accuracy and rollout/solved_frac, {rule}", r.label);
        }
    }
    print!("{}", diffusion_table(&runs));
    // Per step, the episodes that faulted and why (issue #41); report/faults.html the same.
    let mut fault_sections = String::new();
    for (d, r) in args.dirs.iter().zip(&runs) {
        let rows = faults::load(d);
        print!("{}", faults::table(&r.label, &rows));
        fault_sections.push_str(&faults::section(&r.label, &rows));
    }
    if let Some(page) = faults::page(&fault_sections) {
        let file = out.join("faults.html");
        if let Err(e) = write_atomic(&file.to_string_lossy(), page.as_bytes()) {
            eprintln!("error: cannot write {}: {e}", file.display());
            return 1;
        }
        written.push(file);
    }
    for d in &args.dirs {
        if let Some(s) = samples::load(d) {
            print!("{}", samples::text_lines(d, &s));
        }
    }
    // Diffusion runs' sample grids (DIR/grids), first and last evaluation side by side.
    match write_samples_page(&args.dirs, &runs, &out) {
        Ok(Some(f)) => written.push(f),
        Ok(None) => {}
        Err(e) => {
            eprintln!("error: {e}");
            return 1;
        }
    }
    // Only runs that saved their plan (`miles run` writes DIR/plan.json) get the comparison.
    for (d, r) in args.dirs.iter().zip(&runs) {
        match load_plan(d) {
            Ok(Some(plan)) => print!("{}", plan_vs_actual(&r.label, &plan, r)),
            Ok(None) => {}
            Err(e) => eprintln!("warning: no plan vs actual for {}: {e}", d.display()),
        }
    }
    for f in &written {
        println!("wrote {}", f.display());
    }
    0
}

/// The run's success rule (`RunSpec::solved_rule`) from the spec.json it wrote; `None` for a run
/// without one (a diffusion run, or one made before it was written).
fn solved_rule(dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(dir.join("spec.json")).ok()?;
    let spec: miles_runtime::spec::RunSpec = serde_json::from_str(&text).ok()?;
    Some(spec.solved_rule())
}

fn median(mut xs: Vec<f64>) -> Option<f64> {
    if xs.is_empty() {
        return None;
    }
    xs.sort_by(|a, b| a.total_cmp(b));
    let n = xs.len();
    Some(if n % 2 == 1 { xs[n / 2] } else { (xs[n / 2 - 1] + xs[n / 2]) / 2.0 })
}

/// A Markdown table: per run, steps, first/last held-out accuracy, best, last reward and the
/// median throughputs.
pub fn summary_table(runs: &[Run]) -> String {
    let mut s = String::from(
        "| run | steps | eval first | eval last | eval best | reward last | gen tok/s (median) | train tok/s (median) |\n|---|---|---|---|---|---|---|---|\n",
    );
    let pct = |x: Option<f64>| x.map(|v| format!("{:.1}%", 100.0 * v)).unwrap_or_else(|| "-".into());
    let num = |x: Option<f64>| x.map(|v| format!("{v:.0}")).unwrap_or_else(|| "-".into());
    for r in runs {
        let get = |k: &str| r.series.get(k).cloned().unwrap_or_default();
        let eval = get("eval/accuracy");
        let steps = last_step(r);
        let best = eval.iter().map(|p| p.1).fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))));
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r.label,
            steps,
            pct(eval.first().map(|p| p.1)),
            pct(eval.last().map(|p| p.1)),
            pct(best),
            get("rollout/reward_mean").last().map(|p| format!("{:.3}", p.1)).unwrap_or_else(|| "-".into()),
            num(median(get("perf/gen_tokens_per_s").iter().map(|p| p.1).collect())),
            num(median(get("perf/train_tokens_per_s").iter().map(|p| p.1).collect())),
        ));
    }
    s
}

/// The last step any of a run's metrics reached.
fn last_step(r: &Run) -> f64 {
    r.series.values().flat_map(|s| s.iter().map(|p| p.0)).fold(0.0f64, f64::max)
}

/// Diffusion runs (those with a held-out mean reward): the held-out reward, the judge's accuracy
/// and the samples' diversity at the first and last evaluation. Empty when no run is one.
pub fn diffusion_table(runs: &[Run]) -> String {
    let diffusion: Vec<&Run> = runs.iter().filter(|r| r.series.contains_key("eval/reward_mean")).collect();
    if diffusion.is_empty() {
        return String::new();
    }
    let mut s = String::from(
        "\n| diffusion run | steps | held-out reward first | last | judge accuracy first | last | diversity first | last |\n|---|---|---|---|---|---|---|---|\n",
    );
    let ends = |r: &Run, k: &str, pct: bool| -> [String; 2] {
        let v = r.series.get(k).cloned().unwrap_or_default();
        let f = |p: Option<&(f64, f64)>| match p {
            Some(p) if pct => format!("{:.1}%", 100.0 * p.1),
            Some(p) => format!("{:.3}", p.1),
            None => "-".into(),
        };
        [f(v.first()), f(v.last())]
    };
    for r in diffusion {
        let steps = last_step(r);
        let [r0, r1] = ends(r, "eval/reward_mean", false);
        let [j0, j1] = ends(r, "eval/judge_accuracy", true);
        let [d0, d1] = ends(r, "eval/diversity", false);
        s.push_str(&format!("| {} | {steps} | {r0} | {r1} | {j0} | {j1} | {d0} | {d1} |\n", r.label));
    }
    s
}

/// The sample grids a diffusion run wrote at its evaluations (DIR/grids/step-NNNNN.svg), by step.
fn grids(dir: &Path) -> Vec<(u64, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(dir.join("grids")) else { return Vec::new() };
    let mut out: Vec<(u64, PathBuf)> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let step = name.strip_prefix("step-")?.strip_suffix(".svg")?.parse().ok()?;
            Some((step, e.path()))
        })
        .collect();
    out.sort();
    out
}

/// `report/samples.html`: per diffusion run, its sample grid before RL and at the last
/// evaluation side by side, then every evaluation's; per language-model run, a few of its samples
/// per sampled step (samples.jsonl); None when no run wrote either.
fn write_samples_page(dirs: &[PathBuf], runs: &[Run], out: &Path) -> Result<Option<PathBuf>, String> {
    let mut body = String::new();
    for (d, r) in dirs.iter().zip(runs) {
        if let Some(s) = samples::load(d) {
            body.push_str(&samples::section(&r.label, &s));
        }
    }
    for (d, r) in dirs.iter().zip(runs) {
        let g = grids(d);
        let (Some(first), Some(last)) = (g.first(), g.last()) else { continue };
        let img = |(step, p): &(u64, PathBuf)| {
            let abs = std::fs::canonicalize(p).unwrap_or_else(|_| p.clone());
            format!(
                "<figure><img src=\"file://{}\" width=\"480\"><figcaption>step {step}</figcaption></figure>",
                esc(&abs.to_string_lossy())
            )
        };
        body.push_str(&format!(
            "<h2>{}</h2>\n<h3>before RL and after</h3>\n<div class=\"row\">{}{}</div>\n",
            esc(&r.label),
            img(first),
            img(last)
        ));
        body.push_str("<h3>every evaluation</h3>\n<div class=\"row\">");
        for x in &g {
            body.push_str(&img(x));
        }
        body.push_str("</div>\n");
    }
    if body.is_empty() {
        return Ok(None);
    }
    let page = format!(
        "<!doctype html>\n<meta charset=\"utf-8\">\n<meta http-equiv=\"Content-Security-Policy\" content=\"script-src 'none'\">\n<title>miles report: samples</title>\n<style>body{{font-family:sans-serif}} .row{{display:flex;flex-wrap:wrap;gap:12px}} figure{{margin:0}} pre{{white-space:pre-wrap;background:#f6f6f6;padding:4px}} .fault>summary,.why{{color:#b00}}</style>\n<h1>Samples (diffusion: held-out, the same conditions and noise at every evaluation; text: samples.jsonl)</h1>\n{body}"
    );
    let file = out.join("samples.html");
    write_atomic(&file.to_string_lossy(), page.as_bytes())
        .map_err(|e| format!("cannot write {}: {e}", file.display()))?;
    Ok(Some(file))
}

/// The plan's memory for the process `miles run` measures: on a CPU cluster every stage on the
/// host shares one process, so their totals add up; on GPUs, the largest rank. A data-parallel
/// trainer's ranks are processes of their own (`ranks::rank_rows`), left out here.
fn planned_memory(plan: &serde_json::Value) -> Option<(f64, &'static str)> {
    let rows: Vec<&serde_json::Value> =
        plan.get("memory")?.as_array()?.iter().filter(|m| !ranks::is_rank_row(m)).collect();
    let total = |m: &serde_json::Value| m.get("total").and_then(|t| t.as_f64());
    match plan.pointer("/cluster/host").and_then(|h| h.as_str()) {
        Some(host) => {
            let on_host: Vec<f64> = rows
                .iter()
                .filter(|m| m.get("device").and_then(|d| d.as_str()) == Some(host))
                .filter_map(|m| total(m))
                .collect();
            (!on_host.is_empty()).then(|| (on_host.iter().sum(), "host total"))
        }
        None => rows.into_iter().filter_map(total).reduce(f64::max).map(|m| (m, "largest rank")),
    }
}

/// "Plan vs actual": each phase's estimate next to the median the run measured, the plan's
/// memory next to the measured peak RSS, and the lengths the plan priced a sample at next to the
/// run's, with measured/plan ratios ("-" where either is missing).
pub fn plan_vs_actual(label: &str, plan: &serde_json::Value, run: &Run) -> String {
    let col = |k: &str| run.series.get(k).map(|s| s.iter().map(|p| p.1).collect::<Vec<_>>()).unwrap_or_default();
    let secs = |x: Option<f64>| x.map(|v| format!("{v:.3} s")).unwrap_or_else(|| "-".into());
    let ratio = |m: Option<f64>, p: Option<f64>| match (m, p) {
        (Some(m), Some(p)) if p > 0.0 && (m / p).is_finite() => format!("x{:.2}", m / p),
        _ => "-".into(),
    };
    let est = |ptr: &str| plan.pointer(ptr).and_then(|v| v.as_f64());
    let mut s =
        format!("\nPlan vs actual: {label}\n| phase | plan | measured (median) | measured/plan |\n|---|---|---|---|\n");
    for (phase, ptr, metric) in [
        // A diffusion run's rollout (denoising and waiting for rewards) is `perf/rollout_s`.
        ("rollout", "/step/rollout_s", &["perf/gen_s", "perf/rollout_s"][..]),
        ("train", "/step/train_s", &["perf/train_s"]),
        ("sync", "/step/sync_s", &["perf/sync_s"]),
        ("step", "/step/step/seconds", &["perf/step_s"]),
    ] {
        let measured = metric.iter().find(|k| run.series.contains_key(**k)).unwrap_or(&metric[0]);
        let (p, m) = (est(ptr), median(col(measured)));
        s.push_str(&format!("| {phase} | {} | {} | {} |\n", secs(p), secs(m), ratio(m, p)));
    }
    let gb = |x: Option<f64>| x.map(|v| format!("{:.1} MB", v / 1e6)).unwrap_or_else(|| "-".into());
    let planned = planned_memory(plan);
    let peak = col("perf/peak_rss_bytes").into_iter().reduce(f64::max);
    s.push_str(&format!(
        "| memory ({} vs peak RSS) | {} | {} | {} |\n",
        planned.map_or("plan", |p| p.1),
        gb(planned.map(|p| p.0)),
        gb(peak),
        ratio(peak, planned.map(|p| p.0))
    ));
    s.push_str(&ranks::rank_rows(plan, run));
    s.push_str(&lengths_rows(plan, run));
    if plan.get("step").is_none_or(|v| v.is_null()) {
        s.push_str("(the plan has no step-time estimate for this cluster)\n");
    }
    s
}

/// The lengths the plan priced a sample at (the recipe's `mean_*`, else the bounds) next to the
/// run's means over its steps, so a user learns what to state: a response (per turn in an
/// episode) from `rollout/response_len` (sampled tokens per sample) and `rollout/turns`; a
/// prompt from `perf/trained_tokens` per sample less the sampled and observation tokens. Empty
/// when the plan has no lengths (plans made before it had them, diffusion).
fn lengths_rows(plan: &serde_json::Value, run: &Run) -> String {
    let Some(l) = plan.get("lengths").filter(|l| l.is_object()) else { return String::new() };
    let num = |k: &str| l.get(k).and_then(|v| v.as_f64());
    let stated = |k: &str| l.get(k).and_then(|v| v.as_bool()).unwrap_or(false);
    let mean = |k: &str| {
        let v: Vec<f64> = run.series.get(k).map(|s| s.iter().map(|p| p.1).collect()).unwrap_or_default();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    };
    let fig = |x: Option<f64>| x.map(|v| format!("{v:.1}")).unwrap_or_else(|| "-".into());
    let ratio = |m: Option<f64>, p: Option<f64>| match (m, p) {
        (Some(m), Some(p)) if p > 0.0 && (m / p).is_finite() => format!("x{:.2}", m / p),
        _ => "-".into(),
    };
    let planned = |v: &str, max: &str, flag: &str, field: &str, bound: &str| {
        let (p, m) = (num(v), num(max));
        let why = if stated(flag) { field } else { bound };
        (p.or(m), format!("{} ({why})", fig(p.or(m))))
    };
    let episodes = l.get("turns").is_some_and(|t| t.is_number());
    let turns = mean("rollout/turns").filter(|_| episodes);
    let sampled = mean("rollout/response_len");
    let per_turn = match turns {
        Some(t) if t > 0.0 => sampled.map(|r| r / t),
        Some(_) => None,
        None => sampled,
    };
    // Trained tokens per sample: prompt + sampled tokens (+ an episode's observations).
    let samples = plan.pointer("/batch/samples_per_rollout").and_then(|v| v.as_f64()).filter(|n| *n > 0.0);
    let per_sample = |k: &str| mean(k).zip(samples).map(|(x, n)| x / n);
    let observations = if episodes { per_sample("rollout/observation_tokens").unwrap_or(0.0) } else { 0.0 };
    let prompt = per_sample("perf/trained_tokens").zip(sampled).map(|(t, r)| t - r - observations);
    let mut s = String::new();
    let (p, text) =
        planned("response_tokens", "max_response_tokens", "response_stated", "mean_response_tokens", "max_new_tokens");
    let what = if episodes { "response tokens per turn (mean)" } else { "response tokens (mean)" };
    s.push_str(&format!("| {what} | {text} | {} | {} |\n", fig(per_turn), ratio(per_turn, p)));
    let (p, text) =
        planned("prompt_tokens", "max_prompt_tokens", "prompt_stated", "mean_prompt_tokens", "max_prompt_tokens");
    s.push_str(&format!("| prompt tokens (mean) | {text} | {} | {} |\n", fig(prompt), ratio(prompt, p)));
    if episodes {
        let (p, text) = planned("turns", "max_turns", "turns_stated", "mean_turns", "turns that fit");
        s.push_str(&format!("| turns per episode (mean) | {text} | {} | {} |\n", fig(turns), ratio(turns, p)));
        // One observation between each two turns: what env_reward.observation_tokens states.
        let e = plan.get("episodes");
        let p = e.and_then(|e| e.get("observation_tokens")).and_then(|v| v.as_f64());
        let flag = |k: &str| e.and_then(|e| e.get(k)).and_then(|v| v.as_bool()).unwrap_or(false);
        let why = if flag("observation_stated") {
            "observation_tokens"
        } else if flag("observation_assumed") {
            "assumed"
        } else {
            "the environment's"
        };
        let measured = turns.filter(|t| *t > 1.0).map(|t| observations / (t - 1.0));
        if let Some(p) = p {
            s.push_str(&format!(
                "| observation tokens (mean) | {} ({why}) | {} | {} |\n",
                fig(Some(p)),
                fig(measured),
                ratio(measured, Some(p))
            ));
        }
    }
    s.push_str(
        "(lengths: the plan prices time at the recipe's generate.mean_response_tokens, mean_prompt_tokens and env_reward.mean_turns, else at the bounds; state the measured means to plan shorter answers, memory stays at the bounds; an observation's length is env_reward.observation_tokens)\n",
    );
    s
}

const COLORS: &[&str] = &["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// A self-contained SVG line chart with axes, ticks and a legend.
pub fn svg_chart(title: &str, lines: &[(&str, &[(f64, f64)])]) -> String {
    let (w, h, left, right, top, bottom) = (720.0, 360.0, 64.0, 16.0, 36.0, 44.0);
    let pts = lines.iter().flat_map(|(_, p)| p.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in pts {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    if y1 <= y0 {
        y1 = y0 + 1.0;
        y0 -= 1.0;
    }
    let pad = (y1 - y0) * 0.05;
    let (y0, y1) = (y0 - pad, y1 + pad);
    let sx = |x: f64| left + (x - x0) / (x1 - x0) * (w - left - right);
    let sy = |y: f64| top + (1.0 - (y - y0) / (y1 - y0)) * (h - top - bottom);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{}\" y=\"22\" font-size=\"15\" font-weight=\"bold\">{}</text>\n",
        left,
        esc(title)
    );
    for i in 0..=4 {
        let fy = y0 + (y1 - y0) * f64::from(i) / 4.0;
        s.push_str(&format!(
            "<line x1=\"{left}\" x2=\"{}\" y1=\"{:.1}\" y2=\"{:.1}\" stroke=\"#ddd\"/><text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>\n",
            w - right,
            sy(fy),
            sy(fy),
            left - 6.0,
            sy(fy) + 4.0,
            tick(fy)
        ));
    }
    for fx in step_ticks(x0, x1) {
        s.push_str(&format!(
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
            sx(fx),
            h - bottom + 18.0,
            tick(fx)
        ));
    }
    s.push_str(&format!(
        "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">step</text>\n",
        (left + w - right) / 2.0,
        h - 8.0
    ));
    for (i, (label, p)) in lines.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let path: Vec<String> = p.iter().map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y))).collect();
        s.push_str(&format!(
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"1.6\" points=\"{}\"/>\n",
            path.join(" ")
        ));
        if p.len() <= 40 {
            for &(x, y) in p.iter() {
                s.push_str(&format!("<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"2.5\" fill=\"{color}\"/>\n", sx(x), sy(y)));
            }
        }
        let ly = top + 14.0 * i as f64 + 6.0;
        s.push_str(&format!(
            "<line x1=\"{}\" x2=\"{}\" y1=\"{ly:.1}\" y2=\"{ly:.1}\" stroke=\"{color}\" stroke-width=\"3\"/><text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>\n",
            w - right - 130.0,
            w - right - 110.0,
            w - right - 136.0,
            ly + 4.0,
            esc(label)
        ));
    }
    s.push_str("</svg>\n");
    s
}

/// The x axis's labels: steps are whole, so ticks fall on whole steps, every 1, 2 or 5 x 10^k
/// steps (at most about six across the range); quarters of the range gave 5.75, 10.5.
fn step_ticks(x0: f64, x1: f64) -> Vec<f64> {
    let raw = ((x1 - x0) / 5.0).max(1.0);
    let mag = 10f64.powf(raw.log10().floor());
    let every = [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * mag).find(|&e| e >= raw - 1e-9).unwrap_or(10.0 * mag);
    let first = (x0 / every - 1e-9).ceil() * every;
    (0..).map(|i| first + every * f64::from(i)).take_while(|&x| x <= x1 + 1e-9).take(64).collect()
}

fn tick(v: f64) -> String {
    let a = v.abs();
    if a != 0.0 && !(1e-3..1e5).contains(&a) {
        format!("{v:.1e}")
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else {
        let t = format!("{v:.3}");
        t.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn torn_lines_are_reported_with_file_and_line() {
        let dir = std::env::temp_dir().join(format!("miles-report-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("metrics.jsonl"), "{\"step\":1,\"eval/accuracy\":0.5}\n{\"step\":2,\"eval/acc")
            .unwrap();
        let r = load(&dir).unwrap();
        assert_eq!(r.series["eval/accuracy"], vec![(1.0, 0.5)]);
        assert_eq!(r.skipped.len(), 1);
        assert!(r.skipped[0].contains("metrics.jsonl:2:"), "{:?}", r.skipped);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn summary_and_chart() {
        let mut series = BTreeMap::new();
        series.insert("eval/accuracy".to_string(), vec![(0.0, 0.2), (10.0, 0.6), (20.0, 0.5)]);
        series.insert("rollout/reward_mean".to_string(), vec![(1.0, 0.1), (20.0, 0.7)]);
        let runs = vec![Run { label: "a".into(), series, skipped: vec![] }];
        let t = summary_table(&runs);
        assert!(t.contains("| a | 20 | 20.0% | 50.0% | 60.0% | 0.700 | - | - |"), "{t}");
        let svg = svg_chart("t", &[("a", &[(0.0, 0.0), (1.0, 1.0)])]);
        assert!(svg.starts_with("<svg") && svg.contains("<polyline"));
    }

    /// The report names what counted as solved, from the run's spec.json (issue #42).
    #[test]
    fn the_success_rule_is_read_from_the_runs_spec() {
        let dir = std::env::temp_dir().join(format!("miles-report-rule-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(solved_rule(&dir), None);
        let tiny = include_str!("../engine/runtime/tests/data/tiny.json");
        std::fs::write(dir.join("spec.json"), tiny).unwrap();
        assert_eq!(solved_rule(&dir).as_deref(), Some("solved: reward >= 1"));
        let mut spec: serde_json::Value = serde_json::from_str(tiny).unwrap();
        spec["env"] = serde_json::json!({"env": {"type": "calculator"}, "solved_at": 0.5});
        std::fs::write(dir.join("spec.json"), spec.to_string()).unwrap();
        assert_eq!(solved_rule(&dir).as_deref(), Some("solved: episode reward >= 0.5 (env_reward.solved_at)"));
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn step_ticks_are_whole_steps() {
        // Steps 1..=24: the old quarters of the range fell on 6.75, 12.5, 18.25.
        let svg = svg_chart("t", &[("a", &[(1.0, 0.0), (24.0, 1.0)])]);
        let labels: Vec<&str> = svg
            .lines()
            .filter(|l| l.contains("text-anchor=\"middle\"") && !l.contains(">step<"))
            .filter_map(|l| l.split('>').nth(1)?.split('<').next())
            .collect();
        assert_eq!(labels, ["5", "10", "15", "20"], "{svg}");
        assert_eq!(step_ticks(0.0, 2.0), [0.0, 1.0, 2.0]);
        assert_eq!(step_ticks(1.0, 1.0), [1.0]);
        assert_eq!(step_ticks(0.0, 300.0), [0.0, 100.0, 200.0, 300.0]);
        assert_eq!(step_ticks(3.0, 37.0), [10.0, 20.0, 30.0]);
    }

    #[test]
    fn plan_vs_actual_sets_measured_lengths_beside_the_plans() {
        let mut series = BTreeMap::new();
        // 16 samples a step: 2.5 sampled tokens and 20 trained tokens each, so 17.5 of prompt.
        series.insert("rollout/response_len".to_string(), vec![(1.0, 2.0), (2.0, 3.0)]);
        series.insert("perf/trained_tokens".to_string(), vec![(1.0, 320.0), (2.0, 320.0)]);
        let run = Run { label: "a".into(), series, skipped: vec![] };
        let plan = serde_json::json!({
            "format_version": 2,
            "batch": {"samples_per_rollout": 16},
            "lengths": {"max_prompt_tokens": 32.0, "max_response_tokens": 4.0, "prompt_tokens": 32.0,
                        "response_tokens": 2.0, "prompt_stated": false, "response_stated": true},
        });
        let t = plan_vs_actual("a", &plan, &run);
        assert!(t.contains("| response tokens (mean) | 2.0 (mean_response_tokens) | 2.5 | x1.25 |"), "{t}");
        assert!(t.contains("| prompt tokens (mean) | 32.0 (max_prompt_tokens) | 17.5 | x0.55 |"), "{t}");
        assert!(!t.contains("turns per episode"), "{t}");
        // An episode: per turn from the mean turns; observations are not prompt.
        let mut series = BTreeMap::new();
        series.insert("rollout/response_len".to_string(), vec![(1.0, 24.0)]);
        series.insert("rollout/turns".to_string(), vec![(1.0, 1.5)]);
        series.insert("rollout/observation_tokens".to_string(), vec![(1.0, 160.0)]);
        series.insert("perf/trained_tokens".to_string(), vec![(1.0, 16.0 * 42.0)]);
        let run = Run { label: "e".into(), series, skipped: vec![] };
        let plan = serde_json::json!({
            "format_version": 2,
            "batch": {"samples_per_rollout": 16},
            "lengths": {"max_prompt_tokens": 8.0, "max_response_tokens": 28.0, "prompt_tokens": 8.0,
                        "response_tokens": 28.0, "prompt_stated": false, "response_stated": false,
                        "max_turns": 2.0, "turns": 2.0},
        });
        let t = plan_vs_actual("e", &plan, &run);
        assert!(t.contains("| response tokens per turn (mean) | 28.0 (max_new_tokens) | 16.0 | x0.57 |"), "{t}");
        assert!(t.contains("| prompt tokens (mean) | 8.0 (max_prompt_tokens) | 8.0 | x1.00 |"), "{t}");
        assert!(t.contains("| turns per episode (mean) | 2.0 (turns that fit) | 1.5 | x0.75 |"), "{t}");
        // 160 observation tokens over 16 episodes of 1.5 turns: 20 an observation, against 512 assumed.
        let mut plan = plan;
        plan["episodes"] = serde_json::json!({"observation_tokens": 512, "observation_assumed": true});
        let t = plan_vs_actual("e", &plan, &run);
        assert!(t.contains("| observation tokens (mean) | 512.0 (assumed) | 20.0 | x0.04 |"), "{t}");
    }

    #[test]
    fn plan_vs_actual_ratios_and_bad_plans() {
        let mut series = BTreeMap::new();
        series.insert("perf/step_s".to_string(), vec![(1.0, 1.0), (2.0, 3.0), (3.0, 2.0)]);
        series.insert("perf/peak_rss_bytes".to_string(), vec![(1.0, 1e8), (3.0, 3e8)]);
        let run = Run { label: "a".into(), series, skipped: vec![] };
        let plan = serde_json::json!({
            "format_version": 1,
            "cluster": {"host": "laptop"},
            "memory": [{"device": "laptop", "total": 1e8}, {"device": "laptop", "total": 1e8}],
            "step": {"rollout_s": 1.0, "train_s": 1.0, "sync_s": 0.0, "step": {"seconds": 4.0}},
        });
        let t = plan_vs_actual("a", &plan, &run);
        assert!(t.contains("| step | 4.000 s | 2.000 s | x0.50 |"), "{t}");
        assert!(t.contains("| memory (host total vs peak RSS) | 200.0 MB | 300.0 MB | x1.50 |"), "{t}");
        assert!(t.contains("| sync | 0.000 s | - | - |"), "{t}");
        // No lengths in the plan (made before it had them): no length rows.
        assert!(!t.contains("response tokens"), "{t}");
        let dir = std::env::temp_dir().join(format!("miles-report-plan-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(load_plan(&dir), Ok(None));
        std::fs::write(dir.join("plan.json"), "{\"format_version\": 1, \"memo").unwrap();
        assert!(load_plan(&dir).unwrap_err().contains("plan.json is not valid JSON"));
        std::fs::write(dir.join("plan.json"), "[1, 2]").unwrap();
        assert!(load_plan(&dir).unwrap_err().contains("not a miles plan"));
        std::fs::remove_dir_all(&dir).ok();
    }
}
