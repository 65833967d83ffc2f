//! A project: the package whose `miles.toml` is found above the files being compiled, and the
//! build of its dependencies: from `miles.lock` when every entry checks out against the
//! manifests, the files and the repositories (`verify`), otherwise resolved again and the lock
//! rewritten.

use crate::cache::Cache;
use crate::lock::{self, Lock, Locked};
use crate::manifest::{self, Manifest};
use crate::resolve::{self, Index, Origin, Pin};
use crate::verify::{self, LockFile, Verdict};
use crate::{git, hash};
use miles_compiler::fs::{join, normalize};
use miles_compiler::program::{PackageRoot, Packages};
use miles_compiler::Sources;
use miles_grammar::diag::Diagnostic;
use miles_grammar::diag::ErrorCode;
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

/// Where `miles vendor` puts dependencies, under the project root.
pub const VENDOR: &str = "vendor";

pub struct Project {
    /// The directory of `miles.toml`, as a module-key prefix (`.` for the current directory).
    pub root: String,
    pub manifest: Manifest,
}

/// How `build` treats `miles.lock`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Use the lock while it matches the manifest; resolve (and write it) only when it does not.
    Locked,
    /// Resolve again with fresh tags: every package (`None`) or only the named one.
    Update(Option<String>),
    /// `Locked` for an editor: never writes `miles.lock` and never reaches a network. A lock
    /// that is missing or stale is resolved in memory from what is already here (path
    /// dependencies, the cache's mirrors and sources); anything not here is E0114 asking for
    /// `miles fetch`.
    Frozen,
}

pub struct Package {
    pub name: String,
    pub version: String,
    /// Where its files are: a key prefix (a cache directory or a path relative to the project).
    pub root: String,
    pub locked: Locked,
}

pub struct Build {
    pub packages: Vec<Package>,
    /// The map the compiler resolves imports through.
    pub map: Packages,
    /// The lock as it stands after the build (written when it changed, unless `Mode::Frozen`).
    pub lock: Lock,
    /// Whether `lock` differs from `miles.lock` on disk.
    pub lock_changed: bool,
}

/// The directory (as a module key) of the nearest `miles.toml` at or above `key`'s directory.
pub fn find(key: &str) -> Option<String> {
    let mut dir = miles_compiler::fs::parent_dir(&normalize(key));
    loop {
        if Path::new(&dir).join(manifest::FILE).is_file() {
            return Some(dir);
        }
        let up =
            if dir == "." || dir.ends_with("..") { join(&dir, "..") } else { miles_compiler::fs::parent_dir(&dir) };
        // Stop at the file system's root.
        let abs_up = std::fs::canonicalize(&up).ok()?;
        if std::fs::canonicalize(&dir).ok()? == abs_up {
            return None;
        }
        dir = up;
    }
}

pub(crate) fn read_manifest(dir: &str, sources: &mut Sources) -> Result<Manifest, Diagnostic> {
    let path = join(dir, manifest::FILE);
    let text = std::fs::read_to_string(&path).map_err(|e| {
        Diagnostic::error(ErrorCode::E0112, format!("cannot read {path}: {e}"))
            .with_help("a package is a directory holding a miles.toml (see docs/packages.md)")
    })?;
    let file = sources.add(path, text);
    let text = &sources.files[file.0 as usize].text;
    Manifest::parse(file, text)
}

pub fn open(root: &str, sources: &mut Sources) -> Result<Project, Diagnostic> {
    let root = normalize(root);
    let manifest = read_manifest(&root, sources)?;
    Ok(Project { root, manifest })
}

/// Builds the project's dependencies (see `Mode`), writing `miles.lock` when it changed.
pub fn build(project: &Project, cache: &Cache, mode: &Mode, sources: &mut Sources) -> Result<Build, Diagnostic> {
    let lock_path = join(&project.root, lock::FILE);
    let old = match std::fs::read_to_string(&lock_path) {
        Ok(text) => {
            let file = sources.add(lock_path.clone(), text);
            Some((Lock::parse(file, &sources.files[file.0 as usize].text)?, file))
        }
        Err(_) => None,
    };
    let mut checked = None;
    if let (Some((l, file)), Mode::Locked | Mode::Frozen) = (&old, mode) {
        let text = sources.files[file.0 as usize].text.clone();
        let lf = LockFile { lock: l, file: *file, text: &text };
        if let Verdict::Use(packages) = verify::check(project, cache, mode, &lf, sources)? {
            checked = Some((l.clone(), packages));
        }
    }
    let (lock, packages) = match checked {
        Some(used) => used,
        None => {
            let lock = resolve_lock(project, cache, mode, old.as_ref().map(|(l, _)| l), sources)?;
            let packages =
                lock.packages.iter().map(|l| materialize(project, cache, mode, l, None)).collect::<Result<_, _>>()?;
            (lock, packages)
        }
    };
    let mut roots = vec![PackageRoot {
        name: project.manifest.name.clone(),
        root: project.root.clone(),
        dependencies: project.manifest.dependencies.keys().cloned().collect(),
        modules: Vec::new(),
    }];
    roots.extend(packages.iter().map(|p| PackageRoot {
        name: p.name.clone(),
        root: p.root.clone(),
        dependencies: p.locked.dependencies.clone(),
        modules: Vec::new(),
    }));
    // House rules: the project's own and every dependency's (a platform's rules reach its users).
    let mut rules = house_rules(&project.manifest);
    for p in &packages {
        let mut scratch = Sources::default();
        let m = read_manifest(&p.root, &mut scratch)?;
        rules.extend(house_rules(&m));
    }
    let lock_changed = old.as_ref().map(|(l, _)| l) != Some(&lock);
    if lock_changed && *mode != Mode::Frozen {
        miles_compiler::fs::DiskFs::write_atomic(Path::new(&lock_path), lock.render().as_bytes()).map_err(|e| {
            Diagnostic::error(ErrorCode::E0114, format!("cannot write {lock_path}: {e}"))
                .with_help("check the directory is writable")
        })?;
    }
    Ok(Build { packages, map: Packages { roots, rules }, lock, lock_changed })
}

/// Resolves the manifest again (the lock on disk, if any, gives only pins: commits resolution
/// keeps while the tags still name them) into a fresh lock, each git source fetched and hashed.
fn resolve_lock(
    project: &Project,
    cache: &Cache,
    mode: &Mode,
    old: Option<&Lock>,
    sources: &mut Sources,
) -> Result<Lock, Diagnostic> {
    let pins: BTreeMap<String, Pin> = match (mode, old) {
        (Mode::Update(None), _) | (_, None) => BTreeMap::new(),
        (Mode::Update(Some(n)), Some(l)) => pins_of(l, Some(n)),
        (Mode::Locked | Mode::Frozen, Some(l)) => pins_of(l, None),
    };
    let mut index = GitIndex {
        cache,
        project_root: project.root.clone(),
        refresh: matches!(mode, Mode::Update(_)),
        offline: *mode == Mode::Frozen,
        refreshed: HashSet::new(),
        sources,
    };
    let resolved = resolve::resolve(&project.manifest, &mut index, &pins).map_err(|d| match mode {
        // Offline, an unreachable repository is one not fetched yet.
        Mode::Frozen if d.code == ErrorCode::E0114 => d.with_help(FETCH_HELP),
        _ => d,
    })?;
    let mut packages = Vec::new();
    for r in resolved {
        let (source, reference, commit, hash) = match &r.origin {
            Origin::Path(dir) => (format!("path+{dir}"), None, None, None),
            Origin::Git { url, reference, commit } => {
                let dir = source(cache, mode, &r.name, url, commit)?;
                let h = hash::tree(&dir).map_err(|e| tree_error(&r.name, e))?;
                (format!("git+{url}"), Some(reference.clone()), Some(commit.clone()), Some(h))
            }
        };
        packages.push(Locked {
            name: r.name,
            version: r.version.to_string(),
            source,
            reference,
            commit,
            hash,
            dependencies: r.dependencies,
        });
    }
    Ok(Lock { version: 1, packages })
}

/// Where one locked package's files are: a path dependency's directory, or a git package's
/// exported commit (the `vendor/` copy when there is one, else the cache, fetched when missing
/// outside `Mode::Frozen`) whose files must hash to the entry's `hash` (E0116, at the entry's
/// line when `lf` is the lock read from disk).
pub(crate) fn materialize(
    project: &Project,
    cache: &Cache,
    mode: &Mode,
    l: &Locked,
    lf: Option<&LockFile>,
) -> Result<Package, Diagnostic> {
    let root = if let Some(dir) = l.source.strip_prefix("path+") {
        join(&project.root, dir)
    } else if let (Some(url), Some(commit), Some(want)) = (l.source.strip_prefix("git+"), &l.commit, &l.hash) {
        // `miles vendor` copies: used instead of the cache, checked against the same hash.
        let vendored = Path::new(&project.root).join(VENDOR).join(&l.name);
        let dir = if vendored.is_dir() { vendored } else { source(cache, mode, &l.name, url, commit)? };
        let found = hash::tree(&dir).map_err(|e| tree_error(&l.name, e))?;
        if *want != found {
            let mut d = Diagnostic::error(
                ErrorCode::E0116,
                format!("the sources of `{}` {} changed: miles.lock expects {want}, found {found}", l.name, l.version),
            )
            .with_help(format!(
                "miles.lock was edited, or the copy ({}) or the tag upstream was altered: restore miles.lock, or delete that directory to fetch it again; if the change is wanted, `miles update {}`",
                dir.display(),
                l.name
            ));
            if let Some(lf) = lf {
                d = d.with_primary(lf.span(&l.name, "hash"), "the hash miles.lock records");
            }
            return Err(d);
        }
        dir.to_string_lossy().into_owned()
    } else {
        // `Lock::parse` refuses such entries; a lock built in memory never has one.
        return Err(Diagnostic::error(
            ErrorCode::E0120,
            format!("{}: `{}` has no usable source, commit and hash", lock::FILE, l.name),
        )
        .with_help("delete miles.lock and run `miles update`"));
    };
    Ok(Package { name: l.name.clone(), version: l.version.clone(), root, locked: l.clone() })
}

/// A manifest's `[[rule]]`s for the compiler, each named `PACKAGE/miles.toml:LINE`.
fn house_rules(m: &Manifest) -> Vec<miles_compiler::program::HouseRule> {
    m.rules
        .iter()
        .map(|r| miles_compiler::program::HouseRule {
            stage: r.stage.clone(),
            check: r.check.clone(),
            message: r.message.clone(),
            help: r.help.clone(),
            warn: r.warn,
            origin: format!("{}/{}:{}", m.name, manifest::FILE, r.line),
        })
        .collect()
}

/// Lists each dependency's modules (`grpo/base` for `grpo/base.miles`): what an editor offers
/// after `import NAME/`. The project's own root (the first) is left out: its modules are
/// imported by relative paths, and it may be large.
pub fn list_modules(map: &mut Packages) {
    for r in map.roots.iter_mut().skip(1) {
        let mut files = Vec::new();
        // An unreadable directory offers nothing; the build itself reports what is missing.
        let _ = hash::walk(Path::new(&r.root), Path::new(&r.root), &mut files);
        r.modules = files.iter().filter_map(|f| f.strip_suffix(".miles")).map(str::to_string).collect();
        r.modules.sort();
    }
}

fn pins_of(lock: &Lock, except: Option<&String>) -> BTreeMap<String, Pin> {
    lock.packages
        .iter()
        .filter(|p| Some(&p.name) != except)
        .filter_map(|p| p.commit.clone().map(|commit| (p.name.clone(), Pin { commit })))
        .collect()
}

/// The files of a locked revision: fetched when missing, except in `Mode::Frozen`.
fn source(cache: &Cache, mode: &Mode, name: &str, url: &str, commit: &str) -> Result<PathBuf, Diagnostic> {
    if *mode != Mode::Frozen {
        return fetch(cache, name, url, commit);
    }
    cache.cached_source(name, url, commit).ok_or_else(|| not_fetched(name, &format!("{url} at {commit}")))
}

/// What an offline build (`Mode::Frozen`) says when the cache lacks something.
pub(crate) fn not_fetched(name: &str, what: &str) -> Diagnostic {
    Diagnostic::error(ErrorCode::E0114, format!("`{name}` ({what}) is not in the cache")).with_help(FETCH_HELP)
}

const FETCH_HELP: &str = "run `miles fetch` in the package (the editor never fetches)";

fn fetch(cache: &Cache, name: &str, url: &str, commit: &str) -> Result<PathBuf, Diagnostic> {
    cache.source(name, url, commit).map_err(|why| fetch_error(name, url, commit, &why))
}

pub(crate) fn fetch_error(name: &str, url: &str, commit: &str, why: &str) -> Diagnostic {
    Diagnostic::error(ErrorCode::E0114, format!("cannot fetch `{name}` from {url} at {commit}: {why}"))
        .with_help("check the repository is reachable; nothing was written to the cache")
}

/// A package's files that have no hash: unreadable (E0114), or holding a symbolic link (E0122).
fn tree_error(name: &str, e: hash::TreeError) -> Diagnostic {
    match e {
        hash::TreeError::Io(e) => {
            Diagnostic::error(ErrorCode::E0114, format!("cannot read the sources of `{name}`: {e}"))
                .with_help("check the cache directory")
        }
        hash::TreeError::Symlink(path) => Diagnostic::error(
            ErrorCode::E0122,
            format!(
                "the sources of `{name}` hold a symbolic link, `{path}`: the lock's hash cannot pin what it points at"
            ),
        )
        .with_help(format!(
            "replace the link by the file in the repository of `{name}` (packages may not hold symbolic links)"
        )),
    }
}

/// Copies every dependency's files into `dir/NAME` (for `miles vendor`), each through a
/// temporary directory and a rename.
pub fn vendor(build: &Build, dir: &Path) -> std::io::Result<Vec<(String, PathBuf)>> {
    std::fs::create_dir_all(dir)?;
    let mut out = Vec::new();
    for p in &build.packages {
        // The name becomes a path below `dir` (and one removed there): only a package name may.
        if !manifest::valid_name(&p.name) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("`{}` is not a package name", p.name),
            ));
        }
        let dest = dir.join(&p.name);
        let tmp = dir.join(format!(".{}.tmp.{}", p.name, std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        let mut files = Vec::new();
        hash::walk(Path::new(&p.root), Path::new(&p.root), &mut files)?;
        for f in &files {
            let to = tmp.join(f);
            if let Some(parent) = to.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::copy(Path::new(&p.root).join(f), &to)?;
        }
        std::fs::create_dir_all(&tmp)?;
        // The old copy moves aside before the new one moves in, so `dest` is never half-written.
        let old = dir.join(format!(".{}.old.{}", p.name, std::process::id()));
        if dest.exists() {
            std::fs::rename(&dest, &old)?;
        }
        std::fs::rename(&tmp, &dest)?;
        let _ = std::fs::remove_dir_all(&old);
        out.push((p.name.clone(), dest));
    }
    Ok(out)
}

/// The index over real repositories: tags and files come from the cache's mirrors.
struct GitIndex<'a> {
    cache: &'a Cache,
    project_root: String,
    /// Fetch each repository once before reading its tags (`miles update`).
    refresh: bool,
    /// Read only what the cache holds (`Mode::Frozen`).
    offline: bool,
    refreshed: HashSet<String>,
    sources: &'a mut Sources,
}

impl GitIndex<'_> {
    fn db(&mut self, url: &str) -> Result<PathBuf, String> {
        if self.offline {
            return self.cache.cached_db(url).ok_or_else(|| "not in the cache: run `miles fetch`".to_string());
        }
        let refresh = self.refresh && self.refreshed.insert(url.to_string());
        self.cache.db(url, refresh)
    }
}

impl Index for GitIndex<'_> {
    fn tags(&mut self, url: &str) -> Result<Vec<(String, String)>, String> {
        let db = self.db(url)?;
        git::tags(&db)
    }
    fn commit(&mut self, url: &str, reference: &str) -> Result<String, String> {
        let db = self.db(url)?;
        git::commit_of(&db, reference)
    }
    fn manifest_at(&mut self, name: &str, url: &str, commit: &str) -> Result<Manifest, Diagnostic> {
        let mode = if self.offline { Mode::Frozen } else { Mode::Locked };
        let dir = source(self.cache, &mode, name, url, commit)?;
        read_manifest(&dir.to_string_lossy(), self.sources)
    }
    fn manifest_in(&mut self, dir: &str) -> Result<Manifest, Diagnostic> {
        read_manifest(&join(&self.project_root, dir), self.sources)
    }
}
