//! `pass_env` (`command_reward`, `command_env`): names of the run's environment variables a
//! program also gets. Each must be a variable's name and none the run's own (`MILES_*`: the API
//! key and the run token among them), which no program is given (E0310, at the field that lists
//! it). The runtime refuses the same names again (`miles_runtime::child`), for a run spec written
//! by hand.

use crate::eval::Eval;
use crate::graph::StageGraph;
use crate::value::Value;
use miles_grammar::diag::{Diagnostic, ErrorCode, Span};

/// The field's name, wherever a stage or a record (an environment) has it.
const FIELD: &str = "pass_env";
/// The prefix of the run's own variables.
const RESERVED: &str = "MILES_";

/// Why `name` cannot be passed to a program, if it cannot.
fn refusal(name: &str) -> Option<String> {
    let mut chars = name.chars();
    let valid = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid {
        Some(format!("`{name}` is not an environment variable's name"))
    } else if name.to_ascii_uppercase().starts_with(RESERVED) {
        Some(format!("`{name}` is one of the run's own variables, which no program is given"))
    } else {
        None
    }
}

/// Reports each name no program may be given, in every stage's `pass_env` and in every record's
/// (an environment inside a stage's field).
pub(crate) fn check(ev: &mut Eval, g: &StageGraph) {
    for node in g.graph.node_weights() {
        for (name, p) in &node.params {
            if name == FIELD && !p.defaulted {
                names(ev, &p.value, p.span);
            }
            records(ev, &p.value);
        }
    }
}

fn records(ev: &mut Eval, v: &Value) {
    match v {
        Value::Record(r) => {
            for (name, f) in &r.fields {
                if name == FIELD && !f.defaulted {
                    names(ev, &f.value, f.span);
                }
                records(ev, &f.value);
            }
        }
        Value::List(items) => items.iter().for_each(|i| records(ev, i)),
        _ => {}
    }
}

fn names(ev: &mut Eval, list: &Value, span: Span) {
    let Value::List(items) = list else { return };
    for why in items.iter().filter_map(|v| match v {
        Value::Str(s) => refusal(s),
        _ => None,
    }) {
        ev.report(
            Diagnostic::error(ErrorCode::E0310, format!("`pass_env` cannot list it: {why}"))
                .with_primary(span, "passed to the program")
                .with_help(
                    "list the names of variables the program needs (e.g. \"HF_HOME\"); the run's API key and \
                     token stay with the run",
                ),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::refusal;
    use crate::fs::MemoryFs;

    /// The E0310 messages of a laptop recipe whose reward and environment list `reward_env` and
    /// `env_env`.
    fn e0310(reward_env: &str, env_env: &str) -> Vec<String> {
        let src = format!(
            r#"
import std/tasks/strings
model policy = transformer {{ layers = 1, d_model = 16, heads = 2, vocab = strings.vocab, max_len = 16 }}
recipe r {{
    rollout = generate(policy) {{ prompts = strings.reverse {{}}, samples_per_prompt = 4 }}
    reward = command_reward(rollout) {{ command = ["python3", "v.py"], pass_env = [{reward_env}] }}
    episodes = env_reward(rollout) {{ env = command_env {{ command = ["python3", "e.py"], pass_env = [{env_env}] }} }}
    train = grpo(rollout, reward) {{ rollout_batch = 4, global_batch = 16 }}
    sync = weights(train -> rollout)
}}
"#
        );
        let fs = MemoryFs::with(&[("r.miles", &src)]);
        let c = crate::compile(&fs, &["r.miles".to_string()], &crate::Options::default());
        c.diagnostics.iter().filter(|d| d.code == "E0310").map(|d| d.message.clone()).collect()
    }

    #[test]
    fn a_recipe_passing_the_runs_secrets_is_refused_at_check() {
        assert_eq!(e0310(r#""HF_HOME""#, r#""OPENAI_BASE_URL", "PYTHONPATH""#), Vec::<String>::new());
        let got = e0310(r#""MILES_API_KEY""#, r#""HF_HOME", "MILES_RUN_TOKEN", "A=B""#);
        assert_eq!(got.len(), 3, "{got:#?}");
        assert!(got[0].contains("`MILES_API_KEY` is one of the run's own variables"), "{got:#?}");
        assert!(got.iter().any(|m| m.contains("`MILES_RUN_TOKEN` is one of the run's own")), "{got:#?}");
        assert!(got.iter().any(|m| m.contains("`A=B` is not an environment variable's name")), "{got:#?}");
    }

    #[test]
    fn names_and_the_runs_own_variables() {
        for ok in ["HF_HOME", "_X1", "openai_base_url", "MILESTONE"] {
            assert_eq!(refusal(ok), None, "{ok}");
        }
        for bad in ["MILES_API_KEY", "MILES_RUN_TOKEN", "miles_home", "", "1X", "A=B", "A B", "LC_*"] {
            assert!(refusal(bad).is_some(), "{bad:?}");
        }
    }
}
