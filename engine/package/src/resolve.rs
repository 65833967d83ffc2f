//! Resolution: one version of every package of a build, chosen from the requirements of
//! everything that depends on it (semver on tags: the highest matching one, or the version the
//! lock pins while it still matches). Pure: repositories are reached through `Index`, so the
//! benchmark and the tests resolve in memory.

use crate::manifest::{Dependency, GitRef, Manifest};
use miles_grammar::diag::Diagnostic;
use miles_grammar::diag::ErrorCode;
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;

/// What resolution needs from the world.
pub trait Index {
    /// Tags of a repository and the commit each names.
    fn tags(&mut self, url: &str) -> Result<Vec<(String, String)>, String>;
    /// The commit a branch or revision names.
    fn commit(&mut self, url: &str, reference: &str) -> Result<String, String>;
    /// The manifest of a repository at a commit.
    fn manifest_at(&mut self, name: &str, url: &str, commit: &str) -> Result<Manifest, Diagnostic>;
    /// The manifest of a directory (a path dependency), relative to the project root.
    fn manifest_in(&mut self, dir: &str) -> Result<Manifest, Diagnostic>;
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// A directory relative to the project root.
    Path(String),
    Git {
        url: String,
        reference: String,
        commit: String,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    pub name: String,
    pub version: semver::Version,
    pub origin: Origin,
    pub dependencies: Vec<String>,
}

/// A pin from the lock: the version resolution keeps while every requirement still accepts it.
#[derive(Clone, Debug)]
pub struct Pin {
    pub commit: String,
}

#[derive(Clone)]
struct Requirement {
    dep: Dependency,
    /// Who asked: the root package first, this package last (shared: cloned on every pick).
    chain: Rc<Vec<String>>,
}

pub(crate) fn tag_version(tag: &str) -> Option<semver::Version> {
    semver::Version::parse(tag.strip_prefix('v').unwrap_or(tag)).ok()
}

fn chain_text(chain: &[String]) -> String {
    chain.join(" -> ")
}

/// Resolves every package the root manifest needs, directly or not. `root_dir` is where the root
/// manifest lives, relative to the project root (`.`).
pub fn resolve(
    root: &Manifest,
    index: &mut dyn Index,
    pins: &BTreeMap<String, Pin>,
) -> Result<Vec<Resolved>, Diagnostic> {
    let mut reqs: BTreeMap<String, Vec<Requirement>> = BTreeMap::new();
    // Each pass walks the graph with the requirements known so far; a requirement found late
    // can change an earlier choice, and then the walk starts again with it known.
    for _ in 0..64 {
        let mut w =
            Walk { index, pins, reqs: &mut reqs, chosen: BTreeMap::new(), manifests: HashMap::new(), changed: false };
        let stack = vec![(root.name.clone(), ".".to_string())];
        w.expand(root, &stack)?;
        if !w.changed {
            let mut out: Vec<Resolved> = w.chosen.into_values().collect();
            out.sort_by(|a, b| a.name.cmp(&b.name));
            return Ok(out);
        }
    }
    Err(Diagnostic::error(ErrorCode::E0118, "dependency resolution did not settle")
        .with_help("report this with your miles.toml"))
}

struct Walk<'a> {
    index: &'a mut dyn Index,
    pins: &'a BTreeMap<String, Pin>,
    reqs: &'a mut BTreeMap<String, Vec<Requirement>>,
    chosen: BTreeMap<String, Resolved>,
    manifests: HashMap<(String, String), Manifest>,
    changed: bool,
}

impl Walk<'_> {
    /// `stack`: the chain from the root to `m`, with each package's directory (for path deps).
    fn expand(&mut self, m: &Manifest, stack: &[(String, String)]) -> Result<(), Diagnostic> {
        for (name, dep) in &m.dependencies {
            let chain = || -> Vec<String> {
                stack.iter().map(|(n, _)| n.clone()).chain(std::iter::once(name.clone())).collect()
            };
            if let Some(pos) = stack.iter().position(|(n, _)| n == name) {
                let chain = chain();
                return Err(Diagnostic::error(ErrorCode::E0113, format!("dependency cycle: {}", chain_text(&chain[pos..])))
                    .with_help("packages may not depend on themselves, directly or through others: move what both need into a third package"));
            }
            // Path dependencies are relative to the package that declares them.
            let dep = match dep {
                Dependency::Path(p) => {
                    let here = &stack[stack.len() - 1].1;
                    if here.starts_with("git+") {
                        return Err(Diagnostic::error(
                            ErrorCode::E0112,
                            format!("`{}` (from git) has a path dependency `{name}`", stack[stack.len() - 1].0),
                        )
                        .with_help("a package fetched from git can depend only on other git packages"));
                    }
                    Dependency::Path(miles_compiler::fs::join(here, p))
                }
                d => d.clone(),
            };
            let list = self.reqs.entry(name.clone()).or_default();
            if !list.iter().any(|r| r.dep == dep) {
                list.push(Requirement { dep: dep.clone(), chain: Rc::new(chain()) });
            }
            let pick = self.pick(name)?;
            if let Some(prev) = self.chosen.get(name) {
                if prev.origin != pick.0 {
                    self.changed = true;
                }
                continue;
            }
            let (origin, version_hint) = pick;
            let (manifest, dir) = match &origin {
                Origin::Path(dir) => (self.index.manifest_in(dir)?, dir.clone()),
                Origin::Git { url, commit, .. } => {
                    let key = (url.clone(), commit.clone());
                    let m = match self.manifests.get(&key) {
                        Some(m) => m.clone(),
                        None => {
                            let m = self.index.manifest_at(name, url, commit)?;
                            self.manifests.insert(key, m.clone());
                            m
                        }
                    };
                    (m, format!("git+{url}"))
                }
            };
            if manifest.name != *name {
                return Err(Diagnostic::error(
                    ErrorCode::E0117,
                    format!(
                        "dependency `{name}` (asked by {}) is the package `{}`",
                        chain_text(&chain()[..stack.len()]),
                        manifest.name
                    ),
                )
                .with_help(format!("name the dependency after the package: `{} = ...`", manifest.name)));
            }
            let version = version_hint.unwrap_or_else(|| manifest.version.clone());
            self.chosen.insert(
                name.clone(),
                Resolved {
                    name: name.clone(),
                    version,
                    origin: origin.clone(),
                    dependencies: manifest.dependencies.keys().cloned().collect(),
                },
            );
            let mut next = stack.to_vec();
            next.push((name.clone(), dir));
            self.expand(&manifest, &next)?;
        }
        Ok(())
    }

    /// The one source and version that satisfies every requirement on `name` seen so far.
    fn pick(&mut self, name: &str) -> Result<(Origin, Option<semver::Version>), Diagnostic> {
        let reqs = self.reqs[name].clone();
        let identity = |d: &Dependency| match d {
            Dependency::Path(p) => format!("path {p}"),
            Dependency::Git { url, .. } => format!("git {url}"),
        };
        let first = identity(&reqs[0].dep);
        if let Some(other) = reqs.iter().find(|r| identity(&r.dep) != first) {
            return Err(Diagnostic::error(
                ErrorCode::E0117,
                format!(
                    "two packages named `{name}`: {} (asked by {}) and {} (asked by {})",
                    first,
                    chain_text(&reqs[0].chain),
                    identity(&other.dep),
                    chain_text(&other.chain)
                ),
            )
            .with_help(
                "a build holds one package per name: point both dependencies at the same repository or directory",
            ));
        }
        let conflict = |why: &str| {
            let lines: Vec<String> =
                reqs.iter().map(|r| format!("{} wants {}", chain_text(&r.chain), r.dep.source())).collect();
            Diagnostic::error(
                ErrorCode::E0118,
                format!("two versions of `{name}` are required ({why}): {}", lines.join("; ")),
            )
            .with_help("loosen one requirement (e.g. `^1.0`) or update the package that asks for the other version")
        };
        match &reqs[0].dep {
            Dependency::Path(p) => Ok((Origin::Path(p.clone()), None)),
            Dependency::Git { url, at } => {
                let fixed: Vec<&GitRef> = reqs
                    .iter()
                    .filter_map(|r| match &r.dep {
                        Dependency::Git { at, .. } if !matches!(at, GitRef::Version(_)) => Some(at),
                        _ => None,
                    })
                    .collect();
                if let Some(f) = fixed.first() {
                    if fixed.iter().any(|g| g != f) || fixed.len() != reqs.len() {
                        return Err(conflict("different tags, branches or revisions"));
                    }
                    return match f {
                        GitRef::Tag(t) => {
                            let tags = self.tags(name, url, &reqs[0].chain)?;
                            match tags.iter().find(|(n, _)| n == t) {
                                Some((_, c)) => Ok((
                                    Origin::Git { url: url.clone(), reference: t.clone(), commit: c.clone() },
                                    tag_version(t),
                                )),
                                None => Err(missing(name, url, &format!("tag `{t}`"), &tags)),
                            }
                        }
                        GitRef::Branch(r) | GitRef::Rev(r) => {
                            let c = self.index.commit(url, r).map_err(|_| {
                                let tags = self.tags(name, url, &reqs[0].chain).unwrap_or_default();
                                missing(name, url, &format!("`{r}`"), &tags)
                            })?;
                            Ok((Origin::Git { url: url.clone(), reference: r.clone(), commit: c }, None))
                        }
                        GitRef::Version(_) => unreachable_version(),
                    };
                }
                let _ = at;
                let parsed: Vec<semver::VersionReq> = reqs
                    .iter()
                    .filter_map(|r| match &r.dep {
                        Dependency::Git { at: GitRef::Version(v), .. } => semver::VersionReq::parse(v).ok(),
                        _ => None,
                    })
                    .collect();
                let tags = self.tags(name, url, &reqs[0].chain)?;
                let mut ok: Vec<(semver::Version, &String, &String)> = tags
                    .iter()
                    .filter_map(|(t, c)| tag_version(t).map(|v| (v, t, c)))
                    .filter(|(v, _, _)| parsed.iter().all(|r| r.matches(v)))
                    .collect();
                ok.sort_by(|a, b| a.0.cmp(&b.0));
                let pinned = self.pins.get(name).and_then(|p| ok.iter().find(|(_, _, c)| **c == p.commit));
                match pinned.or(ok.last()) {
                    Some((v, t, c)) => Ok((
                        Origin::Git { url: url.clone(), reference: (*t).clone(), commit: (*c).clone() },
                        Some(v.clone()),
                    )),
                    None if reqs.len() > 1
                        && parsed
                            .iter()
                            .all(|r| tags.iter().any(|(t, _)| tag_version(t).is_some_and(|v| r.matches(&v)))) =>
                    {
                        Err(conflict("no tag satisfies all of them"))
                    }
                    None => Err(missing(
                        name,
                        url,
                        &format!(
                            "a tag matching `{}`",
                            reqs.iter().map(|r| r.dep.source()).collect::<Vec<_>>().join(", ")
                        ),
                        &tags,
                    )),
                }
            }
        }
    }

    fn tags(&mut self, name: &str, url: &str, chain: &[String]) -> Result<Vec<(String, String)>, Diagnostic> {
        self.index.tags(url).map_err(|why| {
            Diagnostic::error(ErrorCode::E0114, format!("cannot reach the repository of `{name}` ({url}): {why}"))
                .with_help(format!(
                    "check the URL in miles.toml (asked by {}) and your access to it; once fetched, `miles check` works offline from the cache",
                    chain_text(&chain[..chain.len().saturating_sub(1)])
                ))
        })
    }
}

fn unreachable_version() -> Result<(Origin, Option<semver::Version>), Diagnostic> {
    Err(Diagnostic::error(ErrorCode::E0118, "internal: a version requirement among fixed references"))
}

fn missing(name: &str, url: &str, what: &str, tags: &[(String, String)]) -> Diagnostic {
    let mut known: Vec<&str> = tags.iter().map(|(t, _)| t.as_str()).collect();
    known.sort();
    Diagnostic::error(ErrorCode::E0115, format!("`{name}` ({url}) has no {what}")).with_help(if known.is_empty() {
        "the repository has no tags: tag a release (`git tag v1.0.0 && git push --tags`) or depend on a branch"
            .to_string()
    } else {
        format!("its tags: {}", known.join(", "))
    })
}
