//! `miles fmt [--check] FILES...`: rewrite `.miles` files in the one canonical layout
//! (grammar/src/fmt.rs). Directories are searched for `.miles` files. A file with syntax errors
//! is left alone and its errors printed. Files are replaced atomically (a temporary file in the
//! same directory, then a rename), so an interrupted run never leaves half a recipe.
//!
//! Exit codes: 0 all formatted (or, with --check, nothing to change); 1 a file needs formatting
//! (--check) or has syntax errors; 2 a file could not be read or written.

use crate::diagnostics::emit;
use crate::DiagFormat;
use miles_compiler::Sources;
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct Args {
    /// Files or directories (searched for `.miles` files).
    #[arg(required = true)]
    pub files: Vec<String>,
    /// Change nothing; list the files that would change and exit 1 if any.
    #[arg(long)]
    pub check: bool,
}

pub fn run(args: Args) -> u8 {
    let mut code = 0u8;
    let mut files = Vec::new();
    for f in &args.files {
        collect(Path::new(f), &mut files);
    }
    if files.is_empty() {
        eprintln!("error: no .miles files in {}", args.files.join(", "));
        return 2;
    }
    let mut changed = 0usize;
    for path in &files {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("error: {}: {e}", path.display());
                code = code.max(2);
                continue;
            }
        };
        match miles_grammar::fmt::format(&text) {
            Err(diags) => {
                let mut sources = Sources::default();
                sources.add(path.display().to_string(), text);
                emit(&sources, &diags, DiagFormat::Auto);
                eprintln!("error: {} has syntax errors; not formatted", path.display());
                code = code.max(1);
            }
            Ok(formatted) if formatted == text => {}
            Ok(formatted) => {
                changed += 1;
                if args.check {
                    println!("would reformat {}", path.display());
                    code = code.max(1);
                } else if let Err(e) = crate::files::DiskFs::write_atomic(path, formatted.as_bytes()) {
                    eprintln!("error: {}: {e}", path.display());
                    code = code.max(2);
                } else {
                    println!("formatted {}", path.display());
                }
            }
        }
    }
    let verb = if args.check { "would reformat" } else { "reformatted" };
    eprintln!("{} file(s) checked, {changed} {verb}", files.len());
    code
}

fn collect(p: &Path, out: &mut Vec<PathBuf>) {
    if p.is_dir() {
        let mut entries: Vec<PathBuf> =
            std::fs::read_dir(p).into_iter().flatten().flatten().map(|e| e.path()).collect();
        entries.sort();
        for e in entries {
            if e.is_dir() || e.extension().is_some_and(|x| x == "miles") {
                collect(&e, out);
            }
        }
    } else {
        out.push(p.to_path_buf());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_atomically_and_keeps_nothing_behind() {
        let dir = std::env::temp_dir().join(format!("miles-fmt-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let f = dir.join("r.miles");
        std::fs::write(&f, "const  x=1\n").expect("write");
        let code = run(Args { files: vec![dir.display().to_string()], check: true });
        assert_eq!(code, 1);
        assert_eq!(std::fs::read_to_string(&f).ok().as_deref(), Some("const  x=1\n"));
        let code = run(Args { files: vec![f.display().to_string()], check: false });
        assert_eq!(code, 0);
        assert_eq!(std::fs::read_to_string(&f).ok().as_deref(), Some("const x = 1\n"));
        let left: Vec<_> = std::fs::read_dir(&dir).into_iter().flatten().flatten().collect();
        assert_eq!(left.len(), 1, "temporary files left behind");
        std::fs::write(&f, "const x = (1 +\n").expect("write");
        assert_eq!(run(Args { files: vec![f.display().to_string()], check: false }), 1);
        assert_eq!(std::fs::read_to_string(&f).ok().as_deref(), Some("const x = (1 +\n"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
