//! From a compiled diffusion recipe (a `denoise` rollout) to the embedded backend's
//! `DiffusionRunSpec` (engine/runtime/src/diffusion.rs). The stdlib's checks, the capability
//! table and its shape rules (`capability::shape::diffusion_run`: one denoiser, one `denoise`
//! rollout, one `image_reward`, one `diffusion_grpo`) have refused what the run cannot do.

use miles_compiler::capability;
use miles_compiler::job::DiffusionJob;
use miles_compiler::{CompiledRecipe, Diagnostic};
use miles_grammar::diag::ErrorCode;
use miles_runtime::diffusion::*;
use std::path::PathBuf;

/// Whether `recipe` is a diffusion recipe (it samples with `denoise`).
pub fn is_diffusion(recipe: &CompiledRecipe) -> bool {
    recipe.graph.nodes().any(|n| n.kind == "denoise")
}

pub fn diffusion_spec(recipe: &CompiledRecipe) -> Result<DiffusionRunSpec, Vec<Diagnostic>> {
    // Every refusal of the recipe's shape (E0511) comes from the run contract.
    let d = capability::shape::diffusion_run(recipe)?;
    let (seed, stop) = (recipe.job.seed, recipe.job.stop);
    let DiffusionJob { model, pretrain, rollout: r, reward: Some(reward), train: Some(train), eval } = d else {
        return Err(vec![Diagnostic::error(
            ErrorCode::E0511,
            "internal error: a diffusion job without its reward or trainer",
        )
        .with_primary(recipe.span, "while mapping this recipe to a run")
        .with_help("this is a bug in miles, not in the recipe; please report it")]);
    };
    let rollout_span = recipe.job.stage(&r.stage).map_or(recipe.span, |s| s.name_span);
    let model = DenoiserConfig {
        side: model.side as usize,
        conditions: model.conditions as usize,
        hidden: model.hidden as usize,
        layers: model.layers as usize,
    };
    let pretrain = match pretrain {
        Some(p) => {
            PretrainSpec { steps: p.steps, lr: p.lr, batch: p.batch as usize, p_uncond: p.p_uncond, seed: p.seed }
        }
        // No pretraining stage: RL starts from the seeded, untrained denoiser.
        None => PretrainSpec { steps: 0, lr: 0.0, batch: 1, p_uncond: 0.0, seed: None },
    };
    let (every, samples, judge_steps) = match eval {
        Some(e) => (e.every.max(1), e.samples as usize, e.judge_steps),
        // No evaluation stage: the held-out samples are drawn once before RL and once at the end.
        None => (stop.max(1), 32, 0),
    };
    let spec = DiffusionRunSpec {
        seed,
        model,
        schedule: if r.schedule == "linear" { ScheduleKind::Linear } else { ScheduleKind::Cosine },
        steps: r.steps as usize,
        eta: r.eta,
        guidance: r.guidance,
        pretrain,
        reward: DiffusionRewardSpec {
            classifier_steps: reward.classifier_steps,
            classifier_path: reward.classifier.as_ref().map(PathBuf::from),
            classifier_weight: reward.classifier_weight,
            classifier_temperature: reward.temperature,
            analytic: match reward.analytic.as_deref() {
                Some("brightness") => Some(AnalyticReward::Brightness),
                Some("contrast") => Some(AnalyticReward::Contrast),
                Some("center_mass") => Some(AnalyticReward::CenterMass),
                _ => None,
            },
            analytic_weight: reward.analytic_weight,
            extra_cost_ms: (reward.extra_cost_s * 1000.0).round().max(0.0) as u64,
            process: reward.process,
        },
        rl: DiffusionRlSpec {
            steps: stop,
            conditions_per_step: train.conditions_per_step as usize,
            samples_per_condition: r.samples_per_condition as usize,
            micro_group: r.micro_group as usize,
            lr: train.lr,
            clip: train.clip,
            kl_coef: train.kl_coef,
            train_steps: train.train_steps.map(|n| n as usize),
            std_norm: train.std_norm,
            grad_clip: train.grad_clip,
        },
        eval: DiffusionEvalSpec { every, samples, judge_steps },
        streaming: reward.streaming,
    };
    // The runtime's own rules, a backstop: the stdlib's checks state each at its field first.
    if let Err(e) = spec.validate() {
        let d =
            Diagnostic::error(ErrorCode::E0511, e.message).with_primary(rollout_span, "the diffusion run refuses this");
        return Err(vec![d]);
    }
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;
    use miles_compiler::fs::MemoryFs;
    use miles_compiler::{compile, Options};

    fn spec_of(text: &str) -> Result<DiffusionRunSpec, Vec<String>> {
        let fs = MemoryFs::with(&[("d.miles", text)]);
        let c = compile(&fs, &["d.miles".to_string()], &Options::default());
        let errors: Vec<String> = c.diagnostics.iter().filter(|d| d.is_error()).map(|d| d.message.clone()).collect();
        if !errors.is_empty() {
            return Err(errors);
        }
        let r = &c.recipes[0];
        assert!(is_diffusion(r));
        diffusion_spec(r).map_err(|d| d.into_iter().map(|d| d.message).collect())
    }

    const RECIPE: &str = r#"
model policy = denoiser { side = 12, conditions = 4, hidden = 64, layers = 1 }
recipe d {
    pretrain = denoise_pretrain(policy) { steps = 50.steps, lr = 1e-3, batch = 8, p_uncond = 0.2, seed = 11 }
    rollout = denoise(pretrain) { steps = 10, schedule = linear, eta = 0.5, guidance = 2.0, samples_per_condition = 4, micro_group = 2 }
    reward = image_reward(rollout) { classifier_steps = 30, classifier_weight = 0.5, temperature = 4.0,
                                     analytic = contrast, analytic_weight = 2.0, streaming = false, extra_cost = 15.ms,
                                     process = true }
    train = diffusion_grpo(rollout, reward) { conditions_per_step = 3, lr = 1e-4, clip = 0.1, kl_coef = 0.02,
                                              train_steps = 5, std_norm = false, grad_clip = 0.5 }
    sync = weights(train -> rollout) { transport = local }
    eval = image_eval(rollout) { every = 5.steps, samples = 16, judge_steps = 40 }
    seed = 7
    stop = 20.steps
}
"#;

    #[test]
    fn diffusion_recipe_fields_reach_the_spec() {
        let s = spec_of(RECIPE).unwrap();
        assert_eq!(s.seed, 7);
        assert_eq!(s.model, DenoiserConfig { side: 12, conditions: 4, hidden: 64, layers: 1 });
        assert_eq!((s.schedule, s.steps, s.eta, s.guidance), (ScheduleKind::Linear, 10, 0.5, 2.0));
        assert_eq!(s.pretrain, PretrainSpec { steps: 50, lr: 1e-3, batch: 8, p_uncond: 0.2, seed: Some(11) });
        let r = &s.reward;
        assert_eq!((r.classifier_steps, r.classifier_weight, r.classifier_temperature), (30, 0.5, 4.0));
        assert_eq!((r.analytic, r.analytic_weight, r.extra_cost_ms), (Some(AnalyticReward::Contrast), 2.0, 15));
        assert_eq!((r.classifier_path.as_ref(), r.process), (None, true));
        let t = &s.rl;
        assert_eq!((t.steps, t.conditions_per_step, t.samples_per_condition, t.micro_group), (20, 3, 4, 2));
        assert_eq!(
            (t.lr, t.clip, t.kl_coef, t.train_steps, t.std_norm, t.grad_clip),
            (1e-4, 0.1, 0.02, Some(5), false, 0.5)
        );
        assert_eq!((s.eval.every, s.eval.samples, s.eval.judge_steps), (5, 16, 40));
        assert!(!s.streaming);
        assert!(s.validate().is_ok());
    }

    #[test]
    fn a_second_stage_of_a_kind_is_refused_and_evaluation_is_optional() {
        let e = spec_of(&RECIPE.replace("    sync = weights", "    again = image_eval(rollout)\n    sync = weights"))
            .unwrap_err();
        assert!(e.iter().any(|m| m.contains("a second `image_eval` stage")), "{e:?}");
        let s = spec_of(
            &RECIPE.replace("    eval = image_eval(rollout) { every = 5.steps, samples = 16, judge_steps = 40 }\n", ""),
        )
        .unwrap();
        assert_eq!((s.eval.every, s.eval.samples, s.eval.judge_steps), (20, 32, 0), "before RL and at the end");
    }
}
