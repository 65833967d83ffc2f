//! `miles.toml`: a package's name, version, description, license, dependencies and library tests.
//!
//! ```toml
//! [package]
//! name = "platform"
//! version = "1.1.0"
//! description = "Base recipes and house rules"
//! license = "Apache-2.0"
//!
//! [dependencies]
//! catalogs = { path = "../catalogs" }
//! platform = { git = "file:///srv/git/platform.git", version = "^1.0" }   # or tag/branch/rev
//!
//! [[test]]
//! file = "tests/small_batch.miles"
//! expect = "fail"          # or "pass"
//! check = "min_batch"      # the failing rule (name or message) or code that must fire
//! ```

use miles_grammar::diag::ErrorCode;
use miles_grammar::diag::{Diagnostic, FileId, Span};
use serde::Deserialize;
use std::collections::BTreeMap;

pub const FILE: &str = "miles.toml";

#[derive(Clone, Debug, PartialEq)]
pub struct Manifest {
    pub name: String,
    pub version: semver::Version,
    pub description: Option<String>,
    pub license: Option<String>,
    pub dependencies: BTreeMap<String, Dependency>,
    pub tests: Vec<TestCase>,
    /// House rules on stdlib stage kinds (`[[rule]]`), with the line of each.
    pub rules: Vec<RuleDecl>,
}

/// `[[rule]]`: a check on every instance of a stdlib stage kind, in every recipe of a build that
/// includes this package (docs/packages.md).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleDecl {
    /// The stage kind: `grpo`, `generate`, ...
    pub stage: String,
    /// A Bool expression over the stage's fields, in the recipe language: `lr <= 1e-4`.
    pub check: String,
    #[serde(default)]
    pub message: Option<String>,
    #[serde(default)]
    pub help: Option<String>,
    /// A failure warns instead of failing the check.
    #[serde(default)]
    pub warn: bool,
    /// 1-based line of its `[[rule]]` header.
    #[serde(skip)]
    pub line: usize,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Dependency {
    /// A directory, relative to the manifest's own.
    Path(String),
    Git {
        url: String,
        at: GitRef,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum GitRef {
    Tag(String),
    Branch(String),
    Rev(String),
    /// The highest tag (`v1.2.3` or `1.2.3`) matching the requirement.
    Version(String),
}

impl GitRef {
    /// The manifest key that names this reference (`tag`, `branch`, `rev` or `version`) and its
    /// value: `miles.lock` and `miles add` spell a git source with the same keys.
    pub fn key_value(&self) -> (&'static str, &str) {
        match self {
            GitRef::Tag(t) => ("tag", t),
            GitRef::Branch(b) => ("branch", b),
            GitRef::Rev(r) => ("rev", r),
            GitRef::Version(v) => ("version", v),
        }
    }
}

impl Dependency {
    /// The dependency as `miles.lock` records its source: `path+DIR` or `git+URL?tag=v1`.
    pub fn source(&self) -> String {
        match self {
            Dependency::Path(p) => format!("path+{p}"),
            Dependency::Git { url, at } => {
                let (k, v) = at.key_value();
                format!("git+{url}?{k}={v}")
            }
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TestCase {
    /// The recipe file, relative to the package root.
    pub file: String,
    /// Only this recipe of the file (default: every recipe in it).
    #[serde(default)]
    pub recipe: Option<String>,
    pub expect: Expect,
    /// For `expect = "fail"`: a rule name, a code, or words of the message that must appear in
    /// one of the errors.
    #[serde(default)]
    pub check: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Expect {
    Pass,
    Fail,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    package: RawPackage,
    #[serde(default)]
    dependencies: BTreeMap<String, RawDep>,
    #[serde(default, rename = "test")]
    tests: Vec<TestCase>,
    #[serde(default, rename = "rule")]
    rules: Vec<RuleDecl>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPackage {
    name: String,
    version: String,
    description: Option<String>,
    license: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDep {
    path: Option<String>,
    git: Option<String>,
    tag: Option<String>,
    branch: Option<String>,
    rev: Option<String>,
    version: Option<String>,
}

/// A package name is the first segment of an import path: letters, digits, `_` and `-`.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        && name != "std"
}

impl Manifest {
    /// Parses `text` (the file `file` in the caller's `Sources`); errors point at the line.
    pub fn parse(file: FileId, text: &str) -> Result<Manifest, Diagnostic> {
        let whole = Span::new(file, 0, 0);
        let raw: Raw = toml::from_str(text).map_err(|e| {
            let span = e.span().map(|r| Span::new(file, r.start, r.end.max(r.start))).unwrap_or(whole);
            Diagnostic::error(ErrorCode::E0112, format!("invalid {FILE}: {}", e.message()))
                .with_primary(span, "here")
                .with_help("see docs/packages.md for the manifest's fields")
        })?;
        // Serde forgets positions once parsed: point semantic errors at the line naming the key.
        let at = |key: &str| -> Span {
            let mut offset = 0;
            for line in text.split_inclusive('\n') {
                let t = line.trim_start();
                if t.starts_with(key) && t[key.len()..].trim_start().starts_with(['=', '.']) {
                    let start = offset + (line.len() - t.len());
                    return Span::new(file, start, start + line.trim_end().len() - (line.len() - t.len()));
                }
                offset += line.len();
            }
            whole
        };
        let bad = |key: &str, msg: String, help: &str| {
            Diagnostic::error(ErrorCode::E0112, format!("invalid {FILE}: {msg}"))
                .with_primary(at(key), "here")
                .with_help(help)
        };
        if !valid_name(&raw.package.name) {
            return Err(bad(
                "name",
                format!("`{}` is not a package name", raw.package.name),
                "a name starts with a letter and holds letters, digits, `_` or `-` (and is not `std`)",
            ));
        }
        let version = semver::Version::parse(&raw.package.version).map_err(|e| {
            bad("version", format!("version `{}`: {e}", raw.package.version), "write a semantic version: \"1.2.0\"")
        })?;
        let mut dependencies = BTreeMap::new();
        for (name, d) in raw.dependencies {
            if !valid_name(&name) {
                return Err(bad(&name, format!("`{name}` is not a package name"), "rename the dependency"));
            }
            let refs = [&d.tag, &d.branch, &d.rev, &d.version].iter().filter(|r| r.is_some()).count();
            let dep = match (d.path, d.git) {
                (Some(p), None) if refs == 0 => Dependency::Path(p),
                (None, Some(url)) if refs <= 1 => {
                    if let Some(r) = [&d.tag, &d.branch, &d.rev].into_iter().flatten().find(|r| r.starts_with('-')) {
                        return Err(bad(&name, format!("`{r}` is not a tag, branch or revision"), "a git reference never starts with `-`"));
                    }
                    let line = at(&name);
                    let at = if let Some(t) = d.tag {
                        GitRef::Tag(t)
                    } else if let Some(b) = d.branch {
                        GitRef::Branch(b)
                    } else if let Some(r) = d.rev {
                        GitRef::Rev(r)
                    } else {
                        let req = d.version.unwrap_or_else(|| "*".into());
                        semver::VersionReq::parse(&req).map_err(|e| {
                            bad(&name, format!("version requirement `{req}` of `{name}`: {e}"), "e.g. \"^1.0\"")
                        })?;
                        GitRef::Version(req)
                    };
                    if let Err(why) = crate::url::check(&url) {
                        return Err(Diagnostic::error(ErrorCode::E0121, format!("git URL of `{name}`: {why}"))
                            .with_primary(line, "here")
                            .with_help("see docs/packages.md for the allowed URLs"));
                    }
                    Dependency::Git { url, at }
                }
                _ => {
                    return Err(bad(
                        &name,
                        format!("dependency `{name}` needs exactly one of `path` or `git` (with at most one of tag, branch, rev, version)"),
                        "e.g. `platform = { git = \"https://host/platform.git\", version = \"^1.0\" }`",
                    ))
                }
            };
            dependencies.insert(name, dep);
        }
        // Each rule's line: the n-th `[[rule]]` header (toml keeps the array's order).
        let headers: Vec<usize> =
            text.lines().enumerate().filter(|(_, l)| l.trim() == "[[rule]]").map(|(i, _)| i + 1).collect();
        let mut rules = raw.rules;
        for (r, line) in rules.iter_mut().zip(headers) {
            r.line = line;
        }
        Ok(Manifest {
            name: raw.package.name,
            version,
            description: raw.package.description,
            license: raw.package.license,
            dependencies,
            tests: raw.tests,
            rules,
        })
    }

    /// The `[dependencies]` line of one dependency, for `miles add`.
    pub fn dependency_line(name: &str, dep: &Dependency) -> String {
        let q = toml_string;
        match dep {
            Dependency::Path(p) => format!("{name} = {{ path = {} }}", q(p)),
            Dependency::Git { url, at } => {
                let (k, v) = at.key_value();
                format!("{name} = {{ git = {}, {k} = {} }}", q(url), q(v))
            }
        }
    }
}

/// `s` as a TOML string, quotes included (Rust's `{:?}` escapes, such as `\u{301}`, are not TOML).
pub(crate) fn toml_string(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

/// Adds (or replaces) one dependency in a manifest's text, keeping everything else as written.
pub fn with_dependency(text: &str, name: &str, dep: &Dependency) -> String {
    let line = Manifest::dependency_line(name, dep);
    let mut out: Vec<String> = Vec::new();
    let mut in_deps = false;
    let mut placed = false;
    for l in text.lines() {
        let t = l.trim();
        if t.starts_with('[') {
            if in_deps && !placed {
                out.push(line.clone());
                placed = true;
            }
            in_deps = t == "[dependencies]";
        } else if in_deps && t.split(['=', ' ', '.']).next() == Some(name) {
            if !placed {
                out.push(line.clone());
                placed = true;
            }
            continue;
        }
        out.push(l.to_string());
    }
    if !placed {
        if !in_deps {
            if out.last().is_some_and(|l| !l.trim().is_empty()) {
                out.push(String::new());
            }
            out.push("[dependencies]".into());
        }
        out.push(line);
    }
    out.join("\n") + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
[package]
name = "team"
version = "0.3.0"
description = "GRPO recipes"

[dependencies]
platform = { git = "file:///srv/platform.git", version = "^1.0" }
local = { path = "../local" }

[[test]]
file = "tests/bad.miles"
expect = "fail"
check = "min_batch"
"#;

    #[test]
    fn parses_a_manifest() {
        let m = Manifest::parse(FileId(0), GOOD).expect("parses");
        assert_eq!(m.name, "team");
        assert_eq!(m.version, semver::Version::new(0, 3, 0));
        assert_eq!(m.dependencies["local"], Dependency::Path("../local".into()));
        assert_eq!(m.dependencies["platform"].source(), "git+file:///srv/platform.git?version=^1.0");
        assert_eq!(m.tests[0].expect, Expect::Fail);
    }

    #[test]
    fn bad_manifests_name_the_line() {
        let cases: &[(&str, &str, usize)] = &[
            ("[package]\nname = \"x\"\nversion = 1.0\n", "invalid type", 3),
            ("[package]\nname = \"x\"\nversion = \"1.0.0\"\n[dependencies]\na = { git = \"u\", tag = \"v1\", rev = \"abc\" }\n", "exactly one", 5),
            ("[package]\nname = \"x\"\nversion = \"one\"\n", "version `one`", 3),
            ("[package]\nname = \"x\"\nversion = \"1.0.0\"\n[dependencies]\na = { git = \"u\", version = \"~~1\" }\n", "requirement", 5),
            ("[package\nname = \"x\"\n", "", 1),
        ];
        for (text, want, line) in cases {
            let d = Manifest::parse(FileId(0), text).expect_err(text);
            assert_eq!(d.code, "E0112");
            assert!(d.message.contains(want), "{}", d.message);
            let start = d.primary.as_ref().map(|l| l.span.start as usize).unwrap_or(0);
            assert_eq!(text[..start].matches('\n').count() + 1, *line, "{text}: {}", d.message);
        }
    }

    /// A URL git would read as an option or a command, or an unauthenticated scheme, is E0121
    /// at the dependency's line; an option-looking reference is E0112.
    #[test]
    fn hostile_git_urls_and_references_are_refused() {
        let head = "[package]\nname = \"x\"\nversion = \"1.0.0\"\n[dependencies]\n";
        for (dep, code) in [
            (r#"a = { git = "--upload-pack=touch /tmp/x", tag = "v1" }"#, "E0121"),
            (r#"a = { git = "ext::sh -c touch% /tmp/x" }"#, "E0121"),
            (r#"a = { git = "http://example.com/a.git" }"#, "E0121"),
            (r#"a = { git = "https://example.com/a.git", branch = "--output=/tmp/x" }"#, "E0112"),
        ] {
            let text = format!("{head}{dep}\n");
            let d = Manifest::parse(FileId(0), &text).expect_err(dep);
            assert_eq!(d.code, code, "{dep}: {}", d.message);
            let start = d.primary.as_ref().map(|l| l.span.start as usize).unwrap_or(0);
            assert_eq!(text[..start].matches('\n').count() + 1, 5, "{dep}");
        }
        let ok = format!("{head}a = {{ git = \"git@example.com:team/a.git\", tag = \"v1\" }}\n");
        Manifest::parse(FileId(0), &ok).expect("scp-like URLs are allowed");
    }

    #[test]
    fn add_keeps_the_rest_of_the_file() {
        let dep = Dependency::Git { url: "file:///x".into(), at: GitRef::Tag("v1".into()) };
        let out = with_dependency(GOOD, "platform", &dep);
        assert!(out.contains("platform = { git = \"file:///x\", tag = \"v1\" }"));
        assert!(!out.contains("version = \"^1.0\""));
        assert!(out.contains("local = { path"));
        let fresh =
            with_dependency("[package]\nname = \"a\"\nversion = \"1.0.0\"\n", "b", &Dependency::Path("../b".into()));
        assert!(fresh.ends_with("[dependencies]\nb = { path = \"../b\" }\n"), "{fresh}");
        Manifest::parse(FileId(0), &out).expect("still parses");
    }
}
