//! What one invocation adds to a spec (not part of the recipe), and what a run reports.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// How progress is shown on stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProgressMode {
    /// A bar when stderr is a terminal, plain lines otherwise.
    #[default]
    Auto,
    Plain,
    Off,
}

/// The exit status of a run ended by Ctrl-C (`miles run`, `miles-engine run`), as a shell reports
/// a process SIGINT ended: 128 + 2.
pub const EXIT_INTERRUPTED: u8 = 130;

/// Per-invocation options (not part of the recipe).
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Receives metrics.jsonl, spec.json, checkpoints/ and the final model.
    pub out_dir: PathBuf,
    /// Continue from the newest checkpoint in out_dir (same data order and RNG state).
    pub resume: bool,
    pub progress: ProgressMode,
    /// Stop cleanly after this many RL steps in this invocation (tests of resume).
    pub stop_after: Option<u64>,
    /// Intra-op threads of the backend; None = backend default. Results are bit-exact only for
    /// the same thread count.
    pub threads: Option<usize>,
    /// Upper bound on the whole run's wall time; exceeded -> E0509 after the current step.
    pub max_wall: Option<std::time::Duration>,
    /// Set (by a Ctrl-C handler) to end the run after the step in progress, with a checkpoint at
    /// the step reached; read between steps by both executors.
    pub interrupt: Option<Arc<AtomicBool>>,
    /// Starts the OpenAI-compatible session server over a hub (docs/agents.md "The session
    /// server"); None: this process cannot serve one (the `miles-engine` binary sets the workers'
    /// implementation).
    pub chat_server: Option<Arc<dyn super::serving::ChatServer>>,
}

impl RunOptions {
    pub fn new(out_dir: impl Into<PathBuf>) -> Self {
        RunOptions {
            out_dir: out_dir.into(),
            resume: false,
            progress: ProgressMode::Auto,
            stop_after: None,
            threads: None,
            max_wall: None,
            interrupt: None,
            chat_server: None,
        }
    }

    /// Whether the run was asked to stop (`interrupt` set).
    pub fn interrupted(&self) -> bool {
        self.interrupt.as_ref().is_some_and(|f| f.load(Ordering::SeqCst))
    }
}

/// What a finished (or cleanly stopped) run reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// RL steps completed in total (including those before a resume).
    pub steps_done: u64,
    /// Held-out accuracy after SFT, before the first RL step.
    pub eval_start: Option<f64>,
    /// Last held-out accuracy measured.
    pub eval_end: Option<f64>,
    /// Mean reward of the last step's rollouts.
    pub last_reward: Option<f64>,
    /// Newest checkpoint directory, if any was written.
    pub checkpoint: Option<PathBuf>,
    pub metrics_path: PathBuf,
    pub wall_seconds: f64,
    /// True when `stop_after` or an interrupt ended the run before `steps`.
    pub stopped_early: bool,
    /// True when an interrupt (Ctrl-C) ended it; `checkpoint` is then at `steps_done`.
    #[serde(default)]
    pub interrupted: bool,
}
