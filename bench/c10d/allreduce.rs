//! Gloo all-reduce over loopback between ranks that are separate processes, as the trainer's ranks
//! are: this binary is rank 0 (it hosts the c10d store) and spawns itself for ranks 1..N with
//! MILES_C10D_BENCH_RANK set. For each size (MiB) it times all-reduces (sum, f32) on rank 0, each
//! after a barrier, and prints the median and minimum seconds and the algorithmic bandwidth
//! bytes * 2(N-1)/N / seconds in GB/s (1e9 bytes/s): the bytes each rank sends and receives in a
//! ring all-reduce, so the figure is comparable across N. This is the planner's collective
//! bandwidth on a `local` cluster.
//!
//!   cargo bench -p miles-c10d --bench allreduce
//!   MILES_C10D_BENCH_WORLD=4 MILES_C10D_BENCH_SIZES_MB=1,8,64 MILES_C10D_BENCH_ITERS=20 cargo bench ...

use miles_c10d::{GlooDevice, ProcessGroup, ReduceOp, Store};
use std::process::{Child, Command};
use std::time::{Duration, Instant};
use tch::{Kind, Tensor};

const TIMEOUT: Duration = Duration::from_secs(120);
const HOST: &str = "127.0.0.1";

struct Config {
    world: usize,
    sizes_mb: Vec<usize>,
    /// Timed iterations per size; 0 picks by size (more for small tensors).
    iters: usize,
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> Result<T, String> {
    match std::env::var(name) {
        Ok(v) => v.trim().parse().map_err(|_| format!("{name}={v:?} is not a valid value")),
        Err(_) => Ok(default),
    }
}

fn config() -> Result<Config, String> {
    let world = env_or("MILES_C10D_BENCH_WORLD", 2usize)?;
    if world < 2 {
        return Err(format!("MILES_C10D_BENCH_WORLD={world}: an all-reduce needs at least 2 ranks"));
    }
    let sizes = std::env::var("MILES_C10D_BENCH_SIZES_MB").unwrap_or_else(|_| "1,8,64".into());
    let sizes_mb = sizes
        .split(',')
        .map(|s| s.trim().parse::<usize>().ok().filter(|&n| n > 0))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| {
            format!("MILES_C10D_BENCH_SIZES_MB={sizes:?}: expected positive integers separated by commas")
        })?;
    let iters = env_or("MILES_C10D_BENCH_ITERS", 0usize)?;
    Ok(Config { world, sizes_mb, iters })
}

fn iterations(cfg: &Config, mb: usize) -> usize {
    if cfg.iters > 0 {
        cfg.iters
    } else {
        (200 / mb).clamp(10, 100)
    }
}

/// The schedule every rank runs; rank 0 returns the timed seconds per size.
fn run(pg: &ProcessGroup, cfg: &Config) -> Result<Vec<Vec<f64>>, String> {
    let mut out = Vec::new();
    for &mb in &cfg.sizes_mb {
        let bytes = mb << 20;
        let mut t = Tensor::zeros([(bytes / 4) as i64], (Kind::Float, tch::Device::Cpu));
        let mut times = Vec::new();
        for i in 0..(3 + iterations(cfg, mb)) {
            // Fresh ones each time: repeated sums would grow towards inf (or denormals) otherwise.
            let _ = t.fill_(1.0);
            pg.barrier().map_err(|e| e.to_string())?;
            let start = Instant::now();
            pg.all_reduce(&mut t, ReduceOp::Sum).map_err(|e| e.to_string())?;
            if i >= 3 {
                times.push(start.elapsed().as_secs_f64());
            }
        }
        // The reduction actually happened (every element is N).
        let got = t.max().double_value(&[]);
        if got != cfg.world as f64 || t.min().double_value(&[]) != got {
            return Err(format!("all-reduce of {mb} MB gave {got}, expected {}", cfg.world));
        }
        out.push(times);
    }
    Ok(out)
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    }
}

fn child(rank: usize, cfg: &Config) -> Result<(), String> {
    let port = env_or("MILES_C10D_BENCH_PORT", 0u16)?;
    let store = Store::client(HOST, port, TIMEOUT).map_err(|e| e.to_string())?;
    let pg = ProcessGroup::gloo_on(&store, "bench", rank, cfg.world, TIMEOUT, &GlooDevice::Hostname(HOST.into()))
        .map_err(|e| e.to_string())?;
    run(&pg, cfg).map(|_| ())
}

fn wait_children(children: &mut [Child]) -> Result<(), String> {
    let deadline = Instant::now() + TIMEOUT;
    for (i, c) in children.iter_mut().enumerate() {
        loop {
            match c.try_wait().map_err(|e| e.to_string())? {
                Some(status) if status.success() => break,
                Some(status) => return Err(format!("rank {} exited with {status}", i + 1)),
                None if Instant::now() > deadline => {
                    let _ = c.kill();
                    return Err(format!("rank {} did not exit within {TIMEOUT:?}", i + 1));
                }
                None => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }
    Ok(())
}

fn parent(cfg: &Config) -> Result<(), String> {
    let store = Store::server(HOST, 0, TIMEOUT).map_err(|e| e.to_string())?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut children = Vec::new();
    for rank in 1..cfg.world {
        let c = Command::new(&exe)
            .env("MILES_C10D_BENCH_RANK", rank.to_string())
            .env("MILES_C10D_BENCH_PORT", store.port().to_string())
            .spawn()
            .map_err(|e| format!("spawning rank {rank}: {e}"))?;
        children.push(c);
    }
    let result = (|| {
        let pg = ProcessGroup::gloo_on(&store, "bench", 0, cfg.world, TIMEOUT, &GlooDevice::Hostname(HOST.into()))
            .map_err(|e| e.to_string())?;
        run(&pg, cfg)
    })();
    let times = match result {
        Ok(t) => t,
        Err(e) => {
            for c in &mut children {
                let _ = c.kill();
            }
            return Err(e);
        }
    };
    wait_children(&mut children)?;
    let n = cfg.world as f64;
    println!(
        "gloo all-reduce (sum, f32) through libtorch's c10d, {} ranks as processes over loopback ({HOST})",
        cfg.world
    );
    // Median: what a step sees on a shared machine; min: the uncontended figure.
    println!(
        "{:>8} {:>6} {:>12} {:>12} {:>14} {:>14}",
        "size", "iters", "median s", "min s", "algbw GB/s", "at min GB/s"
    );
    for (&mb, ts) in cfg.sizes_mb.iter().zip(times) {
        let bytes = (mb << 20) as f64;
        let iters = ts.len();
        let min = ts.iter().copied().fold(f64::INFINITY, f64::min);
        let med = median(ts);
        let algbw = |secs: f64| bytes * 2.0 * (n - 1.0) / n / secs / 1e9;
        println!("{:>4} MiB {iters:>6} {med:>12.6} {min:>12.6} {:>14.3} {:>14.3}", mb, algbw(med), algbw(min));
    }
    Ok(())
}

fn main() {
    let cfg = match config() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("allreduce bench: {e}");
            std::process::exit(2);
        }
    };
    let result = match std::env::var("MILES_C10D_BENCH_RANK") {
        Ok(rank) => match rank.parse::<usize>() {
            Ok(r) if r >= 1 && r < cfg.world => child(r, &cfg).map_err(|e| format!("rank {r}: {e}")),
            _ => Err(format!("MILES_C10D_BENCH_RANK={rank:?} is not a rank in 1..{}", cfg.world)),
        },
        Err(_) => parent(&cfg),
    };
    if let Err(e) = result {
        eprintln!("allreduce bench: {e}");
        std::process::exit(1);
    }
}
