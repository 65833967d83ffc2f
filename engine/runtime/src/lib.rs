//! Backend-neutral runtime of miles: the run spec, tasks with verifiable rewards, the traits a
//! compute backend implements (rollout engine, trainer, reward, weight transport), and the
//! synchronous executor (`run_with`).

pub mod backend;
pub mod distspec;
pub mod error;
pub mod exec;
pub mod progress;
pub mod rng;
pub mod spec;
pub mod tasks;
pub mod tensorboard;

pub use backend::*;
pub use error::*;
pub use exec::run_with;
pub use spec::*;
