//! LoRA on the embedded backend: the adapted forward against PEFT's (tests/fixtures/peft, made by
//! scripts/make-peft-fixture.py), training that moves only the adapters, adapter-only weight
//! updates into an engine, exact resume, and the PEFT export.

use crate::common;

use miles_runtime::tasks::EOS;
use miles_runtime::{LoraSpec, RolloutEngine, TrainSpec, Trainer, Trajectory};
use miles_tch::lora::{is_adapter_name, read_peft};
use miles_tch::model::Policy;
use miles_tch::train::TchTrainer;
use miles_tch::TchEngine;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use tch::{Kind, Tensor};

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(rel)
}

fn temp(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("miles-lora-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn read(path: &Path) -> HashMap<String, Tensor> {
    Tensor::read_safetensors(path).unwrap().into_iter().collect()
}

fn max_err(a: &Tensor, b: &Tensor, valid: &Tensor) -> f64 {
    (a - b).abs().amax([-1], false).masked_select(valid).max().double_value(&[])
}

#[test]
fn lora_forward_matches_peft() {
    tch::set_num_threads(1);
    let (mut policy, _) = Policy::load_hf(&fixture("hf/llama"), None).unwrap();
    let adapters = read_peft(&fixture("peft/llama-r4"), &policy.cfg).unwrap();
    assert_eq!((adapters.spec.rank, adapters.spec.alpha), (4, 8.0));
    policy.lora_spec = Some(adapters.spec.clone());
    policy.set_adapters(vec![adapters]);
    let mut r = read(&fixture("peft/llama-r4/reference/logits.safetensors"));
    let (ids, pos) = (r.remove("input_ids").unwrap(), r.remove("position_ids").unwrap());
    let mask = r.remove("attention_mask").unwrap().to_kind(Kind::Bool);
    let logits = tch::no_grad(|| policy.forward(&ids, &pos, &mask, None));
    let err = max_err(&logits, &r["logits"], &mask);
    assert!(err < 1e-4, "unmerged LoRA forward vs PEFT: max |diff| {err}");
    // The base alone is far from it: the adapters do change the model.
    let (base, _) = Policy::load_hf(&fixture("hf/llama"), None).unwrap();
    let plain = tch::no_grad(|| base.forward(&ids, &pos, &mask, None));
    assert!(max_err(&plain, &r["logits"], &mask) > 0.1);
    // Merged: PEFT's merge_and_unload weights, and its logits.
    let merged = policy.merged();
    let want = read(&fixture("peft/llama-r4/reference/merged.safetensors"));
    for (name, t) in merged.params() {
        if let Some(w) = want.get(name) {
            let d = (t - w).abs().max().double_value(&[]);
            assert!(d < 1e-6, "{name}: merged weight differs by {d}");
        }
    }
    assert_eq!(want.len(), 14);
    let ml = tch::no_grad(|| merged.forward(&ids, &pos, &mask, None));
    let err = max_err(&ml, &r["merged_logits"], &mask);
    assert!(err < 1e-4, "merged forward vs PEFT merged: {err}");
    // The slot (continuous-batching) path adds the same terms.
    let mut cache = miles_tch::model::SlotCache::new(&policy, 1);
    let row0 = ids.narrow(0, 0, 1);
    let p0 = pos.narrow(0, 0, 1);
    let sl = tch::no_grad(|| policy.forward_slots(&row0, &p0, &Tensor::from_slice(&[0i64]), &mut cache));
    let d = (sl - logits.narrow(0, 0, 1)).abs().max().double_value(&[]);
    assert!(d < 1e-4, "slot forward differs by {d}");
}

#[test]
fn lora_export_uses_peft_names_and_config() {
    tch::set_num_threads(1);
    let (mut policy, _) = Policy::load_hf(&fixture("hf/llama"), None).unwrap();
    let adapters = read_peft(&fixture("peft/llama-r4"), &policy.cfg).unwrap();
    let dir = temp("peft-names");
    adapters.write_peft(&dir, Some("../base")).unwrap();
    let ours = read(&dir.join("adapter_model.safetensors"));
    let theirs = read(&fixture("peft/llama-r4/adapter_model.safetensors"));
    let mut a: Vec<(String, Vec<i64>)> = ours.iter().map(|(n, t)| (n.clone(), t.size())).collect();
    let mut b: Vec<(String, Vec<i64>)> = theirs.iter().map(|(n, t)| (n.clone(), t.size())).collect();
    a.sort();
    b.sort();
    assert_eq!(a, b, "tensor names and shapes as PEFT writes them");
    for (n, t) in &ours {
        assert!(t.to_kind(Kind::Float).equal(&theirs[n]), "{n} round-trips");
    }
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("adapter_config.json")).unwrap()).unwrap();
    let peft: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("peft/llama-r4/adapter_config.json")).unwrap()).unwrap();
    for key in ["peft_type", "task_type", "r", "bias", "fan_in_fan_out", "use_dora", "use_rslora", "lora_dropout"] {
        assert_eq!(cfg[key], peft[key], "{key}");
    }
    assert_eq!(cfg["lora_alpha"].as_f64(), peft["lora_alpha"].as_f64());
    let sorted = |v: &serde_json::Value| {
        let mut x: Vec<String> = v.as_array().unwrap().iter().map(|s| s.as_str().unwrap().to_string()).collect();
        x.sort();
        x
    };
    assert_eq!(sorted(&cfg["target_modules"]), sorted(&peft["target_modules"]));
    // Read back: the same adapters.
    policy.set_adapters(vec![read_peft(&dir, &policy.cfg).unwrap()]);
    assert_eq!(policy.adapter_snapshot(0).unwrap().tensors.len(), 28);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_bad_peft_adapter_is_refused_with_the_reason() {
    let (policy, _) = Policy::load_hf(&fixture("hf/llama"), None).unwrap();
    let dir = temp("peft-bad");
    let cfg_text = std::fs::read_to_string(fixture("peft/llama-r4/adapter_config.json")).unwrap();
    std::fs::copy(fixture("peft/llama-r4/adapter_model.safetensors"), dir.join("adapter_model.safetensors")).unwrap();
    let write = |f: &dyn Fn(&mut serde_json::Value)| {
        let mut v: serde_json::Value = serde_json::from_str(&cfg_text).unwrap();
        f(&mut v);
        std::fs::write(dir.join("adapter_config.json"), v.to_string()).unwrap();
    };
    let err = |f: &dyn Fn(&mut serde_json::Value)| {
        write(f);
        match read_peft(&dir, &policy.cfg) {
            Ok(_) => panic!("accepted"),
            Err(e) => e.to_string(),
        }
    };
    assert!(err(&|v| v["peft_type"] = "IA3".into()).contains("only LORA"));
    assert!(err(&|v| v["use_dora"] = true.into()).contains("use_dora"));
    assert!(err(&|v| v["target_modules"] = serde_json::json!(["q_proj", "wq"])).contains("`wq`"));
    // A rank that does not match the tensors: both names in the message.
    let e = err(&|v| v["r"] = 8.into());
    assert!(e.contains("does not match") && e.contains("lora_A"), "{e}");
    // Fewer modules than the file holds.
    assert!(err(&|v| v["target_modules"] = serde_json::json!(["q_proj"])).contains("unexpected tensor"));
    let _ = std::fs::remove_dir_all(&dir);
}

fn lora(rank: usize, targets: &[&str]) -> LoraSpec {
    LoraSpec {
        rank,
        alpha: 2.0 * rank as f64,
        dropout: 0.0,
        target_modules: targets.iter().map(|s| s.to_string()).collect(),
        init_seed: 3,
        adapters: Vec::new(),
        init: None,
    }
}

fn spec(lora: Option<LoraSpec>) -> TrainSpec {
    let mut s: TrainSpec = serde_json::from_str(r#"{"lr": 0.02, "micro_batch": 2, "global_batch": 4}"#).unwrap();
    s.lora = lora;
    s
}

fn batch() -> Vec<Trajectory> {
    let traj = |p: Vec<u32>, r: Vec<u32>, adv: f32| common::trajectory(p, r, 0.0, adv);
    vec![
        traj(vec![1, 5], vec![6, 7, EOS], 1.0),
        traj(vec![1, 8], vec![9, EOS], -1.0),
        traj(vec![1, 4], vec![4, 4, 4, EOS], 0.5),
        traj(vec![1, 3], vec![3, EOS], -0.5),
    ]
}

fn bits(t: &Tensor) -> Vec<u32> {
    Vec::<f32>::try_from(t.reshape([-1])).unwrap().into_iter().map(f32::to_bits).collect()
}

#[test]
fn lora_trains_only_the_adapters_and_syncs_adapter_bytes() {
    tch::set_num_threads(1);
    let cfg = common::tiny_config(0.5);
    let mut base = Policy::init(&cfg, 1);
    base.lora_spec = Some(lora(4, &["q_proj", "v_proj", "down_proj"]));
    let mut engine = TchEngine::new(base.deep_copy());
    let mut tr = TchTrainer::new(base.deep_copy(), spec(Some(lora(4, &["q_proj", "v_proj", "down_proj"]))));
    // Before RL: the whole model, no adapters.
    let first = tr.export_weights().unwrap();
    assert!(!first.tensors.iter().any(|t| is_adapter_name(&t.name)));
    engine.load_weights(&first).unwrap();
    let before: Vec<Vec<u32>> = tr.policy.params().iter().map(|(_, t)| bits(t)).collect();
    for _ in 0..3 {
        tr.train_rl(&batch(), &[0.02], 1.0).unwrap();
    }
    // The base did not move, bit for bit; the adapters did.
    for ((n, t), b) in tr.policy.params().iter().zip(&before) {
        assert_eq!(&bits(t), b, "{n} changed");
    }
    let update = tr.export_weights().unwrap();
    assert!(update.tensors.iter().all(|t| is_adapter_name(&t.name)), "an update is adapters only");
    // 2 layers x (q: A 4x32 + B 32x4, v: 4x32 + 16x4, down: 4x48 + 32x4)
    let per_layer = 4 * 32 + 32 * 4 + 4 * 32 + 16 * 4 + 4 * 48 + 32 * 4;
    assert_eq!(update.bytes(), 2 * per_layer * 4);
    assert!(update.bytes() * 10 < first.bytes());
    let moved = update.tensors.iter().filter(|t| t.name.contains("lora_B") && t.data.iter().any(|&x| x != 0.0));
    assert_eq!(moved.count(), 6, "every B left zero");
    // The engine applies it on its base and scores tokens as the trainer does.
    engine.load_weights(&update).unwrap();
    let b = batch();
    let prompts: Vec<Vec<u32>> = b.iter().map(|t| t.prompt.clone()).collect();
    let responses: Vec<Vec<u32>> = b.iter().map(|t| t.response.clone()).collect();
    let want = tr.logprobs(&prompts, &responses, 1.0).unwrap();
    let mut check = TchTrainer::new(engine.policy.deep_copy(), spec(Some(lora(4, &["q_proj", "v_proj", "down_proj"]))));
    let got = check.logprobs(&prompts, &responses, 1.0).unwrap();
    assert_eq!(got, want);
    // An engine with no LoRA settings refuses an adapter update with a clear message.
    let mut plain = TchEngine::new(Policy::init(&cfg, 1));
    let e = plain.load_weights(&update).unwrap_err().to_string();
    assert!(e.contains("no LoRA settings"), "{e}");
    // A snapshot evaluation engine that holds nothing gets the base and adapters at once.
    let full = tr.export_full_weights().unwrap();
    let mut fresh = TchEngine::new({
        let mut p = Policy::init(&cfg, 77);
        p.lora_spec = Some(lora(4, &["q_proj", "v_proj", "down_proj"]));
        p
    });
    fresh.load_weights(&full).unwrap();
    assert_eq!(fresh.policy.snapshot(0).unwrap().tensors, tr.policy.snapshot(0).unwrap().tensors);
}

#[test]
fn lora_dropout_is_on_in_training_only() {
    tch::set_num_threads(1);
    let cfg = common::tiny_config(0.5);
    let mut l = lora(4, &["q_proj", "o_proj"]);
    l.dropout = 0.5;
    let mut tr = TchTrainer::new(Policy::init(&cfg, 2), spec(Some(l)));
    tr.train_rl(&batch(), &[0.02], 1.0).unwrap();
    let b = batch();
    let prompts: Vec<Vec<u32>> = b.iter().map(|t| t.prompt.clone()).collect();
    let responses: Vec<Vec<u32>> = b.iter().map(|t| t.response.clone()).collect();
    // Scoring is deterministic (no dropout outside the training forward).
    let a = tr.logprobs(&prompts, &responses, 1.0).unwrap();
    let c = tr.logprobs(&prompts, &responses, 1.0).unwrap();
    assert_eq!(a, c);
}

#[test]
fn lora_resume_restores_adapters_and_optimizer_exactly() {
    tch::set_num_threads(1);
    let cfg = common::tiny_config(0.5);
    let l = lora(2, &["q_proj", "k_proj", "gate_proj"]);
    let dir = temp("resume");
    let mut a = TchTrainer::new(Policy::init(&cfg, 5), spec(Some(l.clone())));
    a.train_sft(&[(vec![1, 5], vec![6, 7, EOS])], 0.01).unwrap();
    for _ in 0..2 {
        a.train_rl(&batch(), &[0.02], 1.0).unwrap();
    }
    Trainer::save(&a, &dir).unwrap();
    assert!(dir.join("adapter_model.safetensors").exists());
    let mut b = TchTrainer::new(Policy::init(&cfg, 99), spec(Some(l.clone())));
    Trainer::load(&mut b, &dir).unwrap();
    // After a load the engines may hold anything: the next update is the whole model.
    let w = b.export_weights().unwrap();
    assert!(w.tensors.iter().any(|t| !is_adapter_name(&t.name)) && w.tensors.iter().any(|t| is_adapter_name(&t.name)));
    let sa = a.train_rl(&batch(), &[0.02], 1.0).unwrap();
    let sb = b.train_rl(&batch(), &[0.02], 1.0).unwrap();
    assert_eq!(sa.loss.to_bits(), sb.loss.to_bits());
    assert_eq!(sa.grad_norm.to_bits(), sb.grad_norm.to_bits());
    assert_eq!(a.export_full_weights().unwrap(), b.export_full_weights().unwrap());
    // A checkpoint of other adapters (another rank) is refused, naming both tensors.
    let mut c = TchTrainer::new(Policy::init(&cfg, 5), spec(Some(lora(3, &["q_proj", "k_proj", "gate_proj"]))));
    let e = Trainer::load(&mut c, &dir).unwrap_err().to_string();
    assert!(e.contains("does not match") && e.contains("lora_A"), "{e}");
    // And a trainer with no LoRA refuses it too.
    let mut d = TchTrainer::new(Policy::init(&cfg, 5), spec(None));
    let e = Trainer::load(&mut d, &dir).unwrap_err().to_string();
    assert!(e.contains("has no `lora`"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn lora_final_model_is_merged_with_the_peft_adapter_and_base_beside_it() {
    tch::set_num_threads(1);
    let cfg = common::tiny_config(0.5);
    let mut tr = TchTrainer::new(Policy::init(&cfg, 6), spec(Some(lora(4, &["q_proj", "up_proj"]))));
    for _ in 0..3 {
        tr.train_rl(&batch(), &[0.05], 1.0).unwrap();
    }
    let root = temp("export");
    let dir = root.join("model");
    tr.policy.export_hf(&dir, None).unwrap();
    let merged = Policy::load(&dir).unwrap();
    assert!(merged.adapters().is_empty());
    let base = Policy::load(&dir.join("base")).unwrap();
    let mut adapted = base.deep_copy();
    adapted.set_adapters(vec![read_peft(&dir.join("adapter"), &cfg).unwrap()]);
    let (tokens, valid, positions, _) = miles_tch::model::left_pad(&[vec![1, 5, 6, 7], vec![1, 8, 9]]);
    let f = |p: &Policy| tch::no_grad(|| p.forward(&tokens, &positions, &valid, None));
    let (want, m, a) = (f(&tr.policy), f(&merged), f(&adapted));
    assert!((&m - &want).abs().max().double_value(&[]) < 1e-5, "merged model = adapted policy");
    assert!((&a - &want).abs().max().double_value(&[]) < 1e-6, "base + PEFT adapter = adapted policy");
    assert!((f(&base) - &want).abs().max().double_value(&[]) > 1e-4, "the adapters changed the model");
    let _ = std::fs::remove_dir_all(&root);
}

fn two_adapters() -> LoraSpec {
    let task: miles_runtime::TaskSpec = serde_json::from_str(r#"{"kind": {"type": "addition", "digits": 1}}"#).unwrap();
    let mut l = lora(4, &["q_proj", "o_proj", "up_proj"]);
    l.adapters = ["rev", "sort"]
        .iter()
        .map(|n| miles_runtime::AdapterSpec { name: n.to_string(), task: task.clone(), lr: None })
        .collect();
    l
}

#[test]
fn multi_lora_adapters_train_apart() {
    tch::set_num_threads(1);
    let cfg = common::tiny_config(0.5);
    let mut tr = TchTrainer::new(Policy::init(&cfg, 1), spec(Some(two_adapters())));
    let full = tr.export_weights().unwrap();
    tr.select_adapter(0).unwrap();
    let snap = |tr: &TchTrainer, i: usize| -> Vec<Vec<u32>> {
        tr.policy.adapters()[i].named().iter().map(|(_, t)| bits(t)).collect()
    };
    let (a0, b0) = (snap(&tr, 0), snap(&tr, 1));
    // Adapter 0 trains on its batch: adapter 1 does not move, bit for bit.
    for _ in 0..2 {
        tr.train_rl(&batch(), &[0.02], 1.0).unwrap();
    }
    assert_ne!(snap(&tr, 0), a0);
    assert_eq!(snap(&tr, 1), b0, "adapter 1 moved while adapter 0 trained");
    // And the other way round: adapter 0 keeps what it learnt while adapter 1 trains.
    let a1 = snap(&tr, 0);
    tr.select_adapter(1).unwrap();
    tr.train_rl(&batch()[..2], &[0.02], 1.0).unwrap();
    assert_eq!(snap(&tr, 0), a1, "adapter 0 moved while adapter 1 trained");
    assert_ne!(snap(&tr, 1), b0);
    let names: Vec<String> = tr.policy.adapters()[1].named().into_iter().map(|(n, _)| n).collect();
    assert!(names.iter().all(|n| n.contains(".sort.")), "{names:?}");
    // One update carries both adapters, under their names.
    let update = tr.export_weights().unwrap();
    assert!(update.tensors.iter().any(|t| t.name.contains(".lora_A.rev.")));
    assert!(update.tensors.iter().any(|t| t.name.contains(".lora_A.sort.")));
    // An engine serves both on one base: selecting an adapter changes its scores, and each
    // matches the trainer's with the same adapter.
    let mut base = Policy::init(&cfg, 1);
    base.lora_spec = Some(two_adapters());
    let mut engine = TchEngine::new(base);
    engine.load_weights(&full).unwrap();
    engine.load_weights(&update).unwrap();
    let b = batch();
    let prompts: Vec<Vec<u32>> = b.iter().map(|t| t.prompt.clone()).collect();
    let responses: Vec<Vec<u32>> = b.iter().map(|t| t.response.clone()).collect();
    let mut scores = Vec::new();
    for i in 0..2 {
        tr.select_adapter(i).unwrap();
        engine.select_adapter(i).unwrap();
        let want = tr.logprobs(&prompts, &responses, 1.0).unwrap();
        let mut check = TchTrainer::new(engine.policy.deep_copy(), spec(Some(two_adapters())));
        check.select_adapter(i).unwrap();
        assert_eq!(check.logprobs(&prompts, &responses, 1.0).unwrap(), want, "adapter {i}");
        scores.push(want);
    }
    assert_ne!(scores[0], scores[1]);
    assert!(engine.select_adapter(2).is_err());
    // Checkpoint and resume: both adapters and both optimizer states.
    let dir = temp("multi");
    Trainer::save(&tr, &dir).unwrap();
    // Separate optimizer states: adapter 0 took 2 Adam steps, adapter 1 one (a shared state
    // would have counted 3 for both).
    let state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("trainer.json")).unwrap()).unwrap();
    assert_eq!(state["adam_steps"], serde_json::json!([2, 1]));
    let mut back = TchTrainer::new(Policy::init(&cfg, 9), spec(Some(two_adapters())));
    Trainer::load(&mut back, &dir).unwrap();
    for i in [1, 0] {
        tr.select_adapter(i).unwrap();
        back.select_adapter(i).unwrap();
        let (x, y) = (tr.train_rl(&batch(), &[0.02], 1.0).unwrap(), back.train_rl(&batch(), &[0.02], 1.0).unwrap());
        assert_eq!(x.loss.to_bits(), y.loss.to_bits());
    }
    assert_eq!(tr.export_full_weights().unwrap(), back.export_full_weights().unwrap());
    // Export: the base, and one PEFT directory per adapter.
    let out = dir.join("model");
    tr.policy.export_hf(&out, None).unwrap();
    for n in ["rev", "sort"] {
        let ad = read_peft(&out.join("adapters").join(n), &cfg).unwrap();
        assert_eq!(ad.numel(), tr.policy.adapters()[0].numel());
    }
    assert!(Policy::load(&out).unwrap().adapters().is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}

/// `lora { init }`: the adapter starts at the PEFT directory's A and B (the policy is PEFT's
/// base + adapter from the first forward), RL trains it on from there with the base frozen, and
/// a file that no longer says what the recipe does (`miles check` compared them) is refused.
#[test]
fn lora_init_starts_from_the_peft_adapter() {
    tch::set_num_threads(1);
    let mut l = lora(4, &["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]);
    l.alpha = 8.0;
    l.init = Some(fixture("peft/llama-r4"));
    let (mut policy, _) = Policy::load_hf(&fixture("hf/llama"), None).unwrap();
    policy.lora_spec = Some(l.clone());
    policy.attach_lora().unwrap();
    let mut r = read(&fixture("peft/llama-r4/reference/logits.safetensors"));
    let (ids, pos) = (r.remove("input_ids").unwrap(), r.remove("position_ids").unwrap());
    let mask = r.remove("attention_mask").unwrap().to_kind(Kind::Bool);
    let logits = tch::no_grad(|| policy.forward(&ids, &pos, &mask, None));
    let err = max_err(&logits, &r["logits"], &mask);
    assert!(err < 1e-4, "base + init adapter vs PEFT: max |diff| {err}");

    let file = read(&fixture("peft/llama-r4/adapter_model.safetensors"));
    let mut tr = TchTrainer::new(policy, spec(Some(l.clone())));
    let base: Vec<Vec<u32>> = tr.policy.params().iter().map(|(_, t)| bits(t)).collect();
    // Before any step the trainer's adapter is the file's, bit for bit.
    for (n, t) in tr.policy.lora().unwrap().named() {
        assert_eq!(bits(&t), bits(&file[&n]), "{n} is not the file's");
    }
    tr.train_rl(&batch(), &[0.02], 1.0).unwrap();
    for ((n, t), b) in tr.policy.params().iter().zip(&base) {
        assert_eq!(&bits(t), b, "{n} changed: the base is frozen");
    }
    let moved = tr.policy.lora().unwrap().named().into_iter().filter(|(n, t)| bits(t) != bits(&file[n])).count();
    assert_eq!(moved, 2 * 7 * 2, "every A and B trains on from the file's");

    // The recipe's rank or targets no longer match the file: refused, naming the file.
    for (rank, targets) in
        [(8, vec!["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]), (4, vec!["q_proj"])]
    {
        let mut bad = lora(rank, &targets);
        bad.alpha = 8.0;
        bad.init = Some(fixture("peft/llama-r4"));
        let (mut p, _) = Policy::load_hf(&fixture("hf/llama"), None).unwrap();
        p.lora_spec = Some(bad);
        let e = p.attach_lora().unwrap_err().to_string();
        assert!(e.contains("adapter_config.json") && e.contains("changed after `miles check`"), "{e}");
    }
}
