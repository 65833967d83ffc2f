//! Hugging Face mixture-of-experts directories (tests/fixtures/hf/qwen3_moe and mixtral, made by
//! scripts/make-hf-moe-fixtures.py with transformers): our forward against transformers' logits,
//! R3 on a loaded model, a train step, export (round trip, structure, transformers' own reload
//! where a Python with transformers exists), LoRA, and what is refused.

use crate::common;
use crate::common::hf::{
    assert_carried, assert_matches_reference, assert_refused, edit_config, fixture, max_err, perturb, reference, Bad,
};

use miles_runtime::{LoraSpec, ModelConfig, MoeConfig, RouteId, SamplingParams, Trainer};
use miles_tch::generate::generate_recording;
use miles_tch::hf::{parse_config, Architecture};
use miles_tch::model::{KvCache, Policy, SlotCache};
use miles_tch::moe::Route;
use miles_tch::train::{pack, recorded_routes, TchTrainer};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use tch::{Kind, Tensor};

const FIXTURES: [(&str, Architecture); 2] = [("qwen3_moe", Architecture::Qwen3Moe), ("mixtral", Architecture::Mixtral)];

fn temp(tag: &str) -> PathBuf {
    common::hf::temp(&format!("moe-{tag}"))
}

/// Tensor name -> shape, from a safetensors file's header.
fn header(path: &Path) -> BTreeMap<String, Vec<i64>> {
    Tensor::read_safetensors(path).unwrap().into_iter().map(|(n, t)| (n, t.size())).collect()
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn moe_forward_matches_transformers() {
    tch::set_num_threads(1);
    for (name, arch) in FIXTURES {
        let (policy, meta) = Policy::load_hf(&fixture(name), None).unwrap();
        assert_eq!(meta.architecture, arch);
        let m = policy.cfg.moe.as_ref().expect("an MoE config");
        let (r, _) = assert_matches_reference(name, &policy);
        let t = r.ids.size()[1];
        // The sampler's paths (KV cache, continuous-batching slots) agree on the padded row.
        let row = |x: &Tensor| x.narrow(0, 1, 1);
        let mut cache = KvCache::new(&policy, 1, t);
        let cached = tch::no_grad(|| policy.forward(&row(&r.ids), &row(&r.pos), &row(&r.mask), Some(&mut cache)));
        let e = max_err(&cached, &row(&r.logits), &row(&r.mask));
        assert!(e <= 1e-4, "{name}: KV-cached forward differs by {e}");
        let mut slots = SlotCache::new(&policy, 1);
        let real = row(&r.mask).sum(Kind::Int64).int64_value(&[]);
        let tail = |x: &Tensor| row(x).narrow(1, t - real, real);
        let s = tch::no_grad(|| {
            policy.forward_slots(&tail(&r.ids), &tail(&r.pos), &Tensor::from_slice(&[0i64]), &mut slots)
        });
        let e = (&s - tail(&r.logits)).abs().max().double_value(&[]);
        assert!(e <= 1e-4, "{name}: slot forward differs by {e}");
        match arch {
            Architecture::Qwen3Moe => {
                // Layer 1 is dense (mlp_only_layers), of intermediate_size; experts of
                // moe_intermediate_size; the raw softmax weights (norm_topk_prob false).
                assert_eq!((m.experts, m.top_k, m.expert_d_ff, policy.cfg.d_ff), (8, 2, 24, 48));
                assert_eq!((0..3).map(|i| m.is_moe_layer(i)).collect::<Vec<_>>(), vec![true, false, true]);
                assert!(!m.norm_topk && policy.cfg.qk_norm && policy.cfg.head_dim == Some(16));
                assert!((m.aux_loss_coef - 0.001).abs() < 1e-12);
            }
            _ => {
                assert_eq!((m.experts, m.top_k, m.expert_d_ff), (4, 2, 48));
                assert!(m.norm_topk && !policy.cfg.qk_norm && m.moe_layers(policy.cfg.n_layers) == 2);
                assert_eq!(meta.dtype.as_deref(), Some("bfloat16"));
            }
        }
    }
}

fn sampling(seed: u64) -> SamplingParams {
    SamplingParams {
        max_new_tokens: 6,
        temperature: 1.0,
        top_p: 1.0,
        top_k: 0,
        stop_tokens: vec![],
        greedy: false,
        seed,
    }
}

/// R3 on a loaded checkpoint: the sampler records each token's experts, a replayed forward uses
/// exactly those and gives the sampler's log-probs; then one RL step moves the experts.
#[test]
fn r3_and_a_train_step_on_loaded_moe_checkpoints() {
    tch::set_num_threads(1);
    for (name, _) in FIXTURES {
        let (policy, _) = Policy::load_hf(&fixture(name), None).unwrap();
        let prompts: Vec<Vec<u32>> = vec![vec![11, 40, 7, 99], vec![5, 300, 42]];
        let samples = generate_recording(&policy, &prompts, 2, &sampling(3), 0, true, Some(RouteId::U8)).unwrap();
        let batch = common::sampled_trajectories(&prompts, samples, |i| if i % 2 == 0 { 1.0 } else { -1.0 });
        let moe_layers = policy.cfg.moe.as_ref().unwrap().moe_layers(policy.cfg.n_layers);
        for t in &batch {
            let r = t.routing.as_ref().expect("routing recorded");
            assert_eq!((r.layers, r.top_k, r.tokens()), (moe_layers, 2, t.prompt.len() + t.response.len() - 1));
        }
        let pr: Vec<&[u32]> = batch.iter().map(|t| t.prompt.as_slice()).collect();
        let rs: Vec<&[u32]> = batch.iter().map(|t| t.response.as_slice()).collect();
        let pk = pack(&pr, &rs, None);
        let (ids, mask) = recorded_routes(&batch, &pk).unwrap();
        let mut route = Route::for_batch(
            Some((ids.iter().map(Tensor::shallow_clone).collect(), mask.shallow_clone())),
            &pk.valid,
            false,
        );
        let logits =
            tch::no_grad(|| policy.forward_routed(&pk.tokens, &pk.positions, &pk.valid, None, Some(&mut route)));
        for (used, rec) in route.used.iter().zip(&ids) {
            let m = mask.unsqueeze(-1).expand_as(used);
            assert!(used.masked_select(&m).equal(&rec.masked_select(&m)), "{name}: replay used the recorded experts");
        }
        let lp = logits.log_softmax(-1, Kind::Float);
        let width = pk.tokens.size()[1];
        let mut worst = 0f64;
        for (b, t) in batch.iter().enumerate() {
            let start = width - (t.prompt.len() + t.response.len()) as i64;
            for (j, (&tok, &want)) in t.response.iter().zip(&t.rollout_logprobs).enumerate() {
                let col = start + (t.prompt.len() + j) as i64;
                let got = lp.double_value(&[b as i64, col - 1, tok as i64]);
                worst = worst.max((got - want as f64).abs());
            }
        }
        eprintln!("{name}: max |replayed log-prob - sampler's| = {worst:.3e}");
        assert!(worst < 1e-4, "{name}: replayed log-probs differ from the sampler's by {worst}");

        // One RL step under replay: it moves the experts the batch used, and the router.
        let mut tr = TchTrainer::new(
            policy.deep_copy(),
            serde_json::from_str(r#"{"lr": 0.01, "micro_batch": 4, "global_batch": 4}"#).unwrap(),
        );
        tr.replay = true;
        let before: Vec<(String, Tensor)> =
            tr.policy.params().iter().map(|(n, t)| (n.clone(), t.detach().copy())).collect();
        let st = tr.train_rl_impl(&batch, &[0.01], 1.0).unwrap();
        let m = st.moe.expect("MoE statistics");
        assert!(m.replayed && m.r3_dropped == 0);
        assert!(m.route_mismatch.iter().all(|&x| x == 0.0), "{name}: {:?}", m.route_mismatch);
        let moved = |pat: &str| {
            before
                .iter()
                .zip(tr.policy.params())
                .filter(|((n, _), _)| n.contains(pat))
                .any(|((_, a), (_, b))| !a.equal(b))
        };
        assert!(moved(".mlp.experts."), "{name}: no expert weight changed");
        assert!(moved(".mlp.gate.weight"), "{name}: the router did not change");
    }
}

fn rewrite_tensors(file: &Path, f: impl FnOnce(&mut Vec<(String, Tensor)>)) {
    let mut all = Tensor::read_safetensors(file).unwrap();
    f(&mut all);
    Tensor::write_safetensors(&all, file).unwrap();
}

const BAD: &[Bad] = &[
    (
        "missing expert tensor",
        "mixtral",
        |d| {
            rewrite_tensors(&d.join("model.safetensors"), |v| {
                v.retain(|(n, _)| n != "model.layers.1.block_sparse_moe.experts.2.w3.weight")
            })
        },
        &["model.layers.1.block_sparse_moe.experts.2.w3.weight", "missing", "MixtralForCausalLM"],
    ),
    (
        "misshapen router",
        "qwen3_moe",
        |d| {
            rewrite_tensors(&d.join("model.safetensors"), |v| {
                for (n, t) in v.iter_mut() {
                    if n == "model.layers.2.mlp.gate.weight" {
                        *t = Tensor::zeros([7, 32], (Kind::Float, tch::Device::Cpu));
                    }
                }
            })
        },
        &["model.safetensors", "model.layers.2.mlp.gate.weight", "[7, 32]", "[8, 32]"],
    ),
    (
        "misshapen expert",
        "mixtral",
        |d| {
            edit_config(d, |c| {
                c.insert("intermediate_size".into(), 40.into());
            })
        },
        &["model.safetensors", "model.layers.0.block_sparse_moe.experts.0.w1.weight", "[48, 32]", "[40, 32]"],
    ),
    (
        "dense layer where the file has experts",
        "qwen3_moe",
        |d| {
            edit_config(d, |c| {
                c.insert("mlp_only_layers".into(), serde_json::json!([0, 1]));
            })
        },
        &["model.layers.0.mlp.gate_proj.weight", "missing", "Qwen3MoeForCausalLM"],
    ),
    (
        "fused experts",
        "qwen3_moe",
        |d| {
            rewrite_tensors(&d.join("model.safetensors"), |v| {
                v.retain(|(n, _)| !n.starts_with("model.layers.0.mlp.experts."));
                v.push((
                    "model.layers.0.mlp.experts.gate_up_proj".into(),
                    Tensor::zeros([8, 48, 32], (Kind::Float, tch::Device::Cpu)),
                ));
            })
        },
        &[
            "model.layers.0.mlp.experts.0.gate_proj.weight",
            "missing",
            "fused",
            "model.layers.0.mlp.experts.gate_up_proj",
        ],
    ),
    (
        "router jitter",
        "mixtral",
        |d| {
            edit_config(d, |c| {
                c.insert("router_jitter_noise".into(), 0.1.into());
            })
        },
        &["config.json", "`router_jitter_noise`", "0.1", "MixtralForCausalLM"],
    ),
    (
        "qwen3_moe sliding window",
        "qwen3_moe",
        |d| {
            edit_config(d, |c| {
                c.insert("use_sliding_window".into(), true.into());
            })
        },
        &["config.json", "`use_sliding_window`", "Qwen3MoeForCausalLM"],
    ),
    (
        "shared expert",
        "qwen3_moe",
        |d| {
            edit_config(d, |c| {
                c.insert("shared_expert_intermediate_size".into(), 64.into());
            })
        },
        &["config.json", "`shared_expert_intermediate_size` = 64", "no shared expert"],
    ),
    (
        "sigmoid scoring",
        "mixtral",
        |d| {
            edit_config(d, |c| {
                c.insert("scoring_func".into(), "sigmoid".into());
            })
        },
        &["config.json", "`scoring_func`", "sigmoid"],
    ),
    (
        "top-k above the experts",
        "mixtral",
        |d| {
            edit_config(d, |c| {
                c.insert("num_experts_per_tok".into(), 5.into());
            })
        },
        &["config.json", "`num_experts_per_tok` = 5", "1..=4"],
    ),
    (
        "two expert counts",
        "qwen3_moe",
        |d| {
            edit_config(d, |c| {
                c.insert("num_experts".into(), 6.into());
            })
        },
        &["config.json", "`num_experts` (6)", "`num_local_experts` (8)"],
    ),
    (
        "mlp_only_layers out of range",
        "qwen3_moe",
        |d| {
            edit_config(d, |c| {
                c.insert("mlp_only_layers".into(), serde_json::json!([1, 3]));
            })
        },
        &["config.json", "`mlp_only_layers` names layer 3, of 3 layers"],
    ),
    (
        "mixtral without renormalisation",
        "mixtral",
        |d| {
            edit_config(d, |c| {
                c.insert("norm_topk_prob".into(), false.into());
            })
        },
        &["config.json", "`norm_topk_prob` = false"],
    ),
    (
        "no expert width",
        "qwen3_moe",
        |d| {
            edit_config(d, |c| {
                c.remove("moe_intermediate_size");
            })
        },
        &["config.json", "missing field `moe_intermediate_size`"],
    ),
];

#[test]
fn bad_moe_directories_are_errors_naming_the_file_and_field() {
    assert_refused("moe-bad", BAD);
}

/// The Hub's Qwen3-MoE configs say `num_experts` where transformers 5 writes
/// `num_local_experts`; `decoder_sparse_step` places the MoE layers.
#[test]
fn qwen3_moe_config_forms() {
    let p = fixture("qwen3_moe").join("config.json");
    let text = std::fs::read_to_string(&p).unwrap();
    let mut hub = json(&p);
    let parse = |v: &serde_json::Value| parse_config(&p, &v.to_string()).unwrap();
    let n = hub.as_object_mut().unwrap().remove("num_local_experts").unwrap();
    hub["num_experts"] = n;
    assert_eq!(parse_config(&p, &text).unwrap().model, parse(&hub).model);
    hub["mlp_only_layers"] = serde_json::json!([]);
    hub["decoder_sparse_step"] = 2.into();
    hub["num_hidden_layers"] = 4.into();
    let moe = parse(&hub).model.moe.unwrap();
    assert_eq!((0..4).map(|i| moe.is_moe_layer(i)).collect::<Vec<_>>(), vec![false, true, false, true]);
    // transformers builds a Qwen3-MoE with no experts as a dense model.
    hub["num_experts"] = 0.into();
    assert!(parse(&hub).model.moe.is_none());
}

/// Loaded, changed in place (as an optimizer step does), exported, reloaded: the same logits
/// bit for bit, the directory's own config.json (dtype float32) and the fixture's tensor names
/// and shapes.
#[test]
fn moe_export_round_trips_as_its_own_architecture() {
    tch::set_num_threads(1);
    for (name, arch) in FIXTURES {
        let (policy, meta) = Policy::load_hf(&fixture(name), None).unwrap();
        perturb(&policy, 0.01, 5);
        let out = temp(&format!("export-{name}"));
        policy.export_hf(&out, Some(&meta)).unwrap();
        let (again, meta2) = Policy::load_hf(&out, None).unwrap();
        assert_eq!((meta2.architecture, &again.cfg), (arch, &policy.cfg), "{name}");
        let r = reference(name);
        assert!(r.forward(&policy).equal(&r.forward(&again)), "{name}: logits changed through export");
        let mut want = json(&fixture(name).join("config.json"));
        want["dtype"] = "float32".into();
        assert_eq!(json(&out.join("config.json")), want, "{name}: the source's config.json, dtype float32");
        assert_eq!(header(&out.join("model.safetensors")), header(&fixture(name).join("model.safetensors")), "{name}");
        assert_carried(&meta, &out, name);
        let _ = std::fs::remove_dir_all(&out);
    }
}

/// A policy seeded from a fixture's sizes (no source directory) exports as the same
/// architecture: config.json parses back to the same model and holds every key the fixture's
/// does that miles reads, and the tensors have the fixture's names and shapes (the structural
/// check of an export CI runs without Python).
#[test]
fn a_seeded_moe_policy_exports_with_the_fixtures_structure() {
    tch::set_num_threads(1);
    for (name, arch) in FIXTURES {
        let path = fixture(name).join("config.json");
        let hc = parse_config(&path, &std::fs::read_to_string(&path).unwrap()).unwrap();
        let p = Policy::init(&hc.model, 7);
        let out = temp(&format!("seeded-{name}"));
        p.export_hf(&out, None).unwrap();
        let written = json(&out.join("config.json"));
        let back = parse_config(&out.join("config.json"), &written.to_string()).unwrap();
        assert_eq!(back.architecture, arch, "{name}");
        assert_eq!(back.model, hc.model, "{name}: config.json says the same model");
        let fixture_cfg = json(&path);
        let read = match arch {
            Architecture::Mixtral => miles_tch::hf::MIXTRAL_KEYS,
            _ => miles_tch::hf::QWEN3_MOE_KEYS,
        };
        let common = [
            "architectures",
            "model_type",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "vocab_size",
            "rms_norm_eps",
            "tie_word_embeddings",
            "hidden_act",
        ];
        for k in read.iter().chain(&common).filter(|k| fixture_cfg.get(**k).is_some()) {
            // transformers 5 writes `num_local_experts` for Qwen3-MoE; the Hub and we `num_experts`.
            let ours = written.get(*k).or_else(|| (*k == "num_local_experts").then(|| &written["num_experts"]));
            assert_eq!(ours, Some(&fixture_cfg[*k]), "{name}: config.json key `{k}`");
        }
        assert_eq!(header(&out.join("model.safetensors")), header(&fixture(name).join("model.safetensors")), "{name}");
        let (q, _) = Policy::load_hf(&out, None).unwrap();
        let r = reference(name);
        let a = r.forward(&p);
        assert!(a.equal(&r.forward(&q)), "{name}");
        // A checkpoint of the same policy round-trips through the trainer's reader too.
        let ck = temp(&format!("ckpt-{name}"));
        std::fs::create_dir_all(&ck).unwrap();
        p.save(&ck).unwrap();
        let mut c = Policy::init(&hc.model, 99);
        c.load_tensors(&ck.join("model.safetensors")).unwrap();
        assert!(r.forward(&c).equal(&a), "{name}: checkpoint");
        for d in [&out, &ck] {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

fn moe_cfg(f: impl FnOnce(&mut ModelConfig, &mut MoeConfig)) -> ModelConfig {
    let mut c = common::tiny_config(0.3);
    c.n_layers = 3;
    let mut m = common::small_moe();
    f(&mut c, &mut m);
    c.moe = Some(m);
    c
}

/// The model_type an export writes, or the words of its refusal.
type Expect = Result<&'static str, &'static [&'static str]>;

/// What no transformers class holds is refused, naming why; the laptop recipe's kind of policy
/// (Llama attention, experts everywhere) is a Mixtral, a q/k-normed one with dense layers a
/// Qwen3-MoE. Checkpoints of a refused policy still round-trip.
#[test]
fn export_refuses_what_no_transformers_class_holds() {
    tch::set_num_threads(1);
    let cases: Vec<(&str, ModelConfig, Expect)> = vec![
        ("llama attention, experts everywhere", moe_cfg(|_, _| {}), Ok("mixtral")),
        (
            "q/k norm, leading dense layer, no renormalisation",
            moe_cfg(|c, m| {
                c.qk_norm = true;
                m.dense_layers = 1;
                m.norm_topk = false;
            }),
            Ok("qwen3_moe"),
        ),
        (
            "shared expert",
            moe_cfg(|_, m| m.shared_expert_d_ff = 8),
            Err(&["neither qwen3_moe nor mixtral has a shared expert (shared_expert_d_ff = 8)"]),
        ),
        (
            "sigmoid gating",
            moe_cfg(|c, m| {
                c.qk_norm = true;
                m.gating = miles_runtime::Gating::Sigmoid;
            }),
            Err(&["sigmoid gating"]),
        ),
        (
            "llama attention with a dense layer",
            moe_cfg(|_, m| m.dense_layers = 1),
            Err(&["qwen3_moe: no q/k norm", "mixtral: dense layers [0]"]),
        ),
        (
            "llama attention without renormalisation",
            moe_cfg(|_, m| m.norm_topk = false),
            Err(&["qwen3_moe: no q/k norm", "mixtral: norm_topk = false"]),
        ),
        (
            "qwen2 biases",
            moe_cfg(|c, _| {
                c.qkv_bias = true;
            }),
            Err(&["q/k/v biases on but an o_proj bias off", "mixtral: attention biases"]),
        ),
    ];
    let (tokens, valid, positions, _) = miles_tch::model::left_pad(&[vec![1, 5, 6, 7], vec![1, 8, 9]]);
    for (case, cfg, want) in cases {
        let p = Policy::init(&cfg, 4);
        let out = temp(&format!("refuse-{}", case.replace([' ', ',', '/'], "-")));
        let f = |q: &Policy| tch::no_grad(|| q.forward(&tokens, &positions, &valid, None));
        match want {
            Ok(model_type) => {
                p.export_hf(&out, None).unwrap();
                assert_eq!(json(&out.join("config.json"))["model_type"], model_type, "{case}");
                assert!(f(&Policy::load(&out).unwrap()).equal(&f(&p)), "{case}");
            }
            Err(words) => {
                let e = p.export_hf(&out, None).unwrap_err();
                assert!(
                    e.message.contains("no transformers architecture holds this mixture of experts"),
                    "{case}: {}",
                    e.message
                );
                for w in words {
                    assert!(e.message.contains(w), "{case}: `{}` lacks `{w}`", e.message);
                }
                assert!(!out.exists(), "{case}: a refused export leaves nothing");
                std::fs::create_dir_all(&out).unwrap();
                p.save(&out).unwrap();
                assert!(!out.join("config.json").exists() && out.join(miles_tch::model::MODEL_CONFIG_FILE).exists());
                assert!(f(&Policy::load(&out).unwrap()).equal(&f(&p)), "{case}: checkpoint round trip");
            }
        }
        let _ = std::fs::remove_dir_all(&out);
    }
}

fn lora(targets: &[&str]) -> LoraSpec {
    LoraSpec {
        rank: 4,
        alpha: 8.0,
        dropout: 0.0,
        target_modules: targets.iter().map(|s| s.to_string()).collect(),
        init_seed: 3,
        adapters: Vec::new(),
        init: None,
    }
}

/// A LoRA run on a loaded MoE checkpoint exports the merged model as its own architecture, with
/// the PEFT adapter and the frozen base beside it; base + adapter = merged = the trained policy.
#[test]
fn lora_on_an_moe_checkpoint_exports_merged_base_and_adapter() {
    tch::set_num_threads(1);
    for (name, arch) in FIXTURES {
        let (policy, meta) = Policy::load_hf(&fixture(name), None).unwrap();
        let mut spec: miles_runtime::TrainSpec =
            serde_json::from_str(r#"{"lr": 0.05, "micro_batch": 2, "global_batch": 2}"#).unwrap();
        spec.lora = Some(lora(&["q_proj", "v_proj", "o_proj"]));
        let mut tr = TchTrainer::new(policy, spec);
        let batch = vec![
            common::trajectory(vec![11, 40, 7], vec![99, 5, 2], 1.0, 1.0),
            common::trajectory(vec![5, 300], vec![42, 8], 0.0, -1.0),
        ];
        for _ in 0..2 {
            tr.train_rl(&batch, &[0.05], 1.0).unwrap();
        }
        let root = temp(&format!("lora-{name}"));
        std::fs::create_dir_all(&root).unwrap();
        let dir = root.join("model");
        tr.policy.export_hf(&dir, Some(&meta)).unwrap();
        let (merged, mm) = Policy::load_hf(&dir, None).unwrap();
        let (base, bm) = Policy::load_hf(&dir.join("base"), None).unwrap();
        assert_eq!((mm.architecture, bm.architecture), (arch, arch));
        assert_eq!(header(&dir.join("model.safetensors")), header(&fixture(name).join("model.safetensors")));
        let mut adapted = base.deep_copy();
        adapted.set_adapters(vec![miles_tch::lora::read_peft(&dir.join("adapter"), &base.cfg).unwrap()]);
        let r = reference(name);
        let f = |p: &Policy| r.forward(p);
        let want = f(&tr.policy);
        assert!(max_err(&f(&merged), &want, &r.mask) < 1e-4, "{name}: merged = adapted policy");
        assert!(max_err(&f(&adapted), &want, &r.mask) < 1e-5, "{name}: base + PEFT adapter = adapted policy");
        assert!(max_err(&f(&base), &want, &r.mask) > 1e-4, "{name}: the adapter changed the model");
        let _ = std::fs::remove_dir_all(&root);
    }
}

/// transformers itself reloads an exported MoE directory and computes our logits (run where a
/// Python with transformers is found: bench/out/trl-venv, or `MILES_HF_PYTHON`).
#[test]
fn transformers_reloads_an_exported_moe_directory() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let python = match std::env::var_os("MILES_HF_PYTHON") {
        Some(p) => PathBuf::from(p),
        None => root.join("bench/out/trl-venv/bin/python"),
    };
    if !python.exists() {
        eprintln!("skipped: no Python with transformers ({} absent; set MILES_HF_PYTHON)", python.display());
        return;
    }
    tch::set_num_threads(1);
    let seeded = moe_cfg(|c, m| {
        c.vocab_size = 64;
        c.qk_norm = true;
        m.dense_layers = 1;
        m.mlp_only_layers = vec![2];
        m.norm_topk = false;
        c.n_layers = 4;
    });
    let cases: Vec<(String, Policy, Option<miles_tch::hf::HfMeta>)> = FIXTURES
        .iter()
        .map(|(name, _)| {
            let (p, meta) = Policy::load_hf(&fixture(name), None).unwrap();
            perturb(&p, 0.003, 3);
            (name.to_string(), p, Some(meta))
        })
        .chain([
            ("seeded-qwen3_moe".to_string(), Policy::init(&seeded, 5), None),
            ("seeded-mixtral".to_string(), Policy::init(&moe_cfg(|c, _| c.vocab_size = 64), 5), None),
        ])
        .collect();
    for (name, p, meta) in cases {
        let dir = temp(&format!("py-{name}"));
        std::fs::create_dir_all(&dir).unwrap();
        let model = dir.join("model");
        p.export_hf(&model, meta.as_ref()).unwrap();
        let (tokens, valid, positions, _) = miles_tch::model::left_pad(&[vec![1, 5, 6, 7, 9, 3], vec![2, 8, 9]]);
        let logits = tch::no_grad(|| p.forward(&tokens, &positions, &valid, None));
        let ours = dir.join("ours.safetensors");
        let named = [
            ("input_ids", tokens),
            ("attention_mask", valid.to_kind(Kind::Int64)),
            ("position_ids", positions),
            ("logits", logits),
        ];
        Tensor::write_safetensors(&named, &ours).unwrap();
        let o = std::process::Command::new(&python)
            .arg(root.join("scripts/check-hf-export.py"))
            .arg(&model)
            .arg("--compare")
            .arg(&ours)
            .output()
            .unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        eprintln!("{name}: {}", text.lines().filter(|l| l.contains("max |logits")).collect::<Vec<_>>().join(" "));
        assert!(o.status.success(), "{name}: check-hf-export.py failed:\n{text}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// A GRPO run from the Mixtral directory (its tokenizer, its weights) with R3 replay and a bf16
/// engine: routing is recorded and replayed every step, checkpoints reload through the Hugging
/// Face reader, and the final model is a MixtralForCausalLM equal to the last checkpoint.
#[test]
fn an_rl_run_from_a_mixtral_directory_replays_routes_and_exports_mixtral() {
    let dir = temp("run");
    std::fs::create_dir_all(&dir).unwrap();
    let model_dir = fixture("mixtral");
    let (policy, _) = Policy::load_hf(&model_dir, Some(32)).unwrap();
    let mut s = miles_runtime::RunSpec::from_json(include_str!("../../../runtime/tests/data/tiny.json")).unwrap();
    s.steps = 2;
    s.model = policy.cfg.clone();
    s.hf = Some(miles_runtime::HfModelSpec { path: model_dir.clone() });
    s.sft = None;
    s.rollout.max_new_tokens = 3;
    s.rollout.precision = miles_runtime::Precision::Bf16;
    s.rollout.r3 = Some(miles_runtime::R3Spec { replay: true, id: RouteId::U8 });
    let out = dir.join("out");
    let mut o = miles_runtime::RunOptions::new(&out);
    o.progress = miles_runtime::ProgressMode::Off;
    o.threads = Some(1);
    let r = miles_tch::run(&s, &o).unwrap();
    assert_eq!(r.steps_done, 2);
    let rows: Vec<serde_json::Value> = std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|v: &serde_json::Value| v.get("r3/replayed").is_some())
        .collect();
    assert_eq!(rows.len(), 2, "every step trained with R3");
    let num = |row: &serde_json::Value, k: &str| row[k].as_f64().unwrap_or_else(|| panic!("{k} in {row}"));
    for row in &rows {
        assert_eq!(
            (num(row, "r3/replayed"), num(row, "r3/dropped"), num(row, "r3/route_mismatch")),
            (1.0, 0.0, 0.0),
            "{row}"
        );
        assert!(num(row, "r3/tokens") > 0.0 && num(row, "r3/router_disagreement") >= 0.0, "{row}");
    }
    let model = out.join("model");
    assert_eq!(json(&model.join("config.json"))["architectures"][0], "MixtralForCausalLM");
    assert_eq!(header(&model.join("model.safetensors")), header(&model_dir.join("model.safetensors")));
    let (exported, _) = Policy::load_hf(&model, Some(32)).unwrap();
    let (trained, _) = Policy::load_hf(&out.join("checkpoints/step-00000002"), Some(32)).unwrap();
    let (tokens, valid, positions, _) = miles_tch::model::left_pad(&[vec![0, 17, 42, 99, 7, 250]]);
    let f = |p: &Policy| tch::no_grad(|| p.forward(&tokens, &positions, &valid, None));
    assert!(f(&exported).equal(&f(&trained)), "the export is the last checkpoint");
    assert!(!f(&exported).equal(&f(&policy)), "training changed the model");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A run refuses a directory whose config.json no longer says the experts `miles check` read.
#[test]
fn a_changed_moe_config_is_a_difference_from_the_spec() {
    use miles_tch::hf::first_difference;
    let p = fixture("qwen3_moe").join("config.json");
    let loaded = parse_config(&p, &std::fs::read_to_string(&p).unwrap()).unwrap().model;
    assert_eq!(first_difference(&loaded, &loaded), None);
    let with = |f: fn(&mut ModelConfig)| {
        let mut s = loaded.clone();
        f(&mut s);
        first_difference(&loaded, &s)
    };
    assert_eq!(with(|s| s.moe = None), Some("experts"));
    assert_eq!(with(|s| s.moe.as_mut().unwrap().top_k = 1), Some("top_k"));
    assert_eq!(with(|s| s.moe.as_mut().unwrap().expert_d_ff = 8), Some("expert_d_ff"));
    assert_eq!(with(|s| s.moe.as_mut().unwrap().mlp_only_layers = vec![]), Some("moe layers"));
    assert_eq!(with(|s| s.moe.as_mut().unwrap().norm_topk = true), Some("norm_topk"));
    // The load-balancing coefficient is the directory's own.
    assert_eq!(with(|s| s.moe.as_mut().unwrap().aux_loss_coef = 0.5), None);
}
