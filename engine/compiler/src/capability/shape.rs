//! The run contract's refusals about a recipe's shape rather than a field's value: which stages
//! the embedded backend runs together (one `generate` and one trainer; a diffusion recipe's one
//! denoiser, rollout, reward and trainer), which engines, trainers, models and prompt sets it
//! reads, and which combinations (a teacher no trainer reads, servers by URL with a launcher).
//! `miles run` asks here before it maps a recipe (src/runspec.rs), so every E0511 has its home in
//! `capability/`: the table for fields, this file for shapes. They are reported when a recipe is
//! run, not at `miles check`: a recipe of another shape may still be planned.

use crate::graph::StageNode;
use crate::job::read::{refusal_span, Fields};
use crate::job::{DiffusionJob, Family, Job, ModelJob, StageJob};
use crate::recipe::CompiledRecipe;
use miles_grammar::diag::{Diagnostic, ErrorCode, Span};

/// The stage kinds a language-model run executes.
const LM_KINDS: &[&str] = &[
    "generate",
    "grpo",
    "ppo",
    "sft",
    "weights",
    "evaluate",
    "checkpoint",
    "samples",
    "exact_match",
    "verify",
    "command_reward",
    "http_reward",
    "group_command_reward",
    "group_http_reward",
    "combine",
    "env_reward",
    "teacher_logprobs",
];

/// The stage kinds a diffusion run executes.
const DIFFUSION_KINDS: &[&str] =
    &["denoise_pretrain", "denoise", "image_reward", "diffusion_grpo", "image_eval", "weights"];

/// The prompt sets the runtime reads: std/tasks' built-in tasks and data files.
const PROMPTS: &[&str] = &["addition", "multiplication", "reverse", "sort", "jsonl", "parquet"];

struct Refusals<'r> {
    recipe: &'r CompiledRecipe,
    diags: Vec<Diagnostic>,
}

impl<'r> Refusals<'r> {
    fn job(&self) -> &'r Job {
        &self.recipe.job
    }

    fn node(&self, s: &StageJob) -> Option<&'r StageNode> {
        self.recipe.graph.node(&s.name)
    }

    fn field_span(&self, s: &StageJob, field: &str) -> Span {
        self.node(s).map_or(s.name_span, |n| refusal_span(n, field))
    }

    fn refuse(&mut self, span: Span, what: String, help: &str) {
        self.diags.push(
            Diagnostic::error(ErrorCode::E0511, format!("the embedded backend cannot run {what}"))
                .with_primary(span, "not supported by `miles run` on this machine")
                .with_help(help.to_string()),
        );
    }

    fn of_kind(&self, kind: &str) -> Vec<&'r StageJob> {
        self.job().stages.iter().filter(|s| s.kind == kind).collect()
    }

    /// The record in `field` of a stage (an engine, a backend) must be the embedded one.
    fn require_embedded(&mut self, s: &StageJob, field: &str, schema: Option<&str>, embedded: &str, what: &str) {
        let Some(schema) = schema.filter(|schema| *schema != embedded) else { return };
        let help = format!("remove `{field}` (the embedded {what} is the default) to run here");
        let span = self.field_span(s, field);
        self.refuse(span, format!("a `{schema}` {what}"), &help);
    }

    fn kinds_outside(&mut self, kinds: &[&str], what: impl Fn(&str) -> String, help: &str) {
        for node in self.recipe.graph.nodes() {
            if !kinds.contains(&node.kind.as_str()) {
                self.refuse(node.name_span, what(&node.kind), help);
            }
        }
    }

    fn result<T>(self, ok: T) -> Result<T, Vec<Diagnostic>> {
        if self.diags.is_empty() {
            Ok(ok)
        } else {
            Err(self.diags)
        }
    }
}

/// The rollout and the trainer a language-model run executes, or every reason it cannot run.
pub fn lm_run(recipe: &CompiledRecipe) -> Result<(&StageJob, &StageJob), Vec<Diagnostic>> {
    let mut r = Refusals { recipe, diags: Vec::new() };
    let rollouts = r.of_kind("generate");
    let trainers: Vec<&StageJob> = r.job().trainers().collect();
    let (Some(rollout), Some(train)) = (rollouts.first().copied(), trainers.first().copied()) else {
        let d = Diagnostic::error(
            ErrorCode::E0511,
            "the embedded backend runs a recipe with a `generate` rollout and a `grpo` trainer",
        )
        .with_primary(
            recipe.graph.nodes().next().map(|n| n.name_span).unwrap_or(recipe.span),
            "this recipe has no rollout and trainer pair",
        )
        .with_help("add `rollout = generate(...)`, a reward and `train = grpo(rollout, reward)`");
        return Err(vec![d]);
    };
    for extra in rollouts.iter().skip(1).chain(trainers.iter().skip(1)) {
        r.refuse(
            extra.name_span,
            format!("a second `{}` stage", extra.kind),
            "the embedded backend runs one rollout and one trainer",
        );
    }
    r.kinds_outside(
        LM_KINDS,
        |k| format!("a `{k}` stage"),
        "the embedded backend runs sft, generate, exact_match, verify, command_reward, http_reward, \
         group_command_reward, group_http_reward, combine, env_reward, teacher_logprobs, grpo, weights, evaluate, checkpoint and samples",
    );
    let engine = rollout.rollout.as_ref().and_then(|x| x.engine.as_ref());
    let by_url = engine.is_some_and(|e| e.schema == "sglang" && !e.urls.is_empty());
    if !by_url {
        r.require_embedded(rollout, "engine", engine.map(|e| e.schema.as_str()), "embedded_engine", "engine");
    }
    let backend = train.train.as_ref().and_then(|t| t.backend.as_ref());
    r.require_embedded(train, "backend", backend.map(|b| b.schema.as_str()), "embedded_trainer", "trainer");
    if !matches!(rollout.model, Some(ModelJob::Transformer { .. } | ModelJob::Hf(_))) {
        let record = r.node(rollout).and_then(|n| n.model.as_deref());
        r.refuse(
            record.map_or(rollout.name_span, |m| m.span),
            format!("a `{}` model", record.map_or("unknown", |m| m.schema_name.as_str())),
            "the embedded backend trains a `transformer { ... }` from a seed",
        );
        return Err(r.diags);
    }
    hf_directories(&mut r);
    let prompts = r.node(rollout).and_then(|n| n.record("prompts"));
    if !prompts.is_some_and(|p| PROMPTS.contains(&p.schema_name.as_str())) {
        r.refuse(
            r.field_span(rollout, "prompts"),
            format!("prompts from `{}`", prompts.map_or("?", |p| p.schema_name.as_str())),
            "use a built-in task (std/tasks/arith, std/tasks/strings), `jsonl { ... }` or `parquet { ... }`",
        );
        return Err(r.diags);
    }
    verifier_schema(&mut r, train);
    verifiers_args(&mut r);
    unread_teachers(&mut r, train);
    if by_url && recipe.settings.as_record().and_then(|s| s.record("launcher")).is_some_and(launches_workers) {
        r.refuse(
            r.field_span(rollout, "engine"),
            "rollout servers given by URL together with a launcher".into(),
            "with `engine = sglang { url = ... }` the trainer runs in `miles run`; remove `launcher`",
        );
    }
    r.result((rollout, train))
}

/// Every `hf` directory a run would load (the policy's, an OPD teacher's), at the model's line:
/// an architecture the embedded backend loads, with tokenizer.json and the weights beside
/// config.json. `miles check` and `miles plan` read config.json alone, so a directory holding
/// only config.json checks and plans; `miles run` refuses it here, before loading anything.
fn hf_directories(r: &mut Refusals) {
    let mut seen = std::collections::HashSet::new();
    for s in &r.job().stages {
        let Some(ModelJob::Hf(h)) = &s.model else { continue };
        if !seen.insert(h.path.as_str()) {
            continue;
        }
        let span = r.node(s).and_then(|n| n.model.as_deref()).map_or(s.name_span, |m| m.span);
        if !h.loadable {
            r.refuse(
                span,
                format!("a `{}` model ({}/config.json)", h.architecture, h.path),
                "the embedded backend loads llama, mistral, qwen2, qwen3, qwen3_moe and mixtral; plan it with `miles plan`",
            );
            continue;
        }
        if !h.has_weights {
            r.refuse(
                span,
                format!(
                    "a model directory without weights ({}: no model.safetensors nor model.safetensors.index.json)",
                    h.path
                ),
                "`miles check` and `miles plan` read config.json alone; to run, save the weights there as safetensors \
                 (model.save_pretrained(dir, safe_serialization=True)) or download the model's files into it",
            );
        }
        if !h.has_tokenizer {
            r.refuse(
                span,
                format!("a model directory without tokenizer.json ({})", h.path),
                "`miles check` and `miles plan` read config.json alone; to run, save a fast tokenizer there \
                 (AutoTokenizer.from_pretrained(...).save_pretrained(dir)) or download the model's tokenizer.json into it",
            );
        }
    }
}

/// A launcher that starts worker processes (not `in_process`).
fn launches_workers(l: &crate::value::Record) -> bool {
    matches!(l.schema_name.as_str(), "local_processes" | "slurm" | "ray")
}

/// A `verify` reward's `schema_text` must be JSON, also as a part of a combination.
fn verifier_schema(r: &mut Refusals, train: &StageJob) {
    let graph = &r.recipe.graph;
    let mut stack: Vec<&str> = train.train.as_ref().and_then(|t| t.reward.as_deref()).into_iter().collect();
    // Each stage once: a recipe may name one part in several combinations.
    let mut seen = std::collections::HashSet::new();
    while let Some(name) = stack.pop() {
        let Some(node) = graph.node(name).filter(|_| seen.insert(name)) else { continue };
        if node.kind == "combine" {
            stack.extend(node.list("parts").iter().filter_map(|p| match p {
                crate::value::Value::Stage(n) => Some(n.as_str()),
                _ => None,
            }));
            continue;
        }
        let Some(text) = node.str("schema_text").filter(|_| node.kind == "verify") else { continue };
        if let Err(e) = serde_json::from_str::<serde_json::Value>(text) {
            r.diags.push(
                Diagnostic::error(ErrorCode::E0511, format!("`schema_text` is not valid JSON: {e}"))
                    .with_primary(refusal_span(node, "schema_text"), "a JSON schema, as text"),
            );
        }
    }
}

/// A `verifiers` environment's `args` must be a JSON object (its driver would fail every group).
fn verifiers_args(r: &mut Refusals) {
    for node in r.recipe.graph.nodes().filter(|n| n.kind == "env_reward") {
        let Some(env) = node.record("env").filter(|e| e.schema_name == "verifiers") else { continue };
        let Some(text) = env.str("args") else { continue };
        let why = match serde_json::from_str::<serde_json::Value>(text) {
            Ok(v) if v.is_object() => continue,
            Ok(_) => "it is JSON, not a JSON object".to_string(),
            Err(e) => e.to_string(),
        };
        let span = env.set_span("args").unwrap_or_else(|| refusal_span(node, "env"));
        r.diags.push(
            Diagnostic::error(
                ErrorCode::E0511,
                format!("the `verifiers` environment's `args` is not a JSON object: {why}"),
            )
            .with_primary(span, "the env config's fields, as JSON text")
            .with_help("args = \"{\\\"taskset\\\": {\\\"size\\\": 8}}\""),
        );
    }
}

/// A teacher stage no trainer reads is refused, never run for nothing.
fn unread_teachers(r: &mut Refusals, train: &StageJob) {
    let read = r.job().teacher_of(train);
    for t in r.of_kind("teacher_logprobs") {
        if read.is_none_or(|x| x.name != t.name) {
            r.refuse(
                t.name_span,
                format!("a teacher stage no trainer reads (`{}`)", t.name),
                "name it in the trainer's distillation: train.opd = opd { teacher = ... }, or remove it",
            );
        }
    }
}

/// The diffusion job a diffusion run executes (with its reward and trainer), or every reason it
/// cannot run.
pub fn diffusion_run(recipe: &CompiledRecipe) -> Result<&DiffusionJob, Vec<Diagnostic>> {
    let mut r = Refusals { recipe, diags: Vec::new() };
    r.kinds_outside(
        DIFFUSION_KINDS,
        |k| format!("a `{k}` stage in a diffusion recipe"),
        "a diffusion run executes denoise_pretrain, denoise, image_reward, diffusion_grpo, image_eval and weights",
    );
    let mut one = |kind: &str| {
        let all = r.of_kind(kind);
        for extra in all.iter().skip(1) {
            r.refuse(extra.name_span, format!("a second `{kind}` stage"), "a diffusion run has one of each stage");
        }
        all.first().copied()
    };
    let (rollout, reward, train) = (one("denoise"), one("image_reward"), one("diffusion_grpo"));
    one("denoise_pretrain");
    one("image_eval");
    let (Some(rollout), Some(_), Some(train)) = (rollout, reward, train) else {
        let d = Diagnostic::error(
            ErrorCode::E0511,
            "the embedded backend runs a diffusion recipe with a `denoise` rollout, an `image_reward` and a `diffusion_grpo` trainer",
        )
        .with_primary(rollout.map(|n| n.name_span).unwrap_or(recipe.span), "this recipe lacks one of them")
        .with_help("reward = image_reward(rollout) { ... } and train = diffusion_grpo(rollout, reward) { ... }");
        r.diags.push(d);
        return Err(r.diags);
    };
    let Family::Diffusion(d) = &recipe.job.family else {
        r.refuse(
            rollout.name_span,
            "a denoising rollout without a `denoiser` model".into(),
            "model policy = denoiser { ... }",
        );
        return Err(r.diags);
    };
    // The trainer must train the rollout's samples with the reward that scored them.
    let (scored_by, reward) = (d.train.as_ref().and_then(|t| t.reward.as_deref()), d.reward.as_ref());
    if scored_by != reward.map(|w| w.stage.as_str()) {
        r.refuse(train.name_span, "a trainer fed by another reward".into(), "train = diffusion_grpo(rollout, reward)");
    }
    r.result(&**d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::MemoryFs;
    use crate::{compile, Options};

    const RECIPE: &str = r#"
import std/tasks/arith
model policy = transformer { layers = 1, d_model = 32, heads = 2, vocab = arith.vocab }
recipe r {
    rollout = generate(policy) { prompts = arith.addition { digits = 2 }, samples_per_prompt = 4, max_new_tokens = 4.tokens }
    again = generate(policy) { prompts = arith.addition { digits = 2 }, samples_per_prompt = 4, max_new_tokens = 4.tokens }
    reward = exact_match(rollout)
    train = grpo(rollout, reward) { rollout_batch = 8, global_batch = 32 }
    sync = weights(train -> rollout)
    stop = 2.steps
}
"#;

    fn refusals(text: &str) -> Vec<String> {
        let fs = MemoryFs::with(&[("r.miles", text)]);
        let c = compile(&fs, &["r.miles".to_string()], &Options::default());
        match lm_run(&c.recipes[0]) {
            Ok(_) => Vec::new(),
            Err(d) => d.into_iter().map(|d| format!("{} {}", d.code, d.message)).collect(),
        }
    }

    #[test]
    fn a_second_rollout_is_refused_and_one_rollout_runs() {
        let got = refusals(RECIPE);
        assert_eq!(got, ["E0511 the embedded backend cannot run a second `generate` stage"], "{got:?}");
        let one = RECIPE.lines().filter(|l| !l.trim_start().starts_with("again")).collect::<Vec<_>>().join("\n");
        assert_eq!(refusals(&one), Vec::<String>::new());
    }

    #[test]
    fn verifiers_args_must_be_a_json_object() {
        let with_args = |args: &str| {
            let one = RECIPE.lines().filter(|l| !l.trim_start().starts_with("again")).collect::<Vec<_>>().join("\n");
            let env = format!("reward = env_reward(rollout) {{ env = verifiers {{ module = \"m\", args = {args} }} }}");
            refusals(&one.replace("reward = exact_match(rollout)", &env))
        };
        assert_eq!(with_args(r#""{\"taskset\": {\"size\": 8}}""#), Vec::<String>::new());
        let not_json = with_args(r#""{taskset: 8}""#);
        assert!(
            not_json.len() == 1
                && not_json[0].starts_with(
                    "E0511 the `verifiers` environment's `args` is not a JSON object: key must be a string"
                ),
            "{not_json:?}"
        );
        let list = with_args(r#""[1]""#);
        assert_eq!(
            list,
            ["E0511 the `verifiers` environment's `args` is not a JSON object: it is JSON, not a JSON object"]
        );
    }
}
