//! Plans of recipes as a new user writes them (issue #17): each test compiles a small recipe
//! through the compiler and `plan_input`, so the stdlib checks and the planner are tested
//! together.

use miles_compiler::fs::FileSystem;
use miles_compiler::{compile, Compilation, Options};
use miles_plan::*;

/// One file, `r.miles`; everything else comes from the embedded stdlib.
struct One(String);
impl FileSystem for One {
    fn read(&self, path: &str) -> Result<Vec<u8>, String> {
        if path == "r.miles" {
            Ok(self.0.clone().into_bytes())
        } else {
            Err(format!("{path}: not found"))
        }
    }
}

fn compiled(src: &str) -> Compilation {
    compile(&One(src.to_string()), &["r.miles".to_string()], &Options::default())
}

fn planned(src: &str) -> Plan {
    let c = compiled(src);
    assert!(!c.has_errors(), "{:#?}", c.diagnostics);
    plan(&plan_input(&c.recipes[0]))
}

fn check_messages(src: &str) -> Vec<String> {
    compiled(src).diagnostics.iter().filter(|d| d.is_error()).map(|d| d.message.clone()).collect()
}

fn codes(p: &Plan) -> Vec<&'static str> {
    p.diagnostics.iter().map(|d| d.code).collect()
}

/// The Miles repository's Qwen3-4B GRPO script on one node of 8 H100, colocated, FSDP.
fn qwen3_4b(rollout_batch: u64, engine: &str, backend: &str) -> String {
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

const ENGINE: &str = "sglang { tp = 1, max_concurrent = 128 }";
const FSDP: &str = "backend = fsdp { gpus = 8 }";

/// 256 samples over 8 engines are 32 per engine, not the 44 the KV cache could hold nor the 128
/// the engine allows; so E0407 does not fire on a correct recipe.
#[test]
fn decode_batch_is_the_samples_an_engine_has() {
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
fn colocated_memory_is_summed_and_eviction_priced() {
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
fn engine_tp_must_divide_heads() {
    let msgs = check_messages(&qwen3_4b(32, "sglang { tp = 3 }", FSDP));
    assert!(msgs.iter().any(|m| m.contains("engine's TP must divide the model's attention heads")), "{msgs:?}");
    // 32 heads, 8 KV heads: TP16 divides the heads, and is a multiple of the KV heads.
    let msgs = check_messages(&qwen3_4b(32, "sglang { tp = 16 }", FSDP));
    assert!(!msgs.iter().any(|m| m.contains("engine's TP")), "{msgs:?}");
}

/// A TP that does not divide the node, planned anyway (the planner never trusts its input):
/// the GPUs no engine fits on are named (colocated: the trainer still uses them; alone: idle),
/// and no warning claims that TP traffic leaves a single node.
#[test]
fn uneven_engine_tp_on_one_node() {
    let c = compiled(&qwen3_4b(32, ENGINE, FSDP));
    let mut input = plan_input(&c.recipes[0]);
    input.stages[0].engine.as_mut().expect("engine").tp.value = 3;
    let p = plan(&input);
    assert!(!codes(&p).contains(&"E0406"), "{}", render_text(&p));
    assert!(p.stages[0].layout.contains("2 engines x TP3 (2 GPUs unused)"), "{}", p.stages[0].layout);
    assert_eq!(p.summary.idle_gpus, 0, "the trainer uses all 8: {}", render_text(&p));

    input.placement.mode.value = PlacementMode::Disaggregated;
    input.stages.retain(|s| s.role != Role::Train);
    input.syncs.clear();
    let p = plan(&input);
    assert!(!codes(&p).contains(&"E0406"), "{}", render_text(&p));
    assert_eq!(p.summary.idle_gpus, 2, "{}", render_text(&p));
}

/// E0401's fixes name only fields the backend has and GPU counts the cluster holds.
#[test]
fn e0401_fixes_fit_the_backend_and_the_cluster() {
    let src = qwen3_4b(32, ENGINE, FSDP).replace("qwen3_4b", "qwen3_30b_a3b");
    let p = planned(&src);
    let e = p.diagnostics.iter().find(|d| d.code == "E0401").expect("30B on 8 GPUs with FSDP does not fit");
    let help = e.help.as_deref().unwrap_or("");
    assert!(!help.contains("recompute"), "FSDP has no `recompute`: {help}");
    assert!(!help.contains("16 GPUs") && !help.contains("GPUs for this stage"), "8-GPU cluster: {help}");
    assert!(help.contains("stream_from_disk"), "{help}");
}

/// On a GPU cluster a trainer without a GPU backend is refused by a check that says why.
#[test]
fn gpu_cluster_needs_a_gpu_backend() {
    let msgs = check_messages(&qwen3_4b(32, ENGINE, ""));
    assert!(msgs.iter().any(|m| m.contains("on a GPU cluster the trainer needs a GPU backend")), "{msgs:?}");
}

/// A stage kind the planner does not know, running a model, is a warning naming it.
#[test]
fn unknown_stage_kind_with_a_model_warns() {
    let src = qwen3_4b(32, ENGINE, FSDP).replace(
        "    reward = exact_match(rollout)",
        "    reward = exact_match(rollout)\n    judge = my_teacher(rollout)",
    ) + "\nstage my_teacher(rollout: Trajectories) -> Scores {}\n";
    let p = planned(&src);
    let w = p.diagnostics.iter().find(|d| d.code == "E0410").expect("E0410");
    assert!(!w.is_error() && w.message.contains("my_teacher") && w.message.contains("judge"), "{}", w.message);
}

/// A rate is not under a key named `seconds`.
#[test]
fn json_rate_is_per_second() {
    let p = planned(&qwen3_4b(32, ENGINE, FSDP));
    let v: serde_json::Value = serde_json::from_str(&render_json(&p)).expect("json");
    let rate = &v["rollouts"][0]["tokens_per_s"];
    assert!(rate["per_s"].as_f64().is_some_and(|x| x > 0.0) && rate.get("seconds").is_none(), "{rate}");
}

/// Qwen3-30B-A3B on one 8-GPU H100 node per side: the update takes seconds, and broadcast beats
/// P2P there (Miles §4.2), through the whole path from recipe to plan.
#[test]
fn one_node_per_side_broadcast_takes_seconds_and_wins() {
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
fn json_diagnostics_can_be_located() {
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
