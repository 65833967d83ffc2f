//! Robustness: thousands of random edits (insertions of code fragments, unicode and brackets;
//! deletions of random spans), sent as incremental changes, interleaved with every kind of
//! request at random positions. The server must answer everything, never panic, and its copy
//! of the text must equal the client's. Seeded and bounded in time, so it runs in the normal
//! suite in seconds.

use crate::support::Client;
use miles_lsp::convert::LineIndex;
use serde_json::json;
use std::time::{Duration, Instant};

/// xorshift64*: deterministic, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545F4914F6CDD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
}

const FRAGMENTS: &[&str] = &[
    "{",
    "}",
    "(",
    ")",
    "[",
    "]",
    "\n",
    " ",
    "x",
    "=",
    " = ",
    ".",
    "..",
    "->",
    ",",
    "\"",
    "//",
    "///",
    "€",
    "𝄞",
    "é",
    "train.",
    "lr = 1e-4\n",
    "rollout",
    "grpo(",
    "8.GB",
    "1..",
    "check ",
    "recipe r {\n",
    "import std/",
    "stage s(",
    "schema q {\n",
    "enum E { a, b }\n",
    "}\n}\n",
    "\t",
    "\r\n",
];

const SEED_TEXT: &str = include_str!("../../../recipes/grpo-arith.miles");

fn char_floor(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

#[test]
fn random_edits_never_break_the_server() {
    let mut c = Client::start(&format!("//- main.miles\n{SEED_TEXT}"));
    let uri = c.main_uri();
    let mut text = SEED_TEXT.to_string();
    let mut rng = Rng(0x9E3779B97F4A7C15);
    let started = Instant::now();
    let budget = Duration::from_secs(10);
    let mut version = 1;
    let mut edits = 0;
    while edits < 3000 && started.elapsed() < budget {
        // One edit: a deletion, an insertion or a replacement, at char boundaries.
        let a = char_floor(&text, rng.below(text.len() + 1));
        let b = match rng.below(3) {
            0 => a,
            _ => char_floor(&text, (a + rng.below(40)).min(text.len())),
        };
        let insert = match rng.below(3) {
            0 => String::new(),
            _ => FRAGMENTS[rng.below(FRAGMENTS.len())].to_string(),
        };
        let range = {
            let idx = LineIndex::new(&text);
            let (s, e) = (idx.position(a), idx.position(b));
            json!({ "start": { "line": s.line, "character": s.character }, "end": { "line": e.line, "character": e.character } })
        };
        text.replace_range(a..b, &insert);
        version += 1;
        c.notify(
            "textDocument/didChange",
            json!({ "textDocument": { "uri": uri, "version": version }, "contentChanges": [{ "range": range, "text": insert }] }),
        );
        edits += 1;
        // Keep the text from growing without bound.
        if text.len() > 4 * SEED_TEXT.len() {
            text = SEED_TEXT.to_string();
            version += 1;
            c.notify(
                "textDocument/didChange",
                json!({ "textDocument": { "uri": uri, "version": version }, "contentChanges": [{ "text": text }] }),
            );
        }
        if edits % 100 == 0 {
            let at = char_floor(&text, rng.below(text.len() + 1));
            let p = LineIndex::new(&text).position(at);
            let pos = json!({ "line": p.line, "character": p.character });
            let doc = json!({ "uri": uri });
            let whole = json!({ "start": { "line": 0, "character": 0 }, "end": { "line": 10_000, "character": 0 } });
            for (method, params) in [
                ("textDocument/hover", json!({ "textDocument": doc, "position": pos })),
                ("textDocument/completion", json!({ "textDocument": doc, "position": pos })),
                ("textDocument/definition", json!({ "textDocument": doc, "position": pos })),
                (
                    "textDocument/references",
                    json!({ "textDocument": doc, "position": pos, "context": { "includeDeclaration": true } }),
                ),
                ("textDocument/documentSymbol", json!({ "textDocument": doc })),
                ("textDocument/semanticTokens/full", json!({ "textDocument": doc })),
                ("textDocument/inlayHint", json!({ "textDocument": doc, "range": whole })),
                (
                    "textDocument/codeAction",
                    json!({ "textDocument": doc, "range": whole, "context": { "diagnostics": [] } }),
                ),
                (
                    "textDocument/formatting",
                    json!({ "textDocument": doc, "options": { "tabSize": 4, "insertSpaces": true } }),
                ),
            ] {
                let r = c.request(method, params);
                // Errors are answers too (rename of nothing, say); a crash would hang `request`.
                let _ = r;
            }
            let server_text = c.request("miles/documentText", json!({ "uri": uri }));
            assert_eq!(server_text.as_str(), Some(text.as_str()), "texts diverged after {edits} edits");
            c.notifications.clear();
        }
    }
    let server_text = c.request("miles/documentText", json!({ "uri": uri }));
    assert_eq!(server_text.as_str(), Some(text.as_str()));
    assert!(edits >= 500, "only {edits} edits in the time budget");
    eprintln!("{edits} random edits in {:.1} s", started.elapsed().as_secs_f64());
    c.shutdown();
}
