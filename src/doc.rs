//! `miles doc [DIR]`: a package's reference (schemas, stage kinds, fields with types, units and
//! defaults, checks with their messages, recipes) from its `///` comments, as Markdown and
//! static HTML. `miles doc --std` writes the standard library's reference the same way.

use miles_package::doc;
use std::path::Path;

#[derive(clap::Args)]
pub struct Args {
    /// The package's directory (default: the one holding the nearest miles.toml).
    #[arg(default_value = ".")]
    pub dir: String,
    /// Document the standard library instead of a package.
    #[arg(long = "std")]
    pub stdlib: bool,
    /// Where to write NAME.md and NAME.html (default: target/doc under the package).
    #[arg(long)]
    pub out: Option<String>,
}

pub fn run(args: Args) -> u8 {
    let (name, title, summary, modules, default_out) = if args.stdlib {
        (
            "stdlib".to_string(),
            doc::STDLIB_TITLE.to_string(),
            doc::STDLIB_SUMMARY.to_string(),
            doc::stdlib_modules(),
            "docs".to_string(),
        )
    } else {
        let root = match crate::packages::project_root(&args.dir) {
            Ok(r) => r,
            Err(c) => return c,
        };
        let mut sources = miles_compiler::Sources::default();
        let p = match miles_package::project::open(&root, &mut sources) {
            Ok(p) => p,
            Err(d) => {
                crate::diagnostics::emit(&sources, &[d], crate::DiagFormat::Auto);
                return 1;
            }
        };
        let mut files = Vec::new();
        if let Err(e) = miles_package::hash::walk(Path::new(&root), Path::new(&root), &mut files) {
            eprintln!("error: cannot list {root}: {e}");
            return 1;
        }
        files.retain(|f| f.ends_with(".miles") && !f.starts_with("vendor/") && !f.starts_with("target/"));
        files.sort();
        let modules: Vec<(String, String)> = files
            .iter()
            .filter_map(|f| {
                let text = std::fs::read_to_string(Path::new(&root).join(f)).ok()?;
                Some((format!("{}/{}", p.manifest.name, f.trim_end_matches(".miles")), text))
            })
            .collect();
        let title = format!("{} {}", p.manifest.name, p.manifest.version);
        let summary = p.manifest.description.clone().unwrap_or_default();
        (p.manifest.name.clone(), title, summary, modules, miles_compiler::fs::join(&root, "target/doc"))
    };
    let out = args.out.unwrap_or(default_out);
    if let Err(e) = std::fs::create_dir_all(&out) {
        eprintln!("error: cannot create {out}: {e}");
        return 1;
    }
    for (ext, text) in
        [("md", doc::markdown(&title, &summary, &modules)), ("html", doc::html(&title, &summary, &modules))]
    {
        let path = format!("{out}/{name}.{ext}");
        if let Err(e) = crate::files::write_atomic(&path, text.as_bytes()) {
            eprintln!("error: cannot write {path}: {e}");
            return 1;
        }
        eprintln!("wrote {path}");
    }
    0
}
