//! The crate's top-level modules are layers: each imports only modules of the layers below it, so
//! no import loop spans the crate and a leaf never reaches back up to an executor. The table is
//! [`LAYERS`]; this test reads the crate's sources and keeps it true (as rust-analyzer's
//! architecture is stated and tested).
//!
//! An import is a path `crate::m...` (a `use` or inline, braces expanded), `super::` climbing out
//! of a top-level module, or a name the crate root re-exports (`crate::RunError` is `error`'s).
//! Test code (`#[cfg(test)]` items, and files declared by one) may import anything. A glob of the
//! crate root (`use crate::*`) is refused: it hides which modules a file uses.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Bottom first. A module imports only modules of earlier rows. A new top-level module goes in
/// the lowest row above everything it imports.
const LAYERS: &[&[&str]] = &[
    // Leaves: import nothing of the crate.
    &["child", "distributed", "error", "quote", "routing", "schedule", "source", "tensorboard", "token"],
    // The run spec (plain data), and the small services everything uses.
    &["atomic_write", "diffusion", "http_client", "line_child", "rng", "safetensors", "spec"],
    // What engines sample and trainers consume; text to ids; progress; a Hugging Face
    // directory's config.json and tensor names for a model config.
    &["hf_dir", "progress", "sample", "tokenize"],
    // Advantages from rewards, the backend's traits, rewards, TITO sessions.
    &["advantage", "backend", "reward", "session"],
    // Environments and episodes, tasks and prompts, streaming engines; the simulated backend.
    &["env", "sim", "stream", "tasks"],
    // The asynchronous buffer; the session server's core (chat requests onto TITO sessions).
    &["buffer", "chat"],
    // The rollout plug-in layers: programs playing episodes through the chat server.
    &["agent"],
    // The executors: the schedules over their shared pieces.
    &["run"],
    // Old paths kept for other crates (`exec`, in lib.rs).
    &["exec"],
];

#[test]
fn no_import_cycle_between_top_level_modules() {
    let graph = Graph::read();
    let cycles = graph.cycles();
    let mut report = String::new();
    for cycle in &cycles {
        report.push_str(&format!("import cycle among {}:\n", cycle.join(", ")));
        for ((from, to), at) in &graph.edges {
            if cycle.contains(from) && cycle.contains(to) {
                report.push_str(&format!("  {from} -> {to}  ({})\n", at.join(", ")));
            }
        }
    }
    assert!(cycles.is_empty(), "{report}");
}

#[test]
fn top_level_modules_import_only_the_layers_below() {
    let graph = Graph::read();
    let layer = |m: &str| LAYERS.iter().position(|row| row.contains(&m));
    let mut report = String::new();
    for m in &graph.modules {
        if layer(m).is_none() {
            report.push_str(&format!("module `{m}` is in no layer: add it to LAYERS (src/layers.rs)\n"));
        }
    }
    for row in LAYERS {
        for m in *row {
            if !graph.modules.contains(*m) {
                report.push_str(&format!("LAYERS names `{m}`, which is no module of the crate\n"));
            }
        }
    }
    for ((from, to), at) in &graph.edges {
        if let (Some(a), Some(b)) = (layer(from), layer(to)) {
            if b >= a {
                report.push_str(&format!("{from} (layer {a}) imports {to} (layer {b}): {}\n", at.join(", ")));
            }
        }
    }
    assert!(report.is_empty(), "{report}");
}

/// The top-level modules and their imports of each other, with where each is made.
struct Graph {
    modules: BTreeSet<String>,
    edges: BTreeMap<(String, String), Vec<String>>,
}

/// One source file (or a module written inline in lib.rs), as the graph reads it.
struct Source {
    /// Shown in messages (`src/run/mod.rs`).
    name: String,
    /// Its module path below the crate root (`["run"]` for src/run/mod.rs).
    path: Vec<String>,
    /// The text with comments, literals and test code blanked (line breaks kept).
    code: String,
}

impl Graph {
    fn read() -> Graph {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        let mut sources = Vec::new();
        let mut test_files = BTreeSet::new();
        for file in &files {
            let rel = file.strip_prefix(&src).unwrap().with_extension("");
            let mut path: Vec<String> = rel.iter().map(|c| c.to_string_lossy().into_owned()).collect();
            if matches!(path.last().map(String::as_str), Some("mod" | "lib")) {
                path.pop();
            }
            let text = std::fs::read_to_string(file).unwrap();
            let raw = blank_comments_and_literals(&text);
            // `#[cfg(test)] mod x;` makes the file of `x` test code.
            for name in test_module_declarations(&raw) {
                let mut p = path.clone();
                p.push(name);
                test_files.insert(p);
            }
            let code = blank_test_items(&raw);
            let name = format!("src/{}", file.strip_prefix(&src).unwrap().display());
            if path.is_empty() {
                // lib.rs: its inline modules (`pub mod exec { ... }`) are modules of their own.
                for (module, body) in inline_modules(&code) {
                    sources.push(Source { name: name.clone(), path: vec![module], code: body });
                }
            }
            sources.push(Source { name, path, code });
        }
        sources.retain(|s| !test_files.contains(&s.path));
        let modules: BTreeSet<String> = sources.iter().filter_map(|s| s.path.first().cloned()).collect();
        let root_names = root_names(&sources, &modules);
        let mut edges: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
        for s in sources.iter().filter(|s| !s.path.is_empty()) {
            for (line, first) in imports(s) {
                let to = if modules.contains(&first) {
                    first
                } else {
                    match root_names.get(&first) {
                        Some(m) => m.clone(),
                        None => panic!("{}:{line}: cannot tell which module `crate::{first}` is", s.name),
                    }
                };
                if to != s.path[0] {
                    edges.entry((s.path[0].clone(), to)).or_default().push(format!("{}:{line}", s.name));
                }
            }
        }
        Graph { modules, edges }
    }

    /// The strongly connected components of more than one module (Tarjan's algorithm).
    fn cycles(&self) -> Vec<Vec<String>> {
        struct Walk<'g> {
            next: BTreeMap<&'g str, Vec<&'g str>>,
            index: BTreeMap<&'g str, usize>,
            low: BTreeMap<&'g str, usize>,
            stack: Vec<&'g str>,
            found: Vec<Vec<String>>,
        }
        fn visit<'g>(w: &mut Walk<'g>, v: &'g str) {
            let i = w.index.len();
            w.index.insert(v, i);
            w.low.insert(v, i);
            w.stack.push(v);
            for u in w.next.get(v).cloned().unwrap_or_default() {
                if !w.index.contains_key(u) {
                    visit(w, u);
                    let l = w.low[v].min(w.low[u]);
                    w.low.insert(v, l);
                } else if w.stack.contains(&u) {
                    let l = w.low[v].min(w.index[u]);
                    w.low.insert(v, l);
                }
            }
            if w.low[v] == w.index[v] {
                let mut component = Vec::new();
                while let Some(u) = w.stack.pop() {
                    component.push(u.to_string());
                    if u == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    w.found.push(component);
                }
            }
        }
        let mut w = Walk {
            next: BTreeMap::new(),
            index: BTreeMap::new(),
            low: BTreeMap::new(),
            stack: Vec::new(),
            found: Vec::new(),
        };
        for (a, b) in self.edges.keys() {
            w.next.entry(a.as_str()).or_default().push(b.as_str());
        }
        for m in &self.modules {
            if !w.index.contains_key(m.as_str()) {
                visit(&mut w, m.as_str());
            }
        }
        w.found
    }
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// `text` with comments and string and char literals replaced by spaces (line breaks kept).
fn blank_comments_and_literals(text: &str) -> String {
    let b: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let blank = |out: &mut String, s: &[char]| out.extend(s.iter().map(|&c| if c == '\n' { '\n' } else { ' ' }));
    let mut i = 0;
    while i < b.len() {
        let ident_before = i > 0 && (b[i - 1].is_alphanumeric() || b[i - 1] == '_');
        let end = if b[i] == '/' && b.get(i + 1) == Some(&'/') {
            b[i..].iter().position(|&c| c == '\n').map_or(b.len(), |k| i + k)
        } else if b[i] == '/' && b.get(i + 1) == Some(&'*') {
            let mut depth = 0;
            let mut j = i;
            loop {
                if j + 1 >= b.len() {
                    break b.len();
                }
                if b[j] == '/' && b[j + 1] == '*' {
                    depth += 1;
                    j += 2;
                } else if b[j] == '*' && b[j + 1] == '/' {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break j;
                    }
                } else {
                    j += 1;
                }
            }
        } else if b[i] == 'r' && !ident_before && matches!(b.get(i + 1), Some('"' | '#')) {
            let hashes = b[i + 1..].iter().take_while(|&&c| c == '#').count();
            if b.get(i + 1 + hashes) != Some(&'"') {
                out.push(b[i]);
                i += 1;
                continue;
            }
            let mut j = i + 2 + hashes;
            while j < b.len()
                && !(b[j] == '"' && b[j + 1..].iter().take(hashes).filter(|&&c| c == '#').count() == hashes)
            {
                j += 1;
            }
            (j + 1 + hashes).min(b.len())
        } else if b[i] == '"' {
            let mut j = i + 1;
            while j < b.len() && b[j] != '"' {
                j += if b[j] == '\\' { 2 } else { 1 };
            }
            (j + 1).min(b.len())
        } else if b[i] == '\'' && b.get(i + 2) == Some(&'\'') {
            i + 3
        } else if b[i] == '\'' && b.get(i + 1) == Some(&'\\') {
            b[i + 2..].iter().position(|&c| c == '\'').map_or(b.len(), |k| i + 3 + k)
        } else {
            out.push(b[i]);
            i += 1;
            continue;
        };
        blank(&mut out, &b[i..end]);
        i = end;
    }
    out
}

/// The names of the modules `code` declares as test code in files of their own.
fn test_module_declarations(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(k) = rest.find("#[cfg(test)]") {
        rest = &rest[k + "#[cfg(test)]".len()..];
        let item = rest.trim_start();
        let item = item.strip_prefix("pub(crate) ").or_else(|| item.strip_prefix("pub ")).unwrap_or(item);
        if let Some(decl) = item.strip_prefix("mod ") {
            let name: String = decl.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            if decl[name.len()..].trim_start().starts_with(';') {
                out.push(name);
            }
        }
    }
    out
}

/// `code` with every `#[cfg(test)]` item blanked (to its matching `}` or its `;`).
fn blank_test_items(code: &str) -> String {
    let mut out: Vec<char> = code.chars().collect();
    let marker: Vec<char> = "#[cfg(test)]".chars().collect();
    let mut i = 0;
    while i + marker.len() <= out.len() {
        if out[i..i + marker.len()] != marker[..] {
            i += 1;
            continue;
        }
        let mut j = i + marker.len();
        let mut depth = 0usize;
        while j < out.len() {
            match out[j] {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
                ';' if depth == 0 => break,
                _ => {}
            }
            j += 1;
        }
        let stop = (j + 1).min(out.len());
        for c in &mut out[i..stop] {
            if *c != '\n' {
                *c = ' ';
            }
        }
        i = j + 1;
    }
    out.into_iter().collect()
}

/// lib.rs's inline modules (`pub mod name { ... }`): each name with its body.
fn inline_modules(code: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(k) = code[from..].find("mod ") {
        let at = from + k;
        from = at + 4;
        let name: String = code[from..].chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        let after = code[from + name.len()..].trim_start();
        if !after.starts_with('{') {
            continue;
        }
        let open = code.len() - after.len();
        let mut depth = 0;
        let mut close = open;
        for (j, c) in code[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        close = open + j;
                        break;
                    }
                }
                _ => {}
            }
        }
        // Blank what precedes the body, keeping its lines, so line numbers stay the file's.
        let before: String = code[..open].chars().map(|c| if c == '\n' { '\n' } else { ' ' }).collect();
        out.push((name, format!("{before}{}", &code[open..close])));
        from = close;
    }
    out
}

/// The names the crate root re-exports (`pub use m::*;` and `pub use m::{A, B};` in lib.rs), each
/// with the top-level module it comes from.
fn root_names(sources: &[Source], modules: &BTreeSet<String>) -> BTreeMap<String, String> {
    let lib = sources.iter().find(|s| s.path.is_empty()).expect("src/lib.rs");
    let mut names = BTreeMap::new();
    for stmt in statements(&lib.code, "pub use ") {
        let (module, rest) = stmt.split_once("::").unwrap_or((stmt.as_str(), ""));
        if !modules.contains(module) {
            continue;
        }
        if rest == "*" {
            // Every public name of the module's files (nested globs included).
            for s in sources.iter().filter(|s| s.path.first().map(String::as_str) == Some(module)) {
                for name in public_names(&s.code) {
                    names.entry(name).or_insert_with(|| module.to_string());
                }
            }
        } else {
            for item in expand(rest) {
                let last = item.rsplit(" as ").next().unwrap_or(&item);
                let last = last.rsplit("::").next().unwrap_or(last).trim();
                names.insert(last.to_string(), module.to_string());
            }
        }
    }
    names
}

/// The names a file declares or re-exports as `pub`.
fn public_names(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    for kw in ["struct", "enum", "trait", "fn", "type", "const", "static", "mod"] {
        let pat = format!("pub {kw} ");
        let mut rest = code;
        while let Some(k) = rest.find(&pat) {
            rest = &rest[k + pat.len()..];
            out.push(rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect());
        }
    }
    for stmt in statements(code, "pub use ") {
        for item in expand(&stmt) {
            let last = item.rsplit(" as ").next().unwrap_or(&item);
            out.push(last.rsplit("::").next().unwrap_or(last).trim().to_string());
        }
    }
    out
}

/// Every statement starting with `keyword` (up to its `;`), whitespace collapsed.
fn statements(code: &str, keyword: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(k) = rest.find(keyword) {
        let ident_before = rest[..k].chars().last().is_some_and(|c| c.is_alphanumeric() || c == '_');
        rest = &rest[k + keyword.len()..];
        if ident_before {
            continue;
        }
        let end = rest.find(';').unwrap_or(rest.len());
        out.push(rest[..end].split_whitespace().collect::<Vec<_>>().join(" "));
        rest = &rest[end..];
    }
    out
}

/// A use tree's paths, braces expanded: `a::{b, c::{d, e}}` is `a::b`, `a::c::d`, `a::c::e`.
fn expand(tree: &str) -> Vec<String> {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else { return vec![tree.to_string()] };
    let close = tree.rfind('}').unwrap_or(tree.len());
    let (head, inner) = (&tree[..open], &tree[open + 1..close]);
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (j, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..j]);
                start = j + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts.into_iter().filter(|p| !p.trim().is_empty()).flat_map(|p| expand(&format!("{head}{}", p.trim()))).collect()
}

/// The crate-root names a source file imports, with their lines: the first segment after
/// `crate::`, or after as many `super::` as climb out of its top-level module.
fn imports(s: &Source) -> Vec<(usize, String)> {
    let code = &s.code;
    let line_of = |at: usize| code[..at].matches('\n').count() + 1;
    let mut out = Vec::new();
    for (at, _) in code.match_indices("crate::").chain(code.match_indices("super::")) {
        if code[..at].chars().last().is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        // The whole path, braces included.
        let mut depth = 0;
        let end = code[at..]
            .char_indices()
            .find(|&(_, c)| {
                match c {
                    '{' => depth += 1,
                    '}' if depth > 0 => depth -= 1,
                    _ => {}
                }
                depth == 0 && !(c.is_alphanumeric() || c == '_' || c == ':' || c == '{' || c == '}')
            })
            .map_or(code.len(), |(k, _)| at + k);
        let path = code[at..end].split_whitespace().collect::<Vec<_>>().join(" ");
        for full in expand(&path) {
            let full = full.split(" as ").next().unwrap_or(&full).replace(' ', "");
            let mut segs: Vec<&str> = full.split("::").collect();
            let from_root = if segs[0] == "crate" {
                segs.remove(0);
                true
            } else {
                let ups = segs.iter().take_while(|&&x| x == "super").count();
                segs.drain(..ups);
                ups >= s.path.len()
            };
            match segs.first() {
                Some(&"*") if from_root => {
                    panic!("{}:{}: `use crate::*` hides which modules the file uses; name them", s.name, line_of(at))
                }
                Some(first) if from_root && !first.is_empty() && *first != "self" => {
                    out.push((line_of(at), first.to_string()))
                }
                _ => {}
            }
        }
    }
    out
}
