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

impl Lock {
    pub fn parse(file: FileId, text: &str) -> Result<Lock, Diagnostic> {
        toml::from_str(text).map_err(|e| {
            let span = e.span().map(|r| Span::new(file, r.start, r.end)).unwrap_or(Span::new(file, 0, 0));
            Diagnostic::error(ErrorCode::E0112, format!("invalid {FILE}: {}", e.message()))
                .with_primary(span, "here")
                .with_help("delete miles.lock and run `miles update` to write it again")
        })
    }

    pub fn get(&self, name: &str) -> Option<&Locked> {
        self.packages.iter().find(|p| p.name == name)
    }

    pub fn render(&self) -> String {
        let q = |s: &str| format!("{s:?}");
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
                commit: Some("abc".into()),
                hash: Some("sha256:00".into()),
                dependencies: vec!["catalog".into()],
            }],
        };
        let text = lock.render();
        assert_eq!(Lock::parse(FileId(0), &text).expect("parses"), lock);
        assert_eq!(Lock::parse(FileId(0), "version = \n").expect_err("bad").code, "E0112");
    }
}
