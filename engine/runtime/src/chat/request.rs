//! An OpenAI `chat.completions` body, read and checked: every field this server honours is
//! validated, a field that would change the answer in a way it cannot honour is refused by name
//! (400), and the rest (`user`, `metadata`, `store`, `model`, ...) is ignored as OpenAI servers do.

use super::{ChatError, HubConfig};
use crate::sample::SamplingParams;
use serde_json::{json, Map, Value};

/// Choices one request may ask for (`n`).
pub const MAX_N: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    System,
    User,
    Assistant,
    Tool,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

/// A tool call of an assistant message: its arguments parsed (the template renders them as JSON).
#[derive(Debug, Clone, PartialEq)]
pub struct CallIn {
    pub id: String,
    pub name: String,
    pub arguments: Value,
}

/// One message, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub role: Role,
    /// The text (a list of text parts joined); "" for a null content.
    pub content: String,
    pub tool_calls: Vec<CallIn>,
    pub tool_call_id: Option<String>,
    pub name: Option<String>,
}

impl Message {
    /// The message as the chat template takes it (Hugging Face's form: a tool call's arguments
    /// as an object), with `content` in place of the text.
    pub fn template_json(&self, content: &str) -> Value {
        let mut m = Map::new();
        m.insert("role".into(), json!(self.role.name()));
        m.insert("content".into(), json!(content));
        if !self.tool_calls.is_empty() {
            let calls: Vec<Value> = self
                .tool_calls
                .iter()
                .map(
                    |c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}),
                )
                .collect();
            m.insert("tool_calls".into(), Value::Array(calls));
        }
        if let Some(id) = &self.tool_call_id {
            m.insert("tool_call_id".into(), json!(id));
        }
        if let Some(n) = &self.name {
            m.insert("name".into(), json!(n));
        }
        Value::Object(m)
    }

    /// What identifies an assistant message's answer: its text and its calls (names and
    /// arguments as values, so the JSON's spacing and key order do not matter; call ids do not).
    pub fn answer_key(&self) -> u64 {
        let calls: Vec<Value> = self.tool_calls.iter().map(|c| json!([c.name, c.arguments])).collect();
        let v = json!([self.content, calls]);
        crate::session::message_key("assistant-text", v.to_string().as_bytes())
    }

    /// The key of a message that is not a sampled turn (the role, text, calls and ids).
    pub fn key(&self) -> u64 {
        crate::session::message_key(self.role.name(), self.template_json(&self.content).to_string().as_bytes())
    }
}

/// A checked request.
#[derive(Debug, Clone)]
pub struct ChatRequest {
    pub messages: Vec<Message>,
    /// Tool schemas for the template (None: no tools, or `tool_choice: "none"`).
    pub tools: Option<Value>,
    pub n: usize,
    /// Sampling settings; `max_new_tokens` is `max_tokens` if given (bounded by the context later).
    pub params: SamplingParams,
    /// `max_tokens` as asked (None: the server's default, bounded by the context).
    pub max_tokens: Option<usize>,
    /// `seed` as asked.
    pub seed: Option<u64>,
    pub logprobs: bool,
    pub return_token_ids: bool,
}

fn bad(m: impl Into<String>) -> ChatError {
    ChatError::bad_request(m)
}

fn text_of(content: Option<&Value>, at: &str) -> Result<String, ChatError> {
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut out = String::new();
            for (i, p) in parts.iter().enumerate() {
                match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => out.push_str(t),
                    (Some("text"), None) => return Err(bad(format!("{at}.content[{i}]: a text part needs `text`"))),
                    (Some(t), _) => {
                        return Err(bad(format!(
                            "{at}.content[{i}]: content parts of type {t:?} are not supported; this server takes text"
                        )))
                    }
                    (None, _) => return Err(bad(format!("{at}.content[{i}]: a content part needs a `type`"))),
                }
            }
            Ok(out)
        }
        Some(v) => Err(bad(format!("{at}.content must be a string, a list of text parts or null, not {v}"))),
    }
}

fn call_of(c: &Value, at: &str) -> Result<CallIn, ChatError> {
    let f = c.get("function").ok_or_else(|| bad(format!("{at}: a tool call needs `function`")))?;
    if c.get("type").is_some_and(|t| t != "function") {
        return Err(bad(format!("{at}.type must be \"function\"")));
    }
    let name = f.get("name").and_then(Value::as_str).filter(|n| !n.is_empty());
    let name = name.ok_or_else(|| bad(format!("{at}.function.name must be a non-empty string")))?;
    let arguments = match f.get("arguments") {
        None | Some(Value::Null) => json!({}),
        Some(Value::String(s)) => serde_json::from_str::<Value>(s).ok().filter(Value::is_object).ok_or_else(|| {
            bad(format!(
                "{at}.function.arguments is not a JSON object ({}); the chat template renders a call's \
                     arguments as JSON, so this call cannot be rendered",
                crate::quote::truncate(s, 60)
            ))
        })?,
        Some(o @ Value::Object(_)) => o.clone(),
        Some(v) => return Err(bad(format!("{at}.function.arguments must be a JSON string, not {v}"))),
    };
    let id = c.get("id").and_then(Value::as_str).unwrap_or_default().to_string();
    Ok(CallIn { id, name: name.to_string(), arguments })
}

fn message_of(m: &Value, i: usize) -> Result<Message, ChatError> {
    let at = format!("messages[{i}]");
    let role = match m.get("role").and_then(Value::as_str) {
        Some("system" | "developer") => Role::System,
        Some("user") => Role::User,
        Some("assistant") => Role::Assistant,
        Some("tool") => Role::Tool,
        Some(r) => return Err(bad(format!("{at}.role {r:?} is not one of system, developer, user, assistant, tool"))),
        None => return Err(bad(format!("{at} needs a `role` string"))),
    };
    let content = text_of(m.get("content"), &at)?;
    let mut tool_calls = Vec::new();
    match m.get("tool_calls") {
        None | Some(Value::Null) => {}
        Some(Value::Array(calls)) if role == Role::Assistant => {
            for (j, c) in calls.iter().enumerate() {
                tool_calls.push(call_of(c, &format!("{at}.tool_calls[{j}]"))?);
            }
        }
        Some(Value::Array(_)) => return Err(bad(format!("{at}: only assistant messages carry tool_calls"))),
        Some(v) => return Err(bad(format!("{at}.tool_calls must be a list, not {v}"))),
    }
    let tool_call_id = match (role, m.get("tool_call_id")) {
        (Role::Tool, Some(Value::String(s))) if !s.is_empty() => Some(s.clone()),
        (Role::Tool, _) => return Err(bad(format!("{at}: a tool message needs a `tool_call_id` string"))),
        _ => None,
    };
    let name = m.get("name").and_then(Value::as_str).map(str::to_string);
    Ok(Message { role, content, tool_calls, tool_call_id, name })
}

/// A number field in `lo..=hi`, or None when absent.
fn number(body: &Value, key: &str, lo: f64, hi: f64) -> Result<Option<f64>, ChatError> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_f64()
            .filter(|x| x.is_finite() && (lo..=hi).contains(x))
            .map(Some)
            .ok_or_else(|| bad(format!("`{key}` must be a number in [{lo}, {hi}], not {v}"))),
    }
}

fn count(body: &Value, key: &str) -> Result<Option<u64>, ChatError> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or_else(|| bad(format!("`{key}` must be a non-negative integer, not {v}"))),
    }
}

fn flag(body: &Value, key: &str) -> Result<bool, ChatError> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(v) => Err(bad(format!("`{key}` must be true or false, not {v}"))),
    }
}

/// Fields that change the answer in ways this server does not implement: refused, never ignored.
fn refuse_unsupported(body: &Value) -> Result<(), ChatError> {
    let set = |k: &str| body.get(k).is_some_and(|v| !v.is_null());
    if let Some(f) = body.get("response_format").filter(|v| !v.is_null()) {
        if f.get("type").and_then(Value::as_str) != Some("text") {
            return Err(bad("`response_format` other than {\"type\": \"text\"} is not supported by this server"));
        }
    }
    match body.get("stop") {
        None | Some(Value::Null) => {}
        Some(Value::Array(a)) if a.is_empty() => {}
        Some(_) => {
            return Err(bad(
                "`stop` strings are not supported by this server (a turn ends at the model's end-of-turn token); \
                 leave `stop` out",
            ))
        }
    }
    for k in ["frequency_penalty", "presence_penalty", "repetition_penalty"] {
        if body.get(k).and_then(Value::as_f64).is_some_and(|x| x != 0.0 && !(k == "repetition_penalty" && x == 1.0)) {
            return Err(bad(format!("`{k}` is not supported by this server; leave it out")));
        }
    }
    if body.get("logit_bias").is_some_and(|v| v.as_object().is_some_and(|m| !m.is_empty())) {
        return Err(bad("`logit_bias` is not supported by this server; leave it out"));
    }
    if set("functions") || set("function_call") {
        return Err(bad("`functions`/`function_call` (the legacy API) are not supported: use `tools`"));
    }
    if body.get("parallel_tool_calls") == Some(&Value::Bool(false)) {
        return Err(bad("`parallel_tool_calls: false` cannot be enforced by this server; leave it out"));
    }
    match body.get("top_logprobs") {
        None | Some(Value::Null) => {}
        Some(v) if v.as_u64() == Some(0) => {}
        Some(v) => {
            return Err(bad(format!(
                "`top_logprobs` = {v}: this server returns the sampled token's log-prob only (top_logprobs 0)"
            )))
        }
    }
    Ok(())
}

fn tools_of(body: &Value) -> Result<Option<Value>, ChatError> {
    let choice = match body.get("tool_choice") {
        None | Some(Value::Null) => "auto",
        Some(Value::String(s)) if s == "auto" || s == "none" => s.as_str(),
        Some(v) => {
            return Err(bad(format!(
                "`tool_choice` {v} is not supported: this server takes \"auto\" or \"none\" (it cannot force a call)"
            )))
        }
    };
    let tools = match body.get("tools") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(t)) if t.is_empty() => return Ok(None),
        Some(Value::Array(t)) => t,
        Some(v) => return Err(bad(format!("`tools` must be a list, not {v}"))),
    };
    for (i, t) in tools.iter().enumerate() {
        if t.get("type").and_then(Value::as_str) != Some("function")
            || t.get("function").and_then(|f| f.get("name")).and_then(Value::as_str).is_none_or(str::is_empty)
        {
            return Err(bad(format!("tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}")));
        }
    }
    Ok((choice == "auto").then(|| Value::Array(tools.clone())))
}

/// Reads and checks `body` against the hub's bounds.
pub fn parse(body: &Value, config: &HubConfig) -> Result<ChatRequest, ChatError> {
    if !body.is_object() {
        return Err(bad("the request body must be a JSON object"));
    }
    refuse_unsupported(body)?;
    let raw = match body.get("messages") {
        Some(Value::Array(m)) if !m.is_empty() => m,
        Some(Value::Array(_)) => return Err(bad("`messages` is empty")),
        _ => return Err(bad("`messages` must be a list of messages")),
    };
    let messages = raw.iter().enumerate().map(|(i, m)| message_of(m, i)).collect::<Result<Vec<_>, _>>()?;
    if messages.last().is_some_and(|m| m.role == Role::Assistant) {
        return Err(bad("the last message is the assistant's: this server answers after a user or tool message"));
    }
    let n = count(body, "n")?.unwrap_or(1);
    if n == 0 || n > MAX_N as u64 {
        return Err(bad(format!("`n` = {n}: this server takes 1 to {MAX_N}")));
    }
    let max_tokens = match (count(body, "max_completion_tokens")?, count(body, "max_tokens")?) {
        (Some(a), _) | (None, Some(a)) => Some(a),
        (None, None) => None,
    };
    let max_tokens = match max_tokens {
        Some(m) if config.pinned && m > config.max_new_tokens as u64 => Some(config.max_new_tokens as u64),
        m => m,
    };
    if let Some(m) = max_tokens {
        if m == 0 || m > config.max_new_tokens as u64 {
            return Err(bad(format!("`max_tokens` = {m}: this server takes 1 to {}", config.max_new_tokens)));
        }
    }
    let d = &config.defaults;
    let temperature = number(body, "temperature", 0.0, 2.0)?.unwrap_or(d.temperature);
    let top_p = number(body, "top_p", f64::MIN_POSITIVE, 1.0)?.unwrap_or(d.top_p);
    let top_k = match body.get("top_k") {
        None | Some(Value::Null) => d.top_k,
        Some(v) => match v.as_i64() {
            Some(-1) | Some(0) => 0,
            Some(k) if k > 0 => k as usize,
            _ => return Err(bad(format!("`top_k` must be a positive integer, or -1/0 for off, not {v}"))),
        },
    };
    if config.pinned {
        // Greedy defaults (an evaluation) pin temperature 0, whatever their `temperature` holds.
        let want_t = if d.greedy { 0.0 } else { d.temperature };
        let pinned = [("temperature", temperature, want_t), ("top_p", top_p, d.top_p)];
        let off = pinned.iter().find(|(k, v, want)| body.get(*k).is_some_and(|x| !x.is_null()) && v != want);
        let off = off.map(|(k, v, want)| (k.to_string(), v.to_string(), want.to_string()));
        let off = off.or_else(|| (top_k != d.top_k).then(|| ("top_k".into(), top_k.to_string(), d.top_k.to_string())));
        if let Some((k, v, want)) = off {
            return Err(bad(format!(
                "`{k}` = {v}: this server samples for training with {k} = {want} (the trainer's log-probs assume \
                 the rollout's sampling); leave `{k}` out"
            )));
        }
    }
    let seed = count(body, "seed")?;
    let logprobs = flag(body, "logprobs")?;
    flag(body, "stream")?;
    let params = SamplingParams {
        max_new_tokens: max_tokens.map_or(config.max_new_tokens, |m| m as usize),
        temperature: if temperature == 0.0 {
            1.0
        } else if config.pinned {
            d.temperature
        } else {
            temperature
        },
        top_p,
        top_k,
        stop_tokens: d.stop_tokens.clone(),
        greedy: if config.pinned {
            d.greedy
        } else {
            temperature == 0.0 || d.greedy && body.get("temperature").is_none()
        },
        seed: seed.unwrap_or(d.seed),
    };
    Ok(ChatRequest {
        messages,
        tools: tools_of(body)?,
        n: n as usize,
        params,
        max_tokens: max_tokens.map(|m| m as usize),
        seed,
        logprobs,
        return_token_ids: flag(body, "return_token_ids")?,
    })
}
