//! `miles serve` under load (issue #35): 100 clients sending well-formed `/generate` requests back
//! to back, one hostile request a second (a huge `n`, a huge body declared or chunked, a slow
//! body, a huge `max_new_tokens`, a foreign Host), and a prober timing `GET /health`, for a bounded
//! time. Prints the figures bench/RESULTS.md records and whether the acceptance holds: /health
//! p99 within 50 ms and no well-formed request lost.
//!
//! `bash bench/serve-load/run.sh [SECONDS]` trains the tiny model, serves it and runs this; by hand:
//! `cargo bench -p miles-workers --bench serve-load -- --url http://127.0.0.1:PORT [--seconds 60]
//! [--clients 100] [--prompt 5,6,12,7,13] [--n 4] [--max-new-tokens 3] [--slow-body-for 40]`.

mod driver;

use std::time::Duration;

fn main() {
    match parse(std::env::args().skip(1).collect()) {
        Ok(cfg) => {
            let r = driver::run(&cfg);
            println!("{}", r.markdown(&cfg));
            let p99 = r.health_quantile(0.99);
            let lost = r.well_formed_sent - r.well_formed_ok;
            let refused = r.hostile.iter().all(|h| h.expected.contains(&h.status));
            let pass = p99 <= Duration::from_millis(50) && lost == 0 && r.health_failed == 0 && refused;
            println!(
                "acceptance (/health p99 <= 50 ms, no well-formed request lost, every hostile one refused): {}",
                if pass { "PASS" } else { "FAIL" }
            );
            std::process::exit(if pass { 0 } else { 1 });
        }
        Err(e) => {
            eprintln!("serve-load: {e}");
            std::process::exit(2);
        }
    }
}

fn parse(args: Vec<String>) -> Result<driver::Config, String> {
    let mut cfg: Option<driver::Config> = None;
    let mut rest: Vec<(String, String)> = Vec::new();
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        // `cargo bench` adds `--bench`.
        if a == "--bench" {
            continue;
        }
        let v = it.next().ok_or_else(|| format!("{a} wants a value"))?;
        match a.as_str() {
            "--url" => cfg = Some(driver::Config::new(&v)),
            _ => rest.push((a, v)),
        }
    }
    let mut cfg = cfg.ok_or("--url http://HOST:PORT of a running `miles serve` is required")?;
    let num = |a: &str, v: &str| v.parse::<u64>().map_err(|_| format!("{a}: {v} is not a whole number"));
    for (a, v) in rest {
        match a.as_str() {
            "--seconds" => cfg.duration = Duration::from_secs(num(&a, &v)?),
            "--clients" => cfg.clients = num(&a, &v)? as usize,
            "--n" => cfg.n = num(&a, &v)?,
            "--max-new-tokens" => cfg.max_new_tokens = num(&a, &v)?,
            "--slow-body-for" => cfg.slow_body_for = Duration::from_secs(num(&a, &v)?),
            "--prompt" => {
                cfg.prompt = v.split(',').map(|t| num(&a, t.trim()).map(|x| x as u32)).collect::<Result<_, _>>()?
            }
            _ => return Err(format!("unknown argument {a}")),
        }
    }
    Ok(cfg)
}
