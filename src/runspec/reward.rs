//! The reward stage feeding the trainer and an environment's episodes, as the run spec carries
//! them: verifiers, command and HTTP rewards, and `env_reward`'s environment (only `miles run`
//! reads these).

use miles_compiler::graph::StageNode;
use miles_compiler::job::read::Fields;
use miles_compiler::job::EpisodesJob;
use miles_runtime::reward::RewardSpec;

/// None: the task's exact match. (A `schema_text` that is not JSON was refused by
/// `capability::shape`.)
pub(super) fn reward_spec(r: &StageNode) -> Option<RewardSpec> {
    use miles_runtime::reward::OnRewardError;
    let on_error = match r.member("on_error").map(|e| e.value) {
        Some("drop") => OnRewardError::Drop,
        Some("zero") => OnRewardError::Zero,
        _ => OnRewardError::Stop,
    };
    let timeout_s = r.f64("timeout").map_or(60.0, |t| t.value);
    let text = |name: &str| r.str(name).map(str::to_string);
    let count = |name: &str| r.u64(name).map_or(0, |v| v.value);
    let name = r.name.clone();
    match r.kind.as_str() {
        "verify" => {
            let schema = text("schema_text").and_then(|t| serde_json::from_str(&t).ok());
            Some(RewardSpec::Verifier {
                name,
                kind: r.member("kind").map_or("math", |k| k.value).to_string(),
                pattern: text("pattern"),
                schema,
                on_error,
            })
        }
        "command_reward" => Some(RewardSpec::Command {
            name,
            command: r.strings("command"),
            cwd: None,
            timeout_s,
            on_error,
            pass_env: r.strings("pass_env"),
        }),
        "http_reward" => Some(RewardSpec::Http {
            name,
            url: text("url").unwrap_or_default(),
            concurrency: count("concurrency").max(1) as usize,
            batch_size: count("batch_size").max(1) as usize,
            timeout_s,
            retries: count("retries") as u32,
            on_error,
        }),
        _ => None,
    }
}

/// An `env_reward` stage as the run spec's episodes: its environment, limits and reward rules,
/// with the TITO rule of the rollout's `session`.
pub(super) fn env_spec(
    r: &StageNode,
    episodes: &EpisodesJob,
    session: miles_runtime::session::Rule,
) -> Option<miles_runtime::env::spec::EnvRunSpec> {
    use miles_runtime::env::calculator::CalculatorSpec;
    use miles_runtime::env::jsonl::JsonlSpec;
    use miles_runtime::env::openenv::OpenEnvSpec;
    use miles_runtime::env::spec::{EnvRunSpec, EnvSpec};
    use miles_runtime::env::{OnEnvError, RewardMode, ToolFormat};
    let e = episodes.env.as_ref()?;
    let text = |name: &str| e.str(name).map(str::to_string);
    let real = |name: &str, default: f64| e.f64(name).map_or(default, |v| v.value);
    let env = match e.schema_name.as_str() {
        "calculator" => EnvSpec::Calculator(CalculatorSpec {
            digits: episodes.calculator_digits.unwrap_or(0) as u32,
            tool_reward: real("tool_reward", 0.0) as f32,
            demo_tool_rate: real("demo_tool_rate", 1.0) as f32,
        }),
        "command_env" => EnvSpec::Jsonl(JsonlSpec {
            name: r.name.clone(),
            argv: e.strings("command"),
            cwd: None,
            pass_env: e.strings("pass_env"),
        }),
        "openenv" => EnvSpec::OpenEnv(OpenEnvSpec {
            name: r.name.clone(),
            url: text("url").unwrap_or_default(),
            action_field: text("action_field"),
            observation_field: text("observation_field"),
        }),
        _ => return None,
    };
    let secs = |name: &str, default: f64| r.f64(name).map_or(default, |v| v.value);
    let member = |name: &str| r.member(name).map(|m| m.value);
    Some(EnvRunSpec {
        env,
        max_turns: episodes.max_turns.value.max(1) as usize,
        turn_timeout_s: secs("turn_timeout", 30.0),
        episode_timeout_s: secs("timeout", 600.0),
        concurrency: r.value("concurrency").and_then(|v| v.as_i64()).unwrap_or(64).max(1) as usize,
        tool_format: match member("tool_format") {
            Some("hermes") => ToolFormat::Hermes,
            _ => ToolFormat::Tag,
        },
        reward: match member("reward") {
            Some("sum") => RewardMode::Sum,
            _ => RewardMode::Final,
        },
        on_env_error: match member("on_env_error") {
            Some("score") => OnEnvError::Score,
            _ => OnEnvError::Drop,
        },
        session,
        compact_keep_turns: episodes.compact_keep_turns.map(|k| k as usize),
        solved_at: episodes.solved_at.value,
    })
}
