//! The small command line shared by `examples/run_spec.rs` and the `miles-tch-run` binary (which
//! the resume test kills with SIGKILL): run a RunSpec JSON file on the embedded backend.

use miles_runtime::{ProgressMode, RunOptions, RunSpec};
use std::path::PathBuf;

const USAGE: &str = "usage: run_spec SPEC.json OUT_DIR [--resume] [--stop-after N] [--threads N] \
[--plain|--quiet] [--seed N] [--steps N]";

/// Parses args, runs, prints the summary as JSON on stdout. Returns the process exit code.
pub fn main_with_args(args: &[String]) -> i32 {
    match run_args(args) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("{e}");
            1
        }
    }
}

fn run_args(args: &[String]) -> Result<(), String> {
    let mut pos = Vec::new();
    let mut resume = false;
    let mut stop_after = None;
    let mut threads = None;
    let mut progress = ProgressMode::Auto;
    let mut seed = None;
    let mut steps = None;
    let mut it = args.iter();
    let num = |v: Option<&String>, flag: &str| -> Result<u64, String> {
        v.and_then(|s| s.parse().ok()).ok_or_else(|| format!("{flag} needs a number\n{USAGE}"))
    };
    while let Some(a) = it.next() {
        match a.as_str() {
            "--resume" => resume = true,
            "--stop-after" => stop_after = Some(num(it.next(), a)?),
            "--threads" => threads = Some(num(it.next(), a)? as usize),
            "--seed" => seed = Some(num(it.next(), a)?),
            "--steps" => steps = Some(num(it.next(), a)?),
            "--plain" => progress = ProgressMode::Plain,
            "--quiet" => progress = ProgressMode::Off,
            "-h" | "--help" => return Err(USAGE.to_string()),
            s if s.starts_with("--") => return Err(format!("unknown option {s}\n{USAGE}")),
            _ => pos.push(a.clone()),
        }
    }
    let [spec_path, out] = pos.as_slice() else {
        return Err(USAGE.to_string());
    };
    let text = std::fs::read_to_string(spec_path).map_err(|e| format!("{spec_path}: {e}"))?;
    let mut spec = RunSpec::from_json(&text).map_err(|e| e.to_string())?;
    if let Some(s) = seed {
        spec.seed = s;
    }
    if let Some(s) = steps {
        spec.steps = s;
    }
    let mut opts = RunOptions::new(PathBuf::from(out));
    opts.resume = resume;
    opts.stop_after = stop_after;
    opts.threads = threads;
    opts.progress = progress;
    let summary = crate::run(&spec, &opts).map_err(|e| e.to_string())?;
    println!("{}", serde_json::to_string(&summary).unwrap_or_else(|_| "{}".into()));
    Ok(())
}
