//! Declarations: every name any loaded module declares, by the span of its name.

use miles_compiler::program::Program;
use miles_compiler::value::ItemRef;
use miles_grammar::ast::{self, Ident, Item, ItemKind};
use miles_grammar::diag::Span;
use std::collections::HashMap;

/// What a name declares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum DefKind {
    Module,
    Const,
    Model,
    Cluster,
    Enum,
    EnumMember,
    Interface,
    Schema,
    StageKind,
    Recipe,
    /// A field of a schema or stage kind.
    Field,
    /// A port of a stage kind (`rollout: Trajectories`).
    Port,
    /// A recipe binding that instantiates a stage.
    StageInstance,
    /// A recipe binding that sets a recipe setting (`stop = 100.steps`).
    Setting,
}

/// A declaration found in some module's syntax tree.
#[derive(Clone, Debug)]
pub struct Def {
    pub kind: DefKind,
    pub name: String,
    /// The declared name.
    pub span: Span,
    /// The whole declaration (for document symbols and ranges).
    pub full_span: Span,
    pub doc: Option<String>,
    /// The item that holds a field, port, member or binding.
    pub container: Option<ItemRef>,
    /// The item itself, for item definitions.
    pub item: Option<ItemRef>,
    pub module: u32,
}

/// Every declaration of every loaded module, by the span of its name.
pub struct Defs {
    pub by_span: HashMap<Span, Def>,
}

impl Defs {
    pub fn new(program: &Program) -> Defs {
        let mut by_span = HashMap::new();
        for (m, module) in program.modules.iter().enumerate() {
            let m = m as u32;
            for (index, item) in module.ast.items.iter().enumerate() {
                let r = ItemRef { module: m, index: index as u32 };
                collect_item_defs(item, r, m, &mut by_span);
            }
        }
        Defs { by_span }
    }
    pub fn at(&self, span: Span) -> Option<&Def> {
        self.by_span.get(&span)
    }
}

pub(crate) fn doc_text(d: &Option<ast::Doc>) -> Option<String> {
    d.as_ref().map(|d| d.text.clone())
}

fn collect_item_defs(item: &Item, r: ItemRef, m: u32, out: &mut HashMap<Span, Def>) {
    let mut add =
        |kind, id: &Ident, full: Span, doc: Option<String>, container: Option<ItemRef>, item: Option<ItemRef>| {
            out.insert(
                id.span,
                Def { kind, name: id.name.clone(), span: id.span, full_span: full, doc, container, item, module: m },
            );
        };
    let doc = doc_text(&item.doc);
    match &item.kind {
        ItemKind::Import(imp) => {
            // The name an import binds: its alias, else the path (`arith` of `std/tasks/arith`).
            if imp.names.is_none() {
                let (name, span) = match &imp.alias {
                    Some(al) => (al.name.clone(), al.span),
                    None => (
                        imp.path.trim_end_matches(".miles").rsplit('/').next().unwrap_or("").to_string(),
                        imp.path_span,
                    ),
                };
                add(DefKind::Module, &Ident { name, span }, item.span, None, None, None);
            }
        }
        ItemKind::Const(c) => add(DefKind::Const, &c.name, item.span, doc, None, Some(r)),
        ItemKind::Model(nv) => add(DefKind::Model, &nv.name, item.span, doc, None, Some(r)),
        ItemKind::Cluster(nv) => add(DefKind::Cluster, &nv.name, item.span, doc, None, Some(r)),
        ItemKind::Interface(id) => add(DefKind::Interface, id, item.span, doc, None, Some(r)),
        ItemKind::Enum(e) => {
            add(DefKind::Enum, &e.name, item.span, doc, None, Some(r));
            for mem in &e.members {
                add(DefKind::EnumMember, &mem.name, mem.name.span, doc_text(&mem.doc), Some(r), None);
            }
        }
        ItemKind::Schema(s) => {
            add(DefKind::Schema, &s.name, item.span, doc, None, Some(r));
            for f in &s.fields {
                add(DefKind::Field, &f.name, f.span, doc_text(&f.doc), Some(r), None);
            }
        }
        ItemKind::Stage(s) => {
            add(DefKind::StageKind, &s.name, item.span, doc, None, Some(r));
            for p in &s.ports {
                add(DefKind::Port, &p.name, p.name.span.to(p.ty.span), None, Some(r), None);
            }
            for f in &s.fields {
                add(DefKind::Field, &f.name, f.span, doc_text(&f.doc), Some(r), None);
            }
        }
        ItemKind::Recipe(rc) => {
            add(DefKind::Recipe, &rc.name, item.span, doc, None, Some(r));
            for b in &rc.bindings {
                if b.path.segments.len() != 1 {
                    continue;
                }
                let kind = if stage_call(&b.value).is_some() { DefKind::StageInstance } else { DefKind::Setting };
                add(kind, &b.path.segments[0], b.span, doc_text(&b.doc), Some(r), None);
            }
        }
    }
}

pub use miles_compiler::recipe::stage_call;
