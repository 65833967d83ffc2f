//! `miles data RECIPE` through the built binary: the rows as the model sees them (string prompts
//! with the character tokenizer, chat prompts through a Hugging Face chat template, a Parquet
//! file), the length histogram against `max_prompt_tokens`, the split under each `split_by`
//! rule, malformed rows; and a file whose rows share one prompt, whose dedup the preview shows
//! and which `split_by = row` lets train.

use crate::common;

use common::metrics::json_file;
use common::process::{run_miles as miles, run_recipe, temp_dir, text};
use serde_json::{json, Value};
use std::path::Path;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(300);

/// A one-step GRPO recipe over `prompts` (a prompt set's text) with `model`, written in `dir`.
fn recipe(dir: &Path, model: &str, prompts: &str, max_prompt: u32) -> String {
    let path = dir.join("data.miles");
    let text = format!(
        r#"
model policy = {model}
recipe d {{
    rollout = generate(policy) {{
        prompts = {prompts}
        samples_per_prompt = 2
        max_prompt_tokens = {max_prompt}.tokens
        max_new_tokens = 3.tokens
    }}
    reward = exact_match(rollout)
    train = grpo(rollout, reward) {{ rollout_batch = 2, global_batch = 4, micro_batch = 4, lr = 1e-3 }}
    sync = weights(train -> rollout) {{ transport = local }}
    stop = 1.steps
}}
"#
    );
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// A seeded one-layer model: the run's tokenizer is the character one.
const TINY: &str = "transformer { layers = 1, d_model = 16, heads = 2, vocab = 32, max_len = 12 }";

/// `miles data ARGS`: its stdout with the scratch directory written `DIR`, and its exit code.
fn data(dir: &Path, args: &[&str]) -> (String, Option<i32>) {
    let mut all = vec!["data"];
    all.extend_from_slice(args);
    let o = miles(&all);
    let out = String::from_utf8_lossy(&o.stdout).replace(&dir.display().to_string(), "DIR");
    (out, o.status.code())
}

/// `miles data ARGS --json`.
fn data_json(args: &[&str]) -> Value {
    let mut all = vec!["data", "--json"];
    all.extend_from_slice(args);
    let o = miles(&all);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&o)))
}

#[test]
fn string_prompts_with_the_character_tokenizer() {
    let d = temp_dir("data-strings");
    let file = d.join("sums.jsonl");
    let mut rows: String = (0..12)
        .map(|i| format!("{{\"q\": \"{i}+{}=\", \"a\": \"{}\", \"level\": {}}}\n", i % 3, i + i % 3, i % 2))
        .collect();
    rows.push_str("{\"q\": 5}\n{broken\n");
    std::fs::write(&file, rows).unwrap();
    let prompts = format!(
        r#"jsonl {{ path = "{}", prompt_field = "q", label_field = "a", on_error = skip, test_size = 4 }}"#,
        file.display()
    );
    let r = recipe(&d, TINY, &prompts, 5);
    let (out, code) = data(&d, &[&r, "-n", "2"]);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(
        out,
        r#"recipe d, rollout `rollout`
prompts: jsonl DIR/sums.jsonl (prompt field `q`, label field `a`): 12 row(s) read
tokenizer: characters of the data (15 tokens with <pad>, <s>, </s>)

row DIR/sums.jsonl:1, train: 5 tokens
  | <s>0+0=
  ids: [1, 4, 3, 4, 14]
  label: "0"
  metadata: {"level":0}

row DIR/sums.jsonl:2, train: 5 tokens
  | <s>1+1=
  ids: [1, 5, 3, 5, 14]
  label: "2"
  metadata: {"level":1}

prompt lengths in tokens, 12 train and test rows: min 5, mean 5.2, max 6; longest answer 3 (with its stop token)
            5 | ######################################## 10
                -- max_prompt_tokens 5 --
            6 | ######## 2
                -- max_len 12 less max_new_tokens 3 = 9 --
  over max_prompt_tokens 5: 2
  over max_len 12 less max_new_tokens 3 = 9: 0
  a row over a limit stops the run before its first step (E0510): raise the limit, or leave the longer rows out of the file

split: by prompt, seed 1234, test_size 4
  train 8, test 4, dropped 0

malformed rows skipped: 2
  DIR/sums.jsonl:13: field `q` must be a string or a list of chat messages, found 5
  DIR/sums.jsonl:14: not valid JSON: key must be a string at line 1 column 2
"#
    );
    // The same as JSON: every id of the rows shown, the bins, the limits and the split.
    let j = data_json(&[&r, "-n", "1"]);
    assert_eq!(j["rows"][0]["ids"], json!([1, 4, 3, 4, 14]));
    assert_eq!(j["rows"][0]["metadata"], json!({"level": 0}));
    assert_eq!(j["lengths"]["bins"], json!([{"from": 5, "to": 5, "count": 10}, {"from": 6, "to": 6, "count": 2}]));
    assert_eq!(j["lengths"]["limits"][0], json!({"name": "max_prompt_tokens", "limit": 5, "over": 2}));
    assert_eq!((j["split"]["train"].clone(), j["split"]["test"].clone()), (json!(8), json!(4)));
    assert_eq!(j["malformed"].as_array().map(Vec::len), Some(2));
    let _ = std::fs::remove_dir_all(&d);
}

/// Chat prompts rendered by the model's chat template, its special tokens written out.
#[test]
fn chat_prompts_through_the_chat_template() {
    let d = temp_dir("data-chat");
    let file = d.join("chat.jsonl");
    let rows: String = (0..6)
        .map(|i| {
            let m = json!([
                {"role": "system", "content": "Answer with a number."},
                {"role": "user", "content": format!("What is {i}+{i}?")}
            ]);
            format!("{}\n", json!({"messages": m, "answer": (2 * i).to_string(), "level": i % 2}))
        })
        .collect();
    std::fs::write(&file, rows).unwrap();
    let prompts = format!(
        r#"jsonl {{ path = "{}", prompt_field = "messages", label_field = "answer", test_size = 2 }}"#,
        file.display()
    );
    let r = recipe(&d, r#"hf { path = "tests/fixtures/hf/qwen3-chat" }"#, &prompts, 64);
    let (out, code) = data(&d, &[&r, "-n", "1"]);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(
        out,
        r#"recipe d, rollout `rollout`
prompts: jsonl DIR/chat.jsonl (prompt field `messages`, label field `answer`): 6 row(s) read
tokenizer: tests/fixtures/hf/qwen3-chat (Hugging Face, 384 tokens, with a chat template)

row DIR/chat.jsonl:1, test: 42 tokens
  | <|im_start|>system
  | Answer with a number.<|im_end|>
  | <|im_start|>user
  | What is 0+0?<|im_end|>
  | <|im_start|>assistant
  |
  ids: [1, 363, 375, 205, 39, 84, 89, 93, 279, 227, 93, 353, 301, 227, 84, 91, ... 18 more ..., 17, 22, 37, 2, 205, 1, 332, 205]
  label: "0"
  metadata: {"level":0}

prompt lengths in tokens, 6 train and test rows: min 42, mean 42.0, max 42; longest answer 3 (with its stop token)
           42 | ######################################## 6
                -- max_prompt_tokens 64 --
                -- max_len 512 less max_new_tokens 3 = 509 --
  over max_prompt_tokens 64: 0
  over max_len 512 less max_new_tokens 3 = 509: 0

split: by prompt, seed 1234, test_size 2
  train 4, test 2, dropped 0

malformed rows skipped: 0
"#
    );
    let _ = std::fs::remove_dir_all(&d);
}

/// A Parquet file (string prompts, list and integer columns as metadata) with a Hugging Face
/// tokenizer that adds no BOS.
#[test]
fn a_parquet_file() {
    let d = temp_dir("data-parquet");
    let prompts = r#"parquet { path = "tests/fixtures/data/prompts.parquet", label_field = "answer", test_size = 1 }"#;
    let r = recipe(&d, r#"hf { path = "tests/fixtures/hf/qwen2" }"#, prompts, 32);
    let (out, code) = data(&d, &[&r]);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(
        out,
        r#"recipe d, rollout `rollout`
prompts: parquet tests/fixtures/data/prompts.parquet (prompt field `prompt`, label field `answer`): 3 row(s) read
tokenizer: tests/fixtures/hf/qwen2 (Hugging Face, 500 tokens, with a chat template)

row tests/fixtures/data/prompts.parquet#1, train: 12 tokens
  | What is 6 times 7?
  ids: [57, 74, 274, 330, 223, 24, 264, 362, 262, 223, 25, 33]
  label: "42"
  metadata: {"level":1,"tags":["arith","easy"]}

row tests/fixtures/data/prompts.parquet#2, train: 10 tokens
  | Reverse 'abc'.
  ids: [52, 71, 325, 353, 223, 9, 414, 69, 9, 16]
  label: "cba"
  metadata: {"level":2,"tags":["strings"]}

row tests/fixtures/data/prompts.parquet#3, test: 4 tokens
  | 2+2=
  ids: [20, 13, 20, 31]
  label: "4"
  metadata: {"level":1,"tags":[]}

prompt lengths in tokens, 3 train and test rows: min 4, mean 8.7, max 12; longest answer 4 (with its stop token)
            4 | ######################################## 1
            5 | 0
            6 | 0
            7 | 0
            8 | 0
            9 | 0
           10 | ######################################## 1
           11 | 0
           12 | ######################################## 1
                -- max_prompt_tokens 32 --
                -- max_len 128 less the longest answer 4 = 124 --
  over max_prompt_tokens 32: 0
  over max_len 128 less the longest answer 4 = 124: 0

split: by prompt, seed 1234, test_size 1
  train 2, test 1, dropped 0

malformed rows skipped: 0
"#
    );
    let _ = std::fs::remove_dir_all(&d);
}

/// 40 rows over 10 prompts, 4 answers each, and a problem id: the counts of each rule.
#[test]
fn the_split_counts_under_each_rule() {
    let d = temp_dir("data-rules");
    let file = d.join("rows.jsonl");
    let rows: String =
        (0..40).map(|i| format!("{{\"prompt\": \"q{}\", \"label\": \"{i}\", \"id\": {}}}\n", i % 10, i % 10)).collect();
    std::fs::write(&file, rows).unwrap();
    let counts = |rule: &str| {
        let prompts = format!(r#"jsonl {{ path = "{}", test_size = 6{rule} }}"#, file.display());
        let s = data_json(&[&recipe(&d, TINY, &prompts, 8)])["split"].clone();
        (s["by"].clone(), s["train"].clone(), s["test"].clone(), s["dropped"].clone(), s["groups"].clone())
    };
    assert_eq!(counts(""), (json!("prompt"), json!(20), json!(6), json!(14), Value::Null));
    assert_eq!(counts(", split_by = row"), (json!("row"), json!(34), json!(6), json!(0), Value::Null));
    assert_eq!(
        counts(r#", split_by = key, split_key = "id""#),
        (json!("key \"id\""), json!(32), json!(8), json!(0), json!(10))
    );
    let _ = std::fs::remove_dir_all(&d);
}

/// Issue #36's newcomer: rows that share one prompt (the answer only in the label). `miles data`
/// shows the dedup emptying the train split and exits 1; `miles run` stops with the same error,
/// naming `split_by`; with `split_by = row` the run's split works and it trains.
#[test]
fn a_shared_prompt_file_shows_its_dedup_and_runs_split_by_row() {
    let d = temp_dir("data-shared");
    let file = d.join("same.jsonl");
    let rows: String = (0..40).map(|i| format!("{{\"prompt\": \"solve\", \"label\": \"{}\"}}\n", i % 10)).collect();
    std::fs::write(&file, rows).unwrap();
    let prompts = |rule: &str| format!(r#"jsonl {{ path = "{}", test_size = 8{rule} }}"#, file.display());
    let r = recipe(&d, TINY, &prompts(""), 6);
    let (out, code) = data(&d, &[&r, "-n", "1"]);
    assert_eq!(code, Some(1), "{out}");
    assert_eq!(
        out,
        r#"recipe d, rollout `rollout`
prompts: jsonl DIR/same.jsonl (prompt field `prompt`, label field `label`): 40 row(s) read
tokenizer: characters of the data (13 tokens with <pad>, <s>, </s>)

row DIR/same.jsonl:1, dropped: 6 tokens
  | <s>solve
  ids: [1, 11, 10, 9, 12, 8]
  label: "0"

prompt lengths in tokens, 8 train and test rows: min 6, mean 6.0, max 6; longest answer 2 (with its stop token)
            6 | ######################################## 8
                -- max_prompt_tokens 6 --
                -- max_len 12 less max_new_tokens 3 = 9 --
  over max_prompt_tokens 6: 0
  over max_len 12 less max_new_tokens 3 = 9: 0

split: by prompt, seed 1234, test_size 8
  train 0, test 8, dropped 32
  dropped because a test row has its prompt (split_by = prompt keeps them apart):
    DIR/same.jsonl:31: solve
    DIR/same.jsonl:12: solve
    DIR/same.jsonl:17: solve
    ... and 29 more
  the run stops here: DIR/same.jsonl: needs at least one usable train and one test prompt (train 0, test 8)

malformed rows skipped: 0
"#
    );
    let o = run_recipe(Path::new(&r), &d.join("run"), LIMIT);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("Set `split_by = row` to split the rows as they are"), "{}", text(&o));

    let r = recipe(&d, TINY, &prompts(", split_by = row"), 6);
    let (out, code) = data(&d, &[&r, "-n", "0"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("\nsplit: by row, seed 1234, test_size 8\n  train 32, test 8, dropped 0\n"), "{out}");
    let o = run_recipe(Path::new(&r), &d.join("run-row"), LIMIT);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let spec = json_file(&d.join("run-row/spec.json"));
    assert_eq!(spec["task"]["split"], json!({"test_size": 8, "seed": 1234, "by": "row"}));
    let _ = std::fs::remove_dir_all(&d);
}

/// A malformed row under `on_error = stop` is the run's own error, at its file:line.
#[test]
fn a_malformed_row_stops_the_preview_as_it_stops_the_run() {
    let d = temp_dir("data-malformed");
    let file = d.join("bad.jsonl");
    std::fs::write(&file, "{\"prompt\": \"1+1=\", \"label\": \"2\"}\n{\"q\": \"x\"}\n").unwrap();
    let r = recipe(&d, TINY, &format!(r#"jsonl {{ path = "{}" }}"#, file.display()), 8);
    let o = miles(&["data", &r]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "");
    assert_eq!(
        String::from_utf8_lossy(&o.stderr).replace(&d.display().to_string(), "DIR"),
        "error[E0502]: DIR/bad.jsonl:2: missing field `prompt` (fields: q)\n  \
         help: fix the row, or set `on_error: skip` to skip malformed rows\n"
    );
    let _ = std::fs::remove_dir_all(&d);
}
