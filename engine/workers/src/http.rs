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
//! `/update_weights_from_disk` loads only from inside the weights directory it was started with.

use miles_runtime::tasks::TokenId;
use miles_runtime::{FinishReason, RolloutEngine, RunError, Sample, SamplingParams, WeightSnapshot};
use serde_json::{json, Value};
use std::collections::HashSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

// ---- client -----------------------------------------------------------------------------

/// `http://host:port/path` -> (host:port, /path).
fn split_url(url: &str) -> Result<(String, String), String> {
    let rest = url.strip_prefix("http://").ok_or_else(|| format!("{url}: only http:// URLs are supported"))?;
    let (host, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    Ok((host.to_string(), path.to_string()))
}

/// The environment variable holding the API key: `miles serve` reads it when `--api-key` is not
/// given (so the key need not appear in `ps`), and `HttpEngine` sends it as
/// `Authorization: Bearer` (so a recipe needs no field for it).
pub const API_KEY_ENV: &str = "MILES_API_KEY";

/// The API key from `MILES_API_KEY`, if set and not empty.
pub fn api_key_from_env() -> Option<String> {
    std::env::var(API_KEY_ENV).ok().filter(|k| !k.is_empty())
}

/// Whether a key can travel in an HTTP header as `Bearer KEY`: printable ASCII, no spaces (also
/// what keeps a key from smuggling a line break into the request).
pub fn valid_api_key(key: &str) -> bool {
    !key.is_empty() && key.bytes().all(|b| b.is_ascii_graphic())
}

/// One HTTP/1.1 request with a bound on connect, send and the whole answer.
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
    let auth = match key {
        Some(k) if valid_api_key(k) => format!("Authorization: Bearer {k}\r\n"),
        Some(_) => return Err(format!("{url}: the API key ({API_KEY_ENV}) must be printable ASCII without spaces")),
        None => String::new(),
    };
    let (host, path) = split_url(url)?;
    let addr = host
        .to_socket_addrs()
        .map_err(|e| format!("{host}: {e}"))?
        .next()
        .ok_or_else(|| format!("{host} resolves to no address"))?;
    let s = TcpStream::connect_timeout(&addr, timeout).map_err(|e| format!("{url}: {e}"))?;
    s.set_read_timeout(Some(timeout)).map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(timeout)).map_err(|e| e.to_string())?;
    let payload = body.map(|b| b.to_string()).unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{payload}",
        payload.len()
    );
    (&s).write_all(req.as_bytes()).map_err(|e| format!("{url}: {e}"))?;
    let mut r = BufReader::new(&s);
    let mut status = String::new();
    r.read_line(&mut status).map_err(|e| format!("{url}: {e}"))?;
    let code: u16 = status
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("{url}: bad status line {status:?}"))?;
    let mut len = None;
    let mut chunked = false;
    loop {
        let mut line = String::new();
        r.read_line(&mut line).map_err(|e| format!("{url}: {e}"))?;
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        let lower = l.to_ascii_lowercase();
        if let Some(v) = lower.strip_prefix("content-length:") {
            len = v.trim().parse::<usize>().ok();
        }
        if lower.starts_with("transfer-encoding:") && lower.contains("chunked") {
            chunked = true;
        }
    }
    let mut body = Vec::new();
    if chunked {
        loop {
            let mut line = String::new();
            r.read_line(&mut line).map_err(|e| format!("{url}: {e}"))?;
            let n = usize::from_str_radix(line.trim(), 16).map_err(|_| format!("{url}: bad chunk size"))?;
            if n == 0 {
                break;
            }
            let mut chunk = vec![0u8; n + 2];
            r.read_exact(&mut chunk).map_err(|e| format!("{url}: {e}"))?;
            body.extend_from_slice(&chunk[..n]);
        }
    } else if let Some(n) = len {
        body.resize(n, 0);
        r.read_exact(&mut body).map_err(|e| format!("{url}: {e}"))?;
    } else {
        r.read_to_end(&mut body).map_err(|e| format!("{url}: {e}"))?;
    }
    let v = if body.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&body).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()))
    };
    Ok((code, v))
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

// ---- server -----------------------------------------------------------------------------

/// Loads a model directory into an engine (the root binary passes the libtorch loader).
/// The second argument is the weight version the engine reports.
pub type Loader = Arc<dyn Fn(&Path, u64) -> Result<Box<dyn RolloutEngine + Send>, RunError> + Send + Sync>;

/// Prefix reuse, counted as a radix cache would: a prompt's cached tokens are its longest prefix
/// already seen; the other samples of a group reuse the whole prompt.
#[derive(Default)]
pub struct PrefixStats {
    seen: HashSet<u64>,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
}

impl PrefixStats {
    /// Records a prompt; returns its cached tokens.
    pub fn record(&mut self, prompt: &[TokenId]) -> usize {
        // Bounded memory: forget everything past a million prefixes (a cache eviction).
        if self.seen.len() > 1_000_000 {
            self.seen.clear();
        }
        let mut h = miles_runtime::rng::Fnv1a::default();
        let mut cached = 0;
        for (i, &t) in prompt.iter().enumerate() {
            h = h.value(t as u64);
            if !self.seen.insert(h.0) && cached == i {
                cached = i + 1;
            }
        }
        self.prompt_tokens += prompt.len() as u64;
        self.cached_tokens += cached as u64;
        cached
    }
    pub fn hit_rate(&self) -> f64 {
        self.cached_tokens as f64 / self.prompt_tokens.max(1) as f64
    }
}

struct ServeState {
    engine: Mutex<Box<dyn RolloutEngine + Send>>,
    loader: Loader,
    model_path: Mutex<PathBuf>,
    /// Canonical: `/update_weights_from_disk` loads only from inside it.
    weights_dir: PathBuf,
    prefix: Mutex<PrefixStats>,
    paused: Mutex<bool>,
    requests: Mutex<u64>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Parses SGLang's `/generate` body into (prompts, per-request params, n).
/// Prompts, one sampling-parameter set per prompt, and whether the request was a batch.
type Parsed = (Vec<Vec<TokenId>>, Vec<SamplingParams>, bool);

fn parse_generate(body: &Value) -> Result<Parsed, String> {
    let ids = body.get("input_ids").ok_or("`input_ids` is required (this server takes token ids, not text)")?;
    let to_ids = |v: &Value| -> Result<Vec<TokenId>, String> {
        v.as_array()
            .ok_or("input_ids must be a list")?
            .iter()
            .map(|x| {
                x.as_u64().map(|x| x as TokenId).ok_or_else(|| "token ids must be non-negative integers".to_string())
            })
            .collect()
    };
    let (prompts, batched) = match ids.as_array().and_then(|a| a.first()) {
        Some(Value::Array(_)) => {
            (ids.as_array().into_iter().flatten().map(to_ids).collect::<Result<Vec<_>, _>>()?, true)
        }
        _ => (vec![to_ids(ids)?], false),
    };
    let sp = body.get("sampling_params").cloned().unwrap_or(json!({}));
    let one = |v: &Value| -> SamplingParams {
        let f = |k: &str, d: f64| v.get(k).and_then(Value::as_f64).unwrap_or(d);
        let temperature = f("temperature", 1.0);
        let top_k = v.get("top_k").and_then(Value::as_i64).unwrap_or(-1);
        SamplingParams {
            max_new_tokens: v.get("max_new_tokens").and_then(Value::as_u64).unwrap_or(128) as usize,
            temperature: if temperature <= 0.0 { 1.0 } else { temperature },
            top_p: f("top_p", 1.0),
            top_k: if top_k <= 0 { 0 } else { top_k as usize },
            stop_tokens: v
                .get("stop_token_ids")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(|x| x.as_u64().map(|x| x as TokenId)).collect())
                .unwrap_or_else(|| vec![miles_runtime::tasks::EOS]),
            greedy: temperature <= 0.0 || top_k == 1,
            seed: v.get("sampling_seed").and_then(Value::as_u64).unwrap_or(0),
        }
    };
    let params: Vec<SamplingParams> = match &sp {
        Value::Array(a) => a.iter().map(one).collect(),
        v => vec![one(v); prompts.len()],
    };
    if params.len() != prompts.len() {
        return Err(format!("{} sampling_params for {} prompts", params.len(), prompts.len()));
    }
    Ok((prompts, params, batched))
}

fn generate_blocking(st: &ServeState, body: &Value) -> Result<Value, (u16, String)> {
    let (prompts, params, batched) = parse_generate(body).map_err(|m| (400, m))?;
    let waited = Instant::now();
    while *lock(&st.paused) {
        // Paused for a weight update: new requests wait, boundedly.
        if waited.elapsed() > Duration::from_secs(120) {
            return Err((503, "generation is paused".into()));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let n = body.pointer("/sampling_params/n").and_then(Value::as_u64).unwrap_or(1).max(1) as usize;
    let mut out = Vec::new();
    let mut engine = lock(&st.engine);
    // Requests with identical prompt and params are one group: the prompt is processed once.
    let mut i = 0;
    while i < prompts.len() {
        let mut j = i + 1;
        while j < prompts.len()
            && prompts[j] == prompts[i]
            && params[j].seed == params[i].seed.wrapping_add((j - i) as u64)
        {
            j += 1;
        }
        let group = (j - i) * n;
        let samples = engine.generate(&prompts[i..i + 1], group, &params[i]).map_err(|e| (500, e.to_string()))?;
        let mut prefix = lock(&st.prefix);
        for (k, s) in samples.iter().enumerate() {
            let cached = if k == 0 {
                prefix.record(&prompts[i])
            } else {
                prefix.prompt_tokens += prompts[i].len() as u64;
                prefix.cached_tokens += prompts[i].len() as u64;
                prompts[i].len()
            };
            out.push(json!({
                "text": "",
                "output_ids": s.response,
                "meta_info": {
                    "id": format!("{}-{k}", *lock(&st.requests)),
                    "finish_reason": {"type": match s.finish { FinishReason::Stop => "stop", FinishReason::Length => "length" }},
                    "prompt_tokens": prompts[i].len(),
                    "completion_tokens": s.response.len(),
                    "cached_tokens": cached,
                    "weight_version": s.weight_version.to_string(),
                    "output_token_logprobs": s.logprobs.iter().zip(&s.response).map(|(lp, id)| json!([lp, id, null])).collect::<Vec<_>>(),
                }
            }));
        }
        i = j;
    }
    *lock(&st.requests) += 1;
    Ok(if batched || out.len() > 1 { Value::Array(out) } else { out.pop().unwrap_or(Value::Null) })
}

/// What `miles serve` was started with.
pub struct ServeOptions {
    /// Listen address (`host:port`).
    pub bind: String,
    /// The model directory loaded first.
    pub model_path: PathBuf,
    /// The one directory `/update_weights_from_disk` loads from; None: `model_path`'s parent.
    /// Created if missing.
    pub weights_dir: Option<PathBuf>,
    /// The key every call but `/health*` and `/metrics` must carry as `Authorization: Bearer`.
    pub api_key: Option<String>,
}

/// Whether a listen address reaches only this host: an IP in 127.0.0.0/8 or `::1` (also as
/// `::ffff:127.x.y.z`), or the name `localhost`. Anything else (`0.0.0.0`, `::`, another name) is
/// taken as reachable from elsewhere.
pub fn is_loopback_bind(bind: &str) -> bool {
    use std::net::{IpAddr, SocketAddr};
    fn loopback(ip: IpAddr) -> bool {
        match ip {
            IpAddr::V4(v4) => v4.is_loopback(),
            IpAddr::V6(v6) => v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback()),
        }
    }
    if let Ok(a) = bind.parse::<SocketAddr>() {
        return loopback(a.ip());
    }
    let host = bind.rsplit_once(':').map_or(bind, |(h, _)| h);
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    match host.parse::<IpAddr>() {
        Ok(ip) => loopback(ip),
        Err(_) => host.eq_ignore_ascii_case("localhost"),
    }
}

/// A server anyone else can reach must have a key: refuses a non-loopback `bind` without one.
pub fn check_bind(bind: &str, api_key: Option<&str>) -> Result<(), String> {
    if api_key.is_some() || is_loopback_bind(bind) {
        return Ok(());
    }
    Err(format!(
        "refusing to listen on {bind} without an API key: the address is not loopback, and whoever reaches it \
         could generate and replace the weights; pass --api-key KEY or set {API_KEY_ENV} (clients then send \
         `Authorization: Bearer KEY`), or bind to 127.0.0.1"
    ))
}

/// `requested`, resolved (`..` and symlinks followed), if it lies inside `root` (itself resolved,
/// as `std::fs::canonicalize` gives it). The resolved path is what is to be loaded, so a symlink
/// cannot point the load elsewhere after the check. Err: (HTTP status, message).
pub fn confine(root: &Path, requested: &Path) -> Result<PathBuf, (u16, String)> {
    let real = std::fs::canonicalize(requested)
        .map_err(|e| (400, format!("model_path {}: {e}; the current weights stay in use", requested.display())))?;
    if real.starts_with(root) {
        Ok(real)
    } else {
        Err((
            403,
            format!(
                "model_path {} resolves to {}, outside the weights directory {} this server was started with \
                 (--weights-dir); the current weights stay in use",
                requested.display(),
                real.display(),
                root.display()
            ),
        ))
    }
}

/// Whether an `Authorization` header carries `key` as a bearer token (scheme in any case, as
/// SGLang takes it), compared in constant time.
fn bearer_ok(header: Option<&str>, key: &str) -> bool {
    let Some((scheme, token)) = header.and_then(|h| h.split_once(' ')) else { return false };
    // Both sides of the comparison are always evaluated: a wrong scheme costs what a wrong key does.
    let ok = crate::auth::token_eq(token, key);
    scheme.eq_ignore_ascii_case("bearer") && ok
}

/// Paths served without a key, as SGLang does (`/health`, `/health_generate`, `/metrics`): liveness
/// probes and metric scrapers carry no secrets. Nothing here reads or changes the model.
fn open_path(path: &str) -> bool {
    path.starts_with("/health") || path.starts_with("/metrics")
}

/// Serves the API until the process ends. `on_ready` gets the bound address.
pub fn serve(opts: ServeOptions, loader: Loader, on_ready: impl FnOnce(&str)) -> Result<(), String> {
    use axum::extract::State;
    use axum::http::StatusCode;
    use axum::routing::{get, post};
    use axum::Json;
    let ServeOptions { bind, model_path, weights_dir, api_key } = opts;
    let api_key = api_key.filter(|k| !k.is_empty());
    if let Some(k) = &api_key {
        if !valid_api_key(k) {
            return Err("the API key must be printable ASCII without spaces (it travels in an HTTP header)".into());
        }
    }
    // Before anything slow: an exposed server without a key does not start at all.
    check_bind(&bind, api_key.as_deref())?;
    let weights_dir = match weights_dir {
        Some(d) => d,
        None => std::fs::canonicalize(&model_path)
            .map_err(|e| format!("{}: {e}", model_path.display()))?
            .parent()
            .map(Path::to_path_buf)
            .ok_or_else(|| format!("{} has no parent directory: pass --weights-dir", model_path.display()))?,
    };
    std::fs::create_dir_all(&weights_dir).map_err(|e| format!("--weights-dir {}: {e}", weights_dir.display()))?;
    let weights_dir =
        std::fs::canonicalize(&weights_dir).map_err(|e| format!("--weights-dir {}: {e}", weights_dir.display()))?;
    let engine = loader(&model_path, 0).map_err(|e| e.to_string())?;
    let st = Arc::new(ServeState {
        engine: Mutex::new(engine),
        loader,
        model_path: Mutex::new(model_path),
        weights_dir,
        prefix: Mutex::new(PrefixStats::default()),
        paused: Mutex::new(false),
        requests: Mutex::new(0),
    });
    type Reply = (StatusCode, Json<Value>);
    fn fail(code: u16, m: String) -> Reply {
        (
            StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            Json(json!({"error": {"message": m}})),
        )
    }
    async fn blocking(
        st: Arc<ServeState>,
        f: impl FnOnce(&ServeState) -> Result<Value, (u16, String)> + Send + 'static,
    ) -> Reply {
        match tokio::task::spawn_blocking(move || f(&st)).await {
            Ok(Ok(v)) => (StatusCode::OK, Json(v)),
            Ok(Err((c, m))) => fail(c, m),
            Err(e) => fail(500, e.to_string()),
        }
    }
    /// The key check, before any handler (and before a body is read).
    async fn check_key(
        State(key): State<Arc<Option<String>>>,
        req: axum::extract::Request,
        next: axum::middleware::Next,
    ) -> axum::response::Response {
        use axum::response::IntoResponse;
        if let Some(k) = key.as_deref() {
            if !open_path(req.uri().path()) {
                let h = req.headers().get(axum::http::header::AUTHORIZATION).and_then(|v| v.to_str().ok());
                if !bearer_ok(h, k) {
                    let m = if h.is_none() { "this server wants `Authorization: Bearer KEY`" } else { "wrong API key" };
                    let mut r = fail(401, format!("Unauthorized: {m}")).into_response();
                    r.headers_mut()
                        .insert(axum::http::header::WWW_AUTHENTICATE, axum::http::HeaderValue::from_static("Bearer"));
                    return r;
                }
            }
        }
        next.run(req).await
    }
    let needs_key = api_key.is_some();
    let app = axum::Router::new()
        .route("/generate", post(|State(st): State<Arc<ServeState>>, Json(b): Json<Value>| async move { blocking(st, move |s| generate_blocking(s, &b)).await }))
        .route("/health", get(|| async { StatusCode::OK }))
        .route("/health_generate", get(|| async { StatusCode::OK }))
        .route("/model_info", get(|State(st): State<Arc<ServeState>>| async move {
            Json(json!({"model_path": *lock(&st.model_path), "is_generation": true, "weight_version": lock(&st.engine).weight_version().to_string()}))
        }))
        .route("/get_server_info", get(|State(st): State<Arc<ServeState>>| async move {
            let p = lock(&st.prefix);
            Json(json!({"prefix_cache": {"prompt_tokens": p.prompt_tokens, "cached_tokens": p.cached_tokens, "hit_rate": p.hit_rate()}, "paused": *lock(&st.paused)}))
        }))
        .route("/metrics", get(|State(st): State<Arc<ServeState>>| async move {
            let p = lock(&st.prefix);
            format!("# TYPE sglang:cache_hit_rate gauge\nsglang:cache_hit_rate {}\nmiles:prompt_tokens_total {}\nmiles:cached_tokens_total {}\n", p.hit_rate(), p.prompt_tokens, p.cached_tokens)
        }))
        .route("/flush_cache", post(|State(st): State<Arc<ServeState>>| async move { *lock(&st.prefix) = PrefixStats::default(); Json(json!({"success": true})) }))
        .route("/pause_generation", post(|State(st): State<Arc<ServeState>>| async move { *lock(&st.paused) = true; Json(json!({"success": true})) }))
        .route("/continue_generation", post(|State(st): State<Arc<ServeState>>| async move { *lock(&st.paused) = false; Json(json!({"success": true})) }))
        .route("/abort_request", post(|| async { Json(json!({"success": true})) }))
        .route("/update_weights_from_disk", post(|State(st): State<Arc<ServeState>>, Json(b): Json<Value>| async move {
            blocking(st, move |s| {
                let path = b.get("model_path").and_then(Value::as_str).ok_or((400, "`model_path` is required".to_string()))?;
                let version = b.get("weight_version").and_then(|w| w.as_u64().or_else(|| w.as_str().and_then(|x| x.parse().ok())));
                // Only inside --weights-dir; a refusal leaves the current weights in place.
                let path = confine(&s.weights_dir, Path::new(path))?;
                let mut fresh = (s.loader)(&path, version.unwrap_or(0)).map_err(|e| (400, e.to_string()))?;
                let mut e = lock(&s.engine);
                std::mem::swap(&mut *e, &mut fresh);
                *lock(&s.model_path) = path;
                *lock(&s.prefix) = PrefixStats::default();
                Ok(json!({"success": true, "message": "loaded", "weight_version": e.weight_version().to_string()}))
            })
            .await
        }))
        .route("/update_weights_from_tensor", post(|| async { fail(501, "needs a GPU process group; use /update_weights_from_disk".into()) }))
        .route("/init_weights_update_group", post(|| async { fail(501, "NCCL groups need GPUs; use /update_weights_from_disk".into()) }))
        .route("/update_weights_from_distributed", post(|| async { fail(501, "NCCL groups need GPUs; use /update_weights_from_disk".into()) }))
        .with_state(st)
        .layer(axum::middleware::from_fn_with_state(Arc::new(api_key), check_key));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async move {
        let l = tokio::net::TcpListener::bind(&bind).await.map_err(|e| format!("cannot listen on {bind}: {e}"))?;
        let addr = l.local_addr().map_err(|e| e.to_string())?;
        // The name may have resolved elsewhere than loopback (`localhost` in /etc/hosts).
        if !needs_key {
            check_bind(&addr.to_string(), None)?;
        }
        on_ready(&addr.to_string());
        axum::serve(l, app).await.map_err(|e| e.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_reuse_is_counted_like_a_radix_cache() {
        let mut p = PrefixStats::default();
        assert_eq!(p.record(&[1, 2, 3, 4]), 0);
        assert_eq!(p.record(&[1, 2, 3, 4]), 4);
        assert_eq!(p.record(&[1, 2, 9]), 2);
        assert_eq!(p.record(&[7, 2, 3]), 0);
        assert_eq!((p.prompt_tokens, p.cached_tokens), (14, 6));
    }

    #[test]
    fn generate_body_and_parse_follow_sglang() {
        let p = SamplingParams::plain(4, 5);
        let b = generate_body(&[vec![5, 6], vec![7]], 2, &p);
        assert_eq!(b["input_ids"], json!([[5, 6], [5, 6], [7], [7]]));
        assert_eq!(b["sampling_params"][1]["sampling_seed"], 6);
        assert_eq!(b["sampling_params"][0]["top_k"], -1);
        let (prompts, params, batched) = parse_generate(&b).unwrap();
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

    #[test]
    fn loopback_addresses_and_the_key_rule() {
        for b in
            ["127.0.0.1:30000", "127.3.2.1:0", "[::1]:8080", "localhost:30000", "LOCALHOST:1", "[::ffff:127.0.0.1]:5"]
        {
            assert!(is_loopback_bind(b), "{b}");
            assert!(check_bind(b, None).is_ok(), "{b}");
        }
        for b in [
            "0.0.0.0:0",
            "[::]:30000",
            "10.0.0.5:30000",
            "128.0.0.1:1",
            "example.com:80",
            "localhost.evil:1",
            "[::2]:1",
        ] {
            assert!(!is_loopback_bind(b), "{b}");
            let e = check_bind(b, None).unwrap_err();
            assert!(e.contains(b) && e.contains("--api-key") && e.contains(API_KEY_ENV), "{e}");
            assert!(check_bind(b, Some("k")).is_ok(), "{b}");
        }
    }

    #[test]
    fn bearer_tokens() {
        assert!(bearer_ok(Some("Bearer s3cret"), "s3cret"));
        assert!(bearer_ok(Some("bearer s3cret"), "s3cret"));
        for h in [
            None,
            Some("Bearer"),
            Some("Bearer "),
            Some("Bearer s3cre"),
            Some("Bearer s3cretx"),
            Some("Basic s3cret"),
            Some("s3cret"),
        ] {
            assert!(!bearer_ok(h, "s3cret"), "{h:?}");
        }
        assert!(open_path("/health") && open_path("/health_generate") && open_path("/metrics"));
        assert!(!open_path("/generate") && !open_path("/update_weights_from_disk") && !open_path("/model_info"));
        assert!(
            valid_api_key("abc-123_XYZ") && !valid_api_key("") && !valid_api_key("a b") && !valid_api_key("a\r\nX: y")
        );
    }

    #[test]
    fn weight_paths_stay_inside_the_weights_dir() {
        let base = std::env::temp_dir().join(format!("miles-confine-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let (root, outside) = (base.join("weights"), base.join("weights-other"));
        std::fs::create_dir_all(root.join("v1")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("link")).unwrap();
        std::os::unix::fs::symlink(root.join("v1"), base.join("link-in")).unwrap();
        let root = std::fs::canonicalize(&root).unwrap();
        assert_eq!(confine(&root, &root.join("v1")).unwrap(), root.join("v1"));
        assert_eq!(confine(&root, &root.join("v1/../v1")).unwrap(), root.join("v1"));
        // A link from outside to inside is fine: what is loaded is inside.
        assert_eq!(confine(&root, &base.join("link-in")).unwrap(), root.join("v1"));
        for p in [root.join("../weights-other"), root.join("v1/../../weights-other"), root.join("link"), base.clone()] {
            let (code, m) = confine(&root, &p).unwrap_err();
            assert_eq!(code, 403, "{p:?}: {m}");
            assert!(m.contains("outside the weights directory") && m.contains("--weights-dir"), "{m}");
        }
        // A sibling whose name starts like the root is outside (components, not characters).
        assert_eq!(confine(&root, &outside).unwrap_err().0, 403);
        assert_eq!(confine(&root, &root.join("missing")).unwrap_err().0, 400);
        let _ = std::fs::remove_dir_all(&base);
    }
}
