//! `WorkersBackend`: a `miles_runtime::Backend` whose rollout engines and trainer are worker
//! processes. The synchronous executor runs unchanged on top of it: `create` starts the
//! controller, launches the workers, waits for them to register and initialises them.

use crate::auth::new_token;
use crate::launcher::{LaunchEnv, Launcher, LocalLauncher, RayLauncher, SlurmLauncher, WorkerLaunch};
use crate::remote::{Controller, Deadlines, Fleet, OnFailure, RemoteEngine, RemoteTeacher, RemoteTrainer, SharedFleet};
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
}

/// How the controller builds a teacher stage: this crate runs no model itself.
pub type TeacherFactory = Box<dyn Fn(&RunSpec) -> Result<Box<dyn TeacherScorer>, RunError> + Send + Sync>;

impl WorkersBackend {
    pub fn new(exe: PathBuf, out_dir: PathBuf) -> Self {
        WorkersBackend { exe, out_dir, threads: Mutex::new(None), fleet: Mutex::new(None), teacher: None }
    }

    pub fn with_teacher(mut self, f: TeacherFactory) -> Self {
        self.teacher = Some(f);
        self
    }
}

/// The worker processes of a run: trainer-0, then rollout-0..n, then teacher-0 when the run's
/// teacher stage (named `teacher`) runs in a worker of its own.
pub fn plan_workers(d: &DistributedSpec, threads: usize, teacher: Option<&str>) -> Vec<WorkerLaunch> {
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
    let mut v = vec![WorkerLaunch {
        worker_id: "trainer-0".into(),
        role: "trainer".into(),
        stage: "train".into(),
        cpus: cpus(cpus_per),
        gpus: gpus_trainer,
        threads: threads as u32,
    }];
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
        let workers = plan_workers(&d, threads, teacher_worker(spec));
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
            Err(e) => {
                launcher.stop();
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
        let trainer = remotes.remove(0);
        let launcher = Arc::new(Mutex::new(launcher));
        let l2 = launcher.clone();
        let mut fleet = Fleet {
            controller,
            trainer,
            engines: remotes,
            teacher,
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
        if fleet.trainer.reg.role != "trainer" {
            return Err(RunError::new(E_WORKER, "trainer-0 registered with another role"));
        }
        fleet.init_all(spec, threads as u32)?;
        let fleet = Arc::new(Mutex::new(fleet));
        *self.fleet.lock().unwrap_or_else(|p| p.into_inner()) = Some(fleet.clone());
        Ok(fleet)
    }
}
