//! Mixture-of-experts policies and R3 on the embedded backend: layer layout and checkpoints, the
//! sampler's recorded routing and its replay in the trainer, and the bf16 engine's mismatch.

use crate::common;

use miles_runtime::{GenRequest, StreamEngine};
use miles_runtime::{ModelConfig, MoeConfig, RouteId, RunSpec, SamplingParams, Trajectory};
use miles_tch::generate::generate_recording;
use miles_tch::model::{left_pad, Policy};
use miles_tch::moe::Route;
use miles_tch::stream::TchStreamEngine;
use miles_tch::train::{pack, recorded_routes, TchTrainer};
use tch::{Kind, Tensor};

fn moe_cfg(dense_layers: usize, shared: usize) -> ModelConfig {
    let mut c = common::tiny_config(0.5);
    c.n_layers = 3;
    c.moe = Some(MoeConfig { shared_expert_d_ff: shared, dense_layers, ..common::small_moe() });
    c
}

fn params(seed: u64) -> SamplingParams {
    SamplingParams {
        max_new_tokens: 6,
        temperature: 1.0,
        top_p: 1.0,
        top_k: 0,
        stop_tokens: vec![2],
        greedy: false,
        seed,
    }
}

fn prompts() -> Vec<Vec<u32>> {
    vec![vec![1, 4, 5], vec![1, 6, 7, 8, 3]]
}

fn trajectories(p: &[Vec<u32>], s: Vec<miles_runtime::Sample>) -> Vec<Trajectory> {
    common::sampled_trajectories(p, s, |_| 0.5)
}

#[test]
fn moe_layers_after_dense_layers() {
    tch::set_num_threads(1);
    let cfg = moe_cfg(1, 8);
    let names = miles_tch::model::param_names(&cfg);
    assert!(names.contains(&"model.layers.0.mlp.gate_proj.weight".to_string()), "layer 0 is dense");
    assert!(!names.iter().any(|n| n.starts_with("model.layers.0.mlp.experts")));
    for i in [1, 2] {
        assert!(names.contains(&format!("model.layers.{i}.mlp.gate.weight")), "layer {i}'s router");
        assert!(names.contains(&format!("model.layers.{i}.mlp.experts.3.down_proj.weight")));
        assert!(names.contains(&format!("model.layers.{i}.mlp.shared_expert.up_proj.weight")));
        assert!(!names.contains(&format!("model.layers.{i}.mlp.gate_proj.weight")));
    }
    let p = Policy::init(&cfg, 3);
    let shape = |n: &str| p.params().iter().find(|(m, _)| m == n).map(|(_, t)| t.size()).unwrap();
    assert_eq!(shape("model.layers.1.mlp.gate.weight"), vec![4, 32]);
    assert_eq!(shape("model.layers.1.mlp.experts.0.gate_proj.weight"), vec![16, 32]);
    assert_eq!(shape("model.layers.1.mlp.shared_expert.down_proj.weight"), vec![32, 8]);
    assert_eq!(shape("model.layers.0.mlp.down_proj.weight"), vec![32, 48]);
    // A checkpoint round trip is bit-exact.
    let dir = std::env::temp_dir().join(format!("miles-moe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    p.save(&dir).unwrap();
    let mut q = Policy::init(&cfg, 99);
    q.load_tensors(&dir.join("model.safetensors")).unwrap();
    let (tok, valid, pos, _) = left_pad(&[vec![1, 4, 5, 6]]);
    let a = p.forward(&tok, &pos, &valid, None);
    let b = q.forward(&tok, &pos, &valid, None);
    assert!(a.equal(&b));
    // A shared expert: no transformers class holds it, so the checkpoint describes itself in
    // its own config file (hf_moe.rs tests the exportable ones).
    let own = dir.join(miles_tch::model::MODEL_CONFIG_FILE);
    let config: ModelConfig = serde_json::from_str(&std::fs::read_to_string(own).unwrap()).unwrap();
    assert_eq!(config, cfg);
    assert!(!dir.join("config.json").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// The sampler records every forwarded token (prompt + response - 1) and the trainer's replay
/// uses exactly those experts, even where its own router would choose others.
#[test]
fn replayed_routing_equals_recorded() {
    tch::set_num_threads(1);
    let cfg = moe_cfg(1, 0);
    let policy = Policy::init(&cfg, 5);
    let p = prompts();
    let samples = generate_recording(&policy, &p, 3, &params(11), 0, true, Some(RouteId::U8)).unwrap();
    let plain = generate_recording(&policy, &p, 3, &params(11), 0, true, None).unwrap();
    for (s, q) in samples.iter().zip(&plain) {
        assert_eq!((&s.response, &s.logprobs), (&q.response, &q.logprobs), "recording changes no sample");
        let r = s.routing.as_ref().expect("routing recorded");
        assert_eq!(r.tokens(), p[s.prompt_index].len() + s.response.len() - 1);
        assert_eq!((r.layers, r.top_k, r.bytes()), (2, 2, r.tokens() * 4));
    }
    let mut batch = trajectories(&p, samples);
    // Rewrite the recorded experts to {3, 2} wherever the router chose otherwise, so replay is
    // visible: the training forward must use what was recorded, not what it would choose.
    for t in &mut batch {
        let r = t.routing.as_mut().unwrap();
        for b in r.data.iter_mut() {
            *b = 3 - (*b % 2);
        }
    }
    let pr: Vec<&[u32]> = batch.iter().map(|t| t.prompt.as_slice()).collect();
    let rs: Vec<&[u32]> = batch.iter().map(|t| t.response.as_slice()).collect();
    let pk = pack(&pr, &rs, None);
    let (ids, mask) = recorded_routes(&batch, &pk).unwrap();
    let (tokens, valid, positions) = (&pk.tokens, &pk.valid, &pk.positions);
    let mut route =
        Route::for_batch(Some((ids.iter().map(Tensor::shallow_clone).collect(), mask.shallow_clone())), valid, true);
    let _ = policy.forward_routed(tokens, positions, valid, None, Some(&mut route));
    for (used, rec) in route.used.iter().zip(&ids) {
        let m = mask.unsqueeze(-1).expand_as(used);
        assert!(used.masked_select(&m).equal(&rec.masked_select(&m)), "replayed experts equal the recorded ones");
        assert!(!route.own[0].masked_select(&m).equal(&rec.masked_select(&m)), "the router alone would differ");
    }
    let recorded: i64 = mask.sum(Kind::Int64).int64_value(&[]);
    let want: usize = batch.iter().map(|t| t.prompt.len() + t.response.len() - 1).sum();
    assert_eq!(recorded as usize, want);
    // A trajectory whose routing does not fit the model is dropped from training, named.
    let mut tr = TchTrainer::new(
        policy.deep_copy(),
        serde_json::from_str(r#"{"lr": 0.01, "micro_batch": 6, "global_batch": 6}"#).unwrap(),
    );
    tr.replay = true;
    batch[0].routing.as_mut().unwrap().data.pop();
    let st = tr.train_rl_impl(&batch, &[0.01], 1.0).unwrap();
    let m = st.moe.unwrap();
    assert_eq!(m.r3_dropped, 1);
    assert!(m.replayed);
    assert_eq!(m.route_mismatch, vec![0.0, 0.0], "replayed: the forward used the recorded experts");
    assert!(m.router_disagreement.iter().all(|&d| d > 0.1), "{:?}", m.router_disagreement);
}

/// A bf16 engine samples with other numbers than the fp32 trainer computes: the log-probs
/// differ by bf16 rounding (an fp32 engine's by float reordering alone).
#[test]
fn bf16_engine_differs_from_fp32_trainer() {
    tch::set_num_threads(1);
    let cfg = moe_cfg(0, 0);
    let policy = Policy::init(&cfg, 8);
    let mut spec = RunSpec::from_json(include_str!("../../../runtime/tests/data/tiny.json")).unwrap();
    spec.model = cfg.clone();
    spec.rollout.precision = miles_runtime::Precision::Bf16;
    let engine = miles_tch::engine_policy(&policy, &spec).unwrap();
    assert_eq!(engine.kind(), Kind::BFloat16);
    let p = prompts();
    let diff = |e: &Policy| {
        let s = generate_recording(e, &p, 4, &params(3), 0, true, None).unwrap();
        let batch = trajectories(&p, s);
        let tr = TchTrainer::new(
            policy.deep_copy(),
            serde_json::from_str(r#"{"lr": 0.01, "micro_batch": 8, "global_batch": 8}"#).unwrap(),
        );
        let pr: Vec<Vec<u32>> = batch.iter().map(|t| t.prompt.clone()).collect();
        let rs: Vec<Vec<u32>> = batch.iter().map(|t| t.response.clone()).collect();
        let lp = tr.logprobs_impl(&pr, &rs, 1.0).unwrap();
        let (mut sum, mut n) = (0f64, 0usize);
        for (t, l) in batch.iter().zip(&lp) {
            for (a, b) in t.rollout_logprobs.iter().zip(l) {
                sum += (a - b).abs() as f64;
                n += 1;
            }
        }
        sum / n as f64
    };
    let bf16 = diff(&engine);
    let fp32 = diff(&policy.deep_copy());
    assert!(fp32 < 1e-5, "fp32 engine vs trainer: {fp32}");
    assert!(bf16 > 1e-4 && bf16 < 0.2, "bf16 engine vs trainer: {bf16}");
}

/// The continuous-batching engine records the same token count: the prompt, then every sampled
/// token but the last (never fed back).
#[test]
fn stream_engine_records_every_forwarded_token() {
    tch::set_num_threads(1);
    let policy = Policy::init(&moe_cfg(1, 0), 4);
    let mut e = TchStreamEngine::new(policy, 3);
    e.record = Some(RouteId::U16);
    for (id, p) in prompts().into_iter().enumerate() {
        e.submit(GenRequest { id: id as u64, prompt: p, params: params(id as u64) }).unwrap();
    }
    let mut done = Vec::new();
    for _ in 0..50 {
        done.extend(e.step().unwrap());
        if done.len() == 2 {
            break;
        }
    }
    assert_eq!(done.len(), 2);
    for s in done {
        let r = s.routing.unwrap();
        let plen = prompts()[s.id as usize].len();
        assert_eq!(r.tokens(), plen + s.response.len() - 1);
        assert_eq!(r.bytes(), r.tokens() * 2 * 2 * 2, "u16 ids: 2 layers x top-2 x 2 bytes");
        assert!(r.ids().iter().all(|&x| (0..4).contains(&x)));
    }
}

/// True on-policy: with the batch-invariant kernels the trainer's log-probs of the sampled tokens
/// are the sampler's bit for bit, for a dense and an MoE policy, whatever else shares the
/// trainer's micro-batch or the sampler's batch; without them they differ in the last bits.
#[test]
fn batch_invariant_logprobs_are_the_samplers_bit_for_bit() {
    tch::set_num_threads(1);
    for cfg in [common::tiny_config(0.5), moe_cfg(1, 8)] {
        let mut policy = Policy::init(&cfg, 21);
        policy.invariant = true;
        let p = prompts();
        let alone = generate_recording(&policy, &p[..1], 3, &params(5), 0, true, None).unwrap();
        let mixed = generate_recording(&policy, &p, 3, &params(5), 0, true, None).unwrap();
        let mut batch = trajectories(&p, mixed);
        batch.extend(trajectories(&p[..1], alone));
        let mut tr = TchTrainer::new(
            policy.deep_copy(),
            serde_json::from_str(r#"{"lr": 0.01, "micro_batch": 9, "global_batch": 9}"#).unwrap(),
        );
        let pr: Vec<Vec<u32>> = batch.iter().map(|t| t.prompt.clone()).collect();
        let rs: Vec<Vec<u32>> = batch.iter().map(|t| t.response.clone()).collect();
        let together = tr.logprobs_impl(&pr, &rs, 1.0).unwrap();
        let single = tr.logprobs_impl(&pr[..1], &rs[..1], 1.0).unwrap();
        assert_eq!(together[0], single[0], "the trainer's log-probs do not depend on the micro-batch");
        for (t, lp) in batch.iter().zip(&together) {
            assert_eq!(&t.rollout_logprobs, lp, "sampler and trainer agree bit for bit");
        }
        // The training step sees no train-rollout difference at all.
        let st = tr.train_rl_impl(&batch[..9], &[0.01], 1.0).unwrap();
        assert_eq!(st.logp_diff, 0.0);
        // The ordinary kernels do not give it.
        policy.invariant = false;
        let fast = generate_recording(&policy, &p, 3, &params(5), 0, true, None).unwrap();
        let fb = trajectories(&p, fast);
        let tr2 = TchTrainer::new(
            policy.deep_copy(),
            serde_json::from_str(r#"{"lr": 0.01, "micro_batch": 6, "global_batch": 6}"#).unwrap(),
        );
        let pr: Vec<Vec<u32>> = fb.iter().map(|t| t.prompt.clone()).collect();
        let rs: Vec<Vec<u32>> = fb.iter().map(|t| t.response.clone()).collect();
        let lp = tr2.logprobs_impl(&pr, &rs, 1.0).unwrap();
        assert!(fb.iter().zip(&lp).any(|(t, l)| &t.rollout_logprobs != l));
    }
}

/// An MoE run with R3 and a bf16 engine resumes exactly: the experts, the routers and their Adam
/// state are in the checkpoint, and the resumed engine records and replays as before.
#[test]
fn moe_r3_run_resumes_exactly() {
    let (tmp, opts, metrics) = (common::run_dir, common::quiet, common::untimed_metrics);
    let mut s = RunSpec::from_json(include_str!("../../../runtime/tests/data/tiny.json")).unwrap();
    s.model.moe = moe_cfg(0, 0).moe;
    s.rollout.precision = miles_runtime::Precision::Bf16;
    s.rollout.r3 = Some(miles_runtime::R3Spec { replay: true, id: RouteId::U8 });
    let (full, part) = (tmp("moe-full"), tmp("moe-part"));
    miles_tch::run(&s, &opts(&full)).unwrap();
    let mut o = opts(&part);
    o.stop_after = Some(3);
    assert!(miles_tch::run(&s, &o).unwrap().stopped_early);
    let mut o = opts(&part);
    o.resume = true;
    miles_tch::run(&s, &o).unwrap();
    let m = metrics(&full);
    assert_eq!(m, metrics(&part));
    assert!(m.iter().any(|r| r.get("r3/tokens").is_some()));
    for d in [full, part] {
        let _ = std::fs::remove_dir_all(d);
    }
}
