//! The one diagnostic type of the project. Every crate (parser, compiler, planner, runtime,
//! language server) reports problems as `Diagnostic`s with a code from `codes::CODES`.

use serde::Serialize;

pub use crate::codes::ErrorCode;
pub use crate::spanned::Spanned;

/// Index of a source file in the compiler's source map (`miles_compiler::Sources`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Default)]
pub struct FileId(pub u32);

/// A byte range in one file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Default)]
pub struct Span {
    pub file: FileId,
    pub start: u32,
    pub end: u32,
}

impl Span {
    pub fn new(file: FileId, start: usize, end: usize) -> Span {
        Span { file, start: start as u32, end: end as u32 }
    }
    /// The smallest span covering both (they must be in the same file).
    pub fn to(self, other: Span) -> Span {
        Span { file: self.file, start: self.start.min(other.start), end: self.end.max(other.end) }
    }
    pub fn range(self) -> std::ops::Range<usize> {
        self.start as usize..self.end as usize
    }
    pub fn contains(self, offset: usize) -> bool {
        (self.start as usize) <= offset && offset <= (self.end as usize)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Error,
    Warning,
    Note,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Label {
    pub span: Span,
    pub message: String,
}

/// A replacement that fixes a diagnostic (used by "did you mean" and code actions).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Fix {
    pub message: String,
    pub span: Span,
    pub replacement: String,
}

/// Where a stdlib (or library) `check` rule that fired is defined.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Rule {
    /// e.g. `std/stages.grpo` or `my/team.rules`.
    pub name: String,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Diagnostic {
    /// Stable code, `E0001`...; registered in `codes::CODES`.
    pub code: ErrorCode,
    pub severity: Severity,
    pub message: String,
    /// The primary label; `None` only for diagnostics about no particular source (a missing file
    /// given on the command line).
    pub primary: Option<Label>,
    pub secondary: Vec<Label>,
    pub help: Option<String>,
    pub rule: Option<Rule>,
    pub fixes: Vec<Fix>,
}

impl Diagnostic {
    pub fn error(code: ErrorCode, message: impl Into<String>) -> Diagnostic {
        Diagnostic {
            code,
            severity: Severity::Error,
            message: message.into(),
            primary: None,
            secondary: Vec::new(),
            help: None,
            rule: None,
            fixes: Vec::new(),
        }
    }
    pub fn warning(code: ErrorCode, message: impl Into<String>) -> Diagnostic {
        Diagnostic { severity: Severity::Warning, ..Diagnostic::error(code, message) }
    }
    pub fn with_primary(mut self, span: Span, message: impl Into<String>) -> Diagnostic {
        self.primary = Some(Label { span, message: message.into() });
        self
    }
    pub fn with_secondary(mut self, span: Span, message: impl Into<String>) -> Diagnostic {
        self.secondary.push(Label { span, message: message.into() });
        self
    }
    pub fn with_help(mut self, help: impl Into<String>) -> Diagnostic {
        self.help = Some(help.into());
        self
    }
    pub fn with_fix(mut self, message: impl Into<String>, span: Span, replacement: impl Into<String>) -> Diagnostic {
        self.fixes.push(Fix { message: message.into(), span, replacement: replacement.into() });
        self
    }
    pub fn with_rule(mut self, name: impl Into<String>, span: Span) -> Diagnostic {
        self.rule = Some(Rule { name: name.into(), span });
        self
    }
    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}
