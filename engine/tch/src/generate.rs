//! Batched sampling with a KV cache. Each group's prompt is prefilled once; the cache rows are
//! then repeated for its n samples. Sampling itself happens in Rust on the logits of each step
//! (vocabularies here are small), driven by our seeded RNG: same seed, same samples.

use crate::model::{backend_err, left_pad, KvCache, Policy};
use crate::moe::{used_ids, Route};
use miles_runtime::rng::Rng;
use miles_runtime::tasks::{TokenId, PAD};
use miles_runtime::{FinishReason, RouteId, Routing, RunError, Sample, SamplingParams, E_TOO_LONG};
use tch::{Kind, Tensor};

/// Generates `n` samples per prompt. `use_cache = false` recomputes the whole prefix at every
/// token (only for benchmarks and tests: same result, quadratic cost).
pub fn generate(
    policy: &Policy,
    prompts: &[Vec<TokenId>],
    n: usize,
    params: &SamplingParams,
    version: u64,
    use_cache: bool,
) -> Result<Vec<Sample>, RunError> {
    generate_recording(policy, prompts, n, params, version, use_cache, None)
}

/// `generate`, recording (R3) every forwarded token's routed experts in `record`'s id type when
/// the policy has MoE layers: the prompt's from the prefill, each response token's from the
/// decode step that fed it. Recording needs the KV-cache path (the recompute path is for
/// benchmarks) and leaves the samples bit-identical.
pub fn generate_recording(
    policy: &Policy,
    prompts: &[Vec<TokenId>],
    n: usize,
    params: &SamplingParams,
    version: u64,
    use_cache: bool,
    record: Option<RouteId>,
) -> Result<Vec<Sample>, RunError> {
    if policy.invariant {
        return generate_invariant(policy, prompts, n, params, version, record);
    }
    let record = record.filter(|_| use_cache).and_then(|id| policy.cfg.moe.as_ref().map(|m| (id, m)));
    if prompts.is_empty() || n == 0 {
        return Ok(Vec::new());
    }
    let _g = tch::no_grad_guard();
    let mut d = Decode::prefill(policy, prompts, n, params, use_cache, record.is_some())?;
    let mut out: Vec<Sample> = (0..d.rows.len())
        .map(|i| Sample {
            prompt_index: i / n,
            response: Vec::new(),
            logprobs: Vec::new(),
            finish: FinishReason::Length,
            weight_version: version,
            routing: record.map(|(id, m)| Routing::new(m.moe_layers(policy.cfg.n_layers), m.top_k, id)),
        })
        .collect();
    d.record_prompts(&mut out);
    let mut rng = Rng::new(params.seed);
    let mut done = vec![false; out.len()];
    let mut scratch = Vec::with_capacity(policy.cfg.vocab_size);
    for t in 0..d.max_new {
        let next = d.sample(&mut out, &mut done, params, &mut rng, &mut scratch)?;
        if done.iter().all(|&x| x) || t + 1 == d.max_new {
            break;
        }
        d.step(t, &next);
        d.record_step(&mut out, t);
    }
    // The engine forwards every token but a response's last (a row that finished while others
    // went on fed its last one too): keep prompt + response - 1, what the trainer replays.
    for s in &mut out {
        let keep = (prompt_len_of(s, prompts) + s.response.len()).saturating_sub(1);
        if let Some(r) = s.routing.as_mut() {
            r.truncate(keep);
        }
    }
    Ok(out)
}

/// One batch's decoding state: every sample's row (each prompt's repeated n times), the columns
/// fed so far (left-padded prompts, then one column per step), the KV cache (or none: every step
/// recomputes the whole prefix), the route being recorded and the logits of each row's last token.
struct Decode<'p> {
    policy: &'p Policy,
    /// Each sample's prompt (its row in the prefill).
    rows: Vec<i64>,
    prompt_len: Vec<i64>,
    /// Tokens each sample may still add: `max_new_tokens` within the model's `max_len`.
    budget: Vec<usize>,
    /// Steps the longest budget allows.
    max_new: usize,
    /// Width of the left-padded prompt block; new tokens follow it.
    width: i64,
    key_valid: Tensor,
    tokens: Tensor,
    positions: Tensor,
    cache: Option<KvCache>,
    route: Option<Route>,
    /// Logits [rows, V] of each sample's last fed token.
    last: Tensor,
}

impl<'p> Decode<'p> {
    /// Prefills each prompt once (recording its route when `record`) and repeats its cache rows
    /// for its n samples.
    fn prefill(
        policy: &'p Policy,
        prompts: &[Vec<TokenId>],
        n: usize,
        params: &SamplingParams,
        use_cache: bool,
        record: bool,
    ) -> Result<Decode<'p>, RunError> {
        let max_len = policy.cfg.max_len;
        let longest = prompts.iter().map(|p| p.len()).max().unwrap_or(0);
        if longest == 0 || longest >= max_len {
            return Err(RunError::new(
                E_TOO_LONG,
                format!("prompt of {longest} tokens does not fit model max_len {max_len} (or is empty)"),
            ));
        }
        let seqs: Vec<Vec<i64>> = prompts.iter().map(|p| p.iter().map(|&t| t as i64).collect()).collect();
        let (tokens, valid, positions, lp) = left_pad(&seqs);
        // The left-padded prompt block ends at column lp; new tokens follow. Positions never exceed
        // max_len - 1: a row reaching that length stops with `length`. Each row has its own budget,
        // so one long context (an episode's later turn) does not cut the others' short.
        let shortest = prompts.iter().map(|p| p.len()).min().unwrap_or(0);
        let max_new = params.max_new_tokens.min(max_len - shortest);
        let cap = lp + max_new as i64;
        let p = prompts.len() as i64;
        let bsz = p * n as i64;
        let rows: Vec<i64> = (0..p).flat_map(|i| std::iter::repeat_n(i, n)).collect();
        let rows_t = crate::device::from_slice(&rows);
        let prompt_len: Vec<i64> = rows.iter().map(|&i| seqs[i as usize].len() as i64).collect();
        let budget: Vec<usize> = prompt_len.iter().map(|&l| params.max_new_tokens.min(max_len - l as usize)).collect();

        let block = |x: &Tensor, kind: Kind| {
            let all = Tensor::zeros([bsz, cap], (kind, crate::device::current()));
            all.narrow(1, 0, lp).copy_(&x.index_select(0, &rows_t));
            all
        };
        let (key_valid, all_tokens, all_pos) =
            (block(&valid, Kind::Bool), block(&tokens, Kind::Int64), block(&positions, Kind::Int64));
        let mut cache = use_cache.then(|| KvCache::new(policy, p, cap));
        let mut route = record.then(Route::default);
        let logits = policy.forward_routed(&tokens, &positions, &valid, cache.as_mut(), route.as_mut());
        if let Some(c) = cache.as_mut() {
            c.select_rows(&rows_t);
        }
        let last = logits.select(1, lp - 1).index_select(0, &rows_t);
        Ok(Decode {
            policy,
            rows,
            prompt_len,
            budget,
            max_new,
            width: lp,
            key_valid,
            tokens: all_tokens,
            positions: all_pos,
            cache,
            route,
            last,
        })
    }

    /// The prompt's routing: prefill row rows[i], its real (last prompt_len) columns.
    fn record_prompts(&self, out: &mut [Sample]) {
        let Some((ids, [_, t, l, k])) = self.route.as_ref().and_then(used_ids) else { return };
        for (i, s) in out.iter_mut().enumerate() {
            let (row, len) = (self.rows[i] as usize, self.prompt_len[i] as usize);
            if let Some(r) = s.routing.as_mut() {
                for col in t - len..t {
                    let at = (row * t + col) * l * k;
                    r.push_token(&ids[at..at + l * k]);
                }
            }
        }
    }

    /// Samples each unfinished row's next token from `last`, in row order (the RNG's order);
    /// returns the tokens to feed (PAD for finished rows).
    fn sample(
        &self,
        out: &mut [Sample],
        done: &mut [bool],
        params: &SamplingParams,
        rng: &mut Rng,
        scratch: &mut Vec<(f64, usize)>,
    ) -> Result<Vec<i64>, RunError> {
        let vocab = self.policy.cfg.vocab_size;
        let logits: Vec<f32> = Vec::<f32>::try_from(self.last.contiguous().view([-1])).map_err(backend_err)?;
        let mut next = vec![PAD as i64; out.len()];
        for i in 0..out.len() {
            if done[i] {
                continue;
            }
            let row = &logits[i * vocab..(i + 1) * vocab];
            let (tok, lp) = sample_token(row, params, rng, scratch);
            out[i].response.push(tok);
            out[i].logprobs.push(lp);
            next[i] = tok as i64;
            if params.stop_tokens.contains(&tok) {
                out[i].finish = FinishReason::Stop;
                done[i] = true;
            } else if out[i].response.len() >= self.budget[i] {
                done[i] = true;
            }
        }
        Ok(next)
    }

    /// Feeds step `t`'s tokens `next` (column width + t) and keeps the logits they give.
    fn step(&mut self, t: usize, next: &[i64]) {
        let (policy, bsz) = (self.policy, self.rows.len() as i64);
        let max_len = policy.cfg.max_len as i64;
        let col = self.width + t as i64;
        let next_t = crate::device::from_slice(next).view([bsz, 1]);
        // A finished row keeps feeding PAD; its position stays inside the rotary table.
        let pos: Vec<i64> = self.prompt_len.iter().map(|&l| (l + t as i64).min(max_len - 1)).collect();
        let pos_t = crate::device::from_slice(&pos).view([bsz, 1]);
        let _ = self.key_valid.narrow(1, col, 1).fill_(1);
        self.tokens.narrow(1, col, 1).copy_(&next_t);
        self.positions.narrow(1, col, 1).copy_(&pos_t);
        if let Some(r) = self.route.as_mut() {
            *r = Route::default();
        }
        let valid = self.key_valid.narrow(1, 0, col + 1);
        self.last = match self.cache.as_mut() {
            Some(c) => policy.forward_routed(&next_t, &pos_t, &valid, Some(c), self.route.as_mut()).select(1, 0),
            None => policy
                .forward(&self.tokens.narrow(1, 0, col + 1), &self.positions.narrow(1, 0, col + 1), &valid, None)
                .select(1, col),
        };
    }

    /// Step `t`'s routing: rows that sampled token t fed it to this step.
    fn record_step(&self, out: &mut [Sample], t: usize) {
        let Some((ids, [_, _, l, k])) = self.route.as_ref().and_then(used_ids) else { return };
        for (i, s) in out.iter_mut().enumerate() {
            if s.response.len() == t + 1 {
                if let Some(r) = s.routing.as_mut() {
                    r.push_token(&ids[i * l * k..(i + 1) * l * k]);
                }
            }
        }
    }
}

fn prompt_len_of(s: &Sample, prompts: &[Vec<TokenId>]) -> usize {
    prompts.get(s.prompt_index).map_or(0, Vec::len)
}

/// Picks a token from one row of logits. The reported log-prob is that of the temperature-scaled
/// full distribution (top-k/top-p only restrict the choice): the quantity the trainer recomputes.
pub fn sample_token(
    logits: &[f32],
    params: &SamplingParams,
    rng: &mut Rng,
    scratch: &mut Vec<(f64, usize)>,
) -> (TokenId, f32) {
    let temp = if params.greedy { 1.0 } else { params.temperature };
    let z: Vec<f64> = logits.iter().map(|&x| x as f64 / temp).collect();
    let m = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let lse = m + z.iter().map(|&x| (x - m).exp()).sum::<f64>().ln();
    let logp = |i: usize| (z[i] - lse) as f32;
    if params.greedy {
        // First maximum: ties break toward the lower id, deterministically.
        let mut best = 0;
        for i in 1..z.len() {
            if z[i] > z[best] {
                best = i;
            }
        }
        return (best as TokenId, logp(best));
    }
    scratch.clear();
    scratch.extend(z.iter().enumerate().map(|(i, &x)| ((x - lse).exp(), i)));
    // Descending probability, ties by id, so the order is deterministic.
    scratch.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    let mut keep = scratch.len();
    if params.top_k > 0 {
        keep = keep.min(params.top_k);
    }
    if params.top_p < 1.0 {
        let mut acc = 0.0;
        for (j, (pr, _)) in scratch.iter().take(keep).enumerate() {
            acc += pr;
            if acc >= params.top_p {
                keep = j + 1;
                break;
            }
        }
    }
    let kept = &scratch[..keep.max(1)];
    let total: f64 = kept.iter().map(|x| x.0).sum();
    let mut u = rng.next_f64() * total;
    let mut chosen = kept[kept.len() - 1].1;
    for &(pr, i) in kept {
        if u < pr {
            chosen = i;
            break;
        }
        u -= pr;
    }
    (chosen as TokenId, logp(chosen))
}

/// Batch-invariant sampling: every sample in its own slot of the continuous-batching engine, whose
/// attention spans every `max_len` column as the trainer's does, each sample drawing from its own
/// seeded stream (`derive_seed(seed, "invariant", i)`).
fn generate_invariant(
    policy: &Policy,
    prompts: &[Vec<TokenId>],
    n: usize,
    params: &SamplingParams,
    version: u64,
    record: Option<RouteId>,
) -> Result<Vec<Sample>, RunError> {
    use miles_runtime::{GenRequest, StreamEngine};
    let total = prompts.len() * n;
    let mut engine = crate::stream::TchStreamEngine::new(policy.shallow(), total);
    engine.record = record;
    for i in 0..total {
        let seed = miles_runtime::rng::derive_seed(params.seed, "invariant", i as u64);
        engine.submit(GenRequest {
            id: i as u64,
            prompt: prompts[i / n].clone(),
            params: SamplingParams { seed, ..params.clone() },
        })?;
    }
    let mut out: Vec<Option<Sample>> = (0..total).map(|_| None).collect();
    let mut left = total;
    // Each step samples a token for every slot: a sample ends within max_new_tokens steps.
    for _ in 0..=params.max_new_tokens + 1 {
        for s in engine.step()? {
            if let Some(slot) = out.get_mut(s.id as usize) {
                *slot = Some(Sample {
                    prompt_index: s.id as usize / n,
                    response: s.response,
                    logprobs: s.logprobs,
                    finish: s.finish,
                    weight_version: version,
                    routing: s.routing,
                });
                left -= 1;
            }
        }
        if left == 0 {
            break;
        }
    }
    out.into_iter()
        .map(|s| s.ok_or_else(|| RunError::new(miles_runtime::E_BACKEND, "a batch-invariant sample did not finish")))
        .collect()
}
