//! The worker protocol with a fake stage (no libtorch): token checks, deadlines, health, weights
//! over a transport, and the controller's registry.

use miles_runtime::tasks::TokenId;
use miles_runtime::*;
use miles_workers::pb::{self, worker_client::WorkerClient};
use miles_workers::remote::{Controller, Deadlines, Fleet, OnFailure, RemoteEngine, RemoteTrainer};
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
    let factory: miles_workers::worker::Factory = Arc::new(move |role, _: &RunSpec, _| match role {
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
    let t = Trajectory {
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
    };
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
        let t = Trajectory {
            prompt: vec![1],
            response: vec![2],
            rollout_logprobs: vec![-1.0],
            loss_mask: vec![1.0],
            reward: 1.5,
            advantage: 0.5,
            group: 0,
            weight_version: 0,
            routing: None,
            teacher_logprobs: Vec::new(),
        };
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
