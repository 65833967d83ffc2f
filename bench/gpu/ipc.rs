//! CUDA IPC weight hand-off between two processes on one GPU against a device-to-device copy in
//! one process, same size, same run (issue #19: >= 50%). The parent allocates `--gb` GB (the
//! trainer's weights), exports its IPC handle and starts this binary again as the engine, which
//! opens the handle and copies the buffer into memory of its own (what a colocated engine's weight
//! update does), verifies the first and last 4 KiB, and reports the median of 5 copies.
//!
//!   cargo bench -p miles-cuda --bench ipc -- [--gb 1]      (needs a GPU: bench/gpu/run.sh)

use miles_cuda::ipc::{Gpu, IpcHandle};
use std::io::{BufRead, Write};
use std::process::{Command, Stdio};
use std::time::Instant;

const CHILD: &str = "MILES_IPC_ENGINE";

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Median seconds of 5 copies of `bytes` from `src` to `dst` after a warm-up.
fn time_copies(gpu: &Gpu, dst: u64, src: u64, bytes: usize) -> f64 {
    gpu.copy(dst, src, bytes).expect("warm-up copy");
    median(
        (0..5)
            .map(|_| {
                let t = Instant::now();
                gpu.copy(dst, src, bytes).expect("copy");
                t.elapsed().as_secs_f64()
            })
            .collect(),
    )
}

fn engine(handle: &str, bytes: usize) {
    let gpu = Gpu::open(0).unwrap_or_else(|e| panic!("engine: {e}"));
    let h = IpcHandle::from_hex(handle).expect("a 128-hex-digit handle");
    let theirs = gpu.open_handle(&h, bytes).unwrap_or_else(|e| panic!("engine: {e}"));
    let mine = gpu.alloc(bytes, 0).expect("engine buffer");
    let s = time_copies(&gpu, mine.ptr, theirs.ptr, bytes);
    let ok = [0, bytes - 4096].iter().all(|&o| gpu.read(mine.ptr, o, 4096).expect("read").iter().all(|&b| b == 0x5a));
    println!("{s} {ok}");
}

fn main() {
    if let Ok(v) = std::env::var(CHILD) {
        let (h, b) = v.split_once(' ').expect("handle and size");
        engine(h, b.parse().expect("size"));
        return;
    }
    let args: Vec<String> = std::env::args().collect();
    let gb: f64 = args.windows(2).find(|w| w[0] == "--gb").and_then(|w| w[1].parse().ok()).unwrap_or(1.0);
    let bytes = (gb * 1e9) as usize / 4096 * 4096;
    let gpu = match Gpu::open(0) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("skipped: {e}");
            return;
        }
    };
    let weights = gpu.alloc(bytes, 0x5a).expect("trainer buffer");
    let scratch = gpu.alloc(bytes, 0).expect("reference buffer");
    let reference = time_copies(&gpu, scratch.ptr, weights.ptr, bytes);
    drop(scratch);
    let handle = weights.export().expect("export");
    let mut child = Command::new(std::env::current_exe().expect("exe"))
        .env(CHILD, format!("{} {bytes}", handle.to_hex()))
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the engine process");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("engine output");
    let status = child.wait().expect("engine");
    let mut it = line.split_whitespace();
    let (ipc, ok) = (it.next().and_then(|s| s.parse::<f64>().ok()), it.next() == Some("true"));
    let Some(ipc) = ipc.filter(|_| status.success()) else {
        eprintln!("error: the engine process failed ({status}): {line}");
        std::process::exit(1);
    };
    let gbs = |s: f64| bytes as f64 / s / 1e9;
    println!("| size | in-process device-to-device copy | IPC hand-off to another process | ratio | verified |");
    println!("|---:|---:|---:|---:|---|");
    println!(
        "| {:.2} GB | {:.1} GB/s ({:.2} ms) | {:.1} GB/s ({:.2} ms) | {:.0}% | {ok} |",
        bytes as f64 / 1e9,
        gbs(reference),
        reference * 1e3,
        gbs(ipc),
        ipc * 1e3,
        100.0 * reference / ipc
    );
    println!("(GB/s counts each byte once; a copy reads and writes it, so memory traffic is twice that.)");
    let _ = std::io::stdout().flush();
}
