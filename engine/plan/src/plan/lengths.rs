//! Expected lengths (docs/plan.md, "Expected lengths"): the planner cannot know how long a
//! policy's answers are, so without the recipe's word it prices every prompt at
//! max_prompt_tokens, every response at max_new_tokens and every episode at all the turns that
//! fit. A recipe may state the means it expects (`generate.mean_prompt_tokens`,
//! `mean_response_tokens`, `env_reward.mean_turns`): time estimates then use them and name them,
//! while memory (KV cache, activations, buffer) stays sized for the bounds, which a batch can
//! still reach.

use super::Ctx;
use crate::input::*;
use crate::output::LengthReport;

/// The bounds and the lengths time estimates use, per sample.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Lengths {
    pub max_prompt: f64,
    /// Per turn in an episode.
    pub max_response: f64,
    pub prompt: f64,
    pub response: f64,
    pub prompt_stated: bool,
    pub response_stated: bool,
    /// Episodes: the turns that fit the context (the bound) and the expected turns, with the
    /// tokens an observation adds between turns.
    pub episode: Option<EpisodeLengths>,
    /// The recipe's bounds where the model's `max_len` cut them (the bounds above are cut).
    pub capped: Option<ContextCap>,
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) struct EpisodeLengths {
    pub max_turns: f64,
    pub turns: f64,
    pub turns_stated: bool,
    pub observation: f64,
}

/// A stated mean, kept within 1..=bound (the stdlib checks say so; a JSON input may not), or the
/// bound itself.
fn expected(mean: Option<f64>, bound: f64) -> (f64, bool) {
    match mean.filter(|m| m.is_finite()) {
        Some(m) => (m.min(bound).max(1.0_f64.min(bound)), true),
        None => (bound, false),
    }
}

impl Lengths {
    pub fn from_input(input: &PlanInput, turns_that_fit: Option<u64>) -> Option<Lengths> {
        let a = &input.assumptions;
        let (max_prompt, max_response) = match &input.episodes {
            Some(e) => (e.prompt_tokens as f64, e.turn_tokens as f64),
            None => {
                let e = input.stages.iter().filter(|s| s.role == Role::Rollout).find_map(|s| s.engine.as_ref())?;
                (e.prompt_len.value as f64, e.response_len.value as f64)
            }
        };
        let (prompt, prompt_stated) = expected(a.mean_prompt_tokens, max_prompt);
        let (response, response_stated) = expected(a.mean_response_tokens, max_response);
        let episode = input.episodes.as_ref().map(|e| {
            let max_turns = turns_that_fit.unwrap_or(e.max_turns.value).max(1) as f64;
            let (turns, turns_stated) = expected(e.mean_turns.map(|t| t.value), max_turns);
            EpisodeLengths { max_turns, turns, turns_stated, observation: e.observation(a) as f64 }
        });
        let capped = input.context_cap.clone();
        Some(Lengths { max_prompt, max_response, prompt, response, prompt_stated, response_stated, episode, capped })
    }

    /// Whether the recipe stated any mean (else every figure is the bound, as before).
    pub fn stated(&self) -> bool {
        self.prompt_stated || self.response_stated || self.episode.as_ref().is_some_and(|e| e.turns_stated)
    }

    /// Expected tokens of a trained sequence: prompt + response, or for an episode prompt +
    /// turns x response + (turns - 1) x observation; at most `seq_len`, the trainer's bound. With
    /// no mean stated, `seq_len` itself.
    pub fn sequence(&self, seq_len: u64) -> f64 {
        if !self.stated() {
            return seq_len as f64;
        }
        let n = match &self.episode {
            Some(e) => self.prompt + e.turns * self.response + (e.turns - 1.0) * e.observation,
            None => self.prompt + self.response,
        };
        n.min(seq_len as f64)
    }

    /// Expected over bound of the tokens sampled per sample (every turn's).
    pub fn sampled_ratio(&self) -> f64 {
        let turns = self.episode.as_ref().map_or(1.0, |e| crate::model::div(e.turns, e.max_turns));
        turns * crate::model::div(self.response, self.max_response)
    }

    /// An episode of `turns` calls (the bound): the share of episodes expected to play each
    /// later turn, (mean_turns - 1) / (turns - 1), and the ratio of a later turn's context at
    /// the means to at the bounds, sum over k of (p + k (r + O)) each. (1, 1) with no mean
    /// stated, or no later turn.
    pub fn later_turns(&self, turns: f64) -> (f64, f64) {
        let Some(e) = self.episode.as_ref().filter(|_| self.stated() && turns > 1.0) else { return (1.0, 1.0) };
        let k = (turns - 1.0) * turns / 2.0;
        let at = |p: f64, r: f64| (turns - 1.0) * p + k * (r + e.observation);
        let ratio = crate::model::div(at(self.prompt, self.response), at(self.max_prompt, self.max_response));
        (((e.turns - 1.0) / (turns - 1.0)).clamp(0.0, 1.0), ratio)
    }

    /// The line each estimate that uses a mean adds to its assumptions; none when no mean is
    /// stated.
    pub fn note(&self) -> Option<String> {
        if !self.stated() {
            return None;
        }
        let mut parts = Vec::new();
        let fig = |x: f64| if x.fract() == 0.0 { format!("{x:.0}") } else { format!("{x:.1}") };
        if self.prompt_stated {
            parts.push(format!("prompts {} of {} tokens (mean_prompt_tokens)", fig(self.prompt), fig(self.max_prompt)));
        }
        if self.response_stated {
            parts.push(format!(
                "responses {} of {} tokens{} (mean_response_tokens)",
                fig(self.response),
                fig(self.max_response),
                if self.episode.is_some() { " per turn" } else { "" }
            ));
        }
        if let Some(e) = self.episode.as_ref().filter(|e| e.turns_stated) {
            parts.push(format!("{} of {} turns per episode (mean_turns)", fig(e.turns), fig(e.max_turns)));
        }
        Some(format!("expected lengths, the recipe's planning assumption: {}", parts.join(", ")))
    }

    pub fn report(&self, seq_len: Option<u64>) -> LengthReport {
        LengthReport {
            max_prompt_tokens: self.max_prompt,
            max_response_tokens: self.max_response,
            prompt_tokens: self.prompt,
            response_tokens: self.response,
            prompt_stated: self.prompt_stated,
            response_stated: self.response_stated,
            max_turns: self.episode.as_ref().map(|e| e.max_turns),
            turns: self.episode.as_ref().map(|e| e.turns),
            turns_stated: self.episode.as_ref().is_some_and(|e| e.turns_stated),
            sequence_tokens: seq_len.map(|s| self.sequence(s)),
            max_sequence_tokens: seq_len,
            capped: self.capped.clone(),
        }
    }
}

/// The recipe's lengths: the turns that fit come from the episode arithmetic.
pub(super) fn plan_lengths(cx: &Ctx) -> Option<Lengths> {
    let fit = super::episodes::plan_episodes(cx).map(|e| e.turns);
    Lengths::from_input(cx.input, fit)
}

/// Adds the lengths' note to an estimate's assumptions (when a mean is stated).
pub(super) fn note_into(l: Option<&Lengths>, assumptions: &mut Vec<String>) {
    if let Some(n) = l.and_then(Lengths::note) {
        assumptions.push(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn means_are_kept_within_their_bounds() {
        assert_eq!(expected(None, 4.0), (4.0, false));
        assert_eq!(expected(Some(2.5), 4.0), (2.5, true));
        assert_eq!(expected(Some(9.0), 4.0), (4.0, true));
        assert_eq!(expected(Some(0.0), 4.0), (1.0, true));
        assert_eq!(expected(Some(f64::NAN), 4.0), (4.0, false));
        // A zero bound stays zero (nothing to sample).
        assert_eq!(expected(Some(3.0), 0.0), (0.0, true));
    }
}
