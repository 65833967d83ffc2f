//! The SGLang-compatible HTTP rollout API: the server `miles serve` runs over any
//! `RolloutEngine`, and the client a rollout stage uses for `engine = sglang { url = ... }`, so a
//! real SGLang fleet is a drop-in for `miles serve`.
//!
//! Endpoints (SGLang's names and shapes): `POST /generate`, `GET /health`, `GET /health_generate`,
//! `GET /model_info`, `GET /get_server_info`, `POST /flush_cache`, `POST /pause_generation`,
//! `POST /continue_generation`, `POST /abort_request`, `POST /update_weights_from_disk`,
//! `GET /metrics`. The NCCL weight endpoints answer 501: this server has no GPU group.
//!
//! Security, as SGLang's `--api-key`: with a key, every endpoint but `/health*` and `/metrics`
//! (left open for probes and scrapers, as SGLang does) wants `Authorization: Bearer KEY` and
//! answers 401 without it; a server on a non-loopback address refuses to start without a key;
//! `/update_weights_from_disk` loads only from inside the weights directory it was started with;
//! without a key (loopback only), requests must name loopback in `Host` (DNS-rebinding defence).
//! What one request may ask (`n`, tokens, prompts, body bytes) and how long it may take are
//! bounded (`Limits`, each a `miles serve` flag; docs/distributed.md).

use miles_runtime::tasks::TokenId;
use miles_runtime::{hf_dir, http_client};
use miles_runtime::{
    FinishReason, ModelConfig, RolloutEngine, RunError, Sample, SamplingParams, WeightSnapshot, E_CHECKPOINT,
};
use serde_json::{json, Value};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

// ---- client -----------------------------------------------------------------------------

/// The environment variable holding the API key: `miles serve` reads it when `--api-key` is not
/// given (so the key need not appear in `ps`), and `HttpEngine` sends it as
/// `Authorization: Bearer` (so a recipe needs no field for it).
pub const API_KEY_ENV: &str = "MILES_API_KEY";

/// The API key from `MILES_API_KEY`, if set and not empty.
pub fn api_key_from_env() -> Option<String> {
    std::env::var(API_KEY_ENV).ok().filter(|k| !k.is_empty())
}

/// Whether a key can travel in an HTTP header as `Bearer KEY` (the runtime's client checks it).
pub use miles_runtime::http_client::valid_api_key;

/// One request (`GET`, or `POST` with `body`) over the runtime's HTTP client
/// (`miles_runtime::http_client`): `http://` or `https://`, one deadline over connect, send and
/// the whole answer, answers capped at 64 MB.
pub fn request(method: &str, url: &str, body: Option<&Value>, timeout: Duration) -> Result<(u16, Value), String> {
    request_with_key(method, url, body, timeout, None)
}

/// `request`, with `Authorization: Bearer KEY` when `key` is given. The key appears in no error
/// this returns.
pub fn request_with_key(
    method: &str,
    url: &str,
    body: Option<&Value>,
    timeout: Duration,
    key: Option<&str>,
) -> Result<(u16, Value), String> {
    if key.is_some_and(|k| !valid_api_key(k)) {
        return Err(format!("{url}: the API key ({API_KEY_ENV}) must be printable ASCII without spaces"));
    }
    let u = http_client::parse_url(url).map_err(|e| format!("{url}: {e}"))?;
    // A POST without a body sends an empty one, as before.
    let payload = body.map(Value::to_string).unwrap_or_default();
    let sent = match method {
        "GET" => http_client::Client::shared().request(&u, None, timeout, key),
        "POST" => http_client::Client::shared().request(&u, Some(&payload), timeout, key),
        m => return Err(format!("{url}: {m} is not a method this client sends (GET, POST)")),
    };
    let a = sent.map_err(|e| format!("{url}: {}", e.what))?;
    Ok((a.status, a.json()))
}

pub fn post_json(url: &str, body: &Value, timeout: Duration) -> Result<Value, String> {
    post_json_with_key(url, body, timeout, None)
}

pub fn get_json(url: &str, timeout: Duration) -> Result<Value, String> {
    get_json_with_key(url, timeout, None)
}

/// `post_json` with `Authorization: Bearer KEY` when `key` is given.
pub fn post_json_with_key(url: &str, body: &Value, timeout: Duration, key: Option<&str>) -> Result<Value, String> {
    answer(url, request_with_key("POST", url, Some(body), timeout, key)?)
}

/// `get_json` with `Authorization: Bearer KEY` when `key` is given.
pub fn get_json_with_key(url: &str, timeout: Duration, key: Option<&str>) -> Result<Value, String> {
    answer(url, request_with_key("GET", url, None, timeout, key)?)
}

fn answer(url: &str, (code, v): (u16, Value)) -> Result<Value, String> {
    match code {
        200..=299 => Ok(v),
        c => Err(format!("{url} answered {c}: {v}")),
    }
}

/// A POST of `HttpEngine` to a rollout server: a 401 says which key it wants.
fn post_to_server(url: &str, body: &Value, timeout: Duration, key: Option<&str>) -> Result<Value, String> {
    match request_with_key("POST", url, Some(body), timeout, key)? {
        (401, v) => Err(format!(
            "{url} answered 401: {v} ({})",
            if key.is_some() {
                format!("{API_KEY_ENV} is not the key this server was started with")
            } else {
                format!("the server wants an API key: set {API_KEY_ENV} to the key it was started with")
            }
        )),
        r => answer(url, r),
    }
}

/// The SGLang `/generate` body for `n` samples of each prompt (a batch, prompt-major).
pub fn generate_body(prompts: &[Vec<TokenId>], n: usize, p: &SamplingParams) -> Value {
    let ids: Vec<&Vec<TokenId>> = prompts.iter().flat_map(|x| std::iter::repeat_n(x, n)).collect();
    let params: Vec<Value> = (0..ids.len())
        .map(|k| {
            let mut sp = json!({
                "max_new_tokens": p.max_new_tokens,
                "temperature": if p.greedy { 0.0 } else { p.temperature },
                "top_p": p.top_p,
                "top_k": if p.top_k == 0 { -1 } else { p.top_k as i64 },
                "stop_token_ids": p.stop_tokens,
                "sampling_seed": p.seed.wrapping_add(k as u64) % (1u64 << 53),
            });
            if p.greedy {
                sp["top_k"] = json!(1);
            }
            sp
        })
        .collect();
    json!({ "input_ids": ids, "sampling_params": params, "return_logprob": true })
}

/// One `/generate` answer item -> a sample.
pub fn parse_output(v: &Value, prompt_index: usize) -> Result<Sample, String> {
    let ids: Vec<TokenId> = v
        .get("output_ids")
        .and_then(Value::as_array)
        .ok_or("answer has no output_ids")?
        .iter()
        .filter_map(|x| x.as_u64().map(|x| x as TokenId))
        .collect();
    let meta = v.get("meta_info").cloned().unwrap_or(Value::Null);
    let lps: Vec<f32> = meta
        .get("output_token_logprobs")
        .and_then(Value::as_array)
        .map(|a| a.iter().map(|e| e.get(0).and_then(Value::as_f64).unwrap_or(0.0) as f32).collect())
        .unwrap_or_else(|| vec![0.0; ids.len()]);
    let finish = match meta.pointer("/finish_reason/type").and_then(Value::as_str) {
        Some("stop") => FinishReason::Stop,
        _ => FinishReason::Length,
    };
    let weight_version = meta
        .get("weight_version")
        .and_then(|w| w.as_u64().or_else(|| w.as_str().and_then(|s| s.parse().ok())))
        .unwrap_or(0);
    Ok(Sample { prompt_index, response: ids, logprobs: lps, finish, weight_version, routing: None })
}

/// A rollout engine made of SGLang-compatible servers (`miles serve` or SGLang itself). Groups go
/// to servers by prompt affinity. Weight updates are written as a Hugging Face checkpoint under
/// `weights_dir` (shared with the servers, inside their `--weights-dir`) and loaded with
/// `/update_weights_from_disk`. Every call carries `Authorization: Bearer` with the key from
/// `MILES_API_KEY` when that is set.
pub struct HttpEngine {
    pub urls: Vec<String>,
    pub timeout: Duration,
    pub weights_dir: PathBuf,
    pub model: miles_runtime::ModelConfig,
    /// Never printed: no `Debug` here, and no error message includes it.
    api_key: Option<String>,
    version: u64,
    /// config.json of the Hugging Face directory the policy was loaded from (`with_source`):
    /// each update's config.json, as that directory says the model is.
    source_config: Option<Value>,
}

impl HttpEngine {
    /// The API key comes from `MILES_API_KEY` (none when unset).
    pub fn new(urls: Vec<String>, weights_dir: PathBuf, model: miles_runtime::ModelConfig, timeout: Duration) -> Self {
        HttpEngine { urls, timeout, weights_dir, model, api_key: api_key_from_env(), version: 0, source_config: None }
    }

    /// The policy was loaded from the Hugging Face directory `dir` (the run spec's `hf`): every
    /// update carries its config.json (dtype float32) rather than one made from the model config,
    /// which lacks what the trainer read from the directory alone (rope scaling, token ids).
    pub fn with_source(mut self, dir: Option<&Path>) -> Result<Self, RunError> {
        self.source_config = match dir {
            None => None,
            Some(d) => {
                let path = d.join("config.json");
                let text =
                    std::fs::read_to_string(&path).map_err(|e| RunError::io(E_CHECKPOINT, "cannot read", &path, e))?;
                let v: Value = serde_json::from_str(&text)
                    .map_err(|e| RunError::new(E_CHECKPOINT, format!("{}: not valid JSON: {e}", path.display())))?;
                if !v.is_object() {
                    return Err(RunError::new(E_CHECKPOINT, format!("{}: not a JSON object", path.display())));
                }
                Some(v)
            }
        };
        Ok(self)
    }

    /// Replaces the API key taken from the environment.
    pub fn with_api_key(mut self, key: Option<String>) -> Self {
        self.api_key = key;
        self
    }
}

fn http_err(url: &str, m: String) -> RunError {
    RunError::new(crate::E_WORKER, format!("rollout server {url}: {m}"))
}

impl RolloutEngine for HttpEngine {
    fn generate(
        &mut self,
        prompts: &[Vec<TokenId>],
        n: usize,
        params: &SamplingParams,
    ) -> Result<Vec<Sample>, RunError> {
        let mut by: Vec<Vec<usize>> = vec![Vec::new(); self.urls.len()];
        for (i, p) in prompts.iter().enumerate() {
            by[crate::remote::route(p, self.urls.len())].push(i);
        }
        let results: Vec<Result<Vec<Sample>, RunError>> = std::thread::scope(|s| {
            let hs: Vec<_> = by
                .iter()
                .enumerate()
                .filter(|(_, ps)| !ps.is_empty())
                .map(|(k, ps)| {
                    let url = format!("{}/generate", self.urls[k].trim_end_matches('/'));
                    let sub: Vec<Vec<TokenId>> = ps.iter().map(|&i| prompts[i].clone()).collect();
                    let timeout = self.timeout;
                    let key = self.api_key.as_deref();
                    s.spawn(move || -> Result<Vec<Sample>, RunError> {
                        let v = post_to_server(&url, &generate_body(&sub, n, params), timeout, key)
                            .map_err(|m| http_err(&url, m))?;
                        let items = v.as_array().cloned().unwrap_or_else(|| vec![v.clone()]);
                        if items.len() != sub.len() * n {
                            return Err(http_err(
                                &url,
                                format!("{} answers for {} requests", items.len(), sub.len() * n),
                            ));
                        }
                        items
                            .iter()
                            .enumerate()
                            .map(|(j, it)| parse_output(it, ps[j / n]).map_err(|m| http_err(&url, m)))
                            .collect()
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err(RunError::new(crate::E_WORKER, "client thread panicked"))))
                .collect()
        });
        let mut out = Vec::new();
        for r in results {
            out.extend(r?);
        }
        out.sort_by_key(|s| s.prompt_index);
        Ok(out)
    }

    fn weight_version(&self) -> u64 {
        self.version
    }

    fn load_weights(&mut self, w: &WeightSnapshot) -> Result<(), RunError> {
        let dir = self.weights_dir.join(format!("v{:010}", w.version));
        write_hf_checkpoint_from(&dir, w, &self.model, self.source_config.as_ref())?;
        for u in &self.urls {
            let url = format!("{}/update_weights_from_disk", u.trim_end_matches('/'));
            let body = json!({ "model_path": dir, "weight_version": w.version.to_string() });
            let v = post_to_server(&url, &body, self.timeout, self.api_key.as_deref()).map_err(|m| http_err(u, m))?;
            if v.get("success").and_then(Value::as_bool) == Some(false) {
                return Err(http_err(
                    u,
                    format!("weight update refused: {}", v.get("message").cloned().unwrap_or_default()),
                ));
            }
        }
        self.version = w.version;
        Ok(())
    }
}

/// A weight update as a Hugging Face directory (model.safetensors in F32, config.json), what
/// SGLang's `/update_weights_from_disk` and `miles serve` read: config.json made from `m`
/// (`miles_runtime::hf_dir::config_json`, the exporter's: Llama, Qwen2, Qwen3, Qwen3-MoE or
/// Mixtral, whichever holds `m`), tensors under that architecture's names (Mixtral's
/// `block_sparse_moe`). A model no transformers class holds is refused, saying why. Written into a
/// temp directory, synced and renamed into place.
pub fn write_hf_checkpoint(dir: &Path, w: &WeightSnapshot, m: &ModelConfig) -> Result<(), RunError> {
    write_hf_checkpoint_from(dir, w, m, None)
}

/// `write_hf_checkpoint`, with `source` (config.json of the Hugging Face directory the policy was
/// loaded from) written as the update's config.json, dtype set to float32, so every field `m`
/// does not hold (rope scaling, token ids, sliding window) reaches the server as the trainer
/// read it.
pub fn write_hf_checkpoint_from(
    dir: &Path,
    w: &WeightSnapshot,
    m: &ModelConfig,
    source: Option<&Value>,
) -> Result<(), RunError> {
    let (config, arch) = match source {
        // The names follow the model: a directory `m` came from is held by the class `m` maps to.
        Some(s) => (hf_dir::float32_config(s), hf_dir::config_json(m)?.1),
        None => hf_dir::config_json(m)?,
    };
    miles_runtime::atomic_write::write_dir_atomically(dir, |tmp| {
        let path = tmp.join("model.safetensors");
        write_f32_safetensors(&path, w, arch).map_err(|e| RunError::io(E_CHECKPOINT, "cannot write", &path, e))?;
        let path = tmp.join("config.json");
        std::fs::write(&path, config.to_string()).map_err(|e| RunError::io(E_CHECKPOINT, "cannot write", &path, e))
    })
}

/// The snapshot's tensors as one safetensors file, each under `arch`'s name for it.
fn write_f32_safetensors(path: &Path, w: &WeightSnapshot, arch: hf_dir::Architecture) -> std::io::Result<()> {
    let mut header = serde_json::Map::new();
    let mut off = 0usize;
    for t in &w.tensors {
        let n = t.data.len() * 4;
        let name = hf_dir::hf_name(arch, &t.name);
        let entry = json!({"dtype": "F32", "shape": t.shape, "data_offsets": [off, off + n]});
        if header.insert(name.clone(), entry).is_some() {
            return Err(std::io::Error::other(format!("two tensors of the update are named {name}")));
        }
        off += n;
    }
    let mut h = serde_json::to_vec(&Value::Object(header)).map_err(std::io::Error::other)?;
    // The data starts 8-byte aligned, as safetensors' own writer pads it.
    while h.len() % 8 != 0 {
        h.push(b' ');
    }
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    f.write_all(&(h.len() as u64).to_le_bytes())?;
    f.write_all(&h)?;
    for t in &w.tensors {
        f.write_all(crate::wire::as_bytes(&t.data))?;
    }
    f.flush()
}

// ---- server: serve.rs (routes, state, the key and Host gate), generate.rs (`/generate`),
// limits.rs (what one request may ask and how long it may take) ----------------------------

mod generate;
mod limits;
mod openai;
mod serve;
pub use generate::check_generate_body;
pub use limits::{host_is_loopback, Limits};
pub use openai::{sse_events, OpenAiServer, SESSION_HEADER};
pub use serve::{check_bind, confine, is_loopback_bind, serve, Loader, PrefixStats, ServeOptions};

#[cfg(test)]
mod tests {
    use super::*;
    use miles_runtime::{MoeConfig, NamedTensor};

    fn temp(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("miles-http-ckpt-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn model(qk_norm: bool, moe: Option<MoeConfig>) -> ModelConfig {
        ModelConfig {
            vocab_size: 16,
            d_model: 8,
            n_layers: 2,
            n_heads: 2,
            n_kv_heads: 1,
            d_ff: 12,
            max_len: 64,
            rope_theta: 1e6,
            norm_eps: 1e-6,
            init_std: 0.02,
            head_dim: Some(6),
            qkv_bias: false,
            o_bias: false,
            qk_norm,
            tie_embeddings: true,
            rope_scaling: None,
            moe,
        }
    }

    fn experts(dense_layers: usize) -> MoeConfig {
        MoeConfig { dense_layers, aux_loss_coef: 0.001, ..MoeConfig::routed(2, 1, 12) }
    }

    /// A snapshot under the model's own names, as `Policy::snapshot` makes them.
    fn snapshot(names: &[&str]) -> WeightSnapshot {
        let tensors = names
            .iter()
            .enumerate()
            .map(|(i, n)| NamedTensor { name: n.to_string(), shape: vec![2, 1 + i], data: vec![i as f32; 2 * (1 + i)] })
            .collect();
        WeightSnapshot { version: 4, tensors }
    }

    fn written(dir: &Path) -> (Value, miles_runtime::safetensors::Header, Vec<u8>) {
        let config = serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
        let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
        (config, miles_runtime::safetensors::parse(&bytes).unwrap(), bytes)
    }

    #[test]
    fn each_architecture_gets_its_own_config_json() {
        let names = ["model.embed_tokens.weight", "model.layers.0.self_attn.q_norm.weight"];
        for (m, class) in [
            (model(true, None), "Qwen3ForCausalLM"),
            (model(true, Some(experts(1))), "Qwen3MoeForCausalLM"),
            (model(false, Some(experts(0))), "MixtralForCausalLM"),
            (ModelConfig { qkv_bias: true, ..model(false, None) }, "Qwen2ForCausalLM"),
        ] {
            let dir = temp(class).join("v1");
            write_hf_checkpoint(&dir, &snapshot(&names), &m).unwrap();
            let (config, ..) = written(&dir);
            // The exporter's config.json, byte for byte the same object: one implementation.
            assert_eq!(config, hf_dir::config_json(&m).unwrap().0, "{class}");
            assert_eq!(config["architectures"][0], class);
            assert_eq!((config["head_dim"].as_u64(), config["tie_word_embeddings"].as_bool()), (Some(6), Some(true)));
            let _ = std::fs::remove_dir_all(dir.parent().unwrap());
        }
    }

    #[test]
    fn a_mixtral_update_carries_transformers_names_and_its_data() {
        let own = [
            "model.embed_tokens.weight",
            "model.layers.0.mlp.gate.weight",
            "model.layers.0.mlp.experts.1.gate_proj.weight",
            "model.layers.0.mlp.experts.1.up_proj.weight",
            "model.layers.1.mlp.experts.0.down_proj.weight",
            "model.layers.1.self_attn.o_proj.weight",
        ];
        let dir = temp("mixtral").join("v4");
        let w = snapshot(&own);
        write_hf_checkpoint(&dir, &w, &model(false, Some(experts(0)))).unwrap();
        let (_, header, bytes) = written(&dir);
        let names: Vec<&str> = header.entries.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "model.embed_tokens.weight",
                "model.layers.0.block_sparse_moe.gate.weight",
                "model.layers.0.block_sparse_moe.experts.1.w1.weight",
                "model.layers.0.block_sparse_moe.experts.1.w3.weight",
                "model.layers.1.block_sparse_moe.experts.0.w2.weight",
                "model.layers.1.self_attn.o_proj.weight",
            ]
        );
        for (e, t) in header.entries.iter().zip(&w.tensors) {
            assert_eq!(e.shape, t.shape.iter().map(|&d| d as u64).collect::<Vec<_>>());
            let data = &bytes[e.start as usize..(e.start + e.len) as usize];
            assert_eq!(data, crate::wire::as_bytes(&t.data), "{}", e.name);
        }
        // Qwen3-MoE's names are the model's own.
        let dir2 = temp("qwen3moe").join("v4");
        write_hf_checkpoint(&dir2, &w, &model(true, Some(experts(0)))).unwrap();
        let (_, header, _) = written(&dir2);
        assert_eq!(header.entries.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(), own);
        for d in [dir, dir2] {
            let _ = std::fs::remove_dir_all(d.parent().unwrap());
        }
    }

    #[test]
    fn what_no_class_holds_is_refused_and_nothing_is_left() {
        let m = model(true, Some(MoeConfig { shared_expert_d_ff: 4, ..experts(0) }));
        let root = temp("refused");
        let dir = root.join("v1");
        let e = write_hf_checkpoint(&dir, &snapshot(&["model.embed_tokens.weight"]), &m).unwrap_err().to_string();
        assert!(e.contains("no transformers architecture holds") && e.contains("shared expert"), "{e}");
        assert!(!dir.exists() && std::fs::read_dir(&root).map_or(true, |mut d| d.next().is_none()));
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn a_source_config_json_is_carried_with_fp32() {
        let root = temp("source");
        std::fs::create_dir_all(&root).unwrap();
        let source = json!({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "torch_dtype": "bfloat16",
            "rope_scaling": {"rope_type": "linear", "factor": 2.0}, "eos_token_id": [7, 9]});
        std::fs::write(root.join("config.json"), source.to_string()).unwrap();
        let m = model(true, None);
        let engine = HttpEngine::new(vec![], root.join("w"), m.clone(), Duration::from_secs(1))
            .with_source(Some(&root))
            .unwrap();
        let dir = root.join("w").join("v2");
        write_hf_checkpoint_from(&dir, &snapshot(&["model.embed_tokens.weight"]), &m, engine.source_config.as_ref())
            .unwrap();
        let (config, ..) = written(&dir);
        let mut want = source.clone();
        want["torch_dtype"] = json!("float32");
        assert_eq!(config, want);
        // A source without a readable config.json is an error naming the file.
        let e = HttpEngine::new(vec![], root.join("w"), m, Duration::from_secs(1))
            .with_source(Some(&root.join("nowhere")))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("nowhere/config.json"), "{e}");
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn generate_body_and_parse_follow_sglang() {
        let p = SamplingParams::plain(4, 5);
        let b = generate_body(&[vec![5, 6], vec![7]], 2, &p);
        assert_eq!(b["input_ids"], json!([[5, 6], [5, 6], [7], [7]]));
        assert_eq!(b["sampling_params"][1]["sampling_seed"], 6);
        assert_eq!(b["sampling_params"][0]["top_k"], -1);
        let generate::Parsed { prompts, params, batched, .. } = generate::parse_generate(&b).unwrap();
        assert_eq!(prompts.len(), 4);
        assert!(batched);
        assert_eq!(params[3].seed, 8);
        let out = json!({"output_ids": [3, 2], "meta_info": {"finish_reason": {"type": "stop"}, "weight_version": "7",
            "output_token_logprobs": [[-0.5, 3, null], [-0.1, 2, null]]}});
        let s = parse_output(&out, 1).unwrap();
        assert_eq!(
            (s.response.clone(), s.finish, s.weight_version, s.logprobs.clone()),
            (vec![3, 2], FinishReason::Stop, 7, vec![-0.5, -0.1])
        );
    }
}
