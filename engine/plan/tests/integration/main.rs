//! The planner's integration tests, one test binary (`cargo test -p miles-plan --test
//! integration`; link time dominates a test build, issue #34). Each module was a test binary of
//! its own. Inputs are in `tests/fixtures/`; snapshots in `snapshots/`, named
//! `integration__MODULE__NAME.snap`.

mod html;
mod lengths;
mod plans;
mod recipes;
mod trainers;
