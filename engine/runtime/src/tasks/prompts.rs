//! Prompt files a user brings: JSONL or Parquet (how Hugging Face datasets ship: a file, a
//! directory of shards, a `datasets` repository with its own test split), with
//! user-named prompt and label fields. A prompt is a plain string or a list of chat messages
//! (`[{role, content, ...}]`); the label and every other field travel untouched, as JSON, to the
//! reward. See docs/data.md.

pub use crate::tokenize::{Messages, Prompt};

use super::parquet as pq;
use crate::reward::RewardInput;
use crate::spec::{HeldOut, OnError, SplitSpec};
use crate::{FinishReason, RunError, E_DATA_FILE, E_DATA_LINE};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Which file, and which of its fields is the prompt and which the label.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DataSettings {
    pub path: PathBuf,
    #[serde(default = "default_prompt_field")]
    pub prompt_field: String,
    #[serde(default = "default_label_field")]
    pub label_field: String,
    /// What a malformed row does (reported as file:line or file#row either way).
    #[serde(default)]
    pub on_error: OnError,
}

fn default_prompt_field() -> String {
    "prompt".into()
}

fn default_label_field() -> String {
    "label".into()
}

/// One row of a prompt file.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptRow {
    pub prompt: Prompt,
    /// The label field, untouched; `null` when the row has none.
    pub label: Value,
    /// The row's other fields, untouched.
    pub metadata: Map<String, Value>,
    /// `file:line` (JSONL) or `file#row` (Parquet, from 1): where a fault points.
    pub origin: String,
}

impl PromptRow {
    /// A row of a built-in task: a string prompt and its answer.
    pub fn text(prompt: String, label: String) -> PromptRow {
        PromptRow {
            prompt: Prompt::Text(prompt),
            label: Value::String(label),
            metadata: Map::new(),
            origin: String::new(),
        }
    }

    /// The prompt's identity for disjoint splits: the string, or the messages' JSON.
    pub fn prompt_key(&self) -> &str {
        match &self.prompt {
            Prompt::Text(s) => s,
            Prompt::Chat(m) => &m.json,
        }
    }

    /// The label as text (the gold answer of SFT and exact match): a string as is, any other JSON
    /// as its text, `null` as "".
    pub fn label_text(&self) -> String {
        match &self.label {
            Value::String(s) => s.clone(),
            Value::Null => String::new(),
            other => other.to_string(),
        }
    }

    /// What a reward receives for a response to this row.
    pub fn reward_input(&self, sample_id: String, response: String, finish: FinishReason) -> RewardInput {
        RewardInput {
            sample_id,
            prompt: self.prompt.to_json(),
            response,
            label: self.label.clone(),
            metadata: Value::Object(self.metadata.clone()),
            finish,
            group: 0,
        }
    }
}

/// Reads a prompt file; the format follows the extension (`.jsonl`, `.parquet`); a directory
/// holds Parquet shards (docs/data.md), of which this reads the train split.
pub fn read(settings: &DataSettings, warnings: &mut Vec<String>) -> Result<Vec<PromptRow>, RunError> {
    let path = &settings.path;
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    let rows = match ext {
        _ if path.is_dir() => pq::read(settings, warnings)?,
        "jsonl" => read_jsonl(settings, warnings)?,
        "parquet" => pq::read(settings, warnings)?,
        other => {
            return Err(RunError::new(
                E_DATA_FILE,
                format!(
                    "{}: unknown prompt file format `.{other}`: expected .jsonl, .parquet or a directory of .parquet shards",
                    path.display()
                ),
            ))
        }
    };
    if rows.is_empty() {
        return Err(RunError::new(E_DATA_FILE, format!("{}: holds no prompts", path.display()))
            .with_help("a prompt file needs at least one row with the prompt field"));
    }
    if rows.iter().all(|r| r.label.is_null()) {
        warnings.push(format!(
            "{}: no row has the label field `{}`; rewards that need a label will fail",
            path.display(),
            settings.label_field
        ));
    }
    Ok(rows)
}

/// The held-out rows a prompt source ships: a datasets layout's `test` shards (docs/data.md), at
/// most `split.test_size` of them (drawn by `split.seed` when there are more, kept in file
/// order); None when it ships none or the recipe set `held_out = drawn`, and the held-out rows
/// are drawn from the train rows.
pub fn read_shipped_test(
    settings: &DataSettings,
    split: &SplitSpec,
    warnings: &mut Vec<String>,
) -> Result<Option<Vec<PromptRow>>, RunError> {
    if split.held_out == HeldOut::Drawn || !settings.path.is_dir() {
        return Ok(None);
    }
    let Some(rows) = pq::read_test(settings, warnings)? else { return Ok(None) };
    let (test_size, seed) = (split.test_size, split.seed);
    if rows.len() <= test_size {
        return Ok(Some(rows));
    }
    let mut keep: Vec<usize> = (0..rows.len()).collect();
    crate::rng::Rng::derived(seed, "test-split", 0).shuffle(&mut keep);
    keep.truncate(test_size);
    keep.sort_unstable();
    let mut rows: Vec<Option<PromptRow>> = rows.into_iter().map(Some).collect();
    Ok(Some(keep.into_iter().filter_map(|i| rows[i].take()).collect()))
}

/// What a malformed row does under `on_error`.
pub(crate) fn malformed(on_error: OnError, msg: String, warnings: &mut Vec<String>) -> Result<(), RunError> {
    match on_error {
        OnError::Stop => {
            Err(RunError::new(E_DATA_LINE, msg)
                .with_help("fix the row, or set `on_error: skip` to skip malformed rows"))
        }
        OnError::Skip => {
            warnings.push(format!("skipped {msg}"));
            Ok(())
        }
    }
}

fn read_jsonl(settings: &DataSettings, warnings: &mut Vec<String>) -> Result<Vec<PromptRow>, RunError> {
    let path = &settings.path;
    let text = std::fs::read_to_string(path).map_err(|e| open_error(path, e))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let origin = format!("{}:{}", path.display(), i + 1);
        // Raw values keep each field's text, so message keys keep their order.
        let fields = serde_json::from_str::<BTreeMap<String, Box<RawValue>>>(line)
            .map_err(|e| {
                if serde_json::from_str::<Value>(line).is_ok() {
                    "not a JSON object".to_string()
                } else {
                    format!("not valid JSON: {e}")
                }
            })
            .and_then(|fields| {
                let mut values = Map::new();
                let mut prompt_raw = None;
                for (k, raw) in fields {
                    let v: Value = serde_json::from_str(raw.get()).map_err(|e| format!("field `{k}`: {e}"))?;
                    if k == settings.prompt_field {
                        prompt_raw = Some(raw.get().to_string());
                    }
                    values.insert(k, v);
                }
                row(settings, values, prompt_raw, origin.clone())
            });
        match fields {
            Ok(r) => out.push(r),
            Err(why) => malformed(settings.on_error, format!("{origin}: {why}"), warnings)?,
        }
    }
    Ok(out)
}

pub(crate) fn open_error(path: &Path, e: std::io::Error) -> RunError {
    let what =
        if e.kind() == std::io::ErrorKind::NotFound { "prompt file not found:" } else { "cannot read prompt file" };
    RunError::io(E_DATA_FILE, what, path, e)
}

/// A row from its fields; `prompt_json` is the prompt field's text in the file's key order.
pub(crate) fn row(
    settings: &DataSettings,
    mut fields: Map<String, Value>,
    prompt_json: Option<String>,
    origin: String,
) -> Result<PromptRow, String> {
    let name = &settings.prompt_field;
    let prompt = match fields.remove(name) {
        None => {
            let present: Vec<&str> = fields.keys().map(String::as_str).collect();
            return Err(format!("missing field `{name}` (fields: {})", present.join(", ")));
        }
        Some(Value::String(s)) if s.is_empty() => return Err(format!("field `{name}` is empty")),
        Some(Value::String(s)) => Prompt::Text(s),
        Some(Value::Array(items)) => {
            let list = messages(name, items)?;
            let json = prompt_json
                .unwrap_or_else(|| Value::Array(list.iter().cloned().map(Value::Object).collect()).to_string());
            Prompt::Chat(Messages { json, list })
        }
        Some(other) => {
            return Err(format!(
                "field `{name}` must be a string or a list of chat messages, found {}",
                crate::quote::truncate(&other.to_string(), 80)
            ))
        }
    };
    let label = fields.remove(&settings.label_field).unwrap_or(Value::Null);
    Ok(PromptRow { prompt, label, metadata: fields, origin })
}

fn messages(name: &str, items: Vec<Value>) -> Result<Vec<Map<String, Value>>, String> {
    if items.is_empty() {
        return Err(format!("field `{name}` is an empty list of messages"));
    }
    items
        .into_iter()
        .enumerate()
        .map(|(i, m)| {
            let Value::Object(m) = m else {
                return Err(format!("message {i} of `{name}` is not an object {{role, content}}"));
            };
            match m.get("role") {
                Some(Value::String(_)) => {}
                _ => return Err(format!("message {i} of `{name}` has no string `role`")),
            }
            match m.get("content") {
                Some(Value::String(_) | Value::Array(_) | Value::Null) => {}
                None if m.contains_key("tool_calls") => {}
                None => return Err(format!("message {i} of `{name}` has no `content`")),
                Some(other) => {
                    return Err(format!(
                        "message {i} of `{name}`: `content` must be a string, a list of parts or null, found {}",
                        crate::quote::truncate(&other.to_string(), 60)
                    ))
                }
            }
            Ok(m)
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    pub(crate) fn settings(path: PathBuf, on_error: OnError) -> DataSettings {
        DataSettings { path, prompt_field: "prompt".into(), label_field: "answer".into(), on_error }
    }

    fn tmp(name: &str, body: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("miles-prompts-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(name);
        std::fs::write(&p, body).unwrap();
        p
    }

    #[test]
    fn strings_and_chats_with_fields_passed_through() {
        let p = tmp(
            "a.jsonl",
            r#"{"prompt": "1+1=", "answer": 2, "level": "easy"}

{"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi", "name": "bob"}], "answer": {"x": [1]}}
{"prompt": [{"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"z": 1, "a": 2}}}]}]}
"#,
        );
        let mut w = Vec::new();
        let rows = read(&settings(p.clone(), OnError::Stop), &mut w).unwrap();
        assert!(w.is_empty(), "{w:?}");
        assert_eq!(rows[0].prompt, Prompt::Text("1+1=".into()));
        assert_eq!(rows[0].label, json!(2));
        assert_eq!(rows[0].metadata, json!({"level": "easy"}).as_object().unwrap().clone());
        assert_eq!(rows[0].origin, format!("{}:1", p.display()));
        let Prompt::Chat(m) = &rows[1].prompt else { panic!("{:?}", rows[1].prompt) };
        assert_eq!(m.list.len(), 2);
        assert_eq!(m.list[1]["name"], "bob");
        assert_eq!(rows[1].label, json!({"x": [1]}));
        assert_eq!(rows[1].origin, format!("{}:3", p.display()));
        // The file's key order survives for templates (`z` before `a`).
        let Prompt::Chat(m) = &rows[2].prompt else { panic!() };
        assert!(m.json.contains(r#"{"z": 1, "a": 2}"#), "{}", m.json);
        assert_eq!(rows[2].label, Value::Null);
        let input = rows[1].reward_input("s1".into(), "hello".into(), FinishReason::Stop);
        assert_eq!(input.prompt[0]["content"], "Be brief.");
        assert_eq!(input.metadata, json!({}));
    }

    #[test]
    fn malformed_rows_name_file_and_line() {
        let p = tmp(
            "b.jsonl",
            "{\"prompt\": \"ok\", \"answer\": \"1\"}\n{\"prompt\": 3}\n[1]\n{\"q\": \"x\"}\n{\"prompt\": [{\"content\": \"x\"}]}\n{\"prompt\": [{\"role\": \"user\", \"content\": 5}]}\n{\"prompt\": \n",
        );
        let mut w = Vec::new();
        let rows = read(&settings(p.clone(), OnError::Skip), &mut w).unwrap();
        assert_eq!(rows.len(), 1);
        let d = p.display();
        assert_eq!(
            w,
            vec![
                format!("skipped {d}:2: field `prompt` must be a string or a list of chat messages, found 3"),
                format!("skipped {d}:3: not a JSON object"),
                format!("skipped {d}:4: missing field `prompt` (fields: q)"),
                format!("skipped {d}:5: message 0 of `prompt` has no string `role`"),
                format!("skipped {d}:6: message 0 of `prompt`: `content` must be a string, a list of parts or null, found 5"),
                format!("skipped {d}:7: not valid JSON: EOF while parsing a value at line 1 column 11"),
            ]
        );
        let e = read(&settings(p, OnError::Stop), &mut Vec::new()).unwrap_err();
        assert_eq!(e.code, E_DATA_LINE);
        assert!(
            e.message.ends_with("b.jsonl:2: field `prompt` must be a string or a list of chat messages, found 3"),
            "{e}"
        );
    }

    #[test]
    fn empty_missing_and_unknown_files() {
        let p = tmp("empty.jsonl", "\n  \n");
        let e = read(&settings(p.clone(), OnError::Stop), &mut Vec::new()).unwrap_err();
        assert_eq!((e.code, e.message), (E_DATA_FILE, format!("{}: holds no prompts", p.display())));
        let e = read(&settings("/nonexistent/p.jsonl".into(), OnError::Stop), &mut Vec::new()).unwrap_err();
        assert!(e.message.starts_with("prompt file not found: /nonexistent/p.jsonl"), "{e}");
        let e = read(&settings("p.csv".into(), OnError::Stop), &mut Vec::new()).unwrap_err();
        assert_eq!(
            e.message,
            "p.csv: unknown prompt file format `.csv`: expected .jsonl, .parquet or a directory of .parquet shards"
        );
        let p = tmp("nolabel.jsonl", "{\"prompt\": \"x\"}\n");
        let mut w = Vec::new();
        read(&settings(p, OnError::Stop), &mut w).unwrap();
        assert!(w[0].ends_with("no row has the label field `answer`; rewards that need a label will fail"), "{w:?}");
    }
}
