//! SGLang's `/generate` on the server side: the body read into prompts, one parameter set per
//! prompt and `n`, checked against the server's limits, and answered in SGLang's shape (prompt-
//! major, `n` completions per prompt; one object for one prompt with `n = 1`).

use super::limits::{Limits, Refusal};
use super::serve::{lock, ServeState};
use miles_runtime::tasks::TokenId;
use miles_runtime::{FinishReason, SamplingParams};
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// A `/generate` body, read.
pub(super) struct Parsed {
    pub prompts: Vec<Vec<TokenId>>,
    /// One set per prompt.
    pub params: Vec<SamplingParams>,
    /// Completions per prompt (`sampling_params.n`, the same in every set, as SGLang wants).
    pub n: usize,
    /// Whether `input_ids` was a list of prompts (answered with a list).
    pub batched: bool,
}

/// `n` of one parameter set: a positive integer, 1 when absent.
fn n_of(v: &Value) -> Result<usize, String> {
    match v.get("n") {
        None | Some(Value::Null) => Ok(1),
        Some(x) => x
            .as_u64()
            .filter(|&n| n >= 1)
            .map(|n| usize::try_from(n).unwrap_or(usize::MAX))
            .ok_or_else(|| format!("sampling_params.n must be a positive integer, not {x}")),
    }
}

fn params_of(v: &Value) -> SamplingParams {
    let f = |k: &str, d: f64| v.get(k).and_then(Value::as_f64).unwrap_or(d);
    let temperature = f("temperature", 1.0);
    let top_k = v.get("top_k").and_then(Value::as_i64).unwrap_or(-1);
    SamplingParams {
        max_new_tokens: v
            .get("max_new_tokens")
            .and_then(Value::as_u64)
            .map_or(128, |m| usize::try_from(m).unwrap_or(usize::MAX)),
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
}

/// Reads SGLang's `/generate` body.
pub(super) fn parse_generate(body: &Value) -> Result<Parsed, String> {
    let ids = body.get("input_ids").ok_or("`input_ids` is required (this server takes token ids, not text)")?;
    let to_ids = |v: &Value| -> Result<Vec<TokenId>, String> {
        v.as_array()
            .ok_or("input_ids must be a list")?
            .iter()
            .map(|x| {
                x.as_u64()
                    .and_then(|x| TokenId::try_from(x).ok())
                    .ok_or_else(|| "token ids must be non-negative 32-bit integers".to_string())
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
    let (params, n) = match &sp {
        Value::Array(a) => {
            let ns = a.iter().map(n_of).collect::<Result<Vec<_>, _>>()?;
            if ns.windows(2).any(|w| w[0] != w[1]) {
                return Err("every sampling_params entry must have the same `n` (as SGLang requires)".into());
            }
            (a.iter().map(params_of).collect::<Vec<_>>(), ns.first().copied().unwrap_or(1))
        }
        v => (vec![params_of(v); prompts.len()], n_of(v)?),
    };
    if params.len() != prompts.len() {
        return Err(format!("{} sampling_params for {} prompts", params.len(), prompts.len()));
    }
    Ok(Parsed { prompts, params, n, batched })
}

/// A `/generate` body read and held to the server's limits: what the server does with every
/// body before it reaches the engine (and what fuzz/fuzz_targets/generate_request.rs feeds).
pub(super) fn read_request(body: &Value, limits: &Limits) -> Result<Parsed, String> {
    let parsed = parse_generate(body)?;
    let max_new: Vec<usize> = parsed.params.iter().map(|p| p.max_new_tokens).collect();
    limits.check(&parsed.prompts, &max_new, parsed.n)?;
    Ok(parsed)
}

/// A raw `/generate` body checked as the server checks it: JSON, then SGLang's shape, then the
/// limits. Returns the number of completions it asks for. The fuzz target's entry point.
pub fn check_generate_body(body: &[u8], limits: &Limits) -> Result<usize, String> {
    let v: Value = serde_json::from_slice(body).map_err(|e| format!("the request body is not JSON: {e}"))?;
    let p = read_request(&v, limits)?;
    Ok(p.prompts.len().saturating_mul(p.n))
}

fn past() -> Refusal {
    (504, "the request's deadline passed (--request-timeout); it was abandoned".into())
}

/// Answers one `/generate` body on a blocking thread; stops between prompt groups once
/// `deadline` has passed (the client has been answered 504 by then).
pub(super) fn generate_blocking(st: &ServeState, body: &Value, deadline: Instant) -> Result<Value, Refusal> {
    let Parsed { prompts, params, n, batched } = read_request(body, &st.limits).map_err(|m| (400, m))?;
    let waited = Instant::now();
    while st.paused.load(Ordering::SeqCst) {
        // Paused for a weight update: new requests wait, boundedly.
        if waited.elapsed() > Duration::from_secs(120) {
            return Err((503, "generation is paused".into()));
        }
        if Instant::now() >= deadline {
            return Err(past());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let id = st.requests.fetch_add(1, Ordering::SeqCst);
    let mut out = Vec::new();
    let mut engine = lock(&st.engine);
    // Requests with identical prompt and params are one group: the prompt is processed once.
    let mut i = 0;
    while i < prompts.len() {
        if Instant::now() >= deadline {
            return Err(past());
        }
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
                    "id": format!("{id}-{}", out.len()),
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
    Ok(if batched || out.len() > 1 { Value::Array(out) } else { out.pop().unwrap_or(Value::Null) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn n_is_read_from_one_set_or_every_set() {
        let p = parse_generate(&json!({"input_ids": [[1], [2]], "sampling_params": {"n": 4}})).unwrap();
        assert_eq!((p.n, p.params.len(), p.batched), (4, 2, true));
        let p = parse_generate(&json!({"input_ids": [[1], [2]], "sampling_params": [{"n": 3}, {"n": 3}]})).unwrap();
        assert_eq!(p.n, 3);
        let p = parse_generate(&json!({"input_ids": [1, 2]})).unwrap();
        assert_eq!((p.n, p.prompts.len(), p.batched), (1, 1, false));
        for bad in [json!({"n": 0}), json!({"n": -2}), json!({"n": 2.5}), json!({"n": "3"})] {
            let e = parse_generate(&json!({"input_ids": [1], "sampling_params": bad})).err().unwrap();
            assert!(e.contains("positive integer"), "{e}");
        }
        let e = parse_generate(&json!({"input_ids": [[1], [2]], "sampling_params": [{"n": 2}, {}]})).err().unwrap();
        assert!(e.contains("same `n`"), "{e}");
        let e = parse_generate(&json!({"input_ids": [1, 4294967296u64]})).err().unwrap();
        assert!(e.contains("32-bit"), "{e}");
    }
}
