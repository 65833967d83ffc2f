//! `miles.lock`: every resolved package with its version, source, commit and content hash.
//! Written by miles in a fixed order, so the same resolution gives the same bytes.

use miles_grammar::diag::ErrorCode;
use miles_grammar::diag::{Diagnostic, FileId, Span};
use serde::Deserialize;

pub const FILE: &str = "miles.lock";

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Lock {
    pub version: u32,
    #[serde(default, rename = "package")]
    pub packages: Vec<Locked>,
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Locked {
    pub name: String,
    pub version: String,
    /// `git+URL` or `path+DIR` (relative to the project root).
    pub source: String,
    /// The tag, branch or revision the commit was chosen through.
    #[serde(default)]
    pub reference: Option<String>,
    #[serde(default)]
    pub commit: Option<String>,
    /// `sha256:...` of the exported tree (git packages; a path package is the directory as is).
    #[serde(default)]
    pub hash: Option<String>,
    #[serde(default)]
    pub dependencies: Vec<String>,
}

const REWRITE: &str = "miles.lock is written by miles: restore it from version control, or delete it and run `miles update` to write it again";

impl Lock {
    /// Reads a lock and checks every entry's form (`validate`); any bytes give a lock or one
    /// diagnostic at the line at fault, never a panic.
    pub fn parse(file: FileId, text: &str) -> Result<Lock, Diagnostic> {
        let lock: Lock = toml::from_str(text).map_err(|e| {
            let span = e.span().map(|r| Span::new(file, r.start, r.end)).unwrap_or(Span::new(file, 0, 0));
            Diagnostic::error(ErrorCode::E0112, format!("invalid {FILE}: {}", e.message()))
                .with_primary(span, "here")
                .with_help(REWRITE)
        })?;
        lock.validate(file, text)?;
        Ok(lock)
    }

    /// The checks that need no repository: names are package names (they become cache and
    /// vendor paths), a git entry has a URL git may use, a full commit id and a content hash, and
    /// every dependency named is an entry. What the repositories and files say is checked by the
    /// build (`verify`).
    fn validate(&self, file: FileId, text: &str) -> Result<(), Diagnostic> {
        let blocks = package_blocks(text);
        let bad = |code: ErrorCode, index: Option<usize>, key: &str, msg: String| {
            let span = match index {
                Some(i) => key_span(text, blocks.get(i).copied().unwrap_or((0, 0)), key),
                None => key_span(text, (0, blocks.first().map_or(text.len(), |b| b.0)), key),
            };
            Diagnostic::error(code, format!("{FILE}: {msg}"))
                .with_primary(Span::new(file, span.0, span.1), "here")
                .with_help(REWRITE)
        };
        if self.version != 1 {
            return Err(bad(
                ErrorCode::E0112,
                None,
                "version",
                format!("lock format {} is not known (1 is)", self.version),
            ));
        }
        let mut seen = std::collections::HashSet::new();
        for (i, p) in self.packages.iter().enumerate() {
            let at = Some(i);
            if !crate::manifest::valid_name(&p.name) {
                return Err(bad(ErrorCode::E0112, at, "name", format!("`{}` is not a package name", p.name)));
            }
            if !seen.insert(p.name.as_str()) {
                return Err(bad(ErrorCode::E0112, at, "name", format!("`{}` is listed twice", p.name)));
            }
            if semver::Version::parse(&p.version).is_err() {
                return Err(bad(
                    ErrorCode::E0112,
                    at,
                    "version",
                    format!("`{}` of `{}` is not a semantic version", p.version, p.name),
                ));
            }
            if let Some(d) = p.dependencies.iter().find(|d| self.get(d).is_none()) {
                return Err(bad(
                    ErrorCode::E0112,
                    at,
                    "dependencies",
                    format!("`{}` depends on `{d}`, which is not listed", p.name),
                ));
            }
            if let Some(url) = p.source.strip_prefix("git+") {
                if let Err(why) = crate::url::check(url) {
                    return Err(bad(ErrorCode::E0121, at, "source", format!("git URL of `{}`: {why}", p.name)));
                }
                if !p.commit.as_deref().is_some_and(crate::git::is_commit_id) {
                    let c = p.commit.as_deref().unwrap_or("");
                    let key = if p.commit.is_some() { "commit" } else { "name" };
                    return Err(bad(ErrorCode::E0112, at, key, format!("`{}` has no full commit id (`{c}`)", p.name)));
                }
                if p.reference.is_none() {
                    return Err(bad(ErrorCode::E0112, at, "name", format!("`{}` has no `reference`", p.name)));
                }
                match &p.hash {
                    None => {
                        return Err(bad(
                            ErrorCode::E0120,
                            at,
                            "name",
                            format!("`{}` has no content `hash`, so its files could not be checked", p.name),
                        ))
                    }
                    Some(h) if !is_hash(h) => {
                        return Err(bad(
                            ErrorCode::E0112,
                            at,
                            "hash",
                            format!("`{h}` of `{}` is not `sha256:` and 64 hex digits", p.name),
                        ))
                    }
                    Some(_) => {}
                }
            } else if p.source.strip_prefix("path+").is_none_or(str::is_empty) {
                return Err(bad(
                    ErrorCode::E0112,
                    at,
                    "source",
                    format!("`{}` has no usable source (`git+URL` or `path+DIR`)", p.name),
                ));
            }
        }
        Ok(())
    }

    /// The byte range of the line setting `key` in the `[[package]]` entry named `name` (the
    /// entry's first line when it has no such line): where a diagnostic about it points.
    pub fn entry_line(&self, text: &str, name: &str, key: &str) -> (usize, usize) {
        let blocks = package_blocks(text);
        let i = self.packages.iter().position(|p| p.name == name);
        key_span(text, i.and_then(|i| blocks.get(i).copied()).unwrap_or((0, 0)), key)
    }

    pub fn get(&self, name: &str) -> Option<&Locked> {
        self.packages.iter().find(|p| p.name == name)
    }

    pub fn render(&self) -> String {
        let q = crate::manifest::toml_string;
        let mut out =
            String::from("# Written by miles (`miles update`); not meant to be edited by hand.\nversion = 1\n");
        let mut pkgs = self.packages.clone();
        pkgs.sort_by(|a, b| a.name.cmp(&b.name));
        for p in &pkgs {
            out.push_str(&format!(
                "\n[[package]]\nname = {}\nversion = {}\nsource = {}\n",
                q(&p.name),
                q(&p.version),
                q(&p.source)
            ));
            for (k, v) in [("reference", &p.reference), ("commit", &p.commit), ("hash", &p.hash)] {
                if let Some(v) = v {
                    out.push_str(&format!("{k} = {}\n", q(v)));
                }
            }
            let deps: Vec<String> = p.dependencies.iter().map(|d| q(d)).collect();
            out.push_str(&format!("dependencies = [{}]\n", deps.join(", ")));
        }
        out
    }
}

fn is_hash(h: &str) -> bool {
    h.strip_prefix("sha256:")
        .is_some_and(|x| x.len() == 64 && x.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
}

/// The byte range of each `[[package]]` entry (from its header to the next header).
fn package_blocks(text: &str) -> Vec<(usize, usize)> {
    let mut starts = Vec::new();
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        if line.trim() == "[[package]]" {
            starts.push(offset);
        }
        offset += line.len();
    }
    let ends = starts.iter().skip(1).copied().chain(std::iter::once(text.len()));
    starts.iter().copied().zip(ends).collect()
}

/// The line setting `key` inside `block` (without its newline), else the block's first line.
fn key_span(text: &str, block: (usize, usize), key: &str) -> (usize, usize) {
    let body = text.get(block.0..block.1).unwrap_or("");
    let mut offset = block.0;
    let mut first = None;
    for line in body.split_inclusive('\n') {
        let t = line.trim_end();
        first.get_or_insert((offset, offset + t.len()));
        let k = t.trim_start();
        if k.starts_with(key) && k[key.len()..].trim_start().starts_with('=') {
            return (offset + (t.len() - k.len()), offset + t.len());
        }
        offset += line.len();
    }
    first.unwrap_or((block.0, block.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let lock = Lock {
            version: 1,
            packages: vec![Locked {
                name: "platform".into(),
                version: "1.0.0".into(),
                source: "git+file:///x".into(),
                reference: Some("v1.0.0".into()),
                commit: Some(COMMIT.into()),
                hash: Some(HASH.into()),
                dependencies: vec![],
            }],
        };
        let text = lock.render();
        assert_eq!(Lock::parse(FileId(0), &text).expect("parses"), lock);
        assert_eq!(Lock::parse(FileId(0), "version = \n").expect_err("bad").code, "E0112");
    }

    /// Any string a lock holds is written as a TOML string (Rust's `{:?}` escapes such as
    /// `\u{301}` are not TOML), so a path with a combining accent or a quote reads back.
    #[test]
    fn render_writes_toml_strings() {
        let lock = Lock {
            version: 1,
            packages: vec![Locked {
                name: "local".into(),
                version: "1.0.0".into(),
                source: "path+../cafe\u{301}/\"q\"\\x".into(),
                reference: None,
                commit: None,
                hash: None,
                dependencies: vec![],
            }],
        };
        assert_eq!(Lock::parse(FileId(0), &lock.render()).expect("parses"), lock);
    }

    const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";
    const HASH: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    /// A well-formed two-entry lock whose second entry's line `key = ...` is replaced by `line`
    /// (or removed when `line` is empty).
    fn edited(key: &str, line: &str) -> String {
        let good = format!(
            "version = 1\n\n[[package]]\nname = \"catalog\"\nversion = \"1.0.0\"\nsource = \"path+../catalog\"\ndependencies = []\n\n\
             [[package]]\nname = \"platform\"\nversion = \"1.0.0\"\nsource = \"git+file:///srv/platform\"\n\
             reference = \"v1.0.0\"\ncommit = \"{COMMIT}\"\nhash = \"{HASH}\"\ndependencies = [\"catalog\"]\n"
        );
        let Some(at) = good.rfind(&format!("\n{key} = ")) else { return good };
        let end = good[at + 1..].find('\n').map_or(good.len(), |e| at + 1 + e);
        let sep = if line.is_empty() { "" } else { "\n" };
        format!("{}{sep}{line}{}", &good[..at], &good[end..])
    }

    /// Each malformed entry is one diagnostic with its code, at the entry's line in miles.lock;
    /// none panics (a short or multi-byte commit included).
    #[test]
    fn every_entry_is_checked_and_errors_name_the_line() {
        Lock::parse(FileId(0), &edited("none", "")).expect("the unedited lock is valid");
        let cases: &[(&str, &str, &str, &str)] = &[
            ("hash", "", "E0120", "name = \"platform\""),
            ("name", "name = \"../../escape\"", "E0112", "name = \"../../escape\""),
            ("name", "name = \"catalog\"", "E0112", "name = \"catalog\""),
            ("commit", "commit = \"abc\"", "E0112", "commit = \"abc\""),
            ("commit", "commit = \"aaaaaaaaaaa\u{e9}\"", "E0112", "commit = \"aaaaaaaaaaa\u{e9}\""),
            ("commit", "", "E0112", "name = \"platform\""),
            ("hash", "hash = \"sha256:00\"", "E0112", "hash = \"sha256:00\""),
            ("source", "source = \"git+--upload-pack=touch /tmp/x\"", "E0121", "source = "),
            ("source", "source = \"git+ext::sh -c touch% /tmp/x\"", "E0121", "source = "),
            ("source", "source = \"svn+x\"", "E0112", "source = \"svn+x\""),
            ("version", "version = \"one\"", "E0112", "version = \"one\""),
            ("dependencies", "dependencies = [\"ghost\"]", "E0112", "dependencies = [\"ghost\"]"),
            ("reference", "", "E0112", "name = \"platform\""),
        ];
        for (key, line, code, at) in cases {
            let text = edited(key, line);
            let d = Lock::parse(FileId(0), &text).expect_err(line);
            assert_eq!(d.code, *code, "{line}: {}", d.message);
            let span = d.primary.as_ref().expect("a span").span;
            let shown = &text[span.start as usize..span.end as usize];
            assert!(shown.starts_with(at), "{line}: points at `{shown}`");
        }
    }
}
