//! The one error type of a run. Each carries an E05xx code from grammar/src/codes.rs so the CLI
//! can print `miles explain CODE` help.

use std::fmt;

/// A task data file is missing or unreadable.
pub const E_DATA_FILE: &str = "E0501";
/// A JSONL line is malformed (reported as file:line).
pub const E_DATA_LINE: &str = "E0502";
/// The model's vocabulary does not cover the task's tokenizer.
pub const E_VOCAB: &str = "E0503";
/// The run spec is invalid or inconsistent.
pub const E_SPEC: &str = "E0504";
/// A loss or gradient became NaN/infinite; the run stopped.
pub const E_NONFINITE: &str = "E0505";
/// A checkpoint could not be written or read, or resume found none.
pub const E_CHECKPOINT: &str = "E0506";
/// The output directory cannot be used (exists with a finished/other run, not writable).
pub const E_OUT_DIR: &str = "E0507";
/// The compute backend failed (libtorch error, shape mismatch).
pub const E_BACKEND: &str = "E0508";
/// A bounded wait or the run's wall-time limit expired.
pub const E_TIMEOUT: &str = "E0509";
/// A prompt plus its answer does not fit the model's max_len.
pub const E_TOO_LONG: &str = "E0510";
/// The recipe asks for a GPU (or more GPUs, or CUDA libraries) that this machine lacks.
pub const E_NO_GPU: &str = "E0518";

#[derive(Debug, Clone, PartialEq)]
pub struct RunError {
    pub code: &'static str,
    pub message: String,
    pub help: Option<String>,
    pub kind: ErrorKind,
}

/// Whose fault an error is, for what the user is told to do about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ErrorKind {
    /// The recipe, its data, the machine or a stage outside miles: the message says what to fix.
    #[default]
    User,
    /// An invariant of miles itself broke (a thread panicked, a contract between its parts was
    /// violated): nothing the user did, and nothing the user can fix.
    Internal,
}

impl RunError {
    pub fn new(code: &'static str, message: impl Into<String>) -> Self {
        RunError { code, message: message.into(), help: None, kind: ErrorKind::User }
    }

    /// A bug in miles (E0508): said as such, so nobody hunts for a mistake in their recipe.
    pub fn internal(message: impl Into<String>) -> Self {
        RunError {
            code: E_BACKEND,
            message: format!("internal error: {}", message.into()),
            help: Some("this is a bug in miles, not in the recipe; please report it with the run's spec.json".into()),
            kind: ErrorKind::Internal,
        }
    }

    pub fn with_help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }

    pub fn io(code: &'static str, what: &str, path: &std::path::Path, e: std::io::Error) -> Self {
        RunError::new(code, format!("{what} {}: {e}", path.display()))
    }
}

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "error[{}]: {}", self.code, self.message)?;
        if let Some(h) = &self.help {
            write!(f, "\n  help: {h}")?;
        }
        Ok(())
    }
}

impl std::error::Error for RunError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_internal_error_says_it_is_a_bug() {
        let e = RunError::internal("the generation thread panicked");
        assert_eq!(e.kind, ErrorKind::Internal);
        let text = e.to_string();
        assert!(text.starts_with("error[E0508]: internal error: the generation thread panicked"), "{text}");
        assert!(text.contains("a bug in miles"), "{text}");
        assert_eq!(RunError::new(E_SPEC, "x").kind, ErrorKind::User);
    }
}
