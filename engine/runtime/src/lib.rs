//! Backend-neutral runtime of miles: the run spec, tasks with verifiable rewards, the traits a
//! compute backend implements (rollout engine, trainer, reward, weight transport), and the
//! executors: synchronous (`exec::run_with`) and asynchronous (`async_exec`, for the
//! `one_step_off` and `fully_async` schedules; `run_with` dispatches to it).

pub mod async_exec;
pub mod backend;
pub mod buffer;
pub mod diffusion;
pub mod distributed;
pub mod env;
pub mod error;
pub mod exec;
pub mod http_client;
pub mod line_child;
pub mod progress;
pub mod reward;
pub mod rng;
pub mod routing;
pub mod schedule;
pub mod session;
pub mod sim;
pub mod source;
pub mod spec;
pub mod stream;
pub mod tasks;
pub mod tensorboard;
pub mod tokenize;

pub use backend::*;
pub use error::*;
pub use exec::run_with;
pub use routing::{RouteId, Routing};
pub use spec::*;
pub use stream::*;
