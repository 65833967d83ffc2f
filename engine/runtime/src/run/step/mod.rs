//! What both schedules share, below them (nothing here imports a schedule): `open` (the output
//! directory, the task, a fresh run's opening and how a run ends), `batch` (what a step's rollout
//! gives the trainer; a step of single responses), `episodes` (a step of played episodes: the
//! environment's runner), `score` (responses through the run's reward), `eval` (held-out
//! evaluation), `teacher` (on-policy distillation's teacher stage), `train` (a step's learning
//! rates, training and metrics columns), `sft` (the warm-up), `checkpoint` (checkpoints and the
//! final model), `metrics` (metrics.jsonl and TensorBoard) and `samples` (samples.jsonl: a few
//! samples of a step, to read).

pub(crate) mod batch;
pub(crate) mod checkpoint;
pub(crate) mod episodes;
pub(crate) mod eval;
pub(crate) mod metrics;
pub(crate) mod open;
pub(crate) mod samples;
pub(crate) mod score;
pub(crate) mod sft;
pub(crate) mod teacher;
pub(crate) mod train;

pub use batch::StepBatch;
pub use metrics::Metrics;
pub use train::peak_rss_bytes;
