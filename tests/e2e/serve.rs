//! `miles serve MODEL_DIR`: the SGLang-compatible HTTP API over the embedded engine, driven with
//! the same client a rollout stage uses for `engine = sglang { url = ... }`.

use crate::common;

use common::process::{output, temp_dir, Proc};
use common::tiny::tiny_recipe;
use miles_runtime::{RolloutEngine, SamplingParams};
use miles_workers::http::{
    get_json, post_json, request, request_with_key, write_hf_checkpoint, HttpEngine, API_KEY_ENV,
};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

/// A run of the tiny recipe ends well within this.
const LIMIT: Duration = Duration::from_secs(300);

/// Trains the tiny recipe into `dir/out`: (the recipe text, the model directory, the run's spec).
fn train_tiny(dir: &Path) -> (String, PathBuf, miles_runtime::RunSpec) {
    let r = dir.join("tiny.miles");
    let recipe = tiny_recipe("transport = local", 2, &[]);
    std::fs::write(&r, &recipe).unwrap();
    let out = dir.join("out");
    let o = run(&[r.to_str().unwrap(), "--out", out.to_str().unwrap()], None);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let spec = serde_json::from_str(&std::fs::read_to_string(out.join("spec.json")).unwrap()).unwrap();
    (recipe, out.join("model"), spec)
}

/// `miles run ARGS`, with `key` (or nothing) as MILES_API_KEY.
fn run(args: &[&str], key: Option<&str>) -> std::process::Output {
    let mut c = common::process::miles();
    c.arg("run").args(args).args(["--threads", "1", "--progress", "off"]).env_remove(API_KEY_ENV);
    if let Some(k) = key {
        c.env(API_KEY_ENV, k);
    }
    output(&mut c, LIMIT)
}

/// The tiny recipe with its rollout stage on the server at `base`, running `steps` steps.
fn http_recipe(recipe: &str, base: &str, steps: u32) -> String {
    recipe
        .replace("generate(warmup) {", &format!("generate(warmup) {{\n        engine = sglang {{ url = \"{base}\" }}"))
        .replace("stop = 2.steps", &format!("stop = {steps}.steps"))
        // Servers given by URL load each version from disk: no transport to choose.
        .replace("{ transport = local }", "{}")
}

/// Starts `miles serve ARGS` with `key` (or nothing) as MILES_API_KEY; returns it (killed with
/// everything it started when dropped, passed or failed) and its base URL.
fn start_server(args: &[&str], key: Option<&str>) -> (Proc, String) {
    let mut c = common::process::miles();
    c.arg("serve")
        .args(args)
        .args(["--threads", "1"])
        .env_remove(API_KEY_ENV)
        .stdin(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(k) = key {
        c.env(API_KEY_ENV, k);
    }
    let mut server = Proc::spawn(&mut c);
    let mut err = BufReader::new(server.child().stderr.take().unwrap());
    let mut seen = String::new();
    let base = loop {
        let mut line = String::new();
        if err.read_line(&mut line).unwrap() == 0 {
            panic!("miles serve ended before serving: {seen}");
        }
        seen.push_str(&line);
        if let Some(w) = line.split_whitespace().find(|w| w.starts_with("http://")) {
            // A server on every interface is reached here through loopback.
            break w.trim_end_matches(')').replace("0.0.0.0", "127.0.0.1");
        }
    };
    // Keep reading, so a later line never meets a closed pipe.
    std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::sink()));
    (server, base)
}

#[test]
fn serve_speaks_sglang_generate_weights_pause_and_counts_prefix_reuse() {
    let dir = temp_dir("serve");
    let (recipe, model, spec) = train_tiny(&dir);
    // Both the client below (dir/weights) and the run (dir/out-http/weights-http) write under dir.
    let (mut server, base) =
        start_server(&[model.to_str().unwrap(), "--bind", "127.0.0.1:0", "--weights-dir", dir.to_str().unwrap()], None);
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
    let mut engine = HttpEngine::new(vec![base.clone()], dir.join("weights"), spec.model.clone(), t).with_api_key(None);
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
    std::fs::write(&r2, http_recipe(&recipe, &base, 3)).unwrap();
    let o = run(&[r2.to_str().unwrap(), "--out", dir.join("out-http").to_str().unwrap()], None);
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

/// SGLang's `--api-key`: every call but `/health*` and `/metrics` carries the key or gets 401;
/// the trainer's client sends MILES_API_KEY; weights load only from inside `--weights-dir`.
#[test]
fn serve_wants_its_api_key_and_loads_weights_only_from_its_weights_dir() {
    const KEY: &str = "test-key-5f0c2a9e";
    const WRONG: &str = "test-key-5f0c2a9f";
    let dir = temp_dir("serve-key");
    let (recipe, model, spec) = train_tiny(&dir);
    let weights = dir.join("w");
    // On every interface, which a key allows; the key from the environment (not in `ps`).
    let (_server, base) = start_server(
        &[model.to_str().unwrap(), "--bind", "0.0.0.0:0", "--weights-dir", weights.to_str().unwrap()],
        Some(KEY),
    );
    let t = Duration::from_secs(30);
    let call = |method: &str, path: &str, body: Option<&Value>, key: Option<&str>| {
        request_with_key(method, &format!("{base}{path}"), body, t, key).unwrap()
    };
    let version = || call("GET", "/model_info", None, Some(KEY)).1["weight_version"].clone();
    let gen = json!({"input_ids": [5, 6, 12, 7, 13], "sampling_params": {"max_new_tokens": 3, "temperature": 0}});

    // No key, a wrong key: 401 with a JSON error, on every guarded endpoint.
    for key in [None, Some(WRONG)] {
        let (code, v) = call("POST", "/generate", Some(&gen), key);
        assert_eq!(code, 401, "{key:?}: {v}");
        assert!(v["error"]["message"].as_str().unwrap().contains("Unauthorized"), "{v}");
        assert!(!v.to_string().contains(KEY), "{v}");
    }
    let (code, v) = call("POST", "/generate", Some(&gen), Some(&KEY[..KEY.len() - 1]));
    assert_eq!(code, 401, "a prefix of the key is not the key: {v}");
    for (m, p) in [
        ("GET", "/model_info"),
        ("GET", "/get_server_info"),
        ("POST", "/flush_cache"),
        ("POST", "/pause_generation"),
        ("POST", "/continue_generation"),
        ("POST", "/abort_request"),
        ("POST", "/update_weights_from_disk"),
        ("POST", "/update_weights_from_tensor"),
        ("POST", "/init_weights_update_group"),
        ("POST", "/update_weights_from_distributed"),
    ] {
        assert_eq!(call(m, p, Some(&json!({})), None).0, 401, "{m} {p} without a key");
        assert_eq!(call(m, p, Some(&json!({})), Some(WRONG)).0, 401, "{m} {p} with a wrong key");
    }
    assert_eq!(call("GET", "/get_server_info", None, Some(KEY)).1["paused"], false, "an unauthorized pause paused");
    // Open without a key, as SGLang leaves them: probes and scrapers.
    assert_eq!(call("GET", "/health", None, None).0, 200);
    assert_eq!(call("GET", "/health_generate", None, None).0, 200);
    assert_eq!(call("GET", "/metrics", None, None).0, 200);
    // The right key: answered.
    let (code, v) = call("POST", "/generate", Some(&gen), Some(KEY));
    assert_eq!(code, 200, "{v}");
    assert!(!v["output_ids"].as_array().unwrap().is_empty(), "{v}");
    assert_eq!(version(), "0");

    // The client: without the key it is refused and says what to set; the key is never echoed.
    let params = SamplingParams::plain(3, 3);
    let engine = |key: Option<&str>| {
        HttpEngine::new(vec![base.clone()], weights.join("client"), spec.model.clone(), t)
            .with_api_key(key.map(String::from))
    };
    let e = engine(None).generate(&[vec![5, 6, 12, 6, 13]], 1, &params).unwrap_err().to_string();
    assert!(e.contains("401") && e.contains(API_KEY_ENV), "{e}");
    let e = engine(Some(WRONG)).generate(&[vec![5, 6, 12, 6, 13]], 1, &params).unwrap_err().to_string();
    assert!(e.contains("401") && !e.contains(WRONG), "{e}");
    let mut w =
        miles_runtime::WeightSnapshot { version: 7, tensors: read_safetensors(&model.join("model.safetensors")) };
    let e = engine(None).load_weights(&w).unwrap_err().to_string();
    assert!(e.contains("401"), "{e}");
    assert_eq!(version(), "0", "a weight update without the key was applied");
    // With it: a weight update (written inside --weights-dir) and generation on it.
    let mut keyed = engine(Some(KEY));
    keyed.load_weights(&w).unwrap();
    assert_eq!(version(), "7");
    assert_eq!(keyed.generate(&[vec![5, 6, 12, 6, 13]], 1, &params).unwrap()[0].weight_version, 7);

    // A loadable checkpoint outside --weights-dir, reached directly, through `..` and through a
    // symlink inside: refused with 403, and the server keeps answering with version 7.
    w.version = 9;
    let outside = dir.join("outside").join("v9");
    write_hf_checkpoint(&outside, &w, &spec.model).unwrap();
    std::os::unix::fs::symlink(&outside, weights.join("link")).unwrap();
    for p in [outside.clone(), weights.join("..").join("outside").join("v9"), weights.join("link")] {
        let body = json!({"model_path": p, "weight_version": "9"});
        let (code, v) = call("POST", "/update_weights_from_disk", Some(&body), Some(KEY));
        assert_eq!(code, 403, "{p:?}: {v}");
        let m = v["error"]["message"].as_str().unwrap();
        assert!(m.contains("outside the weights directory") && m.contains("--weights-dir"), "{m}");
        assert_eq!(version(), "7", "{p:?}");
        let (code, v) = call("POST", "/generate", Some(&gen), Some(KEY));
        assert_eq!((code, v["meta_info"]["weight_version"].as_str()), (200, Some("7")), "{v}");
    }
    // The same checkpoint inside is loaded: the refusals above were the confinement alone.
    std::fs::rename(dir.join("outside"), weights.join("inside")).unwrap();
    let body = json!({"model_path": weights.join("inside").join("v9"), "weight_version": "9"});
    let (code, v) = call("POST", "/update_weights_from_disk", Some(&body), Some(KEY));
    assert_eq!(code, 200, "{v}");
    assert_eq!(version(), "9");

    // A whole run whose rollout stage is this server: the trainer sends MILES_API_KEY.
    let r2 = dir.join("http.miles");
    std::fs::write(&r2, http_recipe(&recipe, &base, 2)).unwrap();
    let out = weights.join("run");
    let o = run(&[r2.to_str().unwrap(), "--out", out.to_str().unwrap()], Some(KEY));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(!err.contains(KEY) && !String::from_utf8_lossy(&o.stdout).contains(KEY), "the key was printed: {err}");
    assert_ne!(version(), "9", "the run pushed its own weights");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A server reachable from elsewhere without a key does not start.
#[test]
fn serve_without_a_key_refuses_a_non_loopback_address() {
    let dir = temp_dir("serve-bind");
    // Refused before the model is read: this directory need not exist.
    let model = dir.join("no-model");
    for (bind, key) in [("0.0.0.0:0", None), ("[::]:0", None), ("0.0.0.0:0", Some(""))] {
        let mut c = common::process::miles();
        c.args(["serve", model.to_str().unwrap(), "--bind", bind]).env_remove(API_KEY_ENV);
        if let Some(k) = key {
            c.env(API_KEY_ENV, k);
        }
        let o = output(&mut c, Duration::from_secs(60));
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{bind}: {err}");
        assert!(err.contains(&format!("refusing to listen on {bind}")), "{err}");
        assert!(err.contains("--api-key") && err.contains(API_KEY_ENV), "{err}");
    }
    // Loopback without a key is the default and goes on to read the model (which is missing here).
    let o = output(
        common::process::miles()
            .args(["serve", model.to_str().unwrap(), "--bind", "127.0.0.1:0"])
            .env_remove(API_KEY_ENV),
        Duration::from_secs(60),
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(!err.contains("refusing to listen"), "{err}");
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

#[test]
fn fully_async_with_miles_serve_as_the_engine_trains() {
    let dir = temp_dir("serve-async");
    let (recipe, model, _) = train_tiny(&dir);
    let (_server, base) =
        start_server(&[model.to_str().unwrap(), "--bind", "127.0.0.1:0", "--weights-dir", dir.to_str().unwrap()], None);
    let text = http_recipe(&recipe, &base, 6).replace(
        "    stop = 6.steps",
        "    schedule = fully_async { max_staleness = 1 }\n    ckpt = checkpoint(train) { every = 3.steps }\n    stop = 6.steps",
    );
    assert!(text.contains("fully_async"), "{text}");
    let r = dir.join("async.miles");
    std::fs::write(&r, text).unwrap();
    let out = dir.join("out-async");
    let o = run(&[r.to_str().unwrap(), "--out", out.to_str().unwrap()], None);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("rollout on SGLang-compatible server(s)"), "{err}");
    let rows = common::metrics::untimed(&out);
    assert_eq!(common::metrics::trained_steps(&out), (1..=6).collect::<Vec<_>>());
    let swaps: f64 = rows.iter().filter_map(|v| v["rollout/fully_async/weight_swaps"].as_f64()).sum();
    assert!(swaps >= 1.0, "the server took new weights while the run went on");
    // The server holds a version the run pushed, read from the run's own weights directory.
    let info = get_json(&format!("{base}/model_info"), Duration::from_secs(30)).unwrap();
    assert_ne!(info["weight_version"], "0", "{info}");
    assert!(out.join("weights-http").is_dir());
    // Every prompt served was trained, dropped with a reason, or is waiting in the checkpoint.
    assert_eq!(common::metrics::prompt_ledger(&out).accounting_faults(), Vec::<String>::new());
    let _ = std::fs::remove_dir_all(&dir);
}

/// The OpenAI-compatible session server inside `miles serve`: plain inference on
/// /v1/chat/completions and a session by URL (`base_url = .../sessions/ID/v1`), whose recorded
/// chains hold exactly the ids the server answered with.
#[test]
fn serve_answers_openai_chat_completions_and_records_sessions() {
    let dir = temp_dir("serve-chat");
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf/qwen3");
    let (_server, base) =
        start_server(&[model.to_str().unwrap(), "--bind", "127.0.0.1:0", "--weights-dir", dir.to_str().unwrap()], None);
    let t = Duration::from_secs(120);
    let (code, models) = request("GET", &format!("{base}/v1/models"), None, t).unwrap();
    assert_eq!((code, models["data"][0]["id"].as_str()), (200, Some("qwen3")), "{models}");
    let user = json!({"role": "user", "content": "Hi"});
    let body = json!({"messages": [user], "max_tokens": 4, "temperature": 0, "return_token_ids": true});
    let (code, a) = request("POST", &format!("{base}/v1/chat/completions"), Some(&body), t).unwrap();
    assert_eq!(code, 200, "{a}");
    assert_eq!(a["object"], "chat.completion");
    assert_eq!(a["choices"][0]["message"]["role"], "assistant");
    assert!(a["usage"]["completion_tokens"].as_u64().unwrap() <= 4);
    // A session by URL, two turns; the second re-sends the first's answer.
    let url = format!("{base}/sessions/ep-1/v1/chat/completions");
    let (code, first) = request("POST", &url, Some(&body), t).unwrap();
    assert_eq!(code, 200, "{first}");
    let more = json!({"role": "user", "content": "More"});
    let body2 = json!({"messages": [user, first["choices"][0]["message"], more], "max_tokens": 4, "temperature": 0});
    let (code, second) = request("POST", &url, Some(&body2), t).unwrap();
    assert_eq!(code, 200, "{second}");
    let (code, rec) = request("GET", &format!("{base}/v1/sessions/ep-1"), None, t).unwrap();
    assert_eq!((code, rec["turns"].as_u64()), (200, Some(2)), "{rec}");
    // Every id the server answered with is a trained (mask 1) id of a recorded chain.
    let answered: Vec<u64> =
        first["miles"]["token_ids"][0].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    let chains = rec["chains"].as_array().unwrap();
    assert!(
        chains.iter().any(|c| {
            let ids = c["token_ids"].as_array().unwrap();
            let mask = c["loss_mask"].as_array().unwrap();
            let trained: Vec<u64> = ids
                .iter()
                .zip(mask)
                .filter(|(_, m)| m.as_f64() == Some(1.0))
                .map(|(i, _)| i.as_u64().unwrap())
                .collect();
            trained.starts_with(&answered)
        }),
        "{rec}"
    );
    let (code, e) = request("GET", &format!("{base}/v1/sessions/unknown"), None, t).unwrap();
    assert_eq!((code, e["error"]["code"].as_str()), (404, Some("session_not_found")));
}
