//! Text of an episode to ids and back, with the tokenizer's turn delimiters. The first
//! observation is rendered as the conversation's first user message (the chat template with
//! `add_generation_prompt`); each later observation is tokenised once, wrapped in what the
//! template puts between the end of an assistant turn and the next assistant turn (for Qwen:
//! `\n<|im_start|>user\n<tool_response>\n` ... `\n</tool_response><|im_end|>\n<|im_start|>assistant\n`).
//! Those delimiters are read off the template itself by rendering a probe conversation. Without a
//! chat template (the char tokenizer, a plain Hugging Face tokenizer) an observation is its text.
//!
//! `naive_ids` is the path TITO replaces: re-render the whole conversation as text (each sampled
//! turn decoded) and re-tokenise it, as an OpenAI-style harness does each turn.

use crate::token::TokenId;
use crate::tokenize::{RenderOptions, Tokenizer};
use serde_json::json;

/// Who speaks an observation: the environment (`user`), or a tool answering a call (`tool`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    User,
    Tool,
}

impl Role {
    fn name(self) -> &'static str {
        match self {
            Role::User => "user",
            Role::Tool => "tool",
        }
    }
}

/// Marks the probe conversation's assistant text and observation (private-use characters no
/// template writes).
const ASSISTANT: &str = "\u{E001}";
const OBSERVATION: &str = "\u{E000}";

pub struct ChatCodec<'a> {
    tok: &'a Tokenizer,
    system: Option<String>,
    /// Text before and after an observation, per role (`None`: no chat template).
    wrap: Option<[(String, String); 2]>,
}

fn msg(role: &str, content: &str) -> serde_json::Value {
    json!({"role": role, "content": content})
}

impl<'a> ChatCodec<'a> {
    pub fn new(tok: &'a Tokenizer, system: Option<String>) -> Result<ChatCodec<'a>, String> {
        let wrap = match tok {
            Tokenizer::Hf(h) if h.chat_template().is_some() => {
                let eot = h.special().end_of_turn.map(|id| h.decode(&[id], false));
                let probe = |role: Role| -> Result<(String, String), String> {
                    let mut m = Vec::new();
                    if let Some(s) = &system {
                        m.push(msg("system", s));
                    }
                    m.extend([msg("user", "q"), msg("assistant", ASSISTANT), msg(role.name(), OBSERVATION)]);
                    let text = h
                        .render_chat(&serde_json::Value::Array(m).to_string(), &generation())
                        .map_err(|e| e.message)?;
                    let a = text.find(ASSISTANT).ok_or("the chat template dropped the assistant message")?
                        + ASSISTANT.len();
                    // The sampled turn ends with the end-of-turn token: what follows it is ours.
                    let start = match &eot {
                        Some(e) => text[a..].find(e.as_str()).map(|i| a + i + e.len()).unwrap_or(a),
                        None => a,
                    };
                    let seg = &text[start..];
                    let (pre, post) = seg.split_once(OBSERVATION).ok_or("the chat template dropped the observation")?;
                    Ok((pre.to_string(), post.to_string()))
                };
                Some([probe(Role::User)?, probe(Role::Tool)?])
            }
            _ => None,
        };
        Ok(ChatCodec { tok, system, wrap })
    }

    pub fn tokenizer(&self) -> &'a Tokenizer {
        self.tok
    }

    /// The delimiters around an observation of `role` (empty without a chat template).
    pub fn delimiters(&self, role: Role) -> (&str, &str) {
        match &self.wrap {
            Some(w) => {
                let (a, b) = &w[role as usize];
                (a, b)
            }
            None => ("", ""),
        }
    }

    fn chat(&self, first: &str) -> Vec<serde_json::Value> {
        let mut m = Vec::new();
        if let Some(s) = &self.system {
            m.push(msg("system", s));
        }
        m.push(msg("user", first));
        m
    }

    /// The ids of the first turn's prompt.
    pub fn first_prompt(&self, observation: &str) -> Result<Vec<TokenId>, String> {
        match self.tok {
            Tokenizer::Char(t) => t.encode_prompt(observation).map_err(|e| e.message),
            Tokenizer::Hf(h) if self.wrap.is_some() => {
                let text = h
                    .render_chat(&serde_json::Value::Array(self.chat(observation)).to_string(), &generation())
                    .map_err(|e| e.message)?;
                h.encode(&text, false).map_err(|e| e.message)
            }
            Tokenizer::Hf(h) => h.encode(observation, true).map_err(|e| e.message),
        }
    }

    /// The ids appended after a sampled turn for an observation: tokenised once, delimiters
    /// included.
    pub fn observation(&self, role: Role, text: &str) -> Result<Vec<TokenId>, String> {
        let (pre, post) = self.delimiters(role);
        let full = format!("{pre}{text}{post}");
        match self.tok {
            Tokenizer::Char(t) => Ok(char_lossy(t, &full)),
            Tokenizer::Hf(h) => h.encode(&full, false).map_err(|e| e.message),
        }
    }

    /// The text of a sampled turn (up to its stop token, special tokens skipped).
    pub fn decode(&self, ids: &[TokenId]) -> String {
        self.tok.decode(ids)
    }

    /// What a re-tokenising harness conditions the last turn on, then that turn's sampled ids:
    /// the conversation re-rendered as text (`turns`: each earlier turn's decoded text and the
    /// observation that followed) and tokenised again.
    pub fn naive_ids(
        &self,
        first: &str,
        turns: &[(String, Role, String)],
        last_output: &[TokenId],
    ) -> Result<Vec<TokenId>, String> {
        let mut ids = match self.tok {
            Tokenizer::Char(t) => {
                // The char tokenizer's turn delimiter is EOS.
                let mut v = t.encode_prompt(first).map_err(|e| e.message)?;
                for (a, _, o) in turns {
                    v.extend(t.encode(a).map_err(|e| e.message)?);
                    v.push(crate::token::EOS);
                    v.extend(char_lossy(t, o));
                }
                v
            }
            Tokenizer::Hf(h) if self.wrap.is_some() => {
                let mut m = self.chat(first);
                for (a, role, o) in turns {
                    m.push(msg("assistant", a));
                    m.push(msg(role.name(), o));
                }
                let text =
                    h.render_chat(&serde_json::Value::Array(m).to_string(), &generation()).map_err(|e| e.message)?;
                h.encode(&text, false).map_err(|e| e.message)?
            }
            Tokenizer::Hf(h) => {
                let stop = h.special().stop.first().map(|&id| h.decode(&[id], false)).unwrap_or_default();
                let mut text = first.to_string();
                for (a, _, o) in turns {
                    text += a;
                    text += &stop;
                    text += o;
                }
                h.encode(&text, true).map_err(|e| e.message)?
            }
        };
        ids.extend_from_slice(last_output);
        Ok(ids)
    }
}

/// An environment's text over a char vocabulary: characters outside it are left out (an
/// environment may say more than the task's alphabet; the policy cannot read it either way).
fn char_lossy(t: &crate::tokenize::CharTokenizer, text: &str) -> Vec<TokenId> {
    text.chars().filter_map(|c| t.id(c)).collect()
}

fn generation() -> RenderOptions {
    RenderOptions { add_generation_prompt: true, ..Default::default() }
}
