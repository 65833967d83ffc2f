//! A compilation plus the indexes editor features need, and the references the compiler does not
//! record (resolved here from the syntax tree, so they work in broken files).

use crate::defs::{stage_call, Def, DefKind, Defs};
use crate::syntax::walk_item_exprs;
use miles_compiler::program::{Program, ScopeEntry};
use miles_compiler::value::ItemRef;
use miles_compiler::Compilation;
use miles_grammar::ast::{self, Expr, ExprKind, ItemKind};
use miles_grammar::diag::{FileId, Span};
use std::collections::HashMap;

/// A compilation plus the indexes editor features need. Built once per edit, shared by every
/// request until the next one.
pub struct Analysis {
    pub compilation: Compilation,
    pub defs: Defs,
    /// Use span -> definition name span: the compiler's references plus those resolved here.
    pub refs: Vec<(Span, Span)>,
}

impl Analysis {
    pub fn new(compilation: Compilation) -> Analysis {
        let defs = Defs::new(&compilation.program);
        let mut refs = compilation.references.clone();
        extra_references(&compilation, &defs, &mut refs);
        refs.sort_by_key(|(u, d)| (u.file, u.start, u.end, d.file, d.start));
        refs.dedup();
        Analysis { compilation, defs, refs }
    }

    pub fn program(&self) -> &Program {
        &self.compilation.program
    }

    /// The file a path (module key) was loaded as.
    pub fn file_id(&self, path: &str) -> Option<FileId> {
        self.program().modules.iter().find(|m| m.key == path).map(|m| m.file)
    }

    pub fn module_of_file(&self, file: FileId) -> Option<u32> {
        self.program().modules.iter().position(|m| m.file == file).map(|i| i as u32)
    }

    pub fn text(&self, file: FileId) -> &str {
        self.program().sources.get(file).map(|s| s.text.as_str()).unwrap_or("")
    }

    /// The definition a cursor is on: a use, or a declared name itself.
    pub fn resolve(&self, file: FileId, offset: usize) -> Option<(Span, &Def)> {
        let mut best: Option<(Span, Span)> = None;
        for (u, d) in &self.refs {
            if u.file == file && u.contains(offset) && best.is_none_or(|(b, _)| u.end - u.start < b.end - b.start) {
                best = Some((*u, *d));
            }
        }
        if let Some((u, d)) = best {
            if let Some(def) = self.defs.at(d) {
                return Some((u, def));
            }
        }
        self.defs
            .by_span
            .iter()
            .filter(|(s, _)| s.file == file && s.contains(offset))
            .min_by_key(|(s, _)| s.end - s.start)
            .map(|(s, d)| (*s, d))
    }
}

/// References the compiler does not record: field names in stage blocks and amendments
/// (`train.lr = ...`), recipe settings, enum members written bare or qualified, `extends`
/// parents in other modules.
fn extra_references(c: &Compilation, defs: &Defs, out: &mut Vec<(Span, Span)>) {
    let program = &c.program;
    let known: HashMap<Span, Span> = c.references.iter().copied().collect();
    let settings = settings_schema(program);
    for (m, module) in program.modules.iter().enumerate() {
        let m = m as u32;
        for item in &module.ast.items {
            if let ItemKind::Recipe(r) = &item.kind {
                // Instance name -> stage kind declaration, for amendments.
                let mut instances: HashMap<&str, ItemRef> = HashMap::new();
                for b in &r.bindings {
                    let Some(first) = b.path.segments.first() else { continue };
                    if b.path.segments.len() == 1 {
                        if let Some((callee, _, fields)) = stage_call(&b.value) {
                            if let Some(kind) = stage_kind_of(program, defs, &known, m, callee) {
                                instances.insert(first.name.as_str(), kind);
                                for f in fields {
                                    if let Some(fid) = f.path.segments.first() {
                                        if let Some(d) = field_decl(program, kind, &fid.name) {
                                            out.push((fid.span, d));
                                        }
                                    }
                                }
                            }
                        } else if let Some(s) = settings {
                            if let Some(d) = field_decl(program, s, &first.name) {
                                out.push((first.span, d));
                            }
                        }
                    }
                }
                for b in &r.bindings {
                    if b.path.segments.len() < 2 {
                        continue;
                    }
                    let head = &b.path.segments[0];
                    let target =
                        r.bindings.iter().find(|x| x.path.segments.len() == 1 && x.path.segments[0].name == head.name);
                    if let Some(t) = target {
                        out.push((head.span, t.path.segments[0].span));
                    }
                    if let (Some(kind), Some(field)) = (instances.get(head.name.as_str()), b.path.segments.get(1)) {
                        if let Some(d) = field_decl(program, *kind, &field.name) {
                            out.push((field.span, d));
                        }
                    }
                }
            }
            // Enum members: bare names the compiler resolved by expected type, and `Enum.member`.
            let mut visit = |e: &Expr| match &e.kind {
                ExprKind::Name(id) if !known.contains_key(&id.span) => {
                    if let Some(ScopeEntry::Module(_)) = program.lookup(m, &id.name) {
                        if let Some(d) = import_binding(program, m, &id.name) {
                            out.push((id.span, d));
                        }
                    } else if let Some(d) = enum_member_visible(program, m, &id.name) {
                        out.push((id.span, d));
                    }
                }
                ExprKind::Field(base, field) => {
                    if let ExprKind::Name(b) = &base.kind {
                        let def = known.get(&b.span).and_then(|d| defs.at(*d));
                        if let Some(Def { kind: DefKind::Enum, item: Some(r), .. }) = def {
                            if let ItemKind::Enum(en) = &program.item(*r).kind {
                                if let Some(mem) = en.members.iter().find(|x| x.name.name == field.name) {
                                    out.push((field.span, mem.name.span));
                                }
                            }
                        }
                    }
                }
                _ => {}
            };
            walk_item_exprs(item, &mut visit);
        }
    }
}

/// Where an import binds `name` in module `m`: its alias or its path.
fn import_binding(program: &Program, m: u32, name: &str) -> Option<Span> {
    program.module(m).ast.items.iter().find_map(|i| match &i.kind {
        ItemKind::Import(imp) if imp.names.is_none() => match &imp.alias {
            Some(al) if al.name == name => Some(al.span),
            None if imp.path.trim_end_matches(".miles").rsplit('/').next() == Some(name) => Some(imp.path_span),
            _ => None,
        },
        _ => None,
    })
}

/// The stage kind a callee names (via the compiler's references, else a scope lookup).
fn stage_kind_of(
    program: &Program,
    defs: &Defs,
    known: &HashMap<Span, Span>,
    m: u32,
    callee: &Expr,
) -> Option<ItemRef> {
    let id = match &callee.kind {
        ExprKind::Name(id) => id,
        ExprKind::Field(_, id) => id,
        _ => return None,
    };
    if let Some(Def { kind: DefKind::StageKind, item: Some(r), .. }) = known.get(&id.span).and_then(|d| defs.at(*d)) {
        return Some(*r);
    }
    if let ExprKind::Name(id) = &callee.kind {
        if let Some(ScopeEntry::Item(r)) = program.lookup(m, &id.name) {
            if matches!(program.item(r).kind, ItemKind::Stage(_)) {
                return Some(r);
            }
        }
    }
    None
}

pub(crate) fn field_decl(program: &Program, decl: ItemRef, name: &str) -> Option<Span> {
    decl_fields(program, decl).iter().find(|f| f.name.name == name).map(|f| f.name.span)
}

pub(crate) fn decl_fields(program: &Program, decl: ItemRef) -> &[ast::FieldDecl] {
    match &program.item(decl).kind {
        ItemKind::Schema(s) => &s.fields,
        ItemKind::Stage(s) => &s.fields,
        _ => &[],
    }
}

pub(crate) fn settings_schema(program: &Program) -> Option<ItemRef> {
    miles_compiler::program::PRELUDE.iter().find_map(|p| {
        let m = program.module_by_key(p)?;
        program.module(m).own.get("recipe_settings").copied()
    })
}

/// A bare enum member as the checker resolves it (one rule: `miles_compiler::eval`).
fn enum_member_visible(program: &Program, module: u32, name: &str) -> Option<Span> {
    miles_compiler::eval::bare_enum_member(program, module, name).map(|(_, m)| m.name.span)
}

#[cfg(test)]
mod tests {
    use crate::fixture::at_cursor;
    use crate::DefKind;

    #[test]
    fn resolves_a_stage_field_in_a_broken_file() {
        let (a, f, at) = at_cursor("recipe r {\n    train = grpo(x, y) { l$0r = 1e-4 }\n}\nconst = \n");
        let (_, def) = a.resolve(f, at).expect("lr resolves");
        assert_eq!(def.kind, DefKind::Field);
    }
}
