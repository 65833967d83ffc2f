//! Executing a run spec. The schedules are siblings: `sync` (the default) and `async_` (the
//! `one_step_off` and `fully_async` schedules, docs/async.md), each over the pieces both share,
//! below them in `step` (opening a run, a step's batch, scoring and evaluation, the teacher stage,
//! training, SFT, checkpoints and metrics). [`run_with`] checks the spec, builds the task and hands
//! the run to its schedule.

mod async_;
pub(crate) mod step;
mod sync;

use crate::backend::Backend;
use crate::spec::{RunOptions, RunSpec, Summary};
use crate::RunError;
use std::time::Instant;

/// Runs `spec` on `backend`. Errors carry E05xx codes; nothing panics on bad input.
pub fn run_with(spec: &RunSpec, opts: &RunOptions, backend: &dyn Backend) -> Result<Summary, RunError> {
    let started = Instant::now();
    spec.validate()?;
    let task = step::open::build_task(spec)?;
    let lanes = sync::lanes::lanes_of(spec)?;
    if !spec.schedule.is_sync() {
        return async_::run(spec, opts, backend, task, started);
    }
    sync::run(spec, opts, backend, task, lanes, started)
}
