//! What a run's chat server is, as the run sees it: the OpenAI-compatible session server's wire
//! errors and the traits its HTTP side (engine/workers) and the external-framework layer
//! implement. They live here, below every layer that holds them (`RunOptions::chat_server`), and
//! `crate::chat` re-exports them beside the `Hub` that implements [`ChatService`].

use crate::RunError;
use std::sync::Arc;
use std::time::Instant;

/// An error answered to an OpenAI client: the HTTP status and the body
/// `{"error": {"message", "type", "code"}}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatError {
    pub status: u16,
    pub code: &'static str,
    pub message: String,
}

impl ChatError {
    pub fn new(status: u16, code: &'static str, message: impl Into<String>) -> ChatError {
        ChatError { status, code, message: message.into() }
    }

    /// 400 `invalid_request_error`.
    pub fn bad_request(message: impl Into<String>) -> ChatError {
        ChatError::new(400, "invalid_request_error", message)
    }

    /// The OpenAI error body.
    pub fn body(&self) -> serde_json::Value {
        let kind = match self.status {
            401 => "authentication_error",
            404 => "not_found_error",
            429 => "rate_limit_error",
            400..=499 => "invalid_request_error",
            _ => "server_error",
        };
        serde_json::json!({"error": {"message": self.message, "type": kind, "code": self.code}})
    }
}

impl std::fmt::Display for ChatError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.status, self.code, self.message)
    }
}

/// The external-framework layer: sessions opened and finished by a harness over HTTP.
pub trait ExternalSessions: Send + Sync {
    /// `POST /v1/sessions`.
    fn open(&self, body: &serde_json::Value) -> Result<serde_json::Value, ChatError>;
    /// `POST /v1/sessions/{id}/finish`.
    fn finish(&self, id: &str, body: &serde_json::Value) -> Result<serde_json::Value, ChatError>;
}

/// What the HTTP server asks of a hub (`crate::chat::Hub` implements it). Every method may block
/// (call it on a blocking thread).
pub trait ChatService: Send + Sync {
    /// `POST /v1/chat/completions`: the `chat.completion` object, or the error to answer.
    fn chat(
        &self,
        session: Option<&str>,
        body: &serde_json::Value,
        deadline: Instant,
    ) -> Result<serde_json::Value, ChatError>;
    /// `GET /v1/models`.
    fn models(&self) -> serde_json::Value;
    /// `GET /v1/sessions/{id}`: what the session recorded so far; 404 when unknown.
    fn session_json(&self, id: &str) -> Result<serde_json::Value, ChatError>;
    /// Where `POST /v1/sessions` and `.../finish` go; None: answered 404.
    fn external(&self) -> Option<Arc<dyn ExternalSessions>>;
}

/// How a run starts the HTTP server over a hub (implemented in engine/workers, handed to the
/// runtime in `RunOptions::chat_server`). A caller passes an `Arc<chat::Hub>`.
pub trait ChatServer: Send + Sync {
    fn start(
        &self,
        hub: Arc<dyn ChatService>,
        bind: &str,
        api_key: &str,
    ) -> Result<Box<dyn RunningChatServer>, RunError>;
}

/// A started server; dropping it stops it (a bounded, graceful shutdown).
pub trait RunningChatServer: Send {
    /// `http://127.0.0.1:PORT`.
    fn base_url(&self) -> String;
}

impl std::fmt::Debug for dyn ChatServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ChatServer")
    }
}
