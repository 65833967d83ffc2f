//! `miles test`: a library's own tests, declared in its manifest as `[[test]]` tables (a recipe
//! file that must pass, or must fail with a given rule), so house rules are tested like code.

use crate::manifest::{Expect, TestCase};
use crate::project::Project;
use miles_compiler::fs::{join, FileSystem};
use miles_compiler::program::Packages;
use miles_compiler::{compile_in, Compilation, Diagnostic, Options, Severity};
use miles_grammar::diag::ErrorCode;

pub struct Outcome {
    pub test: TestCase,
    pub passed: bool,
    /// Why it failed, in one line.
    pub why: String,
    pub compilation: Compilation,
}

impl Outcome {
    /// The test as `miles test` names it: its file, and its recipe when it names one.
    pub fn name(&self) -> String {
        let recipe = self.test.recipe.as_ref().map(|r| format!(" ({r})")).unwrap_or_default();
        format!("{}{recipe}", self.test.file)
    }

    /// A failed test as the one diagnostic `miles test` reports (E0119); `None` when it passed.
    pub fn diagnostic(&self) -> Option<Diagnostic> {
        (!self.passed).then(|| {
            Diagnostic::error(ErrorCode::E0119, format!("library test {} failed: {}", self.name(), self.why))
                .with_help("fix the rule or the test's expectation in miles.toml")
        })
    }
}

/// Whether an error of `c` is the one `check` names: its code, its rule's name, or words of its
/// message.
pub fn fired(c: &Compilation, check: &str) -> bool {
    c.diagnostics.iter().filter(|d| d.severity == Severity::Error).any(|d| {
        d.code.eq_ignore_ascii_case(check)
            || d.rule.as_ref().is_some_and(|r| r.name == check || r.name.ends_with(&format!(".{check}")))
            || d.message.contains(check)
    })
}

pub fn run(project: &Project, packages: &Packages, fs: &dyn FileSystem) -> Vec<Outcome> {
    project
        .manifest
        .tests
        .iter()
        .map(|t| {
            let key = join(&project.root, &t.file);
            let opts = Options { recipe: t.recipe.clone(), ..Options::default() };
            let c = compile_in(fs, &[key], &opts, packages);
            let errors: Vec<String> = c
                .diagnostics
                .iter()
                .filter(|d| d.severity == Severity::Error)
                .map(|d| format!("{}: {}", d.code, d.message))
                .collect();
            let (passed, why) = match (t.expect, &t.check) {
                (Expect::Pass, _) if errors.is_empty() => (true, String::new()),
                (Expect::Pass, _) => (false, format!("expected to pass, failed with {}", errors.join("; "))),
                (Expect::Fail, None) if !errors.is_empty() => (true, String::new()),
                (Expect::Fail, Some(check)) if fired(&c, check) => (true, String::new()),
                (Expect::Fail, Some(check)) if !errors.is_empty() => {
                    (false, format!("expected `{check}` to fail, got other errors: {}", errors.join("; ")))
                }
                (Expect::Fail, check) => (
                    false,
                    format!(
                        "expected to fail{}, but it passed",
                        check.as_ref().map(|c| format!(" with `{c}`")).unwrap_or_default()
                    ),
                ),
            };
            Outcome { test: t.clone(), passed, why, compilation: c }
        })
        .collect()
}
