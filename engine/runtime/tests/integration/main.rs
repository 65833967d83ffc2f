//! The runtime's integration tests, one test binary (`cargo test -p miles-runtime --test
//! integration`; link time dominates a test build, issue #34): the asynchronous executor on the
//! simulated backend, a user's own data, tokenizer and reward, compacted episodes, OpenEnv
//! against a real server, and DAPO's dynamic sampling and overlong shaping. Each module was a test
//! binary of its own; `cargo test -p miles-runtime --test integration MODULE::` runs one.

mod async_sched;
mod bring_your_own;
mod compaction;
mod dynamic_sampling;
mod one_reward;
mod openenv;
mod overlong;
mod resume;
mod support;
