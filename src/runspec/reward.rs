//! The reward stage feeding the trainer and an environment's episodes, as the run spec carries
//! them: verifiers, command and HTTP rewards (per sample or per group), a combination of these,
//! and `env_reward`'s environment (only `miles run` reads these).

use miles_compiler::graph::{StageGraph, StageNode};
use miles_compiler::job::read::Fields;
use miles_compiler::job::EpisodesJob;
use miles_compiler::value::Value;
use miles_runtime::reward::RewardSpec;

mod verifiers;

/// None: the task's exact match. (A `schema_text` that is not JSON was refused by
/// `capability::shape`.)
pub(super) fn reward_spec(graph: &StageGraph, r: &StageNode) -> Option<RewardSpec> {
    match r.kind.as_str() {
        "combine" => Some(combination(graph, r, 0)),
        _ => one_reward(r),
    }
}

/// A `combine` stage: its parts (nested combinations included; the depth bound only stops a
/// graph the compiler would have refused as a cycle) with their weights.
fn combination(graph: &StageGraph, r: &StageNode, depth: u32) -> RewardSpec {
    let nodes = r.list("parts").iter().filter_map(|p| match p {
        Value::Stage(name) => graph.node(name),
        _ => None,
    });
    let parts = nodes.map(|p| part(graph, p, depth)).collect();
    let weights = r.list("weights").iter().filter_map(Value::as_f64).collect();
    RewardSpec::Combine { name: r.name.clone(), parts, weights }
}

/// One part of a combination: the exact match is a part of its own there, with its partial
/// credit. (`env_reward`, the one other kind that scores, was refused by the capability table.)
fn part(graph: &StageGraph, p: &StageNode, depth: u32) -> RewardSpec {
    let exact = || RewardSpec::ExactMatch {
        name: p.name.clone(),
        partial_credit: p.bool("partial_credit").is_some_and(|b| b.value),
    };
    match p.kind.as_str() {
        "combine" if depth < 16 => combination(graph, p, depth + 1),
        _ => one_reward(p).unwrap_or_else(exact),
    }
}

/// A reward stage of one kind; None for `exact_match` (the run's task reward).
fn one_reward(r: &StageNode) -> Option<RewardSpec> {
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
        kind @ ("command_reward" | "group_command_reward") => Some(RewardSpec::Command {
            name,
            command: r.strings("command"),
            cwd: None,
            timeout_s,
            on_error,
            pass_env: r.strings("pass_env"),
            group: kind == "group_command_reward",
        }),
        "http_reward" => Some(RewardSpec::Http {
            name,
            url: text("url").unwrap_or_default(),
            concurrency: count("concurrency").max(1) as usize,
            batch_size: count("batch_size").max(1) as usize,
            timeout_s,
            retries: count("retries") as u32,
            on_error,
            group: false,
        }),
        "group_http_reward" => Some(RewardSpec::Http {
            name,
            url: text("url").unwrap_or_default(),
            concurrency: count("concurrency").max(1) as usize,
            // A group is never split: one request per group, however large.
            batch_size: 1,
            timeout_s,
            retries: count("retries") as u32,
            on_error,
            group: true,
        }),
        _ => None,
    }
}

/// An `env_reward` stage as the run spec's episodes: its environment, limits and reward rules,
/// with the TITO rule of the rollout's `session` (none: `linear`, and `branching` for the plug-in
/// layers, whose harnesses may edit or compact what they send).
pub(super) fn env_spec(
    r: &StageNode,
    episodes: &EpisodesJob,
    session: Option<miles_runtime::session::Rule>,
) -> Option<miles_runtime::env::spec::EnvRunSpec> {
    use miles_runtime::env::calculator::CalculatorSpec;
    use miles_runtime::env::jsonl::JsonlSpec;
    use miles_runtime::env::openenv::OpenEnvSpec;
    use miles_runtime::env::spec::{EnvRunSpec, EnvSpec, ExternalSpec, ProgramSpec};
    use miles_runtime::env::{EpisodePrompt, OnEnvError, RewardMode, ToolFormat};
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
        "agent_program" | "rollout_program" => {
            let program = ProgramSpec {
                name: r.name.clone(),
                command: e.strings("command"),
                cwd: None,
                pass_env: e.strings("pass_env"),
            };
            match e.schema_name.as_str() {
                "agent_program" => EnvSpec::AgentProgram(program),
                _ => EnvSpec::RolloutProgram(program),
            }
        }
        "verifiers" => EnvSpec::RolloutProgram(verifiers::program(&r.name, e)),
        "external_agents" => EnvSpec::ExternalAgents(ExternalSpec {
            name: r.name.clone(),
            bind: text("bind").unwrap_or_else(|| "127.0.0.1:0".into()),
        }),
        _ => return None,
    };
    let session = session.unwrap_or(if env.is_layer() {
        miles_runtime::session::Rule::Branching
    } else {
        miles_runtime::session::Rule::Linear
    });
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
        // One reading of the field, shared with `miles plan`: the typed job's.
        prompt: match episodes.prompt.as_str() {
            "replace" => EpisodePrompt::Replace,
            "observation_only" => EpisodePrompt::ObservationOnly,
            _ => EpisodePrompt::Append,
        },
    })
}
