//! The server over JSON-RPC, in process: multi-file fixtures with a `$0` cursor, answers
//! rendered as short text and snapshotted (lsp/tests/integration/snapshots/). What each feature
//! answers is tested in the IDE layer (engine/ide, `$0` fixture tests at the end of each module);
//! these tests cover what the server adds: publication, conversion to LSP positions and kinds,
//! the search over every open document, files on disk, and the panic guard.

use crate::support::*;
use insta::assert_snapshot;
use serde_json::{json, Value};

/// A recipe that imports a library module and the stdlib task; `$0` goes where each test asks.
fn recipe(body_marker: &str) -> String {
    format!(
        r#"//- main.miles
import std/tasks/arith
import ./lib/common

/// The policy.
model policy = transformer {{ layers = 2, d_model = 64, heads = 4, vocab = arith.vocab }}

recipe tiny {{
    rollout = generate(policy) {{
        prompts        = arith.addition {{ digits = 2 }}
        max_new_tokens = common.answer_tokens
    }}
    reward = exact_match(rollout)
    train  = grpo(rollout, reward) {{
        rollout_batch = 16
        global_batch  = 128
        lr            = common.peak_lr
        {body_marker}
    }}
    sync = weights(train -> rollout)
    stop = 100.steps
}}
//- lib/common.miles
/// Peak learning rate of every recipe of the team.
const peak_lr = 3e-4
/// Answer length in tokens.
const answer_tokens = 2.tokens * 2
"#
    )
}

fn hover_text(c: &mut Client) -> String {
    let h = c.at_cursor("textDocument/hover", json!({}));
    if h.is_null() {
        return "(no hover)".into();
    }
    let range = c.loc(&c.main_uri(), &h["range"]);
    format!("{range}\n{}", h["contents"]["value"].as_str().unwrap_or(""))
}

fn completion_text(c: &mut Client) -> String {
    let v = c.at_cursor("textDocument/completion", json!({}));
    render_completions(&v)
}

#[test]
fn diagnostics_on_open_and_change() {
    let mut c = Client::start(&recipe("lrr = 1e-4"));
    let uri = c.main_uri();
    let d = c.diagnostics(&uri);
    assert_snapshot!("diagnostics_open", render_diagnostics(&d));
    // Fix the typo: the next publication is clean.
    let text = c.fx.text("main.miles").replace("lrr = 1e-4", "");
    c.change(2, json!([{ "text": text }]));
    let d = c.diagnostics(&uri);
    assert_eq!(render_diagnostics(&d), "");
    assert_eq!(d["version"], 2);
    // Closing clears whatever the editor showed.
    c.notify("textDocument/didClose", json!({ "textDocument": { "uri": uri } }));
    let d = c.diagnostics(&uri);
    assert_eq!(d["diagnostics"], json!([]));
    c.shutdown();
}

#[test]
fn diagnostics_keep_going_past_a_syntax_error() {
    let mut c = Client::start(
        r#"const broken = (1 +
const fine: Bytes = 4
recipe r {
    x = = 2
}
"#,
    );
    let uri = c.main_uri();
    let d = c.diagnostics(&uri);
    assert_snapshot!(render_diagnostics(&d));
    c.shutdown();
}

#[test]
fn hover_on_a_stage_kind() {
    let mut c = Client::start(&recipe("").replace("train  = grpo(", "train  = gr$0po("));
    assert_snapshot!(hover_text(&mut c));
    c.shutdown();
}

#[test]
fn completion_of_stage_parameters() {
    let mut c = Client::start(&recipe("$0"));
    assert_snapshot!(completion_text(&mut c));
    c.shutdown();
}

#[test]
fn stdlib_files_are_read_only_and_analysed_as_stdlib() {
    let mut c = Client::start(&recipe("").replace("train  = grpo(", "train  = gr$0po("));
    let d = c.at_cursor("textDocument/definition", json!({}));
    let uri = d["uri"].as_str().unwrap_or("").to_string();
    let path = lsp_types::Url::parse(&uri).ok().and_then(|u| u.to_file_path().ok()).unwrap_or_default();
    assert!(std::fs::metadata(&path).map(|m| m.permissions().readonly()).unwrap_or(false));
    // Opening it: hover works there, and it has no diagnostics of its own.
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    c.notify(
        "textDocument/didOpen",
        json!({ "textDocument": { "uri": uri, "languageId": "miles", "version": 1, "text": text } }),
    );
    let diags = c.diagnostics(&uri);
    assert_eq!(render_diagnostics(&diags), "");
    let at = text.find("stage grpo").unwrap_or(0) + "stage g".len();
    let line = text[..at].matches('\n').count();
    let col = at - text[..at].rfind('\n').map(|i| i + 1).unwrap_or(0);
    let h = c.request(
        "textDocument/hover",
        json!({ "textDocument": { "uri": uri }, "position": { "line": line, "character": col } }),
    );
    assert!(h["contents"]["value"]
        .as_str()
        .unwrap_or("")
        .contains("stage grpo(rollout: Trajectories, reward: Scores) -> Policy"));
    let r = c.request(
        "textDocument/rename",
        json!({ "textDocument": { "uri": uri }, "position": { "line": line, "character": col }, "newName": "x" }),
    );
    assert_snapshot!(r["error"].as_str().unwrap_or("renamed?!"), @"`grpo` is declared in the standard library, which is read-only");
    c.shutdown();
}

#[test]
fn find_references_across_open_documents() {
    let mut c = Client::start(&recipe("").replace(
        "/// Peak learning rate of every recipe of the team.\nconst peak_lr",
        "/// Peak learning rate of every recipe of the team.\nconst pea$0k_lr",
    ));
    // The cursor is in lib/common.miles; the recipe that uses it is open too.
    c.open("main.miles");
    let refs = c.at_cursor("textDocument/references", json!({ "context": { "includeDeclaration": true } }));
    let mut out = String::new();
    for r in refs.as_array().cloned().unwrap_or_default() {
        let uri = r["uri"].as_str().unwrap_or("").to_string();
        out.push_str(&format!("{} `{}`\n", c.loc(&uri, &r["range"]), c.range_text(&uri, &r["range"])));
    }
    assert_snapshot!(out);
    c.shutdown();
}

fn render_symbols(v: &Value, depth: usize, out: &mut String) {
    for s in v.as_array().cloned().unwrap_or_default() {
        let r = &s["range"]["start"];
        out.push_str(&format!(
            "{}{} (kind {}) {} @{}\n",
            "  ".repeat(depth),
            s["name"].as_str().unwrap_or(""),
            s["kind"],
            s["detail"].as_str().unwrap_or(""),
            r["line"].as_u64().unwrap_or(0) + 1
        ));
        render_symbols(&s["children"], depth + 1, out);
    }
}

#[test]
fn document_symbols() {
    let mut c = Client::start(&recipe(""));
    let u = c.main_uri();
    let v = c.request("textDocument/documentSymbol", json!({ "textDocument": { "uri": u } }));
    let mut out = String::new();
    render_symbols(&v, 0, &mut out);
    assert_snapshot!(out);
    c.shutdown();
}

const TOKEN_TYPES: &[&str] = &[
    "keyword",
    "comment",
    "string",
    "number",
    "namespace",
    "type",
    "enum",
    "enumMember",
    "interface",
    "function",
    "property",
    "parameter",
    "variable",
    "operator",
];

#[test]
fn semantic_tokens() {
    let src = r#"import std/tasks/arith
/// Doc.
enum Mode { fast, slow }
schema opts { mode: Mode = fast, size: Bytes = 1.GB }
const o = opts { mode = Mode.slow }   // a comment
recipe r {
    rollout = generate(arith.addition {}) { prompts = arith.addition {} }
}
"#;
    let mut c = Client::start(src);
    let u = c.main_uri();
    let v = c.request("textDocument/semanticTokens/full", json!({ "textDocument": { "uri": u } }));
    let data: Vec<u64> = v["data"].as_array().cloned().unwrap_or_default().iter().filter_map(|x| x.as_u64()).collect();
    let lines: Vec<&str> = src.split('\n').collect();
    let (mut line, mut col) = (0usize, 0usize);
    let mut out = String::new();
    for t in data.chunks(5) {
        if t[0] > 0 {
            line += t[0] as usize;
            col = t[1] as usize;
        } else {
            col += t[1] as usize;
        }
        let text = lines.get(line).and_then(|l| l.get(col..col + t[2] as usize)).unwrap_or("?");
        let mods: Vec<&str> = ["declaration", "defaultLibrary", "documentation"]
            .iter()
            .enumerate()
            .filter(|(i, _)| t[4] & (1 << i) != 0)
            .map(|(_, m)| *m)
            .collect();
        out.push_str(&format!("{}:{} {text:?} {} {}\n", line + 1, col + 1, TOKEN_TYPES[t[3] as usize], mods.join(",")));
    }
    assert_snapshot!(out);
    c.shutdown();
}

#[test]
fn inlay_hints_show_defaulted_parameters() {
    let mut c = Client::start(&recipe(""));
    let u = c.main_uri();
    let v = c.request(
        "textDocument/inlayHint",
        json!({ "textDocument": { "uri": u }, "range": { "start": { "line": 0, "character": 0 }, "end": { "line": 100, "character": 0 } } }),
    );
    let mut out = String::new();
    for h in v.as_array().cloned().unwrap_or_default() {
        out.push_str(&format!(
            "{}:{} {}\n",
            h["position"]["line"].as_u64().unwrap_or(0) + 1,
            h["position"]["character"].as_u64().unwrap_or(0) + 1,
            h["label"].as_str().unwrap_or("")
        ));
    }
    assert_snapshot!(out);
    c.shutdown();
}

#[test]
fn code_actions_apply_the_compilers_fixes() {
    let mut c = Client::start(
        &recipe("").replace("global_batch  = 128", "global_bach  = 128").replace("stop = 100.steps", "stop = 100"),
    );
    let u = c.main_uri();
    let _ = c.diagnostics(&u);
    let v = c.request(
        "textDocument/codeAction",
        json!({ "textDocument": { "uri": u }, "range": { "start": { "line": 0, "character": 0 }, "end": { "line": 100, "character": 0 } }, "context": { "diagnostics": [] } }),
    );
    let mut out = String::new();
    for a in v.as_array().cloned().unwrap_or_default() {
        for (uri, edits) in a["edit"]["changes"].as_object().cloned().unwrap_or_default() {
            for e in edits.as_array().cloned().unwrap_or_default() {
                out.push_str(&format!(
                    "{}: {} {}\n",
                    a["title"].as_str().unwrap_or(""),
                    c.loc(&uri, &e["range"]),
                    e["newText"]
                ));
            }
        }
    }
    assert_snapshot!(out);
    c.shutdown();
}

#[test]
fn formatting_a_document() {
    let mut c = Client::start("recipe   r   {\n  stop=100.steps   // how long\n\n\n  seed = 1\n}\n");
    let u = c.main_uri();
    let v = c.request(
        "textDocument/formatting",
        json!({ "textDocument": { "uri": u }, "options": { "tabSize": 4, "insertSpaces": true } }),
    );
    assert_snapshot!(v[0]["newText"].as_str().unwrap_or("(no edit)"));
    c.shutdown();
    // A file with a syntax error is left alone.
    let mut c = Client::start("const x = (1 +\n");
    let u = c.main_uri();
    let v = c.request(
        "textDocument/formatting",
        json!({ "textDocument": { "uri": u }, "options": { "tabSize": 4, "insertSpaces": true } }),
    );
    assert_eq!(v, Value::Null);
    c.shutdown();
}

/// Compiling opens the imported files; the watcher reports those reads, which must not start
/// another check (each check would read them again, forever).
#[test]
fn reading_imported_files_does_not_recheck() {
    let mut c = Client::start_with(&recipe(""), true);
    let u = c.main_uri();
    assert_eq!(render_diagnostics(&c.diagnostics(&u)), "");
    assert_eq!(c.publications_within(std::time::Duration::from_millis(500)), 0);
    // A change is checked (a few events, a few publications), then the server is quiet again.
    std::fs::write(c.fx.path("lib/common.miles"), "const peak_lr = 3e-4\nconst answer_tokens = 4.tokens\n")
        .expect("write");
    assert!(c.publications_within(std::time::Duration::from_millis(500)) > 0, "the change is checked");
    assert_eq!(c.publications_within(std::time::Duration::from_millis(500)), 0);
    c.shutdown();
}

#[test]
fn imported_file_changed_on_disk_is_rechecked() {
    let mut c = Client::start_with(&recipe(""), true);
    let u = c.main_uri();
    let d = c.diagnostics(&u);
    assert_eq!(render_diagnostics(&d), "");
    // Outside the editor, the library's constant loses its unit.
    let lib = c.fx.path("lib/common.miles");
    std::fs::write(&lib, "const peak_lr = 3e-4\nconst answer_tokens = 4\n").expect("write");
    // The watcher may report the truncation before the write: a check of the empty file can
    // come first; the last one sees the whole file.
    let mut d = c.diagnostics(&u);
    for _ in 0..20 {
        if render_diagnostics(&d).contains("E0202") {
            break;
        }
        d = c.diagnostics(&u);
    }
    assert!(render_diagnostics(&d).contains("E0202"), "{}", render_diagnostics(&d));
    c.shutdown();
}

#[test]
fn rename_a_library_constant_renames_its_uses_in_other_open_documents() {
    // The cursor is in lib/common.miles; main.miles, which uses the constant, is open too.
    let mut c = Client::start(&recipe("").replace("const peak_lr", "const pea$0k_lr"));
    c.open("main.miles");
    let r = c.at_cursor("textDocument/rename", json!({ "newName": "top_lr" }));
    let mut edits: Vec<String> = Vec::new();
    for (uri, list) in r["changes"].as_object().cloned().unwrap_or_default() {
        for e in list.as_array().cloned().unwrap_or_default() {
            edits.push(format!("{} `{}`", c.loc(&uri, &e["range"]), c.range_text(&uri, &e["range"])));
        }
    }
    edits.sort();
    assert_eq!(edits, ["lib/common.miles:2:7-2:14 `peak_lr`", "main.miles:16:32-16:39 `peak_lr`"]);
    c.shutdown();
}
