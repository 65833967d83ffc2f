//! `miles serve MODEL_DIR`: the SGLang-compatible HTTP API over the embedded engine, driven with
//! the same client a rollout stage uses for `engine = sglang { url = ... }`.

use miles_runtime::{RolloutEngine, SamplingParams};
use miles_workers::http::{get_json, post_json, request, HttpEngine};
use serde_json::json;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

const RECIPE: &str = r#"
import std/tasks/arith
model policy = transformer { layers = 1, d_model = 32, heads = 2, vocab = arith.vocab, max_len = 12 }
cluster laptop = local { cpus = 2 }
recipe tiny on laptop {
    warmup = sft(policy) { data = arith.addition { digits = 1 }, steps = 20.steps, lr = 3e-3 }
    rollout = generate(warmup) {
        prompts = arith.addition { digits = 1, split = train }
        samples_per_prompt = 4
        max_prompt_tokens = 6.tokens
        max_new_tokens = 3.tokens
    }
    reward = exact_match(rollout)
    train = grpo(rollout, reward) { rollout_batch = 8, global_batch = 32, micro_batch = 32, lr = 1e-3 }
    sync = weights(train -> rollout) { transport = local }
    stop = 2.steps
}
"#;

#[test]
fn serve_speaks_sglang_generate_weights_pause_and_counts_prefix_reuse() {
    let dir = std::env::temp_dir().join(format!("miles-serve-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let r = dir.join("tiny.miles");
    std::fs::write(&r, RECIPE).unwrap();
    let out = dir.join("out");
    let o = Command::new(env!("CARGO_BIN_EXE_miles"))
        .args(["run", r.to_str().unwrap(), "--out", out.to_str().unwrap(), "--threads", "1", "--progress", "off"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let model = out.join("model");

    let mut server = Command::new(env!("CARGO_BIN_EXE_miles"))
        .args(["serve", model.to_str().unwrap(), "--bind", "127.0.0.1:0", "--threads", "1"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(server.stderr.take().unwrap()).read_line(&mut line).unwrap();
    let base = line.split_whitespace().find(|w| w.starts_with("http://")).unwrap().trim_end_matches(')').to_string();
    let t = Duration::from_secs(30);

    let result = std::panic::catch_unwind(|| {
        assert_eq!(request("GET", &format!("{base}/health"), None, t).unwrap().0, 200);
        // One request: SGLang's answer shape.
        let v = post_json(
            &format!("{base}/generate"),
            &json!({"input_ids": [5, 6, 12, 7, 13], "sampling_params": {"max_new_tokens": 3, "temperature": 0}, "return_logprob": true}),
            t,
        )
        .unwrap();
        let ids = v["output_ids"].as_array().unwrap();
        assert!(!ids.is_empty() && ids.len() <= 3, "{v}");
        let meta = &v["meta_info"];
        assert!(["stop", "length"].contains(&meta["finish_reason"]["type"].as_str().unwrap()), "{v}");
        assert_eq!(meta["prompt_tokens"], 5);
        assert_eq!(meta["output_token_logprobs"].as_array().unwrap().len(), ids.len());
        assert_eq!(meta["cached_tokens"], 0);
        // The same prompt again is a full prefix hit; a group of n reuses it n-1 more times.
        let v = post_json(
            &format!("{base}/generate"),
            &json!({"input_ids": [5, 6, 12, 7, 13], "sampling_params": {"max_new_tokens": 3, "n": 3}}),
            t,
        )
        .unwrap();
        assert_eq!(v.as_array().unwrap().len(), 3);
        assert_eq!(v[0]["meta_info"]["cached_tokens"], 5);
        let info = get_json(&format!("{base}/get_server_info"), t).unwrap();
        assert_eq!(info["prefix_cache"]["cached_tokens"], 15);
        assert_eq!(info["prefix_cache"]["prompt_tokens"], 20);

        // The client a rollout stage uses, with a weight update through /update_weights_from_disk.
        let spec: miles_runtime::RunSpec =
            serde_json::from_str(&std::fs::read_to_string(out.join("spec.json")).unwrap()).unwrap();
        let mut engine = HttpEngine::new(vec![base.clone()], dir.join("weights"), spec.model.clone(), t);
        let params = SamplingParams {
            max_new_tokens: 3,
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            stop_tokens: vec![2],
            greedy: false,
            seed: 3,
        };
        let s = engine.generate(&[vec![5, 6, 12, 6, 13], vec![7, 12, 7, 13]], 2, &params).unwrap();
        assert_eq!(s.iter().map(|x| x.prompt_index).collect::<Vec<_>>(), vec![0, 0, 1, 1]);
        let mut w = miles_runtime::WeightSnapshot { version: 7, tensors: Vec::new() };
        // The trained weights, read back from the run's safetensors through the server's own loader.
        let names = safetensor_names(&model.join("model.safetensors"));
        assert!(!names.is_empty());
        w.tensors = read_safetensors(&model.join("model.safetensors"));
        engine.load_weights(&w).unwrap();
        let info = get_json(&format!("{base}/model_info"), t).unwrap();
        assert_eq!(info["weight_version"], "7");
        let s = engine.generate(&[vec![5, 6, 12, 6, 13]], 1, &params).unwrap();
        assert_eq!(s[0].weight_version, 7);

        // A whole run whose rollout stage is this server (`engine = sglang { url = ... }`).
        let r2 = dir.join("http.miles");
        let recipe = RECIPE
            .replace(
                "generate(warmup) {",
                &format!("generate(warmup) {{\n        engine = sglang {{ url = \"{base}\" }}"),
            )
            .replace("stop = 2.steps", "stop = 3.steps");
        std::fs::write(&r2, recipe).unwrap();
        let o = Command::new(env!("CARGO_BIN_EXE_miles"))
            .args([
                "run",
                r2.to_str().unwrap(),
                "--out",
                dir.join("out-http").to_str().unwrap(),
                "--threads",
                "1",
                "--progress",
                "off",
            ])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{err}");
        assert!(err.contains("rollout on SGLang-compatible server(s)"), "{err}");
        let info = get_json(&format!("{base}/model_info"), t).unwrap();
        assert_ne!(info["weight_version"], "7", "the run pushed its own weights: {info}");

        // Paused: a request waits; continued, it is answered.
        post_json(&format!("{base}/pause_generation"), &json!({}), t).unwrap();
        let b2 = base.clone();
        let h = std::thread::spawn(move || {
            post_json(
                &format!("{b2}/generate"),
                &json!({"input_ids": [5, 12, 5, 13], "sampling_params": {"max_new_tokens": 2}}),
                Duration::from_secs(30),
            )
        });
        std::thread::sleep(Duration::from_millis(300));
        assert!(!h.is_finished(), "generation must wait while paused");
        post_json(&format!("{base}/continue_generation"), &json!({}), t).unwrap();
        assert!(h.join().unwrap().is_ok());
        assert_eq!(request("POST", &format!("{base}/init_weights_update_group"), Some(&json!({})), t).unwrap().0, 501);
        assert_eq!(request("POST", &format!("{base}/generate"), Some(&json!({"text": "1+1="})), t).unwrap().0, 400);
    });
    let _ = server.kill();
    let _ = server.wait();
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(p) = result {
        std::panic::resume_unwind(p);
    }
}

/// The tensor names of a safetensors file.
fn safetensor_names(path: &std::path::Path) -> Vec<String> {
    read_safetensors(path).into_iter().map(|t| t.name).collect()
}

/// A minimal F32 safetensors reader (the format: u64 header length, JSON header, raw data).
fn read_safetensors(path: &std::path::Path) -> Vec<miles_runtime::NamedTensor> {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let data = &bytes[8 + n..];
    let mut out: Vec<(usize, miles_runtime::NamedTensor)> = header
        .iter()
        .filter(|(k, _)| *k != "__metadata__")
        .map(|(k, v)| {
            let off: Vec<usize> =
                v["data_offsets"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect();
            let shape = v["shape"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect();
            let floats =
                data[off[0]..off[1]].chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
            (off[0], miles_runtime::NamedTensor { name: k.clone(), shape, data: floats })
        })
        .collect();
    out.sort_by_key(|x| x.0);
    out.into_iter().map(|x| x.1).collect()
}
