//! The runtime's integration tests, one test binary (`cargo test -p miles-runtime --test
//! integration`; link time dominates a test build, issue #34): the asynchronous executor on the
//! simulated backend, a user's own data, tokenizer and reward, compacted episodes, and OpenEnv
//! against a real server. Each module was a test binary of its own; `cargo test -p miles-runtime
//! --test integration MODULE::` runs one.

mod async_sched;
mod bring_your_own;
mod compaction;
mod one_reward;
mod openenv;
mod resume;
