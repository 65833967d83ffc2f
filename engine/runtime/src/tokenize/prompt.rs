//! A prompt as a tokenizer encodes it: a plain string, or a list of chat messages that the chat
//! template renders (prompt files, docs/data.md, give either).

use serde_json::{Map, Value};

/// A prompt as the data gave it.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    Text(String),
    Chat(Messages),
}

/// Chat messages, each an object with a string `role`, and `content` a string, a list of parts,
/// or null (an assistant turn with `tool_calls`). Other keys (`tool_calls`, `name`,
/// `tool_call_id`, ...) are kept. `json` is the messages' text in the file's key order, which a
/// chat template's `tojson` reproduces.
#[derive(Debug, Clone, PartialEq)]
pub struct Messages {
    pub json: String,
    pub list: Vec<Map<String, Value>>,
}

impl Prompt {
    /// The prompt as JSON: a string, or the list of messages.
    pub fn to_json(&self) -> Value {
        match self {
            Prompt::Text(s) => Value::String(s.clone()),
            Prompt::Chat(m) => Value::Array(m.list.iter().cloned().map(Value::Object).collect()),
        }
    }
}
