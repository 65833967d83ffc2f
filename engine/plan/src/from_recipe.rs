//! From a compiled recipe to the planner's input: reads the resolved stage graph and the
//! catalog records (`schema gpu`, `schema llm`, `schema transformer`, ...) field by field.
//!
//! The recipe has already passed the compiler's checks, so a missing or mistyped field here is
//! a bug in this mapping, not in the recipe; such a field falls back to `None`/a default and the
//! planner reports what it cannot plan.

use crate::input::*;
use miles_compiler::graph::{ChannelKind, StageGraph, StageNode};
use miles_compiler::num::Q;
use miles_compiler::value::{Record, Value};
use miles_compiler::CompiledRecipe;
use miles_grammar::diag::Span;
use std::collections::HashMap;

/// Builds the planner's input for one compiled recipe.
pub fn plan_input(recipe: &CompiledRecipe) -> PlanInput {
    let settings = recipe.settings.as_record();
    let g = &recipe.graph;
    let cluster = settings.and_then(|s| s.get("cluster")).and_then(Value::as_record);
    let cluster = cluster_of(&recipe.cluster_name, cluster);
    let mut stages = Vec::new();
    let mut syncs = Vec::new();
    let mut batch = Batch::default();
    let mut r3 = Spanned::new(false);
    let mut r3_id_bytes = None;
    let episodes = episodes_of(g);
    // The rollout's expected lengths, when the recipe states them (time only: docs/plan.md).
    // The rollout the (first) trainer reads, else the first `generate`.
    let rollout_node = g
        .nodes()
        .filter(|n| role_of(n) == Role::Train)
        .find_map(|t| upstream_rollout(g, t))
        .or_else(|| g.nodes().find(|n| n.kind == "generate"));
    let mean = |name: &str| rollout_node.and_then(|n| n.param(name)).and_then(Value::as_f64);
    let assumptions = Assumptions {
        mean_prompt_tokens: mean("mean_prompt_tokens").filter(|v| v.is_finite()),
        mean_response_tokens: mean("mean_response_tokens").filter(|v| v.is_finite()),
        ..Assumptions::default()
    };
    // With episodes, a rollout's (and its trainer's) sequence is a whole episode.
    let as_episode = |(prompt, response): (Spanned<u64>, Spanned<u64>), model: Option<&ModelSpec>| match &episodes {
        Some(e) => {
            let n = e.tokens(&assumptions, model.map(|m| m.max_context));
            (prompt, Spanned { value: n.saturating_sub(prompt.value), span: response.span })
        }
        None => (prompt, response),
    };
    // What a trainer trains on per sequence: its rollout's prompt + response (an episode's whole
    // context).
    let trainer_seq_len = |train: &StageNode, model: Option<&ModelSpec>| {
        let rollout = upstream_rollout(g, train).map(|r| lengths(g, r));
        let (prompt, response) = as_episode(rollout.unwrap_or((Spanned::new(0), Spanned::new(0))), model);
        Spanned::new(prompt.value + response.value)
    };
    for node in g.nodes() {
        if node.kind == "weights" {
            syncs.push(sync_of(node));
            continue;
        }
        let role = role_of(node);
        let model = node.model.as_deref().and_then(model_spec);
        let mut stage = Stage {
            name: node.name.clone(),
            kind: node.kind.clone(),
            role,
            model,
            gpus: None,
            engine: None,
            trainer: None,
            teacher: None,
            span: Some(node.name_span),
        };
        if role == Role::Rollout || role == Role::Eval {
            if let Some(engine) = rec(node, "engine") {
                if engine.schema_name == "sglang" && engine.get("url").is_none_or(|u| *u == Value::None) {
                    stage.gpus = Some(gpu_request(engine));
                }
                let (prompt, response) = as_episode(lengths(g, node), stage.model.as_ref());
                stage.engine = Some(engine_of(engine, prompt, response));
            }
            // `record_routing` defaults to `routing_replay`: its span is the replay's when defaulted.
            if let Some((true, s)) = param_bool(node, "record_routing") {
                r3 = spanned(true, s.or_else(|| param_span(node, "routing_replay")));
                r3_id_bytes = match node.param("routing_dtype").and_then(Value::as_enum) {
                    Some("u8") => Some(1),
                    Some("u16") => Some(2),
                    Some("i32") => Some(4),
                    _ => None,
                };
            }
        }
        if role.trains() {
            let seq_len = trainer_seq_len(node, stage.model.as_ref());
            if let Some(backend) = rec(node, "backend") {
                if matches!(backend.schema_name.as_str(), "megatron" | "fsdp") {
                    stage.gpus = Some(gpu_request(backend));
                }
                let offload = rec(node, "optimizer").and_then(|o| enum_of(o, "state"));
                stage.trainer = Some(trainer_of(g, node, backend, seq_len, offload));
            }
            if role == Role::Train && batch.rollout_batch.is_none() {
                batch.rollout_batch = param_int(node, "rollout_batch");
                batch.global_batch = param_int(node, "global_batch");
                batch.steps_per_rollout = param_int(node, "steps_per_rollout");
                batch.samples_per_prompt = upstream_rollout(g, node).and_then(|r| param_int(r, "samples_per_prompt"));
            }
        }
        // An OPD teacher stage on GPUs of its own: the trainer that reads it says what it scores.
        if let Some(n) = node.kind.eq("teacher_logprobs").then(|| param_int(node, "gpus")).flatten() {
            stage.gpus = Some(spanned(GpuRequest::Count(n.value), n.span));
            let reader = g.nodes().find(|t| teacher_stage_of(g, t).is_some_and(|x| x.name == node.name));
            stage.teacher = reader.and_then(|t| {
                let student = t.model.as_deref().and_then(model_spec);
                let tr = trainer_of(g, t, rec(t, "backend")?, trainer_seq_len(t, student.as_ref()), None);
                Some(TeacherJob {
                    seq_len: tr.seq_len.value,
                    micro_batch: tr.micro_batch.value,
                    precision: tr.precision.value,
                })
            });
        }
        // A kind the planner does not know, running a model of its own (a teacher in a field):
        // that model is the one E0410 names, whatever the stage's ports lead to.
        if stage.trainer.is_none() && stage.engine.is_none() && !KNOWN_KINDS.contains(&node.kind.as_str()) {
            if let Some(m) = node.params.values().find_map(|p| p.value.as_record().and_then(model_spec)) {
                stage.model = Some(m);
            }
        }
        stages.push(stage);
    }
    let placement = match settings.and_then(|s| s.fields.get("placement")) {
        Some(f) => Placement {
            embedded: embedded_extras(g),
            diffusion: diffusion_of(g),
            mode: spanned(
                if f.value.as_enum() == Some("colocated") {
                    PlacementMode::Colocated
                } else {
                    PlacementMode::Disaggregated
                },
                (!f.defaulted).then_some(f.span),
            ),
        },
        None => Placement { embedded: embedded_extras(g), diffusion: diffusion_of(g), ..Placement::default() },
    };
    let schedule = settings
        .and_then(|s| s.fields.get("schedule"))
        .map(|f| schedule_of(&f.value, f.span, f.defaulted))
        .unwrap_or_default();
    PlanInput {
        recipe: recipe.name.clone(),
        cluster,
        stages,
        graph: graph_of(g),
        placement,
        syncs,
        schedule,
        batch,
        r3,
        r3_id_bytes,
        episodes,
        assumptions,
        device: device_of(settings.and_then(|s| s.get("cluster")).and_then(Value::as_record), g),
    }
}

/// A `local` cluster's `device`, with its span when the recipe set it.
fn device_of(cluster: Option<&Record>, g: &StageGraph) -> Option<DeviceInput> {
    let c = cluster.filter(|c| c.schema_name == "local")?;
    let asked = c.get("device").and_then(Value::as_enum)?.to_string();
    // engine/tch/src/diffusion makes its tensors on the CPU (`device = cuda` there is E0511).
    let cpu_only = g.nodes().any(|n| n.kind == "denoise").then(|| "a diffusion recipe computes on the CPU".to_string());
    Some(DeviceInput {
        asked: Spanned { value: asked, span: field_span(c, "device") },
        machine: None,
        cpu_only,
        cpu_bf16: None,
    })
}

/// The episodes of a rollout scored by an environment (`env_reward`): its turn limit, and what an
/// observation of a built-in environment adds (the calculator's `<result>N</result>`, one token
/// per character on the embedded char tokenizer).
fn episodes_of(g: &StageGraph) -> Option<Episodes> {
    let node = g.nodes().find(|n| n.kind == "env_reward")?;
    let env = rec(node, "env");
    let observation_tokens = match env.map(|e| e.schema_name.as_str()) {
        Some("calculator") => {
            let digits = env.and_then(|e| int_of(e, "digits")).map_or(2, |d| d.0);
            Some("<result></result>".len() as u64 + 2 * digits)
        }
        _ => None,
    };
    let (prompt, turn) = upstream_rollout(g, node).map(|r| lengths(g, r)).unwrap_or_default();
    Some(Episodes {
        env: env.map_or_else(|| "?".into(), |e| e.schema_name.clone()),
        max_turns: param_int(node, "max_turns").unwrap_or(Spanned::new(4)),
        observation_tokens,
        prompt_tokens: prompt.value,
        turn_tokens: turn.value,
        compact_keep_turns: rec(node, "compact").map(|c| int_of(c, "keep_turns").map_or(1, |k| k.0)),
        mean_turns: node
            .param("mean_turns")
            .and_then(Value::as_f64)
            .filter(|v| v.is_finite())
            .map(|v| spanned(v, param_span(node, "mean_turns"))),
    })
}

/// What the embedded process holds besides the trainer: a KL reference (`kl_coef > 0` on a
/// trainer), a snapshot evaluation's engine (`evaluate { mode = snapshot }`), the entropy's graph
/// (`entropy_coef > 0`).
fn embedded_extras(g: &StageGraph) -> EmbeddedExtras {
    let positive = |n: &StageNode, name: &str| n.param(name).and_then(Value::as_f64).is_some_and(|v| v > 0.0);
    let trainers = || g.nodes().filter(|n| role_of(n) == Role::Train);
    EmbeddedExtras {
        kl_reference: trainers().any(|n| positive(n, "kl_coef")),
        eval_snapshot: g
            .nodes()
            .any(|n| role_of(n) == Role::Eval && n.param("mode").and_then(Value::as_enum) == Some("snapshot")),
        entropy_in_loss: trainers().any(|n| positive(n, "entropy_coef")),
    }
}

/// A diffusion RL recipe: a `denoise` stage sampling from a `denoiser` record, with the first
/// `denoise_pretrain`, `image_reward`, `diffusion_grpo` and `image_eval` stages (docs/plan.md,
/// "Diffusion RL"). `None` for every other recipe.
fn diffusion_of(g: &StageGraph) -> Option<Diffusion> {
    let rollout = g.nodes().find(|n| n.kind == "denoise")?;
    let r = rollout.model.as_deref().filter(|r| r.schema_name == "denoiser")?;
    let model = DenoiserSpec {
        side: u64_of(r, "side")?,
        conditions: u64_of(r, "conditions")?,
        hidden: u64_of(r, "hidden")?,
        layers: u64_of(r, "layers")?,
        params: u64_of(r, "params")?,
    };
    let of_kind = |kind: &str| g.nodes().find(|n| n.kind == kind);
    let num = |n: &StageNode, name: &str| n.param(name).and_then(Value::as_q).and_then(q_to_u64);
    let real = |n: &StageNode, name: &str| n.param(name).and_then(Value::as_f64);
    Some(Diffusion {
        model,
        pretrain: of_kind("denoise_pretrain").map(|n| DenoisePretrain {
            stage: n.name.clone(),
            steps: num(n, "steps").unwrap_or(3000),
            batch: num(n, "batch").unwrap_or(64),
        }),
        rollout: DenoiseRollout {
            stage: rollout.name.clone(),
            steps: num(rollout, "steps").unwrap_or(20),
            guidance: real(rollout, "guidance").unwrap_or(3.0),
            samples_per_condition: num(rollout, "samples_per_condition").unwrap_or(8),
            micro_group: num(rollout, "micro_group").unwrap_or(8),
        },
        reward: of_kind("image_reward").map(|n| ImageReward {
            stage: n.name.clone(),
            streaming: n.param("streaming").and_then(Value::as_bool).unwrap_or(true),
            process: n.param("process").and_then(Value::as_bool).unwrap_or(false),
            extra_cost_s: real(n, "extra_cost").filter(|x| x.is_finite() && *x > 0.0).unwrap_or(0.0),
            classifier_steps: match n.param("classifier").and_then(|v| v.as_str()) {
                Some(_) => None,
                None => Some(num(n, "classifier_steps").unwrap_or(300)),
            },
            analytic: n.param("analytic").and_then(Value::as_enum).is_some(),
        }),
        train: of_kind("diffusion_grpo").map(|n| DiffusionTrainer {
            stage: n.name.clone(),
            conditions_per_step: num(n, "conditions_per_step").unwrap_or(4),
            train_steps: n.param("train_steps").and_then(Value::as_i64).and_then(|v| u64::try_from(v).ok()),
            kl_coef: real(n, "kl_coef").filter(|x| x.is_finite() && *x > 0.0).unwrap_or(0.0),
        }),
        eval: of_kind("image_eval").map(|n| ImageEval {
            stage: n.name.clone(),
            every: num(n, "every").unwrap_or(25),
            samples: num(n, "samples").unwrap_or(32),
            judge_steps: num(n, "judge_steps").unwrap_or(600),
        }),
    })
}

fn spanned<T>(value: T, span: Option<Span>) -> Spanned<T> {
    Spanned { value, span }
}

/// `gpus` (a count), `gpus` + `first_gpu` (a range), or neither (the planner sizes the stage).
fn gpu_request(r: &Record) -> Spanned<GpuRequest> {
    match (int_of(r, "gpus"), int_of(r, "first_gpu")) {
        (Some((n, s)), Some((first, fs))) => {
            spanned(GpuRequest::Range { first, last: first + n.saturating_sub(1) }, fs.or(s))
        }
        (Some((n, s)), None) => spanned(GpuRequest::Count(n), s),
        _ => Spanned::new(GpuRequest::Auto),
    }
}

fn role_of(node: &StageNode) -> Role {
    use miles_compiler::value::PortKind;
    match (node.kind.as_str(), node.output) {
        ("sft", _) => Role::Sft,
        ("generate", _) => Role::Rollout,
        ("evaluate", _) => Role::Eval,
        ("teacher_logprobs", _) => Role::Teacher,
        (_, Some(PortKind::Trajectories)) => Role::Rollout,
        (_, Some(PortKind::Scores)) => Role::Reward,
        (_, Some(PortKind::Policy)) => Role::Train,
        _ => Role::Other,
    }
}

/// A parameter that is a record (`engine`, `backend`, `optimizer`).
fn rec<'a>(node: &'a StageNode, name: &str) -> Option<&'a Record> {
    node.param(name).and_then(Value::as_record)
}

fn param_span(node: &StageNode, name: &str) -> Option<Span> {
    node.params.get(name).filter(|p| !p.defaulted).map(|p| p.span)
}

fn param_int(node: &StageNode, name: &str) -> Option<Spanned<u64>> {
    let v = node.param(name)?.as_i64()?;
    Some(spanned(u64::try_from(v).ok()?, param_span(node, name)))
}

fn param_bool(node: &StageNode, name: &str) -> Option<(bool, Option<Span>)> {
    Some((node.param(name)?.as_bool()?, param_span(node, name)))
}

fn field_span(r: &Record, name: &str) -> Option<Span> {
    r.fields.get(name).filter(|f| !f.defaulted && f.span != Span::default()).map(|f| f.span)
}

fn int_of(r: &Record, name: &str) -> Option<(u64, Option<Span>)> {
    let v = r.get(name)?.as_i64()?;
    Some((u64::try_from(v).ok()?, field_span(r, name)))
}

fn u64_of(r: &Record, name: &str) -> Option<u64> {
    r.get(name).and_then(Value::as_q).and_then(q_to_u64)
}

fn q_to_u64(q: Q) -> Option<u64> {
    let f = q.to_f64();
    (f.is_finite() && f >= 0.0).then(|| f.round() as u64)
}

fn f64_of(r: &Record, name: &str) -> Option<f64> {
    r.get(name).and_then(Value::as_f64)
}

fn enum_of<'a>(r: &'a Record, name: &str) -> Option<(&'a str, Option<Span>)> {
    Some((r.get(name)?.as_enum()?, field_span(r, name)))
}

fn str_of(r: &Record, name: &str) -> Option<String> {
    r.get(name).and_then(|v| v.as_str()).map(str::to_string)
}

fn cluster_of(name: &str, r: Option<&Record>) -> Cluster {
    let Some(r) = r else { return Cluster { name: name.to_string(), pools: Vec::new(), host: None, span: None } };
    match r.schema_name.as_str() {
        "gpu_cluster" => {
            let gpu = r.get("gpu").and_then(Value::as_record).and_then(gpu_spec);
            let gpus = u64_of(r, "gpus").unwrap_or(0);
            let per_node = u64_of(r, "gpus_per_node").unwrap_or(1).max(1);
            let pools = gpu
                .map(|g| vec![NodePool { gpu: g, nodes: spanned(gpus.div_ceil(per_node), field_span(r, "gpus")) }])
                .unwrap_or_default();
            Cluster { name: name.to_string(), pools, host: None, span: Some(r.span) }
        }
        _ => Cluster {
            name: name.to_string(),
            pools: Vec::new(),
            host: Some(HostSpec {
                name: name.to_string(),
                cpus: u64_of(r, "cpus").unwrap_or(1),
                memory: u64_of(r, "memory").unwrap_or(0),
                memory_bandwidth: f64_of(r, "memory_bandwidth").unwrap_or(0.0),
                fp32: f64_of(r, "fp32"),
            }),
            span: Some(r.span),
        },
    }
}

fn arch_of(s: &str) -> Arch {
    match s {
        "ampere" => Arch::Ampere,
        "hopper" => Arch::Hopper,
        "blackwell" => Arch::Blackwell,
        "cdna3" => Arch::Cdna3,
        "cdna4" => Arch::Cdna4,
        _ => Arch::Cpu,
    }
}

fn gpu_spec(r: &Record) -> Option<GpuSpec> {
    Some(GpuSpec {
        name: str_of(r, "name")?,
        arch: arch_of(r.get("arch")?.as_enum()?),
        hbm: u64_of(r, "hbm")?,
        hbm_bandwidth: f64_of(r, "hbm_bandwidth")?,
        bf16: f64_of(r, "bf16")?,
        fp8: f64_of(r, "fp8"),
        fp4: f64_of(r, "fp4"),
        scaleup_domain: u64_of(r, "scaleup_domain")?,
        scaleup_bandwidth: f64_of(r, "scaleup_bandwidth")?,
        network_bandwidth: f64_of(r, "network_bandwidth")?,
        gpus_per_node: u64_of(r, "gpus_per_node")?,
        host_link_bandwidth: f64_of(r, "host_link_bandwidth")?,
        host_memory: u64_of(r, "host_memory"),
        disk_bandwidth: f64_of(r, "disk_bandwidth"),
    })
}

fn model_spec(r: &Record) -> Option<ModelSpec> {
    match r.schema_name.as_str() {
        "llm" => Some(ModelSpec {
            name: str_of(r, "name")?,
            params: u64_of(r, "params")?,
            active_params: u64_of(r, "active_params")?,
            layers: u64_of(r, "layers")?,
            dense_layers: u64_of(r, "dense_layers").unwrap_or(0),
            hidden_size: u64_of(r, "hidden_size")?,
            heads: u64_of(r, "heads")?,
            kv_heads: u64_of(r, "kv_heads")?,
            head_dim: u64_of(r, "head_dim")?,
            vocab: u64_of(r, "vocab")?,
            experts: u64_of(r, "experts").unwrap_or(0),
            top_k: u64_of(r, "top_k").unwrap_or(0),
            max_context: u64_of(r, "max_context")?,
            attention: match r.get("attention")?.as_enum()? {
                "mha" => Attention::Mha,
                "mla" => Attention::Mla,
                _ => Attention::Gqa,
            },
            kv_lora_rank: u64_of(r, "kv_lora_rank"),
            qk_rope_head_dim: u64_of(r, "qk_rope_head_dim"),
            sparse_topk: u64_of(r, "sparse_topk"),
            index_head_dim: u64_of(r, "index_head_dim"),
            update_requantize_s: f64_of(r, "update_requantize"),
            intermediate_size: None,
            tied_embeddings: None,
        }),
        // The embedded backend's decoder: parameters counted from its shape (docs/plan.md).
        // With `experts > 0` every layer from `dense_layers` on is a mixture of experts: a router
        // (experts x d_model), `experts` SwiGLU experts of `expert_d_ff` (top_k of them active
        // per token) and an optional shared expert of `shared_expert_d_ff`.
        "transformer" => {
            let (d, heads, kv) = (u64_of(r, "d_model")?, u64_of(r, "heads")?.max(1), u64_of(r, "kv_heads")?);
            let (ff, vocab, hd, layers) = (u64_of(r, "d_ff")?, u64_of(r, "vocab")?, d / heads, u64_of(r, "layers")?);
            let attn = d * heads * hd + 2 * d * kv * hd + heads * hd * d;
            let experts = u64_of(r, "experts").unwrap_or(0);
            let (top_k, dense_layers) = if experts == 0 {
                (0, 0)
            } else {
                (u64_of(r, "top_k").unwrap_or(0), u64_of(r, "dense_layers").unwrap_or(0).min(layers))
            };
            let moe_layers = if experts == 0 { 0 } else { layers - dense_layers };
            let expert = 3 * d * u64_of(r, "expert_d_ff").unwrap_or(ff);
            let shared = 3 * d * u64_of(r, "shared_expert_d_ff").unwrap_or(0);
            // The embedding and the LM head are two matrices (2 x vocab x d).
            let common = 2 * vocab * d
                + layers * (attn + 2 * d)
                + d
                + (layers - moe_layers) * 3 * d * ff
                + moe_layers * (shared + experts * d);
            let params = common + moe_layers * experts * expert;
            let active_params = common + moe_layers * top_k * expert;
            decoder_spec(r, "transformer", params, hd).map(|m| ModelSpec {
                name: if experts == 0 { m.name } else { format!("{} MoE top-{top_k} of {experts}", m.name) },
                active_params,
                dense_layers,
                experts,
                top_k,
                tied_embeddings: Some(false),
                ..m
            })
        }
        // A Hugging Face directory: the sizes `miles check` read from its config.json, the
        // parameters counted there (biases, q/k norms and tied embeddings included).
        "hf" => {
            let (arch, tied) = match r.get("config") {
                Some(Value::Map(m)) => (
                    m.get("architecture").and_then(|v| v.as_str()).unwrap_or("hf").to_string(),
                    m.get("tie_embeddings").and_then(Value::as_bool),
                ),
                _ => ("hf".into(), None),
            };
            decoder_spec(r, &arch, u64_of(r, "params")?, u64_of(r, "head_dim")?)
                .map(|m| ModelSpec { tied_embeddings: tied, ..m })
        }
        _ => None,
    }
}

/// A dense decoder's plan input from the fields `transformer` and `hf` share (layers, d_model,
/// heads, kv_heads, vocab, max_len), named `<name> <layers>x<d_model>`.
fn decoder_spec(r: &Record, name: &str, params: u64, head_dim: u64) -> Option<ModelSpec> {
    let (layers, d, heads, kv) =
        (u64_of(r, "layers")?, u64_of(r, "d_model")?, u64_of(r, "heads")?.max(1), u64_of(r, "kv_heads")?);
    Some(ModelSpec {
        name: format!("{name} {layers}x{d}"),
        params,
        active_params: params,
        layers,
        dense_layers: 0,
        hidden_size: d,
        heads,
        kv_heads: kv,
        head_dim,
        vocab: u64_of(r, "vocab")?,
        experts: 0,
        top_k: 0,
        max_context: u64_of(r, "max_len")?,
        attention: if kv == heads { Attention::Mha } else { Attention::Gqa },
        kv_lora_rank: None,
        qk_rope_head_dim: None,
        sparse_topk: None,
        index_head_dim: None,
        update_requantize_s: None,
        intermediate_size: u64_of(r, "d_ff"),
        tied_embeddings: None,
    })
}

fn precision_of(s: &str) -> Precision {
    match s {
        "fp32" => Precision::Fp32,
        "fp16" => Precision::Fp16,
        "fp8_blockwise" => Precision::Fp8Blockwise,
        "mxfp8" => Precision::Mxfp8,
        "nvfp4" => Precision::Nvfp4,
        _ => Precision::Bf16,
    }
}

/// Prompt and response lengths of a rollout (tokens).
fn lengths(g: &StageGraph, node: &StageNode) -> (Spanned<u64>, Spanned<u64>) {
    let node = if node.param("max_new_tokens").is_some() { node } else { upstream_rollout(g, node).unwrap_or(node) };
    let get = |name: &str| {
        node.param(name)
            .and_then(Value::as_q)
            .and_then(q_to_u64)
            .map(|v| spanned(v, param_span(node, name)))
            .unwrap_or(Spanned::new(0))
    };
    (get("max_prompt_tokens"), get("max_new_tokens"))
}

fn upstream_rollout<'g>(g: &'g StageGraph, node: &StageNode) -> Option<&'g StageNode> {
    node.inputs.values().find_map(|v| match v {
        Value::Stage(n) => g.node(n).filter(|up| up.output == Some(miles_compiler::value::PortKind::Trajectories)),
        _ => None,
    })
}

fn engine_of(r: &Record, prompt_len: Spanned<u64>, response_len: Spanned<u64>) -> Engine {
    let int = |name: &str, default: u64| int_of(r, name).map(|(v, s)| spanned(v, s)).unwrap_or(Spanned::new(default));
    let precision =
        enum_of(r, "precision").map(|(p, s)| spanned(precision_of(p), s)).unwrap_or(Spanned::new(Precision::Fp32));
    Engine {
        engines: None,
        tp: int("tp", 1),
        dp: Spanned::new(1),
        ep: int("ep", 1),
        precision,
        embedded: r.schema_name == "embedded_engine",
        kv_precision: None,
        mem_fraction: f64_of(r, "mem_fraction")
            .map(|v| spanned(v, field_span(r, "mem_fraction")))
            .unwrap_or(Spanned::new(0.85)),
        max_concurrent: int_of(r, "max_concurrent").map(|(v, s)| spanned(v, s)),
        // A planning assumption the recipe states on its engine (std/prelude `sglang`).
        prefix_cache_hit: f64_of(r, "prefix_cache_hit").map(|v| spanned(v, field_span(r, "prefix_cache_hit"))),
        prompt_len,
        response_len,
    }
}

fn trainer_of(
    g: &StageGraph,
    node: &StageNode,
    b: &Record,
    seq_len: Spanned<u64>,
    offload: Option<(&str, Option<Span>)>,
) -> Trainer {
    // `opd = opd { teacher = <a teacher_logprobs stage> }`: that stage's model, read like the
    // policy (`model_spec`), and where it runs; on GPUs of its own it is planned apart.
    let teacher = teacher_stage_of(g, node).filter(|t| t.param("gpus").is_none_or(|v| *v == Value::None));
    let int = |name: &str| int_of(b, name).map(|(v, s)| spanned(v, s)).unwrap_or(Spanned::new(1));
    let backend = match b.schema_name.as_str() {
        "megatron" => Backend::Megatron,
        "fsdp" => Backend::Fsdp,
        _ => Backend::Embedded,
    };
    let precision =
        enum_of(b, "precision").map(|(p, s)| spanned(precision_of(p), s)).unwrap_or(Spanned::new(Precision::Fp32));
    let recompute = match enum_of(b, "recompute") {
        Some(("full", s)) => spanned(Recompute::Full, s),
        Some(("selective", s)) => spanned(Recompute::Selective, s),
        Some((_, s)) => spanned(Recompute::Off, s),
        None => Spanned::new(Recompute::Off),
    };
    let optimizer_offload = match offload {
        Some(("cpu", s)) => spanned(OptimizerOffload::Cpu, s),
        Some(("stream_from_disk", s)) => spanned(OptimizerOffload::StreamFromDisk, s),
        Some((_, s)) => spanned(OptimizerOffload::OnGpu, s),
        None => Spanned::new(OptimizerOffload::OnGpu),
    };
    // The embedded trainer has no micro-batch of its own: the stage's `micro_batch` (or the
    // SFT `batch`) is what it holds in memory at once.
    let micro_batch = if backend == Backend::Embedded {
        param_int(node, "micro_batch").or_else(|| param_int(node, "batch")).unwrap_or(Spanned::new(1))
    } else {
        int("micro_batch")
    };
    Trainer {
        backend: Spanned::new(backend),
        tp: int("tp"),
        pp: int("pp"),
        cp: int("cp"),
        ep: int("ep"),
        dp: int_of(b, "dp").map(|(v, s)| spanned(v, s)),
        precision,
        micro_batch,
        seq_len,
        recompute,
        optimizer_offload,
        lora: rec(node, "lora").map(|r| lora_of(r, param_span(node, "lora"))),
        teacher: teacher.and_then(|t| t.model.as_deref()).and_then(model_spec),
        teacher_process: teacher.and_then(|t| t.param("process")).and_then(Value::as_bool).unwrap_or(false),
    }
}

/// The `teacher_logprobs` stage a trainer's `opd` reads.
fn teacher_stage_of<'g>(g: &'g StageGraph, train: &StageNode) -> Option<&'g StageNode> {
    match rec(train, "opd").and_then(|o| o.get("teacher")) {
        Some(Value::Stage(n)) => g.node(n),
        _ => None,
    }
}

/// `lora { rank, adapters, target_modules }`; a module named twice is counted once.
fn lora_of(r: &Record, span: Option<Span>) -> Lora {
    let int = |name: &str| int_of(r, name).map(|(v, s)| spanned(v, s)).unwrap_or(Spanned::new(1));
    let mut target_modules = match r.get("target_modules") {
        Some(Value::List(items)) => items.iter().filter_map(|v| v.as_enum().and_then(LoraTarget::from_name)).collect(),
        _ => default_lora_targets(),
    };
    target_modules.sort();
    target_modules.dedup();
    // `dropout: Float in 0..1` (std/prelude); clamped so a value the checker let through cannot
    // turn into negative or runaway memory.
    let dropout = f64_of(r, "dropout").filter(|d| d.is_finite()).map_or(0.0, |d| d.clamp(0.0, 1.0));
    Lora { rank: int("rank"), adapters: int("adapters"), target_modules, dropout, span }
}

fn sync_of(node: &StageNode) -> WeightSync {
    let name_of = |port: &str| match node.inputs.get(port) {
        Some(Value::Stage(n)) => n.clone(),
        _ => String::new(),
    };
    let transport = match node.param("transport").and_then(Value::as_enum) {
        Some("p2p") => Transport::P2p,
        Some("disk_delta") => Transport::DiskDelta,
        Some("local") => Transport::Local,
        _ => Transport::Broadcast,
    };
    let channel = match node.param("channel").and_then(Value::as_enum) {
        Some("tcp") => WeightChannel::Tcp,
        Some("shm") => WeightChannel::Shm,
        Some("nccl") => WeightChannel::Nccl,
        _ => WeightChannel::Auto,
    };
    let bucket = node.param("bucket").and_then(Value::as_q).and_then(q_to_u64).unwrap_or(512_000_000);
    WeightSync {
        name: node.name.clone(),
        from: name_of("train"),
        to: name_of("rollout"),
        transport: spanned(transport, param_span(node, "transport")),
        channel,
        bucket: spanned(bucket, param_span(node, "bucket")),
        span: Some(node.name_span),
    }
}

fn schedule_of(v: &Value, span: Span, defaulted: bool) -> Schedule {
    let Some(r) = v.as_record() else { return Schedule::default() };
    let mode = match r.schema_name.as_str() {
        "fully_async" => ScheduleMode::FullyAsync,
        "one_step_off" => ScheduleMode::OneStepOff,
        _ => ScheduleMode::Sync,
    };
    let int = |name: &str| int_of(r, name).map(|(v, s)| spanned(v, s));
    Schedule {
        mode: spanned(mode, (!defaulted).then_some(span)),
        max_staleness: int("max_staleness"),
        buffer_capacity: int("buffer_capacity"),
        max_concurrent: if mode == ScheduleMode::FullyAsync { int("max_concurrent") } else { None },
    }
}

fn graph_of(g: &StageGraph) -> Graph {
    let roles: HashMap<&str, Role> =
        g.nodes().map(|n| (n.name.as_str(), if n.kind == "weights" { Role::Other } else { role_of(n) })).collect();
    Graph {
        nodes: g
            .nodes()
            .map(|n| GraphNode { id: n.name.clone(), label: n.kind.clone(), role: roles[n.name.as_str()] })
            .collect(),
        edges: g
            .edges()
            .into_iter()
            .map(|(a, b, c)| GraphEdge {
                from: a.to_string(),
                to: b.to_string(),
                label: format!("{:?}", c.kind),
                weights: c.kind == ChannelKind::Weights,
            })
            .collect(),
    }
}
