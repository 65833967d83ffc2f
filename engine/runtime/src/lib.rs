//! Backend-neutral runtime of miles: the run spec, tasks with verifiable rewards, the traits a
//! compute backend implements (rollout engine, trainer, reward, weight transport), and the
//! executors (`run`): synchronous, and asynchronous for the `one_step_off` and `fully_async`
//! schedules; [`run_with`] dispatches to them.
//!
//! The modules are layers, each importing only the layers below it (`layers` holds the table and
//! the test that keeps it true); top first:
//!
//! ```text
//! 7  exec                      the executors' old paths, for other crates
//! 6  run                       run_with: the schedules (sync, async_) over their shared pieces
//! 5½ agent                     the rollout plug-in layers: programs playing through the chat server
//! 5  buffer chat               the asynchronous buffer of finished groups; the session server's
//!                              core (OpenAI chat requests onto TITO sessions)
//! 4  env sim stream tasks      environments and episodes, a simulated backend, streaming
//!                              engines, prompts and splits
//! 3  advantage backend reward  advantages from rewards, a backend's traits, rewards, TITO
//!    session                   sessions
//! 2  progress sample tokenize  progress, what engines sample and trainers consume, text <-> ids
//! 1  atomic_write diffusion    writes that survive a kill, the diffusion run spec, HTTP and
//!    http_client line_child    child-process plumbing, seeded streams, checked safetensors
//!    rng safetensors spec      headers, the run spec (plain data)
//! 0  distributed error quote   leaves: the launcher's settings, the error type, quoting text in
//!    routing schedule source   messages, R3 routing, the schedule's settings, the async data
//!    tensorboard token         source, TensorBoard events, token ids
//! ```

pub mod advantage;
pub mod agent;
pub mod atomic_write;
pub mod backend;
pub mod buffer;
pub mod chat;
pub mod child;
pub mod diffusion;
pub mod distributed;
pub mod env;
pub mod error;
pub mod hf_dir;
pub mod http_client;
pub mod line_child;
pub mod progress;
pub mod quote;
pub mod reward;
pub mod rng;
pub mod routing;
mod run;
pub mod safetensors;
pub mod sample;
pub mod schedule;
pub mod session;
pub mod sim;
pub mod source;
pub mod spec;
pub mod stream;
pub mod tasks;
pub mod tensorboard;
pub mod token;
pub mod tokenize;

#[cfg(test)]
mod layers;

pub use advantage::{advantages, grpo_advantages, rloo_advantages, AdvantageRule};
pub use backend::*;
pub use error::*;
pub use routing::{RouteId, Routing};
pub use run::run_with;
pub use sample::*;
pub use spec::*;
pub use stream::*;

/// The executors' old paths (`miles_runtime::exec::...`): the synchronous executor's module
/// before the executors became `run`, kept for the crates that name them.
pub mod exec {
    pub use crate::atomic_write::{write_atomically, write_json};
    pub use crate::run::run_with;
    pub use crate::run::step::{peak_rss_bytes, Metrics, StepBatch};
}
