//! An in-process client for the server: fixtures with several files and a `$0` cursor, JSON-RPC
//! over `lsp_server::Connection::memory()`, and renderers that turn answers into short text for
//! snapshots (paths shown relative to the fixture, positions 1-based `line:col`).
//!
//! A fixture is files separated by `//- path` lines; the first file (or the one holding `$0`)
//! is opened in the editor, the others are on disk only:
//!
//! ```text
//! //- main.miles
//! import ./lib
//! const x = lib.y$0
//! //- lib.miles
//! const y = 1
//! ```
#![allow(dead_code)]

use lsp_server::{Connection, Message, Notification, Request, RequestId};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

static COUNTER: AtomicUsize = AtomicUsize::new(0);

pub struct Fixture {
    pub dir: PathBuf,
    /// (path relative to dir, text without the cursor marker)
    pub files: Vec<(String, String)>,
    /// The file holding `$0` (or the first) and the cursor's byte offset in it.
    pub main: String,
    pub cursor: Option<usize>,
}

pub fn temp_dir(tag: &str) -> PathBuf {
    let n = COUNTER.fetch_add(1, Ordering::SeqCst);
    let dir = std::env::temp_dir().join(format!("miles-lsp-test-{}-{tag}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

impl Fixture {
    pub fn parse(text: &str) -> Fixture {
        let dir = temp_dir("fx");
        let mut files: Vec<(String, String)> = Vec::new();
        let mut cur: Option<(String, String)> = None;
        for line in text.split_inclusive('\n') {
            if let Some(name) = line.strip_prefix("//- ") {
                if let Some(f) = cur.take() {
                    files.push(f);
                }
                cur = Some((name.trim().to_string(), String::new()));
            } else if let Some((_, t)) = cur.as_mut() {
                t.push_str(line);
            } else {
                cur = Some(("main.miles".to_string(), line.to_string()));
            }
        }
        if let Some(f) = cur.take() {
            files.push(f);
        }
        let mut main = files.first().map(|f| f.0.clone()).unwrap_or_default();
        let mut cursor = None;
        for (name, t) in files.iter_mut() {
            if let Some(at) = t.find("$0") {
                t.replace_range(at..at + 2, "");
                cursor = Some(at);
                main = name.clone();
            }
        }
        for (name, t) in &files {
            let p = dir.join(name);
            if let Some(parent) = p.parent() {
                std::fs::create_dir_all(parent).expect("mkdir");
            }
            std::fs::write(&p, t).expect("write fixture");
        }
        Fixture { dir, files, main, cursor }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    pub fn text(&self, name: &str) -> &str {
        self.files.iter().find(|f| f.0 == name).map(|f| f.1.as_str()).unwrap_or("")
    }

    /// The cursor as an LSP position (UTF-16; fixtures are ASCII).
    pub fn position(&self) -> Value {
        let t = self.text(&self.main);
        let at = self.cursor.unwrap_or(0);
        let line = t[..at].matches('\n').count();
        let col = at - t[..at].rfind('\n').map(|i| i + 1).unwrap_or(0);
        json!({ "line": line, "character": col })
    }
}

pub fn uri(p: &Path) -> String {
    lsp_types::Url::from_file_path(p).map(|u| u.to_string()).unwrap_or_default()
}

pub struct Client {
    pub conn: Connection,
    thread: Option<std::thread::JoinHandle<()>>,
    next_id: i32,
    pub fx: Fixture,
    pub std_dir: PathBuf,
    /// Notifications received while waiting for something else.
    pub notifications: Vec<Notification>,
}

impl Client {
    /// Starts a server on the fixture and opens its main file.
    pub fn start(fixture: &str) -> Client {
        Client::start_with(fixture, false)
    }

    pub fn start_with(fixture: &str, watch: bool) -> Client {
        Client::start_config(fixture, miles_lsp::Config { watch, ..Default::default() })
    }

    /// Starts a server with `config` (its stdlib directory and package cache are the fixture's).
    pub fn start_config(fixture: &str, config: miles_lsp::Config) -> Client {
        let fx = Fixture::parse(fixture);
        let (server, client) = Connection::memory();
        let std_dir = fx.dir.join(".std");
        let package_cache = config.package_cache.clone().or_else(|| Some(fx.dir.join(".miles-home")));
        let config = miles_lsp::Config { std_dir: Some(std_dir.clone()), package_cache, ..config };
        let thread = std::thread::spawn(move || {
            let _ = miles_lsp::serve(server, config);
        });
        let mut c = Client { conn: client, thread: Some(thread), next_id: 0, fx, std_dir, notifications: Vec::new() };
        let root = uri(&c.fx.dir);
        let _ = c.request("initialize", json!({ "capabilities": {}, "rootUri": root }));
        c.notify("initialized", json!({}));
        let main = c.fx.main.clone();
        c.open(&main);
        c
    }

    pub fn main_uri(&self) -> String {
        uri(&self.fx.path(&self.fx.main))
    }

    pub fn open(&mut self, name: &str) {
        let text = self.fx.text(name).to_string();
        let u = uri(&self.fx.path(name));
        self.notify(
            "textDocument/didOpen",
            json!({ "textDocument": { "uri": u, "languageId": "miles", "version": 1, "text": text } }),
        );
    }

    pub fn notify(&mut self, method: &str, params: Value) {
        let n = Notification { method: method.to_string(), params };
        self.conn.sender.send(Message::Notification(n)).expect("server alive");
    }

    pub fn request(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = RequestId::from(self.next_id);
        let req = Request { id: id.clone(), method: method.to_string(), params };
        self.conn.sender.send(Message::Request(req)).expect("server alive");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.conn.receiver.recv_timeout(left) {
                Ok(Message::Response(r)) if r.id == id => {
                    if let Some(e) = r.error {
                        return json!({ "error": e.message });
                    }
                    return r.result.unwrap_or(Value::Null);
                }
                Ok(Message::Notification(n)) => self.notifications.push(n),
                Ok(_) => {}
                Err(e) => panic!("no answer to {method} within 20 s: {e}"),
            }
        }
    }

    /// Asks at the fixture's cursor.
    pub fn at_cursor(&mut self, method: &str, extra: Value) -> Value {
        let mut params = json!({ "textDocument": { "uri": self.main_uri() }, "position": self.fx.position() });
        if let (Some(p), Some(e)) = (params.as_object_mut(), extra.as_object()) {
            for (k, v) in e {
                p.insert(k.clone(), v.clone());
            }
        }
        self.request(method, params)
    }

    /// The next notification of `method` (already received ones first).
    pub fn notification(&mut self, method: &str) -> Value {
        if let Some(i) = self.notifications.iter().position(|n| n.method == method) {
            return self.notifications.remove(i).params;
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.conn.receiver.recv_timeout(left) {
                Ok(Message::Notification(n)) if n.method == method => return n.params,
                Ok(Message::Notification(n)) => self.notifications.push(n),
                Ok(_) => {}
                Err(e) => panic!("no {method} within 20 s: {e}"),
            }
        }
    }

    /// The next diagnostics published for `uri` (already received ones first).
    pub fn diagnostics(&mut self, uri: &str) -> Value {
        if let Some(i) = self
            .notifications
            .iter()
            .position(|n| n.method == "textDocument/publishDiagnostics" && n.params["uri"] == uri)
        {
            return self.notifications.remove(i).params;
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.conn.receiver.recv_timeout(left) {
                Ok(Message::Notification(n))
                    if n.method == "textDocument/publishDiagnostics" && n.params["uri"] == uri =>
                {
                    return n.params
                }
                Ok(Message::Notification(n)) => self.notifications.push(n),
                Ok(_) => {}
                Err(e) => panic!("no diagnostics for {uri} within 20 s: {e}"),
            }
        }
    }

    /// How many diagnostics publications arrive within `window` (others are kept).
    pub fn publications_within(&mut self, window: Duration) -> usize {
        let deadline = Instant::now() + window;
        let mut n = 0;
        while let Ok(m) = self.conn.receiver.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            match m {
                Message::Notification(x) if x.method == "textDocument/publishDiagnostics" => n += 1,
                Message::Notification(x) => self.notifications.push(x),
                _ => {}
            }
        }
        n
    }

    /// Replaces the main document's text (full sync), bumping its version.
    pub fn change(&mut self, version: i32, changes: Value) {
        let u = self.main_uri();
        self.notify(
            "textDocument/didChange",
            json!({ "textDocument": { "uri": u, "version": version }, "contentChanges": changes }),
        );
    }

    pub fn shutdown(mut self) {
        let _ = self.request("shutdown", Value::Null);
        self.notify("exit", Value::Null);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_dir_all(&self.fx.dir);
    }

    // ---- rendering -----------------------------------------------------------------------

    /// A location as `path:line:col` (1-based), paths relative to the fixture or `std/...`.
    pub fn loc(&self, uri: &str, range: &Value) -> String {
        let path = lsp_types::Url::parse(uri).ok().and_then(|u| u.to_file_path().ok()).unwrap_or_default();
        // Stdlib lines move whenever the stdlib grows; its locations show the file only (the
        // tests print the text a range covers, which says where it points).
        if let Ok(r) = path.strip_prefix(&self.std_dir) {
            return r.to_string_lossy().to_string();
        }
        let shown =
            if let Ok(r) = path.strip_prefix(&self.fx.dir) { r.to_string_lossy().to_string() } else { uri.to_string() };
        let l = range["start"]["line"].as_u64().unwrap_or(0) + 1;
        let c = range["start"]["character"].as_u64().unwrap_or(0) + 1;
        let el = range["end"]["line"].as_u64().unwrap_or(0) + 1;
        let ec = range["end"]["character"].as_u64().unwrap_or(0) + 1;
        format!("{shown}:{l}:{c}-{el}:{ec}")
    }

    /// The text a range covers in a fixture file or the stdlib.
    pub fn range_text(&self, uri: &str, range: &Value) -> String {
        let path = lsp_types::Url::parse(uri).ok().and_then(|u| u.to_file_path().ok()).unwrap_or_default();
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let lines: Vec<&str> = text.split('\n').collect();
        let (l, c) = (
            range["start"]["line"].as_u64().unwrap_or(0) as usize,
            range["start"]["character"].as_u64().unwrap_or(0) as usize,
        );
        let (el, ec) = (
            range["end"]["line"].as_u64().unwrap_or(0) as usize,
            range["end"]["character"].as_u64().unwrap_or(0) as usize,
        );
        if l == el {
            lines.get(l).and_then(|s| s.get(c..ec)).unwrap_or("").to_string()
        } else {
            lines.get(l).and_then(|s| s.get(c..)).map(|s| format!("{s}…")).unwrap_or_default()
        }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            let _ = self
                .conn
                .sender
                .send(Message::Notification(Notification { method: "exit".into(), params: Value::Null }));
            let _ = t.join();
        }
    }
}

pub fn render_diagnostics(d: &Value) -> String {
    let mut out = String::new();
    for x in d["diagnostics"].as_array().cloned().unwrap_or_default() {
        let l = x["range"]["start"]["line"].as_u64().unwrap_or(0) + 1;
        let c = x["range"]["start"]["character"].as_u64().unwrap_or(0) + 1;
        let sev = match x["severity"].as_u64() {
            Some(1) => "error",
            Some(2) => "warning",
            _ => "info",
        };
        out.push_str(&format!(
            "{l}:{c} {sev}[{}] {}\n",
            x["code"].as_str().unwrap_or(""),
            x["message"].as_str().unwrap_or("")
        ));
    }
    out
}

pub fn render_completions(v: &Value) -> String {
    let mut items = v.as_array().cloned().unwrap_or_default();
    items.sort_by_key(|i| i["sortText"].as_str().unwrap_or("").to_string());
    items
        .iter()
        .map(|i| {
            let detail = i["detail"].as_str().map(|d| format!("  {d}")).unwrap_or_default();
            format!("{} ({}){detail}\n", i["label"].as_str().unwrap_or(""), i["kind"])
        })
        .collect()
}
