//! The main loop: documents, analyses, and one handler per request.
//!
//! One thread. Text changes are applied as they arrive; diagnostics are recomputed only once
//! the queue of incoming messages is empty, so a burst of keystrokes costs one compilation.
//! Requests compile lazily (and cache until the next change), so they always see the latest
//! text. An edit drops only the analyses that read the edited file; the parsed stdlib and every
//! unchanged file are reused from the session's `ParseCache`.
//!
//! Every request and notification goes through one dispatch table (`REQUESTS`,
//! `NOTIFICATIONS`), each handler guarded by `catch_unwind`: a bug in the compiler or the IDE
//! layer becomes an error answer (or a log line) and the editor session lives on.

use crate::convert::{apply_change, LineIndex};
use crate::packages::{self, Projects};
use crate::stdfiles;
use crossbeam_channel::{select, Receiver};
use lsp_server::{Connection, ErrorCode, Message, Notification, Request, Response};
use lsp_types::notification::Notification as _;
use lsp_types::request::Request as _;
use lsp_types::*;
use miles_compiler::fs::{normalize, DiskFs, MemoryFs, OverlayFs};
use miles_compiler::{FileId, ParseCache, Severity, Span};
use miles_ide::{self as ide, Analysis, CompletionKind as CK, DefKind, TokenKind};
use miles_package::cache::Cache;
use std::collections::{HashMap, HashSet};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

mod requests;
use requests::*;

#[derive(Clone, Debug)]
pub struct Config {
    /// Where the stdlib is written for go-to-definition; `None` picks the default cache dir.
    pub std_dir: Option<PathBuf>,
    /// Watch imported files on disk and re-check when they change.
    pub watch: bool,
    /// The package source cache; `None` finds it as the CLI does (`$MILES_HOME`, ...).
    pub package_cache: Option<PathBuf>,
    /// Fault injection for the tests of the panic guard: the next request or notification of
    /// this method panics inside its guarded handler, as a compiler bug would.
    pub panic_once_on: Option<String>,
}

impl Default for Config {
    fn default() -> Config {
        Config { std_dir: None, watch: true, package_cache: None, panic_once_on: None }
    }
}

struct Doc {
    text: String,
    version: i32,
}

struct State {
    docs: HashMap<Url, Doc>,
    overlay: MemoryFs,
    analyses: HashMap<Url, Analysis>,
    /// Parsed modules shared by every compilation of the session.
    parsed: ParseCache,
    /// Package builds by project root, until a `miles.toml` or `miles.lock` changes.
    projects: Projects,
    std_dir: PathBuf,
    /// Diagnostics need republishing (text or files on disk changed).
    dirty: bool,
    watcher: Option<notify::RecommendedWatcher>,
    watched_dirs: HashSet<PathBuf>,
    /// Documents closed since the last publication: their diagnostics are cleared.
    closed: Vec<Url>,
    shutdown: bool,
    panic_once_on: Option<String>,
}

const TOKEN_TYPES: &[SemanticTokenType] = &[
    SemanticTokenType::KEYWORD,
    SemanticTokenType::COMMENT,
    SemanticTokenType::STRING,
    SemanticTokenType::NUMBER,
    SemanticTokenType::NAMESPACE,
    SemanticTokenType::TYPE,
    SemanticTokenType::ENUM,
    SemanticTokenType::ENUM_MEMBER,
    SemanticTokenType::INTERFACE,
    SemanticTokenType::FUNCTION,
    SemanticTokenType::PROPERTY,
    SemanticTokenType::PARAMETER,
    SemanticTokenType::VARIABLE,
    SemanticTokenType::OPERATOR,
];
const TOKEN_MODIFIERS: &[SemanticTokenModifier] =
    &[SemanticTokenModifier::DECLARATION, SemanticTokenModifier::DEFAULT_LIBRARY, SemanticTokenModifier::DOCUMENTATION];

fn capabilities() -> ServerCapabilities {
    ServerCapabilities {
        text_document_sync: Some(TextDocumentSyncCapability::Options(TextDocumentSyncOptions {
            open_close: Some(true),
            change: Some(TextDocumentSyncKind::INCREMENTAL),
            save: Some(TextDocumentSyncSaveOptions::Supported(true)),
            ..Default::default()
        })),
        hover_provider: Some(HoverProviderCapability::Simple(true)),
        completion_provider: Some(CompletionOptions {
            trigger_characters: Some(vec![".".into(), "/".into(), "=".into(), " ".into()]),
            ..Default::default()
        }),
        definition_provider: Some(OneOf::Left(true)),
        references_provider: Some(OneOf::Left(true)),
        rename_provider: Some(OneOf::Right(RenameOptions {
            prepare_provider: Some(true),
            work_done_progress_options: Default::default(),
        })),
        document_symbol_provider: Some(OneOf::Left(true)),
        document_formatting_provider: Some(OneOf::Left(true)),
        code_action_provider: Some(CodeActionProviderCapability::Simple(true)),
        inlay_hint_provider: Some(OneOf::Left(true)),
        semantic_tokens_provider: Some(SemanticTokensServerCapabilities::SemanticTokensOptions(
            SemanticTokensOptions {
                legend: SemanticTokensLegend {
                    token_types: TOKEN_TYPES.to_vec(),
                    token_modifiers: TOKEN_MODIFIERS.to_vec(),
                },
                full: Some(SemanticTokensFullOptions::Bool(true)),
                range: None,
                work_done_progress_options: Default::default(),
            },
        )),
        ..Default::default()
    }
}

/// Serves one client on `connection` until `exit` (or the client hangs up).
pub fn serve(connection: Connection, config: Config) -> Result<(), String> {
    let caps = serde_json::to_value(capabilities()).map_err(|e| e.to_string())?;
    let init = serde_json::json!({
        "capabilities": caps,
        "serverInfo": { "name": "miles", "version": env!("CARGO_PKG_VERSION") },
    });
    let (id, _params) = connection.initialize_start().map_err(|e| e.to_string())?;
    connection.initialize_finish(id, init).map_err(|e| e.to_string())?;
    let std_dir = config.std_dir.clone().unwrap_or_else(stdfiles::default_dir);
    if let Err(e) = stdfiles::materialize(&std_dir) {
        log(&connection, &format!("could not write the stdlib for go-to-definition: {e}"));
    }
    let (watch_tx, watch_rx) = crossbeam_channel::unbounded::<notify::Result<notify::Event>>();
    let watcher = if config.watch {
        let w = notify::recommended_watcher(move |ev| {
            let _ = watch_tx.send(ev);
        });
        match w {
            Ok(w) => Some(w),
            Err(e) => {
                log(&connection, &format!("not watching imported files: {e}"));
                None
            }
        }
    } else {
        drop(watch_tx);
        None
    };
    let mut st = State {
        docs: HashMap::new(),
        overlay: MemoryFs::new(),
        analyses: HashMap::new(),
        parsed: ParseCache::new(),
        projects: Projects::new(package_cache(&config)),
        std_dir,
        dirty: false,
        watcher,
        watched_dirs: HashSet::new(),
        closed: Vec::new(),
        shutdown: false,
        panic_once_on: config.panic_once_on.clone(),
    };
    main_loop(&connection, &mut st, &watch_rx);
    Ok(())
}

/// The package cache, as an absolute path: its files' module keys become `file://` locations.
fn package_cache(config: &Config) -> Cache {
    let home = config.package_cache.clone().unwrap_or_else(|| Cache::from_env().home);
    Cache { home: std::path::absolute(&home).unwrap_or(home) }
}

fn log(c: &Connection, msg: &str) {
    let params = LogMessageParams { typ: MessageType::WARNING, message: msg.to_string() };
    let _ =
        c.sender.send(Message::Notification(Notification::new(notification::LogMessage::METHOD.to_string(), params)));
}

fn main_loop(c: &Connection, st: &mut State, watch_rx: &Receiver<notify::Result<notify::Event>>) {
    // Without a watcher the channel is disconnected and would be ready at once, every time: the
    // loop would spin on it, taking a core from the compilations it waits for.
    let mut watch_rx = watch_rx.clone();
    loop {
        let msg = select! {
            recv(c.receiver) -> m => match m { Ok(m) => Some(m), Err(_) => return },
            recv(watch_rx) -> ev => {
                if ev.is_err() {
                    watch_rx = crossbeam_channel::never();
                }
                if let Ok(Ok(ev)) = ev {
                    // Reads change nothing, and every check opens the files it imports: acting on
                    // them would check again, forever.
                    if !ev.kind.is_access() {
                        on_disk_change(st, &ev.paths);
                    }
                }
                None
            },
        };
        if let Some(msg) = msg {
            match msg {
                Message::Request(req) => {
                    if req.method == request::Shutdown::METHOD {
                        st.shutdown = true;
                        let _ = c.sender.send(Message::Response(Response::new_ok(req.id, ())));
                        continue;
                    }
                    let resp = handle_request(st, req);
                    let _ = c.sender.send(Message::Response(resp));
                }
                Message::Notification(n) => {
                    if n.method == notification::Exit::METHOD {
                        return;
                    }
                    if let Err(e) = handle_notification(st, n) {
                        log(c, &e);
                    }
                }
                Message::Response(_) => {}
            }
        }
        // Publish once the burst is over.
        if st.dirty && c.receiver.is_empty() {
            st.dirty = false;
            publish_all(c, st);
        }
    }
}

// ---- dispatch ----------------------------------------------------------------------------

type Res = Result<serde_json::Value, (i32, String)>;
type RequestHandler = fn(&mut State, serde_json::Value) -> Res;
type NotificationHandler = fn(&mut State, serde_json::Value);

/// Every request the server answers, by method.
const REQUESTS: &[(&str, RequestHandler)] = &[
    (request::HoverRequest::METHOD, on_hover),
    (request::Completion::METHOD, on_completion),
    (request::GotoDefinition::METHOD, on_definition),
    (request::References::METHOD, on_references),
    (request::PrepareRenameRequest::METHOD, on_prepare_rename),
    (request::Rename::METHOD, on_rename),
    (request::DocumentSymbolRequest::METHOD, on_document_symbols),
    (request::SemanticTokensFullRequest::METHOD, on_semantic_tokens),
    (request::Formatting::METHOD, on_formatting),
    (request::InlayHintRequest::METHOD, on_inlay_hints),
    (request::CodeActionRequest::METHOD, on_code_actions),
    // The server's copy of a document, for tests that check it tracks the client's edits.
    ("miles/documentText", on_document_text),
];

/// Every notification the server acts on, by method (others are ignored, as the protocol asks).
const NOTIFICATIONS: &[(&str, NotificationHandler)] = &[
    (notification::DidOpenTextDocument::METHOD, on_did_open),
    (notification::DidChangeTextDocument::METHOD, on_did_change),
    (notification::DidCloseTextDocument::METHOD, on_did_close),
    (notification::DidChangeWatchedFiles::METHOD, on_files_changed),
    (notification::DidSaveTextDocument::METHOD, on_files_changed),
];

fn handle_request(st: &mut State, req: Request) -> Response {
    let id = req.id.clone();
    if st.shutdown {
        return Response::new_err(id, ErrorCode::InvalidRequest as i32, "the server is shutting down".into());
    }
    let Some((_, handler)) = REQUESTS.iter().find(|(m, _)| *m == req.method) else {
        let msg = format!("unsupported request {}", req.method);
        return Response::new_err(id, ErrorCode::MethodNotFound as i32, msg);
    };
    match guarded(st, &req.method, |st| handler(st, req.params)) {
        Ok(Ok(v)) => Response { id, result: Some(v), error: None },
        Ok(Err((code, msg))) => Response::new_err(id, code, msg),
        Err(why) => Response::new_err(id, ErrorCode::InternalError as i32, why),
    }
}

/// Runs a notification's handler; `Err` is a message for the client's log.
fn handle_notification(st: &mut State, n: Notification) -> Result<(), String> {
    let Some((_, handler)) = NOTIFICATIONS.iter().find(|(m, _)| *m == n.method) else { return Ok(()) };
    guarded(st, &n.method, |st| handler(st, n.params))
}

/// Runs `f`, turning a panic into a message. Analyses computed half-way are dropped, so the next
/// request starts from a clean state.
fn guarded<T>(st: &mut State, method: &str, f: impl FnOnce(&mut State) -> T) -> Result<T, String> {
    let result = catch_unwind(AssertUnwindSafe(|| {
        if st.panic_once_on.as_deref() == Some(method) {
            st.panic_once_on = None;
            panic!("injected panic in {method}");
        }
        f(st)
    }));
    result.map_err(|payload| {
        st.analyses.clear();
        st.dirty = true;
        let what = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown cause".into());
        format!("internal error in {method} (a bug in miles; the session goes on): {what}")
    })
}

fn on_disk_change(st: &mut State, paths: &[PathBuf]) {
    if paths.iter().any(|p| is_project_file(p)) {
        st.projects.clear();
        st.analyses.clear();
        st.dirty = true;
        return;
    }
    let open: HashSet<PathBuf> = st.docs.keys().filter_map(|u| u.to_file_path().ok()).collect();
    if paths.iter().any(|p| p.extension().is_some_and(|e| e == "miles") && !open.contains(p)) {
        st.analyses.clear();
        st.dirty = true;
    }
}

// ---- documents ---------------------------------------------------------------------------

/// The module key the compiler uses for a document: its normalised path, or `std/...` for a
/// document in the stdlib directory.
fn key_of(st: &State, uri: &Url) -> String {
    match uri.to_file_path() {
        Ok(p) => stdfiles::key_of(&st.std_dir, &p).unwrap_or_else(|| normalize(&p.to_string_lossy())),
        Err(_) => normalize(uri.as_str()),
    }
}

fn uri_of_file(st: &State, a: &Analysis, file: FileId) -> Option<Url> {
    let path = &a.program().sources.get(file)?.path;
    if path.starts_with("std/") {
        return Url::from_file_path(stdfiles::file_of(&st.std_dir, path)).ok();
    }
    if path.starts_with("--set") {
        return None;
    }
    // Open documents that are not files (untitled:) keep their URI as the key.
    if let Some(u) = st.docs.keys().find(|u| u.to_file_path().is_err() && normalize(u.as_str()) == *path) {
        return Some(u.clone());
    }
    Url::from_file_path(path).ok()
}

fn analysis<'s>(st: &'s mut State, uri: &Url) -> Option<&'s Analysis> {
    if !st.analyses.contains_key(uri) {
        st.docs.get(uri)?;
        let key = key_of(st, uri);
        let fs = OverlayFs { base: &DiskFs, overlay: &st.overlay };
        let c = packages::compile(&mut st.projects, &fs, &key, &st.parsed);
        st.analyses.insert(uri.clone(), Analysis::new(c));
        update_watches(st, uri);
    }
    st.analyses.get(uri)
}

/// Watches the directories of every user module an analysis read, so edits made outside the
/// editor (a `git checkout`, another tool) re-check the documents that import them.
fn update_watches(st: &mut State, uri: &Url) {
    use notify::Watcher as _;
    let Some(a) = st.analyses.get(uri) else { return };
    let dirs: Vec<PathBuf> = a
        .program()
        .modules
        .iter()
        .filter(|m| !m.is_std)
        .filter_map(|m| Path::new(&m.key).parent().map(Path::to_path_buf))
        .chain(st.projects.roots().map(PathBuf::from))
        .filter(|d| d.is_absolute() && d.is_dir())
        .collect();
    let Some(w) = st.watcher.as_mut() else { return };
    for d in dirs {
        if st.watched_dirs.insert(d.clone()) {
            let _ = w.watch(&d, notify::RecursiveMode::NonRecursive);
        }
    }
}

fn set_text(st: &mut State, uri: &Url, text: String, version: i32) {
    let key = key_of(st, uri);
    if !key.starts_with("std/") {
        st.overlay.insert(&key, text.as_bytes().to_vec());
    }
    st.docs.insert(uri.clone(), Doc { text, version });
    invalidate(st, uri, &key);
    st.dirty = true;
}

/// Drops the analyses that read module `key` (or that failed to read a module, which may be
/// this one), and the document's own: every other analysis stays valid.
fn invalidate(st: &mut State, uri: &Url, key: &str) {
    st.analyses.retain(|u, a| {
        u != uri
            && a.program().module_by_key(key).is_none()
            && !a.compilation.diagnostics.iter().any(|d| d.code == miles_grammar::diag::ErrorCode::E0101)
    });
}

fn on_did_open(st: &mut State, params: serde_json::Value) {
    if let Ok(p) = serde_json::from_value::<DidOpenTextDocumentParams>(params) {
        set_text(st, &p.text_document.uri, p.text_document.text, p.text_document.version);
    }
}

fn on_did_change(st: &mut State, params: serde_json::Value) {
    if let Ok(p) = serde_json::from_value::<DidChangeTextDocumentParams>(params) {
        let uri = p.text_document.uri;
        let Some(doc) = st.docs.get_mut(&uri) else { return };
        for ch in p.content_changes {
            apply_change(&mut doc.text, ch.range, &ch.text);
        }
        let text = std::mem::take(&mut doc.text);
        set_text(st, &uri, text, p.text_document.version);
    }
}

fn on_did_close(st: &mut State, params: serde_json::Value) {
    if let Ok(p) = serde_json::from_value::<DidCloseTextDocumentParams>(params) {
        let uri = p.text_document.uri;
        let key = key_of(st, &uri);
        st.overlay.remove(&key);
        st.docs.remove(&uri);
        invalidate(st, &uri, &key);
        st.closed.push(uri);
        st.dirty = true;
    }
}

/// `didChangeWatchedFiles` and `didSave`: every analysis may be stale; a package build only when
/// a `miles.toml` or `miles.lock` is among the files.
fn on_files_changed(st: &mut State, params: serde_json::Value) {
    let changes = params["changes"].as_array().into_iter().flatten().map(|c| &c["uri"]);
    let uris = changes.chain([&params["textDocument"]["uri"]]);
    let paths: Vec<PathBuf> =
        uris.filter_map(|u| Url::parse(u.as_str()?).ok()).filter_map(|u| u.to_file_path().ok()).collect();
    if paths.iter().any(|p| is_project_file(p)) {
        st.projects.clear();
    }
    st.analyses.clear();
    st.dirty = true;
}

/// A package's manifest or lock: its change changes what imports resolve to.
fn is_project_file(path: &Path) -> bool {
    path.file_name().and_then(|n| n.to_str()).is_some_and(|n| packages::PROJECT_FILES.contains(&n))
}

// ---- diagnostics -------------------------------------------------------------------------

fn publish_all(c: &Connection, st: &mut State) {
    for uri in std::mem::take(&mut st.closed) {
        let params = PublishDiagnosticsParams { uri, diagnostics: Vec::new(), version: None };
        let _ = c.sender.send(Message::Notification(Notification::new(
            notification::PublishDiagnostics::METHOD.to_string(),
            params,
        )));
    }
    let uris: Vec<Url> = st.docs.keys().cloned().collect();
    for uri in uris {
        let version = st.docs.get(&uri).map(|d| d.version);
        let diags = match guarded(st, notification::PublishDiagnostics::METHOD, |st| diagnostics_for(st, &uri)) {
            Ok(d) => d,
            Err(e) => {
                log(c, &e);
                continue;
            }
        };
        let params = PublishDiagnosticsParams { uri, diagnostics: diags, version };
        let _ = c.sender.send(Message::Notification(Notification::new(
            notification::PublishDiagnostics::METHOD.to_string(),
            params,
        )));
    }
}

/// The LSP diagnostics of one document: what the compiler reports in that file.
fn diagnostics_for(st: &mut State, uri: &Url) -> Vec<Diagnostic> {
    let key = key_of(st, uri);
    if analysis(st, uri).is_none() {
        return Vec::new();
    }
    let st: &State = st;
    let Some(a) = st.analyses.get(uri) else { return Vec::new() };
    let Some(file) = a.file_id(&key) else { return Vec::new() };
    let text = a.text(file);
    let idx = LineIndex::new(text);
    let mut out = Vec::new();
    for d in &a.compilation.diagnostics {
        let Some(primary) = &d.primary else { continue };
        if primary.span.file != file {
            continue;
        }
        let mut message = d.message.clone();
        if let Some(h) = &d.help {
            message.push_str(&format!("\nhelp: {h}"));
        }
        if let Some(rule) = &d.rule {
            let (line, _) = a.program().sources.line_col(rule.span);
            let path = a.program().sources.get(rule.span.file).map(|f| f.path.clone()).unwrap_or_default();
            message.push_str(&format!("\nrule `{}` ({path}:{line})", rule.name));
        }
        let mut related = vec![DiagnosticRelatedInformation {
            location: Location {
                uri: uri.clone(),
                range: idx.range(primary.span.start as usize, primary.span.end as usize),
            },
            message: primary.message.clone(),
        }];
        for l in &d.secondary {
            if let Some(loc) = location(st, a, l.span) {
                related.push(DiagnosticRelatedInformation { location: loc, message: l.message.clone() });
            }
        }
        if let Some(rule) = &d.rule {
            if let Some(loc) = location(st, a, rule.span) {
                related.push(DiagnosticRelatedInformation { location: loc, message: format!("rule `{}`", rule.name) });
            }
        }
        out.push(Diagnostic {
            range: idx.range(primary.span.start as usize, primary.span.end as usize),
            severity: Some(match d.severity {
                Severity::Error => DiagnosticSeverity::ERROR,
                Severity::Warning => DiagnosticSeverity::WARNING,
                Severity::Note => DiagnosticSeverity::INFORMATION,
            }),
            code: Some(NumberOrString::String(d.code.to_string())),
            source: Some("miles".into()),
            message,
            related_information: Some(related),
            ..Default::default()
        });
    }
    out
}

fn location(st: &State, a: &Analysis, span: Span) -> Option<Location> {
    let uri = uri_of_file(st, a, span.file)?;
    let text = a.text(span.file);
    let idx = LineIndex::new(text);
    Some(Location { uri, range: idx.range(span.start as usize, span.end as usize) })
}
