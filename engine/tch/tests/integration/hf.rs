//! Hugging Face directories: our forward against transformers' reference logits for every
//! fixture architecture (tests/fixtures/hf, made by scripts/make-hf-fixtures.py), export and
//! reload, and the errors bad directories give.

use crate::common::hf::{
    assert_carried, assert_matches_reference, assert_refused, copy_dir, edit_config, fixture, perturb, reference, temp,
    Bad,
};
use miles_tch::hf::{parse_config, Architecture};
use miles_tch::model::{KvCache, Policy, SlotCache};
use std::path::{Path, PathBuf};
use tch::{Kind, Tensor};

const ARCHS: [(&str, Architecture); 3] =
    [("llama", Architecture::Llama), ("qwen2", Architecture::Qwen2), ("qwen3", Architecture::Qwen3)];

#[test]
fn forward_matches_transformers_for_every_fixture_architecture() {
    tch::set_num_threads(1);
    for (arch, kind) in ARCHS {
        let (policy, meta) = Policy::load_hf(&fixture(arch), None).unwrap();
        assert_eq!(meta.architecture, kind);
        let (r, _) = assert_matches_reference(arch, &policy);
        let t = r.ids.size()[1];

        // Sampling paths: a KV-cached prefill + decode, and continuous batching slots, on row 0.
        let row = r.ids.narrow(0, 0, 1);
        let pos = r.pos.narrow(0, 0, 1);
        let valid = r.mask.narrow(0, 0, 1);
        let want = r.logits.narrow(0, 0, 1);
        let mut cache = KvCache::new(&policy, 1, t);
        let pre = tch::no_grad(|| {
            policy.forward(
                &row.narrow(1, 0, t - 1),
                &pos.narrow(1, 0, t - 1),
                &valid.narrow(1, 0, t - 1),
                Some(&mut cache),
            )
        });
        let dec = tch::no_grad(|| {
            policy.forward(&row.narrow(1, t - 1, 1), &pos.narrow(1, t - 1, 1), &valid, Some(&mut cache))
        });
        let cached = Tensor::cat(&[pre, dec], 1);
        let e = (&cached - &want).abs().max().double_value(&[]);
        assert!(e <= 1e-4, "{arch}: KV-cached forward differs by {e}");
        let mut slots = SlotCache::new(&policy, 2);
        let rows = Tensor::from_slice(&[1i64]);
        let s1 = tch::no_grad(|| {
            policy.forward_slots(&row.narrow(1, 0, t - 1), &pos.narrow(1, 0, t - 1), &rows, &mut slots)
        });
        let s2 = tch::no_grad(|| {
            policy.forward_slots(&row.narrow(1, t - 1, 1), &pos.narrow(1, t - 1, 1), &rows, &mut slots)
        });
        let e = (&Tensor::cat(&[s1, s2], 1) - &want).abs().max().double_value(&[]);
        assert!(e <= 1e-4, "{arch}: slot forward differs by {e}");
    }
}

#[test]
fn meta_carries_the_special_tokens_and_tokenizer_files() {
    let (p, meta) = Policy::load_hf(&fixture("llama"), Some(64)).unwrap();
    assert_eq!(p.cfg.max_len, 64);
    assert_eq!(meta.max_position_embeddings, 128);
    assert_eq!(meta.dtype.as_deref(), Some("float32"));
    // config.json's eos, then generation_config.json's end-of-turn id.
    assert_eq!(meta.eos_token_ids, vec![1, 4]);
    assert_eq!(meta.bos_token_id, Some(0));
    for f in ["tokenizer.json", "tokenizer_config.json", "generation_config.json"] {
        assert!(meta.carried_files.iter().any(|c| c == f), "{f}");
    }
    let (q, meta) = Policy::load_hf(&fixture("qwen2"), None).unwrap();
    assert_eq!(meta.dtype.as_deref(), Some("bfloat16"));
    assert!(q.cfg.tie_embeddings && q.cfg.qkv_bias && !q.cfg.o_bias);
    assert!(!q.params().iter().any(|(n, _)| n == "lm_head.weight"));
    let (q3, _) = Policy::load_hf(&fixture("qwen3"), None).unwrap();
    assert_eq!((q3.cfg.head_dim, q3.cfg.head_dim()), (Some(24), 24));
    assert!(q3.cfg.qk_norm && !q3.cfg.tie_embeddings);
}

#[test]
fn export_then_reload_gives_identical_logits() {
    tch::set_num_threads(1);
    for (arch, _) in ARCHS {
        let (policy, meta) = Policy::load_hf(&fixture(arch), None).unwrap();
        // The export must carry the changed values (and the forward must read them: no stale
        // copies of a parameter).
        perturb(&policy, 0.01, 7);
        let out = temp(&format!("export-{arch}"));
        policy.export_hf(&out, Some(&meta)).unwrap();
        // Twice: the second replaces the first.
        policy.export_hf(&out, Some(&meta)).unwrap();
        let (again, meta2) = Policy::load_hf(&out, None).unwrap();
        assert_eq!(again.cfg, policy.cfg, "{arch}");
        assert_eq!(meta2.architecture, meta.architecture);
        assert_eq!(meta2.dtype.as_deref(), Some("float32"));
        let r = reference(arch);
        let a = r.forward(&policy);
        assert!(
            bool::try_from(a.eq_tensor(&r.forward(&again)).all()).unwrap(),
            "{arch}: logits changed through export"
        );
        let fresh = r.forward(&policy.deep_copy());
        assert!(bool::try_from(a.eq_tensor(&fresh).all()).unwrap(), "{arch}: forward read a stale parameter");
        assert_carried(&meta, &out, arch);
        let leftovers: Vec<_> = std::fs::read_dir(out.parent().unwrap())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with(&format!(".miles-hf-export-{arch}-")))
            .collect();
        assert!(leftovers.is_empty(), "{arch}: temp dirs left behind");
        let _ = std::fs::remove_dir_all(&out);
    }
}

#[test]
fn a_policy_without_a_source_exports_a_loadable_directory() {
    tch::set_num_threads(1);
    let cfg: miles_runtime::ModelConfig = serde_json::from_str(
        r#"{"vocab_size": 40, "d_model": 16, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1, "d_ff": 24, "max_len": 32,
            "head_dim": 12, "qkv_bias": true, "o_bias": true, "qk_norm": true, "tie_embeddings": true,
            "rope_scaling": {"type": "linear", "factor": 2.0}}"#,
    )
    .unwrap();
    let p = Policy::init(&cfg, 3);
    let out = temp("fresh");
    p.export_hf(&out, None).unwrap();
    let (q, meta) = Policy::load_hf(&out, None).unwrap();
    assert_eq!(meta.architecture, Architecture::Qwen3);
    assert_eq!(q.cfg, cfg);
    let tok = Tensor::from_slice(&[3i64, 7, 9, 1]).view([1, 4]);
    let pos = Tensor::arange(4, (Kind::Int64, tch::Device::Cpu)).view([1, 4]);
    let valid = Tensor::ones([1, 4], (Kind::Bool, tch::Device::Cpu));
    let a = tch::no_grad(|| p.forward(&tok, &pos, &valid, None));
    let b = tch::no_grad(|| q.forward(&tok, &pos, &valid, None));
    assert!(bool::try_from(a.eq_tensor(&b).all()).unwrap());
    let _ = std::fs::remove_dir_all(&out);
}

fn drop_tensor(file: &Path, name: &str) {
    let kept: Vec<(String, Tensor)> =
        Tensor::read_safetensors(file).unwrap().into_iter().filter(|(n, _)| n != name).collect();
    Tensor::write_safetensors(&kept, file).unwrap();
}

const BAD: &[Bad] = &[
    (
        "unknown architecture",
        "qwen2",
        |d| {
            edit_config(d, |c| {
                c.insert("architectures".into(), serde_json::json!(["GPT2LMHeadModel"]));
            })
        },
        &["config.json", "`architectures`", "GPT2LMHeadModel", "Qwen3ForCausalLM"],
    ),
    (
        "unknown model_type",
        "qwen2",
        |d| {
            edit_config(d, |c| {
                c.remove("architectures");
                c.insert("model_type".into(), "gemma".into());
            })
        },
        &["config.json", "`model_type`", "gemma"],
    ),
    (
        "unsupported rope type",
        "llama",
        |d| {
            edit_config(d, |c| {
                c.insert("rope_scaling".into(), serde_json::json!({"rope_type": "yarn", "factor": 4.0}));
            })
        },
        &["config.json", "`rope_scaling`", "yarn"],
    ),
    (
        "llama3 rope without its factors",
        "llama",
        |d| {
            edit_config(d, |c| {
                c.insert("rope_scaling".into(), serde_json::json!({"rope_type": "llama3", "factor": 8.0}));
            })
        },
        &["config.json", "low_freq_factor"],
    ),
    (
        "not silu",
        "qwen3",
        |d| {
            edit_config(d, |c| {
                c.insert("hidden_act".into(), "gelu".into());
            })
        },
        &["config.json", "`hidden_act`", "gelu"],
    ),
    (
        "sliding window",
        "qwen2",
        |d| {
            edit_config(d, |c| {
                c.insert("use_sliding_window".into(), true.into());
            })
        },
        &["config.json", "use_sliding_window"],
    ),
    (
        "wrong field type",
        "qwen3",
        |d| {
            edit_config(d, |c| {
                c.insert("hidden_size".into(), "64".into());
            })
        },
        &["config.json", "`hidden_size`"],
    ),
    (
        "missing field",
        "qwen3",
        |d| {
            edit_config(d, |c| {
                c.remove("num_hidden_layers");
            })
        },
        &["config.json", "`num_hidden_layers`"],
    ),
    (
        "heads not a multiple of kv heads",
        "qwen3",
        |d| {
            edit_config(d, |c| {
                c.insert("num_key_value_heads".into(), 3.into());
            })
        },
        &["config.json", "num_key_value_heads"],
    ),
    (
        "config not json",
        "qwen3",
        |d| std::fs::write(d.join("config.json"), "{oops").unwrap(),
        &["config.json", "not valid JSON"],
    ),
    ("no config", "qwen3", |d| std::fs::remove_file(d.join("config.json")).unwrap(), &["cannot read", "config.json"]),
    (
        "shape disagrees with config",
        "qwen3",
        |d| {
            edit_config(d, |c| {
                c.insert("intermediate_size".into(), 97.into());
            })
        },
        &["model.safetensors", "model.layers.0.mlp.gate_proj.weight", "[96, 64]", "[97, 64]"],
    ),
    (
        "vocab disagrees with config",
        "llama",
        |d| {
            edit_config(d, |c| {
                c.insert("vocab_size".into(), 601.into());
            })
        },
        &["model-00001-of-00004.safetensors", "model.embed_tokens.weight"],
    ),
    (
        "missing tensor",
        "qwen3",
        |d| drop_tensor(&d.join("model.safetensors"), "model.layers.1.self_attn.k_norm.weight"),
        &["model.layers.1.self_attn.k_norm.weight", "missing", "Qwen3ForCausalLM"],
    ),
    (
        "unexpected tensor",
        "qwen3",
        |d| {
            edit_config(d, |c| {
                c.insert("num_hidden_layers".into(), 1.into());
            })
        },
        &["model.safetensors", "unexpected tensor", "model.layers.1."],
    ),
    (
        "missing shard",
        "llama",
        |d| std::fs::remove_file(d.join("model-00002-of-00004.safetensors")).unwrap(),
        &["model-00002-of-00004.safetensors", "missing", "model.safetensors.index.json"],
    ),
    (
        "corrupt shard",
        "llama",
        |d| {
            let p = d.join("model-00003-of-00004.safetensors");
            let b = std::fs::read(&p).unwrap();
            std::fs::write(&p, &b[..b.len() / 2]).unwrap();
        },
        &["model-00003-of-00004.safetensors", "not a valid safetensors file"],
    ),
    (
        "garbage weights",
        "qwen2",
        |d| std::fs::write(d.join("model.safetensors"), b"\x08\x00\x00\x00\x00\x00\x00\x00{\"a\":1}").unwrap(),
        &["model.safetensors", "not a valid safetensors file"],
    ),
    (
        "tensor the index promises is absent",
        "llama",
        |d| drop_tensor(&d.join("model-00004-of-00004.safetensors"), "model.norm.weight"),
        &["model-00004-of-00004.safetensors", "model.norm.weight", "listed"],
    ),
    (
        "no weights at all",
        "qwen3",
        |d| std::fs::remove_file(d.join("model.safetensors")).unwrap(),
        &["model.safetensors.index.json", "pytorch_model.bin"],
    ),
];

#[test]
fn bad_directories_are_errors_naming_the_file_and_tensor() {
    assert_refused("bad", BAD);
    let e = Policy::load_hf(&fixture("llama"), Some(129)).err().unwrap();
    assert!(e.message.contains("max_len 129") && e.message.contains("config.json"), "{}", e.message);
}

#[test]
fn both_config_forms_give_the_same_model() {
    // The llama fixture is in the transformers 4.x form; the same model in the 5.x form.
    let p = Path::new("config.json");
    let v4 = std::fs::read_to_string(fixture("llama").join("config.json")).unwrap();
    let mut c: serde_json::Value = serde_json::from_str(&v4).unwrap();
    let m = c.as_object_mut().unwrap();
    let mut rp = m.remove("rope_scaling").unwrap();
    let theta = m.remove("rope_theta").unwrap();
    rp.as_object_mut().unwrap().insert("rope_theta".into(), theta);
    m.insert("rope_parameters".into(), rp);
    let dtype = m.remove("torch_dtype").unwrap();
    m.insert("dtype".into(), dtype);
    let a = parse_config(p, &v4).unwrap();
    let b = parse_config(p, &c.to_string()).unwrap();
    assert_eq!(a.model, b.model);
    assert_eq!(a.model.rope_theta, 500000.0);
    assert!(a.model.rope_scaling.is_some());
    // `type` (older) for `rope_type`; linear scaling; the legacy "default" type is no scaling.
    let lin = parse_config(p, r#"{"model_type": "mistral", "vocab_size": 8, "hidden_size": 8, "num_hidden_layers": 1,
        "num_attention_heads": 2, "intermediate_size": 8, "sliding_window": 16, "rope_scaling": {"type": "linear", "factor": 2}}"#).unwrap();
    assert_eq!(lin.architecture, Architecture::Mistral);
    assert_eq!(lin.model.rope_scaling, Some(miles_runtime::RopeScaling::Linear { factor: 2.0 }));
    assert_eq!((lin.model.max_len, lin.max_position_embeddings), (16, 131072));
    assert_eq!(lin.model.n_kv_heads, 2);
}

/// A safetensors file: `header` (JSON), then `data_len` bytes, the tail left sparse (a file
/// claiming gigabytes costs no disk).
fn crafted(path: &Path, header: &serde_json::Value, data_len: u64) {
    let h = header.to_string();
    let mut b = (h.len() as u64).to_le_bytes().to_vec();
    b.extend(h.as_bytes());
    let n = b.len() as u64;
    std::fs::write(path, &b).unwrap();
    std::fs::OpenOptions::new().write(true).open(path).unwrap().set_len(n + data_len).unwrap();
}

/// Hostile headers (issue #35): each is refused from the header alone, before a tensor is
/// allocated or the data read, naming the file and the tensor.
#[test]
fn hostile_safetensors_headers_are_refused_before_any_tensor_is_built() {
    use serde_json::json;
    let emb = "model.embed_tokens.weight";
    let huge = 1u64 << 34; // 16 GiB of f32 claimed, in a sparse 64 GiB file
    let cases: Vec<(&str, serde_json::Value, u64, Vec<String>)> = vec![
        (
            "huge shape over a few bytes",
            json!({emb: {"dtype": "F32", "shape": [1u64 << 20, 1u64 << 20], "data_offsets": [0, 16]}}),
            16,
            vec![emb.into(), "[1048576, 1048576] of F32 is 4398046511104 bytes".into()],
        ),
        (
            // A consistent header over a sparse file: refused by config.json's shape, the data
            // never read (reading it whole would take 64 GiB of memory).
            "huge shape the file backs",
            json!({emb: {"dtype": "F32", "shape": [huge, 1], "data_offsets": [0, huge * 4]}}),
            huge * 4,
            vec![emb.into(), format!("has shape [{huge}, 1], config.json implies")],
        ),
        (
            "offset beyond the file",
            json!({emb: {"dtype": "U8", "shape": [1u64 << 30], "data_offsets": [0, 1u64 << 30]}}),
            16,
            vec![emb.into(), "run past the end of the data (16 bytes)".into()],
        ),
        (
            "overflowing shape product",
            json!({emb: {"dtype": "F32", "shape": [1u64 << 62, 1u64 << 62], "data_offsets": [0, 16]}}),
            16,
            vec![emb.into(), "overflows a 64-bit byte count".into()],
        ),
    ];
    for (case, header, data_len, want) in cases {
        let dir = temp(&format!("hostile-{}", case.replace(' ', "-")));
        copy_dir(&fixture("qwen3"), &dir);
        let file = dir.join("model.safetensors");
        crafted(&file, &header, data_len);
        let t0 = std::time::Instant::now();
        let e = Policy::load_hf(&dir, None).err().unwrap_or_else(|| panic!("{case}: loaded"));
        assert!(t0.elapsed().as_secs_f64() < 5.0, "{case}: {:?}", t0.elapsed());
        assert_eq!(e.code, miles_runtime::E_CHECKPOINT, "{case}");
        for w in want.iter().map(String::as_str).chain([file.to_str().unwrap()]) {
            assert!(e.message.contains(w), "{case}: `{}` lacks `{w}`", e.message);
        }
        // The checkpoint reader refuses the same file with the same words.
        if data_len == 16 {
            let mut p = Policy::load(&fixture("qwen3")).unwrap();
            let e2 = p.load_tensors(&file).unwrap_err();
            assert!(e2.message.contains(&want[1]) && e2.message.contains(emb), "{case}: {}", e2.message);
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
    // A header length past the end of the file.
    let dir = temp("hostile-header-length");
    copy_dir(&fixture("qwen3"), &dir);
    let file = dir.join("model.safetensors");
    let mut b = std::fs::read(&file).unwrap();
    let claimed = b.len() as u64;
    b[..8].copy_from_slice(&claimed.to_le_bytes());
    std::fs::write(&file, &b).unwrap();
    let e = Policy::load_hf(&dir, None).err().unwrap();
    let want = format!("header length {claimed} runs past the end of the file ({claimed} bytes)");
    assert!(e.message.contains(&want) && e.message.contains(file.to_str().unwrap()), "{}", e.message);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Peak memory of loading a Hugging Face directory, old reader against new (issue #35). Each
/// step runs alone, in its own process (a process's peak only grows):
/// `MILES_MEM_STEP=make|old|new cargo test -p miles-tch --test integration hf::peak_memory -- --ignored --nocapture`.
/// `make` writes a Qwen3 of 33.5M parameters in bf16 (64 MiB) to `MILES_MEM_DIR` (`make32`: in
/// fp32, 128 MiB); `old` reads
/// it as the loader did before (the whole file, then every tensor, then fp32 copies); `new`
/// loads it with `Policy::load_hf`. Prints the peak resident memory above the process's own.
#[test]
#[ignore]
fn peak_memory_of_loading() {
    let dir = PathBuf::from(std::env::var("MILES_MEM_DIR").unwrap_or_else(|_| "/tmp/miles-mem-model".into()));
    let kib = |field: &str| -> i64 {
        let s = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = s.lines().find(|l| l.starts_with(field)).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    };
    let step = std::env::var("MILES_MEM_STEP").unwrap_or_default();
    let file = dir.join("model.safetensors");
    if step == "make" || step == "make32" {
        let _ = std::fs::remove_dir_all(&dir);
        copy_dir(&fixture("qwen3"), &dir);
        edit_config(&dir, |c| {
            c.insert("vocab_size".into(), (1u64 << 18).into());
        });
        let text = std::fs::read_to_string(dir.join("config.json")).unwrap();
        let hc = parse_config(&dir.join("config.json"), &text).unwrap();
        let p = Policy::init(&hc.model, 0);
        p.save(&dir).unwrap();
        if step == "make" {
            let bf16: Vec<(String, Tensor)> = Tensor::read_safetensors(&file)
                .unwrap()
                .into_iter()
                .map(|(n, t)| (n, t.to_kind(Kind::BFloat16)))
                .collect();
            Tensor::write_safetensors(&bf16, &file).unwrap();
        }
        std::fs::write(dir.join("config.json"), text).unwrap();
        println!("wrote {} ({} bytes)", file.display(), std::fs::metadata(&file).unwrap().len());
        return;
    }
    let before = kib("VmRSS:");
    let kept = match step.as_str() {
        "old" => {
            let read = Tensor::read_safetensors(&file).unwrap();
            let fp32: Vec<Tensor> = read.into_iter().map(|(_, t)| t.to_kind(Kind::Float)).collect();
            fp32.len()
        }
        "new" => Policy::load_hf(&dir, None).unwrap().0.cfg.n_layers,
        other => panic!("MILES_MEM_STEP={other:?}: make, old or new"),
    };
    let peak = kib("VmHWM:");
    println!("{step}: peak {} MiB above the {} MiB before ({kept})", (peak - before) / 1024, before / 1024);
}
