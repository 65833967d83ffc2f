//! Runs a diffusion RL spec (engine/tch/src/diffusion/run.rs) until `miles run` maps diffusion
//! recipes: `diffusion_run SPEC.json OUT_DIR [--threads N] [--seed N] [--streaming true|false]`.
//! Prints the summary as JSON.

use miles_tch::diffusion::run::{run, DiffusionRunSpec};
use std::path::PathBuf;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: diffusion_run SPEC.json OUT_DIR [--threads N] [--seed N] [--streaming true|false]";
    if args.len() < 2 {
        eprintln!("{usage}");
        std::process::exit(2);
    }
    let text = match std::fs::read_to_string(&args[0]) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: cannot read {}: {e}", args[0]);
            std::process::exit(1);
        }
    };
    let mut spec: DiffusionRunSpec = match serde_json::from_str(&text) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {}: {e}", args[0]);
            std::process::exit(1);
        }
    };
    let mut threads = None;
    let mut it = args[2..].iter();
    while let Some(a) = it.next() {
        let v = it.next().cloned().unwrap_or_default();
        match a.as_str() {
            "--threads" => threads = v.parse().ok(),
            "--seed" => spec.seed = v.parse().unwrap_or(spec.seed),
            "--streaming" => spec.streaming = v == "true",
            _ => {
                eprintln!("{usage}");
                std::process::exit(2);
            }
        }
    }
    match run(&spec, &PathBuf::from(&args[1]), threads) {
        Ok(s) => println!("{}", serde_json::to_string(&s).unwrap_or_default()),
        Err(e) => {
            eprintln!("error[{}]: {}", e.code, e.message);
            std::process::exit(1);
        }
    }
}
