//! Continuous batching for the asynchronous schedules: up to `slots` samples in flight, each in
//! its own KV-cache slot (`SlotCache`), all advanced by one token per `step`. A new request is
//! prefilled at the next step into a free slot, so a finished sample's slot is reused at once.
//! Weights can be swapped between two steps; samples in flight continue under the new weights
//! (their cache stays as computed) and record the version of every token they sample.

use crate::generate::sample_token;
use crate::model::{backend_err, Policy, SlotCache};
use crate::moe::{used_ids, Route};
use miles_runtime::rng::Rng;
use miles_runtime::tasks::{TokenId, PAD};
use miles_runtime::{
    FinishReason, GenRequest, RouteId, Routing, RunError, SamplingParams, StreamEngine, StreamSample, VersionSpan,
    WeightSnapshot, E_TOO_LONG,
};
use std::collections::VecDeque;
use tch::Tensor;

struct Slot {
    id: u64,
    params: SamplingParams,
    rng: Rng,
    /// Tokens in the cache (prompt + sampled), = the position of the next token.
    len: usize,
    /// Logits for the next token (computed under `versions.last()` unless a swap came after).
    next_logits: Vec<f32>,
    response: Vec<TokenId>,
    logprobs: Vec<f32>,
    versions: Vec<VersionSpan>,
    /// R3: every token fed so far (prompt, then each sampled token but the pending one).
    routing: Option<Routing>,
}

pub struct TchStreamEngine {
    pub policy: Policy,
    version: u64,
    cache: SlotCache,
    slots: Vec<Option<Slot>>,
    queued: VecDeque<GenRequest>,
    scratch: Vec<(f64, usize)>,
    /// R3: record routed experts in this id type (an MoE policy); None: do not.
    pub record: Option<RouteId>,
}

impl TchStreamEngine {
    pub fn new(policy: Policy, slots: usize) -> TchStreamEngine {
        let slots = slots.max(1);
        let cache = SlotCache::new(&policy, slots as i64);
        TchStreamEngine {
            policy,
            version: 0,
            cache,
            slots: (0..slots).map(|_| None).collect(),
            queued: VecDeque::new(),
            scratch: Vec::new(),
            record: None,
        }
    }

    /// A fresh route to fill when this engine records routing.
    fn route(&self) -> Option<Route> {
        self.record.filter(|_| self.policy.cfg.moe.is_some()).map(|_| Route::default())
    }

    fn new_routing(&self) -> Option<Routing> {
        let m = self.policy.cfg.moe.as_ref()?;
        Some(Routing::new(m.moe_layers(self.policy.cfg.n_layers), m.top_k, self.record?))
    }

    /// Prefills queued requests into free slots, one batch (right-padded).
    fn prefill(&mut self) -> Result<(), RunError> {
        let free: Vec<usize> = (0..self.slots.len()).filter(|&i| self.slots[i].is_none()).collect();
        let n = free.len().min(self.queued.len());
        if n == 0 {
            return Ok(());
        }
        let reqs: Vec<GenRequest> = self.queued.drain(..n).collect();
        let max_len = self.policy.cfg.max_len;
        let longest = reqs.iter().map(|r| r.prompt.len()).max().unwrap_or(0);
        if reqs.iter().any(|r| r.prompt.is_empty()) || longest >= max_len {
            return Err(RunError::new(
                E_TOO_LONG,
                format!("prompt of {longest} tokens does not fit model max_len {max_len} (or is empty)"),
            ));
        }
        let l = longest as i64;
        let mut tok = vec![PAD as i64; n * longest];
        for (i, r) in reqs.iter().enumerate() {
            for (j, &t) in r.prompt.iter().enumerate() {
                tok[i * longest + j] = t as i64;
            }
        }
        let tokens = crate::device::from_slice(&tok).view([n as i64, l]);
        let positions =
            Tensor::arange(l, (tch::Kind::Int64, crate::device::current())).unsqueeze(0).repeat([n as i64, 1]);
        let rows_v: Vec<i64> = free[..n].iter().map(|&s| s as i64).collect();
        let rows = crate::device::from_slice(&rows_v);
        let mut route = self.route();
        let logits = self.policy.forward_slots_routed(&tokens, &positions, &rows, &mut self.cache, route.as_mut());
        let ids = route.as_ref().and_then(used_ids);
        let vocab = self.policy.cfg.vocab_size;
        for (i, req) in reqs.into_iter().enumerate() {
            let mut routing = self.new_routing();
            if let (Some(r), Some((ids, [_, t, l, k]))) = (routing.as_mut(), ids.as_ref()) {
                // Right-padded: the request's tokens are columns 0..len.
                for col in 0..req.prompt.len() {
                    let at = (i * t + col) * l * k;
                    r.push_token(&ids[at..at + l * k]);
                }
            }
            let last = logits.get(i as i64).get(req.prompt.len() as i64 - 1);
            let next_logits = Vec::<f32>::try_from(last.contiguous().view([-1])).map_err(backend_err)?;
            debug_assert_eq!(next_logits.len(), vocab);
            self.slots[free[i]] = Some(Slot {
                id: req.id,
                rng: Rng::new(req.params.seed),
                len: req.prompt.len(),
                next_logits,
                response: Vec::new(),
                logprobs: Vec::new(),
                versions: vec![VersionSpan { version: self.version, from_token: 0 }],
                params: req.params,
                routing,
            });
        }
        Ok(())
    }
}

impl StreamEngine for TchStreamEngine {
    fn slots(&self) -> usize {
        self.slots.len()
    }

    fn submit(&mut self, req: GenRequest) -> Result<(), RunError> {
        self.queued.push_back(req);
        Ok(())
    }

    fn step(&mut self) -> Result<Vec<StreamSample>, RunError> {
        crate::guard("generation", || {
            let _g = tch::no_grad_guard();
            self.prefill()?;
            let max_len = self.policy.cfg.max_len;
            let mut out = Vec::new();
            // Sample one token per slot from its pending logits.
            let mut cont: Vec<(usize, i64, i64)> = Vec::new();
            for i in 0..self.slots.len() {
                let Some(s) = self.slots[i].as_mut() else { continue };
                let (tok, lp) = sample_token(&s.next_logits, &s.params, &mut s.rng, &mut self.scratch);
                // Batch-invariant: the log-prob the trainer's log-softmax gives, bit for bit.
                let lp = if self.policy.invariant { torch_logprob(&s.next_logits, &s.params, tok) } else { lp };
                s.response.push(tok);
                s.logprobs.push(lp);
                let stop = s.params.stop_tokens.contains(&tok);
                let full = s.response.len() >= s.params.max_new_tokens || s.len + 1 >= max_len;
                if stop || full {
                    let Some(mut s) = self.slots[i].take() else { continue };
                    // A swap right before the last token leaves an empty span: not a version it used.
                    let n = s.response.len();
                    s.versions.retain(|v| v.from_token < n || v.from_token == 0);
                    out.push(StreamSample {
                        id: s.id,
                        response: s.response,
                        logprobs: s.logprobs,
                        finish: if stop { FinishReason::Stop } else { FinishReason::Length },
                        versions: s.versions,
                        aborted: false,
                        routing: s.routing,
                    });
                } else {
                    cont.push((i, tok as i64, s.len as i64));
                }
            }
            if cont.is_empty() {
                return Ok(out);
            }
            // One decode step for every slot still going.
            let b = cont.len() as i64;
            let tokens = crate::device::from_slice(&cont.iter().map(|c| c.1).collect::<Vec<_>>()).view([b, 1]);
            let positions = crate::device::from_slice(&cont.iter().map(|c| c.2).collect::<Vec<_>>()).view([b, 1]);
            let rows = crate::device::from_slice(&cont.iter().map(|c| c.0 as i64).collect::<Vec<_>>());
            let mut route = self.route();
            let logits = self.policy.forward_slots_routed(&tokens, &positions, &rows, &mut self.cache, route.as_mut());
            if let Some((ids, [_, _, l, k])) = route.as_ref().and_then(used_ids) {
                for (j, &(i, _, _)) in cont.iter().enumerate() {
                    if let Some(r) = self.slots[i].as_mut().and_then(|s| s.routing.as_mut()) {
                        r.push_token(&ids[j * l * k..(j + 1) * l * k]);
                    }
                }
            }
            let flat = Vec::<f32>::try_from(logits.contiguous().view([-1])).map_err(backend_err)?;
            let vocab = self.policy.cfg.vocab_size;
            for (k, &(i, _, _)) in cont.iter().enumerate() {
                if let Some(s) = self.slots[i].as_mut() {
                    s.next_logits.clear();
                    s.next_logits.extend_from_slice(&flat[k * vocab..(k + 1) * vocab]);
                    s.len += 1;
                }
            }
            Ok(out)
        })
    }

    fn in_flight(&self) -> usize {
        self.queued.len() + self.slots.iter().filter(|s| s.is_some()).count()
    }

    fn abort_all(&mut self) -> Vec<StreamSample> {
        let v = self.version;
        let mut out: Vec<StreamSample> = self
            .slots
            .iter_mut()
            .filter_map(Option::take)
            .map(|s| StreamSample {
                id: s.id,
                response: s.response,
                logprobs: s.logprobs,
                finish: FinishReason::Length,
                versions: s.versions,
                aborted: true,
                routing: s.routing,
            })
            .collect();
        out.extend(self.queued.drain(..).map(|r| StreamSample::aborted_unstarted(r.id, v)));
        out
    }

    fn load_weights(&mut self, weights: &WeightSnapshot) -> Result<(), RunError> {
        crate::guard("weight load", || self.policy.load_snapshot(weights))?;
        self.version = weights.version;
        for s in self.slots.iter_mut().flatten() {
            // The pending logits were computed under the old weights: the next token is still
            // old; the ones after it are new.
            s.versions.push(VersionSpan { version: weights.version, from_token: s.response.len() + 1 });
        }
        Ok(())
    }

    fn weight_version(&self) -> u64 {
        self.version
    }

    fn bind_thread(&mut self, threads: Option<usize>) {
        // libtorch's intra-op budget (OpenMP) is per calling thread: the trainer keeps its own.
        if let Some(n) = threads {
            tch::set_num_threads(n.max(1) as i32);
        }
    }
}

/// log softmax(logits / temperature)[tok] with the trainer's libtorch ops (`train::token_logprobs`).
pub(crate) fn torch_logprob(logits: &[f32], params: &SamplingParams, tok: TokenId) -> f32 {
    let temp = if params.greedy { 1.0 } else { params.temperature };
    crate::train::tempered_log_softmax(&Tensor::from_slice(logits), temp).double_value(&[tok as i64]) as f32
}
