use super::*;
use crate::input::PlanInput;

/// Issue #38's newcomer by hand: Qwen3-8B GRPO on two nodes of 8 H100, four SGLang engines of TP2
/// on node 0, FSDP on node 1, fully_async with 64 samples in flight.
fn newcomer(mode: &str, max_concurrent: Option<u64>, engine_mc: u64) -> PlanInput {
    let model = serde_json::json!({
        "name": "Qwen3-8B", "params": 8_190_000_000u64, "active_params": 8_190_000_000u64,
        "layers": 36, "hidden_size": 4096, "heads": 32, "kv_heads": 8, "head_dim": 128,
        "vocab": 151_936, "max_context": 40_960, "attention": "gqa"
    });
    let mut schedule = serde_json::json!({ "mode": mode, "max_staleness": 2 });
    if let Some(m) = max_concurrent {
        schedule["max_concurrent"] = m.into();
    }
    let v = serde_json::json!({
        "recipe": "newcomer",
        "cluster": { "name": "fleet", "pools": [{ "gpu": {
            "name": "H100-80GB", "arch": "hopper", "hbm": 80_000_000_000u64, "hbm_bandwidth": 3.35e12,
            "bf16": 989e12, "fp8": 1979e12, "scaleup_domain": 8, "scaleup_bandwidth": 450e9,
            "network_bandwidth": 50e9, "gpus_per_node": 8, "host_link_bandwidth": 64e9,
            "host_memory": 2_000_000_000_000u64
        }, "nodes": 2 }] },
        "stages": [
            { "name": "rollout", "kind": "generate", "role": "rollout", "model": model, "gpus": { "count": 8 },
              "engine": { "tp": 2, "precision": "bf16", "prompt_len": 512, "response_len": 4096,
                          "max_concurrent": engine_mc } },
            { "name": "reward", "kind": "exact_match", "role": "reward" },
            { "name": "train", "kind": "grpo", "role": "train", "model": model, "gpus": { "count": 8 },
              "trainer": { "backend": "fsdp", "tp": 1, "precision": "bf16", "micro_batch": 1,
                           "seq_len": 4608, "recompute": "off", "optimizer_offload": "on_gpu" } }
        ],
        "placement": { "mode": "disaggregated" },
        "syncs": [{ "name": "sync", "from": "train", "to": "rollout", "transport": "broadcast", "bucket": 536_870_912u64 }],
        "schedule": schedule,
        "batch": { "rollout_batch": 32, "samples_per_prompt": 8, "global_batch": 256 }
    });
    serde_json::from_value(v).expect("a plan input")
}

#[test]
fn the_schedule_throttle_is_named_and_its_fix_is_a_plan_of_the_changed_value() {
    let input = newcomer("fully_async", Some(64), 1000);
    let p = crate::plan(&input);
    let r = &p.rollouts[0];
    let t = r.throttle.as_ref().expect("a throttled rollout");
    assert_eq!((t.limit.as_str(), t.value, t.engines, t.in_flight_per_engine), ("max_concurrent", 64, 4, 16));
    assert_eq!(t.kv_sequences_per_engine, r.sequences_per_engine);
    let f = t.fix.as_ref().expect("a fix");
    // The figures are those of a plan of the recipe with the value set, not an extrapolation.
    let set = f.settings[0].value;
    assert_eq!(f.settings[0].field, "max_concurrent");
    let mut fixed = input.clone();
    fixed.schedule.max_concurrent = Some(set.into());
    let q = crate::plan(&fixed);
    let qs = q.step.as_ref().unwrap();
    assert_eq!((f.rollout_s_after, f.step_s_after), (qs.rollout_s, qs.step.seconds));
    assert!(f.step_s_after < 0.8 * f.step_s, "{f:?}");
    // The smallest value as good as filling the KV slots: one sequence less per engine is worse.
    assert!(f.in_flight_per_engine <= t.kv_sequences_per_engine);
    let at = |per_engine: u64| {
        let mut i = input.clone();
        i.schedule.max_concurrent = Some((per_engine * 4).into());
        crate::plan(&i).step.unwrap().step.seconds
    };
    let best = at(t.kv_sequences_per_engine);
    assert!(f.step_s_after <= best * (1.0 + AS_GOOD) && at(f.in_flight_per_engine - 1) > best * (1.0 + AS_GOOD));
    // Here short of the slots: training then sets the step.
    assert!(f.in_flight_per_engine < t.kv_sequences_per_engine, "{}", fix_line(f));
    assert!(f.bound.starts_with("more would not shorten the step: training ("), "{}", fix_line(f));
    assert!(f.cost.as_deref().is_some_and(|c| c.starts_with("staleness grows")), "{f:?}");
    // A note, not a warning: the summary counts it apart, and the text names limit and fix.
    let d = p.diagnostics.iter().find(|d| d.code == ErrorCode::E0412).expect("E0412");
    assert_eq!(d.severity, Severity::Note);
    assert_eq!((p.summary.warnings, p.summary.notes), (0, 1));
    assert!(
        d.message.contains("held back by max_concurrent = 64 over 4 engines: 16 of ")
            && d.message.contains(" KV slots per engine in use"),
        "{}",
        d.message
    );
    let text = crate::render_text(&p);
    assert!(text.contains(&format!("    fix: max_concurrent = {set} (")), "{text}");
    assert!(text.contains("0 errors, 0 warnings, 1 note."), "{text}");
    // The fixed plan gives no further advice.
    assert!(q.rollouts[0].throttle.is_none() && q.summary.notes == 0, "{}", crate::render_text(&q));
}

#[test]
fn the_engine_limit_binds_when_it_is_the_smaller() {
    let p = crate::plan(&newcomer("fully_async", Some(256), 16));
    let t = p.rollouts[0].throttle.as_ref().expect("a throttled rollout");
    assert_eq!((t.limit.as_str(), t.value, t.in_flight_per_engine), ("engine.max_concurrent", 16, 16));
    let f = t.fix.as_ref().unwrap();
    assert_eq!(f.settings[0].field, "engine.max_concurrent");
    // The schedule's 256 in flight allow 64 per engine: the engine's limit can only rise to it
    // without the schedule's changing too, and the fix is planned as written.
    assert_eq!((f.in_flight_per_engine, f.settings.len()), (64, 1), "{f:?}");
    assert_eq!(f.bound, "max_concurrent = 256 over 4 engines bounds more");
}

#[test]
fn a_small_sync_batch_is_offered_more_optimizer_steps_per_rollout() {
    // 32 x 8 samples over 4 engines: 64 per engine. With 8 samples a prompt and 4 prompts the
    // engines decode 8 each.
    let mut input = newcomer("sync", None, 1000);
    input.batch.rollout_batch = Some(4.into());
    input.batch.global_batch = Some(32.into());
    let p = crate::plan(&input);
    let t = p.rollouts[0].throttle.as_ref().expect("a throttled rollout");
    assert_eq!((t.limit.as_str(), t.value, t.in_flight_per_engine), ("rollout_batch", 4, 8));
    let f = t.fix.as_ref().unwrap();
    let k = f.samples_factor;
    assert!(k >= 2, "{f:?}");
    assert_eq!(
        f.settings,
        vec![
            Setting { field: "rollout_batch".into(), value: 4 * k },
            Setting { field: "steps_per_rollout".into(), value: k }
        ]
    );
    // More samples a rollout step cost less per optimizer step.
    assert!(f.per_optimizer_step_s_after < f.per_optimizer_step_s * (1.0 - WORTH_IT), "{f:?}");
    assert!(fix_line(f).contains(&format!("for {k}x the samples")), "{}", fix_line(f));
}

#[test]
fn no_advice_when_training_sets_the_step_or_the_slots_are_full() {
    // Training sets the step: 2 of the 16 GPUs train.
    let mut input = newcomer("fully_async", Some(64), 1000);
    input.stages[2].gpus = Some(crate::input::GpuRequest::Count(2).into());
    input.stages[2].trainer.as_mut().unwrap().recompute = crate::input::Recompute::Full.into();
    let p = crate::plan(&input);
    let s = p.step.as_ref().unwrap();
    if s.train_s >= s.rollout_s {
        assert!(p.rollouts[0].throttle.is_none(), "{}", crate::render_text(&p));
    }
    // The KV slots already full: nothing to raise.
    let p = crate::plan(&newcomer("fully_async", Some(100_000), 100_000));
    assert!(p.rollouts[0].throttle.is_none(), "{}", crate::render_text(&p));
    assert_eq!(p.summary.notes, 0);
}
