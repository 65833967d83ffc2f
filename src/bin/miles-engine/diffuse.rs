//! `miles-engine diffuse`: executes a diffusion run spec (what `miles run` compiles a diffusion
//! recipe into) on the embedded backend, in this process, and prints the outcome.

use miles_runtime::diffusion::DiffusionRunSpec;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// The diffusion run spec as JSON; `-` reads it from standard input.
    #[arg(long)]
    pub spec: String,
    /// The recipe's name, for messages.
    #[arg(long, default_value = "run")]
    pub name: String,
    #[arg(long)]
    pub out: PathBuf,
    #[arg(long)]
    pub threads: Option<usize>,
}

pub fn run(args: Args) -> u8 {
    let Some(text) = crate::execute::read_spec(&args.spec) else { return 1 };
    let spec: DiffusionRunSpec = match serde_json::from_str(&text) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error[E0504]: not a diffusion run spec: {e}");
            return 1;
        }
    };
    // A finished or running run is not overwritten: its metrics and grids would be mixed.
    if args.out.join("metrics.jsonl").exists() {
        eprintln!(
            "error[E0504]: {} already holds a run (metrics.jsonl); choose another --out or remove it",
            args.out.display()
        );
        return 1;
    }
    eprintln!(
        "miles run: {}: diffusion RL, {} pretraining steps then {} RL steps of {} images on the embedded backend; output in {}",
        args.name,
        spec.pretrain.steps,
        spec.rl.steps,
        spec.rl.conditions_per_step * spec.rl.samples_per_condition,
        args.out.display()
    );
    if let Err(e) = std::fs::create_dir_all(&args.out) {
        eprintln!("error[E0504]: cannot create {}: {e}", args.out.display());
        return 1;
    }
    if let Err(e) = miles_runtime::exec::write_json(&args.out.join("spec.json"), &spec) {
        eprintln!("{e}");
        return 1;
    }
    match miles_tch::diffusion::run::run(&spec, &args.out, args.threads) {
        Ok(s) => {
            let pct = |x: f64| if x.is_finite() { format!("{:.1}%", 100.0 * x) } else { "-".into() };
            eprintln!(
                "miles run: done: {} RL steps in {:.1} s; held-out reward {:.3} -> {:.3}; judge accuracy {} -> {}; metrics in {}, sample grids in {}",
                s.steps_done,
                s.wall_seconds,
                s.eval_start,
                s.eval_end,
                pct(s.judge_start),
                pct(s.judge_end),
                args.out.join("metrics.jsonl").display(),
                args.out.join("grids").display()
            );
            0
        }
        Err(e) => {
            eprintln!("{e}");
            1
        }
    }
}

#[derive(clap::Args)]
pub struct RewardArgs {
    /// The worker's configuration as JSON (the classifier directory, image size, reward terms).
    #[arg(long)]
    pub config: String,
}

/// `miles-engine image-reward`: a diffusion run's reward stage as a worker process, answering JSON
/// lines on stdin with JSON lines on stdout (engine/tch/src/diffusion/reward_stage.rs).
pub fn reward_worker(args: RewardArgs) -> u8 {
    let config: miles_tch::diffusion::reward_stage::WorkerConfig = match serde_json::from_str(&args.config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error[E0504]: not a reward worker configuration: {e}");
            return 1;
        }
    };
    match miles_tch::diffusion::reward_stage::worker_main(&config) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("{e}");
            1
        }
    }
}
