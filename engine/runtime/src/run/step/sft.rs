//! The SFT warm-up before RL: on the task's demonstrations, or an environment's gold episodes.

use super::episodes::tasks_of;
use super::metrics::Metrics;
use crate::backend::{schedule, Trainer};
use crate::progress::Progress;
use crate::rng::derive_seed;
use crate::spec::RunSpec;
use crate::tasks::TaskSet;
use crate::{RunError, E_NONFINITE};
use serde_json::{json, Map};

pub(crate) fn run_sft(
    spec: &RunSpec,
    sft: &crate::spec::SftSpec,
    task: &TaskSet,
    trainer: &mut dyn Trainer,
    metrics: &mut Metrics,
    progress: &mut Progress,
) -> Result<(), RunError> {
    progress.note(&format!("SFT warm-up: {} steps", sft.steps));
    // With an environment, the examples are the turns of its gold episodes (env::demo).
    let demos = match &spec.env {
        Some(e) => Some((e.env.build()?, e.limits(spec.model.max_len)?)),
        None => None,
    };
    for k in 0..sft.steps {
        let items = task.train_batch(spec.seed, "sft", k, sft.batch);
        let batch = match &demos {
            Some((env, limits)) => {
                let codec = crate::env::tools::chat_codec(&task.tokenizer, env.as_ref(), limits.tool_format)?;
                let tasks: Vec<_> =
                    tasks_of(&items, 1, derive_seed(spec.seed, "sft", k), "sft").into_iter().map(|(_, t)| t).collect();
                crate::env::demo::demonstration_pairs(env.as_ref(), &tasks, &codec, limits)?
            }
            None => items
                .iter()
                .map(|it| {
                    Ok((task.tokenizer.encode_prompt(&it.prompt)?, task.tokenizer.encode_answer(&it.label_text())?))
                })
                .collect::<Result<Vec<_>, RunError>>()?,
        };
        let lr = schedule(sft.lr, sft.warmup_steps, crate::spec::Decay::None, 0.0, k, sft.steps);
        let st = trainer.train_sft(&batch, lr)?;
        if !st.loss.is_finite() {
            return Err(RunError::new(E_NONFINITE, format!("SFT loss became NaN/infinite at SFT step {}", k + 1))
                .with_help("lower sft.lr"));
        }
        if (k + 1) % 10 == 0 || k + 1 == sft.steps {
            let mut row = Map::new();
            row.insert("step".into(), json!(0));
            row.insert("sft/step".into(), json!(k + 1));
            row.insert("sft/loss".into(), json!(st.loss));
            row.insert("sft/grad_norm".into(), json!(st.grad_norm));
            metrics.write(&row)?;
            progress.sft(k + 1, sft.steps, st.loss);
        }
    }
    Ok(())
}
