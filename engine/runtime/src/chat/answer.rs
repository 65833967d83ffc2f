//! Sampled turns to the OpenAI `chat.completion` object: the text, tool calls parsed from it in
//! the model's own format (Hermes `<tool_call>` JSON to OpenAI `tool_calls`), per-token
//! log-probs, usage, and the miles extension (`return_token_ids`).

use super::request::{CallIn, ChatRequest, Message, Role};
use crate::sample::{FinishReason, Sample};
use crate::spec::env::ToolFormat;
use crate::token::TokenId;
use crate::tokenize::Tokenizer;
use serde_json::{json, Value};

/// One choice as answered, and as the harness will send it back.
pub struct Choice {
    pub json: Value,
    pub message: Message,
    pub calls: usize,
    /// The text held a tool call that does not parse (answered as text).
    pub bad_call: bool,
}

fn tags(format: ToolFormat) -> (&'static str, &'static str) {
    match format {
        ToolFormat::Tag => ("<tool>", "</tool>"),
        ToolFormat::Hermes => ("<tool_call>", "</tool_call>"),
    }
}

/// The text outside every `open ... close` block (the blocks parsed already).
fn outside_calls(text: &str, format: ToolFormat) -> String {
    let (open, close) = tags(format);
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find(open) {
        out.push_str(&rest[..i]);
        match rest[i..].find(close) {
            Some(j) => rest = &rest[i + j + close.len()..],
            None => {
                rest = "";
                break;
            }
        }
    }
    out.push_str(rest);
    out.trim().to_string()
}

fn token_logprobs(tok: &Tokenizer, s: &Sample) -> Value {
    let content: Vec<Value> = s
        .response
        .iter()
        .zip(&s.logprobs)
        .map(|(&id, &lp)| {
            let text = match tok {
                Tokenizer::Hf(h) => h.decode(&[id], false),
                Tokenizer::Char(t) => t.decode(&[id]),
            };
            json!({"token": text, "logprob": lp, "bytes": text.as_bytes(), "top_logprobs": []})
        })
        .collect();
    json!({"content": content})
}

/// The choice of sample `s` (index `i`); `call_id(j)` names its j-th tool call.
pub fn choice(
    tok: &Tokenizer,
    format: ToolFormat,
    req: &ChatRequest,
    i: usize,
    s: &Sample,
    call_id: impl Fn(usize) -> String,
) -> Choice {
    let text = tok.decode(&s.response);
    let mut content = text.clone();
    let mut calls = Vec::new();
    let mut bad_call = false;
    if req.tools.is_some() {
        match format.parse(&text) {
            Ok(parsed) if !parsed.is_empty() => {
                content = outside_calls(&text, format);
                calls = parsed
                    .into_iter()
                    .enumerate()
                    .map(|(j, c)| CallIn { id: call_id(j), name: c.name, arguments: c.arguments })
                    .collect();
            }
            Ok(_) => {}
            Err(_) => bad_call = true,
        }
    }
    let finish = match (s.finish, calls.is_empty()) {
        (FinishReason::Length, _) => "length",
        (FinishReason::Stop, false) => "tool_calls",
        (FinishReason::Stop, true) => "stop",
    };
    let mut msg = json!({"role": "assistant", "content": content});
    if !calls.is_empty() {
        if content.is_empty() {
            msg["content"] = Value::Null;
        }
        let wire: Vec<Value> = calls
            .iter()
            .map(|c| {
                // OpenAI's arguments are a JSON string; the tag format's raw text is one too.
                let args = match &c.arguments {
                    Value::String(s) => json!({"input": s}).to_string(),
                    a => a.to_string(),
                };
                json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": args}})
            })
            .collect();
        msg["tool_calls"] = Value::Array(wire);
    }
    let mut json = json!({"index": i, "message": msg, "finish_reason": finish, "logprobs": Value::Null});
    if req.logprobs {
        json["logprobs"] = token_logprobs(tok, s);
    }
    let n = calls.len();
    let calls = calls
        .into_iter()
        .map(|c| match c.arguments {
            Value::String(s) => CallIn { arguments: json!({"input": s}), ..c },
            _ => c,
        })
        .collect();
    let message = Message { role: Role::Assistant, content, tool_calls: calls, tool_call_id: None, name: None };
    Choice { json, message, calls: n, bad_call }
}

/// The `chat.completion` object.
pub fn completion(
    id: &str,
    model: &str,
    req: &ChatRequest,
    prompt: &[TokenId],
    samples: &[Sample],
    choices: Vec<Value>,
) -> Value {
    let completion_tokens: usize = samples.iter().map(|s| s.response.len()).sum();
    let created = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let mut v = json!({
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": {
            "prompt_tokens": prompt.len(),
            "completion_tokens": completion_tokens,
            "total_tokens": prompt.len() + completion_tokens,
        },
    });
    if req.return_token_ids {
        let ids: Vec<&Vec<TokenId>> = samples.iter().map(|s| &s.response).collect();
        let version = samples.iter().map(|s| s.weight_version).min().unwrap_or(0);
        v["miles"] = json!({"prompt_token_ids": prompt, "token_ids": ids, "weight_version": version});
    }
    v
}
