//! Embeds every `.miles` file under stdlib/ so `miles` works from any directory.
use std::fs;
use std::path::{Path, PathBuf};

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else { return };
    let mut entries: Vec<_> = entries.flatten().map(|e| e.path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            walk(&p, out);
        } else if p.extension().is_some_and(|e| e == "miles") {
            out.push(p);
        }
    }
}

fn main() {
    // Read at run time, not with env!(): a build script binary compiled in one checkout is
    // reused by cargo for the same crate in another (the artifact names do not depend on the
    // path), and would then embed the first checkout's stdlib, or nothing once it is gone.
    let manifest = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").to_string());
    let root = Path::new(&manifest).join("../../stdlib");
    println!("cargo:rerun-if-changed={}", root.display());
    let mut files = Vec::new();
    walk(&root, &mut files);
    let mut code = String::from(
        "/// (module path, source) for every embedded stdlib file.\npub const STDLIB: &[(&str, &str)] = &[\n",
    );
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
        let rel = f.strip_prefix(&root).unwrap_or(f).with_extension("");
        let module = rel.to_string_lossy().replace('\\', "/");
        let abs = fs::canonicalize(f).unwrap_or(f.clone());
        code.push_str(&format!("    ({:?}, include_str!({:?})),\n", module, abs.to_string_lossy()));
    }
    code.push_str("];\n");
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap_or_else(|_| ".".into())).join("stdlib.rs");
    if let Err(e) = fs::write(&out, code) {
        println!("cargo:warning=could not write {}: {e}", out.display());
    }
}
