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

use miles_runtime::http_client;
use miles_runtime::tasks::TokenId;
use miles_runtime::{FinishReason, RolloutEngine, RunError, Sample, SamplingParams, WeightSnapshot};
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
}

impl HttpEngine {
    /// The API key comes from `MILES_API_KEY` (none when unset).
    pub fn new(urls: Vec<String>, weights_dir: PathBuf, model: miles_runtime::ModelConfig, timeout: Duration) -> Self {
        HttpEngine { urls, timeout, weights_dir, model, api_key: api_key_from_env(), version: 0 }
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
        write_hf_checkpoint(&dir, w, &self.model)
            .map_err(|e| RunError::io(crate::E_TRANSFER, "cannot write", &dir, e))?;
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

/// model.safetensors (F32) + config.json, written into a temp dir and renamed: what SGLang's
/// `/update_weights_from_disk` and `miles serve` read.
pub fn write_hf_checkpoint(dir: &Path, w: &WeightSnapshot, m: &miles_runtime::ModelConfig) -> std::io::Result<()> {
    let parent = dir.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent)?;
    let tmp =
        parent.join(format!(".{}.tmp", dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp)?;
    let mut header = serde_json::Map::new();
    let mut off = 0usize;
    for t in &w.tensors {
        let n = t.data.len() * 4;
        header.insert(t.name.clone(), json!({"dtype": "F32", "shape": t.shape, "data_offsets": [off, off + n]}));
        off += n;
    }
    let mut h = serde_json::to_vec(&Value::Object(header)).map_err(std::io::Error::other)?;
    while h.len() % 8 != 0 {
        h.push(b' ');
    }
    {
        let mut f = std::io::BufWriter::new(std::fs::File::create(tmp.join("model.safetensors"))?);
        f.write_all(&(h.len() as u64).to_le_bytes())?;
        f.write_all(&h)?;
        for t in &w.tensors {
            f.write_all(crate::wire::as_bytes(&t.data))?;
        }
        f.flush()?;
        f.get_ref().sync_all()?;
    }
    let config = json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": m.vocab_size, "hidden_size": m.d_model, "intermediate_size": m.d_ff,
        "num_hidden_layers": m.n_layers, "num_attention_heads": m.n_heads, "num_key_value_heads": m.n_kv_heads,
        "max_position_embeddings": m.max_len, "rms_norm_eps": m.norm_eps, "rope_theta": m.rope_theta,
        "hidden_act": "silu", "tie_word_embeddings": false, "torch_dtype": "float32",
        "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "initializer_range": m.init_std,
    });
    std::fs::write(tmp.join("config.json"), config.to_string())?;
    if dir.exists() {
        std::fs::remove_dir_all(dir)?;
    }
    std::fs::rename(&tmp, dir)
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
