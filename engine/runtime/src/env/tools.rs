//! Tool calls parsed from the model's output. Two formats: a simple tag a tiny policy can learn
//! (`<tool>calc 12*7</tool>`: a name, a space, the argument text), and the chat template's format
//! of Qwen/Hermes models (`<tool_call>{"name": "calc", "arguments": {"expr": "12*7"}}</tool_call>`).
//! A call that does not parse is not an error of the run: the episode driver shows the model what
//! was wrong as the observation of that turn.

pub use crate::spec::env::ToolFormat;

use super::Environment;
use crate::session::ChatCodec;
use crate::tokenize::Tokenizer;
use crate::RunError;
use serde::{Deserialize, Serialize};

/// The chat codec episodes and demonstrations are framed with: the run's tokenizer, and, when
/// the model writes calls in its chat template's format (Hermes), the environment's tools, which
/// the template shows in the system turn (for Qwen, inside `<tools></tools>`). The tag format is
/// the run's own convention, not the template's: no tools are rendered for it.
pub fn chat_codec<'a>(
    tok: &'a Tokenizer,
    env: &dyn Environment,
    format: ToolFormat,
) -> Result<ChatCodec<'a>, RunError> {
    let tools = match format {
        ToolFormat::Hermes => env.tools(),
        ToolFormat::Tag => None,
    };
    ChatCodec::with_tools(tok, None, tools)
        .map_err(|e| RunError::new(crate::E_SPEC, format!("the tokenizer cannot frame observations: {e}")))
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    pub name: String,
    /// A JSON object (Hermes) or the raw argument text as a string (tag format).
    pub arguments: serde_json::Value,
}

impl ToolCall {
    /// The argument text: the string itself (tag format), or the first string-valued argument
    /// (Hermes), or the arguments as JSON.
    pub fn argument_text(&self) -> String {
        match &self.arguments {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Object(m) => {
                m.values().find_map(|v| v.as_str().map(str::to_string)).unwrap_or_else(|| self.arguments.to_string())
            }
            v => v.to_string(),
        }
    }
}

impl ToolFormat {
    fn tags(self) -> (&'static str, &'static str) {
        match self {
            ToolFormat::Tag => ("<tool>", "</tool>"),
            ToolFormat::Hermes => ("<tool_call>", "</tool_call>"),
        }
    }

    /// `call` as the model writes it in this format, so that `parse` reads it back. Hermes: what
    /// Qwen's chat templates render for an assistant message's `tool_calls` (a demonstration
    /// then matches the template's own rendering of the same conversation).
    pub fn write(self, call: &ToolCall) -> String {
        match self {
            ToolFormat::Tag => format!("<tool>{} {}</tool>", call.name, call.argument_text()),
            ToolFormat::Hermes => {
                let name = serde_json::Value::String(call.name.clone());
                // Python's json.dumps, as the template's `tojson` writes the arguments.
                let args = crate::tokenize::pyjson::dumps(&call.arguments, None)
                    .unwrap_or_else(|_| call.arguments.to_string());
                format!("<tool_call>\n{{\"name\": {name}, \"arguments\": {args}}}\n</tool_call>")
            }
        }
    }

    /// Every tool call in `text`, in order. `Err` says what is wrong with the first bad one (an
    /// unclosed tag, an empty name, JSON that does not parse or has no `name`).
    pub fn parse(self, text: &str) -> Result<Vec<ToolCall>, String> {
        let (open, close) = self.tags();
        let mut calls = Vec::new();
        let mut rest = text;
        while let Some(i) = rest.find(open) {
            let body_start = i + open.len();
            let Some(len) = rest[body_start..].find(close) else {
                return Err(format!("{open} without {close}"));
            };
            let body = rest[body_start..body_start + len].trim();
            calls.push(self.call(body)?);
            rest = &rest[body_start + len + close.len()..];
        }
        Ok(calls)
    }

    fn call(self, body: &str) -> Result<ToolCall, String> {
        match self {
            ToolFormat::Tag => {
                let (name, args) = body.split_once(char::is_whitespace).unwrap_or((body, ""));
                if name.is_empty() {
                    return Err("a tool call needs a tool name: <tool>name arguments</tool>".into());
                }
                Ok(ToolCall { name: name.to_string(), arguments: serde_json::Value::String(args.trim().to_string()) })
            }
            ToolFormat::Hermes => {
                let v: serde_json::Value =
                    serde_json::from_str(body).map_err(|e| format!("the tool call is not JSON: {e}"))?;
                let name = v.get("name").and_then(|n| n.as_str()).filter(|n| !n.is_empty());
                let name = name.ok_or("the tool call has no \"name\"")?.to_string();
                let arguments = match v.get("arguments") {
                    None | Some(serde_json::Value::Null) => serde_json::json!({}),
                    // Some models write the arguments as a JSON string.
                    Some(serde_json::Value::String(s)) => {
                        serde_json::from_str(s).unwrap_or_else(|_| serde_json::Value::String(s.clone()))
                    }
                    Some(a) => a.clone(),
                };
                Ok(ToolCall { name, arguments })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tag_calls() {
        let calls = ToolFormat::Tag.parse("let me see <tool>calc 12*7</tool> then <tool>calc  1+1 </tool>").unwrap();
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0], ToolCall { name: "calc".into(), arguments: json!("12*7") });
        assert_eq!(calls[1].argument_text(), "1+1");
        assert_eq!(ToolFormat::Tag.parse("answer: 84").unwrap(), vec![]);
        assert_eq!(ToolFormat::Tag.parse("<tool>calc 1").unwrap_err(), "<tool> without </tool>");
        assert!(ToolFormat::Tag.parse("<tool> </tool>").unwrap_err().starts_with("a tool call needs a tool name"));
    }

    /// What `write` gives, `parse` reads back, in both formats.
    #[test]
    fn written_calls_parse_back() {
        let tag = ToolCall { name: "calc".into(), arguments: json!("12*7") };
        assert_eq!(ToolFormat::Tag.write(&tag), "<tool>calc 12*7</tool>");
        assert_eq!(ToolFormat::Tag.parse(&ToolFormat::Tag.write(&tag)).unwrap(), vec![tag]);
        let hermes = ToolCall { name: "get_weather".into(), arguments: json!({"city": "Paris", "days": 2}) };
        let text = ToolFormat::Hermes.write(&hermes);
        // Python's json.dumps separators, as the template's `tojson` writes the arguments.
        assert_eq!(
            text,
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>"
        );
        assert_eq!(ToolFormat::Hermes.parse(&text).unwrap(), vec![hermes]);
    }

    #[test]
    fn hermes_calls() {
        let text = "<tool_call>\n{\"name\": \"calc\", \"arguments\": {\"expr\": \"12*7\"}}\n</tool_call>";
        let calls = ToolFormat::Hermes.parse(text).unwrap();
        assert_eq!(calls, vec![ToolCall { name: "calc".into(), arguments: json!({"expr": "12*7"}) }]);
        assert_eq!(calls[0].argument_text(), "12*7");
        let s = ToolFormat::Hermes.parse("<tool_call>{\"name\":\"f\",\"arguments\":\"{\\\"a\\\":1}\"}</tool_call>");
        assert_eq!(s.unwrap()[0].arguments, json!({"a": 1}));
        assert!(ToolFormat::Hermes
            .parse("<tool_call>{oops}</tool_call>")
            .unwrap_err()
            .starts_with("the tool call is not JSON"));
        assert_eq!(
            ToolFormat::Hermes.parse("<tool_call>{\"arguments\":{}}</tool_call>").unwrap_err(),
            "the tool call has no \"name\""
        );
    }
}
