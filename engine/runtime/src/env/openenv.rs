//! `openenv` environments: an HTTP service speaking OpenEnv's protocol (the `openenv-core`
//! package, Meta and Hugging Face), so environments from its hub plug in. OpenEnv 0.3's REST
//! `/reset` and `/step` build a fresh environment per request (stateless), so a multi-turn
//! episode runs over its `/ws` WebSocket session, as OpenEnv's own client does: one connection per
//! episode (the server gives each its own environment; its `max_concurrent_envs` caps them):
//!
//! ```text
//! -> {"type": "reset", "data": {"seed": 7, "episode_id": "s0/e3", ...metadata of the row}}
//! <- {"type": "observation", "data": {"observation": {...}, "reward": null, "done": false}}
//! -> {"type": "step", "data": {"message": "<the model's turn>"}}      (the action object)
//! <- {"type": "observation", "data": {"observation": {...}, "reward": 1.0, "done": true}}
//! <- {"type": "error", "data": {"message": "...", "code": "EXECUTION_ERROR"}}
//! -> {"type": "close"}
//! ```
//!
//! The action object is `{<action_field>: text}` (or, with `action_field` unset, the arguments
//! object of the turn's first tool call); the observation text is `observation[<observation_field>]`
//! (or its only string field, or the whole object as JSON). OpenEnv has one `done` flag: it is
//! taken as `terminated`.

pub use crate::spec::env::OpenEnvSpec;

use super::ws::{WebSocket, WsError};
use super::{Action, EnvFault, Environment, StepResult, Task};
use crate::http_client::{self, Url};
use crate::quote::truncate;
use crate::{RunError, E_SPEC};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub struct OpenEnv {
    spec: OpenEnvSpec,
    ws_url: Url,
    /// The open session of each episode.
    sessions: Mutex<HashMap<String, Arc<Mutex<WebSocket>>>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn fault(e: WsError) -> EnvFault {
    if e.timed_out {
        EnvFault::Timeout(e.what)
    } else if e.refused {
        EnvFault::Refused(e.what)
    } else {
        EnvFault::Crashed(e.what)
    }
}

impl OpenEnv {
    pub fn new(spec: OpenEnvSpec) -> Result<OpenEnv, RunError> {
        // The WebSocket schemes name the same server as the HTTP ones.
        let http = match (spec.url.strip_prefix("ws://"), spec.url.strip_prefix("wss://")) {
            (Some(r), _) => format!("http://{r}"),
            (_, Some(r)) => format!("https://{r}"),
            _ => spec.url.clone(),
        };
        let mut url = http_client::parse_url(&http)
            .map_err(|e| RunError::new(E_SPEC, format!("environment `{}`: `url` {}: {e}", spec.name, spec.url)))?;
        url.path = format!("{}/ws", url.path.trim_end_matches('/'));
        Ok(OpenEnv { spec, ws_url: url, sessions: Mutex::new(HashMap::new()) })
    }

    /// Sends one message on `ws` and reads its answer's `data` (an `error` answer is a fault).
    fn exchange(ws: &mut WebSocket, message: &Value, timeout: Duration) -> Result<Value, EnvFault> {
        let deadline = Instant::now() + timeout;
        ws.send_text(&message.to_string(), deadline).map_err(fault)?;
        let text = ws.recv_text(deadline).map_err(fault)?;
        let v: Value = serde_json::from_str(&text).map_err(|e| {
            EnvFault::Malformed(format!("answered a message that is not JSON ({e}): {}", truncate(&text, 200)))
        })?;
        let data = v.get("data").cloned().unwrap_or(Value::Null);
        match v.get("type").and_then(Value::as_str) {
            Some("observation") | Some("state") => Ok(data),
            Some("error") => {
                let msg = data.get("message").and_then(Value::as_str).unwrap_or("");
                let code = data.get("code").and_then(Value::as_str).unwrap_or("?");
                let what = truncate(&format!("{code}: {msg}"), 400);
                Err(match code {
                    // openenv-core's answer to a session past its `max_concurrent_envs`.
                    "CAPACITY_REACHED" => EnvFault::Refused(what),
                    _ => EnvFault::Error(what),
                })
            }
            _ => Err(EnvFault::Malformed(format!("an answer of unknown type: {}", truncate(&text, 200)))),
        }
    }

    /// The text the model is shown.
    fn observation_text(&self, data: &Value) -> Result<String, EnvFault> {
        let obs = data.get("observation").ok_or_else(|| {
            EnvFault::Malformed(format!(
                "an observation answer without `observation`: {}",
                truncate(&data.to_string(), 200)
            ))
        })?;
        let as_text = |v: &Value| v.as_str().map(str::to_string).unwrap_or_else(|| v.to_string());
        if let Some(f) = &self.spec.observation_field {
            return obs.get(f).map(as_text).ok_or_else(|| {
                EnvFault::Malformed(format!("the observation has no field `{f}`: {}", truncate(&obs.to_string(), 200)))
            });
        }
        let strings: Vec<&str> =
            obs.as_object().map(|m| m.values().filter_map(Value::as_str).collect()).unwrap_or_default();
        Ok(match strings.as_slice() {
            [one] => one.to_string(),
            _ => obs.to_string(),
        })
    }

    fn action_object(&self, action: &Action) -> Result<Value, EnvFault> {
        match &self.spec.action_field {
            Some(f) => Ok(json!({ f.as_str(): action.text })),
            None => match action.tool_calls.first() {
                Some(c) if c.arguments.is_object() => Ok(c.arguments.clone()),
                // The driver shows a turn without a usable call to the model as a bad tool call;
                // reaching here means the action cannot be built.
                _ => Err(EnvFault::Error(
                    "the turn has no tool call with an arguments object to send as the action".into(),
                )),
            },
        }
    }
}

impl Environment for OpenEnv {
    fn name(&self) -> &str {
        &self.spec.name
    }

    fn reset(&self, task: &Task, timeout: Duration) -> Result<String, EnvFault> {
        self.session(task, timeout).map_err(|f| match f {
            EnvFault::Refused(what) => EnvFault::Refused(self.refusal(&what)),
            other => other,
        })
    }

    fn step(&self, episode: &str, action: &Action, timeout: Duration) -> Result<StepResult, EnvFault> {
        let ws = lock(&self.sessions)
            .get(episode)
            .cloned()
            .ok_or_else(|| EnvFault::Error(format!("no open session for episode `{episode}`")))?;
        let message = json!({"type": "step", "data": self.action_object(action)?});
        let data = Self::exchange(&mut lock(&ws), &message, timeout)?;
        let observation = self.observation_text(&data)?;
        let mut r = super::jsonl::step_result(&json!({"reward": data.get("reward"), "done": data.get("done")}))?;
        r.observation = observation;
        Ok(r)
    }

    fn close(&self, episode: &str) {
        if let Some(ws) = lock(&self.sessions).remove(episode) {
            let mut ws = lock(&ws);
            let _ = ws.send_text(r#"{"type":"close"}"#, Instant::now() + Duration::from_millis(200));
            ws.close();
        }
    }
}

impl OpenEnv {
    /// What a refused session says: the server's cap of sessions when its answer names it
    /// (openenv-core: `Server at capacity: 1/1 sessions active`), and that every live episode
    /// holds one session for its whole length. Short enough to be quoted whole on the console's
    /// warning line (`env::faults`, 300 characters).
    fn refusal(&self, what: &str) -> String {
        let cap = what
            .split_once("sessions active")
            .and_then(|(head, _)| head.rsplit_once('/'))
            .and_then(|(_, n)| n.trim().parse::<usize>().ok());
        let url = self.ws_url.ws();
        match cap {
            Some(n) => format!(
                "the server at {url} accepts {n} session(s) at once (its max_concurrent_envs; {}) and refused \
                 this episode's; each live episode holds one to its end: give it at least rollout_batch x \
                 samples_per_prompt",
                what.split(':').next().unwrap_or(what)
            ),
            None => format!("the server at {url} refused a session ({what})"),
        }
    }

    /// Opens the episode's WebSocket session and resets it.
    fn session(&self, task: &Task, timeout: Duration) -> Result<String, EnvFault> {
        let mut ws = WebSocket::connect(&self.ws_url, timeout).map_err(fault)?;
        let mut data = json!({"seed": task.seed, "episode_id": task.episode});
        if let Some(m) = task.metadata.as_object() {
            for (k, v) in m {
                data[k] = v.clone();
            }
        }
        let answer = Self::exchange(&mut ws, &json!({"type": "reset", "data": data}), timeout);
        let answer = match answer {
            Ok(a) => a,
            Err(e) => {
                ws.close();
                return Err(e);
            }
        };
        let text = self.observation_text(&answer)?;
        lock(&self.sessions).insert(task.episode.clone(), Arc::new(Mutex::new(ws)));
        Ok(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(u: &str) -> Result<String, String> {
        let spec = OpenEnvSpec { name: "e".into(), url: u.into(), action_field: None, observation_field: None };
        OpenEnv::new(spec).map(|e| e.ws_url.ws()).map_err(|e| e.message)
    }

    #[test]
    fn urls_name_the_ws_session() {
        assert_eq!(url("http://h:8000").unwrap(), "ws://h:8000/ws");
        assert_eq!(url("ws://h:8000/").unwrap(), "ws://h:8000/ws");
        assert_eq!(url("https://h/env").unwrap(), "wss://h:443/env/ws");
        assert_eq!(url("wss://h:9/").unwrap(), "wss://h:9/ws");
        assert_eq!(url("ftp://h").unwrap_err(), "environment `e`: `url` ftp://h: must start with http:// or https://");
    }

    /// Issue #41: a refused session names the server's cap (openenv-core's words for it), short
    /// enough for the console's warning line to quote it whole; a refusal without a cap is quoted.
    #[test]
    fn a_refusal_names_the_servers_cap() {
        let spec = OpenEnvSpec {
            name: "e".into(),
            url: "http://127.0.0.1:8000".into(),
            action_field: None,
            observation_field: None,
        };
        let env = OpenEnv::new(spec).unwrap();
        let said =
            env.refusal("CAPACITY_REACHED: Server at capacity: 1/1 sessions active. Cannot accept new connections.");
        assert!(
            said.starts_with(
                "the server at ws://127.0.0.1:8000/ws accepts 1 session(s) at once (its max_concurrent_envs; CAPACITY_REACHED)"
            ),
            "{said}"
        );
        assert!(
            said.chars().count() <= 300 - 40,
            "room for a longer host: {} characters: {said}",
            said.chars().count()
        );
        let busy = env.refusal("the server refused the WebSocket upgrade: HTTP 503 Service Unavailable");
        assert_eq!(
            busy,
            "the server at ws://127.0.0.1:8000/ws refused a session (the server refused the WebSocket upgrade: HTTP 503 Service Unavailable)"
        );
    }
}
