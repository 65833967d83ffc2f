//! The recipe's `launcher` setting and first `weights` stage as the distributed part of the run
//! spec, or the rollout servers a recipe names by URL.

use super::Mapper;
use miles_compiler::job::read::Fields;
use miles_compiler::job::SyncJob;
use miles_compiler::value::Record;
use miles_runtime::distributed::{DistributedSpec, LauncherSpec, WorkerFailure};

/// None for `in_process` without servers by URL (servers by URL with a launcher were refused by
/// `capability::shape`).
pub(super) fn distributed(m: &Mapper, engine_urls: Vec<String>) -> Option<DistributedSpec> {
    let launcher = m.recipe.settings.as_record().and_then(|s| s.record("launcher"));
    let distributed = launcher.and_then(|l| launcher_spec(l, m.job().syncs.first()));
    if engine_urls.is_empty() {
        return distributed;
    }
    Some(DistributedSpec {
        launcher: LauncherSpec::InProcess,
        rollout_workers: engine_urls.len(),
        transport: "disk".into(),
        channel: "auto".into(),
        bucket_bytes: 0,
        verify_full: false,
        on_worker_failure: Default::default(),
        call_timeout_s: 600.0,
        start_timeout_s: 0.0,
        heartbeat_timeout_s: 0.0,
        bind_host: "127.0.0.1".into(),
        threads: 0,
        engine_urls,
    })
}

fn launcher_spec(l: &Record, sync: Option<&SyncJob>) -> Option<DistributedSpec> {
    let int = |name: &str, default: i64| l.value(name).and_then(|v| v.as_i64()).unwrap_or(default).max(0);
    let opt_str = |name: &str| l.str(name).map(str::to_string);
    let launcher = match l.schema_name.as_str() {
        "local_processes" => LauncherSpec::LocalProcesses { cpus_per_worker: int("cpus_per_worker", 0) as usize },
        "slurm" => LauncherSpec::Slurm {
            partition: opt_str("partition"),
            time_limit: opt_str("time_limit"),
            gpus_per_engine: int("gpus_per_engine", 0) as u32,
            gpus_per_trainer: int("gpus_per_trainer", 0) as u32,
            cpus_per_worker: int("cpus_per_worker", 1) as usize,
        },
        "ray" => LauncherSpec::Ray {
            address: opt_str("address").unwrap_or_default(),
            gpus_per_engine: int("gpus_per_engine", 0) as u32,
            gpus_per_trainer: int("gpus_per_trainer", 0) as u32,
        },
        _ => return None,
    };
    Some(DistributedSpec {
        launcher,
        rollout_workers: int("engines", 1).max(1) as usize,
        transport: sync.map_or("broadcast", |s| s.transport.value.as_str()).to_string(),
        channel: sync.map_or("auto", |s| s.channel.as_str()).to_string(),
        bucket_bytes: sync.map_or(512 << 20, |s| s.bucket.value.max(65536)),
        verify_full: sync.is_some_and(|s| s.verify_full),
        on_worker_failure: if l.member("on_failure").map(|f| f.value) == Some("drop_engine") {
            WorkerFailure::Continue
        } else {
            WorkerFailure::Stop
        },
        call_timeout_s: int("call_timeout", 600) as f64,
        start_timeout_s: int("start_timeout", 120) as f64,
        heartbeat_timeout_s: 15.0,
        bind_host: opt_str("bind").unwrap_or_else(|| "127.0.0.1".into()),
        threads: 0,
        engine_urls: Vec::new(),
    })
}
