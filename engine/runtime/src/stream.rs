//! The rollout engine as the asynchronous executor drives it ([`StreamEngine`], a backend trait):
//! requests of one sample each are submitted and advanced step by step (continuous batching), so
//! a slot is reused as soon as its sample finishes, and weights can be swapped between two steps
//! while requests are in flight.
//!
//! An engine runs on the executor's generation thread, hence `Send`. In-process engines (the
//! embedded backend's `TchStreamEngine`) implement the trait natively; any batch
//! [`RolloutEngine`] (e.g. a remote engine behind a network transport) is adapted by
//! [`BatchedStream`], at group granularity, and [`StreamAsBatch`] lends a streaming engine as a
//! batch one. The requests and samples are plain data (`sample`).

pub use crate::backend::StreamEngine;
pub use crate::sample::{GenRequest, StreamSample, VersionSpan};

use crate::backend::{RolloutEngine, WeightSnapshot};
use crate::sample::SamplingParams;
use crate::token::TokenId;
use crate::RunError;

/// Any batch [`RolloutEngine`] as a [`StreamEngine`]: each `step` generates every queued request
/// in one `generate` call, so requests finish together and slots refill per batch. Samples of the
/// same prompt submitted together share one prefill (one group of `generate`).
pub struct BatchedStream<E> {
    pub engine: E,
    slots: usize,
    queued: Vec<GenRequest>,
}

impl<E: RolloutEngine + Send> BatchedStream<E> {
    pub fn new(engine: E, slots: usize) -> Self {
        BatchedStream { engine, slots: slots.max(1), queued: Vec::new() }
    }
}

impl<E: RolloutEngine + Send> StreamEngine for BatchedStream<E> {
    fn slots(&self) -> usize {
        self.slots
    }

    fn submit(&mut self, req: GenRequest) -> Result<(), RunError> {
        self.queued.push(req);
        Ok(())
    }

    fn step(&mut self) -> Result<Vec<StreamSample>, RunError> {
        if self.queued.is_empty() {
            return Ok(Vec::new());
        }
        let reqs = std::mem::take(&mut self.queued);
        // A group is a run of equal prompts and settings submitted together; consecutive groups of
        // the same size and settings go in one call (a remote fleet spreads them over its
        // engines at once). The seed of a call's first request seeds the call.
        let mut groups: Vec<(usize, usize)> = Vec::new();
        let mut i = 0;
        while i < reqs.len() {
            let mut j = i + 1;
            while j < reqs.len() && reqs[j].prompt == reqs[i].prompt && same_settings(&reqs[j].params, &reqs[i].params)
            {
                j += 1;
            }
            groups.push((i, j));
            i = j;
        }
        let mut out = Vec::with_capacity(reqs.len());
        let mut g = 0;
        while g < groups.len() {
            let (i0, j0) = groups[g];
            let n = j0 - i0;
            let mut h = g + 1;
            while h < groups.len()
                && groups[h].1 - groups[h].0 == n
                && same_settings(&reqs[groups[h].0].params, &reqs[i0].params)
            {
                h += 1;
            }
            let call = &groups[g..h];
            let prompts: Vec<Vec<TokenId>> = call.iter().map(|&(i, _)| reqs[i].prompt.clone()).collect();
            let version = self.engine.weight_version();
            let samples = self.engine.generate(&prompts, n, &reqs[i0].params)?;
            if samples.len() != n * call.len() {
                return Err(RunError::new(
                    crate::E_BACKEND,
                    format!("the rollout engine returned {} samples for {} requests", samples.len(), n * call.len()),
                ));
            }
            let mut seen = vec![0usize; call.len()];
            for s in samples {
                let Some(&(gi, _)) = call.get(s.prompt_index).filter(|_| seen[s.prompt_index] < n) else {
                    return Err(RunError::new(
                        crate::E_BACKEND,
                        format!("the rollout engine answered for prompt {} it was not sent", s.prompt_index),
                    ));
                };
                let req = &reqs[gi + seen[s.prompt_index]];
                seen[s.prompt_index] += 1;
                out.push(StreamSample {
                    id: req.id,
                    response: s.response,
                    logprobs: s.logprobs,
                    finish: s.finish,
                    versions: vec![VersionSpan { version: s.weight_version.max(version), from_token: 0 }],
                    aborted: false,
                    routing: s.routing,
                });
            }
            g = h;
        }
        Ok(out)
    }

    fn in_flight(&self) -> usize {
        self.queued.len()
    }

    fn abort_all(&mut self) -> Vec<StreamSample> {
        let v = self.engine.weight_version();
        std::mem::take(&mut self.queued).into_iter().map(|r| StreamSample::aborted_unstarted(r.id, v)).collect()
    }

    fn load_weights(&mut self, weights: &WeightSnapshot) -> Result<(), RunError> {
        self.engine.load_weights(weights)
    }

    fn weight_version(&self) -> u64 {
        self.engine.weight_version()
    }
}

/// A [`StreamEngine`] lent as a batch [`RolloutEngine`] (evaluation episodes on the generation
/// thread's engine): `generate` submits every sample, steps the engine until all are back, and
/// returns them grouped. The engine must have nothing else in flight; request ids start at
/// `base_id`.
pub struct StreamAsBatch<'a> {
    pub engine: &'a mut dyn StreamEngine,
    pub base_id: u64,
}

impl RolloutEngine for StreamAsBatch<'_> {
    fn generate(
        &mut self,
        prompts: &[Vec<TokenId>],
        n: usize,
        params: &SamplingParams,
    ) -> Result<Vec<crate::Sample>, RunError> {
        let total = prompts.len() * n;
        let mut out: Vec<Option<crate::Sample>> = vec![None; total];
        let (mut next, mut done) = (0usize, 0usize);
        while done < total {
            while next < total && self.engine.in_flight() < self.engine.slots().max(1) {
                let seed = crate::rng::derive_seed(params.seed, "sample", next as u64);
                let req = GenRequest {
                    id: self.base_id + next as u64,
                    prompt: prompts[next / n].clone(),
                    params: SamplingParams { seed, ..params.clone() },
                };
                self.engine.submit(req)?;
                next += 1;
            }
            for s in self.engine.step()? {
                let Some(k) = s.id.checked_sub(self.base_id).map(|k| k as usize).filter(|k| *k < total) else {
                    continue;
                };
                let weight_version = s.oldest_version();
                out[k] = Some(crate::Sample {
                    prompt_index: k / n,
                    response: s.response,
                    logprobs: s.logprobs,
                    finish: s.finish,
                    weight_version,
                    routing: s.routing,
                });
                done += 1;
            }
            if self.engine.in_flight() == 0 && next >= total && done < total {
                return Err(RunError::internal("the rollout engine lost requests"));
            }
        }
        Ok(out.into_iter().flatten().collect())
    }

    fn weight_version(&self) -> u64 {
        self.engine.weight_version()
    }

    fn load_weights(&mut self, weights: &WeightSnapshot) -> Result<(), RunError> {
        self.engine.load_weights(weights)
    }
}

fn same_settings(a: &SamplingParams, b: &SamplingParams) -> bool {
    a.max_new_tokens == b.max_new_tokens
        && a.temperature == b.temperature
        && a.top_p == b.top_p
        && a.top_k == b.top_k
        && a.stop_tokens == b.stop_tokens
        && a.greedy == b.greedy
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::FinishReason;

    fn sample(len: usize, versions: Vec<VersionSpan>) -> StreamSample {
        StreamSample {
            id: 0,
            response: vec![1; len],
            logprobs: vec![0.0; len],
            finish: FinishReason::Stop,
            versions,
            aborted: false,
            routing: None,
        }
    }

    #[test]
    fn versions_per_token_and_back() {
        let spans = vec![VersionSpan { version: 3, from_token: 0 }, VersionSpan { version: 4, from_token: 2 }];
        let s = sample(5, spans.clone());
        assert_eq!(s.token_versions(), vec![3, 3, 4, 4, 4]);
        assert_eq!(VersionSpan::of_tokens(&s.token_versions()), spans);
        // An update before the first token: the sample's tokens are all of the newer version.
        let late =
            sample(2, vec![VersionSpan { version: 1, from_token: 0 }, VersionSpan { version: 2, from_token: 0 }]);
        assert_eq!(late.token_versions(), vec![2, 2]);
        assert_eq!(VersionSpan::of_tokens(&[]), vec![VersionSpan { version: 0, from_token: 0 }]);
        assert_eq!(VersionSpan::of_tokens(&[5, 5, 6, 5]).len(), 3);
    }

    /// Answers each prompt's k-th sample with [prompt's first token, k]; records each call's
    /// prompts and n.
    struct Echo {
        calls: Vec<(usize, usize)>,
    }

    impl RolloutEngine for Echo {
        fn generate(
            &mut self,
            prompts: &[Vec<TokenId>],
            n: usize,
            _params: &SamplingParams,
        ) -> Result<Vec<crate::Sample>, RunError> {
            self.calls.push((prompts.len(), n));
            Ok((0..prompts.len() * n)
                .map(|k| crate::Sample {
                    prompt_index: k / n,
                    response: vec![prompts[k / n][0], (k % n) as TokenId],
                    logprobs: vec![0.0; 2],
                    finish: FinishReason::Stop,
                    weight_version: 0,
                    routing: None,
                })
                .collect())
        }
        fn weight_version(&self) -> u64 {
            0
        }
        fn load_weights(&mut self, _: &WeightSnapshot) -> Result<(), RunError> {
            Ok(())
        }
    }

    #[test]
    fn batched_stream_sends_equal_groups_in_one_call_and_maps_ids_back() {
        let mut e = BatchedStream::new(Echo { calls: Vec::new() }, 16);
        let params = SamplingParams::plain(4, 7);
        // Groups of 3, 3 and 2 samples (prompts 10, 20, 30), ids not in prompt order.
        let plan = [(10, 3), (20, 3), (30, 2)];
        let mut id = 100;
        for (p, n) in plan {
            for _ in 0..n {
                e.submit(GenRequest { id, prompt: vec![p], params: params.clone() }).unwrap();
                id = id.wrapping_sub(7);
            }
        }
        let out = e.step().unwrap();
        assert_eq!(e.engine.calls, vec![(2, 3), (1, 2)], "two groups of 3 in one call, then the group of 2");
        assert_eq!(out.len(), 8);
        let mut id = 100;
        for (p, n) in plan {
            for k in 0..n {
                let s = out.iter().find(|s| s.id == id).unwrap();
                assert_eq!(s.response, vec![p, k as TokenId], "request {id}");
                id = id.wrapping_sub(7);
            }
        }
        assert_eq!(e.in_flight(), 0);
    }
}
