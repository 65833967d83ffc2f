//! The typed `Job`: a compiled recipe read once, into the values `miles plan` and `miles run`
//! both consume. Built during lowering (`recipe.rs`) and stored on `CompiledRecipe::job`, so the
//! planner (`engine/plan/src/from_recipe.rs`) and the run spec (`src/runspec.rs`) never read a
//! stage or a record by field name and cannot disagree about what a recipe means.
//!
//! `read.rs` is the one accessor set (typed values with the span the recipe set them at),
//! `model.rs` what a model is, `stages.rs` rollouts, trainers, teachers, syncs and the schedule,
//! `diffusion.rs` a diffusion recipe's stages. Adding a field read by plan and run means adding it
//! here once (docs/architecture.md, "Adding a feature family").

pub mod diffusion;
pub mod model;
pub mod read;
pub mod stages;

pub use diffusion::*;
pub use model::*;
pub use stages::*;

use crate::graph::StageGraph;
use crate::value::Value;
use miles_grammar::diag::Spanned;
use read::Fields;

/// What a recipe runs: a language-model job, or a diffusion job (it samples with `denoise`).
#[derive(Clone, Debug, PartialEq)]
pub enum Family {
    Lm,
    Diffusion(Box<DiffusionJob>),
}

/// A compiled recipe as typed values.
#[derive(Clone, Debug, PartialEq)]
pub struct Job {
    pub family: Family,
    /// Every stage but the weight syncs, in graph order.
    pub stages: Vec<StageJob>,
    pub syncs: Vec<SyncJob>,
    pub schedule: ScheduleJob,
    pub seed: u64,
    /// Training steps (`stop`).
    pub stop: u64,
    /// `colocated` or `disaggregated`, with its span when the recipe set it.
    pub placement: Option<Spanned<String>>,
    /// A `local` cluster's `device` (`cpu`, `cuda`, `auto`, ...).
    pub device: Option<Spanned<String>>,
}

impl Job {
    /// Reads the lowered graph and the `recipe_settings` record.
    pub fn read(g: &StageGraph, settings: &Value) -> Job {
        let settings = settings.as_record();
        let field = |name: &str| settings.and_then(|s| s.fields.get(name));
        let stages: Vec<StageJob> = g.nodes().filter(|n| n.kind != "weights").map(|n| StageJob::of(g, n)).collect();
        let syncs = g.nodes().filter(|n| n.kind == "weights").map(SyncJob::of).collect();
        let schedule = match field("schedule") {
            Some(f) => match f.value.as_record() {
                Some(r) => ScheduleJob::of(r, (!f.defaulted).then_some(f.span)),
                None => ScheduleJob::sync(),
            },
            None => ScheduleJob::sync(),
        };
        let cluster = settings.and_then(|s| s.record("cluster"));
        Job {
            family: match DiffusionJob::of(g, &stages) {
                Some(d) => Family::Diffusion(Box::new(d)),
                None => Family::Lm,
            },
            stages,
            syncs,
            schedule,
            seed: settings.and_then(|s| s.value("seed")).and_then(Value::as_i64).unwrap_or(0).max(0) as u64,
            stop: settings.and_then(|s| s.u64("stop")).map_or(0, |v| v.value),
            placement: field("placement").and_then(|f| {
                Some(Spanned { value: f.value.as_enum()?.to_string(), span: (!f.defaulted).then_some(f.span) })
            }),
            device: cluster
                .filter(|c| c.schema_name == "local")
                .and_then(|c| c.member("device"))
                .map(|d| d.map(str::to_string)),
        }
    }

    /// The episodes of the first rollout scored by an environment (`env_reward`).
    pub fn episodes(&self) -> Option<&EpisodesJob> {
        self.stages.iter().find_map(|s| s.episodes.as_ref())
    }

    pub fn stage(&self, name: &str) -> Option<&StageJob> {
        self.stages.iter().find(|s| s.name == name)
    }

    /// The trainers (`Role::Train`: grpo, ppo, a user kind with a Policy output; not SFT), in
    /// graph order.
    pub fn trainers(&self) -> impl Iterator<Item = &StageJob> {
        self.stages.iter().filter(|s| s.role == Role::Train)
    }

    /// The rollout a trainer trains on.
    pub fn rollout_of(&self, train: &StageJob) -> Option<&StageJob> {
        self.stage(train.train.as_ref()?.rollout.as_deref()?)
    }

    /// The `teacher_logprobs` stage a trainer's `opd` names.
    pub fn teacher_of(&self, train: &StageJob) -> Option<&StageJob> {
        self.stage(train.train.as_ref()?.opd.as_ref()?.teacher.as_deref()?)
    }

    /// The rollout whose lengths a run is planned at: the (first) trainer's, else the first
    /// `generate`.
    pub fn main_rollout(&self) -> Option<&StageJob> {
        self.trainers().find_map(|t| self.rollout_of(t)).or_else(|| self.stages.iter().find(|s| s.kind == "generate"))
    }
}
