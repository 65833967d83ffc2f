//! Language-server latency on a generated 1,000-line recipe that imports a library module and
//! the stdlib: `cargo bench -p miles-lsp --bench lsp`.
//!
//! The server runs in-process (`Connection::memory`), so the figures are the server's own work:
//! applying the edit, compiling the file with everything it imports, and answering. Measured:
//! - didChange -> publishDiagnostics (one edit, then wait for that version's diagnostics);
//! - didChange -> completion response (an edit, then a completion request inside a stage block:
//!   the request compiles the new text before answering).
//!
//! Prints medians and 99th percentiles; results go in bench/RESULTS.md.

use lsp_server::{Connection, Message, Notification, Request, RequestId};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const ROUNDS: usize = 300;

fn generate(dir: &std::path::Path) -> (String, usize, usize) {
    let mut lib = String::from("// A team library.\n");
    for i in 0..60 {
        lib.push_str(&format!("/// Constant {i}.\nconst c{i} = {i} * 2 + 1\n"));
    }
    std::fs::write(dir.join("lib.miles"), lib).expect("write lib");
    let mut s = String::from("import std/tasks/arith\nimport std/hardware\nimport ./lib\n\n");
    let mut n = 0;
    while s.lines().count() < 900 {
        s.push_str(&format!(
            "/// Schedule {n}.\nschema sched{n} {{\n    peak: Float in 0..1 = 1e-4\n    warmup: Steps = {w}.steps\n    total: Steps = 1000.steps\n    check warmup < total else \"warm-up must end before training\"\n}}\nconst s{n} = sched{n} {{ warmup = {w}.steps }}\nconst k{n} = lib.c{m} + {n}\n\n",
            w = 10 + n,
            m = n % 60
        ));
        n += 1;
    }
    s.push_str(
        "model policy = transformer { layers = 2, d_model = 64, heads = 4, vocab = arith.vocab }\n\nrecipe big {\n",
    );
    for r in 0..8 {
        s.push_str(&format!(
            "    rollout{r} = generate(policy) {{\n        prompts = arith.addition {{ digits = 2 }}\n        max_new_tokens = 4.tokens\n    }}\n    reward{r} = exact_match(rollout{r})\n    train{r} = grpo(rollout{r}, reward{r}) {{\n        rollout_batch = 16\n        global_batch  = 128\n        lr            = 3e-4\n\n    }}\n    sync{r} = weights(train{r} -> rollout{r})\n"
        ));
    }
    s.push_str("    stop = 100.steps\n}\n");
    while s.lines().count() < 1000 {
        s.push_str("// padding\n");
    }
    // The blank line inside train0's block: where completion is asked.
    let marker = s.find("lr            = 3e-4\n\n").expect("marker") + "lr            = 3e-4\n".len();
    let line = s[..marker].matches('\n').count();
    let lines = s.lines().count();
    std::fs::write(dir.join("main.miles"), &s).expect("write main");
    (s, line, lines)
}

struct Client {
    conn: Connection,
    id: i32,
    /// Diagnostics that came while a response was awaited, by version: the server may publish
    /// an edit's diagnostics before it answers the request that followed the edit.
    early: std::collections::HashMap<i64, Value>,
}

impl Client {
    fn notify(&self, method: &str, params: Value) {
        let _ = self.conn.sender.send(Message::Notification(Notification { method: method.into(), params }));
    }
    fn request(&mut self, method: &str, params: Value) -> Value {
        self.id += 1;
        let id = RequestId::from(self.id);
        let _ = self.conn.sender.send(Message::Request(Request { id: id.clone(), method: method.into(), params }));
        loop {
            match self.conn.receiver.recv_timeout(Duration::from_secs(30)) {
                Ok(Message::Response(r)) if r.id == id => return r.result.unwrap_or(Value::Null),
                Ok(Message::Notification(n)) if n.method == "textDocument/publishDiagnostics" => {
                    if let Some(v) = n.params["version"].as_i64() {
                        self.early.insert(v, n.params);
                    }
                }
                Ok(_) => {}
                Err(e) => panic!("no response: {e}"),
            }
        }
    }
    /// Replaces the line `const k0 = ...` (alternating between values, so every round compiles
    /// real work).
    fn edit(&self, uri: &str, version: i32, line: usize, line_len: usize, round: usize) {
        let new = format!("const k0 = lib.c0 + {}", round % 7);
        self.notify(
            "textDocument/didChange",
            json!({ "textDocument": { "uri": uri, "version": version }, "contentChanges": [{
                "range": { "start": { "line": line, "character": 0 }, "end": { "line": line, "character": line_len } },
                "text": new }] }),
        );
    }
    fn diagnostics_for_version(&mut self, version: i32) -> Value {
        if let Some(d) = self.early.remove(&i64::from(version)) {
            self.early.clear();
            return d;
        }
        self.early.clear();
        loop {
            match self.conn.receiver.recv_timeout(Duration::from_secs(30)) {
                Ok(Message::Notification(n))
                    if n.method == "textDocument/publishDiagnostics" && n.params["version"] == version =>
                {
                    return n.params
                }
                Ok(_) => {}
                Err(e) => panic!("no diagnostics: {e}"),
            }
        }
    }
}

fn stats(name: &str, mut xs: Vec<Duration>) {
    xs.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let median = xs[xs.len() / 2];
    let p99 = xs[(xs.len() * 99 / 100).min(xs.len() - 1)];
    println!("{name:<40} median {:>7.2} ms   p99 {:>7.2} ms   ({} rounds)", ms(median), ms(p99), xs.len());
}

fn main() {
    let dir = std::env::temp_dir().join(format!("miles-lsp-bench-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let (text, completion_line, lines) = generate(&dir);
    println!("generated {lines} lines ({} bytes) importing ./lib and the stdlib", text.len());
    let (server, conn) = Connection::memory();
    let config = miles_lsp::Config { std_dir: Some(dir.join(".std")), watch: false, ..Default::default() };
    let thread = std::thread::spawn(move || miles_lsp::serve(server, config));
    let mut c = Client { conn, id: 0, early: Default::default() };
    let uri = lsp_types::Url::from_file_path(dir.join("main.miles")).map(|u| u.to_string()).unwrap_or_default();
    let _ = c.request("initialize", json!({ "capabilities": {} }));
    c.notify("initialized", json!({}));
    c.notify(
        "textDocument/didOpen",
        json!({ "textDocument": { "uri": uri, "languageId": "miles", "version": 1, "text": text } }),
    );
    let d = c.diagnostics_for_version(1);
    let n = d["diagnostics"].as_array().map(|a| a.len()).unwrap_or(0);
    println!("initial diagnostics: {n}");

    let edit_line = text.lines().position(|l| l.starts_with("const k0 = ")).unwrap_or(0);
    let line_len = text.lines().nth(edit_line).map(|l| l.len()).unwrap_or(0);
    let mut version = 1;
    let mut to_diag = Vec::new();
    for i in 0..ROUNDS {
        version += 1;
        let t0 = Instant::now();
        c.edit(&uri, version, edit_line, line_len, i);
        let _ = c.diagnostics_for_version(version);
        to_diag.push(t0.elapsed());
    }
    let mut to_completion = Vec::new();
    for i in 0..ROUNDS {
        version += 1;
        let t0 = Instant::now();
        c.edit(&uri, version, edit_line, line_len, i);
        let r = c.request(
            "textDocument/completion",
            json!({ "textDocument": { "uri": uri }, "position": { "line": completion_line, "character": 8 } }),
        );
        to_completion.push(t0.elapsed());
        if i == 0 {
            let labels: Vec<&str> = r
                .as_array()
                .map(|a| a.iter().filter_map(|x| x["label"].as_str()).take(4).collect())
                .unwrap_or_default();
            println!("completion offers e.g. {labels:?}");
        }
        // Drain the diagnostics the edit produced so they do not queue up.
        let _ = c.diagnostics_for_version(version);
    }
    stats("didChange -> publishDiagnostics", to_diag);
    stats("didChange -> completion response", to_completion);
    let _ = c.request("shutdown", Value::Null);
    c.notify("exit", Value::Null);
    let _ = thread.join();
    let _ = std::fs::remove_dir_all(&dir);
}
