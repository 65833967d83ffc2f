//! The worker protocol with a fake stage (no libtorch): token checks, deadlines, health, weights
//! over a transport, and the controller's registry.

use miles_runtime::tasks::TokenId;
use miles_runtime::*;
use miles_workers::pb::{self, worker_client::WorkerClient};
use miles_workers::remote::{Controller, Deadlines, DpGroup, Fleet, OnFailure, RemoteEngine, RemoteTrainer};
use miles_workers::tls::{RunTls, TlsMode};
use miles_workers::worker::{Hosted, Role, WorkerConfig};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Answers each prompt with its own tokens reversed; sleeps `delay` per call.
struct Echo {
    version: u64,
    delay: Duration,
}

impl RolloutEngine for Echo {
    fn generate(&mut self, prompts: &[Vec<TokenId>], n: usize, _: &SamplingParams) -> Result<Vec<Sample>, RunError> {
        std::thread::sleep(self.delay);
        Ok((0..prompts.len())
            .flat_map(|i| (0..n).map(move |_| i))
            .map(|i| Sample {
                prompt_index: i,
                response: prompts[i].iter().rev().copied().collect(),
                logprobs: vec![-0.5; prompts[i].len()],
                finish: FinishReason::Stop,
                weight_version: self.version,
                routing: None,
            })
            .collect())
    }
    fn weight_version(&self) -> u64 {
        self.version
    }
    fn load_weights(&mut self, w: &WeightSnapshot) -> Result<(), RunError> {
        if w.tensors.len() != 2 || w.tensors[1].data[3] != w.version as f32 {
            return Err(RunError::new(E_BACKEND, "unexpected weights"));
        }
        self.version = w.version;
        Ok(())
    }
}

/// A trainer whose weights are two tensors stamped with the version.
struct Stamp {
    version: u64,
}

impl Trainer for Stamp {
    fn train_rl(&mut self, b: &[Trajectory], lrs: &[f64], _: f64) -> Result<TrainStats, RunError> {
        self.version += lrs.len() as u64;
        Ok(TrainStats { loss: b.iter().map(|t| t.reward as f64).sum(), tokens: b.len() as u64, ..Default::default() })
    }
    fn train_sft(&mut self, _: &[(Vec<TokenId>, Vec<TokenId>)], _: f64) -> Result<SftStats, RunError> {
        Ok(SftStats::default())
    }
    fn reset_optimizer(&mut self) {}
    fn freeze_reference(&mut self) -> Result<(), RunError> {
        Ok(())
    }
    fn logprobs(&mut self, _: &[Vec<TokenId>], r: &[Vec<TokenId>], _: f64) -> Result<Vec<Vec<f32>>, RunError> {
        Ok(r.iter().map(|x| vec![0.0; x.len()]).collect())
    }
    fn version(&self) -> u64 {
        self.version
    }
    fn export_weights(&self) -> Result<WeightSnapshot, RunError> {
        let v = self.version as f32;
        Ok(WeightSnapshot {
            version: self.version,
            tensors: vec![
                NamedTensor { name: "a".into(), shape: vec![1000], data: vec![0.25; 1000] },
                NamedTensor { name: "b".into(), shape: vec![4, 50_000], data: vec![v; 200_000] },
            ],
        })
    }
    fn save(&self, _: &Path) -> Result<(), RunError> {
        Ok(())
    }
    fn load(&mut self, _: &Path) -> Result<(), RunError> {
        Ok(())
    }
    fn save_model(&self, _: &Path) -> Result<(), RunError> {
        Ok(())
    }
}

fn spec() -> RunSpec {
    RunSpec::from_json(include_str!("../../runtime/tests/data/tiny.json")).unwrap()
}

/// Starts a worker thread; returns its gRPC and data addresses.
fn start_worker(id: &str, role: Role, ctrl: Option<String>, token: &str, delay: Duration) -> (String, String) {
    start_worker_tls(id, role, ctrl, token, delay, TlsMode::Auto)
}

fn start_worker_tls(
    id: &str,
    role: Role,
    ctrl: Option<String>,
    token: &str,
    delay: Duration,
    tls: TlsMode,
) -> (String, String) {
    let cfg = WorkerConfig {
        worker_id: id.into(),
        role,
        stage: if role == Role::Trainer { "train".into() } else { "rollout".into() },
        controller: ctrl,
        token: token.into(),
        bind: "127.0.0.1:0".into(),
        advertise_host: None,
        local_dir: std::env::temp_dir().join(format!("miles-proto-{}-{id}", std::process::id())),
        heartbeat: Duration::from_millis(100),
        orphan_after: Duration::from_secs(20),
        tls,
    };
    let factory: miles_workers::worker::Factory = Arc::new(move |role, _: &RunSpec, _, _| match role {
        Role::Rollout => Ok(Hosted::Rollout(Box::new(Echo { version: 0, delay }))),
        Role::Trainer => Ok(Hosted::Trainer(Box::new(Stamp { version: 0 }))),
        // The teacher worker runs the real teacher end to end (tests/e2e/opd.rs).
        Role::Teacher => Err(RunError::new(miles_runtime::E_BACKEND, "no teacher in the protocol tests")),
    });
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = miles_workers::worker::serve(cfg, factory, |a, d| {
            let _ = tx.send((a.to_string(), d.to_string()));
        });
    });
    rx.recv_timeout(Duration::from_secs(10)).unwrap()
}

#[test]
fn calls_without_the_run_token_are_refused() {
    let (addr, _) = start_worker("rollout-0", Role::Rollout, None, "secret", Duration::ZERO);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut c = WorkerClient::connect(format!("http://{addr}")).await.unwrap();
        let e = c.health(pb::HealthRequest {}).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated);
        let ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap().connect().await.unwrap();
        let mut wrong =
            WorkerClient::with_interceptor(ch.clone(), miles_workers::auth::AddToken::new("guess").unwrap());
        assert_eq!(wrong.health(pb::HealthRequest {}).await.unwrap_err().code(), tonic::Code::Unauthenticated);
        let mut right = WorkerClient::with_interceptor(ch, miles_workers::auth::AddToken::new("secret").unwrap());
        let h = right.health(pb::HealthRequest {}).await.unwrap().into_inner();
        assert_eq!((h.worker_id.as_str(), h.role.as_str(), h.ready), ("rollout-0", "rollout", false));
    });
}

/// TLS forced on loopback (`MILES_TLS=always`): registration, heartbeats and the controller's calls
/// go over TLS under the run's certificate; a plaintext client, or one that trusts another run's
/// certificate, gets no answer even with the right token. The weights go over TLS too: the
/// engine's receiver refuses a plaintext stream, and the trainer's stream reaches it.
#[test]
fn forced_tls_carries_the_protocol_and_refuses_plaintext_and_other_runs() {
    let token = "tls-tok";
    let ctrl = Controller::start_with("127.0.0.1:0", token, None, TlsMode::Always).unwrap();
    let (addr, _) =
        start_worker_tls("trainer-0", Role::Trainer, Some(ctrl.addr.clone()), token, Duration::ZERO, TlsMode::Always);
    let (_, data_addr) =
        start_worker_tls("rollout-0", Role::Rollout, Some(ctrl.addr.clone()), token, Duration::ZERO, TlsMode::Always);
    // The workers registered with the TLS controller, over TLS.
    let ids = ["trainer-0".to_string(), "rollout-0".to_string()];
    let regs = ctrl.wait_for(&ids, Duration::from_secs(10), Vec::new).unwrap();
    let deadlines =
        Deadlines { call: Duration::from_secs(10), short: Duration::from_secs(5), heartbeat: Duration::from_secs(10) };
    let mut remotes: Vec<_> = regs.into_iter().map(|r| Fleet::connect(&ctrl, r, &deadlines).unwrap()).collect();
    let trainer = remotes.remove(0);
    let rt = ctrl.rt.clone();
    let mut f = Fleet {
        controller: ctrl,
        trainer,
        engines: remotes,
        teacher: None,
        dp: None,
        on_failure: OnFailure::Stop,
        deadlines,
        transport: "broadcast".into(),
        channel: "auto".into(),
        bucket_bytes: 1 << 16,
        verify_full: false,
        delta_dir: std::env::temp_dir().join(format!("miles-proto-tls-{}", std::process::id())),
        last_report: None,
        sync_log: None,
        events: Vec::new(),
        on_drop: None,
    };
    // The controller's calls (Init) go through over TLS.
    f.init_all(&spec(), 1).unwrap();
    let health = |ep: tonic::transport::Endpoint, tok: &'static str| async move {
        let ch = ep.connect().await.map_err(|e| e.to_string())?;
        let mut c = WorkerClient::with_interceptor(ch, miles_workers::auth::AddToken::new(tok).unwrap());
        c.health(pb::HealthRequest {}).await.map(|r| r.into_inner().ready).map_err(|e| e.to_string())
    };
    rt.block_on(async {
        let plain = tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap();
        assert!(health(plain, "tls-tok").await.is_err(), "a plaintext call was answered");
        let tls = |t: &str| {
            let c = RunTls::derive(t).unwrap().grpc_client();
            tonic::transport::Endpoint::from_shared(format!("https://{addr}")).unwrap().tls_config(c).unwrap()
        };
        assert!(health(tls("another-run"), "tls-tok").await.is_err(), "another run's certificate was trusted");
        assert_eq!(health(tls("tls-tok"), "tls-tok").await, Ok(true));
        // Inside TLS the token is still checked.
        let e = health(tls("tls-tok"), "guess").await.unwrap_err();
        assert!(e.contains("token"), "{e}");
    });
    // The engine's weight receiver takes TLS only; the trainer worker's stream is TLS.
    use miles_workers::transport::{Channel, StreamPublisher, Target, TransportConfig, TransportKind, WeightPublisher};
    let mut plain = TransportConfig::new(TransportKind::Broadcast, token);
    plain.channel = Channel::Tcp;
    let target = [Target { worker_id: "rollout-0".into(), data_addr }];
    let e = StreamPublisher::new(plain).publish(&Stamp { version: 9 }.export_weights().unwrap(), &target).unwrap_err();
    assert!(e.message.contains("TLS only"), "{e}");
    let f = Arc::new(Mutex::new(f));
    let (mut trainer, mut engine) = (RemoteTrainer::new(f.clone()), RemoteEngine::new(f.clone()));
    let t = one_trajectory();
    trainer.train_rl(&[t], &[1e-3], 1.0).unwrap();
    engine.load_weights(&trainer.export_weights().unwrap()).unwrap();
    assert_eq!(f.lock().unwrap().last_report.as_ref().map(|r| r.transport.as_str()), Some("broadcast/shm"));
    assert_eq!(engine.generate(&[vec![1, 2]], 1, &params()).unwrap()[0].weight_version, 1);
}

fn fleet(engine_delays: &[Duration], on_failure: OnFailure, call: Duration, transport: &str) -> Arc<Mutex<Fleet>> {
    let token = "tok";
    let ctrl = Controller::start("127.0.0.1:0", token, None).unwrap();
    let mut ids = vec!["trainer-0".to_string()];
    start_worker("trainer-0", Role::Trainer, Some(ctrl.addr.clone()), token, Duration::ZERO);
    for (i, d) in engine_delays.iter().enumerate() {
        let id = format!("rollout-{i}");
        start_worker(&id, Role::Rollout, Some(ctrl.addr.clone()), token, *d);
        ids.push(id);
    }
    let regs = ctrl.wait_for(&ids, Duration::from_secs(10), Vec::new).unwrap();
    let deadlines = Deadlines { call, short: Duration::from_secs(5), heartbeat: Duration::from_secs(10) };
    let mut remotes: Vec<_> = regs.into_iter().map(|r| Fleet::connect(&ctrl, r, &deadlines).unwrap()).collect();
    let trainer = remotes.remove(0);
    let mut f = Fleet {
        controller: ctrl,
        trainer,
        engines: remotes,
        teacher: None,
        dp: None,
        on_failure,
        deadlines,
        transport: transport.into(),
        channel: "auto".into(),
        bucket_bytes: 1 << 16,
        verify_full: true,
        delta_dir: std::env::temp_dir().join(format!("miles-proto-delta-{}-{transport}", std::process::id())),
        last_report: None,
        sync_log: None,
        events: Vec::new(),
        on_drop: None,
    };
    f.init_all(&spec(), 1).unwrap();
    Arc::new(Mutex::new(f))
}

fn params() -> SamplingParams {
    SamplingParams::plain(4, 1)
}

#[test]
fn remote_stages_generate_train_and_sync_weights_with_every_transport() {
    for transport in ["broadcast", "p2p", "disk_delta"] {
        let f = fleet(&[Duration::ZERO, Duration::ZERO], OnFailure::Stop, Duration::from_secs(20), transport);
        let mut engine = RemoteEngine::new(f.clone());
        let mut trainer = RemoteTrainer::new(f.clone());
        let prompts: Vec<Vec<TokenId>> = (0..10).map(|i| vec![5, 6, i]).collect();
        let s = engine.generate(&prompts, 3, &params()).unwrap();
        assert_eq!(s.len(), 30);
        for (k, x) in s.iter().enumerate() {
            assert_eq!(x.prompt_index, k / 3, "groups contiguous, in prompt order");
            assert_eq!(x.response, vec![prompts[k / 3][2], 6, 5]);
        }
        let t = Trajectory { reward: 1.5, ..one_trajectory() };
        for step in 1..=3u64 {
            let st = trainer.train_rl(&[t.clone(), t.clone()], &[1e-3], 1.0).unwrap();
            assert_eq!(st.loss, 3.0);
            let receipt = trainer.export_weights().unwrap();
            assert_eq!(receipt.version, step);
            engine.load_weights(&receipt).unwrap();
            let s = engine.generate(&prompts[..2], 1, &params()).unwrap();
            assert!(s.iter().all(|x| x.weight_version == step), "{transport}");
        }
        let rep = f.lock().unwrap().last_report.clone().unwrap();
        assert_eq!(rep.targets, 2);
        assert!(rep.bytes > 0 && rep.gb_per_s > 0.0, "{rep:?}");
    }
}

#[test]
fn a_silent_engine_hits_the_deadline_and_its_groups_move_to_the_others() {
    let f = fleet(
        &[Duration::ZERO, Duration::from_secs(30)],
        OnFailure::Continue,
        Duration::from_millis(1500),
        "broadcast",
    );
    let mut engine = RemoteEngine::new(f.clone());
    let prompts: Vec<Vec<TokenId>> = (0..16).map(|i| vec![7, i]).collect();
    let t0 = Instant::now();
    let s = engine.generate(&prompts, 2, &params()).unwrap();
    assert!(t0.elapsed() < Duration::from_secs(10));
    assert_eq!(s.len(), 32, "no group lost");
    let ev = f.lock().unwrap().events.clone();
    assert!(ev[0].contains("worker rollout-1") && ev[0].contains("deadline"), "{ev:?}");

    let f = fleet(&[Duration::from_secs(30)], OnFailure::Stop, Duration::from_millis(1000), "broadcast");
    let mut engine = RemoteEngine::new(f);
    let e = engine.generate(&prompts, 2, &params()).unwrap_err();
    assert_eq!(e.code, "E0513");
    assert!(e.message.contains("stage `rollout` (worker rollout-0 on host"), "{e}");
    assert!(e.message.contains("did not answer within its deadline of 1 s"), "{e}");
}

/// A data-parallel trainer rank for the fleet tests: counts the calls it gets; `collective`
/// stands in for c10d on rank 0: it waits that long for its peer, then fails as Gloo does when a
/// peer is gone.
struct Rank {
    rank: usize,
    calls: Calls,
    collective: Option<Duration>,
    version: u64,
}

impl Rank {
    fn note(&self, what: &str) {
        self.calls.lock().unwrap().push(format!("{}:{what}", self.rank));
    }
}

impl Trainer for Rank {
    fn train_rl(&mut self, b: &[Trajectory], lrs: &[f64], _: f64) -> Result<TrainStats, RunError> {
        self.note("train_rl");
        if let Some(w) = self.collective {
            std::thread::sleep(w);
            return Err(RunError::new(E_BACKEND, "Gloo allreduce timed out: no answer from rank 1"));
        }
        self.version += lrs.len() as u64;
        Ok(TrainStats { loss: 100.0 * self.rank as f64 + b.len() as f64, ..Default::default() })
    }
    fn train_sft(&mut self, _: &[(Vec<TokenId>, Vec<TokenId>)], _: f64) -> Result<SftStats, RunError> {
        self.note("train_sft");
        Ok(SftStats { loss: self.rank as f64, ..Default::default() })
    }
    fn reset_optimizer(&mut self) {
        self.note("reset_optimizer");
    }
    fn freeze_reference(&mut self) -> Result<(), RunError> {
        self.note("freeze_reference");
        Ok(())
    }
    fn logprobs(&mut self, _: &[Vec<TokenId>], r: &[Vec<TokenId>], _: f64) -> Result<Vec<Vec<f32>>, RunError> {
        self.note("logprobs");
        Ok(r.iter().map(|x| vec![self.rank as f32; x.len()]).collect())
    }
    fn version(&self) -> u64 {
        self.version
    }
    fn export_weights(&self) -> Result<WeightSnapshot, RunError> {
        self.note("export");
        Ok(WeightSnapshot { version: self.version, tensors: Vec::new() })
    }
    fn save(&self, _: &Path) -> Result<(), RunError> {
        self.note("save");
        Ok(())
    }
    fn load(&mut self, _: &Path) -> Result<(), RunError> {
        self.note("load");
        Ok(())
    }
    fn save_model(&self, _: &Path) -> Result<(), RunError> {
        self.note("save_model");
        Ok(())
    }
}

/// Two trainer ranks (threads of this test) as a fleet's data-parallel group; rank 0 fails its
/// train calls after `collective` when one is given. Returns the fleet, the calls the ranks got,
/// and rank 1's gRPC address.
/// The calls the ranks got, as "RANK:call".
type Calls = Arc<Mutex<Vec<String>>>;

/// A fleet of two fake trainer ranks: the fleet, the calls they saw, rank 1's address and a
/// receiver told when rank 1's server has stopped (its connections closed).
fn dp_fleet(collective: Option<Duration>) -> (Arc<Mutex<Fleet>>, Calls, String, std::sync::mpsc::Receiver<()>) {
    let token = "dp-tok";
    let ctrl = Controller::start("127.0.0.1:0", token, None).unwrap();
    let calls = Arc::new(Mutex::new(Vec::new()));
    let mut addrs = Vec::new();
    let (stopped_tx, stopped_rx) = std::sync::mpsc::channel();
    for r in 0..2usize {
        let cfg = WorkerConfig {
            worker_id: format!("trainer-{r}"),
            role: Role::Trainer,
            stage: "train".into(),
            controller: Some(ctrl.addr.clone()),
            token: token.into(),
            bind: "127.0.0.1:0".into(),
            advertise_host: None,
            local_dir: std::env::temp_dir().join(format!("miles-proto-dp-{}-{r}", std::process::id())),
            heartbeat: Duration::from_millis(100),
            orphan_after: Duration::from_secs(20),
            tls: TlsMode::Auto,
        };
        let calls = calls.clone();
        let factory: miles_workers::worker::Factory = Arc::new(move |role, s: &RunSpec, _, place: Option<DpRank>| {
            // Init gave the rank its place in the group, and the spec says how big it is.
            let place = place.ok_or_else(|| RunError::new(E_BACKEND, "no data-parallel place"))?;
            assert_eq!((role, place.world, s.train.dp.as_ref().map(|d| d.ranks)), (Role::Trainer, 2, Some(2)));
            assert_eq!(place.store, "127.0.0.1:29500");
            let collective = collective.filter(|_| place.rank == 0);
            let t = Rank { rank: place.rank, calls: calls.clone(), collective, version: 0 };
            Ok(Hosted::Trainer(Box::new(t)))
        });
        let (tx, rx) = std::sync::mpsc::channel();
        let stopped = stopped_tx.clone();
        std::thread::spawn(move || {
            let _ = miles_workers::worker::serve(cfg, factory, |a, _| {
                let _ = tx.send(a.to_string());
            });
            if r == 1 {
                let _ = stopped.send(());
            }
        });
        addrs.push(rx.recv_timeout(Duration::from_secs(10)).unwrap());
    }
    let ids = ["trainer-0".to_string(), "trainer-1".to_string()];
    let regs = ctrl.wait_for(&ids, Duration::from_secs(10), Vec::new).unwrap();
    let deadlines =
        Deadlines { call: Duration::from_secs(20), short: Duration::from_secs(5), heartbeat: Duration::from_secs(10) };
    let mut ranks: Vec<_> = regs.into_iter().map(|r| Fleet::connect(&ctrl, r, &deadlines).unwrap()).collect();
    for (r, x) in ranks.iter_mut().enumerate() {
        x.rank = Some((r, 2));
    }
    let trainer = ranks.remove(0);
    let dp = DpGroup { ranks, store: "127.0.0.1:29500".into(), store_guard: Box::new(()) };
    let mut f = Fleet {
        controller: ctrl,
        trainer,
        engines: Vec::new(),
        teacher: None,
        dp: Some(dp),
        on_failure: OnFailure::Stop,
        deadlines,
        transport: "broadcast".into(),
        channel: "auto".into(),
        bucket_bytes: 1 << 16,
        verify_full: false,
        delta_dir: std::env::temp_dir().join(format!("miles-proto-dp-delta-{}", std::process::id())),
        last_report: None,
        sync_log: None,
        events: Vec::new(),
        on_drop: None,
    };
    let mut s = spec();
    s.train.dp = Some(DataParallelSpec { ranks: 2, zero: ZeroStage::None, bucket_bytes: 1 << 20, timeout_s: 5.0 });
    f.init_all(&s, 1).unwrap();
    (Arc::new(Mutex::new(f)), calls, addrs.remove(1), stopped_rx)
}

fn one_trajectory() -> Trajectory {
    Trajectory {
        prompt: vec![1],
        response: vec![2],
        rollout_logprobs: vec![-1.0],
        loss_mask: vec![1.0],
        reward: 1.0,
        advantage: 0.5,
        group: 0,
        weight_version: 0,
        routing: None,
        teacher_logprobs: Vec::new(),
    }
}

/// Training and every control op reach both ranks (each gets the whole batch) and rank 0's answer
/// is the answer; log-probs and the final model go to rank 0 alone.
#[test]
fn a_data_parallel_trainer_gets_training_and_control_on_every_rank_and_logprobs_on_rank_0() {
    let (f, calls, _, _) = dp_fleet(None);
    let mut t = RemoteTrainer::new(f.clone());
    let st = t.train_rl(&[one_trajectory(), one_trajectory(), one_trajectory()], &[1e-3, 1e-3], 1.0).unwrap();
    assert_eq!(st.loss, 3.0, "rank 0's stats");
    assert_eq!(t.version(), 2);
    assert_eq!(t.train_sft(&[(vec![1], vec![2])], 1e-3).unwrap().loss, 0.0);
    t.save(Path::new("/tmp/ck")).unwrap();
    t.load(Path::new("/tmp/ck")).unwrap();
    t.freeze_reference().unwrap();
    t.reset_optimizer();
    t.save_model(Path::new("/tmp/m")).unwrap();
    let lp = t.logprobs(&[vec![1]], &[vec![2, 3]], 1.0).unwrap();
    assert_eq!(lp, vec![vec![0.0, 0.0]], "rank 0 answers log-probs");
    let mut got = calls.lock().unwrap().clone();
    got.sort();
    let mut want: Vec<String> = ["train_rl", "train_sft", "save", "load", "freeze_reference", "reset_optimizer"]
        .iter()
        .flat_map(|op| [format!("0:{op}"), format!("1:{op}")])
        .chain(["0:save_model".into(), "0:logprobs".into()])
        .collect();
    want.sort();
    assert_eq!(got, want);
}

/// Rank 1's process is gone while rank 0 waits for it in a collective, which then fails: the
/// error names rank 1 (the cause), not rank 0 (the bystander), whose failure is in the help.
#[test]
fn a_dead_rank_is_named_before_the_rank_whose_collective_failed_waiting_for_it() {
    let (f, _, rank1, stopped) = dp_fleet(Some(Duration::from_millis(1500)));
    // Rank 1 exits: its server stops, closes its connections and refuses new ones.
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let ch = tonic::transport::Endpoint::from_shared(format!("http://{rank1}")).unwrap().connect().await.unwrap();
        let mut c = WorkerClient::with_interceptor(ch, miles_workers::auth::AddToken::new("dp-tok").unwrap());
        c.shutdown(pb::ShutdownRequest {}).await.unwrap();
    });
    // Until its server has returned, the fleet's open connection may still be served.
    stopped.recv_timeout(Duration::from_secs(10)).expect("rank 1's server did not stop");
    let mut t = RemoteTrainer::new(f.clone());
    let e = t.train_rl(&[one_trajectory()], &[1e-3], 1.0).unwrap_err();
    assert_eq!(e.code, "E0513", "{e}");
    assert!(e.message.contains("worker trainer-1, rank 1 of 2, on host"), "{e}");
    let help = e.help.clone().unwrap_or_default();
    assert!(help.contains("rank 1 of 2 failed first") && help.contains("OUT/workers/trainer-1.log"), "{help}");
    assert!(help.contains("rank 0: stage `train` (worker trainer-0, rank 0 of 2") && help.contains("Gloo"), "{help}");
    assert!(!f.lock().unwrap().dp.as_ref().unwrap().ranks[0].alive, "rank 1 is marked dead");
    // The next call names it at once, without calling anyone.
    let e = t.train_rl(&[one_trajectory()], &[1e-3], 1.0).unwrap_err();
    assert!(e.message.contains("trainer-1, rank 1 of 2") && e.message.contains("is dead"), "{e}");
}
