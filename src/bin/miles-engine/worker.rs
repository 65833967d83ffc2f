//! `miles worker` hosts one stage instance (a rollout engine or a trainer on the embedded libtorch
//! backend) as its own process, driven by the controller over the worker protocol
//! (engine/workers); `miles serve MODEL_DIR` exposes the embedded engine through the
//! SGLang-compatible HTTP API. Both are thin: the protocol, transports and API live in miles-workers.

use miles_runtime::chat::{Hub, HubConfig};
use miles_runtime::env::tools::ToolFormat;
use miles_runtime::session::Rule;
use miles_runtime::tokenize::{HfTokenizer, Tokenizer};
use miles_runtime::{DpRank, RolloutEngine, RunError, RunSpec, SamplingParams, Trainer};
use miles_tch::model::Policy;
use miles_workers::auth::{worker_token, TOKEN_ENV, TOKEN_FILE_ENV};
use miles_workers::http::Limits;
use miles_workers::worker::{Factory, Hosted, Role, WorkerConfig};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[derive(clap::Args)]
pub struct Args {
    /// This worker's id in the run (e.g. rollout-0).
    #[arg(long)]
    pub id: String,
    /// rollout | trainer
    #[arg(long)]
    pub role: String,
    /// The recipe's stage name, for error messages.
    #[arg(long, default_value = "")]
    pub stage: String,
    /// The controller's address (host:port). The run token comes from MILES_RUN_TOKEN, or the
    /// private file MILES_RUN_TOKEN_FILE names.
    #[arg(long)]
    pub controller: Option<String>,
    /// Listen address of the worker protocol (loopback unless configured otherwise).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub bind: String,
    /// Address other hosts reach this worker by (default: the bound IP).
    #[arg(long)]
    pub advertise: Option<String>,
    /// This host's copy of the weights (disk-delta transport).
    #[arg(long, default_value = "miles-worker")]
    pub local_dir: PathBuf,
    /// Pin the process to these CPUs (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub cpus: Vec<usize>,
    /// `always`: TLS on loopback too, as the controller's `MILES_TLS=always` (the launcher passes
    /// it). Default: MILES_TLS, else TLS beyond loopback only.
    #[arg(long)]
    pub tls: Option<String>,
}

fn pin(cpus: &[usize]) -> Result<(), String> {
    if cpus.is_empty() {
        return Ok(());
    }
    // SAFETY: a zeroed cpu_set_t is the empty set; CPU_SET writes inside it for ids < CPU_SETSIZE.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in cpus {
            if c >= libc::CPU_SETSIZE as usize {
                return Err(format!("CPU {c} is out of range"));
            }
            libc::CPU_SET(c, &mut set);
        }
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(format!("cannot pin to CPUs {cpus:?}: {}", std::io::Error::last_os_error()));
        }
    }
    Ok(())
}

/// The embedded backend's stages, built as `TchBackend::create` builds them in-process (same
/// seeded init), so a one-engine distributed run is bit-identical to the in-process one. A
/// data-parallel trainer rank joins its group here (c10d's rendezvous: every rank's Init waits
/// for the others) and takes rank 0's weights.
fn factory() -> Factory {
    Arc::new(|role: Role, spec: &RunSpec, threads: Option<usize>, rank: Option<DpRank>| -> Result<Hosted, RunError> {
        miles_runtime::Backend::set_threads(&miles_tch::TchBackend, threads);
        spec.validate()?;
        if role == Role::Teacher {
            // The teacher stage loads its own model, not the policy, here in this worker: this
            // process is the teacher's own.
            let mut s = spec.clone();
            if let Some(o) = s.train.opd.as_mut() {
                o.process = false;
            }
            return Ok(Hosted::Teacher(miles_runtime::Backend::teacher(&miles_tch::TchBackend, &s)?));
        }
        let (policy, source) = std::panic::catch_unwind(|| miles_tch::initial_policy(spec))
            .map_err(|_| RunError::new(miles_runtime::E_BACKEND, "model init failed in libtorch"))??;
        Ok(match role {
            Role::Teacher => return Err(RunError::new(miles_runtime::E_BACKEND, "a teacher worker hosts no policy")),
            Role::Rollout => {
                Hosted::Rollout(Box::new(miles_tch::TchEngine::for_run(&policy, spec)?) as Box<dyn RolloutEngine + Send>)
            }
            Role::Trainer => {
                // The saved model carries the source directory's config and tokenizer files.
                let mut trainer = miles_tch::train::TchTrainer::for_run(policy, spec, source);
                if let Some(rank) = rank {
                    let dp = spec.train.dp.as_ref().ok_or_else(|| {
                        RunError::new(
                            miles_runtime::E_SPEC,
                            "a trainer rank was started for a run spec without train.dp",
                        )
                    })?;
                    trainer.join_dp(dp, &rank)?;
                }
                Hosted::Trainer(Box::new(trainer) as Box<dyn Trainer + Send>)
            }
        })
    })
}

pub fn run(args: Args) -> u8 {
    let Some(role) = Role::parse(&args.role) else {
        eprintln!("miles worker: --role must be rollout, trainer or teacher, not {}", args.role);
        return 2;
    };
    // The environment, or a private file it names (a Ray job's environment is public).
    let token = match worker_token(std::env::var(TOKEN_ENV).ok(), std::env::var_os(TOKEN_FILE_ENV).map(PathBuf::from)) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("miles worker: {e}");
            return 2;
        }
    };
    let tls = match args.tls.as_deref() {
        None => miles_workers::tls::TlsMode::from_env(),
        Some("always") => miles_workers::tls::TlsMode::Always,
        Some("auto") => miles_workers::tls::TlsMode::Auto,
        Some(other) => {
            eprintln!("miles worker: --tls must be auto or always, not {other}");
            return 2;
        }
    };
    if let Err(e) = pin(&args.cpus) {
        eprintln!("miles worker {}: {e}", args.id);
        return 1;
    }
    let cfg = WorkerConfig {
        worker_id: args.id.clone(),
        role,
        stage: if args.stage.is_empty() { role.name().into() } else { args.stage },
        controller: args.controller,
        token,
        bind: args.bind,
        advertise_host: args.advertise,
        local_dir: args.local_dir,
        heartbeat: Duration::from_millis(500),
        orphan_after: Duration::from_secs(30),
        tls,
    };
    let id = args.id;
    let res = miles_workers::worker::serve(cfg, factory(), |rpc, data| {
        let gpus =
            std::env::var("CUDA_VISIBLE_DEVICES").map(|g| format!("; CUDA_VISIBLE_DEVICES={g}")).unwrap_or_default();
        eprintln!("miles worker {id}: pid {} serving on {rpc} (weights on {data}{gpus})", std::process::id());
    });
    match res {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("miles worker {id}: {e}");
            1
        }
    }
}

#[derive(clap::Args)]
pub struct ServeArgs {
    /// A model directory (model.safetensors + config.json), e.g. runs/NAME/model.
    pub model_dir: PathBuf,
    /// Listen address. Anything but loopback (127.0.0.0/8, ::1, localhost) needs an API key.
    #[arg(long, default_value = "127.0.0.1:30000")]
    pub bind: String,
    /// Clients must send `Authorization: Bearer KEY` (all but /health* and /metrics, as SGLang).
    /// Default: the MILES_API_KEY environment variable, which, unlike this flag, `ps` does not show.
    #[arg(long, value_name = "KEY")]
    pub api_key: Option<String>,
    /// The only directory /update_weights_from_disk loads from (`..` and symlinks resolved);
    /// created if missing. Default: MODEL_DIR's parent.
    #[arg(long, value_name = "DIR")]
    pub weights_dir: Option<PathBuf>,
    #[arg(long)]
    pub threads: Option<usize>,
    /// Chat sessions (`/sessions/ID/v1/...`) held at once; past it the least recently used idle
    /// session is dropped.
    #[arg(long, default_value_t = 256)]
    pub max_sessions: usize,
    #[command(flatten)]
    pub limits: LimitArgs,
}

/// What one request may ask and how long it may take (docs/distributed.md, "miles serve"). A
/// request past a bound is refused with a status that names the flag.
#[derive(clap::Args)]
pub struct LimitArgs {
    /// Completions per prompt (`sampling_params.n`) at most; 400 beyond.
    #[arg(long, default_value_t = Limits::default().max_n)]
    pub max_n: usize,
    /// `max_new_tokens` of one completion at most; 400 beyond.
    #[arg(long, default_value_t = Limits::default().max_new_tokens)]
    pub max_new_tokens: usize,
    /// Prompts in one request at most; 400 beyond.
    #[arg(long, default_value_t = Limits::default().max_prompts)]
    pub max_prompts: usize,
    /// New tokens one request may ask for in all (prompts x n x max_new_tokens); 400 beyond.
    #[arg(long, default_value_t = Limits::default().max_request_tokens)]
    pub max_request_tokens: u64,
    /// A request body's size at most, in bytes; 413 beyond.
    #[arg(long, default_value_t = Limits::default().max_body_bytes)]
    pub max_body_bytes: usize,
    /// Generations at once (the engine runs one at a time; the others wait for it with their
    /// request read); later requests queue.
    #[arg(long, default_value_t = Limits::default().max_concurrent)]
    pub max_concurrent: usize,
    /// Requests admitted at once (reading a body, queued or generating); 503 at once beyond.
    /// Request bodies held at once are at most this times --max-body-bytes.
    #[arg(long, default_value_t = Limits::default().max_pending)]
    pub max_pending: usize,
    /// Seconds a queued request waits for a generation slot; 503 after.
    #[arg(long, value_name = "SECONDS", default_value_t = Limits::default().queue_timeout.as_secs_f64())]
    pub queue_timeout: f64,
    /// Seconds a request body may take to arrive; 408 after (a slow body cannot hold the server).
    #[arg(long, value_name = "SECONDS", default_value_t = Limits::default().body_timeout.as_secs_f64())]
    pub body_timeout: f64,
    /// Seconds a /generate request may take in all, queue included; 504 after.
    #[arg(long, value_name = "SECONDS", default_value_t = Limits::default().request_timeout.as_secs_f64())]
    pub request_timeout: f64,
    /// Seconds a request's headers may take to arrive, and a kept-alive connection may sit idle;
    /// the connection is closed after.
    #[arg(long, value_name = "SECONDS", default_value_t = Limits::default().header_timeout.as_secs_f64())]
    pub header_timeout: f64,
    /// Connections served at once; past it new connections wait, unaccepted, until one ends.
    #[arg(long, default_value_t = Limits::default().max_connections)]
    pub max_connections: usize,
}

impl LimitArgs {
    fn limits(&self) -> Result<Limits, String> {
        let secs = |flag: &str, s: f64| {
            Duration::try_from_secs_f64(s)
                .ok()
                .filter(|d| !d.is_zero())
                .ok_or_else(|| format!("--{flag} must be a positive number of seconds, not {s}"))
        };
        for (flag, v) in [
            ("max-n", self.max_n),
            ("max-new-tokens", self.max_new_tokens),
            ("max-prompts", self.max_prompts),
            ("max-body-bytes", self.max_body_bytes),
            ("max-concurrent", self.max_concurrent),
            ("max-pending", self.max_pending),
            ("max-connections", self.max_connections),
        ] {
            if v == 0 {
                return Err(format!("--{flag} must be at least 1"));
            }
        }
        Ok(Limits {
            max_n: self.max_n,
            max_new_tokens: self.max_new_tokens,
            max_prompts: self.max_prompts,
            max_request_tokens: self.max_request_tokens,
            max_body_bytes: self.max_body_bytes,
            max_concurrent: self.max_concurrent,
            max_pending: self.max_pending,
            queue_timeout: secs("queue-timeout", self.queue_timeout)?,
            body_timeout: secs("body-timeout", self.body_timeout)?,
            request_timeout: secs("request-timeout", self.request_timeout)?,
            header_timeout: secs("header-timeout", self.header_timeout)?,
            max_connections: self.max_connections,
        })
    }
}

pub fn serve(args: ServeArgs) -> u8 {
    let limits = match args.limits.limits() {
        Ok(l) => l,
        Err(e) => {
            eprintln!("miles serve: {e}");
            return 2;
        }
    };
    miles_runtime::Backend::set_threads(&miles_tch::TchBackend, args.threads);
    if args.api_key.is_some() {
        eprintln!(
            "miles serve: note: --api-key is visible to other users of this machine (ps); {} is not",
            miles_workers::http::API_KEY_ENV
        );
    }
    let api_key = args.api_key.filter(|k| !k.is_empty()).or_else(miles_workers::http::api_key_from_env);
    let keyed = api_key.is_some();
    let loader: miles_workers::http::Loader = Arc::new(|dir: &std::path::Path, version: u64| {
        let policy = Policy::load(dir)?;
        let mut e = miles_tch::TchEngine::new(policy);
        e.version = version;
        Ok(Box::new(e) as Box<dyn RolloutEngine + Send>)
    });
    let chat = chat_hub(&args.model_dir, &limits, args.max_sessions);
    if let Err(why) = &chat {
        eprintln!("miles serve: note: no /v1/chat/completions: {why}");
    }
    let opts = miles_workers::http::ServeOptions {
        bind: args.bind,
        model_path: args.model_dir.clone(),
        weights_dir: args.weights_dir,
        api_key,
        limits,
        chat,
    };
    let res = miles_workers::http::serve(opts, loader, |addr| {
        let auth = if keyed { "; API key required" } else { "" };
        eprintln!(
            "miles serve: {} on http://{addr} (SGLang-compatible /generate, OpenAI-compatible /v1/chat/completions{auth})",
            args.model_dir.display()
        );
    });
    match res {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("miles serve: {e}");
            1
        }
    }
}

/// The OpenAI-compatible session server's hub over a model directory: its tokenizer (and chat
/// template), its context length (config.json's `max_position_embeddings`), Hermes tool calls and
/// branching sessions opened on first use (docs/agents.md "The session server").
fn chat_hub(dir: &std::path::Path, limits: &Limits, max_sessions: usize) -> Result<Arc<Hub>, String> {
    let tok = HfTokenizer::load(dir).map_err(|e| format!("the model directory's tokenizer: {}", e.message))?;
    let config = dir.join("config.json");
    let text = std::fs::read_to_string(&config).map_err(|e| format!("{}: {e}", config.display()))?;
    let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", config.display()))?;
    let max_context = json["max_position_embeddings"]
        .as_u64()
        .ok_or_else(|| format!("{}: no `max_position_embeddings`", config.display()))? as usize;
    let max_new_tokens = limits.max_new_tokens.min(max_context.saturating_sub(1)).max(1);
    let mut defaults = SamplingParams::plain(max_new_tokens, 0);
    defaults.stop_tokens = tok.special().stop.clone();
    let name = dir.file_name().map_or_else(|| "model".into(), |n| n.to_string_lossy().into_owned());
    let config = HubConfig {
        model_name: name,
        tool_format: ToolFormat::Hermes,
        rule: Rule::Branching,
        max_context,
        max_new_tokens,
        defaults,
        max_sessions: max_sessions.max(1),
        pinned: false,
    };
    let hub = Hub::new(Arc::new(Tokenizer::Hf(Box::new(tok))), config).map_err(|e| e.message)?;
    hub.set_open_on_demand(true);
    Ok(Arc::new(hub))
}

#[derive(clap::Args)]
pub struct TeacherArgs {
    /// The teacher's Hugging Face directory.
    #[arg(long)]
    pub model: PathBuf,
    /// The student's vocabulary size and longest sequence, which the teacher must match.
    #[arg(long)]
    pub vocab: usize,
    #[arg(long)]
    pub max_len: usize,
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
}

/// `miles-engine teacher`: on-policy distillation's teacher as a worker process, answering the
/// trainer's JSON lines on stdin (engine/tch/src/teacher.rs).
pub fn teacher(args: TeacherArgs) -> u8 {
    match miles_tch::teacher::worker_main(&args.model, args.vocab, args.max_len, args.threads) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("{e}");
            1
        }
    }
}
