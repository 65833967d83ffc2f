//! The main loop: documents, analyses, and one handler per request.
//!
//! One thread. Text changes are applied as they arrive; diagnostics are recomputed only once
//! the queue of incoming messages is empty, so a burst of keystrokes costs one compilation.
//! Requests compile lazily (and cache until the next change), so they always see the latest
//! text.

use crate::convert::{apply_change, LineIndex};
use crate::stdfiles;
use crossbeam_channel::{select, Receiver};
use lsp_server::{Connection, ErrorCode, Message, Notification, Request, Response};
use lsp_types::notification::Notification as _;
use lsp_types::request::Request as _;
use lsp_types::*;
use miles_compiler::fs::{normalize, FileSystem, MemoryFs, OverlayFs};
use miles_compiler::ide::{self, Analysis, CompletionKind as CK, DefKind, TokenKind};
use miles_compiler::{compile, FileId, Options, Severity, Span};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

#[derive(Clone, Debug)]
pub struct Config {
    /// Where the stdlib is written for go-to-definition; `None` picks the default cache dir.
    pub std_dir: Option<PathBuf>,
    /// Watch imported files on disk and re-check when they change.
    pub watch: bool,
}

impl Default for Config {
    fn default() -> Config {
        Config { std_dir: None, watch: true }
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
    std_dir: PathBuf,
    /// Diagnostics need republishing (text or files on disk changed).
    dirty: bool,
    watcher: Option<notify::RecommendedWatcher>,
    watched_dirs: HashSet<PathBuf>,
    /// Documents closed since the last publication: their diagnostics are cleared.
    closed: Vec<Url>,
    shutdown: bool,
}

/// The real disk, read-only.
struct DiskFs;

impl FileSystem for DiskFs {
    fn read(&self, path: &str) -> Result<Vec<u8>, String> {
        let meta = std::fs::metadata(path).map_err(|e| e.to_string())?;
        if meta.is_dir() {
            return Err("it is a directory".into());
        }
        std::fs::read(path).map_err(|e| e.to_string())
    }
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
        std_dir,
        dirty: false,
        watcher,
        watched_dirs: HashSet::new(),
        closed: Vec::new(),
        shutdown: false,
    };
    main_loop(&connection, &mut st, &watch_rx);
    Ok(())
}

fn log(c: &Connection, msg: &str) {
    let params = LogMessageParams { typ: MessageType::WARNING, message: msg.to_string() };
    let _ =
        c.sender.send(Message::Notification(Notification::new(notification::LogMessage::METHOD.to_string(), params)));
}

fn main_loop(c: &Connection, st: &mut State, watch_rx: &Receiver<notify::Result<notify::Event>>) {
    loop {
        let msg = select! {
            recv(c.receiver) -> m => match m { Ok(m) => Some(m), Err(_) => return },
            recv(watch_rx) -> ev => {
                if let Ok(Ok(ev)) = ev {
                    on_disk_change(st, &ev.paths);
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
                    handle_notification(st, n);
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

fn on_disk_change(st: &mut State, paths: &[PathBuf]) {
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
        let c = compile(&fs, std::slice::from_ref(&key), &Options::default());
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
    st.analyses.clear();
    st.dirty = true;
}

fn handle_notification(st: &mut State, n: Notification) {
    match n.method.as_str() {
        notification::DidOpenTextDocument::METHOD => {
            if let Ok(p) = serde_json::from_value::<DidOpenTextDocumentParams>(n.params) {
                set_text(st, &p.text_document.uri, p.text_document.text, p.text_document.version);
            }
        }
        notification::DidChangeTextDocument::METHOD => {
            if let Ok(p) = serde_json::from_value::<DidChangeTextDocumentParams>(n.params) {
                let uri = p.text_document.uri;
                let Some(doc) = st.docs.get_mut(&uri) else { return };
                for ch in p.content_changes {
                    apply_change(&mut doc.text, ch.range, &ch.text);
                }
                let text = std::mem::take(&mut doc.text);
                set_text(st, &uri, text, p.text_document.version);
            }
        }
        notification::DidCloseTextDocument::METHOD => {
            if let Ok(p) = serde_json::from_value::<DidCloseTextDocumentParams>(n.params) {
                let key = key_of(st, &p.text_document.uri);
                st.overlay.remove(&key);
                st.docs.remove(&p.text_document.uri);
                st.closed.push(p.text_document.uri);
                st.analyses.clear();
                st.dirty = true;
            }
        }
        notification::DidChangeWatchedFiles::METHOD | notification::DidSaveTextDocument::METHOD => {
            st.analyses.clear();
            st.dirty = true;
        }
        _ => {}
    }
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
        let diags = diagnostics_for(st, &uri);
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

// ---- requests ----------------------------------------------------------------------------

fn handle_request(st: &mut State, req: Request) -> Response {
    let id = req.id.clone();
    if st.shutdown {
        return Response::new_err(id, ErrorCode::InvalidRequest as i32, "the server is shutting down".into());
    }
    let result = dispatch(st, req);
    match result {
        Ok(v) => Response { id, result: Some(v), error: None },
        Err((code, msg)) => Response::new_err(id, code, msg),
    }
}

type Res = Result<serde_json::Value, (i32, String)>;

fn params<P: serde::de::DeserializeOwned>(req: Request) -> Result<P, (i32, String)> {
    serde_json::from_value(req.params).map_err(|e| (ErrorCode::InvalidParams as i32, e.to_string()))
}

fn json<T: serde::Serialize>(v: T) -> Res {
    serde_json::to_value(v).map_err(|e| (ErrorCode::InternalError as i32, e.to_string()))
}

/// The analysis of a document and the cursor's file and byte offset in it.
fn at<'s>(st: &'s State, uri: &Url, pos: Position) -> Option<(&'s Analysis, FileId, usize)> {
    let key = key_of(st, uri);
    let a = st.analyses.get(uri)?;
    let file = a.file_id(&key)?;
    let offset = LineIndex::new(a.text(file)).offset(pos);
    Some((a, file, offset))
}

fn dispatch(st: &mut State, req: Request) -> Res {
    match req.method.as_str() {
        request::HoverRequest::METHOD => {
            let p: HoverParams = params(req)?;
            let tp = p.text_document_position_params;
            let _ = analysis(st, &tp.text_document.uri);
            let st: &State = st;
            let Some((a, file, offset)) = at(st, &tp.text_document.uri, tp.position) else { return json(()) };
            let Some(h) = ide::hover(a, file, offset) else { return json(()) };
            let idx = LineIndex::new(a.text(file));
            json(Hover {
                contents: HoverContents::Markup(MarkupContent { kind: MarkupKind::Markdown, value: h.markdown }),
                range: Some(idx.range(h.span.start as usize, h.span.end as usize)),
            })
        }
        request::Completion::METHOD => {
            let p: CompletionParams = params(req)?;
            let tp = p.text_document_position;
            let uri = tp.text_document.uri.clone();
            let _ = analysis(st, &uri);
            let st: &State = st;
            let Some((a, file, offset)) = at(st, &uri, tp.position) else { return json(()) };
            let mut items: Vec<CompletionItem> =
                ide::completions(a, file, offset).into_iter().map(completion_item).collect();
            items.extend(local_import_completions(a, file, offset, &uri));
            json(CompletionResponse::Array(items))
        }
        request::GotoDefinition::METHOD => {
            let p: GotoDefinitionParams = params(req)?;
            let tp = p.text_document_position_params;
            let _ = analysis(st, &tp.text_document.uri);
            let st: &State = st;
            let Some((a, file, offset)) = at(st, &tp.text_document.uri, tp.position) else { return json(()) };
            let Some(span) = ide::definition(a, file, offset) else { return json(()) };
            match location(st, a, span) {
                Some(l) => json(GotoDefinitionResponse::Scalar(l)),
                None => json(()),
            }
        }
        request::References::METHOD => {
            let p: ReferenceParams = params(req)?;
            let tp = p.text_document_position;
            json(references(st, &tp.text_document.uri, tp.position, p.context.include_declaration))
        }
        request::PrepareRenameRequest::METHOD => {
            let p: TextDocumentPositionParams = params(req)?;
            let _ = analysis(st, &p.text_document.uri);
            let st: &State = st;
            let Some((a, file, offset)) = at(st, &p.text_document.uri, p.position) else { return json(()) };
            let Some((span, def)) = a.resolve(file, offset) else {
                return Err((ErrorCode::RequestFailed as i32, "no name to rename here".into()));
            };
            if a.program().module(def.module).is_std {
                return Err((
                    ErrorCode::RequestFailed as i32,
                    format!("`{}` is declared in the standard library, which is read-only", def.name),
                ));
            }
            let idx = LineIndex::new(a.text(file));
            json(PrepareRenameResponse::Range(idx.range(span.start as usize, span.end as usize)))
        }
        request::Rename::METHOD => {
            let p: RenameParams = params(req)?;
            let tp = p.text_document_position;
            let uri = tp.text_document.uri.clone();
            let _ = analysis(st, &uri);
            let st: &State = st;
            let Some((a, file, offset)) = at(st, &uri, tp.position) else { return json(()) };
            let edits = ide::rename(a, file, offset, &p.new_name).map_err(|e| (ErrorCode::RequestFailed as i32, e))?;
            let mut changes: HashMap<Url, Vec<TextEdit>> = HashMap::new();
            for (span, text) in edits {
                if let Some(l) = location(st, a, span) {
                    changes.entry(l.uri).or_default().push(TextEdit { range: l.range, new_text: text });
                }
            }
            json(WorkspaceEdit { changes: Some(changes), ..Default::default() })
        }
        request::DocumentSymbolRequest::METHOD => {
            let p: DocumentSymbolParams = params(req)?;
            let uri = p.text_document.uri;
            let key = key_of(st, &uri);
            let Some(a) = analysis(st, &uri) else { return json(()) };
            let Some(file) = a.file_id(&key) else { return json(()) };
            let idx = LineIndex::new(a.text(file));
            let syms: Vec<DocumentSymbol> =
                ide::document_symbols(a, file).into_iter().map(|s| symbol(&idx, s)).collect();
            json(DocumentSymbolResponse::Nested(syms))
        }
        request::SemanticTokensFullRequest::METHOD => {
            let p: SemanticTokensParams = params(req)?;
            let uri = p.text_document.uri;
            let key = key_of(st, &uri);
            let Some(a) = analysis(st, &uri) else { return json(()) };
            let Some(file) = a.file_id(&key) else { return json(()) };
            json(SemanticTokensResult::Tokens(SemanticTokens { result_id: None, data: encode_tokens(a, file) }))
        }
        request::Formatting::METHOD => {
            let p: DocumentFormattingParams = params(req)?;
            let Some(doc) = st.docs.get(&p.text_document.uri) else { return json(()) };
            match miles_grammar::fmt::format(&doc.text) {
                Ok(formatted) if formatted != doc.text => {
                    let idx = LineIndex::new(&doc.text);
                    json(vec![TextEdit { range: idx.range(0, doc.text.len()), new_text: formatted }])
                }
                Ok(_) => json(Vec::<TextEdit>::new()),
                // Syntax errors: the diagnostics already say where; leave the text alone.
                Err(_) => json(()),
            }
        }
        request::InlayHintRequest::METHOD => {
            let p: InlayHintParams = params(req)?;
            let uri = p.text_document.uri;
            let key = key_of(st, &uri);
            let Some(a) = analysis(st, &uri) else { return json(()) };
            let Some(file) = a.file_id(&key) else { return json(()) };
            let idx = LineIndex::new(a.text(file));
            let mut plain = crate::plan_hints::memory_hints(a, file);
            plain.extend(ide::inlay_hints(a, file));
            plain.sort_by_key(|h| h.offset);
            let hints: Vec<InlayHint> = plain
                .into_iter()
                .map(|h| InlayHint {
                    position: idx.position(h.offset as usize),
                    label: InlayHintLabel::String(h.label),
                    kind: Some(InlayHintKind::PARAMETER),
                    text_edits: None,
                    tooltip: h.tooltip.map(InlayHintTooltip::String),
                    padding_left: Some(true),
                    padding_right: None,
                    data: None,
                })
                .filter(|h| h.position >= p.range.start && h.position <= p.range.end)
                .collect();
            json(hints)
        }
        request::CodeActionRequest::METHOD => {
            let p: CodeActionParams = params(req)?;
            json(code_actions(st, &p))
        }
        // The server's copy of a document, for tests that check it tracks the client's edits.
        "miles/documentText" => {
            let p: TextDocumentIdentifier = params(req)?;
            json(st.docs.get(&p.uri).map(|d| d.text.clone()))
        }
        _ => Err((ErrorCode::MethodNotFound as i32, format!("unsupported request {}", req.method))),
    }
}

fn references(st: &mut State, uri: &Url, pos: Position, include_declaration: bool) -> Vec<Location> {
    // The definition, as (path, start, end), then its uses in every open document's analysis:
    // a library module's names are found in each recipe that imports it.
    let _ = analysis(st, uri);
    let def = {
        let Some((a, file, offset)) = at(st, uri, pos) else { return Vec::new() };
        let Some((_, def)) = a.resolve(file, offset) else { return Vec::new() };
        let path = a.program().sources.get(def.span.file).map(|f| f.path.clone()).unwrap_or_default();
        (path, def.span.start, def.span.end)
    };
    let uris: Vec<Url> = st.docs.keys().cloned().collect();
    for u in &uris {
        let _ = analysis(st, u);
    }
    let st: &State = st;
    let mut out: Vec<Location> = Vec::new();
    for u in &uris {
        let Some(a) = st.analyses.get(u) else { continue };
        let Some(f) = a.file_id(&def.0) else { continue };
        let target = Span { file: f, start: def.1, end: def.2 };
        let mut spans: Vec<Span> = a.refs.iter().filter(|(_, d)| *d == target).map(|(u, _)| *u).collect();
        if include_declaration {
            spans.push(target);
        }
        for s in spans {
            if let Some(l) = location(st, a, s) {
                if !out.contains(&l) {
                    out.push(l);
                }
            }
        }
    }
    out.sort_by(|a, b| (a.uri.as_str(), a.range.start).cmp(&(b.uri.as_str(), b.range.start)));
    out
}

fn code_actions(st: &mut State, p: &CodeActionParams) -> Vec<CodeActionOrCommand> {
    let uri = &p.text_document.uri;
    let key = key_of(st, uri);
    let Some(a) = analysis(st, uri) else { return Vec::new() };
    let Some(file) = a.file_id(&key) else { return Vec::new() };
    let idx = LineIndex::new(a.text(file));
    let mut out = Vec::new();
    for d in &a.compilation.diagnostics {
        let Some(primary) = &d.primary else { continue };
        if primary.span.file != file || d.fixes.is_empty() {
            continue;
        }
        let range = idx.range(primary.span.start as usize, primary.span.end as usize);
        if range.end < p.range.start || range.start > p.range.end {
            continue;
        }
        for fix in &d.fixes {
            if fix.span.file != file {
                continue;
            }
            let edit = TextEdit {
                range: idx.range(fix.span.start as usize, fix.span.end as usize),
                new_text: fix.replacement.clone(),
            };
            let mut changes = HashMap::new();
            changes.insert(uri.clone(), vec![edit]);
            out.push(CodeActionOrCommand::CodeAction(CodeAction {
                title: fix.message.clone(),
                kind: Some(CodeActionKind::QUICKFIX),
                diagnostics: None,
                edit: Some(WorkspaceEdit { changes: Some(changes), ..Default::default() }),
                is_preferred: Some(d.fixes.len() == 1),
                ..Default::default()
            }));
        }
    }
    out
}

/// Relative module files next to the document, for `import ./`.
fn local_import_completions(a: &Analysis, file: FileId, offset: usize, uri: &Url) -> Vec<CompletionItem> {
    let text = a.text(file);
    let line_start = text[..offset.min(text.len())].rfind('\n').map(|i| i + 1).unwrap_or(0);
    let prefix = text[line_start..offset.min(text.len())].trim_start();
    if !prefix.starts_with("import ") || prefix.contains('{') {
        return Vec::new();
    }
    let Ok(path) = uri.to_file_path() else { return Vec::new() };
    let Some(dir) = path.parent() else { return Vec::new() };
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut out: Vec<CompletionItem> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "miles") && *p != path)
        .filter_map(|p| p.file_stem().map(|s| format!("./{}", s.to_string_lossy())))
        .map(|label| CompletionItem { label, kind: Some(CompletionItemKind::FILE), ..Default::default() })
        .collect();
    out.sort_by(|a, b| a.label.cmp(&b.label));
    out
}

fn completion_item(c: ide::Completion) -> CompletionItem {
    let kind = match c.kind {
        CK::Keyword => CompletionItemKind::KEYWORD,
        CK::Module => CompletionItemKind::MODULE,
        CK::StageKind => CompletionItemKind::FUNCTION,
        CK::Schema => CompletionItemKind::STRUCT,
        CK::Enum => CompletionItemKind::ENUM,
        CK::EnumMember => CompletionItemKind::ENUM_MEMBER,
        CK::Interface => CompletionItemKind::INTERFACE,
        CK::Const => CompletionItemKind::CONSTANT,
        CK::Field | CK::Setting => CompletionItemKind::FIELD,
        CK::Builtin => CompletionItemKind::FUNCTION,
        CK::StageInstance => CompletionItemKind::VARIABLE,
        CK::Type => CompletionItemKind::TYPE_PARAMETER,
        CK::Value => CompletionItemKind::VALUE,
    };
    CompletionItem {
        sort_text: Some(format!("{}{}", c.sort, c.label)),
        label: c.label,
        kind: Some(kind),
        detail: c.detail,
        documentation: c
            .documentation
            .map(|d| Documentation::MarkupContent(MarkupContent { kind: MarkupKind::Markdown, value: d })),
        insert_text: c.insert_text,
        ..Default::default()
    }
}

#[allow(deprecated)]
fn symbol(idx: &LineIndex, s: ide::Symbol) -> DocumentSymbol {
    let kind = match s.kind {
        DefKind::Module => SymbolKind::MODULE,
        DefKind::Const | DefKind::Model | DefKind::Cluster => SymbolKind::CONSTANT,
        DefKind::Enum => SymbolKind::ENUM,
        DefKind::EnumMember => SymbolKind::ENUM_MEMBER,
        DefKind::Interface => SymbolKind::INTERFACE,
        DefKind::Schema => SymbolKind::STRUCT,
        DefKind::StageKind => SymbolKind::FUNCTION,
        DefKind::Recipe => SymbolKind::CLASS,
        DefKind::Field | DefKind::Setting => SymbolKind::FIELD,
        DefKind::Port => SymbolKind::TYPE_PARAMETER,
        DefKind::StageInstance => SymbolKind::VARIABLE,
    };
    let range = idx.range(s.span.start as usize, s.span.end as usize);
    let mut selection = idx.range(s.selection.start as usize, s.selection.end as usize);
    // The protocol requires the selection to lie inside the range.
    if selection.start < range.start || selection.end > range.end {
        selection = range;
    }
    DocumentSymbol {
        name: s.name,
        detail: s.detail,
        kind,
        tags: None,
        deprecated: None,
        range,
        selection_range: selection,
        children: Some(s.children.into_iter().map(|c| symbol(idx, c)).collect()),
    }
}

fn encode_tokens(a: &Analysis, file: FileId) -> Vec<SemanticToken> {
    let text = a.text(file);
    let idx = LineIndex::new(text);
    let mut out = Vec::new();
    let (mut prev_line, mut prev_col) = (0u32, 0u32);
    for t in ide::semantic_tokens(a, file) {
        let ty = match t.kind {
            TokenKind::Keyword => SemanticTokenType::KEYWORD,
            TokenKind::Comment | TokenKind::DocComment => SemanticTokenType::COMMENT,
            TokenKind::String => SemanticTokenType::STRING,
            TokenKind::Number => SemanticTokenType::NUMBER,
            TokenKind::Unit => SemanticTokenType::TYPE,
            TokenKind::Namespace => SemanticTokenType::NAMESPACE,
            TokenKind::Type => SemanticTokenType::TYPE,
            TokenKind::Enum => SemanticTokenType::ENUM,
            TokenKind::EnumMember => SemanticTokenType::ENUM_MEMBER,
            TokenKind::Interface => SemanticTokenType::INTERFACE,
            TokenKind::Function => SemanticTokenType::FUNCTION,
            TokenKind::Property => SemanticTokenType::PROPERTY,
            TokenKind::Parameter => SemanticTokenType::PARAMETER,
            TokenKind::Variable => SemanticTokenType::VARIABLE,
            TokenKind::Operator => SemanticTokenType::OPERATOR,
        };
        let Some(type_index) = TOKEN_TYPES.iter().position(|x| *x == ty) else { continue };
        let mut mods = 0u32;
        if t.declaration {
            mods |= 1;
        }
        if t.std {
            mods |= 2;
        }
        if t.kind == TokenKind::DocComment {
            mods |= 4;
        }
        let start = idx.position(t.start as usize);
        let end = idx.position((t.start + t.len) as usize);
        if end.line != start.line {
            continue;
        }
        let delta_line = start.line - prev_line;
        let delta_start = if delta_line == 0 { start.character - prev_col } else { start.character };
        out.push(SemanticToken {
            delta_line,
            delta_start,
            length: end.character - start.character,
            token_type: type_index as u32,
            token_modifiers_bitset: mods,
        });
        prev_line = start.line;
        prev_col = start.character;
    }
    out
}
