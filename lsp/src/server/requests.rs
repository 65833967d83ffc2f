//! The language server's request handlers: each turns an LSP request into a call of the
//! protocol-free IDE layer (`miles-ide`) and its answer back into LSP types.

use super::*;
pub(super) type Params = serde_json::Value;

pub(super) fn params<P: serde::de::DeserializeOwned>(v: Params) -> Result<P, (i32, String)> {
    serde_json::from_value(v).map_err(|e| (ErrorCode::InvalidParams as i32, e.to_string()))
}

pub(super) fn json<T: serde::Serialize>(v: T) -> Res {
    serde_json::to_value(v).map_err(|e| (ErrorCode::InternalError as i32, e.to_string()))
}

/// The analysis of a document and the cursor's file and byte offset in it.
pub(super) fn at<'s>(st: &'s State, uri: &Url, pos: Position) -> Option<(&'s Analysis, FileId, usize)> {
    let key = key_of(st, uri);
    let a = st.analyses.get(uri)?;
    let file = a.file_id(&key)?;
    let offset = LineIndex::new(a.text(file)).offset(pos);
    Some((a, file, offset))
}

pub(super) fn on_hover(st: &mut State, p: Params) -> Res {
    let p: HoverParams = params(p)?;
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

pub(super) fn on_completion(st: &mut State, p: Params) -> Res {
    let p: CompletionParams = params(p)?;
    let tp = p.text_document_position;
    let uri = tp.text_document.uri.clone();
    let _ = analysis(st, &uri);
    let st: &State = st;
    let Some((a, file, offset)) = at(st, &uri, tp.position) else { return json(()) };
    let mut items: Vec<CompletionItem> = ide::completions(a, file, offset).into_iter().map(completion_item).collect();
    items.extend(local_import_completions(a, file, offset, &uri));
    json(CompletionResponse::Array(items))
}

pub(super) fn on_definition(st: &mut State, p: Params) -> Res {
    let p: GotoDefinitionParams = params(p)?;
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

pub(super) fn analyse_open_documents(st: &mut State) {
    let uris: Vec<Url> = st.docs.keys().cloned().collect();
    for u in &uris {
        let _ = analysis(st, u);
    }
}

/// The analyses of every open document, the cursor's first: what references and rename search
/// (a library module's names are used by each recipe that imports it).
/// Every open document's analysis, the cursor's first, with the cursor's file and offset: what
/// references and rename search (one search, so rename edits every reference shown).
pub(super) fn across_open_documents<'s>(
    st: &'s State,
    tp: &TextDocumentPositionParams,
) -> Option<(Vec<&'s Analysis>, FileId, usize)> {
    let uri = &tp.text_document.uri;
    let key = key_of(st, uri);
    let docs = open_analyses(st, uri);
    let (u0, a) = docs.first().copied()?;
    if u0 != uri {
        return None;
    }
    let file = a.file_id(&key)?;
    let offset = LineIndex::new(a.text(file)).offset(tp.position);
    Some((docs.iter().map(|(_, a)| *a).collect(), file, offset))
}

pub(super) fn open_analyses<'s>(st: &'s State, uri: &Url) -> Vec<(&'s Url, &'s Analysis)> {
    let mut out: Vec<(&Url, &Analysis)> = st.analyses.iter().filter(|(u, _)| st.docs.contains_key(*u)).collect();
    out.sort_by_key(|(u, _)| (*u != uri, u.as_str()));
    out
}

pub(super) fn on_references(st: &mut State, p: Params) -> Res {
    let p: ReferenceParams = params(p)?;
    analyse_open_documents(st);
    let st: &State = st;
    let Some((analyses, file, offset)) = across_open_documents(st, &p.text_document_position) else {
        return json(());
    };
    let found = ide::references(&analyses, 0, file, offset, p.context.include_declaration);
    let locations: Vec<Location> = found.iter().filter_map(|f| location(st, analyses[f.analysis], f.span)).collect();
    json(locations)
}

pub(super) fn on_prepare_rename(st: &mut State, p: Params) -> Res {
    let p: TextDocumentPositionParams = params(p)?;
    let _ = analysis(st, &p.text_document.uri);
    let st: &State = st;
    let Some((a, file, offset)) = at(st, &p.text_document.uri, p.position) else { return json(()) };
    let span = ide::prepare_rename(a, file, offset).map_err(|e| (ErrorCode::RequestFailed as i32, e))?;
    let idx = LineIndex::new(a.text(file));
    json(PrepareRenameResponse::Range(idx.range(span.start as usize, span.end as usize)))
}

pub(super) fn on_rename(st: &mut State, p: Params) -> Res {
    let p: RenameParams = params(p)?;
    analyse_open_documents(st);
    let st: &State = st;
    let Some((analyses, file, offset)) = across_open_documents(st, &p.text_document_position) else {
        return json(());
    };
    let edits =
        ide::rename(&analyses, 0, file, offset, &p.new_name).map_err(|e| (ErrorCode::RequestFailed as i32, e))?;
    let mut changes: HashMap<Url, Vec<TextEdit>> = HashMap::new();
    for (f, text) in edits {
        if let Some(l) = location(st, analyses[f.analysis], f.span) {
            changes.entry(l.uri).or_default().push(TextEdit { range: l.range, new_text: text });
        }
    }
    json(WorkspaceEdit { changes: Some(changes), ..Default::default() })
}

pub(super) fn on_document_symbols(st: &mut State, p: Params) -> Res {
    let p: DocumentSymbolParams = params(p)?;
    let uri = p.text_document.uri;
    let key = key_of(st, &uri);
    let Some(a) = analysis(st, &uri) else { return json(()) };
    let Some(file) = a.file_id(&key) else { return json(()) };
    let idx = LineIndex::new(a.text(file));
    let syms: Vec<DocumentSymbol> = ide::document_symbols(a, file).into_iter().map(|s| symbol(&idx, s)).collect();
    json(DocumentSymbolResponse::Nested(syms))
}

pub(super) fn on_semantic_tokens(st: &mut State, p: Params) -> Res {
    let p: SemanticTokensParams = params(p)?;
    let uri = p.text_document.uri;
    let key = key_of(st, &uri);
    let Some(a) = analysis(st, &uri) else { return json(()) };
    let Some(file) = a.file_id(&key) else { return json(()) };
    json(SemanticTokensResult::Tokens(SemanticTokens { result_id: None, data: encode_tokens(a, file) }))
}

pub(super) fn on_formatting(st: &mut State, p: Params) -> Res {
    let p: DocumentFormattingParams = params(p)?;
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

pub(super) fn on_inlay_hints(st: &mut State, p: Params) -> Res {
    let p: InlayHintParams = params(p)?;
    let uri = p.text_document.uri;
    let key = key_of(st, &uri);
    let Some(a) = analysis(st, &uri) else { return json(()) };
    let Some(file) = a.file_id(&key) else { return json(()) };
    let idx = LineIndex::new(a.text(file));
    let mut plain = ide::plan_hints(a, file);
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

pub(super) fn on_code_actions(st: &mut State, p: Params) -> Res {
    let p: CodeActionParams = params(p)?;
    json(code_actions(st, &p))
}

pub(super) fn on_document_text(st: &mut State, p: Params) -> Res {
    let p: TextDocumentIdentifier = params(p)?;
    json(st.docs.get(&p.uri).map(|d| d.text.clone()))
}

pub(super) fn code_actions(st: &mut State, p: &CodeActionParams) -> Vec<CodeActionOrCommand> {
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
pub(super) fn local_import_completions(a: &Analysis, file: FileId, offset: usize, uri: &Url) -> Vec<CompletionItem> {
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

pub(super) fn completion_item(c: ide::Completion) -> CompletionItem {
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
pub(super) fn symbol(idx: &LineIndex, s: ide::Symbol) -> DocumentSymbol {
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

pub(super) fn encode_tokens(a: &Analysis, file: FileId) -> Vec<SemanticToken> {
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
