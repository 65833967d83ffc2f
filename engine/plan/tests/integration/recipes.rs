//! Plans of recipes as a new user writes them (issue #17): each test compiles a small recipe
//! through the compiler and `plan_input`, so the stdlib checks and the planner are tested
//! together.

use super::trainers::*;
use miles_compiler::fs::FileSystem;
use miles_compiler::{compile, Compilation, Options};
use miles_plan::*;

/// One file, `r.miles`; everything else comes from the embedded stdlib.
pub(super) struct One(String);
impl FileSystem for One {
    fn read(&self, path: &str) -> Result<Vec<u8>, String> {
        if path == "r.miles" {
            Ok(self.0.clone().into_bytes())
        } else {
            Err(format!("{path}: not found"))
        }
    }
}

pub(super) fn compiled(src: &str) -> Compilation {
    compile(&One(src.to_string()), &["r.miles".to_string()], &Options::default())
}

pub(super) fn planned(src: &str) -> Plan {
    let c = compiled(src);
    assert!(!c.has_errors(), "{:#?}", c.diagnostics);
    plan(&plan_input(&c.recipes[0]))
}

pub(super) fn check_messages(src: &str) -> Vec<String> {
    compiled(src).diagnostics.iter().filter(|d| d.is_error()).map(|d| d.message.clone()).collect()
}

pub(super) fn codes(p: &Plan) -> Vec<&'static str> {
    p.diagnostics.iter().map(|d| d.code.as_str()).collect()
}

/// The Miles repository's Qwen3-4B GRPO script on one node of 8 H100, colocated, FSDP.
pub(super) fn qwen3_4b(rollout_batch: u64, engine: &str, backend: &str) -> String {
    format!(
        r#"
import std/hardware {{ h100 }}
import std/models {{ qwen3_4b }}
import std/tasks/arith
cluster node = h100 * 8
recipe r on node {{
    rollout = generate(qwen3_4b) {{
        prompts = arith.addition {{}}
        samples_per_prompt = 8
        max_new_tokens = 8192.tokens
        max_prompt_tokens = 1024.tokens
        engine = {engine}
    }}
    reward = exact_match(rollout)
    train = grpo(rollout, reward) {{
        rollout_batch = {rollout_batch}
        global_batch = {global}
        micro_batch = 1
        {backend}
    }}
    sync = weights(train -> rollout) {{ transport = local }}
    placement = colocated
}}
"#,
        global = rollout_batch * 8
    )
}

pub(super) const ENGINE: &str = "sglang { tp = 1, max_concurrent = 128 }";
pub(super) const FSDP: &str = "backend = fsdp { gpus = 8 }";

/// 256 samples over 8 engines are 32 per engine, not the 44 the KV cache could hold nor the 128
/// the engine allows; so E0407 does not fire on a correct recipe.
#[test]
pub(super) fn decode_batch_is_the_samples_an_engine_has() {
    let p = planned(&qwen3_4b(32, ENGINE, FSDP));
    let r = &p.rollouts[0];
    assert_eq!((r.engines, r.decode_batch), (8, 32));
    assert!(r.sequences_per_engine > 32, "{}", r.sequences_per_engine);
    assert!(!codes(&p).contains(&"E0407"), "{:?}", codes(&p));
    let p4 = planned(&qwen3_4b(4, ENGINE, FSDP));
    assert_eq!(p4.rollouts[0].decode_batch, 4);
    let t = |p: &Plan| p.rollouts[0].rollout_time.as_ref().map(|e| e.seconds).unwrap_or(0.0);
    // Fewer sequences per decode step: each step is no slower, and 8x fewer samples finish sooner.
    assert!(t(&p4) < t(&p), "{} vs {}", t(&p4), t(&p));
}

/// Colocated memory is added up per GPU; when both actors do not fit, the plan prices the
/// eviction of the idle one and counts it in the step.
#[test]
pub(super) fn colocated_memory_is_summed_and_eviction_priced() {
    let p = planned(&qwen3_4b(32, ENGINE, FSDP));
    let c = p.colocation.as_ref().expect("colocation report");
    let total = |s: &str| p.memory.iter().find(|m| m.stage == s).map_or(0, |m| m.total);
    assert_eq!(c.resident_bytes, total("rollout") + total("train"));
    assert!(!c.fits_resident && c.resident_bytes > c.usable_bytes);
    let st = p.step.as_ref().expect("step");
    assert!(st.switch_s > 0.0 && (st.switch_s - (c.offload_s + c.reload_s)).abs() < 1e-9);
    let sum = st.rollout_s + st.train_s + st.offload_s + st.sync_s + st.switch_s;
    assert!((st.sync_step_s - sum).abs() < 1e-9);
    assert!(c.share_of_step.is_some_and(|s| s > 0.0 && s < 1.0));
    assert!(render_text(&p).contains("Colocated placement"));

    // A small engine budget leaves room for both: nothing to evict, nothing charged.
    let p = planned(&qwen3_4b(32, "sglang { tp = 1, mem_fraction = 0.3 }", FSDP));
    let c = p.colocation.as_ref().expect("colocation report");
    // 24 GB of engine + 44 GB of FSDP rank (activations of a 9k-token sample) < 73.6 GB usable.
    assert!(c.fits_resident && c.resident_bytes <= c.usable_bytes, "{}", render_text(&p));
    assert_eq!(p.step.as_ref().map(|s| s.switch_s), Some(0.0));
}

/// An engine's TP is checked against the model's heads like the trainer's.
#[test]
pub(super) fn engine_tp_must_divide_heads() {
    let msgs = check_messages(&qwen3_4b(32, "sglang { tp = 3 }", FSDP));
    assert!(msgs.iter().any(|m| m == "the engine's tp = 3 does not divide the model's 32 attention heads"), "{msgs:?}");
    // 32 heads, 8 KV heads: TP16 divides the heads, and is a multiple of the KV heads.
    let msgs = check_messages(&qwen3_4b(32, "sglang { tp = 16 }", FSDP));
    assert!(!msgs.iter().any(|m| m.contains("engine's tp")), "{msgs:?}");
}

/// A TP that does not divide the node, planned anyway (the planner never trusts its input):
/// the GPUs no engine fits on are named (colocated: the trainer still uses them; alone: idle),
/// and no warning claims that TP traffic leaves a single node.
#[test]
pub(super) fn uneven_engine_tp_on_one_node() {
    let c = compiled(&qwen3_4b(32, ENGINE, FSDP));
    let mut input = plan_input(&c.recipes[0]);
    input.stages[0].engine.as_mut().expect("engine").tp.value = 3;
    let p = plan(&input);
    assert!(!codes(&p).contains(&"E0406"), "{}", render_text(&p));
    assert!(p.stages[0].layout.contains("2 engines x TP3 (2 GPUs unused)"), "{}", p.stages[0].layout);
    assert_eq!(p.summary.idle_gpus, 0, "the trainer uses all 8: {}", render_text(&p));
    // The map and the summary say which GPUs the engines leave to the trainer alone.
    let map: Vec<(u64, u64, Vec<String>)> = p.gpu_map.iter().map(|s| (s.first, s.last, s.stages.clone())).collect();
    let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(map, [(0, 5, names(&["rollout", "train"])), (6, 7, names(&["train"]))], "{}", render_text(&p));
    assert!(render_text(&p).contains("on 8 GPUs (6 rollout+train, 2 train)"), "{}", render_text(&p));

    input.placement.mode.value = PlacementMode::Disaggregated;
    input.stages.retain(|s| s.role != Role::Train);
    input.syncs.clear();
    let p = plan(&input);
    assert!(!codes(&p).contains(&"E0406"), "{}", render_text(&p));
    assert_eq!(p.summary.idle_gpus, 2, "{}", render_text(&p));
    // Counted once: 6 rollout GPUs and 2 idle make the cluster's 8.
    let text = render_text(&p);
    assert!(
        text.contains("on 8 GPUs (6 rollout, 2 idle)") && text.contains("GPUs 6-7         node 0         (idle)"),
        "{text}"
    );
}

/// E0401's fixes name only fields the backend has and GPU counts the cluster holds, recomputation
/// first.
#[test]
pub(super) fn e0401_fixes_fit_the_backend_and_the_cluster() {
    let src = qwen3_4b(32, ENGINE, FSDP).replace("qwen3_4b", "qwen3_30b_a3b");
    let p = planned(&src);
    let e = p.diagnostics.iter().find(|d| d.code == "E0401").expect("30B on 8 GPUs with FSDP does not fit");
    let help = e.help.as_deref().unwrap_or("");
    // FSDP's activation checkpointing is what its users reach for first (#38).
    assert!(help.starts_with("fixes: `recompute = full`: activations "), "{help}");
    assert!(!help.contains("16 GPUs") && !help.contains("GPUs for this stage"), "8-GPU cluster: {help}");
    assert!(help.contains("stream_from_disk"), "{help}");
}

/// On a GPU cluster a trainer without a GPU backend is refused by a check that says why.
#[test]
pub(super) fn gpu_cluster_needs_a_gpu_backend() {
    let msgs = check_messages(&qwen3_4b(32, ENGINE, ""));
    assert!(msgs.iter().any(|m| m.contains("on a GPU cluster the trainer needs a GPU backend")), "{msgs:?}");
}

/// A trainer kind declared in the recipe's modules, defaulting to the embedded CPU trainer, on an
/// H100 cluster: no stdlib check sees it, and the plan refuses it (E0409, with the fix) instead of
/// planning 199 GB of fp32 state onto the GPUs; the trainer gets no GPUs and no memory row.
#[test]
pub(super) fn embedded_trainer_on_a_gpu_cluster_is_not_planned_onto_the_gpus() {
    let src = qwen3_4b(32, ENGINE, "").replace("train = grpo(rollout, reward)", "train = my_train(rollout, reward)")
        + "\nstage my_train(rollout: Trajectories, reward: Scores) -> Policy {\n    backend: Backend = embedded_trainer\n    rollout_batch: Int = 32\n    global_batch: Int = 256\n    micro_batch: Int = 1\n}\n";
    let p = planned(&src);
    let e = p.diagnostics.iter().find(|d| d.code == "E0409").expect("E0409");
    assert!(e.is_error() && e.message.contains("embedded trainer runs on the host CPU"), "{}", e.message);
    assert!(e.help.as_deref().is_some_and(|h| h.contains("backend = fsdp")), "{:?}", e.help);
    let train = p.stages.iter().find(|s| s.name == "train").expect("train");
    assert_eq!((train.symbol.as_str(), train.placed, train.gpus), ("!", Where::Host, 0));
    assert!(p.memory.iter().all(|m| m.stage != "train"), "{}", render_text(&p));
    assert!(!codes(&p).contains(&"E0401"), "{}", render_text(&p));
    // The engines keep the GPUs; nothing is colocated with a trainer that is not there.
    assert_eq!(p.rollouts[0].engines, 8);
    assert!(p.colocation.is_none());
}

/// A stage kind the planner does not know, running a model, is a warning naming it.
#[test]
pub(super) fn unknown_stage_kind_with_a_model_warns() {
    let src = qwen3_4b(32, ENGINE, FSDP).replace(
        "    reward = exact_match(rollout)",
        "    reward = exact_match(rollout)\n    judge = my_teacher(rollout)",
    ) + "\nstage my_teacher(rollout: Trajectories) -> Scores {}\n";
    let p = planned(&src);
    let w = p.diagnostics.iter().find(|d| d.code == "E0410").expect("E0410");
    assert!(!w.is_error() && w.message.contains("my_teacher") && w.message.contains("judge"), "{}", w.message);
}

/// A teacher held in a field of a user-declared kind: the warning names the teacher's model,
/// even when no port leads to a model (a kind reading only scores) or one leads to the policy.
#[test]
pub(super) fn unknown_stage_kind_with_a_teacher_field_warns_naming_the_teacher() {
    for (ports, arg) in [("scores: Scores", "reward"), ("rollout: Trajectories", "rollout")] {
        let src = qwen3_4b(32, ENGINE, FSDP)
            .replace("import std/models { qwen3_4b }", "import std/models { qwen3_4b, qwen3_30b_a3b }")
            .replace(
                "    reward = exact_match(rollout)",
                &format!("    reward = exact_match(rollout)\n    judge = teacher_score({arg})"),
            )
            + &format!("\nstage teacher_score({ports}) -> Scores {{\n    teacher: Model = qwen3_30b_a3b\n}}\n");
        let p = planned(&src);
        let w =
            p.diagnostics.iter().find(|d| d.code == "E0410").unwrap_or_else(|| panic!("{ports}: {}", render_text(&p)));
        assert!(!w.is_error(), "{ports}");
        assert!(w.message.contains("`teacher_score` runs Qwen3-30B-A3B"), "{ports}: {}", w.message);
        let judge = p.stages.iter().find(|s| s.name == "judge").expect("judge");
        assert_eq!(judge.model.as_deref(), Some("Qwen3-30B-A3B"));
    }
}

/// A rate is not under a key named `seconds`.
#[test]
pub(super) fn json_rate_is_per_second() {
    let p = planned(&qwen3_4b(32, ENGINE, FSDP));
    let v: serde_json::Value = serde_json::from_str(&render_json(&p)).expect("json");
    let rate = &v["rollouts"][0]["tokens_per_s"];
    assert!(rate["per_s"].as_f64().is_some_and(|x| x > 0.0) && rate.get("seconds").is_none(), "{rate}");
}

/// Qwen3-30B-A3B on one 8-GPU H100 node per side: the update takes seconds, and broadcast beats
/// P2P there (Miles §4.2), through the whole path from recipe to plan.
#[test]
pub(super) fn one_node_per_side_broadcast_takes_seconds_and_wins() {
    let src = r#"
import std/hardware { h100 }
import std/models { qwen3_30b_a3b }
import std/tasks/arith
cluster fleet = h100 * 16
recipe r on fleet {
    rollout = generate(qwen3_30b_a3b) {
        prompts = arith.addition {}
        max_new_tokens = 4096.tokens
        engine = sglang { gpus = 8, tp = 1 }
    }
    reward = exact_match(rollout)
    train = grpo(rollout, reward) {
        backend = megatron { gpus = 8, tp = 1, ep = 8, recompute = full }
        optimizer = adam { state = cpu }
    }
    sync = weights(train -> rollout) { transport = broadcast, bucket = 1.GB }
}
"#;
    let p = planned(src);
    let s = &p.syncs[0];
    let p2p = s.alternatives.iter().find(|a| a.transport == Transport::P2p).expect("p2p alternative").seconds;
    assert!(s.estimate.seconds < 5.0, "broadcast {:.1} s", s.estimate.seconds);
    assert!(s.estimate.seconds < p2p, "broadcast {:.1} s, p2p {p2p:.1} s", s.estimate.seconds);
}

/// Plan diagnostics in JSON can carry the caller's located form (path, line, column) in place
/// of the planner's byte spans; the rest of the plan is unchanged.
#[test]
pub(super) fn json_diagnostics_can_be_located() {
    let p = planned(
        &qwen3_4b(32, "sglang { tp = 1, max_concurrent = 128 }", FSDP)
            .replace("rollout_batch = 32", "rollout_batch = 64")
            .replace("global_batch = 256", "global_batch = 512"),
    );
    assert!(!p.diagnostics.is_empty(), "{}", render_text(&p));
    let located = serde_json::json!([{ "code": p.diagnostics[0].code, "location": { "file": "r.miles", "line": 14, "column": 64 } }]);
    let v: serde_json::Value = serde_json::from_str(&render_json_located(&p, located.clone())).expect("json");
    assert_eq!(v["diagnostics"], located);
    let plain: serde_json::Value = serde_json::from_str(&render_json(&p)).expect("json");
    assert_eq!(v["rollouts"], plain["rollouts"]);
    assert_eq!(v["format_version"], plain["format_version"]);
}

/// A small MoE `transformer`: a dense first layer, then two MoE layers of 8 experts (top-2) and a
/// shared expert; R3 recorded in u16 ids, or in the smallest type (u8) by default.
pub(super) fn moe_recipe(generate: &str) -> String {
    format!(
        r#"
import std/tasks/arith
model policy = transformer {{
    layers = 3, d_model = 64, heads = 4, vocab = arith.vocab
    experts = 8, top_k = 2, expert_d_ff = 64, shared_expert_d_ff = 128, dense_layers = 1
}}
recipe r {{
    rollout = generate(policy) {{ prompts = arith.addition {{}}, max_new_tokens = 4.tokens, {generate} }}
    reward  = exact_match(rollout)
    train   = grpo(rollout, reward) {{ rollout_batch = 32, global_batch = 256 }}
    sync    = weights(train -> rollout) {{ transport = local }}
    runs_on = cluster
}}
"#
    )
}

#[test]
pub(super) fn moe_transformer_counts_total_and_active_params_and_r3_bytes() {
    let c = compiled(&moe_recipe("routing_replay = true, routing_dtype = u16"));
    assert!(!c.has_errors(), "{:#?}", c.diagnostics);
    let input = plan_input(&c.recipes[0]);
    let m = input.stages[0].model.as_ref().expect("model");
    // attention 4 x 64 x 64 = 16,384 per layer, norms 128, q/k norms 2 x 16 (an MoE's `qk_norm`
    // default); embedding + head 2 x 16 x 64; final norm 64; the dense layer's MLP 3 x 64 x 256;
    // per MoE layer a shared expert 3 x 64 x 128 and a router 8 x 64: 151,072 besides the routed
    // experts, of 3 x 64 x 64 = 12,288 each.
    assert_eq!((m.experts, m.top_k, m.dense_layers), (8, 2, 1));
    assert_eq!(m.params, 151_072 + 2 * 8 * 12_288);
    assert_eq!(m.active_params, 151_072 + 2 * 2 * 12_288);
    assert!(input.r3.value && input.r3_id_bytes == Some(2));
    let p = plan(&input);
    let b = p.buffer.as_ref().expect("buffer");
    // The model's 64 tokens (max_len's default; max_prompt_tokens defaults to what max_new_tokens
    // leaves of it), all but the last recorded: 63 x 2 MoE layers x top-2 x 2 B.
    assert_eq!((b.r3_bytes_per_token, b.r3_bytes_per_trajectory), (Some(8), Some(63 * 8)));
    assert!(render_text(&p).contains("(R3 0.5 kB per trajectory, 8 B per token)"), "{}", render_text(&p));

    // Recorded without replay, in the smallest type: 8 experts fit a u8.
    let p = planned(&moe_recipe("record_routing = true"));
    assert_eq!(p.buffer.as_ref().and_then(|b| b.r3_bytes_per_token), Some(4));
    // Neither: no R3 data.
    let p = planned(&moe_recipe("top_p = 1.0"));
    assert_eq!(p.buffer.as_ref().and_then(|b| b.r3_bytes_per_trajectory), None);
}

#[test]
pub(super) fn moe_transformer_active_params_grow_only_by_the_routers() {
    // The same model with 8 or 64 experts (top-2): more total parameters, the same active ones
    // but the routers' (the embedded CPU step time's matmul FLOPs are 2 x the active ones).
    let params = |experts: u64| {
        let src = moe_recipe("top_p = 1.0").replace("experts = 8", &format!("experts = {experts}"));
        let c = compiled(&src);
        assert!(!c.has_errors(), "{:#?}", c.diagnostics);
        let input = plan_input(&c.recipes[0]);
        let m = input.stages[0].model.clone().expect("model");
        (m.params, m.active_params)
    };
    let (p8, a8) = params(8);
    let (p64, a64) = params(64);
    assert!(p64 > p8);
    assert_eq!(a64 - a8, 2 * 56 * 64, "only the routers grow");
}

#[test]
pub(super) fn a_bf16_embedded_engine_holds_half_an_fp32_copy() {
    let copies = |engine: &str| {
        // On the embedded target a shared expert is refused (the final model could not be
        // exported in transformers' format): this one has none.
        let src = moe_recipe(&format!("engine = embedded_engine {{ precision = {engine} }}"))
            .replace("    runs_on = cluster\n", "")
            .replace(", shared_expert_d_ff = 128", "");
        let p = planned(&src);
        let t = p.memory.iter().find(|m| m.stage == "train").expect("train memory");
        let item = t.items.iter().find(|i| i.name == "weight_copies").expect("weight copies").clone();
        let weights = t.items.iter().find(|i| i.name == "weights").expect("weights").bytes;
        (item, weights)
    };
    let (fp32, w) = copies("fp32");
    let (bf16, _) = copies("bf16");
    assert_eq!(fp32.bytes, w);
    assert_eq!(bf16.bytes, w / 2);
    assert_eq!(fp32.note, "1 x fp32: rollout engine");
    assert_eq!(bf16.note, "1 copies: rollout engine (bf16)");
}

/// The laptop recipe's shape (its policy, the reverse task, 32 x 8 samples) with more `models`
/// lines and `train` as the trainer stage.
pub(super) fn laptop_recipe(models: &str, train: &str) -> String {
    format!(
        r#"
import std/tasks/strings
model policy = transformer {{ layers = 2, d_model = 64, heads = 4, kv_heads = 2, d_ff = 192, vocab = strings.vocab, max_len = 20 }}
{models}cluster laptop = local {{ cpus = 2 }}
recipe r on laptop {{
    rollout = generate(policy) {{
        prompts = strings.reverse {{ min_len = 3, max_len = 6 }}
        samples_per_prompt = 8
        max_prompt_tokens = 8.tokens
        max_new_tokens = 8.tokens
    }}
    reward = exact_match(rollout)
    train = {train}
    sync = weights(train -> rollout) {{ transport = local }}
}}
"#
    )
}

/// The diffusion laptop recipe (docs/plan.md, "Diffusion RL"): one embedded process, itemised,
/// and a step time per phase instead of every stage on the host with nothing planned.
pub(super) const DIFFUSION: &str = r#"
model policy = denoiser { side = 16, conditions = 8, hidden = 256, layers = 2 }
cluster laptop = local { cpus = 2 }
recipe diffusion_laptop on laptop {
    pretrain = denoise_pretrain(policy) { steps = 3000.steps, lr = 2e-3, batch = 64 }
    rollout = denoise(pretrain) { steps = 20, eta = 1.0, guidance = 3.0, samples_per_condition = 8, micro_group = 8 }
    reward = image_reward(rollout) { analytic = brightness, analytic_weight = 1.0, extra_cost = 15.ms }
    train = diffusion_grpo(rollout, reward) { conditions_per_step = 4, lr = 3e-4, train_steps = 10, kl_coef = 0.01 }
    sync = weights(train -> rollout) { transport = local }
    eval = image_eval(rollout) { every = 25.steps, samples = 32 }
    seed = 1
    stop = 100.steps
}
"#;

#[test]
pub(super) fn diffusion_recipe_plans_its_one_process() {
    let p = planned(DIFFUSION);
    assert!(codes(&p).is_empty(), "{:?}", p.diagnostics);
    let d = p.diffusion.as_ref().expect("a diffusion report");
    // The record's params (the stdlib's count), and the batch arithmetic.
    assert_eq!(d.params, 464_384);
    let b = &d.batch;
    assert_eq!((b.images_per_step, b.micro_groups_per_step, b.trained_steps, b.forwards_per_step), (32, 4, 10, 2));
    // extra_cost 15 ms reaches the reward, the streamed rollout is the one used.
    assert!(d.reward_micro_group_s >= 0.015 && d.streaming);
    assert_eq!(p.step.as_ref().map(|s| s.rollout_s), Some(d.streamed_s));
    // One memory row on the host, which `miles report` sums against the peak RSS.
    assert_eq!(p.memory.len(), 1);
    assert_eq!(Some(p.memory[0].device.as_str()), p.cluster.host.as_deref());
    let weights = p.memory[0].items.iter().find(|i| i.name == "weights").map(|i| i.bytes);
    assert_eq!(weights, Some(4 * 464_384));
    // The fields `miles report` reads, and the run's metric names under `diffusion.step`.
    let json: serde_json::Value = serde_json::from_str(&render_json(&p)).unwrap();
    for ptr in ["/step/rollout_s", "/step/train_s", "/step/sync_s", "/step/step/seconds", "/memory/0/total"] {
        assert!(json.pointer(ptr).and_then(|v| v.as_f64()).is_some(), "{ptr}");
    }
    for k in ["rollout_s", "denoise_s", "reward_wait_s", "train_s", "step_s"] {
        assert!(json.pointer(&format!("/diffusion/step/{k}")).and_then(|v| v.as_f64()).is_some(), "{k}");
    }
    assert!(render_html(&p).contains("streamed (d + (n - 1) max(d, r) + r)"));
    insta::assert_snapshot!("diffusion_laptop.txt", render_text(&p));
}

/// A Qwen3-4B student on 16 H100, disaggregated: engines on 4 GPUs, FSDP on 8, and its Qwen3-30B-A3B
/// teacher stage on `teacher_gpus` of its own (or, without, beside the trainer).
pub(super) fn teacher_on_gpus(teacher_gpus: &str, schedule: &str) -> String {
    format!(
        r#"
import std/hardware {{ h100 }}
import std/models {{ qwen3_4b, qwen3_30b_a3b }}
import std/tasks/arith
cluster two = h100 * 16
recipe r on two {{
    rollout = generate(qwen3_4b) {{
        prompts = arith.addition {{}}
        samples_per_prompt = 8
        max_new_tokens = 4096.tokens
        max_prompt_tokens = 1024.tokens
        engine = sglang {{ gpus = 4, tp = 1 }}
    }}
    reward = exact_match(rollout)
    teacher = teacher_logprobs(qwen3_30b_a3b, rollout) {{ {teacher_gpus} }}
    train = grpo(rollout, reward) {{
        rollout_batch = 32
        global_batch = 256
        micro_batch = 1
        backend = fsdp {{ gpus = 8 }}
        opd = opd {{ teacher = teacher }}
    }}
    sync = weights(train -> rollout) {{ transport = broadcast }}
    placement = disaggregated
    schedule = {schedule}
}}
"#
    )
}

/// The teacher stage on GPUs of its own: placed on its 4 GPUs, its weights sharded over them (TP4,
/// bf16), its forward over the batch priced on its pool and added to a synchronous step (a third
/// phase beside generation and training under fully_async); the trainer carries none of it. On the
/// trainer's GPUs instead, the trainer's ranks hold it and its forward is a part of train.
#[test]
pub(super) fn opd_teacher_on_gpus_of_its_own() {
    let (own, input) = planned_any_target(&teacher_on_gpus("gpus = 4", "sync"));
    let st = own.stages.iter().find(|s| s.name == "teacher").expect("teacher stage");
    assert_eq!((st.gpus, st.placed, st.layout.as_str()), (4, Where::Own, "teacher TP4"), "{st:?}");
    let t = input.stages.iter().find(|s| s.name == "teacher").and_then(|s| s.model.clone()).expect("teacher model");
    let mem = memory_of(&own, "teacher");
    let w = mem.items.iter().find(|i| i.name == "teacher_weights").expect("weights").bytes;
    assert_eq!(w, t.params * 2 / 4, "bf16 over TP4");
    assert!(mem.items.iter().any(|i| i.name == "teacher_activations" && i.bytes > 0));
    assert!(train_items(&own).iter().all(|(n, _)| !n.starts_with("teacher")));
    let s = own.step.as_ref().expect("step");
    assert!(s.teacher_stage_s > 0.0 && s.teacher_s == 0.0, "{s:?}");
    assert!(
        (s.sync_step_s - (s.rollout_s + s.teacher_stage_s + s.train_s + s.offload_s + s.sync_s + s.switch_s)).abs()
            < 1e-9
    );
    assert_eq!(s.step.seconds, s.sync_step_s);
    let text = render_text(&own);
    assert!(text.contains("teacher TP4") && text.contains("the teacher stage on its own GPUs"), "{text}");
    assert!(render_json(&own).contains("teacher_stage_s") && render_html(&own).contains("teacher "));

    // Under fully_async the teacher's pool works beside generation and training.
    let (asy, _) = planned_any_target(&teacher_on_gpus("gpus = 4", "fully_async"));
    let a = asy.step.as_ref().expect("step");
    let want = a.rollout_s.max(a.train_s + a.offload_s).max(a.teacher_stage_s) + a.sync_s;
    assert!((a.step.seconds - want).abs() < 1e-9, "{a:?}");

    // Beside the trainer: on its ranks, in its step; no pool of its own.
    let (beside, _) = planned_any_target(&teacher_on_gpus("", "sync"));
    assert!(item(&beside, "teacher_weights") > 0);
    let b = beside.step.as_ref().expect("step");
    assert!(b.teacher_s > 0.0 && b.teacher_stage_s == 0.0);
    assert!(beside.memory.iter().all(|m| m.stage != "teacher"));
}

/// A recipe's expected lengths (docs/plan.md, "Expected lengths"): a planning assumption for
/// time only. Each `(generate field, value)` is inserted into `src`'s rollout stage.
pub(super) fn with_means(src: &str, generate: &str, env: &str) -> String {
    let src =
        src.replacen("        samples_per_prompt = 8\n", &format!("        samples_per_prompt = 8\n{generate}"), 1);
    src.replacen("env = calculator {}", &format!("env = calculator {{}}\n{env}"), 1)
}

pub(super) fn memory_totals(p: &Plan) -> Vec<(String, u64)> {
    p.memory.iter().map(|m| (m.stage.clone(), m.total)).collect()
}

pub(super) fn names_a_mean(e: &Estimate, field: &str) -> bool {
    e.assumptions.iter().any(|a| a.contains(field))
}

#[test]
pub(super) fn expected_lengths_lower_cpu_time_not_memory() {
    let src = laptop_recipe("", "grpo(rollout, reward) { rollout_batch = 32, global_batch = 256, micro_batch = 256 }");
    let bound = planned(&src);
    let means = "        mean_response_tokens = 3.tokens\n        mean_prompt_tokens = 5.tokens\n";
    let short = planned(&with_means(&src, means, ""));
    assert!(codes(&short).is_empty(), "{:?}", short.diagnostics);
    let (b, s) = (bound.step.as_ref().expect("step"), short.step.as_ref().expect("step"));
    // Time falls: fewer prefill tokens and decode steps, shorter trained sequences ...
    assert!(s.rollout_s < 0.8 * b.rollout_s, "{} vs {}", s.rollout_s, b.rollout_s);
    assert!(s.train_s < 0.8 * b.train_s, "{} vs {}", s.train_s, b.train_s);
    // ... and each term that used a mean names it.
    assert!(names_a_mean(&s.train_step, "mean_response_tokens"), "{:?}", s.train_step.assumptions);
    assert!(s.step.assumptions.iter().any(|a| a.starts_with("rollout: ") && a.contains("mean_prompt_tokens")));
    assert!(!names_a_mean(&b.train_step, "mean_"), "{:?}", b.train_step.assumptions);
    // Memory stays at the bounds: every row, and the buffer.
    assert_eq!(memory_totals(&short), memory_totals(&bound));
    assert_eq!(short.buffer, bound.buffer);
    let l = short.lengths.as_ref().expect("lengths");
    assert_eq!((l.prompt_tokens, l.max_prompt_tokens, l.response_tokens, l.max_response_tokens), (5.0, 8.0, 3.0, 8.0));
    assert_eq!((l.sequence_tokens, l.max_sequence_tokens), (Some(8.0), Some(16)));
    assert!(render_text(&short).contains("lengths   prompt 5 of 8 tokens (mean_prompt_tokens), response 3 of 8 tokens"));
    let l = bound.lengths.as_ref().expect("lengths");
    assert!(!l.prompt_stated && !l.response_stated && l.sequence_tokens == Some(16.0));
    // A mean at the bound plans as no mean at all, but for the note naming it.
    let at_bound = planned(&with_means(&src, "        mean_response_tokens = 8.tokens\n", ""));
    let a = at_bound.step.as_ref().expect("step");
    assert!((a.rollout_s - b.rollout_s).abs() < 1e-12 && (a.train_s - b.train_s).abs() < 1e-12);
}

#[test]
pub(super) fn mean_turns_play_fewer_later_turns_at_the_same_memory() {
    let src = r#"
import std/tasks/arith
model policy = transformer { layers = 2, d_model = 64, heads = 4, kv_heads = 2, d_ff = 192, vocab = 64, max_len = 64 }
cluster laptop = local { cpus = 2 }
recipe r on laptop {
    warmup = sft(policy) { data = arith.multiplication { digits = 2 }, steps = 10.steps }
    rollout = generate(warmup) {
        prompts = arith.multiplication { digits = 2 }
        samples_per_prompt = 8
        max_prompt_tokens = 8.tokens
        max_new_tokens = 28.tokens
        session = tito { rule = linear }
    }
    reward = env_reward(rollout) { env = calculator {}, max_turns = 3 }
    train = grpo(rollout, reward) { rollout_batch = 16, global_batch = 128, micro_batch = 128 }
    sync = weights(train -> rollout) { transport = local }
}
"#;
    let bound = planned(src);
    let short = planned(&with_means(src, "", "        mean_turns = 1.5"));
    let (b, s) = (bound.step.as_ref().expect("step"), short.step.as_ref().expect("step"));
    assert!(s.rollout_s < 0.9 * b.rollout_s && s.train_s < b.train_s, "{s:?} vs {b:?}");
    assert!(names_a_mean(&s.train_step, "mean_turns"), "{:?}", s.train_step.assumptions);
    assert_eq!(memory_totals(&short), memory_totals(&bound));
    assert_eq!(short.episodes, bound.episodes);
    // Two turns fit the 64-token context: 8 + 28 + 21 + 28 > 64. Trained: 8 + 1.5 x 28 + 0.5 x 21.
    let l = short.lengths.as_ref().expect("lengths");
    assert_eq!((l.turns, l.max_turns, l.turns_stated), (Some(1.5), Some(2.0), true));
    assert_eq!(l.sequence_tokens, Some(8.0 + 1.5 * 28.0 + 0.5 * 21.0));
    // Expected turns above those that fit are taken at the bound.
    let over = planned(&with_means(src, "", "        mean_turns = 3"));
    assert_eq!(over.lengths.as_ref().and_then(|l| l.turns), Some(2.0));
}

#[test]
pub(super) fn expected_lengths_on_gpus_price_throughput_and_training_not_the_kv_cache() {
    let src = qwen3_4b(32, ENGINE, FSDP);
    let means = "        mean_response_tokens = 2048.tokens\n        mean_prompt_tokens = 256.tokens\n";
    let (bound, short) = (planned(&src), planned(&with_means(&src, means, "")));
    let (b, s) = (bound.step.as_ref().expect("step"), short.step.as_ref().expect("step"));
    // The trainer's tokens fall ~4x; memory and the KV cache's sequences do not move.
    assert!(s.train_s < 0.35 * b.train_s, "{} vs {}", s.train_s, b.train_s);
    assert_eq!(memory_totals(&short), memory_totals(&bound));
    let (rb, rs) = (&bound.rollouts[0], &short.rollouts[0]);
    assert_eq!((rs.sequences_per_engine, rs.kv_bytes_per_gpu), (rb.sequences_per_engine, rb.kv_bytes_per_gpu));
    // Under sync one wave still waits for its slowest sample (the bound): the rollout is no
    // longer, and names the means.
    let (tb, ts) = (rb.rollout_time.as_ref().expect("time"), rs.rollout_time.as_ref().expect("time"));
    assert!(ts.seconds <= tb.seconds && names_a_mean(ts, "mean_response_tokens"), "{ts:?}");
    // fully_async refills a slot per sample: throughput alone, so the mean shortens it.
    let split = qwen3_4b(32, "sglang { gpus = 4, tp = 1, max_concurrent = 128 }", "backend = fsdp { gpus = 4 }")
        .replace("transport = local", "transport = broadcast")
        .replace("    placement = colocated\n", "    schedule = fully_async { max_concurrent = 256 }\n");
    let (ab, as_) = (planned(&split), planned(&with_means(&split, means, "")));
    let t = |p: &Plan| p.rollouts[0].rollout_time.as_ref().map_or(0.0, |e| e.seconds);
    assert!(t(&as_) < 0.5 * t(&ab), "{} vs {}", t(&as_), t(&ab));
}

#[test]
pub(super) fn expected_lengths_must_lie_within_their_bounds() {
    let src = laptop_recipe("", "grpo(rollout, reward) { rollout_batch = 32, global_batch = 256 }");
    let msgs = check_messages(&with_means(&src, "        mean_response_tokens = 9.tokens\n", ""));
    assert!(msgs.iter().any(|m| m.contains("expected response length must be between")), "{msgs:?}");
    let msgs = check_messages(&with_means(&src, "        mean_prompt_tokens = 0.tokens\n", ""));
    assert!(msgs.iter().any(|m| m.contains("expected prompt length must be between")), "{msgs:?}");
}

/// The embedded trainer's `precision = bf16` is its GEMMs': its weights, gradients and Adam
/// state stay fp32, a bf16 copy of the weights is added (the GEMMs' operands, kept for
/// backward), and the step's matmuls are priced at the bf16 rate.
#[test]
pub(super) fn a_bf16_embedded_trainer_keeps_fp32_state_and_prices_bf16_gemms() {
    let fp32_src = include_str!("../../../../recipes/compare-trl-10m.miles");
    let bf16_src = fp32_src.replace(
        "optimizer = adam { beta2 = 0.999, weight_decay = 0.0 }",
        "optimizer = adam { beta2 = 0.999, weight_decay = 0.0 }\n        backend = embedded_trainer { precision = bf16 }",
    );
    assert_ne!(fp32_src, bf16_src, "recipes/compare-trl-10m.miles changed: update this test");
    let (fp32, bf16) = (planned(fp32_src), planned(&bf16_src));
    for name in ["weights", "gradients", "optimizer", "activations"] {
        assert_eq!(item(&bf16, name), item(&fp32, name), "{name}");
    }
    assert_eq!(item(&fp32, "gemm_casts"), 0);
    // 10,634,112 parameters x 2 B.
    assert_eq!(item(&bf16, "gemm_casts"), item(&fp32, "weights") / 2);
    assert_eq!(item(&bf16, "gemm_casts"), 2 * 10_634_112);
    assert_eq!(memory_of(&bf16, "train").total, memory_of(&fp32, "train").total + item(&bf16, "gemm_casts"));
    let (s32, s16) = (fp32.step.as_ref().expect("step"), bf16.step.as_ref().expect("step"));
    assert!(s16.train_s < 0.7 * s32.train_s, "bf16 GEMMs at 4x the fp32 rate: {} vs {}", s16.train_s, s32.train_s);
    let notes = |p: &Plan| serde_json::to_value(p).unwrap()["step"]["train_step"]["assumptions"].to_string();
    assert!(notes(&bf16).contains("bf16 matmuls at 256 GFLOP/s"), "{}", notes(&bf16));
    assert!(notes(&fp32).contains(": matmuls at 64 GFLOP/s"), "{}", notes(&fp32));

    // As recipes/compare-trl-10m-bf16.miles, sampling in bf16 too: on a CPU without bf16
    // instructions both are E0411 warnings, each at its `precision`.
    let both = bf16_src.replace(
        "temperature        = 1.0",
        "temperature = 1.0\n        engine = embedded_engine { precision = bf16 }",
    );
    assert_ne!(both, bf16_src);
    let c = compiled(&both);
    assert!(!c.has_errors(), "{:#?}", c.diagnostics);
    let mut input = plan_input(&c.recipes[0]);
    let d = input.device.as_mut().expect("a local cluster's device");
    // `device = auto` on a machine without a GPU resolves to the CPU.
    d.machine = Some(miles_plan::input::MachineGpus { gpus: Vec::new(), unavailable: Some("no driver".into()) });
    d.cpu_bf16 = Some(false);
    let p = plan(&input);
    let w: Vec<_> = p.diagnostics.iter().filter(|d| d.code == "E0411").collect();
    let names: Vec<_> = w.iter().map(|d| d.message.split(':').next().unwrap_or("")).collect();
    assert_eq!(names, ["rollout", "train"], "{w:#?}");
    assert!(w.iter().all(|d| d.primary.is_some()), "each at its field: {w:#?}");
    input.device.as_mut().unwrap().cpu_bf16 = Some(true);
    assert!(plan(&input).diagnostics.iter().all(|d| d.code != "E0411"));
}
