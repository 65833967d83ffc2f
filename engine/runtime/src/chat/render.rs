//! Messages to ids. A new chain renders the whole conversation with the chat template (its
//! `tools`, `add_generation_prompt`); a turn that extends a sampled one tokenises only the new
//! messages, wrapped in what the template writes after the sampled turn's end-of-turn token (read
//! off a probe rendering, as `session::codec` does for one observation). Message text from the
//! harness (user, system and tool contents) is never a source of added tokens: it is rendered as a
//! marker and encoded plain (`HfTokenizer::encode_pieces`), so a tool result that spells
//! `<|im_end|>` cannot forge a turn boundary. Without a chat template (the char tokenizer, a plain
//! Hugging Face one) a conversation is its texts in order, each assistant turn ended by the stop id.

use super::request::{Message, Role};
use super::ChatError;
use crate::token::TokenId;
use crate::tokenize::{HfTokenizer, RenderOptions, Tokenizer};
use serde_json::Value;

/// Markers of a message's text in a probe rendering (private-use characters no template writes).
const OPEN: char = '\u{E002}';
const CLOSE: char = '\u{E003}';
/// The probe's sampled assistant text.
const SAMPLED: &str = "\u{E004}";

fn marker(i: usize) -> String {
    format!("{OPEN}{i}{CLOSE}")
}

fn template_error(e: crate::RunError) -> ChatError {
    ChatError::bad_request(format!("the chat template cannot render these messages: {}", e.message))
}

fn tokenize_error(e: crate::RunError) -> ChatError {
    ChatError::bad_request(e.message)
}

/// Whether a message's text goes into a rendering as a marker (untrusted text) or as itself.
fn marked(m: &Message) -> bool {
    m.role != Role::Assistant
}

/// Refuses text holding the marker characters this module reserves.
fn check_reserved(msgs: &[Message]) -> Result<(), ChatError> {
    let reserved = |s: &str| s.contains([OPEN, CLOSE]) || s.contains(SAMPLED);
    for (i, m) in msgs.iter().enumerate() {
        if reserved(&m.content) || m.tool_calls.iter().any(|c| reserved(&c.arguments.to_string())) {
            return Err(ChatError::bad_request(format!(
                "messages[{i}] holds a private-use character (U+E002 to U+E004) this server reserves"
            )));
        }
    }
    Ok(())
}

/// `text` cut at the markers: (piece, untrusted) with each marker replaced by its message's text.
fn pieces<'t>(text: &'t str, texts: &[&'t str]) -> Result<Vec<(&'t str, bool)>, ChatError> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find(OPEN) {
        out.push((&rest[..i], false));
        let after = &rest[i + OPEN.len_utf8()..];
        let end = after.find(CLOSE).ok_or_else(|| ChatError::bad_request("the chat template cut a message's text"))?;
        let k: usize =
            after[..end].parse().map_err(|_| ChatError::bad_request("the chat template rewrote a message's text"))?;
        let t = texts.get(k).ok_or_else(|| ChatError::bad_request("the chat template rewrote a message's text"))?;
        out.push((t, true));
        rest = &after[end + CLOSE.len_utf8()..];
    }
    out.push((rest, false));
    Ok(out)
}

fn render(h: &HfTokenizer, msgs: &[Value], tools: Option<&Value>) -> Result<String, ChatError> {
    let options =
        RenderOptions { add_generation_prompt: true, tools_json: tools.map(Value::to_string), ..Default::default() };
    h.render_chat(&Value::Array(msgs.to_vec()).to_string(), &options).map_err(template_error)
}

fn lossy(t: &crate::tokenize::CharTokenizer, text: &str) -> Vec<TokenId> {
    text.chars().filter_map(|c| t.id(c)).collect()
}

/// Without a chat template: the texts in order, each assistant turn ended by the stop id.
fn plain(tok: &Tokenizer, msgs: &[Message], first: bool) -> Result<Vec<TokenId>, ChatError> {
    let stop = tok.special().stop.first().copied();
    match tok {
        Tokenizer::Char(t) => {
            let mut ids = if first { vec![crate::token::BOS] } else { Vec::new() };
            for m in msgs {
                ids.extend(lossy(t, &m.content));
                if m.role == Role::Assistant {
                    ids.extend(stop);
                }
            }
            Ok(ids)
        }
        Tokenizer::Hf(h) => {
            let stop_text = stop.map(|id| h.decode(&[id], false)).unwrap_or_default();
            let mut p: Vec<(&str, bool)> = Vec::new();
            for m in msgs {
                p.push((&m.content, marked(m)));
                if m.role == Role::Assistant {
                    p.push((&stop_text, false));
                }
            }
            h.encode_pieces(&p, first).map_err(tokenize_error)
        }
    }
}

/// The ids of a whole conversation, ending with the generation prompt.
pub fn fresh(tok: &Tokenizer, msgs: &[Message], tools: Option<&Value>) -> Result<Vec<TokenId>, ChatError> {
    check_reserved(msgs)?;
    match tok {
        Tokenizer::Hf(h) if h.chat_template().is_some() => {
            let json: Vec<Value> = msgs
                .iter()
                .enumerate()
                .map(|(i, m)| if marked(m) { m.template_json(&marker(i)) } else { m.template_json(&m.content) })
                .collect();
            let text = render(h, &json, tools)?;
            let texts: Vec<&str> = msgs.iter().map(|m| m.content.as_str()).collect();
            h.encode_pieces(&pieces(&text, &texts)?, false).map_err(tokenize_error)
        }
        _ => plain(tok, msgs, true),
    }
}

/// The ids of user and tool messages that follow a sampled turn (which ended with its
/// end-of-turn id), ending with the generation prompt.
pub fn suffix(tok: &Tokenizer, msgs: &[Message]) -> Result<Vec<TokenId>, ChatError> {
    check_reserved(msgs)?;
    match tok {
        Tokenizer::Hf(h) if h.chat_template().is_some() => {
            let probe_user = Message {
                role: Role::User,
                content: "q".into(),
                tool_calls: Vec::new(),
                tool_call_id: None,
                name: None,
            };
            let probe_assistant = Message { role: Role::Assistant, content: SAMPLED.into(), ..probe_user.clone() };
            let mut json = vec![probe_user.template_json("q"), probe_assistant.template_json(SAMPLED)];
            json.extend(msgs.iter().enumerate().map(|(i, m)| m.template_json(&marker(i))));
            let text = render(h, &json, None)?;
            let a = text.find(SAMPLED).ok_or_else(|| ChatError::bad_request("the chat template dropped a turn"))?
                + SAMPLED.len();
            // The sampled turn ends with its end-of-turn token: what follows it is ours.
            let eot = h.special().end_of_turn.map(|id| h.decode(&[id], false));
            let start = match &eot {
                Some(e) => text[a..].find(e.as_str()).map(|i| a + i + e.len()).unwrap_or(a),
                None => a,
            };
            let texts: Vec<&str> = msgs.iter().map(|m| m.content.as_str()).collect();
            h.encode_pieces(&pieces(&text[start..], &texts)?, false).map_err(tokenize_error)
        }
        _ => plain(tok, msgs, false),
    }
}

/// What a harness that re-renders the conversation as text and re-tokenises it would condition
/// the model on (`session::retokenize`).
pub fn naive(tok: &Tokenizer, msgs: &[Message], tools: Option<&Value>) -> Result<Vec<TokenId>, ChatError> {
    match tok {
        Tokenizer::Hf(h) if h.chat_template().is_some() => {
            let json: Vec<Value> = msgs.iter().map(|m| m.template_json(&m.content)).collect();
            h.encode(&render(h, &json, tools)?, false).map_err(tokenize_error)
        }
        _ => plain(tok, msgs, true),
    }
}
