//! `miles plan`: where each stage of a recipe runs, whether it fits in memory, what weight sync
//! and a step will cost, and which settings contradict each other, before any GPU is allocated.
//!
//! Pure: no IO, no clock, no threads. The compiler turns a checked recipe into a [`PlanInput`];
//! [`plan`] turns that into a [`Plan`]; `render_text`, `render_json` and `render_html` print it.
//! Every formula is in docs/plan.md.

pub mod evidence;
#[doc(hidden)]
pub mod fixtures;
pub mod from_recipe;
mod html;
pub mod input;
mod model;
pub mod output;
mod plan;
mod render;
pub mod time;
mod units;

pub use evidence::{Evidence, EvidenceKind};
pub use from_recipe::plan_input;
pub use html::render_html;
pub use input::*;
pub use output::*;
pub use plan::plan;
pub use plan::throttle::{fix_line as throttle_fix_line, limit_line as throttle_limit_line};
pub use render::{render_diagnostics, render_json, render_json_located, render_sections, render_text, summary_line};
pub use units::{gb, secs};
