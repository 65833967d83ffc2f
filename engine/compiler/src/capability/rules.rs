//! The rules of the capability table's `Support::Rule` rows: whether a field's value runs on
//! the recipe's target, read from the whole recipe (its other stages, its settings), with the
//! reason in words when it does not.

use super::table::*;
use super::{Ctx, Target};
use crate::value::{FieldValue, Value};

/// A teacher with LoRA on the same trainer is not run yet.
pub(super) fn rule_opd(cx: &Ctx, f: &FieldValue) -> Option<String> {
    f.value.as_record()?;
    let lora =
        ["grpo", "ppo"].iter().flat_map(|k| cx.stages(k)).any(|t| t.param("lora").is_some_and(|v| *v != Value::None));
    lora.then(|| "distillation with LoRA on the same trainer is not run yet: remove `lora` or `opd`".into())
}

/// Why named adapters (multi-LoRA) cannot run on this recipe's target, if they cannot: they run
/// in `miles run`'s own process, under `sync`, on single-turn prompts.
pub(super) fn multi_lora_refusal(cx: &Ctx, what: &str) -> Option<String> {
    if cx.target != Target::Embedded {
        return Some(format!(
            "{what}: multi-LoRA runs in `miles run`'s own process; {} trains one adapter",
            cx.target.describe()
        ));
    }
    let schedule = cx.recipe.settings.as_record().and_then(|s| s.get("schedule")).and_then(Value::as_record);
    if let Some(s) = schedule.filter(|s| s.schema_name != "sync") {
        return Some(format!(
            "{what}: multi-LoRA runs under the `sync` schedule (this recipe says `{}`)",
            s.schema_name
        ));
    }
    env_of(cx)
        .is_some()
        .then(|| format!("{what}: multi-LoRA trains single-turn prompts; episodes (`env_reward`) train one adapter"))
}

pub(super) fn rule_lora_adapters(cx: &Ctx, f: &FieldValue) -> Option<String> {
    let n = f.value.as_i64().filter(|&n| n > 1)?;
    if let Some(why) = multi_lora_refusal(cx, &format!("`adapters = {n}`")) {
        return Some(why);
    }
    let named =
        cx.stages("grpo").first().and_then(|g| g.param("lora")).and_then(Value::as_record).and_then(|l| {
            match l.get("named") {
                Some(Value::List(items)) => Some(items.len()),
                _ => None,
            }
        });
    (named.unwrap_or(0) == 0).then(|| {
        format!("`adapters = {n}` with no `named` adapters: name each one with its own prompts, `named = [adapter {{ name = \"a\", prompts = ... }}, ...]`")
    })
}

pub(super) fn rule_lora_named(cx: &Ctx, f: &FieldValue) -> Option<String> {
    match &f.value {
        Value::List(items) if !items.is_empty() => multi_lora_refusal(cx, "named adapters"),
        _ => None,
    }
}

/// An adapter's own partial credit changes how `exact_match` scores it; other rewards have none.
pub(super) fn rule_adapter_partial_credit(cx: &Ctx, f: &FieldValue) -> Option<String> {
    if f.value == Value::None || !cx.stages("grpo").is_empty() && !cx.stages("exact_match").is_empty() {
        return None;
    }
    Some("an adapter's `partial_credit` is how `exact_match` scores its answers, and this recipe's reward is another stage: remove it".into())
}

/// An adapter's prompts: what the rollout's may be (a runnable prompt set, its train split).
pub(super) fn rule_adapter_prompts(_: &Ctx, f: &FieldValue) -> Option<String> {
    prompts_refusal(f, "an adapter's prompts", "an adapter")
}

pub(super) fn prompts_json(v: &Value, split: &str) -> Option<serde_json::Value> {
    let r = v.as_record()?;
    let mut j = Value::Record(std::sync::Arc::new(r.clone())).to_json();
    if let Some(o) = j.as_object_mut() {
        o.insert("split".into(), serde_json::Value::String(split.into()));
    }
    Some(j)
}

/// The rollout's prompt set (its train split): what SFT and evaluation must agree with.
pub(super) fn rollout_prompts<'c>(cx: &'c Ctx) -> Option<&'c Value> {
    cx.stages("generate").first().and_then(|g| g.param("prompts"))
}

pub(super) fn rule_rollout_prompts(_: &Ctx, f: &FieldValue) -> Option<String> {
    prompts_refusal(f, "prompts", "the rollout")
}

/// Why a prompt set (`whose`, trained on by `who`) is not one the runtime reads: a runnable kind,
/// its train split. The rollout's and every multi-LoRA adapter's prompts follow this one rule.
pub(super) fn prompts_refusal(f: &FieldValue, whose: &str, who: &str) -> Option<String> {
    let r = f.value.as_record()?;
    if !RUNNABLE_PROMPTS.contains(&r.schema_name.as_str()) {
        return Some(format!(
            "{whose} from `{}`: the runtime reads the built-in tasks (std/tasks/arith, std/tasks/strings), `jsonl {{ ... }}` and `parquet {{ ... }}`",
            r.schema_name
        ));
    }
    match r.get("split").and_then(Value::as_enum) {
        Some("train") | None => None,
        Some(s) => Some(format!(
            "{who} trains on its prompt set's train split (this one says `split = {s}`); evaluation reads the test split"
        )),
    }
}

pub(super) fn rule_sft_data(cx: &Ctx, f: &FieldValue) -> Option<String> {
    if let Some(env) = env_of(cx).and_then(Value::as_record).filter(|e| e.schema_name != "calculator") {
        return Some(format!(
            "with an environment, SFT trains on its demonstrations (gold episodes), and `{}` gives none: remove the `sft` stage",
            env.schema_name
        ));
    }
    let want = rollout_prompts(cx).and_then(|p| prompts_json(p, "train"));
    if want.is_some() && prompts_json(&f.value, "train") == want {
        return None;
    }
    Some("SFT warms up on the rollout's prompt set (its train split): give `sft` the same `data` as the rollout's `prompts`".into())
}

/// A combination's parts are scored by the executor's reward; an `env_reward` plays episodes,
/// whose reward comes from the environment, so it is no part of one.
pub(super) fn rule_combine_parts(cx: &Ctx, f: &FieldValue) -> Option<String> {
    let Value::List(parts) = &f.value else { return None };
    parts.iter().find_map(|p| {
        let Value::Stage(name) = p else { return None };
        (cx.recipe.graph.node(name)?.kind == "env_reward").then(|| {
            format!(
                "a part `{name}` that is an `env_reward`: an episode's reward comes from its environment, and a combination weighs rewards of single responses; score the episodes with `{name}` alone"
            )
        })
    })
}

/// `sync { filter = drop_flat }` regenerates single-turn groups in the run's one trainer: episodes
/// and multi-LoRA's lanes fill their batches otherwise.
pub(super) fn rule_sync_filter(cx: &Ctx, f: &FieldValue) -> Option<String> {
    let Value::Enum { member, .. } = &f.value else { return None };
    if member != "drop_flat" {
        return None;
    }
    if env_of(cx).is_some() {
        return Some(
            "`filter = drop_flat` under `sync`: dynamic sampling regenerates single responses; a recipe of episodes (`env_reward`) filters with `fully_async { filter = drop_flat }`".into(),
        );
    }
    let named = cx
        .stages("grpo")
        .first()
        .and_then(|g| g.param("lora"))
        .and_then(Value::as_record)
        .and_then(|l| l.get("adapters"))
        .and_then(Value::as_i64)
        .is_some_and(|n| n > 1);
    named.then(|| "`filter = drop_flat` under `sync`: a multi-LoRA run's lanes take whole batches; train one adapter, or remove the filter".into())
}

/// The environment of the recipe's `env_reward` stage, if any.
pub(super) fn env_of<'c>(cx: &'c Ctx) -> Option<&'c Value> {
    cx.stages("env_reward").first().and_then(|s| s.param("env"))
}

pub(super) fn rule_env(cx: &Ctx, f: &FieldValue) -> Option<String> {
    let r = f.value.as_record()?;
    let kind = r.schema_name.as_str();
    if !RUNNABLE_ENVS.contains(&kind) {
        return Some(format!(
            "an environment `{kind}`: the runtime plays `calculator`, `command_env {{ command = [...] }}` (any program speaking JSON lines), `openenv {{ url = ... }}` and the plug-in layers `agent_program`, `rollout_program`, `external_agents` and `verifiers`"
        ));
    }
    let schedule = cx.recipe.settings.as_record().and_then(|s| s.get("schedule")).and_then(Value::as_record);
    schedule.filter(|s| AGENT_LAYERS.contains(&kind) && s.schema_name != "sync").map(|s| {
        format!(
            "`{kind}` plays its programs' sessions under the `sync` schedule (this recipe says `{}`): set `schedule = sync`, or use `command_env`, which runs under every schedule",
            s.schema_name
        )
    })
}

/// A `verifiers` environment's `args` is the env config as a JSON object: anything else would
/// fail every group in the driver, so `miles check` says so at its line.
pub(super) fn rule_verifiers_args(_: &Ctx, f: &FieldValue) -> Option<String> {
    let why = match serde_json::from_str::<serde_json::Value>(f.value.as_str()?) {
        Ok(v) if v.is_object() => return None,
        Ok(_) => "it is JSON, not a JSON object".to_string(),
        Err(e) => format!("it is not JSON ({e})"),
    };
    let example = r#"args = "{\"taskset\": {\"size\": 8}}""#;
    Some(format!("{why}: `args` is the env config's fields as a JSON object, as in {example}"))
}

pub(super) fn rule_session(cx: &Ctx, f: &FieldValue) -> Option<String> {
    // `session = none` asks for nothing; a session needs episodes to hold.
    f.value.as_record()?;
    env_of(cx).is_none().then(|| {
        "a TITO session holds multi-turn episodes, and this rollout's samples are single turns: remove `session`, or score the rollout with `env_reward`".into()
    })
}

pub(super) fn rule_eval_prompts(cx: &Ctx, f: &FieldValue) -> Option<String> {
    let want = rollout_prompts(cx).and_then(|p| prompts_json(p, "test"));
    let split_ok = f.value.as_record().and_then(|r| r.get("split")).and_then(Value::as_enum) == Some("test");
    if split_ok && want.is_some() && prompts_json(&f.value, "test") == want {
        return None;
    }
    Some("evaluation reads the test split of the rollout's prompt set: write the rollout's `prompts` with `split = test`".into())
}

pub(super) fn rule_transport(cx: &Ctx, f: &FieldValue) -> Option<String> {
    let t = f.value.as_enum()?;
    match (cx.target, t) {
        (Target::Embedded, "local") => None,
        (Target::Embedded, _) => Some(format!(
            "in one process the new weights are handed over in memory: `{t}` needs a launcher with worker processes (set `transport = local`, or `launcher = local_processes {{ ... }}`)"
        )),
        (Target::Workers, "broadcast" | "p2p" | "disk_delta") => None,
        (Target::Http, _) => Some(
            "servers given by URL load each new version from disk (`/update_weights_from_disk`): remove `transport`".into(),
        ),
        _ => Some(format!("`{t}` is not a transport between worker processes: use broadcast, p2p or disk_delta")),
    }
}

pub(super) fn rule_device(cx: &Ctx, f: &FieldValue) -> Option<String> {
    // The denoiser (engine/tch/src/diffusion) makes its tensors on the CPU.
    (f.value.as_enum() == Some("cuda") && !cx.stages("denoise").is_empty()).then(|| {
        "a diffusion recipe computes on the CPU: set `device = cpu` (or `auto`, which resolves to the CPU for it)"
            .into()
    })
}

/// The seeded `transformer` (experts > 0) one of whose fields is `f` (matched by span and value).
fn moe_transformer_of<'c>(cx: &'c Ctx, f: &FieldValue) -> Option<&'c crate::value::Record> {
    cx.recipe
        .graph
        .nodes()
        .filter_map(|n| n.model.as_deref())
        .filter(|r| r.schema_name == "transformer")
        .find(|r| r.fields.values().any(|x| x.span == f.span && x.value == f.value))
        .filter(|r| r.get("experts").and_then(Value::as_i64).is_some_and(|e| e > 0))
}

const NOT_EXPORTED: &str =
    "so the final model could not be exported in transformers' format (docs/moe.md, \"Out to transformers\")";

/// A seeded MoE's final model is exported as transformers' `qwen3_moe` (q/k norms) or `mixtral`
/// (none); no transformers architecture has a shared expert with either layer (engine/tch's
/// `ModelConfig::hf_moe_architecture` refuses the same, at export).
pub(super) fn rule_moe_shared_expert(cx: &Ctx, f: &FieldValue) -> Option<String> {
    let n = f.value.as_i64().filter(|&n| n > 0)?;
    moe_transformer_of(cx, f)?;
    Some(format!(
        "a shared expert (`shared_expert_d_ff = {n}`): no transformers architecture has a shared expert with \
         Qwen3-MoE's or Mixtral's layer, {NOT_EXPORTED}; set shared_expert_d_ff = 0"
    ))
}

/// Qwen3-MoE and Mixtral both route by a softmax.
pub(super) fn rule_moe_gating(cx: &Ctx, f: &FieldValue) -> Option<String> {
    (f.value.as_enum() == Some("sigmoid")).then_some(())?;
    moe_transformer_of(cx, f)?;
    Some(format!("sigmoid gating: Qwen3-MoE and Mixtral route by a softmax, {NOT_EXPORTED}; use gating = softmax"))
}

/// Without q/k norms the layer is Mixtral's, which has experts in every layer and always
/// renormalises the chosen experts' weights.
pub(super) fn rule_moe_qk_norm(cx: &Ctx, f: &FieldValue) -> Option<String> {
    (f.value.as_bool() == Some(false)).then_some(())?;
    let r = moe_transformer_of(cx, f)?;
    let dense = r.get("dense_layers").and_then(Value::as_i64).unwrap_or(0);
    let norm_topk = r.get("norm_topk").and_then(Value::as_bool).unwrap_or(true);
    let mut why = Vec::new();
    if dense > 0 {
        why.push((format!("dense_layers = {dense}"), "dense_layers = 0"));
    }
    if !norm_topk {
        why.push(("norm_topk = false".to_string(), "norm_topk = true"));
    }
    if why.is_empty() {
        return None;
    }
    Some(format!(
        "`qk_norm = false` with {}: without q/k norms the layer is Mixtral's, which has experts in every layer and \
         always renormalises the chosen experts' weights, {NOT_EXPORTED}; keep qk_norm = true (Qwen3-MoE's layer) \
         or set {}",
        why.iter().map(|w| w.0.as_str()).collect::<Vec<_>>().join(" and "),
        why.iter().map(|w| w.1).collect::<Vec<_>>().join(" and ")
    ))
}

/// `embedded_trainer { dp = N }`: the ranks are trainer worker processes (a launcher's), which
/// sum their gradients over c10d's Gloo process group on the CPU. One process (in `miles run`,
/// or beside rollout servers given by URL) is one rank.
pub(super) fn rule_dp(cx: &Ctx, f: &FieldValue) -> Option<String> {
    let n = f.value.as_i64().filter(|&n| n > 1)?;
    match cx.target {
        Target::Embedded => Some(format!(
            "`dp = {n}`: data-parallel ranks are worker processes: set launcher = local_processes {{}} (or slurm, ray)"
        )),
        Target::Http => Some(format!(
            "`dp = {n}`: with rollout servers given by URL the trainer runs in `miles run`'s own process, one rank: set dp = 1"
        )),
        // Only Gloo is built (engine/c10d): the ranks' tensors must be on the CPU.
        Target::Workers => (local_device(cx) == Some("cuda")).then(|| {
            format!("`dp = {n}` on `device = cuda`: data-parallel ranks reduce over Gloo on the CPU (no NCCL process group is built): set device = cpu, or dp = 1")
        }),
        Target::Cluster => None,
    }
}

/// `embedded_trainer { dp_bucket }`: the ranks' gradient buckets (see `dp_setting`).
pub(super) fn rule_dp_bucket(cx: &Ctx, _: &FieldValue) -> Option<String> {
    dp_setting(cx, "dp_bucket", "gradient buckets of the data-parallel ranks' all-reduce")
}

/// `embedded_trainer { collective_timeout }`: the ranks' deadline (see `dp_setting`).
pub(super) fn rule_collective_timeout(cx: &Ctx, _: &FieldValue) -> Option<String> {
    dp_setting(cx, "collective_timeout", "the deadline of the data-parallel ranks' collectives")
}

/// A setting of the data-parallel ranks' collectives (`what`), executed only where there are
/// ranks: worker processes, dp > 1. With one rank there is no collective for it to shape.
fn dp_setting(cx: &Ctx, field: &str, what: &str) -> Option<String> {
    if cx.target != Target::Workers {
        return Some(format!(
            "{what}, which are worker processes: set a launcher and dp = 2 or more, or remove `{field}`"
        ));
    }
    let dp = cx.record.and_then(|r| r.get("dp")).and_then(|v| v.as_i64()).unwrap_or(1);
    (dp <= 1).then(|| format!("{what}, and with dp = 1 there are none: set dp = 2 or more, or remove `{field}`"))
}

/// A `local` cluster's `device` (`cpu`, `cuda`, `auto`), if the recipe runs on one.
fn local_device<'c>(cx: &'c Ctx) -> Option<&'c str> {
    let cluster = cx.recipe.settings.as_record()?.get("cluster")?.as_record()?;
    (cluster.schema_name == "local").then(|| cluster.get("device")?.as_enum()).flatten()
}
