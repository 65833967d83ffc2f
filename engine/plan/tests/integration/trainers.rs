//! The trained state in a plan, through the recipe as a new user writes it: LoRA adapters
//! (one and several, their dropout and sync bytes), PPO's critic on GPUs and on the embedded
//! host, and an OPD teacher beside the trainer. Split from `recipes.rs`, whose helpers it uses.

use super::recipes::*;
use miles_plan::*;

/// Qwen3-30B-A3B GRPO on 8 + 8 H100 (Megatron TP2 EP8) with `lora`; `LORA` and `ENGINE` vary.
pub(super) fn qwen3_30b_lora(lora: &str, engine: &str) -> String {
    format!(
        r#"
import std/hardware {{ h100 }}
import std/models {{ qwen3_30b_a3b }}
import std/tasks/arith
cluster fleet = h100 * 16
recipe r on fleet {{
    rollout = generate(qwen3_30b_a3b) {{
        prompts = arith.addition {{}}
        samples_per_prompt = 8
        max_new_tokens = 4096.tokens
        engine = {engine}
    }}
    reward = exact_match(rollout)
    train = grpo(rollout, reward) {{
        rollout_batch = 32
        global_batch = 256
        backend = megatron {{ gpus = 8, tp = 2, ep = 8 }}
        {lora}
    }}
    sync = weights(train -> rollout) {{ transport = broadcast }}
}}
"#
    )
}

pub(super) fn train_items(p: &Plan) -> Vec<(String, u64)> {
    let m = p.memory.iter().find(|m| m.stage == "train").expect("train memory");
    m.items.iter().map(|i| (i.name.clone(), i.bytes)).collect()
}

pub(super) fn item(p: &Plan, name: &str) -> u64 {
    train_items(p).into_iter().find(|(n, _)| n == name).map_or(0, |(_, b)| b)
}

/// Multi-LoRA: two adapters hold twice the adapter weights, gradients and Adam state, and a
/// weight update moves both; the frozen base and the activations are the same.
#[test]
pub(super) fn two_adapters_double_adapter_state_and_sync_not_the_base() {
    const E: &str = "sglang { gpus = 8, tp = 2 }";
    let one = planned(&qwen3_30b_lora("lora = lora { rank = 16 }", E));
    let two = planned(&qwen3_30b_lora("lora = lora { rank = 16, adapters = 2 }", E));
    for name in ["weights", "activations"] {
        assert_eq!(item(&two, name), item(&one, name), "{name}");
    }
    for name in ["adapters", "gradients", "optimizer"] {
        let (a, b) = (item(&one, name), item(&two, name));
        assert!(a > 0 && b.abs_diff(2 * a) <= 1, "{name}: {a} then {b}");
    }
    assert_eq!(two.syncs[0].bytes, 2 * one.syncs[0].bytes);
    let r = |p: &Plan| p.memory.iter().find_map(|m| m.lora.clone()).expect("lora report");
    assert_eq!((r(&two).params, r(&two).params_per_adapter), (2 * r(&one).params, r(&one).params));
    assert!(render_text(&two).contains("2 adapters x q,k,v,o rank 16 x 48 layers: 26.7M params (13.4M each)"));
}

/// A LoRA update moves the adapters, unquantised: an FP8 engine receives its FP8 base only
/// once, so the update is the adapters' BF16 bytes, not the model's FP8 bytes; without LoRA the
/// same sync moves the whole model in the engine's format.
#[test]
pub(super) fn lora_sync_moves_adapter_bytes_in_the_trainer_precision() {
    const FP8: &str = "sglang { gpus = 8, tp = 2, precision = fp8_blockwise }";
    let lora = planned(&qwen3_30b_lora("lora = lora { rank = 16 }", FP8));
    let full = planned(&qwen3_30b_lora("", FP8));
    let params = lora.memory.iter().find_map(|m| m.lora.as_ref()).expect("lora report").params;
    assert_eq!(params, 13_369_344);
    assert_eq!(lora.syncs[0].bytes, params * 2);
    assert!(lora.syncs[0].lora && !full.syncs[0].lora);
    assert!(full.syncs[0].bytes > 30_000_000_000, "{}", full.syncs[0].bytes);
    assert!(lora.syncs[0].estimate.seconds < full.syncs[0].estimate.seconds / 10.0);
    let text = render_text(&lora);
    assert!(text.contains("26.7 MB of adapters train -> rollout"), "{text}");
    let v: serde_json::Value = serde_json::from_str(&render_json(&lora)).expect("json");
    assert_eq!(v["syncs"][0]["bytes"], params * 2);
    assert_eq!(v["memory"][1]["lora"]["sync_bytes"], params * 2);
}

/// Without LoRA the same recipe has no adapter item, its gradients and optimizer state are the
/// whole model's, and it does not fit; with LoRA on the MLP too (every routed expert wrapped),
/// the adapters are most of the trained state and still fit.
#[test]
pub(super) fn memory_items_with_and_without_lora_on_one_model() {
    const E: &str = "sglang { gpus = 8, tp = 2 }";
    let full = planned(&qwen3_30b_lora("", E));
    let names: Vec<String> = train_items(&full).into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["weights", "gradients", "optimizer", "activations"]);
    assert!(codes(&full).contains(&"E0401"), "{}", render_text(&full));
    let all = planned(&qwen3_30b_lora(
        "lora = lora { rank = 16, target_modules = [q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj] }",
        E,
    ));
    let names: Vec<String> = train_items(&all).into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["weights", "adapters", "gradients", "optimizer", "activations"]);
    assert!(!codes(&all).contains(&"E0401"), "{}", render_text(&all));
    let r = all.memory.iter().find_map(|m| m.lora.clone()).expect("lora report");
    let experts: Vec<&str> = r.targets.iter().filter(|t| t.on_experts).map(|t| t.module.as_str()).collect();
    assert_eq!(experts, ["gate_proj", "up_proj", "down_proj"]);
    // 48 MoE layers x 128 experts each wrapped.
    assert!(r.targets.iter().filter(|t| t.on_experts).all(|t| t.wrapped_layers == 48 * 128));
    assert_eq!(item(&all, "weights"), item(&full, "weights"));
    assert!(item(&all, "gradients") < item(&full, "gradients") / 10);
}

/// `lora { dropout = ... }` (PEFT's `lora_dropout`) keeps the dropped copy of each wrapped
/// layer's input for the backward pass: its own memory item, in the total, absent at dropout 0.
#[test]
pub(super) fn lora_dropout_keeps_the_wrapped_inputs() {
    const E: &str = "sglang { gpus = 8, tp = 2 }";
    let plain = planned(&qwen3_30b_lora("lora = lora { rank = 16 }", E));
    let zero = planned(&qwen3_30b_lora("lora = lora { rank = 16, dropout = 0.0 }", E));
    let drop = planned(&qwen3_30b_lora("lora = lora { rank = 16, dropout = 0.05 }", E));
    assert_eq!(zero, plain);
    assert!(train_items(&plain).iter().all(|(n, _)| n != "lora_dropout"));
    // Per layer q, k, v read h = 2048, o reads 32 x 128 = 4096: 10,240 x 4608 tokens / TP2,
    // x 48 layers x 1 micro-batch in flight (PP1), bf16.
    let expected = 4608 * 10_240 / 2 * 48 * 2;
    assert_eq!(item(&drop, "lora_dropout"), expected);
    for name in ["weights", "adapters", "gradients", "optimizer", "activations"] {
        assert_eq!(item(&drop, name), item(&plain, name), "{name}");
    }
    let total = |p: &Plan| p.memory.iter().find(|m| m.stage == "train").expect("train").total;
    assert!(total(&drop).abs_diff(total(&plain) + expected) <= 1);
    let text = render_text(&drop);
    assert!(
        text.contains("lora_dropout        2.3 GB  dropout 0.05: kept dropped input of each wrapped layer"),
        "{text}"
    );
    let v: serde_json::Value = serde_json::from_str(&render_json(&drop)).expect("json");
    assert_eq!(v["memory"][1]["items"][5]["name"], "lora_dropout");
    assert_eq!(v["memory"][1]["items"][5]["bytes"], expected);
    assert!(render_html(&drop).contains("lora_dropout 2.3 GB"));
    // A full fine-tune has no adapters, so no dropout item: `without LoRA` is unchanged.
    let full = |p: &Plan| p.memory.iter().find_map(|m| m.lora.clone()).expect("lora").full_finetune;
    assert_eq!(full(&drop), full(&plain));
}

pub(super) const CRITIC: [&str; 4] = ["critic_weights", "critic_gradients", "critic_optimizer", "critic_activations"];

pub(super) fn memory_of<'p>(p: &'p Plan, stage: &str) -> &'p MemoryReport {
    p.memory.iter().find(|m| m.stage == stage).expect("memory report")
}

/// PPO (std/stages `ppo`) trains a learned critic beside the policy: a second Qwen3-4B with a
/// value head, FSDP-sharded like the policy over DP8, fully trained. Its weights, gradients,
/// Adam state and value-loss activations are lines of their own in text, JSON and HTML, in the
/// total, and its values and value loss in the step time; GRPO of the same recipe has none.
#[test]
pub(super) fn ppo_sizes_a_critic_grpo_does_not() {
    let grpo = planned(&qwen3_4b(32, ENGINE, FSDP));
    let ppo = planned(&qwen3_4b(32, ENGINE, FSDP).replace("grpo(", "ppo("));
    let names = |p: &Plan| train_items(p).into_iter().map(|(n, _)| n).collect::<Vec<_>>();
    assert_eq!(names(&grpo), ["weights", "gradients", "optimizer", "activations"]);
    assert_eq!(
        names(&ppo),
        ["weights", "gradients", "optimizer", "activations"].into_iter().chain(CRITIC).collect::<Vec<_>>()
    );
    // The policy's own lines do not change.
    for name in ["weights", "gradients", "optimizer", "activations"] {
        assert_eq!(item(&ppo, name), item(&grpo, name), "{name}");
    }
    // std/models' Qwen3-4B does not say whether its embeddings are tied, so the LM head is
    // counted (an upper bound): 4.02e9 + the value head's 2560 params. FSDP over 8, bf16:
    // weights P/8 x 2 B + two gathered layers 2 x P/36 x 2 B; FP32 gradients P/8 x 4 B; Adam
    // P/8 x 12 B.
    let p = 4_020_002_560.0_f64;
    let want = [p / 8.0 * 2.0 + 2.0 * p / 36.0 * 2.0, p / 8.0 * 4.0, p / 8.0 * 12.0];
    for (name, want) in CRITIC.iter().zip(want) {
        assert!((item(&ppo, name) as f64 - want).abs() <= 1.0, "{name}: {} vs {want}", item(&ppo, name));
    }
    // Activations: the policy's without the FP32 logits, 9216 tokens x 151,936 x 4 B (TP1).
    let logits = 9216 * 151_936 * 4;
    assert!(item(&ppo, "critic_activations").abs_diff(item(&ppo, "activations") - logits) <= 1);
    // The total adds the critic's state; its activations come after the policy's are freed, so
    // the peak holds the larger set (here the policy's).
    let extra: u64 = CRITIC.iter().filter(|n| **n != "critic_activations").map(|n| item(&ppo, n)).sum();
    assert!(memory_of(&ppo, "train").total.abs_diff(memory_of(&grpo, "train").total + extra) <= 4);

    // Step time: the policy's plus the critic's 2 x (values) + 6 x (value loss) critic params
    // per token, with the same attention term: nearly the policy's 8 x params again.
    let (sg, sp) = (grpo.step.as_ref().expect("step"), ppo.step.as_ref().expect("step"));
    assert_eq!(sg.critic_s, 0.0);
    assert!((sp.train_s - sg.train_s - sp.critic_s).abs() < 1e-9, "{} {} {}", sp.train_s, sg.train_s, sp.critic_s);
    let ratio = sp.critic_s / sg.train_s;
    assert!((ratio - 1.0).abs() < 1e-5, "critic / policy time {ratio}");

    let text = render_text(&ppo);
    assert!(text.contains("critic_weights        1.5 GB  4.02B params: policy, embedding tying unknown"), "{text}");
    assert!(text.contains("critic_activations   28.9 GB  value loss: seq 9216 / CP1"), "{text}");
    assert!(text.contains("    critic    40.1 s  (in train: values + value loss of the PPO critic)"), "{text}");
    let g = render_text(&grpo);
    assert!(!g.contains("critic"), "{g}");
    let v: serde_json::Value = serde_json::from_str(&render_json(&ppo)).expect("json");
    let items = v["memory"][1]["items"].as_array().expect("items");
    assert_eq!(items[4]["name"], "critic_weights");
    assert_eq!(items[7]["name"], "critic_activations");
    assert!(v["step"]["critic_s"].as_f64().is_some_and(|s| s > 0.0));
    let why = v["step"]["train_step"]["assumptions"].as_array().expect("assumptions");
    assert!(
        why.iter().any(|a| a
            .as_str()
            .is_some_and(|a| a.starts_with("critic: ") && a.contains("2 x 4.02B params (values) + 6 x"))),
        "{why:?}"
    );
    let vg: serde_json::Value = serde_json::from_str(&render_json(&grpo)).expect("json");
    assert!(vg["step"].get("critic_s").is_none() && !render_json(&grpo).contains("critic"));
    assert!(render_html(&ppo).contains("critic_optimizer 6.0 GB") && !render_html(&grpo).contains("critic"));
}

/// On the embedded CPU backend the critic is the policy's decoder (untied: its LM head is
/// dropped) with the activations of the embedded formula less its vocabulary-wide tensors; with
/// `lora` on the policy the critic still trains in full.
#[test]
pub(super) fn embedded_ppo_critic() {
    let src = |kind: &str, lora: &str| {
        laptop_recipe(
            "",
            &format!("{kind}(rollout, reward) {{ rollout_batch = 32, global_batch = 256, micro_batch = 256 {lora} }}"),
        )
    };
    // `miles run` may not execute `ppo` on the embedded target yet (E0511); the plan is made anyway.
    let plan_of = |src: &str| {
        let c = compiled(src);
        let errors: Vec<_> = c.diagnostics.iter().filter(|d| d.is_error() && d.code != "E0511").collect();
        assert!(errors.is_empty(), "{errors:#?}");
        let input = plan_input(&c.recipes[0]);
        (plan(&input), input)
    };
    let (grpo, _) = plan_of(&src("grpo", ""));
    let (ppo, input) = plan_of(&src("ppo", ""));
    assert!(train_items(&grpo).iter().all(|(n, _)| !n.starts_with("critic")));
    let m = input.stages.iter().find(|s| s.name == "train").and_then(|s| s.model.clone()).expect("model");
    assert_eq!(m.tied_embeddings, Some(false));
    // FP32 on the host: 4 B weights, 4 B gradients, 8 B of Adam moments per critic parameter.
    let pc = (m.params - m.vocab * m.hidden_size + m.hidden_size) as f64;
    assert_eq!(item(&ppo, "critic_weights"), (pc * 4.0) as u64);
    assert_eq!(item(&ppo, "critic_gradients"), (pc * 4.0) as u64);
    assert_eq!(item(&ppo, "critic_optimizer"), (pc * 8.0) as u64);
    // 256 x 16 tokens; the policy's head keeps 3 vocab-wide FP32 tensors per token, the critic's none.
    let scale = input.assumptions.embedded_autograd_scale;
    let head = scale * (256.0 * 16.0) * 3.0 * m.vocab as f64 * 4.0;
    let (a, c) = (item(&ppo, "activations") as f64, item(&ppo, "critic_activations") as f64);
    assert!((a - c - head).abs() <= 2.0, "{a} - {c} vs {head}");
    // The embedded process's other weight copies are the policy's, not the critic's.
    assert_eq!(item(&ppo, "weight_copies"), item(&grpo, "weight_copies"));
    let text = render_text(&ppo);
    assert!(text.contains("no vocab-wide tensors") && text.contains(&format!("LM head {} x 64 dropped", m.vocab)));

    // LoRA on the policy: the critic is the same full fine-tune.
    let (lora, _) = plan_of(&src("ppo", ", lora = lora { rank = 8 }"));
    for name in CRITIC {
        assert_eq!(item(&lora, name), item(&ppo, name), "{name}");
    }
    assert!(render_text(&lora).contains("FP32 accumulation buffer, trained in full (LoRA is the policy's)"));
}

pub(super) const TEACHER: [&str; 2] = ["teacher_weights", "teacher_activations"];

/// Compiles and plans, letting through only E0511 (what `miles run` does not execute on the
/// recipe's target) and std/stages' refusal of a seeded `transformer` teacher: the planner plans
/// a teacher of any shape, so these tests can size one by hand.
pub(super) fn planned_any_target(src: &str) -> (Plan, PlanInput) {
    let c = compiled(src);
    let seeded_teacher =
        |d: &&miles_grammar::diag::Diagnostic| d.message.starts_with("a teacher must be trained weights");
    let errors: Vec<_> =
        c.diagnostics.iter().filter(|d| d.is_error() && d.code != "E0511" && !seeded_teacher(d)).collect();
    assert!(errors.is_empty(), "{errors:#?}");
    let input = plan_input(&c.recipes[0]);
    (plan(&input), input)
}

/// On-policy distillation on the embedded CPU backend: the teacher (a larger decoder of the
/// student's vocabulary) is loaded whole in FP32 into the trainer's process and runs one no-grad
/// forward per micro-batch. Its weights and activations are lines of their own; the activations
/// peak apart from the policy's (max, not sum), so the total grows by the teacher's weights; its
/// forward is a part of the step time. The same recipe without `opd` has none of it.
#[test]
pub(super) fn opd_teacher_on_the_embedded_host() {
    let src = |opd: &str, stage: &str| {
        laptop_recipe(
            "model big = transformer { layers = 3, d_model = 96, heads = 4, kv_heads = 4, d_ff = 256, vocab = strings.vocab, max_len = 20 }\n",
            &format!("grpo(rollout, reward) {{ rollout_batch = 32, global_batch = 256, micro_batch = 64 {opd} }}{stage}"),
        )
    };
    let (plain, _) = planned_any_target(&src("", ""));
    let teacher = "\n    teacher = teacher_logprobs(big, rollout)";
    let (opd, input) = planned_any_target(&src(", opd = opd { teacher = teacher, coef = 0.5 }", teacher));
    let trainer = input.stages.iter().find(|s| s.name == "train").and_then(|s| s.trainer.clone()).expect("trainer");
    let t = trainer.teacher.expect("teacher read from opd");
    // strings.vocab: 16 tokens.
    assert_eq!((t.name.as_str(), t.layers, t.hidden_size, t.vocab), ("transformer 3x96", 3, 96, 16));
    // transformer params: 2 x vocab x d + layers x (attention 4 d^2 + 3 d f + 2 d) + d.
    let want = 2 * 16 * 96 + 3 * (4 * 96 * 96 + 3 * 96 * 256 + 2 * 96) + 96;
    assert_eq!(t.params, want);
    // FP32, whole: 4 B per parameter.
    assert_eq!(item(&opd, "teacher_weights"), t.params * 4);
    // One layer at a time: seq 16 x micro-batch 64 = 1024 tokens x (layer 6d + 5q + 4kv + 4f + 2 H S
    // = 576 + 480 + 384 + 1024 + 128, + 3d + 2 vocab) + concatenated weights (3 x 96 x 96 + 2 x 256 x 96).
    let per_token = (576 + 480 + 384 + 1024 + 128 + 288 + 2 * 16) as f64;
    let concat = (3 * 96 * 96 + 2 * 256 * 96) as f64;
    assert_eq!(item(&opd, "teacher_activations"), ((1024.0 * per_token + concat) * 4.0) as u64);
    // Everything else is the plain recipe's.
    for (name, bytes) in train_items(&plain) {
        assert_eq!(item(&opd, &name), bytes, "{name}");
    }
    assert!(item(&opd, "teacher_activations") < item(&opd, "activations"));
    assert_eq!(memory_of(&opd, "train").total, memory_of(&plain, "train").total + item(&opd, "teacher_weights"));
    assert!(train_items(&plain).iter().all(|(n, _)| !n.starts_with("teacher")));
    // Step time: the teacher's forward is added to the trainer's; the rest is unchanged.
    let (sp, so) = (plain.step.as_ref().expect("step"), opd.step.as_ref().expect("step"));
    assert_eq!(sp.teacher_s, 0.0);
    assert!(so.teacher_s > 0.0);
    assert!((so.train_s - sp.train_s - so.teacher_s).abs() < 1e-12, "{} {} {}", so.train_s, sp.train_s, so.teacher_s);
    let text = render_text(&opd);
    assert!(text.contains("teacher_weights"), "{text}");
    assert!(text.contains("OPD teacher transformer 3x96") && text.contains("fp32 x 4 B, whole"), "{text}");
    assert!(text.contains("no-grad forward, fp32: one layer + logits and log-softmax of seq 16 x micro-batch 64"));
    assert!(text.contains("    teacher ") && text.contains("(of train: the teacher stage's no-grad forward"), "{text}");
    assert!(!render_text(&plain).contains("teacher"));
    let v: serde_json::Value = serde_json::from_str(&render_json(&opd)).expect("json");
    assert!(v["step"]["teacher_s"].as_f64().is_some_and(|s| s > 0.0));
    assert!(!render_json(&plain).contains("teacher"));
    assert!(render_html(&opd).contains("teacher_weights") && !render_html(&plain).contains("teacher"));

    // The teacher stage in a worker process of its own: its memory is that process's (named,
    // with its size), not the trainer's; its forward still comes before the trainer's passes.
    let (apart, _) = planned_any_target(&src(
        ", opd = opd { teacher = teacher, coef = 0.5 }",
        &format!("{teacher} {{ process = true }}"),
    ));
    for (name, bytes) in train_items(&plain) {
        assert_eq!(item(&apart, &name), bytes, "{name}");
    }
    assert_eq!(memory_of(&apart, "train").total, memory_of(&plain, "train").total);
    let text = render_text(&apart);
    // The in-process teacher's two items, as that process's.
    let (w, a) = (item(&opd, "teacher_weights") as f64 / 1e6, item(&opd, "teacher_activations") as f64 / 1e6);
    let want = format!(
        "in a worker process of its own (process = true): {w:.1} MB of weights + {a:.1} MB of activations there"
    );
    assert!(text.contains(&want), "{want}\n{text}");
    assert_eq!(apart.step.as_ref().expect("step").teacher_s, so.teacher_s);
}

/// On a GPU backend the teacher's weights are sharded like the policy's (FSDP over 8 here, in the
/// trainer's bf16) and its forward is priced like the policy's old log-probs: 2 x active
/// parameters per token plus the forward's causal attention. A Qwen3-4B teacher of a Qwen3-4B
/// student holds exactly the policy's weight bytes.
#[test]
pub(super) fn opd_teacher_on_fsdp_is_sharded_like_the_policy() {
    let plain = planned_any_target(&qwen3_4b(32, ENGINE, FSDP)).0;
    // The backend text goes inside the trainer's braces: close them and open the teacher stage's.
    let with = qwen3_4b(
        32,
        ENGINE,
        &format!("{FSDP}\n        opd = opd {{ teacher = teacher }}\n    }}\n    teacher = teacher_logprobs(qwen3_4b, rollout) {{"),
    );
    let (opd, input) = planned_any_target(&with);
    assert_eq!(item(&opd, "teacher_weights"), item(&opd, "weights"));
    let names: Vec<String> = train_items(&opd).into_iter().map(|(n, _)| n).collect();
    assert_eq!(names.iter().filter(|n| TEACHER.contains(&n.as_str())).count(), 2, "{names:?}");
    // No-grad: one layer (34 s b h) and the FP32 logits and log-softmax (2 x 4 s b vocab), TP1 CP1.
    let m = input.stages.iter().find(|s| s.name == "train").and_then(|s| s.model.clone()).expect("model");
    let s = 9216.0;
    let want = 34.0 * s * m.hidden_size as f64 + 2.0 * 4.0 * s * m.vocab as f64;
    assert!((item(&opd, "teacher_activations") as f64 - want).abs() <= 1.0);
    // Below the policy's activations, so the total grows by the teacher's weights only.
    assert!(item(&opd, "teacher_activations") < item(&opd, "activations"));
    assert!(
        memory_of(&opd, "train").total.abs_diff(memory_of(&plain, "train").total + item(&opd, "teacher_weights")) <= 2
    );
    // Time: tokens x (2 x active + 2 x layers x seq x heads x head_dim) at the trainer's rate.
    let (sp, so) = (plain.step.as_ref().expect("step"), opd.step.as_ref().expect("step"));
    assert!((so.train_s - sp.train_s - so.teacher_s).abs() < 1e-9);
    let policy = 8.0 * m.active_params as f64 + 6.0 * m.layers as f64 * s * (m.heads * m.head_dim) as f64;
    let teacher = 2.0 * m.active_params as f64 + 2.0 * m.layers as f64 * s * (m.heads * m.head_dim) as f64;
    let ratio = so.teacher_s / sp.train_s;
    assert!((ratio - teacher / policy).abs() < 1e-9, "{ratio} vs {}", teacher / policy);
    assert!(so.train_step.assumptions.iter().any(|a| a.starts_with("teacher: ") && a.contains("no-grad forward")));
    let text = render_text(&opd);
    assert!(text.contains("bf16 x 2 B, sharded like the policy's: frozen, no gradients, no optimizer state"), "{text}");
    assert!(text.contains("no-grad forward: one layer + FP32 logits and log-softmax, seq 9216 / CP1, micro-batch 1"));
}
