//! What one RL step's rollout gives the trainer and the metrics, and the step of single responses
//! (`episodes` makes the same from played episodes). A step of single responses is one or more
//! rounds of generation (more than one under DAPO's dynamic sampling, `run::sync`), each scored
//! on its own (`score_round`), then the groups kept made into the trained batch (`round_batch`).

use super::samples;
use super::score::{overlong_metrics, score_rollout, Scored};
use crate::advantage::advantages;
use crate::buffer::is_flat;
use crate::reward::combine::part_metrics;
use crate::reward::{BatchReward, BatchScores, PartScores, RewardOutcome, RewardTally};
use crate::sample::{FinishReason, Sample, Trajectory};
use crate::spec::RunSpec;
use crate::tasks::{PromptRow, TaskSet};
use crate::token::TokenId;
use crate::RunError;

/// What one RL step's rollout gives the trainer and the metrics: single responses or episodes.
#[derive(Default)]
pub struct StepBatch {
    pub batch: Vec<Trajectory>,
    /// One per trained response (episode); a dropped one leaves its group.
    pub rewards: Vec<f32>,
    pub groups: Vec<usize>,
    /// Sampled tokens, responses (episodes), and those that ended on a stop token.
    pub sampled_tokens: usize,
    pub responses: usize,
    pub stopped: usize,
    /// Extra columns of the step's metrics row (reward counts, episode ends, ...).
    pub metrics: Vec<(String, f64)>,
    /// The rows samples.jsonl shows of this step (none on a step that writes no samples).
    pub shown: Vec<super::samples::SampleRow>,
}

/// A step of single responses: scored by the run's reward (sample ids `step12/p3/s1`), dropped
/// samples left out of their group, the run's advantages.
pub(crate) fn single_turn_batch(
    spec: &RunSpec,
    task: &TaskSet,
    reward: &mut dyn BatchReward,
    (items, prompts, samples): Generation,
    step: u64,
) -> Result<StepBatch, RunError> {
    let round = score_round(spec, task, reward, (items, prompts, samples), step, 0)?;
    let generated = Generated::of(spec, std::slice::from_ref(&round));
    Ok(round_batch(spec, task, step, round, generated))
}

/// What one generation round made: its prompt rows, their token ids and the samples.
pub(crate) type Generation = (Vec<PromptRow>, Vec<Vec<TokenId>>, Vec<Sample>);

/// One round of a step's single responses, scored: its prompt rows and their ids, the samples
/// (`prompt_index` into `items`), their ids and the reward's outcomes (overlong shaping added to
/// each score) and parts.
pub(crate) struct ScoredRound {
    pub(crate) items: Vec<PromptRow>,
    pub(crate) prompts: Vec<Vec<TokenId>>,
    pub(crate) samples: Vec<Sample>,
    pub(crate) ids: Vec<String>,
    pub(crate) scores: BatchScores,
}

/// Scores one round's samples with the run's reward: sample ids `step{step}/p{first + i}/s{j}`,
/// `first` being the step's count of prompts in earlier rounds (so every id of a step is its own).
pub(crate) fn score_round(
    spec: &RunSpec,
    task: &TaskSet,
    reward: &mut dyn BatchReward,
    (items, prompts, samples): Generation,
    step: u64,
    first: usize,
) -> Result<ScoredRound, RunError> {
    let mut nth = vec![0usize; items.len()];
    let scored: Vec<Scored> = samples
        .iter()
        .map(|s| {
            let j = nth[s.prompt_index];
            nth[s.prompt_index] += 1;
            let id = format!("step{step}/p{}/s{j}", first + s.prompt_index);
            (id, &items[s.prompt_index], &s.response[..], s.finish)
        })
        .collect();
    // A group reward scores the responses to one prompt together.
    let prompt_of: Vec<usize> = samples.iter().map(|s| s.prompt_index).collect();
    let scores = score_rollout(spec, reward, task, &scored, &prompt_of)?;
    let ids: Vec<String> = scored.into_iter().map(|s| s.0).collect();
    Ok(ScoredRound { items, prompts, samples, ids, scores })
}

impl ScoredRound {
    /// Per prompt row: whether its group carries no signal (the rewards it trains on all equal,
    /// the buffer's `is_flat`; a group with none trained has none either).
    pub(crate) fn flat_groups(&self) -> Vec<bool> {
        let mut rewards: Vec<Vec<f32>> = vec![Vec::new(); self.items.len()];
        for (s, o) in self.samples.iter().zip(&self.scores.outcomes) {
            rewards[s.prompt_index].extend(o.reward());
        }
        rewards.iter().map(|r| is_flat(r)).collect()
    }

    /// The rows `keep` names (indices into `items`, in the order given) with their samples, the
    /// rows renumbered 0.. in that order.
    pub(crate) fn select(self, keep: &[usize]) -> ScoredRound {
        let mut new_index = vec![None; self.items.len()];
        for (k, &i) in keep.iter().enumerate() {
            new_index[i] = Some(k);
        }
        let picked: Vec<usize> =
            (0..self.samples.len()).filter(|&j| new_index[self.samples[j].prompt_index].is_some()).collect();
        let ScoredRound { items, prompts, samples, ids, scores } = self;
        let mut samples: Vec<Option<Sample>> = samples.into_iter().map(Some).collect();
        let mut outcomes: Vec<Option<RewardOutcome>> = scores.outcomes.into_iter().map(Some).collect();
        let parts = scores
            .parts
            .into_iter()
            .map(|p| PartScores { stage: p.stage, scores: picked.iter().map(|&j| p.scores[j]).collect() })
            .collect();
        ScoredRound {
            items: keep.iter().map(|&i| items[i].clone()).collect(),
            prompts: keep.iter().map(|&i| prompts[i].clone()).collect(),
            samples: picked
                .iter()
                .map(|&j| {
                    let mut s = samples[j].take().expect("each sample picked once");
                    s.prompt_index = new_index[s.prompt_index].expect("picked");
                    s
                })
                .collect(),
            ids: picked.iter().map(|&j| ids[j].clone()).collect(),
            scores: BatchScores {
                outcomes: picked.iter().map(|&j| outcomes[j].take().expect("each outcome picked once")).collect(),
                parts,
            },
        }
    }

    /// Rounds one after the other as one: the later rounds' rows numbered after the earlier ones'.
    pub(crate) fn concat(rounds: Vec<ScoredRound>) -> ScoredRound {
        let mut out = ScoredRound {
            items: Vec::new(),
            prompts: Vec::new(),
            samples: Vec::new(),
            ids: Vec::new(),
            scores: BatchScores { outcomes: Vec::new(), parts: Vec::new() },
        };
        for r in rounds {
            let (offset, before) = (out.items.len(), out.samples.len());
            out.items.extend(r.items);
            out.prompts.extend(r.prompts);
            out.samples.extend(r.samples.into_iter().map(|s| Sample { prompt_index: s.prompt_index + offset, ..s }));
            out.ids.extend(r.ids);
            out.scores.outcomes.extend(r.scores.outcomes);
            // A part missing from a round (none is: one reward per run) scores none of its samples.
            let after = out.samples.len();
            for p in r.scores.parts {
                let at = match out.scores.parts.iter().position(|q| q.stage == p.stage) {
                    Some(at) => at,
                    None => {
                        out.scores.parts.push(PartScores { stage: p.stage.clone(), scores: vec![None; before] });
                        out.scores.parts.len() - 1
                    }
                };
                out.scores.parts[at].scores.extend(p.scores);
            }
            for p in &mut out.scores.parts {
                p.scores.resize(after, None);
            }
        }
        out
    }
}

/// What a step generated over all its rounds, as its row reports it: sampled tokens, responses
/// and stops, and the reward's columns (counts, parts, overlong shaping) of every response scored.
pub(crate) struct Generated {
    pub(crate) sampled_tokens: usize,
    pub(crate) responses: usize,
    pub(crate) stopped: usize,
    pub(crate) metrics: Vec<(String, f64)>,
}

impl Generated {
    pub(crate) fn of(spec: &RunSpec, rounds: &[ScoredRound]) -> Generated {
        let samples = || rounds.iter().flat_map(|r| r.samples.iter());
        let outcomes = || rounds.iter().flat_map(|r| r.scores.outcomes.iter());
        let mut tally = RewardTally::default();
        for r in rounds {
            tally.add(&r.scores.outcomes);
        }
        let mut metrics: Vec<(String, f64)> = tally.metrics().iter().map(|(k, v)| (k.to_string(), *v)).collect();
        metrics.extend(part_metrics(rounds.iter().flat_map(|r| &r.scores.parts)));
        if let Some(o) = &spec.train.overlong {
            let scored = samples().zip(outcomes()).filter(|(_, o)| matches!(o, RewardOutcome::Score(_)));
            metrics.extend(overlong_metrics(o, scored.map(|(s, _)| s.response.len())));
        }
        Generated {
            sampled_tokens: samples().map(|s| s.response.len()).sum(),
            responses: samples().count(),
            stopped: samples().filter(|s| s.finish == FinishReason::Stop).count(),
            metrics,
        }
    }
}

/// The trained batch of a step of single responses: `round` holds the groups it trains on (every
/// scored sample of them; a dropped one leaves its group), `generated` what the step generated.
pub(crate) fn round_batch(
    spec: &RunSpec,
    task: &TaskSet,
    step: u64,
    round: ScoredRound,
    generated: Generated,
) -> StepBatch {
    let ScoredRound { prompts, samples, ids, scores, .. } = round;
    let outcomes = scores.outcomes;
    let kept: Vec<(&Sample, f32)> =
        samples.iter().zip(&outcomes).filter_map(|(s, o)| o.reward().map(|r| (s, r))).collect();
    let rewards: Vec<f32> = kept.iter().map(|k| k.1).collect();
    let groups: Vec<usize> = kept.iter().map(|k| k.0.prompt_index).collect();
    let adv = advantages(&spec.train, &rewards, &groups);
    let mut per_sample = vec![None; samples.len()];
    let trained = outcomes.iter().enumerate().filter(|(_, o)| o.reward().is_some());
    for ((i, _), a) in trained.zip(&adv) {
        per_sample[i] = Some(*a);
    }
    let shown = samples::single_turn(spec, &task.tokenizer, step, &ids, &prompts, &samples, &outcomes, &per_sample);
    let batch = kept
        .iter()
        .zip(&adv)
        .map(|(&(s, reward), &advantage)| Trajectory {
            prompt: prompts[s.prompt_index].clone(),
            response: s.response.clone(),
            rollout_logprobs: s.logprobs.clone(),
            loss_mask: vec![1.0; s.response.len()],
            reward,
            advantage,
            group: s.prompt_index,
            weight_version: s.weight_version,
            routing: s.routing.clone(),
            teacher_logprobs: Vec::new(),
        })
        .collect();
    StepBatch {
        batch,
        rewards,
        groups,
        sampled_tokens: generated.sampled_tokens,
        responses: generated.responses,
        stopped: generated.stopped,
        metrics: generated.metrics,
        shown,
    }
}
