//! Whether a `miles.lock` read from disk may be used, checked entry by entry rather than believed:
//! a pull request that edits only the lock must not change the code a build runs.
//!
//! The walk starts at the project's manifest and follows only what manifests declare (each
//! dependency's manifest read from its files, whose hash is checked first), so a lock can never
//! make a build fetch a URL nobody declared. For each declared dependency the lock's entry must
//! be the one the manifest asks for (source, tag, branch, revision, or a version the requirement
//! accepts), its files must hash to the lock's `hash` (E0116), its commit must be the one its
//! reference names in the repository (E0120; a branch's commit must be on the branch), and its
//! name, version and dependency list must be what its manifest says. An entry the walk never
//! reaches, or one that no longer fits the manifests, makes the lock stale: it is resolved again
//! (which trusts nothing from the lock but pins, themselves checked against the tags).

use crate::cache::Cache;
use crate::git;
use crate::lock::{self, Lock, Locked};
use crate::manifest::{Dependency, GitRef, Manifest};
use crate::project::{self, Mode, Package, Project, VENDOR};
use miles_compiler::fs::join;
use miles_compiler::Sources;
use miles_grammar::diag::{Diagnostic, ErrorCode, FileId, Span};
use std::collections::HashSet;
use std::path::Path;

/// A lock as read from disk: the parsed entries and where they were written.
pub struct LockFile<'a> {
    pub lock: &'a Lock,
    pub file: FileId,
    pub text: &'a str,
}

impl LockFile<'_> {
    /// The line of `name`'s entry that sets `key`.
    pub fn span(&self, name: &str, key: &str) -> Span {
        let (start, end) = self.lock.entry_line(self.text, name, key);
        Span::new(self.file, start, end)
    }
}

/// What the lock on disk is worth to this build.
pub enum Verdict {
    /// Every entry checked out: the build's packages, in the lock's order.
    Use(Vec<Package>),
    /// The manifests ask for something else (a dependency added, a requirement changed): resolve.
    Stale,
}

/// Checks `lf` against the manifests, the files and the repositories (see the module's doc).
pub fn check(
    project: &Project,
    cache: &Cache,
    mode: &Mode,
    lf: &LockFile,
    sources: &mut Sources,
) -> Result<Verdict, Diagnostic> {
    // (where the declaring package's files are, relative to the project, or `None` from git; its manifest)
    let mut queue: Vec<(Option<String>, Manifest)> = vec![(Some(".".into()), project.manifest.clone())];
    let mut done: Vec<Package> = Vec::new();
    let mut seen: HashSet<String> = HashSet::new();
    while let Some((dir, m)) = queue.pop() {
        for (name, dep) in &m.dependencies {
            let Some(entry) = lf.lock.get(name) else { return Ok(Verdict::Stale) };
            if !declares(dep, dir.as_deref(), entry) {
                return Ok(Verdict::Stale);
            }
            if !seen.insert(name.clone()) {
                continue;
            }
            // The commit is checked before its files are exported: a commit its reference does
            // not name never reaches the cache.
            if let Dependency::Git { at, .. } = dep {
                let vendored = Path::new(&project.root).join(VENDOR).join(name);
                // An air-gapped copy has no repository to ask; its files still answer to the hash.
                if !vendored.is_dir() {
                    reference_names_commit(cache, mode, entry, at, lf)?;
                }
            }
            let package = project::materialize(project, cache, mode, entry, Some(lf))?;
            let manifest = project::read_manifest(&package.root, sources)?;
            if !describes(entry, dep, &manifest) {
                return Ok(Verdict::Stale);
            }
            let next = entry.source.strip_prefix("path+").map(str::to_string);
            queue.push((next, manifest));
            done.push(package);
        }
    }
    if done.len() != lf.lock.packages.len() {
        return Ok(Verdict::Stale);
    }
    let order = |p: &Package| lf.lock.packages.iter().position(|l| l.name == p.name);
    done.sort_by_key(order);
    Ok(Verdict::Use(done))
}

/// Whether `entry` is the package `dep` asks for, declared by a package whose files are at `dir`
/// (relative to the project; `None` for a git package, which may not declare path dependencies).
fn declares(dep: &Dependency, dir: Option<&str>, entry: &Locked) -> bool {
    match dep {
        Dependency::Path(p) => dir.is_some_and(|d| entry.source == format!("path+{}", join(d, p))),
        Dependency::Git { url, at } => {
            entry.source == format!("git+{url}")
                && match at {
                    GitRef::Version(req) => semver::VersionReq::parse(req)
                        .ok()
                        .zip(semver::Version::parse(&entry.version).ok())
                        .is_some_and(|(r, v)| r.matches(&v)),
                    GitRef::Tag(t) | GitRef::Branch(t) | GitRef::Rev(t) => entry.reference.as_deref() == Some(t),
                }
        }
    }
}

/// Whether the entry says what the package's own manifest says: its name, its dependencies and
/// its version (the tag's, when chosen through a semver tag, else the manifest's).
fn describes(entry: &Locked, dep: &Dependency, m: &Manifest) -> bool {
    let tag_version = match dep {
        Dependency::Git { at: GitRef::Tag(_) | GitRef::Version(_), .. } => {
            entry.reference.as_deref().and_then(crate::resolve::tag_version)
        }
        _ => None,
    };
    let version = tag_version.unwrap_or_else(|| m.version.clone());
    let mut deps = entry.dependencies.clone();
    deps.sort();
    m.name == entry.name && semver::Version::parse(&entry.version).ok() == Some(version) && {
        let declared: Vec<&String> = m.dependencies.keys().collect();
        deps.iter().collect::<Vec<_>>() == declared
    }
}

/// E0120 unless the entry's commit is what its reference names in the repository: the tag's
/// commit, a commit on the branch, or the revision's. A locked build whose mirror disagrees
/// fetches it once first (the lock may be newer than the mirror); an editor's never fetches.
fn reference_names_commit(
    cache: &Cache,
    mode: &Mode,
    entry: &Locked,
    at: &GitRef,
    lf: &LockFile,
) -> Result<(), Diagnostic> {
    let (Some(url), Some(commit), Some(reference)) =
        (entry.source.strip_prefix("git+"), entry.commit.as_deref(), entry.reference.as_deref())
    else {
        return Err(untrusted(entry, lf, "source", "it has no git source, commit or reference".into()));
    };
    let mut refresh = false;
    loop {
        let db = if *mode == Mode::Frozen {
            cache.cached_db(url).ok_or_else(|| project::not_fetched(&entry.name, url))?
        } else {
            cache.db(url, refresh).map_err(|why| project::fetch_error(&entry.name, url, commit, &why))?
        };
        let why = match at {
            GitRef::Tag(_) | GitRef::Version(_) => match git::tags(&db) {
                Ok(tags) => match tags.iter().find(|(t, _)| t == reference) {
                    Some((_, c)) if c == commit => return Ok(()),
                    Some((_, c)) => format!("its tag `{reference}` names commit {c}"),
                    None => format!("the repository has no tag `{reference}`"),
                },
                Err(e) => e,
            },
            GitRef::Branch(b) => {
                if git::is_ancestor(&db, commit, &format!("refs/heads/{b}")) {
                    return Ok(());
                }
                format!("the commit is not on its branch `{b}`")
            }
            GitRef::Rev(r) => match git::commit_of(&db, r) {
                Ok(c) if c == commit => return Ok(()),
                Ok(c) => format!("its revision `{r}` names commit {c}"),
                Err(e) => e,
            },
        };
        if *mode == Mode::Frozen || refresh {
            return Err(untrusted(entry, lf, "commit", format!("{url} does not back commit {commit}: {why}")));
        }
        refresh = true;
    }
}

fn untrusted(entry: &Locked, lf: &LockFile, key: &str, why: String) -> Diagnostic {
    Diagnostic::error(ErrorCode::E0120, format!("{}: `{}` {} cannot be trusted: {why}", lock::FILE, entry.name, entry.version))
        .with_primary(lf.span(&entry.name, key), "this entry")
        .with_help(format!(
            "miles.lock was edited, or the reference moved upstream: restore miles.lock from version control, or review the repository and run `miles update {}`",
            entry.name
        ))
}
