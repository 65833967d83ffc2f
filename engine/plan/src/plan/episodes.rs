//! Multi-turn episodes: how long a trajectory gets (prompt, turns, observations between them),
//! and what TITO's unchanging ids save in prefill: each turn extends the last context by one
//! observation, so an engine with a prefix cache (SGLang's radix cache) prefills only that
//! observation; a harness that re-renders and re-tokenises the conversation each turn cannot
//! trust any cached prefix and prefills the whole context again.

use super::Ctx;
use crate::input::*;
use crate::output::EpisodeReport;

pub(super) fn plan_episodes(cx: &Ctx) -> Option<EpisodeReport> {
    let e = cx.input.episodes.as_ref()?;
    let max_context = cx
        .input
        .stages
        .iter()
        .filter(|s| s.role == Role::Rollout)
        .find_map(|s| s.model.as_ref())
        .map(|m| m.max_context);
    Some(report(e, &cx.input.assumptions, max_context))
}

fn report(e: &Episodes, a: &Assumptions, max_context: Option<u64>) -> EpisodeReport {
    let obs = e.observation(a);
    let (p, r) = (e.prompt_tokens, e.turn_tokens);
    let cap = max_context.filter(|&c| c > 0).unwrap_or(u64::MAX);
    // Turn k (from 0) starts from prompt + k x (turn + observation) tokens; a turn whose context
    // would fill the model's never happens (the episode ends with `context_overflow`).
    let context = |k: u64| p.saturating_add(k.saturating_mul(r + obs));
    let turns = (1..e.max_turns.value.max(1)).take_while(|&k| context(k) < cap).count() as u64 + 1;
    EpisodeReport {
        env: e.env.clone(),
        max_turns: e.max_turns.value.max(1),
        prompt_tokens: p,
        turn_tokens: r,
        observation_tokens: obs,
        observation_assumed: e.observation_tokens.is_none(),
        tokens_per_episode: e.tokens(a, max_context),
        sampled_tokens: turns * r,
        prefill_tito: p + (turns - 1) * obs,
        prefill_retokenize: (0..turns).map(context).sum(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn episode_arithmetic_by_hand() {
        let e = Episodes {
            env: "calculator".into(),
            max_turns: Spanned::new(3),
            observation_tokens: Some(21),
            prompt_tokens: 8,
            turn_tokens: 28,
        };
        let a = Assumptions::default();
        // 8 + 3 x 28 + 2 x 21 = 134, capped by a 64-token model.
        assert_eq!(e.tokens(&a, None), 134);
        assert_eq!(e.tokens(&a, Some(64)), 64);
        let r = report(&e, &a, None);
        // TITO: the prompt, then each later turn's observation. Re-tokenising: 8 + 57 + 106.
        assert_eq!((r.prefill_tito, r.prefill_retokenize), (8 + 2 * 21, 8 + 57 + 106));
        assert!(!r.observation_assumed);
        // A 64-token model: the third turn would start at 106 tokens, so it never runs.
        let r = report(&e, &a, Some(64));
        assert_eq!((r.tokens_per_episode, r.prefill_tito, r.prefill_retokenize), (64, 8 + 21, 8 + 57));
    }
}
