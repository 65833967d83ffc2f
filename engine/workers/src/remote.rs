//! The controller's side: the registry workers announce themselves to, and clients that implement
//! `RolloutEngine` and `Trainer` over the worker protocol, so the executor drives remote stages
//! exactly as local ones. Every call has a deadline; a failed or silent worker is reported with its
//! stage, id, host and pid, and the run stops or goes on without it as the recipe says.

use crate::auth::{AddToken, CheckToken};
use crate::convert::*;
use crate::pb::{self, controller_server, worker_client::WorkerClient};
use crate::tls::{RunTls, TlsMode};
use crate::transport::TransferReport;
use crate::{E_TRANSFER, E_WORKER};
use miles_runtime::tasks::TokenId;
use miles_runtime::{RolloutEngine, RunError, RunSpec, Sample, SamplingParams, Trajectory, WeightSnapshot};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

mod ranks;
mod trainer;
use ranks::all_ranks;
pub use trainer::RemoteTrainer;

type Client = WorkerClient<InterceptedService<Channel, AddToken>>;

/// What a worker told the controller about itself.
#[derive(Debug, Clone)]
pub struct Registration {
    pub worker_id: String,
    pub role: String,
    pub stage: String,
    pub host: String,
    pub rpc_addr: String,
    pub data_addr: String,
    pub pid: u32,
    pub last_beat: Instant,
}

impl Registration {
    /// "stage `rollout` (worker rollout-1 on host h, pid 123)": the name every fault carries.
    pub fn who(&self) -> String {
        format!("stage `{}` (worker {} on host {}, pid {})", self.stage, self.worker_id, self.host, self.pid)
    }
}

#[derive(Default)]
struct Registry {
    workers: HashMap<String, Registration>,
    stop: bool,
}

/// The Controller service: registrations and heartbeats.
#[derive(Clone)]
pub struct ControllerState {
    inner: Arc<(Mutex<Registry>, std::sync::Condvar)>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[tonic::async_trait]
impl controller_server::Controller for ControllerState {
    async fn register(&self, req: Request<pb::RegisterRequest>) -> Result<Response<pb::RegisterReply>, Status> {
        let r = req.into_inner();
        let mut g = lock(&self.inner.0);
        g.workers.insert(
            r.worker_id.clone(),
            Registration {
                worker_id: r.worker_id,
                role: r.role,
                stage: r.stage,
                host: r.host,
                rpc_addr: r.rpc_addr,
                data_addr: r.data_addr,
                pid: r.pid,
                last_beat: Instant::now(),
            },
        );
        self.inner.1.notify_all();
        Ok(Response::new(pb::RegisterReply { run_id: String::new() }))
    }

    async fn heartbeat(&self, req: Request<pb::HeartbeatRequest>) -> Result<Response<pb::HeartbeatReply>, Status> {
        let r = req.into_inner();
        let mut g = lock(&self.inner.0);
        let stop = g.stop;
        match g.workers.get_mut(&r.worker_id) {
            Some(w) => w.last_beat = Instant::now(),
            None => return Err(Status::not_found(format!("{} is not registered", r.worker_id))),
        }
        Ok(Response::new(pb::HeartbeatReply { stop }))
    }
}

impl ControllerState {
    /// Seconds since a worker's last heartbeat (None: it never registered).
    pub fn silent_for(&self, id: &str) -> Option<Duration> {
        lock(&self.inner.0).workers.get(id).map(|w| w.last_beat.elapsed())
    }
}

/// The controller: its gRPC server on its own runtime, plus the registry.
pub struct Controller {
    pub rt: Arc<tokio::runtime::Runtime>,
    pub addr: String,
    pub token: String,
    /// When calls to workers are encrypted (beyond loopback, or always).
    pub tls: TlsMode,
    run_tls: RunTls,
    state: ControllerState,
}

impl Controller {
    /// Listens on `bind` ("127.0.0.1:0" by default: loopback, a free port), with TLS beyond
    /// loopback or as `MILES_TLS` says.
    pub fn start(bind: &str, token: &str, advertise_host: Option<&str>) -> Result<Controller, RunError> {
        Controller::start_with(bind, token, advertise_host, TlsMode::from_env())
    }

    /// [`Controller::start`] whose server, and calls to workers, are encrypted as `tls` says.
    pub fn start_with(bind: &str, token: &str, host: Option<&str>, tls: TlsMode) -> Result<Controller, RunError> {
        let run_tls = RunTls::derive(token).map_err(|m| RunError::new(E_WORKER, m))?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| RunError::new(E_WORKER, format!("cannot start the controller runtime: {e}")))?;
        let listener = rt
            .block_on(tokio::net::TcpListener::bind(bind))
            .map_err(|e| RunError::new(E_WORKER, format!("controller cannot listen on {bind}: {e}")))?;
        let local = listener.local_addr().map_err(|e| RunError::new(E_WORKER, e.to_string()))?;
        let host = host.map(str::to_string).unwrap_or_else(|| local.ip().to_string());
        let state = ControllerState { inner: Arc::new((Mutex::new(Registry::default()), std::sync::Condvar::new())) };
        let svc =
            controller_server::ControllerServer::with_interceptor(state.clone(), CheckToken(Arc::new(token.into())));
        let mut server = run_tls
            .grpc_server_builder(tls.wanted(&local.to_string()))
            .map_err(|e| RunError::new(E_WORKER, format!("controller: {e}")))?;
        rt.spawn(async move {
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
            let _ = server.add_service(svc).serve_with_incoming(incoming).await;
        });
        let addr = format!("{host}:{}", local.port());
        Ok(Controller { rt: Arc::new(rt), addr, token: token.into(), tls, run_tls, state })
    }

    /// Waits until every id in `ids` registered, or `timeout`; `dead` reports launcher-observed
    /// failures meanwhile (a process that exited, a job that failed).
    pub fn wait_for(
        &self,
        ids: &[String],
        timeout: Duration,
        mut dead: impl FnMut() -> Vec<(String, String)>,
    ) -> Result<Vec<Registration>, RunError> {
        let deadline = Instant::now() + timeout;
        let mut g = lock(&self.state.inner.0);
        loop {
            let missing: Vec<&String> = ids.iter().filter(|i| !g.workers.contains_key(*i)).collect();
            if missing.is_empty() {
                return Ok(ids.iter().filter_map(|i| g.workers.get(i).cloned()).collect());
            }
            let gone = dead();
            if let Some((id, why)) = gone.into_iter().find(|(id, _)| missing.contains(&id)) {
                return Err(RunError::new(E_WORKER, format!("worker {id} exited before it registered: {why}")));
            }
            let now = Instant::now();
            if now >= deadline {
                let m: Vec<&str> = missing.iter().map(|s| s.as_str()).collect();
                return Err(RunError::new(
                    E_WORKER,
                    format!("workers {} did not register within {:.0} s", m.join(", "), timeout.as_secs_f64()),
                )
                .with_help(
                    "see their logs in OUT/workers/; on Slurm the job may still be queued (raise start_timeout)",
                ));
            }
            let wait = (deadline - now).min(Duration::from_millis(200));
            g = self.state.inner.1.wait_timeout(g, wait).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    /// Seconds since a worker's last heartbeat.
    pub fn silent_for(&self, id: &str) -> Option<Duration> {
        self.state.silent_for(id)
    }

    /// The registry's heartbeats, to watch while calls are in flight without the fleet's lock.
    pub fn heartbeats(&self) -> ControllerState {
        self.state.clone()
    }

    /// Tells every worker to exit at its next heartbeat.
    pub fn stop_all(&self) {
        lock(&self.state.inner.0).stop = true;
    }
}

/// What to do when a worker dies or stops answering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnFailure {
    Stop,
    /// Go on with the remaining rollout engines (a trainer's loss always stops the run).
    Continue,
}

/// Timeouts of the worker protocol.
#[derive(Debug, Clone, Copy)]
pub struct Deadlines {
    /// Generation, training, checkpoints.
    pub call: Duration,
    /// Health checks, activation, small calls.
    pub short: Duration,
    /// A worker whose heartbeats stopped this long ago is treated as dead.
    pub heartbeat: Duration,
}

impl Default for Deadlines {
    fn default() -> Self {
        Deadlines { call: Duration::from_secs(600), short: Duration::from_secs(30), heartbeat: Duration::from_secs(15) }
    }
}

/// A connected worker.
pub struct Remote {
    pub reg: Registration,
    client: Client,
    pub alive: bool,
    /// A data-parallel trainer's (rank, world); None for every other worker and a lone trainer.
    pub rank: Option<(usize, usize)>,
}

impl Remote {
    /// The name its faults carry: the registration's, with a data-parallel trainer's rank
    /// ("stage `train` (worker trainer-1, rank 1 of 2, on host h, pid 123)").
    pub fn who(&self) -> String {
        let r = &self.reg;
        match self.rank {
            Some((rank, world)) => format!(
                "stage `{}` (worker {}, rank {rank} of {world}, on host {}, pid {})",
                r.stage, r.worker_id, r.host, r.pid
            ),
            None => r.who(),
        }
    }
}

/// The trainer's data-parallel ranks beyond rank 0 (which is `Fleet::trainer`), and the c10d
/// store they meet at.
pub struct DpGroup {
    /// Ranks 1..N-1, in rank order.
    pub ranks: Vec<Remote>,
    /// The c10d TCPStore's address (host:port), given to every rank at Init.
    pub store: String,
    /// Keeps the store served for as long as the fleet: the controller hosts it, as torchrun's
    /// agent does, so no rank's death takes the rendezvous with it.
    pub store_guard: Box<dyn std::any::Any + Send>,
}

/// Everything the remote engine and trainer share.
pub struct Fleet {
    pub controller: Controller,
    pub trainer: Remote,
    pub engines: Vec<Remote>,
    /// On-policy distillation's teacher stage as a worker of its own (`process = true`).
    pub teacher: Option<Remote>,
    /// A data-parallel trainer's other ranks (`train.dp`); None: one trainer process.
    pub dp: Option<DpGroup>,
    pub on_failure: OnFailure,
    pub deadlines: Deadlines,
    pub transport: String,
    /// broadcast and p2p: auto | tcp | shm | nccl.
    pub channel: String,
    pub bucket_bytes: u64,
    pub verify_full: bool,
    pub delta_dir: PathBuf,
    /// The last transfer's report, and one row per update appended to `sync_log`.
    pub last_report: Option<TransferReport>,
    pub sync_log: Option<PathBuf>,
    /// Faults seen (worker died, continued without it), for the run's log.
    pub events: Vec<String>,
    /// Called when the run ends: stops processes the launcher started.
    pub on_drop: Option<Box<dyn FnOnce() + Send>>,
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.controller.stop_all();
        let short = self.deadlines.short.min(Duration::from_secs(3));
        let rt = self.controller.rt.clone();
        let ranks = self.dp.as_mut().map(|g| g.ranks.as_mut_slice()).unwrap_or_default();
        let all = std::iter::once(&mut self.trainer)
            .chain(ranks.iter_mut())
            .chain(self.engines.iter_mut())
            .chain(self.teacher.as_mut());
        for r in all.filter(|r| r.alive) {
            let mut c = r.client.clone();
            let _ = rt.block_on(async { tokio::time::timeout(short, c.shutdown(pb::ShutdownRequest {})).await });
        }
        if let Some(f) = self.on_drop.take() {
            f();
        }
    }
}

impl Fleet {
    /// Connects to registered workers (lazily: the first call opens the channel).
    pub fn connect(controller: &Controller, reg: Registration, deadlines: &Deadlines) -> Result<Remote, RunError> {
        let ep = (controller.run_tls.grpc_endpoint(&reg.rpc_addr, controller.tls.wanted(&reg.rpc_addr)))
            .map_err(|e| RunError::new(E_WORKER, format!("{}: {e}", reg.who())))?
            .connect_timeout(deadlines.short)
            .tcp_nodelay(true);
        let _guard = controller.rt.enter();
        let ch = ep.connect_lazy();
        let add = AddToken::new(&controller.token).map_err(|m| RunError::new(E_WORKER, m))?;
        let client = WorkerClient::with_interceptor(ch, add)
            .max_decoding_message_size(512 << 20)
            .max_encoding_message_size(512 << 20);
        Ok(Remote { reg, client, alive: true, rank: None })
    }

    /// Runs one call against a worker with a deadline, turning every failure into a run error that
    /// names the worker. A worker that is gone (not a stage error) is marked dead.
    fn call<T, F, Fut>(&mut self, which: Which, timeout: Duration, f: F) -> Result<T, RunError>
    where
        F: FnOnce(Client) -> Fut,
        Fut: std::future::Future<Output = Result<Response<T>, Status>>,
    {
        let (client, rt, who) = self.prepare(which)?;
        let res = rt.block_on(async { tokio::time::timeout(timeout, f(client)).await });
        finish(res, &who, timeout).map_err(|(e, dead)| {
            if dead {
                self.remote_mut(which).alive = false;
            }
            e
        })
    }

    /// Before a call: the worker's client, or why it cannot be called (dead, or silent past the
    /// heartbeat deadline: then marked dead).
    fn prepare(&mut self, which: Which) -> Result<(Client, Arc<tokio::runtime::Runtime>, String), RunError> {
        let heartbeat = self.deadlines.heartbeat;
        let rt = self.controller.rt.clone();
        let silent = self.controller.silent_for(&self.remote(which).reg.worker_id);
        let r = self.remote_mut(which);
        if !r.alive {
            return Err(RunError::new(E_WORKER, format!("{} is dead", r.who())));
        }
        if let Some(s) = silent.filter(|s| *s > heartbeat) {
            r.alive = false;
            return Err(RunError::new(
                E_WORKER,
                format!("{} sent no heartbeat for {:.0} s: treated as dead", r.who(), s.as_secs_f64()),
            ));
        }
        Ok((r.client.clone(), rt, r.who()))
    }

    fn remote(&self, w: Which) -> &Remote {
        match w {
            Which::Trainer | Which::Rank(0) => &self.trainer,
            Which::Rank(r) => self.dp.as_ref().map_or(&self.trainer, |g| &g.ranks[r - 1]),
            Which::Engine(i) => &self.engines[i],
            Which::Teacher => self.teacher.as_ref().unwrap_or(&self.trainer),
        }
    }
    fn remote_mut(&mut self, w: Which) -> &mut Remote {
        match w {
            Which::Trainer | Which::Rank(0) => &mut self.trainer,
            Which::Rank(r) => match self.dp.as_mut() {
                Some(g) => &mut g.ranks[r - 1],
                None => &mut self.trainer,
            },
            Which::Engine(i) => &mut self.engines[i],
            Which::Teacher => self.teacher.as_mut().unwrap_or(&mut self.trainer),
        }
    }

    /// A rollout engine failed: note it, and decide whether the run goes on.
    fn engine_lost(&mut self, i: usize, e: RunError) -> Result<(), RunError> {
        let alive = self.engines.iter().filter(|r| r.alive).count();
        if self.on_failure == OnFailure::Stop || alive == 0 || self.engines[i].alive {
            return Err(e);
        }
        let msg = format!("{}; continuing with {alive} rollout engine(s) (on_worker_failure = continue)", e.message);
        eprintln!("warning: {msg}");
        self.events.push(msg);
        Ok(())
    }

    /// The trainer's data-parallel ranks (1 without a group).
    pub fn world(&self) -> usize {
        1 + self.dp.as_ref().map_or(0, |g| g.ranks.len())
    }

    /// Initialises every worker: the trainer's data-parallel ranks all at once (each Init returns
    /// only once every rank has joined c10d's rendezvous), then the engines and the teacher.
    pub fn init_all(&mut self, spec: &RunSpec, threads: u32) -> Result<(), RunError> {
        let json = serde_json::to_string(spec).map_err(|e| RunError::new(E_WORKER, e.to_string()))?;
        let call = self.deadlines.call;
        match self.dp.as_ref().map(|g| g.store.clone()) {
            None => {
                let req = pb::InitRequest { spec_json: json.clone(), threads, ..Default::default() };
                self.call(Which::Trainer, call, |mut c| async move { c.init(req).await })?;
            }
            Some(store) => {
                let world = self.world() as u32;
                let reqs: Vec<pb::InitRequest> = (0..world)
                    .map(|r| pb::InitRequest {
                        spec_json: json.clone(),
                        threads,
                        dp_rank: r,
                        dp_world: world,
                        dp_store: store.clone(),
                    })
                    .collect();
                all_ranks(self, |r, mut c| {
                    let req = reqs[r].clone();
                    async move { c.init(req).await }
                })?;
            }
        }
        let teacher = self.teacher.is_some().then_some(Which::Teacher);
        for w in (0..self.engines.len()).map(Which::Engine).chain(teacher) {
            let req = pb::InitRequest { spec_json: json.clone(), threads, ..Default::default() };
            self.call(w, call, |mut c| async move { c.init(req).await })?;
        }
        Ok(())
    }
}

#[derive(Clone, Copy)]
enum Which {
    /// The trainer: rank 0 of a data-parallel group.
    Trainer,
    /// A data-parallel trainer rank (0 is `Trainer`).
    Rank(usize),
    Engine(usize),
    /// The teacher worker; only asked for when the fleet has one.
    Teacher,
}

pub type SharedFleet = Arc<Mutex<Fleet>>;

/// One call against a worker of a shared fleet, the fleet unlocked while it is in flight: the
/// generation thread's engines and the trainer's thread call at once under an asynchronous
/// schedule.
fn call_shared<T, F, Fut>(fleet: &SharedFleet, which: Which, timeout: Option<Duration>, f: F) -> Result<T, RunError>
where
    F: FnOnce(Client) -> Fut,
    Fut: std::future::Future<Output = Result<Response<T>, Status>>,
{
    let (client, rt, who, timeout) = {
        let mut g = lock(fleet);
        let t = timeout.unwrap_or(g.deadlines.call);
        let (c, rt, who) = g.prepare(which)?;
        (c, rt, who, t)
    };
    let res = rt.block_on(async { tokio::time::timeout(timeout, f(client)).await });
    finish(res, &who, timeout).map_err(|(e, dead)| {
        if dead {
            lock(fleet).remote_mut(which).alive = false;
        }
        e
    })
}

/// A call's outcome as a run error naming the worker, and whether the worker is gone (not a
/// stage error: a stage error keeps its code and the worker stays alive).
fn finish<T>(
    res: Result<Result<Response<T>, Status>, tokio::time::error::Elapsed>,
    who: &str,
    timeout: Duration,
) -> Result<T, (RunError, bool)> {
    match res {
        Ok(Ok(resp)) => Ok(resp.into_inner()),
        Ok(Err(st)) if st.code() == tonic::Code::Internal => {
            let (code, msg, help) = code_of(st.message());
            let mut e = RunError::new(code, format!("{who}: {msg}"));
            e.help = help;
            Err((e, false))
        }
        Ok(Err(st)) if st.code() == tonic::Code::Unauthenticated => {
            Err((RunError::new(crate::E_AUTH, format!("{who} refused the call: {}", st.message())), false))
        }
        Ok(Err(st)) => Err((
            RunError::new(E_WORKER, format!("{who} failed: {} ({:?})", st.message(), st.code()))
                .with_help("its log is in OUT/workers/<id>.log; `--resume` continues from the last checkpoint"),
            true,
        )),
        Err(_) => Err((
            RunError::new(
                crate::E_WORKER,
                format!("{who} did not answer within its deadline of {:.0} s", timeout.as_secs_f64()),
            )
            .with_help("the worker is hung or overloaded; raise call_timeout in the launcher if it is only slow"),
            true,
        )),
    }
}

/// On-policy distillation's teacher stage, remote: a worker of its own that the launcher placed
/// like any stage, asked for the teacher's log-probs of each batch over gRPC.
pub struct RemoteTeacher {
    pub fleet: SharedFleet,
    temperature: f64,
}

impl RemoteTeacher {
    pub fn new(fleet: SharedFleet, temperature: f64) -> Self {
        RemoteTeacher { fleet, temperature }
    }
}

impl miles_runtime::TeacherScorer for RemoteTeacher {
    fn logprobs(&mut self, batch: &[Trajectory]) -> Result<Vec<Vec<f32>>, RunError> {
        let req = pb::LogprobsRequest {
            prompts: batch.iter().map(|t| pb::TokenSeq { ids: t.prompt.clone() }).collect(),
            responses: batch.iter().map(|t| pb::TokenSeq { ids: t.response.clone() }).collect(),
            temperature: self.temperature,
        };
        if lock(&self.fleet).teacher.is_none() {
            return Err(RunError::new(E_WORKER, "this fleet has no teacher worker"));
        }
        let r = call_shared(&self.fleet, Which::Teacher, None, |mut c| async move { c.logprobs(req).await })?;
        Ok(r.logprobs.into_iter().map(|s| s.values).collect())
    }
}

/// The rollout engines, remote: groups are routed by prompt affinity, a lost engine's groups are
/// regenerated on the survivors when the recipe says to continue.
pub struct RemoteEngine {
    pub fleet: SharedFleet,
    /// The caller's number for the weights loaded (an asynchronous executor numbers its own).
    version: u64,
    /// The trainer's number of the version active on the engines.
    active: Option<u64>,
}

impl RemoteEngine {
    pub fn new(fleet: SharedFleet) -> Self {
        RemoteEngine { fleet, version: 0, active: None }
    }
}

/// Affinity: the same prompt always goes to the same engine (its prefix cache stays warm), and a
/// group's n samples are never split.
pub fn route(prompt: &[TokenId], engines: usize) -> usize {
    let h = miles_runtime::rng::Fnv1a::default().tokens(prompt).0;
    (h % engines.max(1) as u64) as usize
}

impl RolloutEngine for RemoteEngine {
    fn generate(
        &mut self,
        prompts: &[Vec<TokenId>],
        n: usize,
        params: &SamplingParams,
    ) -> Result<Vec<Sample>, RunError> {
        let mut pending: Vec<usize> = (0..prompts.len()).collect();
        let mut out: Vec<Sample> = Vec::with_capacity(prompts.len() * n);
        while !pending.is_empty() {
            // Under the lock only to read the fleet: the calls run with it released (the trainer's
            // thread calls at once under an asynchronous schedule).
            let (calls, deadline, rt) = {
                let f = lock(&self.fleet);
                let alive: Vec<usize> = (0..f.engines.len()).filter(|&i| f.engines[i].alive).collect();
                if alive.is_empty() {
                    return Err(RunError::new(E_WORKER, "no rollout engine is left"));
                }
                let mut by_engine: Vec<Vec<usize>> = vec![Vec::new(); alive.len()];
                for &p in &pending {
                    by_engine[route(&prompts[p], alive.len())].push(p);
                }
                let calls: Vec<_> = by_engine
                    .into_iter()
                    .enumerate()
                    .filter(|(_, ps)| !ps.is_empty())
                    .map(|(k, ps)| {
                        let i = alive[k];
                        let req = pb::GenerateRequest {
                            prompts: ps.iter().map(|&p| pb::TokenSeq { ids: prompts[p].clone() }).collect(),
                            n: n as u32,
                            // A lone engine keeps the caller's seed: the run is then bit-identical
                            // to the in-process one. Several engines each get their own stream.
                            params: Some(params_to_pb(&SamplingParams {
                                seed: if alive.len() == 1 {
                                    params.seed
                                } else {
                                    params.seed ^ (k as u64 + 1).wrapping_mul(0x9e3779b97f4a7c15)
                                },
                                ..params.clone()
                            })),
                        };
                        (i, ps, req, f.engines[i].client.clone(), f.engines[i].reg.who())
                    })
                    .collect();
                (calls, f.deadlines.call, f.controller.rt.clone())
            };
            pending.clear();
            // One request per engine, all in flight at once.
            let mut futs = Vec::new();
            for (i, ps, req, mut c, who) in calls {
                futs.push(async move {
                    let r = tokio::time::timeout(deadline, c.generate(req)).await;
                    (i, ps, who, r)
                });
            }
            let joined = rt.block_on(async { futures_join_all(futs).await });
            for (i, ps, who, r) in joined {
                match finish(r, &who, deadline) {
                    Ok(reply) => {
                        for s in reply.samples {
                            let mut s = sample_from_pb(s);
                            // Map the engine's local index back to the caller's prompt index.
                            s.prompt_index = *ps.get(s.prompt_index).ok_or_else(|| {
                                RunError::new(E_WORKER, "an engine answered for a prompt it was not sent")
                            })?;
                            out.push(s);
                        }
                    }
                    Err((e, dead)) => {
                        let mut f = lock(&self.fleet);
                        if dead {
                            f.engines[i].alive = false;
                        }
                        f.engine_lost(i, e)?;
                        // Its groups are regenerated on the engines that are left.
                        pending.extend(ps);
                    }
                }
            }
        }
        // Groups contiguous and in prompt order, as the trait promises (stable: keeps sample order).
        out.sort_by_key(|s| s.prompt_index);
        // In the caller's numbering: no activation happens during a generate (both are called
        // from the caller's one thread).
        for s in &mut out {
            s.weight_version = self.version;
        }
        Ok(out)
    }

    fn weight_version(&self) -> u64 {
        self.version
    }

    /// Activates the newest version the trainer published on every live engine. Under an
    /// asynchronous schedule the trainer may already have published the next one (its thread
    /// publishes, then hands the receipt over): then that one is activated, labelled with the
    /// caller's older number until the caller hands its receipt over too (staleness counted
    /// from the older version: never under-counted).
    fn load_weights(&mut self, weights: &WeightSnapshot) -> Result<(), RunError> {
        let (n, published) = {
            let f = lock(&self.fleet);
            (f.engines.len(), f.last_report.as_ref().map_or(weights.version, |r| r.version))
        };
        if self.active == Some(published) {
            self.version = weights.version;
            return Ok(());
        }
        for i in 0..n {
            let req = {
                let f = lock(&self.fleet);
                if !f.engines[i].alive {
                    continue;
                }
                pb::ActivateRequest {
                    version: published,
                    transport: f.transport.clone(),
                    delta_dir: f.delta_dir.to_string_lossy().into_owned(),
                    verify_full: f.verify_full,
                }
            };
            let r =
                call_shared(&self.fleet, Which::Engine(i), None, |mut c| async move { c.activate_weights(req).await });
            if let Err(e) = r {
                if e.code == E_TRANSFER || e.code != E_WORKER {
                    return Err(e);
                }
                lock(&self.fleet).engine_lost(i, e)?;
            }
        }
        self.version = weights.version;
        self.active = Some(published);
        Ok(())
    }
}

/// Joins futures without pulling in the futures crate: each is spawned on the runtime.
async fn futures_join_all<F, T>(futs: Vec<F>) -> Vec<T>
where
    F: std::future::Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let handles: Vec<_> = futs.into_iter().map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        if let Ok(v) = h.await {
            out.push(v);
        }
    }
    out
}
