//! Scoring: responses through the run's reward (`eval` measures held-out success with it), and
//! that reward shared by every part of a run that scores. A rollout's responses (not an
//! evaluation's) also get DAPO's overlong shaping here (`score_rollout`), the one place both
//! schedules form a single response's reward.

use crate::reward::spec::build_run_reward;
use crate::reward::{BatchReward, BatchScores, RewardInput, RewardOutcome};
use crate::sample::FinishReason;
use crate::spec::{OverlongSpec, RunSpec};
use crate::tasks::{PromptRow, TaskSet};
use crate::token::TokenId;
use crate::RunError;
use std::sync::{Arc, Mutex};

/// The run's one reward: rollouts and evaluations, on any thread, score through clones of it, so
/// a command reward's program is started once per run and an HTTP reward's client made once. A
/// call holds it for one batch (a program answers one request at a time anyway).
#[derive(Clone)]
pub(crate) struct SharedReward {
    name: String,
    inner: Arc<Mutex<Box<dyn BatchReward>>>,
}

impl SharedReward {
    pub(crate) fn for_run(spec: &RunSpec) -> Result<SharedReward, RunError> {
        let r = build_run_reward(spec)?;
        Ok(SharedReward { name: r.name().to_string(), inner: Arc::new(Mutex::new(r)) })
    }

    pub(crate) fn boxed(&self) -> Box<dyn BatchReward> {
        Box::new(self.clone())
    }
}

impl BatchReward for SharedReward {
    fn name(&self) -> &str {
        &self.name
    }

    fn score_batch(&mut self, items: &[RewardInput]) -> Result<Vec<RewardOutcome>, RunError> {
        // A thread that panicked while scoring is reported by its join; the reward itself settles
        // a half-answered batch (a command is restarted on its next batch).
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).score_batch(items)
    }

    fn score_parts(&mut self, items: &[RewardInput]) -> Result<BatchScores, RunError> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).score_parts(items)
    }
}

/// A response to score: its sample id (what a failing reward's message names, e.g.
/// `step12/p3/s1`), its prompt row, its ids and how it ended.
pub(crate) type Scored<'a> = (String, &'a PromptRow, &'a [TokenId], FinishReason);

/// Scores responses with `reward`, in order; `groups[i]` is response i's group in this batch (the
/// responses to one prompt share one), which a group reward scores together.
pub(crate) fn score_responses(
    reward: &mut dyn BatchReward,
    task: &TaskSet,
    responses: &[Scored],
    groups: &[usize],
) -> Result<BatchScores, RunError> {
    debug_assert_eq!(responses.len(), groups.len());
    let inputs: Vec<_> = responses
        .iter()
        .zip(groups.iter().copied())
        .map(|((id, row, ids, finish), group)| RewardInput {
            group,
            ..row.reward_input(id.clone(), task.tokenizer.decode(ids), *finish)
        })
        .collect();
    let out = reward.score_parts(&inputs)?;
    let short = |n: usize| n != inputs.len();
    if short(out.outcomes.len()) || out.parts.iter().any(|p| short(p.scores.len())) {
        return Err(RunError::new(
            crate::reward::E_REWARD,
            format!("reward `{}` returned {} results for {} samples", reward.name(), out.outcomes.len(), inputs.len()),
        ));
    }
    Ok(out)
}

/// Scores a rollout's responses as `score_responses` does, then adds DAPO's overlong shaping
/// (`train.overlong`, `OverlongSpec::shaping` of the response's length in tokens) to each scored
/// response's reward. A reward that failed under `on_error = zero` trains on 0, unshaped, as its
/// rule says; an evaluation scores with `score_responses` (its accuracy is the task's reward).
pub(crate) fn score_rollout(
    spec: &RunSpec,
    reward: &mut dyn BatchReward,
    task: &TaskSet,
    responses: &[Scored],
    groups: &[usize],
) -> Result<BatchScores, RunError> {
    let mut out = score_responses(reward, task, responses, groups)?;
    if let Some(o) = &spec.train.overlong {
        for (outcome, (_, _, ids, _)) in out.outcomes.iter_mut().zip(responses) {
            if let RewardOutcome::Score(r) = outcome {
                *r += o.shaping(ids.len()) as f32;
            }
        }
    }
    Ok(out)
}

/// `reward/overlong_mean` (the mean shaping) and `reward/overlong_frac` (the share penalised) of
/// responses of these lengths; none for no response.
pub(crate) fn overlong_metrics(o: &OverlongSpec, lens: impl Iterator<Item = usize>) -> Vec<(String, f64)> {
    let (mut n, mut sum, mut penalised) = (0usize, 0f64, 0usize);
    for len in lens {
        let s = o.shaping(len);
        n += 1;
        sum += s;
        penalised += usize::from(s < 0.0);
    }
    if n == 0 {
        return Vec::new();
    }
    vec![
        ("reward/overlong_mean".to_string(), sum / n as f64),
        ("reward/overlong_frac".to_string(), penalised as f64 / n as f64),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reward::{OnRewardError, RewardSpec};
    use crate::run::step::batch::single_turn_batch;
    use crate::sample::Sample;

    fn rank_py() -> String {
        format!("{}/../../recipes/rewards/rank.py", env!("CARGO_MANIFEST_DIR"))
    }

    fn ranking(mode: &str) -> RewardSpec {
        RewardSpec::Command {
            name: "rank".into(),
            command: vec!["python3".into(), rank_py(), mode.into()],
            cwd: None,
            timeout_s: 20.0,
            on_error: OnRewardError::Stop,
            pass_env: vec![],
            group: true,
        }
    }

    /// Two prompts of four responses each, interleaved (p0 s0, p1 s0, p0 s1, ...), so a group
    /// reward that got the batch in order rather than by group would rank the wrong responses.
    /// Prompt 0 answers [label, wrong, wrong, wrong], prompt 1 [wrong, wrong, label, wrong].
    fn step(spec: &RunSpec, reward: &RewardSpec) -> crate::run::step::batch::StepBatch {
        let task = TaskSet::build(&spec.task).unwrap();
        let items = &task.test[..2];
        let prompts: Vec<_> = items.iter().map(|r| task.tokenizer.encode_prompt(&r.prompt).unwrap()).collect();
        let answer = |row: &PromptRow, right: bool| {
            let label = row.label_text();
            let text = if right { label } else { if label.starts_with('9') { "8" } else { "9" }.to_string() };
            task.tokenizer.encode_answer(&text).unwrap()
        };
        let right = [[true, false, false, false], [false, false, true, false]];
        let samples: Vec<Sample> = (0..4)
            .flat_map(|j| (0..2).map(move |p| (p, j)))
            .map(|(p, j)| Sample {
                prompt_index: p,
                response: answer(&items[p], right[p][j]),
                logprobs: Vec::new(),
                finish: FinishReason::Stop,
                weight_version: 0,
                routing: None,
            })
            .collect();
        let mut r = reward.build().unwrap();
        single_turn_batch(spec, &task, r.as_mut(), (items.to_vec(), prompts.clone(), samples.clone()), 0).unwrap()
    }

    /// Group 0's values, in response order (the batch holds the groups interleaved).
    fn group0(b: &crate::run::step::batch::StepBatch) -> (Vec<f32>, Vec<f32>) {
        let of = |i: usize| b.groups[i] == 0;
        let rewards = (0..b.rewards.len()).filter(|&i| of(i)).map(|i| b.rewards[i]).collect();
        let adv = (0..b.batch.len()).filter(|&i| of(i)).map(|i| b.batch[i].advantage).collect();
        (rewards, adv)
    }

    fn close(got: &[f32], want: &[f64]) {
        assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
        for (g, w) in got.iter().zip(want) {
            assert!((f64::from(*g) - w).abs() < 1e-5, "{got:?} vs {want:?}");
        }
    }

    #[test]
    fn a_ranking_group_reward_changes_the_advantages_as_computed_by_hand() {
        let mut spec = RunSpec::from_json(include_str!("../../../tests/data/tiny.json")).unwrap();
        // Ranks [1, 0.5, 0, 0]: mean 0.375, centred [0.625, 0.125, -0.375, -0.375].
        spec.train.std_norm = false;
        let b = step(&spec, &ranking("ok"));
        let (rewards, adv) = group0(&b);
        assert_eq!(rewards, [1.0, 0.5, 0.0, 0.0]);
        assert_eq!(adv, [0.625, 0.125, -0.375, -0.375]);
        // Prompt 1's own ranking: its right answer is its third response.
        let g1: Vec<f32> = (0..8).filter(|&i| b.groups[i] == 1).map(|i| b.rewards[i]).collect();
        assert_eq!(g1, [0.5, 0.0, 1.0, 0.0]);
        // Unbiased variance (0.390625 + 0.015625 + 2 * 0.140625) / 3 = 0.2291667, std 0.4787136.
        spec.train.std_norm = true;
        let (_, adv) = group0(&step(&spec, &ranking("ok")));
        let std = (0.6875f64 / 3.0).sqrt() + 1e-6;
        close(&adv, &[0.625 / std, 0.125 / std, -0.375 / std, -0.375 / std]);
        // Weighed with exact match (1 for the label, else 0): 1.0 * rank + 0.5 * exact =
        // [1.5, 0.5, 0, 0], mean 0.5, centred [1, 0, -0.5, -0.5], variance 1.5 / 3, std 0.7071068.
        let both = RewardSpec::Combine {
            name: "both".into(),
            parts: vec![ranking("ok"), RewardSpec::ExactMatch { name: "correct".into(), partial_credit: false }],
            weights: vec![1.0, 0.5],
        };
        spec.train.std_norm = false;
        let b = step(&spec, &both);
        let (rewards, adv) = group0(&b);
        assert_eq!(rewards, [1.5, 0.5, 0.0, 0.0]);
        assert_eq!(adv, [1.0, 0.0, -0.5, -0.5]);
        // Each part's mean over the step's 8 samples: rank (1.5 + 1.5) / 8, exact 2 / 8.
        let col = |k: &str| b.metrics.iter().find(|(n, _)| n == k).map(|(_, v)| *v);
        assert_eq!(col("reward/rank"), Some(3.0 / 8.0));
        assert_eq!(col("reward/correct"), Some(2.0 / 8.0));
        assert_eq!(col("reward/scored"), Some(8.0));
        spec.train.std_norm = true;
        let (_, adv) = group0(&step(&spec, &both));
        let std = 0.5f64.sqrt() + 1e-6;
        close(&adv, &[1.0 / std, 0.0, -0.5 / std, -0.5 / std]);
    }

    #[test]
    fn overlong_shaping_by_hand() {
        // DAPO eq. 13 with max 6, cache 3, penalty 0.5: 0 up to 6 - 3 = 3 tokens, then
        // -0.5 (len - 3) / 3 up to 6 tokens, -0.5 beyond.
        let o = OverlongSpec { max: 6, cache: 3, penalty: 0.5 };
        let got: Vec<f32> = (1..=8).map(|l| o.shaping(l) as f32).collect();
        close(&got, &[0.0, 0.0, 0.0, -1.0 / 6.0, -1.0 / 3.0, -0.5, -0.5, -0.5]);

        let mut spec = RunSpec::from_json(include_str!("../../../tests/data/tiny.json")).unwrap();
        spec.train.std_norm = false;
        spec.train.overlong = Some(o);
        let task = TaskSet::build(&spec.task).unwrap();
        let items = &task.test[..2];
        let prompts: Vec<_> = items.iter().map(|r| task.tokenizer.encode_prompt(&r.prompt).unwrap()).collect();
        // A response of exactly `len` ids: the answer and its stop id, then ids after the stop
        // (decoding ends at the stop, so the exact-match reward reads only the answer).
        let response = |row: &PromptRow, right: bool, len: usize| {
            let label = row.label_text();
            let text = if right { label } else { if label.starts_with('9') { "8" } else { "9" }.to_string() };
            let mut ids = task.tokenizer.encode_answer(&text).unwrap();
            let pad = task.tokenizer.encode_answer("1").unwrap()[0];
            assert!(ids.len() <= len, "{text} is longer than {len} ids");
            ids.resize(len, pad);
            ids
        };
        // Prompt 0: right in 3 ids, right in 5, wrong in 4, wrong in 8: shaping 0, -1/3, -1/6,
        // -1/2. Prompt 1: four answers of 3 ids, none shaped.
        let plan = [[(true, 3), (true, 5), (false, 4), (false, 8)], [(true, 3), (true, 3), (false, 3), (false, 3)]];
        let samples: Vec<Sample> = (0..2)
            .flat_map(|p| (0..4).map(move |j| (p, j)))
            .map(|(p, j)| Sample {
                prompt_index: p,
                response: response(&items[p], plan[p][j].0, plan[p][j].1),
                logprobs: Vec::new(),
                finish: FinishReason::Stop,
                weight_version: 0,
                routing: None,
            })
            .collect();
        let exact = RewardSpec::ExactMatch { name: "correct".into(), partial_credit: false };
        let mut r = exact.build().unwrap();
        let b =
            single_turn_batch(&spec, &task, r.as_mut(), (items.to_vec(), prompts.clone(), samples.clone()), 1).unwrap();
        // Rewards 1, 1 - 1/3, 0 - 1/6, 0 - 1/2 (mean 1/4) and 1, 1, 0, 0 (mean 1/2).
        close(&b.rewards, &[1.0, 2.0 / 3.0, -1.0 / 6.0, -0.5, 1.0, 1.0, 0.0, 0.0]);
        let adv: Vec<f32> = b.batch.iter().map(|t| t.advantage).collect();
        close(&adv, &[0.75, 5.0 / 12.0, -5.0 / 12.0, -0.75, 0.5, 0.5, -0.5, -0.5]);
        assert_eq!(b.batch[1].reward, b.rewards[1], "the trajectory carries the shaped reward");
        // Over the step's 8 scored responses: shaping sums to -1, 3 of them penalised.
        let col = |k: &str| b.metrics.iter().find(|(n, _)| n == k).map(|(_, v)| *v);
        assert!((col("reward/overlong_mean").unwrap() + 1.0 / 8.0).abs() < 1e-12, "{:?}", b.metrics);
        assert_eq!(col("reward/overlong_frac"), Some(3.0 / 8.0));
        // Evaluation scores the same responses unshaped: the task's reward.
        let scored: Vec<Scored> =
            samples.iter().map(|s| (String::new(), &items[s.prompt_index], &s.response[..], s.finish)).collect();
        let groups: Vec<usize> = samples.iter().map(|s| s.prompt_index).collect();
        let plain = score_responses(r.as_mut(), &task, &scored, &groups).unwrap();
        let plain: Vec<f32> = plain.outcomes.iter().map(|o| o.reward().unwrap()).collect();
        assert_eq!(plain, [1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0]);
        // Without `overlong` the same step trains on those, with no overlong columns.
        spec.train.overlong = None;
        let b =
            single_turn_batch(&spec, &task, r.as_mut(), (items.to_vec(), prompts.clone(), samples.clone()), 1).unwrap();
        assert_eq!(b.rewards, plain);
        assert!(b.metrics.iter().all(|(k, _)| !k.starts_with("reward/overlong")), "{:?}", b.metrics);
    }

    #[test]
    fn a_wrong_count_of_scores_fails_the_group_and_names_it() {
        let spec = RunSpec::from_json(include_str!("../../../tests/data/tiny.json")).unwrap();
        let task = TaskSet::build(&spec.task).unwrap();
        let mut r = ranking("count").build().unwrap();
        let row = &task.test[0];
        let ids = task.tokenizer.encode_answer("1").unwrap();
        let scored: Vec<Scored> =
            (0..3).map(|j| (format!("step0/p0/s{j}"), row, &ids[..], FinishReason::Stop)).collect();
        let e = score_responses(r.as_mut(), &task, &scored, &[0, 0, 0]).unwrap_err();
        assert_eq!(e.code, crate::reward::E_REWARD);
        assert!(
            e.message.starts_with(
                "reward `rank` failed on sample step0/p0/s0: group step0/p0: answered 2 scores for 3 samples"
            ),
            "{e}"
        );
    }
}
