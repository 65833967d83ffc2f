//! Backend-neutral runtime of miles: the run spec, tasks with verifiable rewards, the traits a
//! compute backend implements, and the synchronous executor.

pub mod error;
pub mod spec;

pub use error::*;
pub use spec::*;
