//! The panic guard: a bug in the compiler or the IDE layer costs one answer (an error) or one
//! notification (a log line), never the editor session. The server's `panic_once_on` injects the
//! panic inside the guarded handler, so these tests run the real guard.

use crate::support::*;
use serde_json::json;

const FIXTURE: &str = r#"recipe tiny {
    rollout = generate(transformer { layers = 2, d_model = 64, heads = 4, vocab = 16 }) {
        prompts = "p"
    }
    reward = exact_match(rollout)
    train  = gr$0po(rollout, reward) {
        lrr = 1e-4
    }
    stop = 100.steps
}
"#;

#[test]
fn a_panic_in_a_request_is_an_error_answer_and_the_session_goes_on() {
    let config = miles_lsp::Config { panic_once_on: Some("textDocument/hover".into()), ..Default::default() };
    let mut c = Client::start_config(FIXTURE, config);
    let h = c.at_cursor("textDocument/hover", json!({}));
    let err = h["error"].as_str().unwrap_or("");
    assert!(err.starts_with("internal error in textDocument/hover (a bug in miles; the session goes on)"), "{h}");
    // The same request again, and another one: answered.
    let h = c.at_cursor("textDocument/hover", json!({}));
    assert!(h["contents"]["value"].as_str().unwrap_or("").contains("stage grpo("), "{h}");
    let items = c.at_cursor("textDocument/completion", json!({}));
    assert!(!render_completions(&items).is_empty(), "{items}");
    c.shutdown();
}

#[test]
fn a_panic_in_a_notification_is_logged_and_the_session_goes_on() {
    let config = miles_lsp::Config { panic_once_on: Some("textDocument/didChange".into()), ..Default::default() };
    let mut c = Client::start_config(FIXTURE, config);
    let uri = c.main_uri();
    let _ = c.diagnostics(&uri);
    let text = c.fx.text("main.miles").replace("lrr = 1e-4", "lr = 1e-4");
    c.change(2, json!([{ "text": text.clone() }]));
    let log = c.notification("window/logMessage");
    assert!(log["message"].as_str().unwrap_or("").contains("injected panic in textDocument/didChange"), "{log}");
    // The lost edit is sent again (as an editor resyncs): diagnostics follow it.
    c.change(3, json!([{ "text": text }]));
    let mut d = c.diagnostics(&uri);
    while d["version"] != 3 {
        d = c.diagnostics(&uri);
    }
    assert!(!render_diagnostics(&d).contains("lrr"), "{}", render_diagnostics(&d));
    c.shutdown();
}
