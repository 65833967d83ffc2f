//! `WorkersBackend`: a `miles_runtime::Backend` whose rollout engines and trainer are worker
//! processes. The synchronous executor runs unchanged on top of it: `create` starts the
//! controller, launches the workers, waits for them to register and initialises them.

use crate::auth::new_token;
use crate::launcher::{LaunchEnv, Launcher, LocalLauncher, RayLauncher, SlurmLauncher, WorkerLaunch};
use crate::remote::{
    Controller, Deadlines, DpGroup, Fleet, OnFailure, RemoteEngine, RemoteTeacher, RemoteTrainer, SharedFleet,
};
use crate::{E_LAUNCH, E_WORKER};
use miles_runtime::distributed::{DistributedSpec, LauncherSpec, WorkerFailure};
use miles_runtime::stream::BatchedStream;
use miles_runtime::{
    AsyncParts, Backend, EngineAndTrainer, EvalMode, RolloutEngine, RunError, RunSpec, TeacherScorer, Trainer,
};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub struct WorkersBackend {
    /// The `miles` binary the workers run.
    pub exe: PathBuf,
    pub out_dir: PathBuf,
    threads: Mutex<Option<usize>>,
    /// The fleet of the last `create`, for reports after the run.
    pub fleet: Mutex<Option<SharedFleet>>,
    /// Builds a distilling run's teacher stage in the controller's process (a compute backend's).
    teacher: Option<TeacherFactory>,
    /// Serves the c10d store a data-parallel trainer's ranks meet at (a compute backend's).
    store_host: Option<StoreHost>,
}

/// How the controller hosts the c10d TCPStore of a data-parallel trainer (this crate links no
/// libtorch): given the address to bind and the rendezvous timeout, the store's `host:port` and a
/// guard that serves it until dropped.
pub type StoreHost =
    Box<dyn Fn(&str, Duration) -> Result<(String, Box<dyn std::any::Any + Send>), RunError> + Send + Sync>;

/// How the controller builds a teacher stage: this crate runs no model itself.
pub type TeacherFactory = Box<dyn Fn(&RunSpec) -> Result<Box<dyn TeacherScorer>, RunError> + Send + Sync>;

impl WorkersBackend {
    pub fn new(exe: PathBuf, out_dir: PathBuf) -> Self {
        WorkersBackend {
            exe,
            out_dir,
            threads: Mutex::new(None),
            fleet: Mutex::new(None),
            teacher: None,
            store_host: None,
        }
    }

    pub fn with_store_host(mut self, f: StoreHost) -> Self {
        self.store_host = Some(f);
        self
    }

    pub fn with_teacher(mut self, f: TeacherFactory) -> Self {
        self.teacher = Some(f);
        self
    }
}

/// The worker processes of a run: trainer-0..N-1 (a data-parallel trainer's ranks, in rank order;
/// one without `train.dp`), then rollout-0..n, then teacher-0 when the run's teacher stage (named
/// `teacher`) runs in a worker of its own. Every launcher starts this list as it is.
pub fn plan_workers(d: &DistributedSpec, trainers: usize, threads: usize, teacher: Option<&str>) -> Vec<WorkerLaunch> {
    let (cpus_per, gpus_engine, gpus_trainer) = match &d.launcher {
        LauncherSpec::LocalProcesses { cpus_per_worker } => (*cpus_per_worker, 0, 0),
        LauncherSpec::Slurm { cpus_per_worker, gpus_per_engine, gpus_per_trainer, .. } => {
            (*cpus_per_worker, *gpus_per_engine, *gpus_per_trainer)
        }
        LauncherSpec::Ray { gpus_per_engine, gpus_per_trainer, .. } => (0, *gpus_per_engine, *gpus_per_trainer),
        LauncherSpec::InProcess => (0, 0, 0),
    };
    let ncpu = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let mut next = 0usize;
    let mut cpus = |n: usize| -> Vec<usize> {
        // Round-robin over this machine's CPUs: with more workers than CPUs they share.
        (0..n)
            .map(|_| {
                let c = next % ncpu;
                next += 1;
                c
            })
            .collect()
    };
    let mut v: Vec<WorkerLaunch> = (0..trainers.max(1))
        .map(|r| WorkerLaunch {
            worker_id: format!("trainer-{r}"),
            role: "trainer".into(),
            stage: "train".into(),
            cpus: cpus(cpus_per),
            gpus: gpus_trainer,
            threads: threads as u32,
        })
        .collect();
    for i in 0..d.rollout_workers.max(1) {
        v.push(WorkerLaunch {
            worker_id: format!("rollout-{i}"),
            role: "rollout".into(),
            stage: "rollout".into(),
            cpus: cpus(cpus_per),
            gpus: gpus_engine,
            threads: threads as u32,
        });
    }
    if let Some(stage) = teacher {
        v.push(WorkerLaunch {
            worker_id: "teacher-0".into(),
            role: "teacher".into(),
            stage: stage.into(),
            cpus: cpus(cpus_per),
            gpus: 0,
            threads: threads as u32,
        });
    }
    v
}

/// The teacher stage to launch as a worker: a distilling run's with `process = true`.
fn teacher_worker(spec: &RunSpec) -> Option<&str> {
    spec.train.opd.as_ref().filter(|o| o.process).map(|o| o.stage.as_str())
}

impl Backend for WorkersBackend {
    /// A teacher stage with `process = true` is the fleet's teacher worker (launched with the
    /// others by `create`); otherwise it runs here, in the controller's process.
    fn teacher(&self, spec: &RunSpec) -> Result<Box<dyn TeacherScorer>, RunError> {
        if teacher_worker(spec).is_some() {
            let fleet = self.fleet.lock().unwrap_or_else(|p| p.into_inner()).clone();
            let fleet = fleet
                .ok_or_else(|| RunError::new(E_LAUNCH, "the teacher worker is asked for before the fleet starts"))?;
            return Ok(Box::new(RemoteTeacher::new(fleet, spec.rollout.temperature)));
        }
        match &self.teacher {
            Some(f) => f(spec),
            None => Err(RunError::new(E_LAUNCH, "this controller was built without a teacher stage")),
        }
    }

    fn name(&self) -> &'static str {
        "workers"
    }

    fn set_threads(&self, threads: Option<usize>) {
        *self.threads.lock().unwrap_or_else(|p| p.into_inner()) = threads;
    }

    fn create(&self, spec: &RunSpec) -> Result<EngineAndTrainer, RunError> {
        let fleet = self.start_fleet(spec)?;
        Ok((
            Box::new(RemoteEngine::new(fleet.clone())) as Box<dyn RolloutEngine>,
            Box::new(RemoteTrainer::new(fleet)) as Box<dyn Trainer>,
        ))
    }

    /// The asynchronous schedules on the same fleet: the generation thread drives the engines
    /// through a batching adapter (each engine step sends every queued group, spread over the
    /// engines at once) while the trainer's thread trains and publishes weights; calls to the
    /// fleet never hold it while in flight. Snapshot evaluation needs a second engine copy that a
    /// fleet does not have (refused at check).
    fn create_async(&self, spec: &RunSpec) -> Result<Option<AsyncParts>, RunError> {
        let Some(a) = spec.async_schedule() else {
            return Ok(None);
        };
        if spec.eval.mode == EvalMode::Snapshot {
            return Err(snapshot_refused(self.name()));
        }
        let fleet = self.start_fleet(spec)?;
        Ok(Some(AsyncParts {
            engine: Box::new(BatchedStream::new(RemoteEngine::new(fleet.clone()), a.max_concurrent)),
            trainer: Box::new(RemoteTrainer::new(fleet)),
            eval_engine: None,
        }))
    }
}

/// Snapshot evaluation (`eval.mode = snapshot`) under an asynchronous schedule evaluates on a
/// second in-process engine; a backend whose engines are elsewhere has none.
pub fn snapshot_refused(backend: &str) -> RunError {
    RunError::new(
        miles_runtime::E_SPEC,
        format!("the `{backend}` backend has no second engine for eval.mode = snapshot under an asynchronous schedule"),
    )
    .with_help("set eval.mode = shared: the rollout engines evaluate between two of their steps")
}

impl WorkersBackend {
    /// Starts the controller, launches the workers, waits for them to register and initialises
    /// them.
    fn start_fleet(&self, spec: &RunSpec) -> Result<SharedFleet, RunError> {
        let d = spec
            .distributed
            .clone()
            .ok_or_else(|| RunError::new(E_LAUNCH, "the distributed backend needs `distributed` in the run spec"))?;
        let threads = match d.threads {
            0 => self.threads.lock().unwrap_or_else(|p| p.into_inner()).unwrap_or(0),
            n => n,
        };
        let token = new_token().map_err(|e| RunError::new(E_LAUNCH, format!("cannot make a run token: {e}")))?;
        let controller = Controller::start(&format!("{}:0", d.bind_host), &token, None)?;
        let mut launcher: Box<dyn Launcher> = match &d.launcher {
            LauncherSpec::LocalProcesses { .. } => Box::new(LocalLauncher::default()),
            LauncherSpec::Slurm { partition, time_limit, .. } => {
                let mut l = SlurmLauncher::new(partition.clone());
                l.time_limit = time_limit.clone();
                Box::new(l)
            }
            LauncherSpec::Ray { address, .. } => Box::new(RayLauncher::new(address)),
            LauncherSpec::InProcess => {
                return Err(RunError::new(E_LAUNCH, "an in-process launcher starts no workers"));
            }
        };
        let ranks = spec.train.dp.as_ref().map_or(1, |p| p.ranks.max(1));
        // The rendezvous is up before any rank starts; it lives as long as the fleet.
        let store = match (ranks > 1, &self.store_host) {
            (false, _) => None,
            (true, Some(host)) => {
                let timeout = spec.train.dp.as_ref().map_or(120.0, |p| p.timeout_s);
                Some(host(&d.bind_host, Duration::from_secs_f64(timeout.max(1.0)))?)
            }
            (true, None) => {
                return Err(RunError::new(
                    E_LAUNCH,
                    "this controller cannot host a data-parallel trainer's c10d store (it was built with no store host)",
                ));
            }
        };
        let workers = plan_workers(&d, ranks, threads, teacher_worker(spec));
        let env = LaunchEnv {
            exe: self.exe.clone(),
            controller: controller.addr.clone(),
            token,
            out_dir: self.out_dir.clone(),
            bind_host: d.bind_host.clone(),
            tls: controller.tls,
        };
        launcher.launch(&env, &workers)?;
        let ids: Vec<String> = workers.iter().map(|w| w.worker_id.clone()).collect();
        let regs = match controller.wait_for(&ids, Duration::from_secs_f64(d.start_timeout_s), || launcher.dead()) {
            Ok(r) => r,
            Err(mut e) => {
                launcher.stop();
                if ranks > 1 {
                    // Which of them are the trainer's ranks, and what waits on them.
                    e.message.push_str(&format!(
                        " (trainer-0..trainer-{} are the trainer's {ranks} data-parallel ranks: every rank must \
                         join before training starts)",
                        ranks - 1
                    ));
                }
                return Err(e);
            }
        };
        eprintln!(
            "miles run: {} workers up ({}): {}",
            regs.len(),
            launcher.name(),
            regs.iter().map(|r| format!("{}@{}", r.worker_id, r.host)).collect::<Vec<_>>().join(", ")
        );
        let deadlines = Deadlines {
            call: Duration::from_secs_f64(d.call_timeout_s.max(1.0)),
            short: Duration::from_secs(30),
            heartbeat: Duration::from_secs_f64(d.heartbeat_timeout_s.max(1.0)),
        };
        let mut remotes = Vec::new();
        for r in regs {
            remotes.push(Fleet::connect(&controller, r, &deadlines)?);
        }
        let teacher = match remotes.last().is_some_and(|r| r.reg.worker_id == "teacher-0") {
            true => remotes.pop(),
            false => None,
        };
        let mut trainers: Vec<_> = remotes.drain(..ranks).collect();
        let dp = match store {
            Some((addr, guard)) => {
                for (r, t) in trainers.iter_mut().enumerate() {
                    t.rank = Some((r, ranks));
                }
                eprintln!("miles run: {ranks} data-parallel trainer ranks meet at the c10d store {addr}");
                Some(DpGroup { ranks: trainers.split_off(1), store: addr, store_guard: guard })
            }
            None => None,
        };
        let trainer = trainers.remove(0);
        let launcher = Arc::new(Mutex::new(launcher));
        let l2 = launcher.clone();
        let mut fleet = Fleet {
            controller,
            trainer,
            engines: remotes,
            teacher,
            dp,
            on_failure: match d.on_worker_failure {
                WorkerFailure::Stop => OnFailure::Stop,
                WorkerFailure::Continue => OnFailure::Continue,
            },
            deadlines,
            transport: d.transport.clone(),
            channel: d.channel.clone(),
            bucket_bytes: d.bucket_bytes,
            verify_full: d.verify_full,
            delta_dir: self.out_dir.join("weights"),
            last_report: None,
            sync_log: Some(self.out_dir.join("sync.jsonl")),
            events: Vec::new(),
            on_drop: Some(Box::new(move || l2.lock().unwrap_or_else(|p| p.into_inner()).stop())),
        };
        let ranks_of = std::iter::once(&fleet.trainer).chain(fleet.dp.iter().flat_map(|g| g.ranks.iter()));
        if let Some(r) = ranks_of.into_iter().find(|r| r.reg.role != "trainer") {
            return Err(RunError::new(E_WORKER, format!("{} registered with another role", r.reg.worker_id)));
        }
        fleet.init_all(spec, threads as u32)?;
        let fleet = Arc::new(Mutex::new(fleet));
        *self.fleet.lock().unwrap_or_else(|p| p.into_inner()) = Some(fleet.clone());
        Ok(fleet)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(launcher: LauncherSpec) -> DistributedSpec {
        let mut d: DistributedSpec =
            serde_json::from_value(serde_json::json!({ "launcher": { "type": "in_process" } }))
                .unwrap_or_else(|e| panic!("{e}"));
        d.launcher = launcher;
        d.rollout_workers = 2;
        d
    }

    /// A data-parallel trainer is trainer-0..N-1 in rank order, before the engines; one rank is
    /// exactly the fleet without one. Every launcher gets the same list (Slurm: one step each).
    #[test]
    fn a_data_parallel_trainer_is_one_worker_per_rank_under_every_launcher() {
        let ids = |v: &[WorkerLaunch]| v.iter().map(|w| w.worker_id.clone()).collect::<Vec<_>>();
        let local = spec(LauncherSpec::LocalProcesses { cpus_per_worker: 1 });
        assert_eq!(ids(&plan_workers(&local, 1, 1, None)), ["trainer-0", "rollout-0", "rollout-1"]);
        assert_eq!(ids(&plan_workers(&local, 0, 1, None)), ids(&plan_workers(&local, 1, 1, None)));
        let v = plan_workers(&local, 3, 1, Some("teacher"));
        assert_eq!(ids(&v), ["trainer-0", "trainer-1", "trainer-2", "rollout-0", "rollout-1", "teacher-0"]);
        assert!(v[..3].iter().all(|w| w.role == "trainer" && w.stage == "train"));
        let ncpu = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        assert_eq!(v[1].cpus, vec![1 % ncpu], "each rank its own CPU, round-robin");
        let slurm = spec(LauncherSpec::Slurm {
            partition: None,
            time_limit: None,
            gpus_per_engine: 0,
            gpus_per_trainer: 1,
            cpus_per_worker: 1,
        });
        let v = plan_workers(&slurm, 2, 1, None);
        assert_eq!(v.iter().map(|w| w.gpus).collect::<Vec<_>>(), [1, 1, 0, 0], "a GPU per rank");
        let ray = spec(LauncherSpec::Ray { address: "http://h:8265".into(), gpus_per_engine: 0, gpus_per_trainer: 0 });
        assert_eq!(ids(&plan_workers(&ray, 2, 1, None))[..2], ["trainer-0", "trainer-1"]);
    }

    /// Ranks that never register are named as the trainer's ranks, after the controller hosted
    /// their store; a controller that cannot host one refuses the run before launching anything.
    #[test]
    fn ranks_that_never_register_are_named_as_the_trainers_ranks() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("miles-dp-noreg-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // A stand-in for `miles worker` that never registers (the launcher stops it).
        let exe = dir.join("worker.sh");
        std::fs::write(&exe, "#!/bin/sh\nexec sleep 30\n").unwrap();
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut run = RunSpec::from_json(include_str!("../../runtime/tests/data/tiny.json")).unwrap();
        let mut d = spec(LauncherSpec::LocalProcesses { cpus_per_worker: 0 });
        d.rollout_workers = 1;
        d.start_timeout_s = 1.0;
        run.distributed = Some(d);
        run.train.dp = Some(miles_runtime::DataParallelSpec {
            ranks: 2,
            zero: miles_runtime::ZeroStage::None,
            bucket_bytes: 1 << 20,
            timeout_s: 5.0,
        });
        let err = WorkersBackend::new(exe.clone(), dir.join("a")).create(&run).err().expect("no worker registers");
        assert!(err.code == E_LAUNCH && err.message.contains("cannot host a data-parallel trainer"), "{err}");
        let hosted = Arc::new(Mutex::new(Vec::new()));
        let h2 = hosted.clone();
        let backend = WorkersBackend::new(exe, dir.join("b")).with_store_host(Box::new(move |bind, t| {
            h2.lock().unwrap().push((bind.to_string(), t));
            Ok(("127.0.0.1:1".to_string(), Box::new(()) as Box<dyn std::any::Any + Send>))
        }));
        let err = backend.create(&run).err().expect("no worker registers");
        assert_eq!(err.code, E_WORKER, "{err}");
        assert!(err.message.contains("trainer-0, trainer-1, rollout-0 did not register within 1 s"), "{err}");
        assert!(err.message.contains("trainer-0..trainer-1 are the trainer's 2 data-parallel ranks"), "{err}");
        assert_eq!(*hosted.lock().unwrap(), [("127.0.0.1".to_string(), Duration::from_secs(5))]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
