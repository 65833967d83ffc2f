//! Any bytes as a chat template and the messages it renders (split at the first 0xFF byte,
//! which UTF-8 never holds): parsing and rendering (`miles_runtime::tokenize::ChatTemplate`, as
//! a model directory's template is) never panic, and a render ends: fuel bounds its
//! instructions, minijinja its recursion, a cap its output (issue #35). Run with libFuzzer's
//! `-timeout=10` so a render that does not end is a finding.
#![no_main]

use libfuzzer_sys::fuzz_target;
use miles_runtime::tokenize::{ChatTemplate, RenderOptions};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Messages used when the input's are not JSON: a conversation with a tool call, so that the
/// template's branches have something to read.
const MESSAGES: &str = r#"[{"role": "system", "content": "s"}, {"role": "user", "content": "q <|im_end|>"},
 {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1}}}]},
 {"role": "tool", "content": "2"}]"#;

fuzz_target!(|data: &[u8]| {
    let (source, rest) = match data.iter().position(|&b| b == 0xFF) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    let Ok(source) = std::str::from_utf8(source) else { return };
    let Ok(t) = ChatTemplate::new(source, PathBuf::from("fuzz/chat_template.jinja")) else { return };
    let messages = std::str::from_utf8(rest).ok().filter(|m| serde_json::from_str::<serde_json::Value>(m).is_ok());
    let specials = BTreeMap::from([("bos_token".to_string(), "<s>".to_string()), ("eos_token".to_string(), "</s>".to_string())]);
    for add_generation_prompt in [false, true] {
        let options = RenderOptions {
            add_generation_prompt,
            tools_json: Some(r#"[{"type": "function", "function": {"name": "f", "parameters": {}}}]"#.into()),
            ..Default::default()
        };
        let _ = t.render(messages.unwrap_or(MESSAGES), &options, &specials);
    }
});
