//! Loading modules: reading files through the `FileSystem`, parsing, resolving imports (cycles
//! reported with their path) and building each module's scope.

use crate::fs::{join, parent_dir, FileSystem};
use crate::suggest::did_you_mean;
use crate::value::ItemRef;
use miles_grammar::ast::{Ident, ItemKind, SourceFile};

use miles_grammar::diag::{Diagnostic, ErrorCode, FileId, Span};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

include!(concat!(env!("OUT_DIR"), "/stdlib.rs"));

/// Modules every module sees without importing them, in lookup order.
pub const PRELUDE: &[&str] = &["std/prelude", "std/stages"];

#[derive(Clone, Debug)]
pub struct SourceInfo {
    /// The path as given (or `std/...` for the embedded standard library).
    pub path: String,
    pub text: String,
}

/// Every source file read while compiling, indexed by `FileId`: for rendering diagnostics.
#[derive(Clone, Debug, Default)]
pub struct Sources {
    pub files: Vec<SourceInfo>,
}

impl Sources {
    pub fn add(&mut self, path: String, text: String) -> FileId {
        self.files.push(SourceInfo { path, text });
        FileId(self.files.len() as u32 - 1)
    }
    pub fn get(&self, id: FileId) -> Option<&SourceInfo> {
        self.files.get(id.0 as usize)
    }
    /// 1-based line and column of a byte offset.
    pub fn line_col(&self, span: Span) -> (usize, usize) {
        let Some(f) = self.get(span.file) else { return (0, 0) };
        let at = (span.start as usize).min(f.text.len());
        let before = &f.text[..at];
        let line = before.matches('\n').count() + 1;
        let col = before.rfind('\n').map(|i| at - i).unwrap_or(at + 1);
        (line, col)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScopeEntry {
    Item(ItemRef),
    Module(u32),
}

#[derive(Debug)]
pub struct Module {
    /// `std/prelude` for the standard library, otherwise the normalised file path.
    pub key: String,
    pub file: FileId,
    /// Shared with the `ParseCache` it may have come from.
    pub ast: Arc<SourceFile>,
    pub is_std: bool,
    /// Names declared here or imported, to what they refer.
    pub scope: HashMap<String, ScopeEntry>,
    /// Names this module declares itself (what `import m { x }` and `m.x` can reach).
    pub own: HashMap<String, ItemRef>,
    pub fallbacks: Vec<u32>,
}

#[derive(Debug, Default)]
pub struct Program {
    pub sources: Sources,
    pub modules: Vec<Module>,
    /// The modules named on the command line (or opened in the editor).
    pub entries: Vec<u32>,
    /// The packages the build resolved imports through (empty outside a package).
    pub packages: Packages,
    /// The packages' house rules, parsed (`Packages::rules`).
    pub house_rules: Vec<HouseCheck>,
}

impl Program {
    pub fn module(&self, id: u32) -> &Module {
        &self.modules[id as usize]
    }
    pub fn item(&self, r: ItemRef) -> &miles_grammar::ast::Item {
        &self.modules[r.module as usize].ast.items[r.index as usize]
    }
    /// Resolves a name in a module: its own scope, then the prelude.
    pub fn lookup(&self, module: u32, name: &str) -> Option<ScopeEntry> {
        let m = self.module(module);
        if let Some(e) = m.scope.get(name) {
            return Some(*e);
        }
        for &f in &m.fallbacks {
            if let Some(r) = self.module(f).own.get(name) {
                return Some(ScopeEntry::Item(*r));
            }
        }
        None
    }
    /// Every name visible in a module (for suggestions and completion).
    pub fn visible_names(&self, module: u32) -> Vec<String> {
        let m = self.module(module);
        let mut names: Vec<String> = m.scope.keys().cloned().collect();
        for &f in &m.fallbacks {
            names.extend(self.module(f).own.keys().cloned());
        }
        names.sort();
        names.dedup();
        names
    }
    /// The module key `import path` names from module `from_key`, through this build's
    /// packages; `None` where the import is refused (E0110, E0111).
    pub fn import_key(&self, from_key: &str, path: &str) -> Option<String> {
        resolve_import_in(&self.packages, from_key, path).ok()
    }

    pub fn module_by_key(&self, key: &str) -> Option<u32> {
        self.modules.iter().position(|m| m.key == key).map(|i| i as u32)
    }
}

/// Parsed modules kept from one compilation to the next, so an editor that compiles on every
/// keystroke parses the standard library once per process and each other file only when its
/// text changed, and then only the top-level items whose text changed (the file's chunks,
/// `miles_grammar::ChunkCache`). A tree is reused whole only for the same module key, the same
/// text and the same `FileId` (its spans carry the id; ids follow load order, which stays put
/// while the imports do); chunks are reused at any place and id, their spans moved.
#[derive(Default)]
pub struct ParseCache {
    parsed: Mutex<HashMap<String, Parsed>>,
}

struct Parsed {
    file: FileId,
    text: String,
    ast: Arc<SourceFile>,
    diags: Vec<Diagnostic>,
    /// The chunks of `text`, for the next text of this module.
    chunks: miles_grammar::ChunkCache,
}

impl ParseCache {
    pub fn new() -> ParseCache {
        ParseCache::default()
    }

    /// The tree and parse diagnostics of `text`, loaded as `key` at `file`.
    fn parse(&self, key: &str, file: FileId, text: &str) -> (Arc<SourceFile>, Vec<Diagnostic>) {
        // The entry leaves the map while its text is parsed, so the lock is not held for that
        // long; a concurrent parse of the same module only misses the chunks.
        let mut chunks = miles_grammar::ChunkCache::new();
        if let Ok(mut m) = self.parsed.lock() {
            if let Some(p) = m.get(key).filter(|p| p.file == file && p.text == text) {
                return (p.ast.clone(), p.diags.clone());
            }
            if let Some(p) = m.remove(key) {
                chunks = p.chunks;
            }
        }
        let (ast, diags) = miles_grammar::parse_cached(file, text, &mut chunks);
        let ast = Arc::new(ast);
        if let Ok(mut m) = self.parsed.lock() {
            let entry = Parsed { file, text: text.to_string(), ast: ast.clone(), diags: diags.clone(), chunks };
            m.insert(key.to_string(), entry);
        }
        (ast, diags)
    }

    /// How many chunk texts have been parsed for `key` (a test hook: reuse shows as a count
    /// that does not grow).
    #[cfg(test)]
    fn chunk_parses(&self, key: &str) -> usize {
        self.parsed.lock().ok().and_then(|m| m.get(key).map(|p| p.chunks.parses())).unwrap_or(0)
    }
}

/// Reads, parses and links the entry files and everything they import.
pub fn load(fs: &dyn FileSystem, entries: &[String], diags: &mut Vec<Diagnostic>) -> Program {
    load_with(fs, entries, &Packages::default(), &ParseCache::new(), diags)
}

/// `load`, reusing (and filling) `cache`.
pub fn load_cached(
    fs: &dyn FileSystem,
    entries: &[String],
    diags: &mut Vec<Diagnostic>,
    cache: &ParseCache,
) -> Program {
    load_with(fs, entries, &Packages::default(), cache, diags)
}

/// The packages a build sees (from `miles.toml` and `miles.lock`, resolved by `miles-package`):
/// each one's root directory, as a module-key prefix, and the packages it may import.
#[derive(Clone, Debug, Default)]
pub struct Packages {
    pub roots: Vec<PackageRoot>,
    /// House rules the build's manifests attach to stdlib stage kinds (`[[rule]]`).
    pub rules: Vec<HouseRule>,
}

/// A rule a package's manifest attaches to a stdlib stage kind (`[[rule]]` in miles.toml): it is
/// checked on every instance of that kind in every recipe of a build that includes the package
/// (the project's own, and its dependencies': a platform team's rules reach its users).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HouseRule {
    /// The stage kind, e.g. `grpo`.
    pub stage: String,
    /// A Bool expression over the stage's fields and ports, as a stage kind's own checks.
    pub check: String,
    pub message: Option<String>,
    pub help: Option<String>,
    /// A failure is a warning (E0309) instead of an error.
    pub warn: bool,
    /// Where it is declared, e.g. `platform/miles.toml:12`; names the rule in diagnostics.
    pub origin: String,
}

/// A house rule parsed: its check's text is a source of its own, named by its origin.
#[derive(Clone, Debug)]
pub struct HouseCheck {
    pub stage: String,
    pub check: miles_grammar::ast::Check,
    pub origin: String,
}

#[derive(Clone, Debug, Default)]
pub struct PackageRoot {
    pub name: String,
    /// The directory holding its `miles.toml`, normalised like module keys (`.` for the project
    /// in the current directory).
    pub root: String,
    /// Declared dependencies: the package names `import NAME/...` may use from inside it.
    pub dependencies: Vec<String>,
    /// Its modules as `import NAME/...` names them (`grpo/base`), for an editor's completion;
    /// empty unless the builder listed them (`miles_package::project::list_modules`).
    pub modules: Vec<String>,
}

impl Packages {
    /// The package a module belongs to: the one with the longest root containing it.
    pub fn owner(&self, key: &str) -> Option<&PackageRoot> {
        self.roots.iter().filter(|p| is_under(key, &p.root)).max_by_key(|p| p.root.len())
    }
    pub fn get(&self, name: &str) -> Option<&PackageRoot> {
        self.roots.iter().find(|p| p.name == name)
    }
}

fn is_under(key: &str, root: &str) -> bool {
    if root == "." {
        return !key.starts_with("../") && !key.starts_with('/') && key != "..";
    }
    key.strip_prefix(root).is_some_and(|rest| rest.starts_with('/'))
}

/// Like `load`, with package imports (`import platform/grpo/base`) resolved through `packages`
/// and every import kept inside its package's root.
pub fn load_in(fs: &dyn FileSystem, entries: &[String], packages: &Packages, diags: &mut Vec<Diagnostic>) -> Program {
    load_with(fs, entries, packages, &ParseCache::new(), diags)
}

/// `load` with both: package imports through `packages`, parsed modules reused from `cache`.
pub fn load_with(
    fs: &dyn FileSystem,
    entries: &[String],
    packages: &Packages,
    cache: &ParseCache,
    diags: &mut Vec<Diagnostic>,
) -> Program {
    let program = Program { packages: packages.clone(), ..Program::default() };
    let mut loader = Loader { fs, packages, program, by_key: HashMap::new(), stack: Vec::new(), diags, cache };
    for p in PRELUDE {
        loader.load(p, None);
    }
    for e in entries {
        let key = crate::fs::normalize(e);
        if let Some(id) = loader.load(&key, None) {
            loader.program.entries.push(id);
        }
    }
    loader.program
}

struct Loader<'a> {
    fs: &'a dyn FileSystem,
    packages: &'a Packages,
    program: Program,
    by_key: HashMap<String, u32>,
    stack: Vec<(String, Option<Span>)>,
    diags: &'a mut Vec<Diagnostic>,
    cache: &'a ParseCache,
}

impl Loader<'_> {
    /// E0101 for a module that cannot be read; in another package than the importing module's,
    /// it names the package and the module path under its root (and the nearest module it has,
    /// when the build listed them).
    fn unreadable(&self, key: &str, from: Option<Span>, why: &str) -> Diagnostic {
        let importer = self.stack.last().and_then(|(k, _)| self.packages.owner(k)).map(|o| o.name.as_str());
        let package = self.packages.owner(key).filter(|o| Some(o.name.as_str()) != importer);
        let mut d = match package {
            Some(o) => {
                let module = key.strip_prefix(o.root.as_str()).unwrap_or(key).trim_start_matches('/');
                let module = module.strip_suffix(".miles").unwrap_or(module);
                let mut d = Diagnostic::error(
                    ErrorCode::E0101,
                    format!("package `{}` has no module `{module}` (cannot read {key}: {why})", o.name),
                );
                match did_you_mean(module, o.modules.iter().map(String::as_str)) {
                    Some(s) => {
                        let s = format!("{}/{s}", o.name);
                        d = d.with_help(format!("did you mean `{s}`?"));
                        if let Some(sp) = from {
                            d = d.with_fix(format!("replace with `{s}`"), sp, s);
                        }
                    }
                    None => d = d.with_help(format!("module paths are relative to the package's root, {}", o.root)),
                }
                d
            }
            None => Diagnostic::error(ErrorCode::E0101, format!("cannot read module `{key}`: {why}"))
                .with_help("paths are relative to the importing file; the `.miles` extension is implied"),
        };
        if let Some(sp) = from {
            d = d.with_primary(sp, "imported here");
        }
        d
    }
}

pub fn stdlib_source(key: &str) -> Option<&'static str> {
    STDLIB.iter().find(|(k, _)| *k == key).map(|(_, s)| *s)
}

/// Decodes UTF-8, replacing invalid bytes and reporting where the first one was.
pub fn decode(bytes: Vec<u8>) -> (String, Option<usize>) {
    match String::from_utf8(bytes) {
        Ok(s) => (s, None),
        Err(e) => {
            let at = e.utf8_error().valid_up_to();
            (String::from_utf8_lossy(e.as_bytes()).into_owned(), Some(at))
        }
    }
}

impl Loader<'_> {
    fn load(&mut self, key: &str, from: Option<Span>) -> Option<u32> {
        if let Some(pos) = self.stack.iter().position(|(k, _)| k == key) {
            self.report_cycle(pos, key, from);
            return None;
        }
        if let Some(&id) = self.by_key.get(key) {
            return Some(id);
        }
        let is_std = key.starts_with("std/");
        let text = if is_std { self.stdlib_text(key, from)? } else { self.file_text(key, from)? };
        let file = self.program.sources.add(key.to_string(), text);
        let (ast, parse_diags) = {
            let text = &self.program.sources.files[file.0 as usize].text;
            self.cache.parse(key, file, text)
        };
        self.diags.extend(parse_diags);
        let id = self.program.modules.len() as u32;
        let fallbacks = if is_std {
            PRELUDE.iter().take_while(|p| **p != key).filter_map(|p| self.by_key.get(*p).copied()).collect()
        } else {
            PRELUDE.iter().filter_map(|p| self.by_key.get(*p).copied()).collect()
        };
        let (own, scope) = self.own_declarations(&ast, id);
        self.program.modules.push(Module {
            key: key.to_string(),
            file,
            ast: Arc::default(),
            is_std,
            scope,
            own,
            fallbacks,
        });
        self.by_key.insert(key.to_string(), id);
        self.stack.push((key.to_string(), from));
        let bound = self.load_imports(key, &ast);
        self.stack.pop();
        self.bind(id, bound);
        self.program.modules[id as usize].ast = ast;
        Some(id)
    }

    /// E0102: `key` is already being loaded further up the stack, from `pos` on.
    fn report_cycle(&mut self, pos: usize, key: &str, from: Option<Span>) {
        let mut path: Vec<&str> = self.stack[pos..].iter().map(|(k, _)| k.as_str()).collect();
        path.push(key);
        let mut d = Diagnostic::error(ErrorCode::E0102, format!("import cycle: {}", path.join(" -> ")))
            .with_help("move what both modules need into a third module that both import");
        if let Some(sp) = from {
            d = d.with_primary(sp, "this import closes the cycle");
        }
        for (_, sp) in self.stack[pos + 1..].iter() {
            if let Some(sp) = sp {
                d = d.with_secondary(*sp, "imported here");
            }
        }
        self.diags.push(d);
    }

    /// A standard module's text; E0101 (with the closest name) when there is none.
    fn stdlib_text(&mut self, key: &str, from: Option<Span>) -> Option<String> {
        if let Some(t) = stdlib_source(key) {
            return Some(t.to_string());
        }
        let known: Vec<&str> = STDLIB.iter().map(|(k, _)| *k).collect();
        let mut d = Diagnostic::error(ErrorCode::E0101, format!("no module `{key}` in the standard library"));
        if let Some(sp) = from {
            d = d.with_primary(sp, "not found");
        }
        if let Some(s) = did_you_mean(key, known.iter().copied()) {
            d = d.with_help(format!("did you mean `{s}`?"));
            if let Some(sp) = from {
                d = d.with_fix(format!("replace with `{s}`"), sp, s);
            }
        } else {
            d = d.with_help(format!("standard modules: {}", known.join(", ")));
        }
        self.diags.push(d);
        None
    }

    /// A user module's text through the file system (E0004 for bytes that are not UTF-8).
    fn file_text(&mut self, key: &str, from: Option<Span>) -> Option<String> {
        match self.fs.read(key) {
            Ok(bytes) => {
                let (text, bad) = decode(bytes);
                if let Some(at) = bad {
                    let file = FileId(self.program.sources.files.len() as u32);
                    self.diags.push(
                        Diagnostic::error(ErrorCode::E0004, "file is not valid UTF-8")
                            .with_primary(Span::new(file, at, at), "first invalid byte here")
                            .with_help("save the file as UTF-8"),
                    );
                }
                Some(text)
            }
            Err(why) => {
                self.diags.push(self.unreadable(key, from, &why));
                None
            }
        }
    }

    /// The module's own declarations, first (E0104 for a name declared twice).
    fn own_declarations(
        &mut self,
        ast: &SourceFile,
        id: u32,
    ) -> (HashMap<String, ItemRef>, HashMap<String, ScopeEntry>) {
        let mut own = HashMap::new();
        let mut scope = HashMap::new();
        for (index, item) in ast.items.iter().enumerate() {
            if let Some(name) = item.name() {
                let r = ItemRef { module: id, index: index as u32 };
                if let Some(prev) = own.get(&name.name) {
                    let prev: &ItemRef = prev;
                    let prev_span = ast.items[prev.index as usize].name().map(|n| n.span).unwrap_or(name.span);
                    self.diags.push(
                        Diagnostic::error(ErrorCode::E0104, format!("`{}` is defined twice", name.name))
                            .with_primary(name.span, "second definition")
                            .with_secondary(prev_span, "first defined here")
                            .with_help("rename one of them"),
                    );
                    continue;
                }
                own.insert(name.name.clone(), r);
                scope.insert(name.name.clone(), ScopeEntry::Item(r));
            }
        }
        (own, scope)
    }

    /// Loads every module `ast` imports, depth-first, and returns the names the imports bind.
    fn load_imports(&mut self, key: &str, ast: &SourceFile) -> Vec<(String, ScopeEntry, Span)> {
        let mut bound = Vec::new();
        for item in &ast.items {
            let ItemKind::Import(imp) = &item.kind else { continue };
            let target_key = match resolve_import_in(self.packages, key, &imp.path) {
                Ok(k) => k,
                Err(d) => {
                    self.diags.push(d.with_primary(imp.path_span, "imported here"));
                    continue;
                }
            };
            let Some(target) = self.load(&target_key, Some(imp.path_span)) else { continue };
            match &imp.names {
                Some(names) => {
                    for n in names {
                        match self.program.modules[target as usize].own.get(&n.name) {
                            Some(r) => bound.push((n.name.clone(), ScopeEntry::Item(*r), n.span)),
                            None => self.report_not_in_module(target, &target_key, n),
                        }
                    }
                }
                None => {
                    let name = match &imp.alias {
                        Some(a) => a.name.clone(),
                        None => imp.path.trim_end_matches(".miles").rsplit('/').next().unwrap_or("").to_string(),
                    };
                    let span = imp.alias.as_ref().map(|a| a.span).unwrap_or(imp.path_span);
                    bound.push((name, ScopeEntry::Module(target), span));
                }
            }
        }
        bound
    }

    /// E0107: `import m { name }` where module `m` declares no `name`.
    fn report_not_in_module(&mut self, target: u32, target_key: &str, n: &Ident) {
        let own_names: Vec<String> = self.program.modules[target as usize].own.keys().cloned().collect();
        let mut d = Diagnostic::error(ErrorCode::E0107, format!("module `{target_key}` has no `{}`", n.name))
            .with_primary(n.span, "not declared there");
        if let Some(s) = did_you_mean(&n.name, own_names.iter().map(|s| s.as_str())) {
            d = d.with_help(format!("did you mean `{s}`?")).with_fix(format!("replace with `{s}`"), n.span, s);
        }
        self.diags.push(d);
    }

    /// Enters the imported names into module `id`'s scope (E0104 for a clash).
    fn bind(&mut self, id: u32, bound: Vec<(String, ScopeEntry, Span)>) {
        let module = &mut self.program.modules[id as usize];
        for (name, entry, span) in bound {
            if let Some(existing) = module.scope.get(&name) {
                if *existing != entry {
                    self.diags.push(
                        Diagnostic::error(ErrorCode::E0104, format!("`{name}` is already defined in this module"))
                            .with_primary(span, "imported again here")
                            .with_help("import it under another name with `as`"),
                    );
                }
                continue;
            }
            module.scope.insert(name, entry);
        }
    }
}

/// The module key an import names, relative to the importing module.
pub fn resolve_import(from_key: &str, path: &str) -> String {
    let path = path.trim_end_matches(".miles");
    if path.starts_with("std/") {
        return path.to_string();
    }
    if from_key.starts_with("std/") {
        // Inside the standard library every import is relative to std/.
        return crate::fs::normalize(&join(&parent_dir(from_key), path));
    }
    format!("{}.miles", join(&parent_dir(from_key), path))
}

/// `resolve_import` through the packages of a build: a path whose first segment names a package
/// resolves under that package's root, when the importing module's package declares it; a
/// relative path may not leave the importing module's package (E0110, E0111). A package import
/// may not hold `..` and no import in a package is absolute (E0110): the key must stay under the
/// root whose files `miles.lock` pins.
// The one diagnostic type is large; this runs once per import, not in a hot loop.
#[allow(clippy::result_large_err)]
pub fn resolve_import_in(packages: &Packages, from_key: &str, path: &str) -> Result<String, Diagnostic> {
    let owner = packages.owner(from_key);
    let escapes = |root: &PackageRoot, why: &str| {
        Diagnostic::error(
            ErrorCode::E0110,
            format!("`{path}` is outside package `{}` (root `{}`): {why}", root.name, root.root),
        )
        .with_help("import a dependency's modules by their path under its root (`import platform/grpo/base`)")
    };
    if let (Some(o), true) = (owner, path.starts_with('/')) {
        return Err(escapes(o, "an import in a package is relative to its module or names a package"));
    }
    let first = path.split('/').next().unwrap_or("");
    if !path.starts_with("std/") && !path.starts_with('.') && !path.starts_with('/') {
        if let Some(dep) = packages.get(first) {
            let allowed = owner.is_none_or(|o| o.name == dep.name || o.dependencies.contains(&dep.name));
            if !allowed {
                let o = owner.map(|o| o.name.as_str()).unwrap_or("");
                return Err(Diagnostic::error(
                    ErrorCode::E0111,
                    format!("package `{o}` does not declare a dependency on `{}`", dep.name),
                )
                .with_help(format!(
                    "add it to `[dependencies]` in {}/miles.toml (`miles add {}`)",
                    owner.map(|o| o.root.as_str()).unwrap_or("."),
                    dep.name
                )));
            }
            let rest = path.trim_end_matches(".miles")[first.len()..].trim_start_matches('/');
            let key = format!("{}.miles", join(&dep.root, rest));
            if rest.split('/').any(|s| s == "..") || !is_under(&key, &dep.root) {
                return Err(escapes(dep, "a package import may not hold `..`"));
            }
            return Ok(key);
        }
    }
    let key = resolve_import(from_key, path);
    if let Some(o) = owner {
        if !key.starts_with("std/") && !is_under(&key, &o.root) {
            return Err(Diagnostic::error(
                ErrorCode::E0110,
                format!("`{path}` is outside package `{}` (root `{}`)", o.name, o.root),
            )
            .with_help("declare the other package under `[dependencies]` in miles.toml and import it by name"));
        }
    }
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::MemoryFs;

    /// The entry module's tree and the load's diagnostics, loading through `cache` (or not).
    fn load_main(text: &str, cache: Option<&ParseCache>) -> (SourceFile, Vec<Diagnostic>, String) {
        let fs = MemoryFs::with(&[("main.miles", text), ("lib.miles", "const one = 1\n")]);
        let mut diags = Vec::new();
        let entries = ["main.miles".to_string()];
        let p = match cache {
            Some(c) => load_cached(&fs, &entries, &mut diags, c),
            None => load(&fs, &entries, &mut diags),
        };
        let m = p.module(p.entries[0]);
        ((*m.ast).clone(), diags, m.key.clone())
    }

    /// Issue #35: `import platform/../secret` left the dependency's root and loaded a file no
    /// lock pins; now every import that leaves its package, or is absolute, is E0110 at its path.
    #[test]
    fn no_import_leaves_a_package_root() {
        let packages = Packages {
            roots: vec![
                PackageRoot {
                    name: "team".into(),
                    root: "/srv/team".into(),
                    dependencies: vec!["platform".into()],
                    ..Default::default()
                },
                PackageRoot { name: "platform".into(), root: "/cache/platform".into(), ..Default::default() },
            ],
            rules: Vec::new(),
        };
        let load_one = |import: &str| {
            let main = format!("import {import}\n");
            let fs = MemoryFs::with(&[
                ("/srv/team/r.miles", main.as_str()),
                ("/srv/team/lib/x.miles", "const x = 1\n"),
                ("/cache/platform/grpo/base.miles", "const b = 1\n"),
                ("/cache/secret.miles", "const s = 1\n"),
            ]);
            let mut diags = Vec::new();
            let p = load_in(&fs, &["/srv/team/r.miles".to_string()], &packages, &mut diags);
            (p, diags, main)
        };
        // The grammar has no absolute import paths; other callers of `resolve_import_in` may.
        for path in ["/cache/secret", "/srv/team/lib/x"] {
            let e = resolve_import_in(&packages, "/srv/team/r.miles", path).expect_err(path);
            assert_eq!(e.code, "E0110", "{path}");
        }
        for import in ["platform/../secret", "platform/grpo/../../secret", "../../cache/secret"] {
            let (p, diags, main) = load_one(import);
            assert!(diags.len() == 1 && diags[0].code == "E0110", "{import}: {diags:#?}");
            let span = diags[0].primary.as_ref().expect("label").span;
            assert_eq!(&main[span.start as usize..span.end as usize], import);
            assert!(
                p.modules.iter().all(|m| !m.key.contains("secret") && !m.key.ends_with("x.miles")),
                "{import} loaded"
            );
        }
        for import in ["platform/grpo/base", "./lib/x", "platform/grpo/./base"] {
            let (_, diags, _) = load_one(import);
            assert!(diags.is_empty(), "{import}: {diags:#?}");
        }
    }

    #[test]
    fn an_edit_reparses_only_the_items_it_changed() {
        let mut text = String::from("import ./lib\n\n");
        for i in 0..20 {
            text.push_str(&format!("/// Item {i}.\nconst c{i} = lib.one + {i}\n\n"));
        }
        text.push_str("recipe r {\n    x = c3 +\n}\n");
        let cache = ParseCache::new();
        let (first, _, key) = load_main(&text, Some(&cache));
        let parsed = cache.chunk_parses(&key);
        assert_eq!(parsed, 22, "one chunk per item");
        assert_eq!(first, load_main(&text, None).0);
        // Longer in the middle, then shorter near the start, then a broken line: each edit
        // reparses one chunk, and everything after it moves.
        let mut edits = vec![text.replace("const c7 = lib.one + 7", "const c7 = lib.one + 7000 * 2")];
        edits.push(edits[0].replace("const c1 = lib.one + 1", "const c1 = 1"));
        edits.push(edits[1].replace("const c12 = lib.one + 12", "const c12 = lib.one +"));
        for (n, edited) in edits.iter().enumerate() {
            let cached = load_main(edited, Some(&cache));
            assert_eq!(cache.chunk_parses(&key), parsed + n + 1, "edit {n}");
            let fresh = load_main(edited, None);
            assert!(cached.0 == fresh.0 && cached.1 == fresh.1, "edit {n}: cached parse differs");
        }
        // The same text again: the whole tree is reused, nothing is parsed.
        let again = load_main(&edits[2], Some(&cache));
        assert_eq!(cache.chunk_parses(&key), parsed + edits.len());
        assert!(again.1 == load_main(&edits[2], None).1);
    }
}
