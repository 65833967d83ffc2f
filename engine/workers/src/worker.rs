//! The server of a `miles worker` process: hosts one stage instance (a rollout engine or a
//! trainer) behind the Worker service, registers with the controller, sends heartbeats, and
//! exits when the controller says so or has been gone longer than the heartbeat timeout.

use crate::auth::{AddToken, CheckToken};
use crate::convert::*;
use crate::delta::DeltaReceiver;
use crate::pb::{self, controller_client::ControllerClient, worker_server};
use crate::tls::{RunTls, TlsMode};
use crate::transport::{self, Receiver, Target, TransportConfig, TransportKind, WeightPublisher};
use crate::wire::Faults;
use miles_runtime::{DpRank, RolloutEngine, RunError, RunSpec, TeacherScorer, Trainer, Trajectory, E_SPEC};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tonic::{Request, Response, Status};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Rollout,
    Trainer,
    /// On-policy distillation's teacher stage (`teacher_logprobs { process = true }`).
    Teacher,
}

impl Role {
    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "rollout" => Some(Role::Rollout),
            "trainer" => Some(Role::Trainer),
            "teacher" => Some(Role::Teacher),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Role::Rollout => "rollout",
            Role::Trainer => "trainer",
            Role::Teacher => "teacher",
        }
    }
}

/// What a worker hosts. `Send` because calls run on the runtime's blocking threads.
pub enum Hosted {
    Rollout(Box<dyn RolloutEngine + Send>),
    Trainer(Box<dyn Trainer + Send>),
    Teacher(Box<dyn TeacherScorer>),
}

/// Builds the stage instance from the run spec (the root binary passes the libtorch backend): the
/// role, the spec, the intra-op threads, and a data-parallel trainer rank's place in its group
/// (building such a rank joins the group: it returns once every rank has).
pub type Factory = Arc<dyn Fn(Role, &RunSpec, Option<usize>, Option<DpRank>) -> Result<Hosted, RunError> + Send + Sync>;

#[derive(Clone)]
pub struct WorkerConfig {
    pub worker_id: String,
    pub role: Role,
    /// The recipe's stage name, for error messages.
    pub stage: String,
    /// The controller's gRPC address; without one the worker only serves (tests, manual use).
    pub controller: Option<String>,
    pub token: String,
    /// gRPC listen address (loopback unless configured otherwise; port 0 picks one).
    pub bind: String,
    /// Address other hosts use to reach this one (default: the bound IP).
    pub advertise_host: Option<String>,
    /// This host's copy of the weights for disk-delta.
    pub local_dir: PathBuf,
    pub heartbeat: Duration,
    /// Exit when the controller has not answered a heartbeat for this long.
    pub orphan_after: Duration,
    /// When the worker's server and its calls to the controller are encrypted (`crate::tls`).
    pub tls: TlsMode,
}

/// The publisher of the last transport configuration (its key), kept across versions.
type KeyedPublisher = (String, Box<dyn WeightPublisher>);

struct Svc {
    cfg: WorkerConfig,
    factory: Factory,
    hosted: Arc<Mutex<Option<Hosted>>>,
    receiver: Option<Receiver>,
    delta: Arc<Mutex<Option<DeltaReceiver>>>,
    publisher: Arc<Mutex<Option<KeyedPublisher>>>,
    /// Set once to end the worker: the server and the heartbeat loop both watch it.
    shutdown: tokio::sync::watch::Sender<bool>,
    version: Arc<std::sync::atomic::AtomicU64>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Svc {
    /// Runs `f` on the hosted stage on a blocking thread (libtorch calls take seconds).
    async fn with<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Hosted) -> Result<T, RunError> + Send + 'static,
    ) -> Result<T, Status> {
        let hosted = self.hosted.clone();
        tokio::task::spawn_blocking(move || {
            let mut g = lock(&hosted);
            match g.as_mut() {
                Some(h) => f(h),
                None => Err(RunError::new(E_SPEC, "the worker was called before Init")),
            }
        })
        .await
        .map_err(|e| Status::internal(format!("worker task failed: {e}")))?
        .map_err(to_status)
    }
}

/// The data-parallel place an Init gives a trainer rank; None outside a group. A place that does
/// not fit (a rank past the world, a group for another role, no store) is refused, not guessed.
fn dp_rank(r: &pb::InitRequest, role: Role) -> Result<Option<DpRank>, RunError> {
    if r.dp_world == 0 {
        return Ok(None);
    }
    if role != Role::Trainer {
        return Err(RunError::new(E_SPEC, format!("a {} worker was given a data-parallel rank", role.name())));
    }
    if r.dp_rank >= r.dp_world || r.dp_store.is_empty() {
        return Err(RunError::new(
            E_SPEC,
            format!(
                "data-parallel rank {} of {} at store {:?} is not a place in a group",
                r.dp_rank, r.dp_world, r.dp_store
            ),
        ));
    }
    Ok(Some(DpRank { rank: r.dp_rank as usize, world: r.dp_world as usize, store: r.dp_store.clone() }))
}

fn wrong_role(want: Role) -> RunError {
    RunError::new(E_SPEC, format!("this call needs a {} worker", want.name()))
}

#[tonic::async_trait]
impl worker_server::Worker for Svc {
    async fn health(&self, _: Request<pb::HealthRequest>) -> Result<Response<pb::HealthReply>, Status> {
        Ok(Response::new(pb::HealthReply {
            worker_id: self.cfg.worker_id.clone(),
            role: self.cfg.role.name().into(),
            weight_version: self.version.load(std::sync::atomic::Ordering::Relaxed),
            ready: lock(&self.hosted).is_some(),
        }))
    }

    async fn init(&self, req: Request<pb::InitRequest>) -> Result<Response<pb::InitReply>, Status> {
        let r = req.into_inner();
        let spec = RunSpec::from_json(&r.spec_json).map_err(to_status)?;
        let threads = (r.threads > 0).then_some(r.threads as usize);
        let rank = dp_rank(&r, self.cfg.role).map_err(to_status)?;
        let (factory, role, hosted) = (self.factory.clone(), self.cfg.role, self.hosted.clone());
        tokio::task::spawn_blocking(move || {
            let h = factory(role, &spec, threads, rank)?;
            *lock(&hosted) = Some(h);
            Ok::<_, RunError>(())
        })
        .await
        .map_err(|e| Status::internal(e.to_string()))?
        .map_err(to_status)?;
        Ok(Response::new(pb::InitReply { weight_version: 0, params: 0 }))
    }

    async fn generate(&self, req: Request<pb::GenerateRequest>) -> Result<Response<pb::GenerateReply>, Status> {
        let r = req.into_inner();
        let prompts: Vec<Vec<u32>> = r.prompts.into_iter().map(|p| p.ids).collect();
        let params = params_from_pb(&r.params.unwrap_or_default());
        let n = r.n as usize;
        let samples = self
            .with(move |h| match h {
                Hosted::Rollout(e) => e.generate(&prompts, n, &params),
                Hosted::Trainer(_) | Hosted::Teacher(_) => Err(wrong_role(Role::Rollout)),
            })
            .await?;
        Ok(Response::new(pb::GenerateReply { samples: samples.iter().map(sample_to_pb).collect() }))
    }

    async fn activate_weights(&self, req: Request<pb::ActivateRequest>) -> Result<Response<pb::ActivateReply>, Status> {
        let r = req.into_inner();
        let t0 = Instant::now();
        let version = r.version;
        let kind = TransportKind::parse(&r.transport)
            .ok_or_else(|| Status::invalid_argument(format!("unknown transport {}", r.transport)))?;
        let bytes_read = if kind == TransportKind::DiskDelta {
            let delta = self.delta.clone();
            let (dir, full) = (PathBuf::from(r.delta_dir), r.verify_full);
            let (local, token) = (self.cfg.local_dir.clone(), self.cfg.token.clone());
            let hosted = self.hosted.clone();
            tokio::task::spawn_blocking(move || -> Result<u64, RunError> {
                let mut d = lock(&delta);
                if d.is_none() {
                    *d = Some(DeltaReceiver::new(&local, &token).map_err(|e| {
                        RunError::io(crate::E_TRANSFER, "cannot use the local weight copy in", &local, e)
                    })?);
                }
                let d = d.as_mut().unwrap_or_else(|| unreachable!());
                let snap = d.activate(&dir, version, full).map_err(|m| RunError::new(crate::E_TRANSFER, m))?;
                match lock(&hosted).as_mut() {
                    Some(Hosted::Rollout(e)) => e.load_weights(snap)?,
                    _ => return Err(wrong_role(Role::Rollout)),
                }
                Ok(d.last_bytes_read)
            })
            .await
            .map_err(|e| Status::internal(e.to_string()))?
            .map_err(to_status)?
        } else {
            let rx = self.receiver.clone().ok_or_else(|| Status::failed_precondition("no weight receiver"))?;
            let hosted = self.hosted.clone();
            tokio::task::spawn_blocking(move || -> Result<u64, RunError> {
                let snap =
                    rx.take(version, Duration::from_secs(30)).map_err(|m| RunError::new(crate::E_TRANSFER, m))?;
                let bytes = snap.bytes() as u64;
                match lock(&hosted).as_mut() {
                    Some(Hosted::Rollout(e)) => e.load_weights(&snap)?,
                    _ => return Err(wrong_role(Role::Rollout)),
                }
                rx.recycle(snap);
                Ok(bytes)
            })
            .await
            .map_err(|e| Status::internal(e.to_string()))?
            .map_err(to_status)?
        };
        self.version.store(version, std::sync::atomic::Ordering::Relaxed);
        Ok(Response::new(pb::ActivateReply { version, load_seconds: t0.elapsed().as_secs_f64(), bytes_read }))
    }

    async fn train_rl(&self, req: Request<pb::TrainRlRequest>) -> Result<Response<pb::TrainRlReply>, Status> {
        let r = req.into_inner();
        let batch: Vec<_> = r.batch.into_iter().map(traj_from_pb).collect();
        let (lrs, temp) = (r.lrs, r.temperature);
        let (stats, version) = self
            .with(move |h| match h {
                Hosted::Trainer(t) => Ok((t.train_rl(&batch, &lrs, temp)?, t.version())),
                Hosted::Rollout(_) | Hosted::Teacher(_) => Err(wrong_role(Role::Trainer)),
            })
            .await?;
        self.version.store(version, std::sync::atomic::Ordering::Relaxed);
        Ok(Response::new(pb::TrainRlReply { stats: Some(stats_to_pb(&stats)), version }))
    }

    async fn train_sft(&self, req: Request<pb::TrainSftRequest>) -> Result<Response<pb::TrainSftReply>, Status> {
        let r = req.into_inner();
        let batch: Vec<_> = r.batch.into_iter().map(|p| (p.prompt, p.answer)).collect();
        let lr = r.lr;
        let s = self
            .with(move |h| match h {
                Hosted::Trainer(t) => t.train_sft(&batch, lr),
                Hosted::Rollout(_) | Hosted::Teacher(_) => Err(wrong_role(Role::Trainer)),
            })
            .await?;
        Ok(Response::new(pb::TrainSftReply { loss: s.loss, grad_norm: s.grad_norm, tokens: s.tokens }))
    }

    async fn logprobs(&self, req: Request<pb::LogprobsRequest>) -> Result<Response<pb::LogprobsReply>, Status> {
        let r = req.into_inner();
        let prompts: Vec<Vec<u32>> = r.prompts.into_iter().map(|p| p.ids).collect();
        let responses: Vec<Vec<u32>> = r.responses.into_iter().map(|p| p.ids).collect();
        let temp = r.temperature;
        let lp = self
            .with(move |h| match h {
                Hosted::Trainer(t) => t.logprobs(&prompts, &responses, temp),
                // The teacher scores at the run's temperature, as it does in the controller.
                Hosted::Teacher(t) => {
                    let batch: Vec<Trajectory> =
                        prompts.into_iter().zip(responses).map(|(p, r)| Trajectory::to_score(p, r)).collect();
                    t.logprobs(&batch)
                }
                Hosted::Rollout(_) => Err(wrong_role(Role::Trainer)),
            })
            .await?;
        Ok(Response::new(pb::LogprobsReply {
            logprobs: lp.into_iter().map(|values| pb::FloatSeq { values }).collect(),
        }))
    }

    async fn control(&self, req: Request<pb::ControlRequest>) -> Result<Response<pb::ControlReply>, Status> {
        let r = req.into_inner();
        let version = self
            .with(move |h| {
                let Hosted::Trainer(t) = h else { return Err(wrong_role(Role::Trainer)) };
                let dir = PathBuf::from(&r.dir);
                match r.op.as_str() {
                    "reset_optimizer" => t.reset_optimizer(),
                    "freeze_reference" => t.freeze_reference()?,
                    "save" => t.save(&dir)?,
                    "load" => t.load(&dir)?,
                    "save_model" => t.save_model(&dir)?,
                    "version" => {}
                    other => return Err(RunError::new(E_SPEC, format!("unknown control op {other}"))),
                }
                Ok(t.version())
            })
            .await?;
        self.version.store(version, std::sync::atomic::Ordering::Relaxed);
        Ok(Response::new(pb::ControlReply { version }))
    }

    async fn publish_weights(&self, req: Request<pb::PublishRequest>) -> Result<Response<pb::PublishReply>, Status> {
        let r = req.into_inner();
        let kind = TransportKind::parse(&r.transport)
            .ok_or_else(|| Status::invalid_argument(format!("unknown transport {}", r.transport)))?;
        let channel = transport::Channel::parse(&r.channel)
            .ok_or_else(|| Status::invalid_argument(format!("unknown weight channel {}", r.channel)))?;
        let mut cfg = TransportConfig::new(kind, self.cfg.token.clone());
        cfg.tls = self.cfg.tls;
        cfg.channel = channel;
        cfg.bucket_bytes = r.bucket_bytes.max(1 << 16);
        cfg.verify_full = r.verify_full;
        cfg.shards = r.shards as usize;
        cfg.faults = Faults::from_env();
        if r.timeout_ms > 0 {
            cfg.timeout = Duration::from_millis(r.timeout_ms);
        }
        let targets: Vec<Target> =
            r.targets.into_iter().map(|t| Target { worker_id: t.worker_id, data_addr: t.data_addr }).collect();
        let key = format!(
            "{}|{}|{}|{}|{}|{}",
            r.transport,
            channel.name(),
            r.delta_dir,
            r.bucket_bytes,
            r.verify_full,
            r.shards
        );
        let delta_dir = (!r.delta_dir.is_empty()).then(|| PathBuf::from(&r.delta_dir));
        let (hosted, publisher) = (self.hosted.clone(), self.publisher.clone());
        let report = tokio::task::spawn_blocking(move || -> Result<transport::TransferReport, RunError> {
            let snap = match lock(&hosted).as_ref() {
                Some(Hosted::Trainer(t)) => t.export_weights()?,
                _ => return Err(wrong_role(Role::Trainer)),
            };
            let mut p = lock(&publisher);
            // The publisher persists across versions (disk-delta diffs against the last one).
            if p.as_ref().map(|x| x.0 != key).unwrap_or(true) {
                *p = Some((key, transport::publisher(cfg.clone(), delta_dir)));
            }
            let pb = p.as_mut().unwrap_or_else(|| unreachable!());
            pb.1.publish(&snap, &targets)
                .map_err(|e| RunError::new(crate::E_TRANSFER, format!("{} failed: {}", e.worker_id, e.message)))
        })
        .await
        .map_err(|e| Status::internal(e.to_string()))?
        .map_err(to_status)?;
        Ok(Response::new(pb::PublishReply {
            report: Some(pb::TransferReport {
                transport: report.transport,
                version: report.version,
                bytes: report.bytes,
                seconds: report.seconds,
                gb_per_s: report.gb_per_s,
                targets: report.targets,
                buckets: report.buckets,
            }),
        }))
    }

    async fn shutdown(&self, _: Request<pb::ShutdownRequest>) -> Result<Response<pb::ShutdownReply>, Status> {
        let _ = self.shutdown.send(true);
        Ok(Response::new(pb::ShutdownReply {}))
    }
}

/// Runs the worker until Shutdown, a stop from the controller, or an orphaned heartbeat.
/// `on_ready` receives the bound gRPC and data addresses (tests and the log line).
pub fn serve(cfg: WorkerConfig, factory: Factory, on_ready: impl FnOnce(&str, &str)) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the worker's runtime: {e}"))?;
    let res = rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(&cfg.bind)
            .await
            .map_err(|e| format!("worker {}: cannot listen on {}: {e}", cfg.worker_id, cfg.bind))?;
        let local = listener.local_addr().map_err(|e| e.to_string())?;
        let host = cfg.advertise_host.clone().unwrap_or_else(|| local.ip().to_string());
        let rpc_addr = format!("{host}:{}", local.port());
        let receiver = if cfg.role == Role::Rollout {
            let r = Receiver::start_with_tls(&format!("{}:0", local.ip()), &cfg.token, cfg.tls)
                .map_err(|e| format!("worker {}: cannot listen for weights: {e}", cfg.worker_id))?;
            Some(r)
        } else {
            None
        };
        let data_addr = receiver.as_ref().map(|r| format!("{host}:{}", r.addr().port())).unwrap_or_default();
        let (shutdown, mut stopped) = tokio::sync::watch::channel(false);
        let svc = Svc {
            cfg: cfg.clone(),
            factory,
            hosted: Arc::new(Mutex::new(None)),
            receiver,
            delta: Arc::new(Mutex::new(None)),
            publisher: Arc::new(Mutex::new(None)),
            shutdown: shutdown.clone(),
            version: Arc::new(std::sync::atomic::AtomicU64::new(0)),
        };
        let version = svc.version.clone();
        let server = tonic::service::interceptor::InterceptedService::new(
            worker_server::WorkerServer::new(svc)
                .max_decoding_message_size(512 << 20)
                .max_encoding_message_size(512 << 20),
            CheckToken(Arc::new(cfg.token.clone())),
        );
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        let mut stop = stopped.clone();
        let mut builder = RunTls::derive(&cfg.token)?
            .grpc_server_builder(cfg.tls.wanted(&local.to_string()))
            .map_err(|e| format!("worker {}: {e}", cfg.worker_id))?;
        let server_task = tokio::spawn(async move {
            builder
                .add_service(server)
                .serve_with_incoming_shutdown(incoming, async move {
                    let _ = stop.wait_for(|v| *v).await;
                })
                .await
        });
        on_ready(&rpc_addr, &data_addr);
        if let Some(ctrl) = cfg.controller.clone() {
            let reg = pb::RegisterRequest {
                worker_id: cfg.worker_id.clone(),
                role: cfg.role.name().into(),
                stage: cfg.stage.clone(),
                host: hostname(),
                rpc_addr: rpc_addr.clone(),
                data_addr: data_addr.clone(),
                pid: std::process::id(),
            };
            let hb = heartbeat_loop(cfg.clone(), ctrl, reg, version);
            tokio::select! {
                r = hb => { let _ = shutdown.send(true); r?; }
                _ = stopped.wait_for(|v| *v) => {}
            }
        } else {
            let _ = stopped.wait_for(|v| *v).await;
        }
        let _ = tokio::time::timeout(Duration::from_secs(5), server_task).await;
        Ok(())
    });
    // A stage call still running (a hung libtorch op) must not keep the process alive.
    rt.shutdown_timeout(Duration::from_secs(1));
    res
}

pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// Registers, then beats every `cfg.heartbeat`. Returns when the controller says stop, or with an
/// error when it has been unreachable for `cfg.orphan_after` (a worker never outlives its run).
async fn heartbeat_loop(
    cfg: WorkerConfig,
    ctrl: String,
    reg: pb::RegisterRequest,
    version: Arc<std::sync::atomic::AtomicU64>,
) -> Result<(), String> {
    let add = AddToken::new(&cfg.token)?;
    let host_port = ctrl.split_once("://").map_or(ctrl.as_str(), |(_, rest)| rest);
    let endpoint = RunTls::derive(&cfg.token)?
        .grpc_endpoint(host_port, cfg.tls.wanted(host_port))
        .map_err(|e| format!("controller {ctrl}: {e}"))?
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(10));
    let started = Instant::now();
    let mut last_ok = Instant::now();
    let mut registered = false;
    let mut client: Option<
        ControllerClient<tonic::service::interceptor::InterceptedService<tonic::transport::Channel, AddToken>>,
    > = None;
    loop {
        let res = async {
            if client.is_none() {
                let ch = endpoint.connect().await.map_err(|e| e.to_string())?;
                client = Some(ControllerClient::with_interceptor(ch, add.clone()));
            }
            let c = client.as_mut().ok_or("no client")?;
            if !registered {
                c.register(reg.clone()).await.map_err(|e| e.message().to_string())?;
                registered = true;
            }
            let beat = pb::HeartbeatRequest {
                worker_id: cfg.worker_id.clone(),
                weight_version: version.load(std::sync::atomic::Ordering::Relaxed),
            };
            let r = c.heartbeat(beat).await.map_err(|e| e.message().to_string())?;
            Ok::<bool, String>(r.into_inner().stop)
        }
        .await;
        match res {
            Ok(true) => return Ok(()),
            Ok(false) => last_ok = Instant::now(),
            Err(e) => {
                client = None;
                let since = if registered { last_ok.elapsed() } else { started.elapsed() };
                if since > cfg.orphan_after {
                    return Err(format!(
                        "worker {}: the controller at {ctrl} has not answered for {:.0} s ({e}); exiting",
                        cfg.worker_id,
                        since.as_secs_f64()
                    ));
                }
            }
        }
        tokio::time::sleep(cfg.heartbeat).await;
    }
}
