//! The tiny recipe the end-to-end run tests train: a one-layer model on one-digit addition, a
//! few steps in a few seconds.

const TINY: &str = r#"
import std/tasks/arith
model policy = transformer { layers = 1, d_model = 32, heads = 2, vocab = arith.vocab, max_len = 12 }
cluster laptop = local { cpus = 2 }
recipe tiny on laptop {
    warmup = sft(policy) { data = arith.addition { digits = 1 }, steps = 30.steps, lr = 3e-3 }
    rollout = generate(warmup) {
        prompts = arith.addition { digits = 1, split = train }
        samples_per_prompt = 4
        max_prompt_tokens = 6.tokens
        max_new_tokens = 3.tokens
    }
    reward = exact_match(rollout)
    train = grpo(rollout, reward) { rollout_batch = 8, global_batch = 32, micro_batch = 32, lr = 1e-3 }
    sync = weights(train -> rollout) { SYNC }
EXTRA
    stop = STEPS.steps
}
"#;

/// The tiny recipe stopping after `steps`, with `sync` as the weight sync's settings and `extra`
/// as more recipe members (a launcher, an evaluation, a checkpoint), one per line.
pub fn tiny_recipe(sync: &str, steps: u32, extra: &[&str]) -> String {
    let extra: String = extra.iter().map(|l| format!("    {l}\n")).collect();
    TINY.replace("SYNC", sync).replace("EXTRA\n", &extra).replace("STEPS", &steps.to_string())
}

/// An evaluation every 2 steps on 20 held-out problems.
pub const EVAL: &str =
    "eval = evaluate(rollout) { prompts = arith.addition { digits = 1, split = test }, every = 2.steps, limit = 20 }";
