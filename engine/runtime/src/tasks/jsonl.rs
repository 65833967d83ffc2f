//! Prompts from a JSONL file with user-named prompt and label fields.

use super::TaskItem;
use crate::spec::OnError;
use crate::{RunError, E_DATA_FILE, E_DATA_LINE};
use std::path::Path;

/// Reads `path`. Blank lines are ignored. A malformed line is an error naming file:line under
/// `OnError::Stop`, or a warning pushed to `warnings` under `OnError::Skip`.
pub fn read(
    path: &Path,
    prompt_field: &str,
    label_field: &str,
    on_error: OnError,
    warnings: &mut Vec<String>,
) -> Result<Vec<TaskItem>, RunError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        let what = if e.kind() == std::io::ErrorKind::NotFound {
            "task data file not found:".to_string()
        } else {
            "cannot read task data file".to_string()
        };
        RunError::io(E_DATA_FILE, &what, path, e)
    })?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match parse_line(line, prompt_field, label_field) {
            Ok(item) => out.push(item),
            Err(why) => {
                let msg = format!("{}:{}: {why}", path.display(), i + 1);
                match on_error {
                    OnError::Stop => {
                        return Err(RunError::new(E_DATA_LINE, msg)
                            .with_help("fix the line, or set `on_error: skip` to skip malformed lines"))
                    }
                    OnError::Skip => warnings.push(format!("skipped {msg}")),
                }
            }
        }
    }
    Ok(out)
}

fn parse_line(line: &str, prompt_field: &str, label_field: &str) -> Result<TaskItem, String> {
    let v: serde_json::Value = serde_json::from_str(line).map_err(|e| format!("not valid JSON: {e}"))?;
    let obj = v.as_object().ok_or_else(|| "not a JSON object".to_string())?;
    let field = |name: &str| -> Result<String, String> {
        match obj.get(name) {
            None => Err(format!("missing field `{name}`")),
            Some(serde_json::Value::String(s)) => Ok(s.clone()),
            // Numeric labels ("42" vs 42) are common in arithmetic data; accept them as text.
            Some(serde_json::Value::Number(n)) => Ok(n.to_string()),
            Some(_) => Err(format!("field `{name}` is not a string")),
        }
    };
    let prompt = field(prompt_field)?;
    let label = field(label_field)?;
    if prompt.is_empty() {
        return Err(format!("field `{prompt_field}` is empty"));
    }
    Ok(TaskItem { prompt, label })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str, body: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("miles-jsonl-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("d.jsonl");
        std::fs::write(&p, body).unwrap();
        p
    }

    #[test]
    fn skip_stop_and_missing() {
        let p = tmp("a", "{\"q\":\"1+1=\",\"a\":\"2\"}\n\nnot json\n{\"q\":\"2+2=\"}\n{\"q\":\"3+3=\",\"a\":6}\n");
        let mut w = Vec::new();
        let items = read(&p, "q", "a", OnError::Skip, &mut w).unwrap();
        assert_eq!(items.len(), 2);
        assert_eq!(items[1].label, "6");
        assert_eq!(w.len(), 2);
        assert!(w[0].contains("d.jsonl:3"), "{w:?}");
        assert!(w[1].contains(":4") && w[1].contains("missing field `a`"), "{w:?}");
        let e = read(&p, "q", "a", OnError::Stop, &mut Vec::new()).unwrap_err();
        assert_eq!(e.code, E_DATA_LINE);
        assert!(e.message.contains("d.jsonl:3"));
        let e = read(Path::new("/nonexistent/x.jsonl"), "q", "a", OnError::Skip, &mut w).unwrap_err();
        assert_eq!(e.code, E_DATA_FILE);
        assert!(e.message.contains("not found"));
    }
}
