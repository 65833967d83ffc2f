//! What an engine samples and a trainer consumes, as plain data: the sampling settings of a call,
//! a generated response (batch or streaming, with the weight versions it was sampled under), and
//! a scored trajectory. Backends, executors, sessions and rewards all speak in these.

use crate::token::{TokenId, EOS};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// A stop token was sampled (it is the last token of the response).
    Stop,
    /// `max_new_tokens` (or the model's max_len) was reached.
    Length,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    pub max_new_tokens: usize,
    pub temperature: f64,
    /// Nucleus filter; 1.0 = off.
    pub top_p: f64,
    /// 0 = off.
    pub top_k: usize,
    pub stop_tokens: Vec<TokenId>,
    /// Argmax decoding (evaluation); the other filters are then ignored.
    pub greedy: bool,
    /// Seed of this call's sampling stream: same seed, prompts and weights -> same samples.
    pub seed: u64,
}

impl SamplingParams {
    /// The rollout stage's sampling settings, to EOS, with stream `seed`.
    pub fn rollout(r: &crate::spec::RolloutSpec, seed: u64) -> SamplingParams {
        SamplingParams {
            max_new_tokens: r.max_new_tokens,
            temperature: r.temperature,
            top_p: r.top_p,
            top_k: r.top_k,
            stop_tokens: vec![EOS],
            greedy: false,
            seed,
        }
    }

    /// The same settings, ending a response on any of `stop` (the run tokenizer's stop ids).
    pub fn with_stop(mut self, stop: Vec<TokenId>) -> SamplingParams {
        self.stop_tokens = stop;
        self
    }

    /// Greedy decoding to EOS: what evaluation measures.
    pub fn greedy(max_new_tokens: usize) -> SamplingParams {
        SamplingParams { greedy: true, ..SamplingParams::plain(max_new_tokens, 0) }
    }

    /// Sampling from the full distribution (temperature 1, no top-p/top-k) to EOS.
    pub fn plain(max_new_tokens: usize, seed: u64) -> SamplingParams {
        SamplingParams {
            max_new_tokens,
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            stop_tokens: vec![EOS],
            greedy: false,
            seed,
        }
    }
}

/// One generated response.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Index into the `prompts` slice given to `generate` (the GRPO group).
    pub prompt_index: usize,
    pub response: Vec<TokenId>,
    /// log p(token) under the engine's policy with logits divided by the temperature, before any
    /// top-k/top-p truncation (what the trainer recomputes). Greedy decoding reports temperature 1.
    pub logprobs: Vec<f32>,
    pub finish: FinishReason,
    /// Version of the weights that generated it.
    pub weight_version: u64,
    /// R3: every forwarded token's routed experts (prompt then response), when recorded.
    pub routing: Option<crate::Routing>,
}

/// A scored sample as the trainer consumes it.
#[derive(Debug, Clone, PartialEq)]
pub struct Trajectory {
    pub prompt: Vec<TokenId>,
    pub response: Vec<TokenId>,
    /// Sampling log-probs from the engine, one per response token.
    pub rollout_logprobs: Vec<f32>,
    /// 1 for tokens the policy is trained on, 0 for context (one per response token).
    pub loss_mask: Vec<f32>,
    pub reward: f32,
    pub advantage: f32,
    pub group: usize,
    pub weight_version: u64,
    /// R3: the experts the engine routed each token to (an MoE policy with `record_routing`).
    pub routing: Option<crate::Routing>,
    /// On-policy distillation: the teacher stage's log-prob of each response token; empty until
    /// the teacher scores the batch (and in a run without one).
    pub teacher_logprobs: Vec<f32>,
}

impl Trajectory {
    /// A prompt and response to score (log-probs of the response under some model), with every
    /// response token counted and nothing else set.
    pub fn to_score(prompt: Vec<TokenId>, response: Vec<TokenId>) -> Trajectory {
        let n = response.len();
        Trajectory {
            prompt,
            response,
            rollout_logprobs: vec![0.0; n],
            loss_mask: vec![1.0; n],
            reward: 0.0,
            advantage: 0.0,
            group: 0,
            weight_version: 0,
            routing: None,
            teacher_logprobs: Vec::new(),
        }
    }
}

/// One sample to generate. `params.seed` seeds this sample's own sampling stream.
#[derive(Debug, Clone, PartialEq)]
pub struct GenRequest {
    /// Unique among the requests in flight; finished samples carry it back.
    pub id: u64,
    pub prompt: Vec<TokenId>,
    pub params: SamplingParams,
}

/// The tokens from `from_token` on (up to the next span) were sampled from logits computed under
/// weight version `version`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionSpan {
    pub version: u64,
    pub from_token: usize,
}

/// A finished (or aborted) request.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamSample {
    pub id: u64,
    pub response: Vec<TokenId>,
    /// Sampling log-probs, as in [`Sample`].
    pub logprobs: Vec<f32>,
    pub finish: FinishReason,
    /// Every weight version the sample was generated under, oldest first; more than one when a
    /// weight update happened while it was in flight (pause = in_place).
    pub versions: Vec<VersionSpan>,
    /// Aborted before it finished (retract/abort pauses, a lost engine): never trained on.
    pub aborted: bool,
    /// R3: every forwarded token's routed experts (prompt then response), when recorded.
    pub routing: Option<crate::Routing>,
}

impl StreamSample {
    /// A request aborted before it was started: no tokens, under weight version `version`.
    pub fn aborted_unstarted(id: u64, version: u64) -> StreamSample {
        StreamSample {
            id,
            response: Vec::new(),
            logprobs: Vec::new(),
            finish: FinishReason::Length,
            versions: vec![VersionSpan { version, from_token: 0 }],
            aborted: true,
            routing: None,
        }
    }

    pub fn oldest_version(&self) -> u64 {
        self.versions.iter().map(|v| v.version).min().unwrap_or(0)
    }

    /// The weight version of each response token.
    pub fn token_versions(&self) -> Vec<u64> {
        let mut out = Vec::with_capacity(self.response.len());
        let mut spans = self.versions.iter().peekable();
        let mut current = self.versions.first().map_or(0, |v| v.version);
        for k in 0..self.response.len() {
            while let Some(v) = spans.next_if(|v| v.from_token <= k) {
                current = v.version;
            }
            out.push(current);
        }
        out
    }
}

impl VersionSpan {
    /// Spans of a version per token (one span per run of equal versions; one span at version 0
    /// for no tokens).
    pub fn of_tokens(versions: &[u64]) -> Vec<VersionSpan> {
        let mut spans: Vec<VersionSpan> = Vec::new();
        for (k, &v) in versions.iter().enumerate() {
            if spans.last().is_none_or(|s| s.version != v) {
                spans.push(VersionSpan { version: v, from_token: k });
            }
        }
        if spans.is_empty() {
            spans.push(VersionSpan { version: 0, from_token: 0 });
        }
        spans
    }
}
