//! The OpenAI-compatible session server over a chat hub (docs/agents.md "The session server"):
//! `GET /v1/models`, `POST /v1/chat/completions` (no session: plain inference; header
//! `X-Miles-Session: ID` names one), the same under `/sessions/{ID}/v1/...` so an OpenAI SDK works
//! unmodified with `base_url = http://HOST:PORT/sessions/{ID}/v1`, `GET /v1/sessions/{ID}` (what the
//! session recorded), and `POST /v1/sessions`, `POST /v1/sessions/{ID}/finish` for the external
//! layer. Served inside `miles serve` (merged into its router) and, for `miles run`, by
//! [`OpenAiServer`], a `ChatServer` on a runtime thread of its own. Bodies, admission, timeouts
//! and connections are bounded by `limits.rs`; the key and Host gate is serve.rs's. The hub's calls
//! block, so they run on `spawn_blocking`; a turn is recorded there once sampled, whatever the
//! client does meanwhile (a client that disconnects mid-stream loses nothing recorded).

use super::limits::{read_body, Limits, Pending, Refusal};
use super::serve::{accept, gate};
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Json;
use miles_runtime::chat::{ChatError, ChatServer, ChatService, RunningChatServer};
use miles_runtime::RunError;
use serde_json::{json, Value};
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The header that names a session on the unprefixed routes.
pub const SESSION_HEADER: &str = "x-miles-session";

pub(super) struct ChatState {
    pub hub: Arc<dyn ChatService>,
    pub limits: Limits,
    /// Requests admitted (shared with the server's other routes in `miles serve`).
    pub pending: Arc<AtomicUsize>,
}

fn error(e: &ChatError) -> Response {
    let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut r = (status, Json(e.body())).into_response();
    if e.status == 503 {
        r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    r
}

fn refused((status, message): Refusal) -> ChatError {
    let code = match status {
        408 => "body_timeout",
        413 => "request_too_large",
        503 => "server_busy",
        _ => "invalid_request_error",
    };
    ChatError::new(status, code, message)
}

/// Runs a hub call on a blocking thread.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ChatError> + Send + 'static,
) -> Result<T, ChatError> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(ChatError::new(500, "internal_error", format!("the hub's thread failed: {e}"))))
}

/// The session a request names: the URL's, or the header's (both: they must agree).
fn session_of(path: Option<String>, headers: &HeaderMap) -> Result<Option<String>, ChatError> {
    let header = match headers.get(SESSION_HEADER) {
        None => None,
        Some(v) => {
            Some(v.to_str().map_err(|_| ChatError::bad_request("the X-Miles-Session header is not text"))?.to_string())
        }
    };
    match (path, header) {
        (Some(p), Some(h)) if p != h => {
            Err(ChatError::bad_request(format!("the URL names session {p:?} and the X-Miles-Session header {h:?}")))
        }
        (p, h) => Ok(p.or(h)),
    }
}

async fn body_json(st: &ChatState, req: Request) -> Result<Value, ChatError> {
    let body = read_body(req, &st.limits).await.map_err(refused)?;
    serde_json::from_slice(&body).map_err(|e| ChatError::bad_request(format!("the request body is not JSON: {e}")))
}

async fn chat(st: Arc<ChatState>, session: Option<String>, req: Request) -> Response {
    let limit = st.limits.request_timeout;
    let deadline = Instant::now() + limit;
    let work = async {
        let _admitted = Pending::admit(&st.pending, &st.limits).map_err(refused)?;
        let body = body_json(&st, req).await?;
        let stream = body.get("stream") == Some(&Value::Bool(true));
        let usage = body.pointer("/stream_options/include_usage") == Some(&Value::Bool(true));
        let hub = st.hub.clone();
        let answer = blocking(move || hub.chat(session.as_deref(), &body, deadline)).await?;
        Ok::<_, ChatError>(match stream {
            true => sse(&answer, usage),
            false => (StatusCode::OK, Json(answer)).into_response(),
        })
    };
    // The hub answers 504 at the deadline itself; this bounds the body's read and admission too.
    match tokio::time::timeout(limit + Duration::from_secs(1), work).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => error(&e),
        Err(_) => error(&ChatError::new(504, "timeout", "the request took over --request-timeout")),
    }
}

async fn chat_header(State(st): State<Arc<ChatState>>, req: Request) -> Response {
    match session_of(None, req.headers()) {
        Ok(s) => chat(st, s, req).await,
        Err(e) => error(&e),
    }
}

async fn chat_path(State(st): State<Arc<ChatState>>, Path(id): Path<String>, req: Request) -> Response {
    match session_of(Some(id), req.headers()) {
        Ok(s) => chat(st, s, req).await,
        Err(e) => error(&e),
    }
}

async fn session_get(State(st): State<Arc<ChatState>>, Path(id): Path<String>) -> Response {
    let hub = st.hub.clone();
    match blocking(move || hub.session_json(&id)).await {
        Ok(v) => Json(v).into_response(),
        Err(e) => error(&e),
    }
}

fn no_external() -> ChatError {
    ChatError::new(
        404,
        "not_found",
        "this server opens no sessions over HTTP: sessions come from the run's episodes (a recipe's \
         `external_agents` layer opens them), or from the session id in the URL on `miles serve`",
    )
}

async fn session_open(State(st): State<Arc<ChatState>>, req: Request) -> Response {
    let r = async {
        let _admitted = Pending::admit(&st.pending, &st.limits).map_err(refused)?;
        let body = body_json(&st, req).await?;
        let ext = st.hub.external().ok_or_else(no_external)?;
        blocking(move || ext.open(&body)).await
    };
    match r.await {
        Ok(v) => Json(v).into_response(),
        Err(e) => error(&e),
    }
}

async fn session_finish(State(st): State<Arc<ChatState>>, Path(id): Path<String>, req: Request) -> Response {
    let r = async {
        let _admitted = Pending::admit(&st.pending, &st.limits).map_err(refused)?;
        let body = body_json(&st, req).await?;
        let ext = st.hub.external().ok_or_else(no_external)?;
        blocking(move || ext.finish(&id, &body)).await
    };
    match r.await {
        Ok(v) => Json(v).into_response(),
        Err(e) => error(&e),
    }
}

/// The chat routes, state applied (merged into `miles serve`'s router, or served alone).
pub(super) fn routes(st: Arc<ChatState>) -> axum::Router {
    let models = |State(st): State<Arc<ChatState>>| async move { Json(st.hub.models()) };
    axum::Router::new()
        .route("/v1/models", get(models))
        .route("/sessions/{id}/v1/models", get(models))
        .route("/v1/chat/completions", post(chat_header))
        .route("/sessions/{id}/v1/chat/completions", post(chat_path))
        .route("/v1/sessions", post(session_open))
        .route("/v1/sessions/{id}", get(session_get))
        .route("/v1/sessions/{id}/finish", post(session_finish))
        .with_state(st)
}

/// The chat routes of a server without a hub (a model directory without a tokenizer): each
/// answers 501 saying why.
pub(super) fn unavailable(why: String) -> axum::Router {
    let why = Arc::new(why);
    let answer = move || {
        let why = why.clone();
        async move { error(&ChatError::new(501, "not_implemented", why.as_str())) }
    };
    axum::Router::new()
        .route("/v1/models", get(answer.clone()))
        .route("/v1/chat/completions", post(answer.clone()))
        .route("/sessions/{id}/v1/chat/completions", post(answer.clone()))
        .route("/v1/sessions", post(answer.clone()))
        .route("/v1/sessions/{id}", get(answer))
}

fn chunk(answer: &Value, choices: Value) -> Value {
    json!({
        "id": answer["id"],
        "object": "chat.completion.chunk",
        "created": answer["created"],
        "model": answer["model"],
        "choices": choices,
    })
}

/// A `chat.completion` as `chat.completion.chunk` events: per choice a role delta, its content
/// delta, its tool-call deltas and its finish reason; then usage (`stream_options.include_usage`)
/// and the miles extension; then `[DONE]`. The turn is sampled whole before the first event.
pub fn sse_events(answer: &Value, include_usage: bool) -> Vec<String> {
    let mut events = Vec::new();
    let mut push = |v: Value| events.push(format!("data: {v}\n\n"));
    for c in answer["choices"].as_array().into_iter().flatten() {
        let i = &c["index"];
        let m = &c["message"];
        let delta = |d: Value, lp: &Value| json!([{"index": i, "delta": d, "logprobs": lp, "finish_reason": null}]);
        push(chunk(answer, delta(json!({"role": "assistant", "content": ""}), &Value::Null)));
        if let Some(text) = m["content"].as_str().filter(|t| !t.is_empty()) {
            push(chunk(answer, delta(json!({"content": text}), &c["logprobs"])));
        }
        for (j, call) in m["tool_calls"].as_array().into_iter().flatten().enumerate() {
            let d = json!({"tool_calls": [{"index": j, "id": call["id"], "type": "function", "function": call["function"]}]});
            push(chunk(answer, delta(d, &Value::Null)));
        }
        push(chunk(answer, json!([{"index": i, "delta": {}, "logprobs": null, "finish_reason": c["finish_reason"]}])));
    }
    if include_usage || answer.get("miles").is_some() {
        let mut last = chunk(answer, json!([]));
        if include_usage {
            last["usage"] = answer["usage"].clone();
        }
        if let Some(m) = answer.get("miles") {
            last["miles"] = m.clone();
        }
        push(last);
    }
    events.push("data: [DONE]\n\n".into());
    events
}

fn sse(answer: &Value, include_usage: bool) -> Response {
    let events = sse_events(answer, include_usage)
        .into_iter()
        .map(|e| Ok::<_, std::convert::Infallible>(axum::body::Bytes::from(e)));
    let body = axum::body::Body::from_stream(tokio_stream::iter(events));
    (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream")),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        ],
        body,
    )
        .into_response()
}

/// The session server for `miles run`: `start` binds `bind` (a port of 0 picks one), serves on
/// a tokio runtime of its own thread, and wants `Authorization: Bearer KEY` on every call but
/// `/health`.
#[derive(Debug, Clone, Default)]
pub struct OpenAiServer {
    pub limits: Limits,
}

/// How long dropping a server waits for its thread to end.
const STOP_WAIT: Duration = Duration::from_secs(5);

struct Running {
    url: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    stopped: std::sync::mpsc::Receiver<()>,
}

impl RunningChatServer for Running {
    fn base_url(&self) -> String {
        self.url.clone()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        // Bounded: a thread still busy after this is left to end on its own.
        let _ = self.stopped.recv_timeout(STOP_WAIT);
    }
}

fn server_error(m: String) -> RunError {
    RunError::new(miles_runtime::E_BACKEND, format!("the session server: {m}"))
}

impl ChatServer for OpenAiServer {
    fn start(
        &self,
        hub: Arc<dyn ChatService>,
        bind: &str,
        api_key: &str,
    ) -> Result<Box<dyn RunningChatServer>, RunError> {
        if !super::valid_api_key(api_key) {
            return Err(server_error("its API key must be printable ASCII without spaces".into()));
        }
        let listener =
            std::net::TcpListener::bind(bind).map_err(|e| server_error(format!("cannot listen on {bind}: {e}")))?;
        let addr = listener.local_addr().map_err(|e| server_error(e.to_string()))?;
        listener.set_nonblocking(true).map_err(|e| server_error(e.to_string()))?;
        let host = if addr.ip().is_unspecified() { "127.0.0.1".to_string() } else { addr.ip().to_string() };
        let url = match addr {
            std::net::SocketAddr::V6(_) if !addr.ip().is_unspecified() => format!("http://[{host}]:{}", addr.port()),
            _ => format!("http://{host}:{}", addr.port()),
        };
        let st = Arc::new(ChatState { hub, limits: self.limits.clone(), pending: Arc::new(AtomicUsize::new(0)) });
        let (header_timeout, max_connections) = (st.limits.header_timeout, st.limits.max_connections);
        let key = Arc::new(Some(api_key.to_string()));
        let app = routes(st)
            .route("/health", get(|| async { StatusCode::OK }))
            .layer(axum::middleware::from_fn_with_state(key, gate));
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("miles-chat")
            .enable_all()
            .build()
            .map_err(|e| server_error(e.to_string()))?;
        let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let (stopped_tx, stopped) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("miles-chat-server".into())
            .spawn(move || {
                rt.block_on(async move {
                    let Ok(l) = tokio::net::TcpListener::from_std(listener) else { return };
                    tokio::select! {
                        _ = accept(l, app, header_timeout, max_connections) => {}
                        _ = stop_rx => {}
                    }
                });
                // Connections still open are ended within a bounded time.
                rt.shutdown_timeout(Duration::from_secs(2));
                let _ = stopped_tx.send(());
            })
            .map_err(|e| server_error(format!("cannot start its thread: {e}")))?;
        Ok(Box::new(Running { url, stop: Some(stop), stopped }))
    }
}
