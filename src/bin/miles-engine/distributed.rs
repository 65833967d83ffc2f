//! `miles run` of a recipe with a `launcher`: the executor runs here (the controller), the stages
//! in worker processes started by the launcher (engine/workers).

use miles_runtime::{RunError, RunOptions, RunSpec, Summary, E_SPEC};

pub fn run(spec: &RunSpec, opts: &RunOptions) -> Result<Summary, RunError> {
    let exe = std::env::current_exe()
        .map_err(|e| RunError::new(E_SPEC, format!("cannot find the miles binary to start workers with: {e}")))?;
    // Workers and their logs live under the output directory, which must exist first; an absolute
    // path, because Slurm steps may start elsewhere.
    std::fs::create_dir_all(&opts.out_dir).map_err(|e| RunError::io(E_SPEC, "cannot create", &opts.out_dir, e))?;
    let out =
        std::fs::canonicalize(&opts.out_dir).map_err(|e| RunError::io(E_SPEC, "cannot resolve", &opts.out_dir, e))?;
    let mut o = opts.clone();
    o.out_dir = out.clone();
    if let Some(d) = spec.distributed.as_ref().filter(|d| !d.engine_urls.is_empty()) {
        let backend = HttpBackend {
            urls: d.engine_urls.clone(),
            weights_dir: out.join("weights-http"),
            timeout: d.call_timeout_s,
        };
        return miles_runtime::run_with(spec, &o, &backend);
    }
    // The teacher stage runs here, beside the executor (or in a worker process of its own).
    let backend = miles_workers::backend::WorkersBackend::new(exe, out)
        .with_teacher(Box::new(|s: &RunSpec| miles_runtime::Backend::teacher(&miles_tch::TchBackend, s)))
        .with_store_host(Box::new(host_store));
    let res = miles_runtime::run_with(spec, &o, &backend);
    if let Some(f) = backend.fleet.lock().unwrap_or_else(|p| p.into_inner()).take() {
        let f = f.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(r) = &f.last_report {
            eprintln!(
                "miles run: last weight update: {} v{}: {:.1} MB to {} engine(s) in {:.3} s ({:.2} GB/s); all updates in sync.jsonl",
                r.transport,
                r.version,
                r.bytes as f64 / 1e6,
                r.targets,
                r.seconds,
                r.gb_per_s
            );
        }
        for e in &f.events {
            eprintln!("miles run: event: {e}");
        }
    }
    res
}

/// Hosts a data-parallel trainer's c10d TCPStore here, in the controller, as torchrun's agent
/// does: a rank's death never takes the rendezvous with it. Bound on the launcher's address, a
/// free port; an unspecified address (0.0.0.0) is advertised as this host's name.
fn host_store(bind: &str, timeout: std::time::Duration) -> Result<(String, Box<dyn std::any::Any + Send>), RunError> {
    let store = miles_c10d::Store::server(bind, 0, timeout).map_err(|e| {
        RunError::new(
            miles_workers::E_LAUNCH,
            format!("cannot host the data-parallel trainer's c10d store on {bind}: {e}"),
        )
    })?;
    let ip: Option<std::net::IpAddr> = bind.parse().ok();
    let host = match ip {
        Some(ip) if ip.is_unspecified() => miles_workers::worker::hostname(),
        _ => bind.to_string(),
    };
    // host:port, split at the last colon by the ranks (an IPv6 host keeps its colons).
    Ok((format!("{host}:{}", store.port()), Box::new(store)))
}

/// The trainer here, the rollout on SGLang-compatible servers (`miles serve` or SGLang): weights
/// reach them as a checkpoint directory and `/update_weights_from_disk`.
struct HttpBackend {
    urls: Vec<String>,
    weights_dir: std::path::PathBuf,
    timeout: f64,
}

impl miles_runtime::Backend for HttpBackend {
    fn name(&self) -> &'static str {
        "http"
    }
    fn set_threads(&self, threads: Option<usize>) {
        miles_tch::TchBackend.set_threads(threads)
    }
    fn teacher(&self, spec: &RunSpec) -> Result<Box<dyn miles_runtime::TeacherScorer>, RunError> {
        miles_tch::TchBackend.teacher(spec)
    }
    fn create(&self, spec: &RunSpec) -> Result<miles_runtime::EngineAndTrainer, RunError> {
        let (_, trainer) = miles_tch::TchBackend.create(spec)?;
        Ok((Box::new(self.engine(spec)?), trainer))
    }

    /// The asynchronous schedules: the servers generate on the executor's generation thread
    /// (every queued group in one request round) while the trainer here trains; each update
    /// reaches them as a checkpoint directory, as under the sync schedule.
    fn create_async(&self, spec: &RunSpec) -> Result<Option<miles_runtime::AsyncParts>, RunError> {
        let Some(a) = spec.async_schedule() else {
            return Ok(None);
        };
        if spec.eval.mode == miles_runtime::EvalMode::Snapshot {
            return Err(miles_workers::backend::snapshot_refused(self.name()));
        }
        let (_, trainer) = miles_tch::TchBackend.create(spec)?;
        Ok(Some(miles_runtime::AsyncParts {
            engine: Box::new(miles_runtime::stream::BatchedStream::new(self.engine(spec)?, a.max_concurrent)),
            trainer,
            eval_engine: None,
        }))
    }
}

impl HttpBackend {
    /// A policy from an `hf` directory sends that directory's config.json with each update.
    fn engine(&self, spec: &RunSpec) -> Result<miles_workers::http::HttpEngine, RunError> {
        miles_workers::http::HttpEngine::new(
            self.urls.clone(),
            self.weights_dir.clone(),
            spec.model.clone(),
            std::time::Duration::from_secs_f64(self.timeout.max(1.0)),
        )
        .with_source(spec.hf.as_ref().map(|h| h.path.as_path()))
    }
}
