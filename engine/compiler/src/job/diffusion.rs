//! A diffusion RL recipe (a `denoise` rollout sampling from a `denoiser`) as typed values: the
//! first `denoise_pretrain`, `denoise`, `image_reward`, `diffusion_grpo` and `image_eval` stages,
//! each with the fields the stdlib filled.

use super::model::{DenoiserModel, ModelJob};
use super::read::{upstream, Fields};
use super::stages::StageJob;
use crate::graph::{StageGraph, StageNode};
use crate::value::PortKind;

#[derive(Clone, Debug, PartialEq)]
pub struct DiffusionJob {
    pub model: DenoiserModel,
    pub pretrain: Option<DenoisePretrainJob>,
    pub rollout: DenoiseJob,
    pub reward: Option<ImageRewardJob>,
    pub train: Option<DiffusionTrainJob>,
    pub eval: Option<ImageEvalJob>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct DenoisePretrainJob {
    pub stage: String,
    pub steps: u64,
    pub lr: f64,
    pub batch: u64,
    pub p_uncond: f64,
    pub seed: Option<u64>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct DenoiseJob {
    pub stage: String,
    /// Denoising steps per sample.
    pub steps: u64,
    /// `linear` or `cosine`.
    pub schedule: String,
    pub eta: f64,
    pub guidance: f64,
    pub samples_per_condition: u64,
    pub micro_group: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ImageRewardJob {
    pub stage: String,
    /// A trained classifier's directory; None: one trained at the start of the run.
    pub classifier: Option<String>,
    pub classifier_steps: u64,
    pub classifier_weight: f64,
    pub temperature: f64,
    /// `brightness`, `contrast`, `center_mass`.
    pub analytic: Option<String>,
    pub analytic_weight: f64,
    pub streaming: bool,
    /// Seconds of extra cost per scored micro-group.
    pub extra_cost_s: f64,
    pub process: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub struct DiffusionTrainJob {
    pub stage: String,
    /// The reward stage that scores its samples.
    pub reward: Option<String>,
    pub conditions_per_step: u64,
    pub lr: f64,
    pub clip: f64,
    pub kl_coef: f64,
    pub train_steps: Option<u64>,
    pub std_norm: bool,
    pub grad_clip: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ImageEvalJob {
    pub stage: String,
    pub every: u64,
    pub samples: u64,
    pub judge_steps: u64,
}

impl DiffusionJob {
    /// None for a recipe with no `denoise` stage sampling from a `denoiser`.
    /// `stages`: the recipe's stages as `StageJob::of` read them (the denoiser is theirs).
    pub(super) fn of(g: &StageGraph, stages: &[StageJob]) -> Option<DiffusionJob> {
        let rollout = g.nodes().find(|n| n.kind == "denoise")?;
        let model = stages.iter().find(|s| s.name == rollout.name).and_then(|s| s.model.as_ref());
        let Some(ModelJob::Denoiser(model)) = model.cloned() else { return None };
        let of_kind = |kind: &str| g.nodes().find(|n| n.kind == kind);
        let count = |n: &StageNode, name: &str| n.u64(name).map_or(0, |v| v.value);
        let real = |n: &StageNode, name: &str| n.f64(name).map_or(0.0, |v| v.value);
        let on = |n: &StageNode, name: &str| n.bool(name).is_some_and(|b| b.value);
        Some(DiffusionJob {
            model,
            pretrain: of_kind("denoise_pretrain").map(|n| DenoisePretrainJob {
                stage: n.name.clone(),
                steps: count(n, "steps"),
                lr: real(n, "lr"),
                batch: count(n, "batch"),
                p_uncond: real(n, "p_uncond"),
                seed: n.some("seed").and_then(|v| v.as_i64()).map(|s| s.max(0) as u64),
            }),
            rollout: DenoiseJob {
                stage: rollout.name.clone(),
                steps: count(rollout, "steps"),
                schedule: rollout.member("schedule").map_or("cosine", |s| s.value).to_string(),
                eta: real(rollout, "eta"),
                guidance: real(rollout, "guidance"),
                samples_per_condition: count(rollout, "samples_per_condition"),
                micro_group: count(rollout, "micro_group"),
            },
            reward: of_kind("image_reward").map(|n| ImageRewardJob {
                stage: n.name.clone(),
                classifier: n.str("classifier").map(str::to_string),
                classifier_steps: count(n, "classifier_steps"),
                classifier_weight: real(n, "classifier_weight"),
                temperature: real(n, "temperature"),
                analytic: n.member("analytic").map(|a| a.value.to_string()),
                analytic_weight: real(n, "analytic_weight"),
                streaming: on(n, "streaming"),
                extra_cost_s: real(n, "extra_cost"),
                process: on(n, "process"),
            }),
            train: of_kind("diffusion_grpo").map(|n| DiffusionTrainJob {
                stage: n.name.clone(),
                reward: upstream(g, n, PortKind::Scores).map(|r| r.name.clone()),
                conditions_per_step: count(n, "conditions_per_step"),
                lr: real(n, "lr"),
                clip: real(n, "clip"),
                kl_coef: real(n, "kl_coef"),
                train_steps: n.some("train_steps").and(n.u64("train_steps")).map(|v| v.value),
                std_norm: on(n, "std_norm"),
                grad_clip: real(n, "grad_clip"),
            }),
            eval: of_kind("image_eval").map(|n| ImageEvalJob {
                stage: n.name.clone(),
                every: count(n, "every"),
                samples: count(n, "samples"),
                judge_steps: count(n, "judge_steps"),
            }),
        })
    }
}
