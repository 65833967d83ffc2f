//! `miles-engine run`: executes a RunSpec on the embedded backend, in this process or with its
//! stages as worker processes (src/bin/miles-engine/distributed.rs), and prints the outcome.

use miles_runtime::spec::{ProgressMode, RunOptions, RunSpec, EXIT_INTERRUPTED};
use std::io::Read;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A second SIGINT sooner than this after the first is the same Ctrl-C, delivered twice: once by
/// the terminal to the whole process group, once passed on by `miles run` (src/engine.rs).
const SAME_CTRL_C: Duration = Duration::from_millis(250);

#[derive(clap::Args)]
pub struct Args {
    /// The run spec as JSON; `-` reads it from standard input.
    #[arg(long)]
    pub spec: String,
    /// The recipe's name, for messages.
    #[arg(long, default_value = "run")]
    pub name: String,
    #[arg(long)]
    pub out: PathBuf,
    #[arg(long)]
    pub resume: bool,
    #[arg(long)]
    pub threads: Option<usize>,
    #[arg(long, default_value = "auto")]
    pub progress: String,
}

/// The text of `--spec`: a file, or standard input for `-`; None (the error said) when unreadable.
pub fn read_spec(spec: &str) -> Option<String> {
    if spec == "-" {
        let mut s = String::new();
        match std::io::stdin().read_to_string(&mut s) {
            Ok(_) => Some(s),
            Err(e) => {
                eprintln!("error[E0504]: cannot read the run spec from standard input: {e}");
                None
            }
        }
    } else {
        match std::fs::read_to_string(spec) {
            Ok(s) => Some(s),
            Err(e) => {
                eprintln!("error[E0504]: cannot read {spec}: {e}");
                None
            }
        }
    }
}

pub fn run(args: Args) -> u8 {
    let Some(text) = read_spec(&args.spec) else { return 1 };
    let spec = match RunSpec::from_json(&text) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{e}");
            return 1;
        }
    };
    let name = args.name;
    let out = args.out;
    let mut opts = RunOptions::new(out.clone());
    opts.interrupt = Some(catch_ctrl_c());
    // The session server an agent layer's harnesses call during the run (docs/agents.md).
    opts.chat_server = Some(Arc::new(miles_workers::http::OpenAiServer::default()));
    opts.resume = args.resume;
    opts.threads = args.threads;
    opts.progress = match args.progress.as_str() {
        "plain" => ProgressMode::Plain,
        "off" => ProgressMode::Off,
        _ => ProgressMode::Auto,
    };
    // A data-parallel trainer's ranks are worker processes: a spec written by hand that asks for
    // them where the trainer runs in this process is refused, not run on one rank.
    let ranks = spec.train.dp.as_ref().map_or(1, |p| p.ranks);
    if ranks > 1 && spec.distributed.as_ref().is_none_or(|d| !d.engine_urls.is_empty()) {
        let e = miles_runtime::RunError::new(
            miles_runtime::E_SPEC,
            format!("train.dp asks for {ranks} data-parallel trainer ranks, but the trainer runs in this process"),
        )
        .with_help("data-parallel ranks are worker processes: set launcher = local_processes {} (or slurm, ray)");
        eprintln!("{e}");
        return 1;
    }
    let result = match &spec.distributed {
        None => {
            eprintln!(
                "miles run: {name}: {} RL steps on the embedded backend; output in {}",
                spec.steps,
                out.display()
            );
            miles_tch::run(&spec, &opts)
        }
        Some(d) if !d.engine_urls.is_empty() => {
            eprintln!(
                "miles run: {name}: {} RL steps, trainer here, rollout on SGLang-compatible server(s) {}; output in {}",
                spec.steps,
                d.engine_urls.join(", "),
                out.display()
            );
            crate::distributed::run(&spec, &opts)
        }
        Some(d) => {
            eprintln!(
                "miles run: {name}: {} RL steps, {} and {} rollout engine(s) as worker processes ({:?} launcher, {} transport{}); output in {}",
                spec.steps,
                match spec.train.dp.as_ref().map_or(1, |p| p.ranks) {
                    1 => "trainer".to_string(),
                    n => format!("trainer as {n} data-parallel ranks"),
                },
                d.rollout_workers,
                d.launcher,
                d.transport,
                if d.channel == "auto" { String::new() } else { format!(" over {}", d.channel) },
                out.display()
            );
            crate::distributed::run(&spec, &opts)
        }
    };
    match result {
        Ok(s) if s.interrupted => {
            let at = s.checkpoint.as_ref().map(|c| format!("; its checkpoint is {}", c.display())).unwrap_or_default();
            eprintln!(
                "miles run: interrupted after step {} of {}{at}; `miles run ... --resume` goes on from there",
                s.steps_done, spec.steps
            );
            EXIT_INTERRUPTED
        }
        Ok(s) => {
            let pct = |x: Option<f64>| x.map(|v| format!("{:.1}%", 100.0 * v)).unwrap_or_else(|| "-".into());
            // Episodes say what counted as solved (a setting, issue #42); exact answers need not.
            let rule = if spec.env.is_some() { format!(" ({})", spec.solved_rule()) } else { String::new() };
            eprintln!(
                "miles run: done: {} steps in {:.1} s; held-out accuracy {} -> {}{rule}; last reward {}; metrics in {}",
                s.steps_done,
                s.wall_seconds,
                pct(s.eval_start),
                pct(s.eval_end),
                s.last_reward.map(|r| format!("{r:.3}")).unwrap_or_else(|| "-".into()),
                s.metrics_path.display()
            );
            0
        }
        Err(e) => {
            eprintln!("{e}");
            if e.message.contains("out of memory") {
                if let Some(note) = planned_memory(&out) {
                    eprintln!("  note: {note}");
                }
            }
            1
        }
    }
}

/// Ctrl-C: the first asks the run to stop after the step in progress, with a checkpoint at it; a
/// second stops the process at once (a checkpoint being written is left incomplete, and a resume
/// never uses it).
fn catch_ctrl_c() -> Arc<AtomicBool> {
    let flag = Arc::new(AtomicBool::new(false));
    let set = flag.clone();
    let mut first: Option<Instant> = None;
    let handler = move || match first {
        None => {
            first = Some(Instant::now());
            set.store(true, Ordering::SeqCst);
            eprintln!(
                "\nmiles run: interrupt: finishing the step in progress, then writing a checkpoint (Ctrl-C again \
                 stops at once)"
            );
        }
        Some(t) if t.elapsed() < SAME_CTRL_C => {}
        Some(_) => {
            eprintln!("\nmiles run: stopped at once; the last complete checkpoint is kept");
            // Not `exit`: the run's threads are still inside libtorch, whose static destructors
            // must not run under them.
            #[cfg(unix)]
            // SAFETY: _exit ends the process without running any code of this one.
            unsafe {
                libc::_exit(EXIT_INTERRUPTED as i32)
            }
            #[cfg(not(unix))]
            std::process::exit(EXIT_INTERRUPTED as i32)
        }
    };
    if let Err(e) = ctrlc::set_handler(handler) {
        eprintln!("warning: cannot catch Ctrl-C ({e}): it stops the run at once, without a checkpoint");
    }
    flag
}

/// What the recipe's plan (OUT/plan.json, written by `miles run`) estimated for each stage's
/// memory, set beside an out-of-memory error so the user sees which estimate the run exceeded.
fn planned_memory(out: &std::path::Path) -> Option<String> {
    let plan = crate::saved_plan::load_plan(out).ok()??;
    let rows = plan.get("memory")?.as_array()?;
    let each: Vec<String> = rows
        .iter()
        .filter_map(|r| {
            let gb = r.get("total")?.as_f64()? / 1e9;
            Some(format!("{} {gb:.2} GB", r.get("stage")?.as_str()?))
        })
        .collect();
    (!each.is_empty()).then(|| format!("the plan estimated {} ({})", each.join(", "), out.join("plan.json").display()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_out_of_memory_error_gets_the_plans_estimate_per_stage() {
        let dir = std::env::temp_dir().join(format!("miles-oom-note-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(super::planned_memory(&dir), None, "no plan, no note");
        let plan = r#"{"format_version": 2, "memory": [{"stage": "train", "total": 2500000000}, {"stage": "rollout", "total": 1000000000}]}"#;
        std::fs::write(dir.join("plan.json"), plan).unwrap();
        let note = super::planned_memory(&dir).unwrap();
        assert!(note.starts_with("the plan estimated train 2.50 GB, rollout 1.00 GB ("), "{note}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
