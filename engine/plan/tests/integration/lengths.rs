//! Sequence lengths as a run sees them (issue #42): the model's `max_len` caps what the plan
//! prices, episodes play the turns that fit, and an observation's length is the recipe's to
//! state.

use super::recipes::compiled;
use miles_plan::*;

/// A small model whose `max_len` (16) is far below the rollout's `max_prompt_tokens` (512, the
/// default before the stdlib derived it from max_len; `miles check` now refuses it): the plan
/// priced 516-token sequences for it (0.3 GB of activations, 6 s a step).
const SMALL: &str = r#"
import std/tasks/arith
model policy = transformer { layers = 2, d_model = 64, heads = 4, vocab = arith.vocab, max_len = 16 }
recipe tiny {
    rollout = generate(policy) {
        prompts            = arith.addition { digits = 2 }
        samples_per_prompt = 8
        max_new_tokens     = 4.tokens
        max_prompt_tokens  = 512.tokens
    }
    reward = exact_match(rollout)
    train  = grpo(rollout, reward) { rollout_batch = 16, global_batch = 128, micro_batch = 128 }
    sync   = weights(train -> rollout) { transport = local }
    stop   = 20.steps
}
"#;

/// The plan of a compiled recipe, whatever `miles check` says of it: the planner must be honest
/// about a recipe's lengths even where the checker refuses them.
fn plan_of(src: &str) -> (PlanInput, Plan) {
    let c = compiled(src);
    let input = plan_input(c.recipes.first().expect("a compiled recipe"));
    let p = plan(&input);
    (input, p)
}

#[test]
fn sequences_are_capped_by_the_models_max_len() {
    let (input, p) = plan_of(SMALL);
    let engine = input.stages.iter().find_map(|s| s.engine.as_ref()).expect("an engine");
    // A run refuses a prompt longer than max_len - max_new_tokens, so 12 + 4 tokens at most.
    assert_eq!((engine.prompt_len.value, engine.response_len.value), (12, 4));
    let trainer = input.stages.iter().find_map(|s| s.trainer.as_ref()).expect("a trainer");
    assert_eq!(trainer.seq_len.value, 16);
    let l = p.lengths.as_ref().expect("lengths");
    assert_eq!((l.max_prompt_tokens, l.max_sequence_tokens), (12.0, Some(16)));
    assert_eq!(input.context_cap.as_ref().map(|c| c.max_len), Some(16), "{}", render_json(&p));
    let text = render_text(&p);
    assert!(text.contains("prompt 12 tokens (max_prompt_tokens 512, capped by the model's max_len 16)"), "{text}");
    assert!(text.contains("seq 16 x micro-batch 128"), "{text}");
    assert!(!text.contains("516"), "{text}");
}

#[test]
fn lengths_within_max_len_are_not_marked_capped() {
    let (_, p) = plan_of(&SMALL.replace("512.tokens", "8.tokens"));
    let text = render_text(&p);
    assert!(text.contains("prompt 8 tokens, response 4 tokens: upper bounds"), "{text}");
    assert!(!text.contains("capped"), "{text}");
}

/// Episodes against an OpenEnv server, whose observations the planner cannot know: 64 prompt
/// tokens, turns of 64, a 1,024-token model, up to 3 turns.
fn openenv(extra: &str) -> String {
    format!(
        r#"
import std/tasks/arith
model policy = transformer {{ layers = 2, d_model = 64, heads = 4, vocab = 64, max_len = 1024 }}
recipe agent {{
    rollout = generate(policy) {{
        prompts           = arith.addition {{ digits = 2 }}
        max_prompt_tokens = 64.tokens
        max_new_tokens    = 64.tokens
    }}
    reward = env_reward(rollout) {{
        env       = openenv {{ url = "http://127.0.0.1:8000" }}
        max_turns = 3
        {extra}
    }}
    train  = grpo(rollout, reward) {{ rollout_batch = 4, global_batch = 32, micro_batch = 32 }}
    sync   = weights(train -> rollout) {{ transport = local }}
    stop   = 20.steps
}}
"#
    )
}

#[test]
fn episodes_say_the_turns_that_fit_where_the_lengths_line_does() {
    // 512 assumed tokens an observation: contexts 64, 640, then 1,216 would pass 1,024.
    let (_, p) = plan_of(&openenv(""));
    let e = p.episodes.as_ref().expect("episodes");
    assert_eq!((e.max_turns, e.turns), (3, 2));
    let text = render_text(&p);
    assert!(text.contains("turns 2: upper bounds"), "{text}");
    assert!(
        text.contains("up to 2 turns (max_turns 3; a third does not fit the model's 1024-token context)"),
        "{text}"
    );
    assert!(
        text.contains("512 observation tokens between turns (assumed: env_reward's observation_tokens states it)"),
        "{text}"
    );
}

#[test]
fn the_recipe_states_an_observations_length() {
    let (input, p) = plan_of(&openenv("observation_tokens = 32.tokens"));
    assert_eq!(input.episodes.as_ref().and_then(|e| e.observation_tokens), Some(32));
    let e = p.episodes.as_ref().expect("episodes");
    // Contexts 64, 160, 256: all three turns fit.
    assert_eq!((e.turns, e.observation_tokens, e.tokens_per_episode), (3, 32, 64 + 3 * 64 + 2 * 32));
    let text = render_text(&p);
    assert!(
        text.contains("up to 3 turns x 64 sampled tokens, 32 observation tokens between turns (observation_tokens)"),
        "{text}"
    );
    assert!(text.contains("turns 3: upper bounds"), "{text}");
    // The success rule is shown with the episodes, the default 1 unless the recipe says.
    assert!(text.contains("solved: an episode whose reward is >= 1 (env_reward's solved_at)"), "{text}");
    let (_, p) = plan_of(&openenv("solved_at = 0.5"));
    assert!(render_text(&p).contains("reward is >= 0.5 (env_reward's solved_at)"));
    // A built-in environment's own length gives way to the recipe's too.
    let calc = openenv("observation_tokens = 5.tokens")
        .replace(r#"openenv { url = "http://127.0.0.1:8000" }"#, "calculator {}");
    let (input, _) = plan_of(&calc);
    assert_eq!(input.episodes.as_ref().and_then(|e| e.observation_tokens), Some(5));
}

/// Issue #41: the plan says what the first turn shows (`env_reward.prompt`) and that
/// `max_prompt_tokens` bounds it as sent, the row's chat and the reset observation together.
#[test]
fn the_plan_shows_what_the_first_prompt_is() {
    let (input, p) = plan_of(&openenv(""));
    assert_eq!(input.episodes.as_ref().map(|e| e.prompt.as_str()), Some("append"));
    let text = render_text(&p);
    assert!(
        text.contains(
            "first prompt: a chat row's messages, then the reset observation (env_reward's prompt = append), \
             at most 64 tokens as sent (max_prompt_tokens)"
        ),
        "{text}"
    );
    let (_, p) = plan_of(&openenv("prompt = observation_only"));
    assert_eq!(p.episodes.as_ref().map(|e| e.prompt.as_str()), Some("observation_only"));
    assert!(
        render_text(&p).contains("first prompt: the reset observation alone (env_reward's prompt = observation_only)")
    );
    let (_, p) = plan_of(&openenv("prompt = replace"));
    assert!(
        render_text(&p).contains("with the reset observation as their user message (env_reward's prompt = replace)")
    );
}
