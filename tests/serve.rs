//! `miles serve MODEL_DIR`: the SGLang-compatible HTTP API over the embedded engine, driven with
//! the same client a rollout stage uses for `engine = sglang { url = ... }`.

mod common;

use common::process::{output, temp_dir, Proc};
use common::tiny::tiny_recipe;
use miles_runtime::{RolloutEngine, SamplingParams};
use miles_workers::http::{get_json, post_json, request, HttpEngine};
use serde_json::json;
use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::Duration;

/// A run of the tiny recipe ends well within this.
const LIMIT: Duration = Duration::from_secs(300);

#[test]
fn serve_speaks_sglang_generate_weights_pause_and_counts_prefix_reuse() {
    let dir = temp_dir("serve");
    let r = dir.join("tiny.miles");
    let recipe = tiny_recipe("transport = local", 2, &[]);
    std::fs::write(&r, &recipe).unwrap();
    let out = dir.join("out");
    let run = |args: &[&str]| {
        output(common::process::miles().arg("run").args(args).args(["--threads", "1", "--progress", "off"]), LIMIT)
    };
    let o = run(&[r.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let model = out.join("model");

    // Killed with everything it started when the test ends, passed or failed.
    let mut server = Proc::spawn(
        common::process::miles()
            .args(["serve", model.to_str().unwrap(), "--bind", "127.0.0.1:0", "--threads", "1"])
            .stdin(Stdio::null())
            .stderr(Stdio::piped()),
    );
    let mut line = String::new();
    BufReader::new(server.child().stderr.take().unwrap()).read_line(&mut line).unwrap();
    let base = line.split_whitespace().find(|w| w.starts_with("http://")).unwrap().trim_end_matches(')').to_string();
    let t = Duration::from_secs(30);

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
    let params = SamplingParams::plain(3, 3);
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
    let recipe = recipe
        .replace("generate(warmup) {", &format!("generate(warmup) {{\n        engine = sglang {{ url = \"{base}\" }}"))
        .replace("stop = 2.steps", "stop = 3.steps")
        // Servers given by URL load each version from disk: no transport to choose.
        .replace("{ transport = local }", "{}");
    std::fs::write(&r2, recipe).unwrap();
    let o = run(&[r2.to_str().unwrap(), "--out", dir.join("out-http").to_str().unwrap()]);
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
    // Killing `miles` alone (not its group) ends the `miles-engine` it started: nothing keeps
    // serving, or training, behind a dead front end.
    let engine_pids =
        |p: &Proc| -> Vec<String> { p.left_behind().into_iter().filter(|p| p.contains("miles-engine")).collect() };
    assert!(!engine_pids(&server).is_empty(), "miles serve runs in miles-engine");
    // SAFETY: SIGKILL to the one `miles` process this test started.
    unsafe {
        libc::kill(server.id() as i32, libc::SIGKILL);
    }
    let _ = server.child().wait();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !engine_pids(&server).is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(engine_pids(&server), Vec::<String>::new(), "miles-engine outlived its killed parent");
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
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
