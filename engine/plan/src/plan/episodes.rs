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
    // Turn by turn: each later turn starts from the last context, its turn and one observation.
    // A context that would fill the model's ends the episode (`context_overflow`), unless the
    // recipe compacts it to the prompt, the kept turns and the new observation: a new chain, whose
    // whole context is prefilled with TITO too (no cached prefix is a prefix of it).
    let (mut context, mut turns, mut compactions) = (p, 1u64, 0u64);
    let (mut prefill_tito, mut prefill_retokenize) = (p, p);
    while turns < e.max_turns.value.max(1) {
        let next = context.saturating_add(r + obs);
        let (next, fresh) = match e.compact_keep_turns {
            _ if next < cap => (next, false),
            Some(k) => (p.saturating_add(k.saturating_mul(r + obs)).max(p + obs), true),
            None => break,
        };
        if next >= cap {
            break;
        }
        prefill_tito += if fresh { next } else { obs };
        prefill_retokenize += next;
        compactions += fresh as u64;
        context = next;
        turns += 1;
    }
    EpisodeReport {
        env: e.env.clone(),
        max_turns: e.max_turns.value.max(1),
        turns,
        max_context: max_context.filter(|&c| c > 0),
        prompt_tokens: p,
        turn_tokens: r,
        observation_tokens: obs,
        observation_assumed: e.observation_tokens.is_none(),
        observation_stated: e.observation_stated && e.observation_tokens.is_some(),
        tokens_per_episode: e.tokens(a, max_context),
        sampled_tokens: turns * r,
        prompt: e.prompt.clone(),
        prefill_tito,
        prefill_retokenize,
        compactions,
        solved_at: e.solved_at,
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
            observation_stated: false,
            prompt_tokens: 8,
            turn_tokens: 28,
            compact_keep_turns: None,
            mean_turns: None,
            solved_at: 1.0,
            prompt: "append".into(),
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
        assert_eq!(r.compactions, 0);
    }

    #[test]
    fn compaction_keeps_an_episode_going_and_prefills_each_new_chain_whole() {
        let e = Episodes {
            env: "calculator".into(),
            max_turns: Spanned::new(4),
            observation_tokens: Some(10),
            observation_stated: false,
            prompt_tokens: 8,
            turn_tokens: 10,
            compact_keep_turns: Some(1),
            mean_turns: None,
            solved_at: 1.0,
            prompt: "append".into(),
        };
        let a = Assumptions::default();
        // Contexts 8, 28, then 48 >= 40: compacted to 8 + 1 x 20 = 28, then 48 again: 28.
        let r = report(&e, &a, Some(40));
        assert_eq!((r.sampled_tokens, r.compactions), (40, 2));
        assert_eq!((r.prefill_tito, r.prefill_retokenize), (8 + 10 + 28 + 28, 8 + 28 + 28 + 28));
        // Without compaction the episode ends after two turns.
        let r = report(&Episodes { compact_keep_turns: None, ..e.clone() }, &a, Some(40));
        assert_eq!((r.sampled_tokens, r.compactions), (20, 0));
        // A compacted context that still does not fit ends the episode too.
        let r = report(&Episodes { compact_keep_turns: Some(3), ..e }, &a, Some(40));
        assert_eq!((r.sampled_tokens, r.compactions), (20, 0));
    }
}
