//! The server `miles serve` runs: SGLang's endpoints over any `RolloutEngine`, its `--api-key`,
//! and the bounds of `limits.rs`. Engine work runs on blocking threads, never in an async
//! handler; what `/health`, `/model_info` and the other reads answer is kept beside the engine,
//! so none of them waits for a generation.

use super::limits::{host_is_loopback, read_body, slot, Pending, Refusal};
use super::{generate::generate_blocking, valid_api_key, Limits, API_KEY_ENV};
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Json;
use miles_runtime::tasks::TokenId;
use miles_runtime::{RolloutEngine, RunError};
use serde_json::{json, Value};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::Semaphore;

/// Loads a model directory into an engine (the root binary passes the libtorch loader).
/// The second argument is the weight version the engine reports.
pub type Loader = Arc<dyn Fn(&Path, u64) -> Result<Box<dyn RolloutEngine + Send>, RunError> + Send + Sync>;

/// Prefix reuse, counted as a radix cache would: a prompt's cached tokens are its longest prefix
/// already seen; the other samples of a group reuse the whole prompt.
#[derive(Default)]
pub struct PrefixStats {
    seen: HashSet<u64>,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
}

impl PrefixStats {
    /// Records a prompt; returns its cached tokens.
    pub fn record(&mut self, prompt: &[TokenId]) -> usize {
        // Bounded memory: forget everything past a million prefixes (a cache eviction).
        if self.seen.len() > 1_000_000 {
            self.seen.clear();
        }
        let mut h = miles_runtime::rng::Fnv1a::default();
        let mut cached = 0;
        for (i, &t) in prompt.iter().enumerate() {
            h = h.value(t as u64);
            if !self.seen.insert(h.0) && cached == i {
                cached = i + 1;
            }
        }
        self.prompt_tokens += prompt.len() as u64;
        self.cached_tokens += cached as u64;
        cached
    }
    pub fn hit_rate(&self) -> f64 {
        self.cached_tokens as f64 / self.prompt_tokens.max(1) as f64
    }
}

/// What `/model_info` answers, updated when weights load (never read through the engine, whose
/// lock a generation holds).
pub(super) struct ModelInfo {
    pub path: PathBuf,
    pub weight_version: u64,
}

pub(super) struct ServeState {
    pub engine: Mutex<Box<dyn RolloutEngine + Send>>,
    loader: Loader,
    pub info: Mutex<ModelInfo>,
    /// Canonical: `/update_weights_from_disk` loads only from inside it.
    weights_dir: PathBuf,
    pub prefix: Mutex<PrefixStats>,
    pub paused: AtomicBool,
    pub requests: AtomicU64,
    pub limits: Limits,
    /// Requests admitted (`--max-pending`).
    pending: Arc<AtomicUsize>,
    /// Generations at once (`--max-concurrent`).
    slots: Arc<Semaphore>,
    /// One weight load at a time: each holds a whole model in memory.
    loads: Arc<Semaphore>,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What `miles serve` was started with.
pub struct ServeOptions {
    /// Listen address (`host:port`).
    pub bind: String,
    /// The model directory loaded first.
    pub model_path: PathBuf,
    /// The one directory `/update_weights_from_disk` loads from; None: `model_path`'s parent.
    /// Created if missing.
    pub weights_dir: Option<PathBuf>,
    /// The key every call but `/health*` and `/metrics` must carry as `Authorization: Bearer`.
    pub api_key: Option<String>,
    /// What one request may ask and how long it may take.
    pub limits: Limits,
    /// The OpenAI-compatible session server's hub over the loaded engine (`/v1/...`, openai.rs);
    /// Err: why there is none (the chat routes answer 501 saying so).
    pub chat: Result<Arc<miles_runtime::chat::Hub>, String>,
}

/// Whether a listen address reaches only this host: an IP in 127.0.0.0/8 or `::1` (also as
/// `::ffff:127.x.y.z`), or the name `localhost`. Anything else (`0.0.0.0`, `::`, another name) is
/// taken as reachable from elsewhere.
pub fn is_loopback_bind(bind: &str) -> bool {
    use std::net::{IpAddr, SocketAddr};
    fn loopback(ip: IpAddr) -> bool {
        match ip {
            IpAddr::V4(v4) => v4.is_loopback(),
            IpAddr::V6(v6) => v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback()),
        }
    }
    if let Ok(a) = bind.parse::<SocketAddr>() {
        return loopback(a.ip());
    }
    let host = bind.rsplit_once(':').map_or(bind, |(h, _)| h);
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    match host.parse::<IpAddr>() {
        Ok(ip) => loopback(ip),
        Err(_) => host.eq_ignore_ascii_case("localhost"),
    }
}

/// A server anyone else can reach must have a key: refuses a non-loopback `bind` without one.
pub fn check_bind(bind: &str, api_key: Option<&str>) -> Result<(), String> {
    if api_key.is_some() || is_loopback_bind(bind) {
        return Ok(());
    }
    Err(format!(
        "refusing to listen on {bind} without an API key: the address is not loopback, and whoever reaches it \
         could generate and replace the weights; pass --api-key KEY or set {API_KEY_ENV} (clients then send \
         `Authorization: Bearer KEY`), or bind to 127.0.0.1"
    ))
}

/// `requested`, resolved (`..` and symlinks followed), if it lies inside `root` (itself resolved,
/// as `std::fs::canonicalize` gives it). The resolved path is what is to be loaded, so a symlink
/// cannot point the load elsewhere after the check. Err: (HTTP status, message).
pub fn confine(root: &Path, requested: &Path) -> Result<PathBuf, (u16, String)> {
    let real = std::fs::canonicalize(requested)
        .map_err(|e| (400, format!("model_path {}: {e}; the current weights stay in use", requested.display())))?;
    if real.starts_with(root) {
        Ok(real)
    } else {
        Err((
            403,
            format!(
                "model_path {} resolves to {}, outside the weights directory {} this server was started with \
                 (--weights-dir); the current weights stay in use",
                requested.display(),
                real.display(),
                root.display()
            ),
        ))
    }
}

/// Whether an `Authorization` header carries `key` as a bearer token (scheme in any case, as
/// SGLang takes it), compared in constant time.
fn bearer_ok(header: Option<&str>, key: &str) -> bool {
    let Some((scheme, token)) = header.and_then(|h| h.split_once(' ')) else { return false };
    // Both sides of the comparison are always evaluated: a wrong scheme costs what a wrong key does.
    let ok = crate::auth::token_eq(token, key);
    scheme.eq_ignore_ascii_case("bearer") && ok
}

/// Paths served without a key, as SGLang does (`/health`, `/health_generate`, `/metrics`): liveness
/// probes and metric scrapers carry no secrets. Nothing here reads or changes the model.
fn open_path(path: &str) -> bool {
    path.starts_with("/health") || path.starts_with("/metrics")
}

/// An error answer in SGLang's shape; a 503 says when to come back.
fn fail(code: u16, m: String) -> Response {
    let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut r = (status, Json(json!({"error": {"message": m}}))).into_response();
    if code == 503 {
        r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    r
}

fn answer(r: Result<Value, Refusal>) -> Response {
    match r {
        Ok(v) => (StatusCode::OK, Json(v)).into_response(),
        Err((c, m)) => fail(c, m),
    }
}

/// An answer already written as JSON (on the blocking thread: a large answer's encoding does
/// not hold up the async threads).
fn answer_json(r: Result<Vec<u8>, Refusal>) -> Response {
    match r {
        Ok(b) => ([(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))], b).into_response(),
        Err((c, m)) => fail(c, m),
    }
}

/// Runs `f` on a blocking thread (engine work never runs on the two async threads, which keep
/// answering `/health` meanwhile).
async fn blocking<T: Send + 'static>(
    st: Arc<ServeState>,
    f: impl FnOnce(&ServeState) -> Result<T, Refusal> + Send + 'static,
) -> Result<T, Refusal> {
    match tokio::task::spawn_blocking(move || f(&st)).await {
        Ok(r) => r,
        Err(e) => Err((500, format!("the engine's thread failed: {e}"))),
    }
}

fn parse_json(body: &[u8]) -> Result<Value, Refusal> {
    serde_json::from_slice(body).map_err(|e| (400, format!("the request body is not JSON: {e}")))
}

/// `/generate`: admitted, body read, a slot waited for, then generated on a blocking thread;
/// all within `--request-timeout`. An abandoned generation stops at its next prompt group.
async fn generate(State(st): State<Arc<ServeState>>, req: Request) -> Response {
    let limit = st.limits.request_timeout;
    let deadline = Instant::now() + limit;
    let work = async move {
        let _admitted = Pending::admit(&st.pending, &st.limits)?;
        let body = read_body(req, &st.limits).await?;
        let what = format!("generation slot ({} at once, --max-concurrent)", st.limits.max_concurrent);
        let permit = slot(&st.slots, &st.limits, &what).await?;
        blocking(st, move |s| {
            // Held until the engine is done, also when the answer was given up on.
            let _permit = permit;
            let v = generate_blocking(s, &parse_json(&body)?, deadline)?;
            serde_json::to_vec(&v).map_err(|e| (500, format!("encoding the answer: {e}")))
        })
        .await
    };
    match tokio::time::timeout(limit, work).await {
        Ok(r) => answer_json(r),
        Err(_) => fail(
            504,
            format!("the request took over {:.1} s (--request-timeout); it was abandoned", limit.as_secs_f64()),
        ),
    }
}

/// `/update_weights_from_disk`: a directory inside `--weights-dir`, loaded beside the current
/// engine and swapped in; a refusal leaves the current weights in place.
async fn update_weights(State(st): State<Arc<ServeState>>, req: Request) -> Response {
    let work = async {
        let _admitted = Pending::admit(&st.pending, &st.limits)?;
        let b = parse_json(&read_body(req, &st.limits).await?)?;
        let permit = slot(&st.loads, &st.limits, "weight-load slot (one load at a time)").await?;
        blocking(st.clone(), move |s| {
            let _permit = permit;
            let path =
                b.get("model_path").and_then(Value::as_str).ok_or((400, "`model_path` is required".to_string()))?;
            let version = b
                .get("weight_version")
                .and_then(|w| w.as_u64().or_else(|| w.as_str().and_then(|x| x.parse().ok())))
                .unwrap_or(0);
            let path = confine(&s.weights_dir, Path::new(path))?;
            let mut fresh = (s.loader)(&path, version).map_err(|e| (400, e.to_string()))?;
            let mut e = lock(&s.engine);
            std::mem::swap(&mut *e, &mut fresh);
            let v = e.weight_version();
            *lock(&s.info) = ModelInfo { path, weight_version: v };
            *lock(&s.prefix) = PrefixStats::default();
            Ok(json!({"success": true, "message": "loaded", "weight_version": v.to_string()}))
        })
        .await
    };
    answer(work.await)
}

/// Before any handler (and before a body is read): with a key, the key on every path but the
/// open ones; without one, a Host that names loopback on every path (a server without a key
/// listens only on loopback, and a DNS-rebinding page names its own host).
pub(super) async fn gate(
    State(key): State<Arc<Option<String>>>,
    req: Request,
    next: axum::middleware::Next,
) -> Response {
    if let Some(k) = key.as_deref() {
        if !open_path(req.uri().path()) {
            let h = req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
            if !bearer_ok(h, k) {
                let m = if h.is_none() { "this server wants `Authorization: Bearer KEY`" } else { "wrong API key" };
                let mut r = fail(401, format!("Unauthorized: {m}"));
                r.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
                return r;
            }
        }
    } else {
        let host = req.headers().get(header::HOST).and_then(|v| v.to_str().ok());
        if !host.is_some_and(host_is_loopback) {
            let shown: String = host.unwrap_or("(none)").chars().take(100).collect();
            return fail(
                403,
                format!(
                    "Forbidden: Host {shown:?} does not name loopback; a server without an API key answers only \
                     requests addressed to localhost, 127.0.0.1 or [::1] (a defence against DNS rebinding); start \
                     it with --api-key or {API_KEY_ENV} to serve other names"
                ),
            );
        }
    }
    next.run(req).await
}

fn router(st: Arc<ServeState>, api_key: Option<String>, chat: axum::Router) -> axum::Router {
    let not_here = |m: &'static str| post(move || async move { fail(501, m.into()) });
    axum::Router::new()
        .route("/generate", post(generate))
        .route("/health", get(|| async { StatusCode::OK }))
        .route("/health_generate", get(|| async { StatusCode::OK }))
        .route(
            "/model_info",
            get(|State(st): State<Arc<ServeState>>| async move {
                let i = lock(&st.info);
                Json(json!({"model_path": i.path, "is_generation": true, "weight_version": i.weight_version.to_string()}))
            }),
        )
        .route(
            "/get_server_info",
            get(|State(st): State<Arc<ServeState>>| async move {
                let p = lock(&st.prefix);
                Json(json!({
                    "prefix_cache": {"prompt_tokens": p.prompt_tokens, "cached_tokens": p.cached_tokens, "hit_rate": p.hit_rate()},
                    "paused": st.paused.load(Ordering::SeqCst),
                }))
            }),
        )
        .route(
            "/metrics",
            get(|State(st): State<Arc<ServeState>>| async move {
                let p = lock(&st.prefix);
                format!(
                    "# TYPE sglang:cache_hit_rate gauge\nsglang:cache_hit_rate {}\nmiles:prompt_tokens_total {}\nmiles:cached_tokens_total {}\n",
                    p.hit_rate(),
                    p.prompt_tokens,
                    p.cached_tokens
                )
            }),
        )
        .route(
            "/flush_cache",
            post(|State(st): State<Arc<ServeState>>| async move {
                *lock(&st.prefix) = PrefixStats::default();
                Json(json!({"success": true}))
            }),
        )
        .route(
            "/pause_generation",
            post(|State(st): State<Arc<ServeState>>| async move {
                st.paused.store(true, Ordering::SeqCst);
                Json(json!({"success": true}))
            }),
        )
        .route(
            "/continue_generation",
            post(|State(st): State<Arc<ServeState>>| async move {
                st.paused.store(false, Ordering::SeqCst);
                Json(json!({"success": true}))
            }),
        )
        .route("/abort_request", post(|| async { Json(json!({"success": true})) }))
        .route("/update_weights_from_disk", post(update_weights))
        .route("/update_weights_from_tensor", not_here("needs a GPU process group; use /update_weights_from_disk"))
        .route("/init_weights_update_group", not_here("NCCL groups need GPUs; use /update_weights_from_disk"))
        .route("/update_weights_from_distributed", not_here("NCCL groups need GPUs; use /update_weights_from_disk"))
        // Explicit, so no extractor falls back on axum's implicit 2 MB.
        .layer(axum::extract::DefaultBodyLimit::max(st.limits.max_body_bytes))
        .with_state(st)
        .merge(chat)
        .layer(axum::middleware::from_fn_with_state(Arc::new(api_key), gate))
}

/// The weights directory: the given one, else the model directory's parent; created, resolved.
fn weights_dir(given: Option<PathBuf>, model_path: &Path) -> Result<PathBuf, String> {
    let dir = match given {
        Some(d) => d,
        None => std::fs::canonicalize(model_path)
            .map_err(|e| format!("{}: {e}", model_path.display()))?
            .parent()
            .map(Path::to_path_buf)
            .ok_or_else(|| format!("{} has no parent directory: pass --weights-dir", model_path.display()))?,
    };
    std::fs::create_dir_all(&dir).map_err(|e| format!("--weights-dir {}: {e}", dir.display()))?;
    std::fs::canonicalize(&dir).map_err(|e| format!("--weights-dir {}: {e}", dir.display()))
}

/// Serves the API until the process ends. `on_ready` gets the bound address.
pub fn serve(opts: ServeOptions, loader: Loader, on_ready: impl FnOnce(&str)) -> Result<(), String> {
    let ServeOptions { bind, model_path, weights_dir: given_dir, api_key, limits, chat } = opts;
    let api_key = api_key.filter(|k| !k.is_empty());
    if let Some(k) = &api_key {
        if !valid_api_key(k) {
            return Err("the API key must be printable ASCII without spaces (it travels in an HTTP header)".into());
        }
    }
    if limits.max_concurrent == 0 || limits.max_pending == 0 {
        return Err("--max-concurrent and --max-pending must be at least 1".into());
    }
    // Before anything slow: an exposed server without a key does not start at all.
    check_bind(&bind, api_key.as_deref())?;
    let weights_dir = weights_dir(given_dir, &model_path)?;
    let engine = loader(&model_path, 0).map_err(|e| e.to_string())?;
    let info = ModelInfo { path: model_path, weight_version: engine.weight_version() };
    let st = Arc::new(ServeState {
        engine: Mutex::new(engine),
        loader,
        info: Mutex::new(info),
        weights_dir,
        prefix: Mutex::new(PrefixStats::default()),
        paused: AtomicBool::new(false),
        requests: AtomicU64::new(0),
        pending: Arc::new(AtomicUsize::new(0)),
        slots: Arc::new(Semaphore::new(limits.max_concurrent)),
        loads: Arc::new(Semaphore::new(1)),
        limits,
    });
    let needs_key = api_key.is_some();
    let (header_timeout, max_connections) = (st.limits.header_timeout, st.limits.max_connections);
    let chat_routes = match chat {
        Ok(hub) => {
            let (pump_hub, pump_st) = (hub.clone(), st.clone());
            std::thread::Builder::new()
                .name("miles-chat-pump".into())
                .spawn(move || pump(&pump_hub, &pump_st))
                .map_err(|e| format!("cannot start the chat engine thread: {e}"))?;
            let hub: Arc<dyn miles_runtime::chat::ChatService> = hub;
            let cs = super::openai::ChatState { hub, limits: st.limits.clone(), pending: st.pending.clone() };
            super::openai::routes(Arc::new(cs))
        }
        Err(why) => super::openai::unavailable(why),
    };
    let app = router(st, api_key, chat_routes);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async move {
        let l = tokio::net::TcpListener::bind(&bind).await.map_err(|e| format!("cannot listen on {bind}: {e}"))?;
        let addr = l.local_addr().map_err(|e| e.to_string())?;
        // The name may have resolved elsewhere than loopback (`localhost` in /etc/hosts).
        if !needs_key {
            check_bind(&addr.to_string(), None)?;
        }
        on_ready(&addr.to_string());
        accept(l, app, header_timeout, max_connections).await;
        Ok(())
    })
}

/// The chat hub's engine side: serves its queued requests on the loaded engine, holding the
/// engine's lock only while a batch is sampled (and never while `/pause_generation` holds).
fn pump(hub: &miles_runtime::chat::Hub, st: &ServeState) {
    loop {
        if st.paused.load(Ordering::SeqCst) {
            std::thread::sleep(std::time::Duration::from_millis(50));
            continue;
        }
        if !hub.wait_for_requests(std::time::Duration::from_millis(200)) {
            continue;
        }
        let mut engine = lock(&st.engine);
        // A failed batch is answered 500 to its requests; the server goes on.
        if let Err(e) = hub.serve_pending(&mut **engine, std::time::Duration::ZERO) {
            eprintln!("miles serve: chat: {e}");
        }
    }
}

/// Serves each connection with hyper directly (axum::serve sets no timer, so slow headers would
/// hold a connection for ever): headers, and the idle time between kept-alive requests, are
/// bounded by `header_timeout`; at most `max_connections` are served at once (the next is
/// accepted when one ends). Never returns.
pub(super) async fn accept(
    l: tokio::net::TcpListener,
    app: axum::Router,
    header_timeout: std::time::Duration,
    max_connections: usize,
) {
    use hyper_util::rt::{TokioIo, TokioTimer};
    let open = Arc::new(Semaphore::new(max_connections));
    loop {
        // A permit before accepting: past the bound, connections wait in the backlog, unread.
        let Ok(permit) = open.clone().acquire_owned().await else { return };
        let sock = match l.accept().await {
            Ok((s, _)) => s,
            // Out of file descriptors, or a connection reset before it was accepted: the server
            // goes on (a short pause, so a persistent error does not spin).
            Err(_) => {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                continue;
            }
        };
        let _ = sock.set_nodelay(true);
        let svc = hyper_util::service::TowerToHyperService::new(app.clone());
        tokio::spawn(async move {
            let _permit = permit;
            let mut b = hyper::server::conn::http1::Builder::new();
            b.timer(TokioTimer::new()).header_read_timeout(header_timeout);
            // A connection's error (reset, timeout, bad request) ends that connection only.
            let _ = b.serve_connection(TokioIo::new(sock), svc).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_reuse_is_counted_like_a_radix_cache() {
        let mut p = PrefixStats::default();
        assert_eq!(p.record(&[1, 2, 3, 4]), 0);
        assert_eq!(p.record(&[1, 2, 3, 4]), 4);
        assert_eq!(p.record(&[1, 2, 9]), 2);
        assert_eq!(p.record(&[7, 2, 3]), 0);
        assert_eq!((p.prompt_tokens, p.cached_tokens), (14, 6));
    }

    #[test]
    fn loopback_addresses_and_the_key_rule() {
        for b in
            ["127.0.0.1:30000", "127.3.2.1:0", "[::1]:8080", "localhost:30000", "LOCALHOST:1", "[::ffff:127.0.0.1]:5"]
        {
            assert!(is_loopback_bind(b), "{b}");
            assert!(check_bind(b, None).is_ok(), "{b}");
        }
        for b in [
            "0.0.0.0:0",
            "[::]:30000",
            "10.0.0.5:30000",
            "128.0.0.1:1",
            "example.com:80",
            "localhost.evil:1",
            "[::2]:1",
        ] {
            assert!(!is_loopback_bind(b), "{b}");
            let e = check_bind(b, None).unwrap_err();
            assert!(e.contains(b) && e.contains("--api-key") && e.contains(API_KEY_ENV), "{e}");
            assert!(check_bind(b, Some("k")).is_ok(), "{b}");
        }
    }

    #[test]
    fn bearer_tokens() {
        assert!(bearer_ok(Some("Bearer s3cret"), "s3cret"));
        assert!(bearer_ok(Some("bearer s3cret"), "s3cret"));
        for h in [
            None,
            Some("Bearer"),
            Some("Bearer "),
            Some("Bearer s3cre"),
            Some("Bearer s3cretx"),
            Some("Basic s3cret"),
            Some("s3cret"),
        ] {
            assert!(!bearer_ok(h, "s3cret"), "{h:?}");
        }
        assert!(open_path("/health") && open_path("/health_generate") && open_path("/metrics"));
        assert!(!open_path("/generate") && !open_path("/update_weights_from_disk") && !open_path("/model_info"));
        assert!(
            valid_api_key("abc-123_XYZ") && !valid_api_key("") && !valid_api_key("a b") && !valid_api_key("a\r\nX: y")
        );
    }

    #[test]
    fn weight_paths_stay_inside_the_weights_dir() {
        let base = std::env::temp_dir().join(format!("miles-confine-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let (root, outside) = (base.join("weights"), base.join("weights-other"));
        std::fs::create_dir_all(root.join("v1")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("link")).unwrap();
        std::os::unix::fs::symlink(root.join("v1"), base.join("link-in")).unwrap();
        let root = std::fs::canonicalize(&root).unwrap();
        assert_eq!(confine(&root, &root.join("v1")).unwrap(), root.join("v1"));
        assert_eq!(confine(&root, &root.join("v1/../v1")).unwrap(), root.join("v1"));
        // A link from outside to inside is fine: what is loaded is inside.
        assert_eq!(confine(&root, &base.join("link-in")).unwrap(), root.join("v1"));
        for p in [root.join("../weights-other"), root.join("v1/../../weights-other"), root.join("link"), base.clone()] {
            let (code, m) = confine(&root, &p).unwrap_err();
            assert_eq!(code, 403, "{p:?}: {m}");
            assert!(m.contains("outside the weights directory") && m.contains("--weights-dir"), "{m}");
        }
        // A sibling whose name starts like the root is outside (components, not characters).
        assert_eq!(confine(&root, &outside).unwrap_err().0, 403);
        assert_eq!(confine(&root, &root.join("missing")).unwrap_err().0, 400);
        let _ = std::fs::remove_dir_all(&base);
    }
}
