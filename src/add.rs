//! `miles add NAME --git URL --tag v1` / `--path DIR`: declares a dependency in miles.toml and
//! resolves it into miles.lock (the manifest is written only when resolution succeeds).

use crate::diagnostics::emit;
use crate::DiagFormat;
use miles_compiler::Sources;
use miles_package::cache::Cache;
use miles_package::manifest::{self, Dependency, GitRef, Manifest};
use miles_package::project::{self, Mode, Project};

#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["git", "path"])))]
#[command(group(clap::ArgGroup::new("at").args(["tag", "branch", "rev", "version"])))]
pub struct Args {
    /// The package's name (the first segment of its imports).
    pub name: String,
    /// A git repository URL: `https://...`, `ssh://...`, `[user@]host:path`, `file:///...` or an
    /// absolute path (others are refused, E0121).
    #[arg(long)]
    pub git: Option<String>,
    /// A directory, relative to the project root.
    #[arg(long, conflicts_with_all = ["tag", "branch", "rev", "version"])]
    pub path: Option<String>,
    #[arg(long, requires = "git")]
    pub tag: Option<String>,
    #[arg(long, requires = "git")]
    pub branch: Option<String>,
    #[arg(long, requires = "git")]
    pub rev: Option<String>,
    /// A semver requirement on the repository's tags (`^1.0`); the default with `--git`.
    #[arg(long, requires = "git")]
    pub version: Option<String>,
}

// The one diagnostic type is large; it ends the command, so its size does not matter here.
#[allow(clippy::result_large_err)]
pub fn run(args: Args) -> u8 {
    let root = match crate::packages::project_root(".") {
        Ok(r) => r,
        Err(c) => return c,
    };
    let dep = match (&args.git, &args.path) {
        (_, Some(p)) => Dependency::Path(p.clone()),
        (Some(url), None) => {
            let at = if let Some(t) = &args.tag {
                GitRef::Tag(t.clone())
            } else if let Some(b) = &args.branch {
                GitRef::Branch(b.clone())
            } else if let Some(r) = &args.rev {
                GitRef::Rev(r.clone())
            } else {
                GitRef::Version(args.version.clone().unwrap_or_else(|| "*".into()))
            };
            Dependency::Git { url: url.clone(), at }
        }
        (None, None) => return 2,
    };
    let path = miles_compiler::fs::join(&root, manifest::FILE);
    let Ok(text) = std::fs::read_to_string(&path) else {
        eprintln!("error: cannot read {path}");
        return 1;
    };
    let new_text = manifest::with_dependency(&text, &args.name, &dep);
    let mut sources = Sources::default();
    let file = sources.add(path.clone(), new_text.clone());
    let result = Manifest::parse(file, &new_text).and_then(|m| {
        let p = Project { root: root.clone(), manifest: m };
        project::build(&p, &Cache::from_env(), &Mode::Update(Some(args.name.clone())), &mut sources)
    });
    match result {
        Ok(b) => {
            if let Err(e) = crate::files::write_atomic(&path, new_text.as_bytes()) {
                eprintln!("error: cannot write {path}: {e}");
                return 1;
            }
            let line = crate::packages::describe(&b).into_iter().find(|l| l.starts_with(&format!("{} ", args.name)));
            eprintln!("added {}", line.unwrap_or(args.name));
            0
        }
        Err(d) => {
            emit(&sources, &[d], DiagFormat::Auto);
            eprintln!("miles add: {path} left unchanged");
            1
        }
    }
}
