//! Compiles .miles files in process, N times, and prints the median: the compiler's own time,
//! without the `miles` binary's start-up (bench/compiler/run.sh reports both).
//!
//! `cargo run --release -p miles-compiler --example check_files -- FILE [RUNS]`

use miles_compiler::fs::FileSystem;
use miles_compiler::{compile, Options};
use std::time::Instant;

struct Disk;

impl FileSystem for Disk {
    fn read(&self, path: &str) -> Result<Vec<u8>, String> {
        std::fs::read(path).map_err(|e| e.to_string())
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(file) = args.first() else {
        eprintln!("usage: check_files FILE [RUNS]");
        std::process::exit(2);
    };
    let runs: usize = args.get(1).and_then(|r| r.parse().ok()).unwrap_or(15);
    let mut times = Vec::with_capacity(runs);
    let mut diags = 0;
    for _ in 0..runs {
        let t = Instant::now();
        let c = compile(&Disk, std::slice::from_ref(file), &Options::default());
        times.push(t.elapsed().as_secs_f64() * 1000.0);
        diags = c.diagnostics.len();
    }
    times.sort_by(|a, b| a.total_cmp(b));
    println!(
        "in-process compile: median {:.2} ms (min {:.2}, max {:.2}) over {runs} runs, {diags} diagnostic(s)",
        times[runs / 2],
        times[0],
        times[runs - 1]
    );
}
