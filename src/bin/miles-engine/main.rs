//! `miles-engine`: the half of miles that links libtorch. `miles run`, `miles worker` and
//! `miles serve` hand their work to it, so `miles check` and the other language verbs never pay
//! libtorch's ~0.5 s load time. Not meant to be called by hand (it takes a compiled run spec,
//! not a recipe), though nothing stops you.

mod diffuse;
mod distributed;
mod execute;
#[path = "../../saved_plan.rs"]
mod saved_plan;
mod worker;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "miles-engine",
    version,
    about = "The libtorch side of miles: runs compiled run specs, workers and the HTTP rollout API"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Execute a run spec (what `miles run` compiles a recipe into).
    Run(execute::Args),
    /// Execute a diffusion run spec (what `miles run` compiles a diffusion recipe into).
    Diffuse(diffuse::Args),
    /// A diffusion run's reward stage as a worker process (started by `diffuse`).
    ImageReward(diffuse::RewardArgs),
    /// On-policy distillation's teacher as a worker process (started by the trainer).
    Teacher(worker::TeacherArgs),
    /// Host one stage instance for a controller (started by a launcher).
    Worker(worker::Args),
    /// Serve a model directory through the SGLang-compatible HTTP API.
    Serve(worker::ServeArgs),
}

/// libtorch's CPU tensors come from glibc malloc. By default a block over the dynamic mmap
/// threshold is mmapped, and freed memory at the top of the heap is trimmed; each training pass then
/// frees and re-faults its activations, and zeroing the fresh pages cost 7-12% of a 10M GRPO step
/// (bench/RESULTS.md "bf16 GEMMs on the CPU"). Blocks up to 32 MB now come from the heap, which is
/// kept up to 1 GB of free memory and grown in 64 MB steps.
fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets allocator parameters; called before any thread starts.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
        libc::mallopt(libc::M_TOP_PAD, 64 << 20);
    }
}

fn main() -> ExitCode {
    keep_freed_memory();
    let cli = Cli::parse();
    // A child that answers its parent on stdout (a teacher, an image reward) ends quietly when the
    // parent is gone. Every other command keeps SIGPIPE ignored: a run writes to children of its
    // own (teachers, rewards, environments), and one killed mid-write must be an error the run
    // handles (restart, name it), not a signal that kills the run.
    #[cfg(unix)]
    if matches!(cli.command, Command::Teacher(_) | Command::ImageReward(_)) {
        // SAFETY: restoring the default disposition of one signal before any thread starts.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    let code = match cli.command {
        Command::Run(a) => execute::run(a),
        Command::Diffuse(a) => diffuse::run(a),
        Command::ImageReward(a) => diffuse::reward_worker(a),
        Command::Teacher(a) => worker::teacher(a),
        Command::Worker(a) => worker::run(a),
        Command::Serve(a) => worker::serve(a),
    };
    ExitCode::from(code)
}
