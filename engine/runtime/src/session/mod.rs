//! TITO (token in, token out) sessions, Miles §2.4: the runtime, not the agent harness, owns
//! tokenisation. Each turn the policy samples is stored as a [`Checkpoint`] holding the exact ids
//! it was conditioned on (`prompt`), the ids it sampled (`output`), their sampling log-probs and
//! the weight version of every token. A later turn attaches to a checkpoint and only the new
//! messages (an observation, a tool result) are tokenised and appended: earlier turns are never
//! re-tokenised, so the trainer scores exactly the tokens that were generated.
//!
//! Rules: `linear` (one growing context: a turn extends the tail; a retry may roll back the last
//! assistant turn) and `branching` (a turn attaches to the deepest checkpoint whose message path
//! is a prefix of its conversation, else starts a new branch, e.g. after the harness compacted
//! its context). A checkpoint that ended by length is never extended. Each leaf of the tree gives
//! one trajectory; its loss mask is 1 on sampled tokens, 0 on prompt, observation and tool-result
//! tokens. `codec` turns observations into ids with the chat template's turn delimiters;
//! `retokenize` measures what a naive re-tokenising path would have got wrong.

pub mod codec;
pub mod retokenize;

pub use crate::spec::env::Rule;
pub use codec::{ChatCodec, Role};

use crate::sample::{FinishReason, Trajectory};
use crate::token::TokenId;

/// A message of the conversation, as a key: equal messages have equal keys (FNV-1a of the role
/// and content; an assistant message's content is its token ids).
pub type MessageKey = u64;

pub fn message_key(role: &str, content: &[u8]) -> MessageKey {
    crate::rng::Fnv1a::default().bytes(role.as_bytes().iter().chain([&0u8]).chain(content)).0
}

/// The key of a sampled turn.
pub fn output_key(ids: &[TokenId]) -> MessageKey {
    let bytes: Vec<u8> = ids.iter().flat_map(|i| i.to_le_bytes()).collect();
    message_key("assistant", &bytes)
}

/// One sampled turn.
#[derive(Debug, Clone, PartialEq)]
pub struct Checkpoint {
    /// The checkpoint this turn extends (`None`: the root of a chain).
    pub parent: Option<usize>,
    /// The conversation up to and including this turn's output.
    pub path: Vec<MessageKey>,
    /// The ids the turn was conditioned on, exactly.
    pub prompt: Vec<TokenId>,
    pub output: Vec<TokenId>,
    /// Sampling log-prob of each output token.
    pub logprobs: Vec<f32>,
    /// Weight version that sampled each output token (a weight update mid-turn changes it).
    pub versions: Vec<u64>,
    pub finish: FinishReason,
    /// Rolled back by a retry (linear rule): no trajectory includes it.
    pub dropped: bool,
    /// R3: the experts the engine routed the turn's context and output to (every forwarded token:
    /// the prompt, then the output but its last id); None when not recorded.
    pub routing: Option<crate::Routing>,
}

/// Where a new turn goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attach {
    /// After checkpoint `parent`: the turn's prompt is the parent's prompt and output, then the
    /// ids of the messages from `path[new_from..]`.
    Extend { parent: usize, new_from: usize },
    /// A new chain: the whole conversation is tokenised.
    Fresh,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Session {
    pub rule: Rule,
    pub checkpoints: Vec<Checkpoint>,
}

/// One trajectory of a session: a chain of checkpoints, root to leaf.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionTrajectory {
    pub prompt: Vec<TokenId>,
    /// Every id after the prompt: sampled turns and the observations between them.
    pub response: Vec<TokenId>,
    /// 1 on sampled ids, 0 on observation / tool-result / template ids (one per response id).
    pub loss_mask: Vec<f32>,
    /// Sampling log-probs (0 where the mask is 0: nothing was sampled there).
    pub logprobs: Vec<f32>,
    /// Weight version per response id (of the turn that follows, where nothing was sampled).
    pub versions: Vec<u64>,
    pub checkpoints: Vec<usize>,
    /// R3 across turns: each token keeps the routing of the turn that first forwarded it (an
    /// earlier turn's tokens are not re-routed by a later turn's prefill); None unless every turn
    /// of the chain recorded routing.
    pub routing: Option<crate::Routing>,
}

impl SessionTrajectory {
    /// The trainer's view. `weight_version` is the oldest version of a sampled token (what
    /// staleness limits compare); TIS corrects per token through the log-probs.
    pub fn to_trajectory(&self, reward: f32, advantage: f32, group: usize) -> Trajectory {
        let oldest = self.versions.iter().zip(&self.loss_mask).filter(|(_, m)| **m > 0.0).map(|(v, _)| *v).min();
        Trajectory {
            prompt: self.prompt.clone(),
            response: self.response.clone(),
            rollout_logprobs: self.logprobs.clone(),
            loss_mask: self.loss_mask.clone(),
            reward,
            advantage,
            group,
            weight_version: oldest.unwrap_or(0),
            routing: self.routing.clone(),
            teacher_logprobs: Vec::new(),
        }
    }

    /// Sampled ids (mask 1).
    pub fn sampled_tokens(&self) -> usize {
        self.loss_mask.iter().filter(|m| **m > 0.0).count()
    }
}

impl Session {
    pub fn new(rule: Rule) -> Session {
        Session { rule, checkpoints: Vec::new() }
    }

    fn live(&self) -> impl Iterator<Item = (usize, &Checkpoint)> {
        self.checkpoints.iter().enumerate().filter(|(_, c)| !c.dropped)
    }

    fn extendable(c: &Checkpoint, path: &[MessageKey]) -> bool {
        c.finish != FinishReason::Length && path.len() > c.path.len() && path.starts_with(&c.path)
    }

    /// Where a turn asked with conversation `path` (every message before the model's answer)
    /// attaches. `Err` under the linear rule when the turn neither extends the tail nor retries
    /// it (the caller starts a new session, or uses the branching rule).
    pub fn attach(&mut self, path: &[MessageKey]) -> Result<Attach, String> {
        match self.rule {
            Rule::Branching => {
                let best = self.live().filter(|(_, c)| Self::extendable(c, path)).max_by_key(|(_, c)| c.path.len());
                Ok(match best {
                    Some((i, c)) => Attach::Extend { parent: i, new_from: c.path.len() },
                    None => Attach::Fresh,
                })
            }
            Rule::Linear => {
                let Some((tail, c)) = self.live().last() else { return Ok(Attach::Fresh) };
                if Self::extendable(c, path) {
                    return Ok(Attach::Extend { parent: tail, new_from: c.path.len() });
                }
                // A retry: the same conversation the tail turn was asked with (or one extending
                // what came before it) rolls the tail back.
                let asked = &c.path[..c.path.len() - 1];
                if path.starts_with(asked) && !path.starts_with(&c.path) {
                    let parent = c.parent;
                    self.checkpoints[tail].dropped = true;
                    return Ok(match parent {
                        Some(p) => Attach::Extend { parent: p, new_from: self.checkpoints[p].path.len() },
                        None => Attach::Fresh,
                    });
                }
                Err(if c.finish == FinishReason::Length {
                    "the last turn ended by length: its context cannot be extended".into()
                } else {
                    "the linear rule extends the tail: this conversation does not continue it".into()
                })
            }
        }
    }

    /// The ids of a turn attached at `at`: the parent's context then `new_ids` (the new
    /// messages, tokenised once), or `new_ids` alone for a fresh chain.
    pub fn context(&self, at: Attach, new_ids: &[TokenId]) -> Vec<TokenId> {
        match at {
            Attach::Extend { parent, .. } => {
                let c = &self.checkpoints[parent];
                c.prompt.iter().chain(&c.output).chain(new_ids).copied().collect()
            }
            Attach::Fresh => new_ids.to_vec(),
        }
    }

    /// Stores a sampled turn; its index. `path` is the conversation it was asked with; the
    /// output's key is appended.
    #[allow(clippy::too_many_arguments)]
    pub fn record(
        &mut self,
        at: Attach,
        path: &[MessageKey],
        prompt: Vec<TokenId>,
        output: Vec<TokenId>,
        logprobs: Vec<f32>,
        versions: Vec<u64>,
        finish: FinishReason,
    ) -> usize {
        debug_assert_eq!(output.len(), logprobs.len());
        debug_assert_eq!(output.len(), versions.len());
        let mut path = path.to_vec();
        path.push(output_key(&output));
        let parent = match at {
            Attach::Extend { parent, .. } => Some(parent),
            Attach::Fresh => None,
        };
        self.checkpoints.push(Checkpoint {
            parent,
            path,
            prompt,
            output,
            logprobs,
            versions,
            finish,
            dropped: false,
            routing: None,
        });
        self.checkpoints.len() - 1
    }

    /// R3: the routing the engine recorded for the turn `record` stored last.
    pub fn set_routing(&mut self, routing: Option<crate::Routing>) {
        if let Some(c) = self.checkpoints.last_mut() {
            c.routing = routing;
        }
    }

    /// Ids the policy sampled in this session (each turn once, rolled-back turns left out).
    pub fn sampled_tokens(&self) -> usize {
        self.checkpoints.iter().filter(|c| !c.dropped).map(|c| c.output.len()).sum()
    }

    /// One trajectory per leaf (a live checkpoint no live checkpoint extends), in order.
    pub fn trajectories(&self) -> Vec<SessionTrajectory> {
        let mut has_child = vec![false; self.checkpoints.len()];
        for (_, c) in self.live() {
            if let Some(p) = c.parent {
                has_child[p] = true;
            }
        }
        self.live().filter(|(i, _)| !has_child[*i]).map(|(i, _)| self.chain(i)).collect()
    }

    /// The routing of a chain of turns: turn i contributes the tokens it forwarded first (its
    /// routing from where the previous turn's ended).
    fn chain_routing(&self, ids: &[usize]) -> Option<crate::Routing> {
        let first = self.checkpoints[*ids.first()?].routing.as_ref()?;
        let mut out = crate::Routing::new(first.layers, first.top_k, first.id);
        let width = first.per_token() * first.id.bytes();
        for &i in ids {
            let r = self.checkpoints[i].routing.as_ref()?;
            if (r.layers, r.top_k, r.id) != (first.layers, first.top_k, first.id) || r.tokens() < out.tokens() {
                return None;
            }
            out.data.extend_from_slice(&r.data[out.tokens() * width..]);
        }
        Some(out)
    }

    fn chain(&self, leaf: usize) -> SessionTrajectory {
        let mut ids = vec![leaf];
        while let Some(p) = self.checkpoints[*ids.last().expect("non-empty")].parent {
            ids.push(p);
        }
        ids.reverse();
        let root = &self.checkpoints[ids[0]];
        let mut t = SessionTrajectory {
            prompt: root.prompt.clone(),
            response: Vec::new(),
            loss_mask: Vec::new(),
            logprobs: Vec::new(),
            versions: Vec::new(),
            checkpoints: ids.clone(),
            routing: None,
        };
        t.routing = self.chain_routing(&ids);
        let mut end = root.prompt.len();
        for &i in &ids {
            let c = &self.checkpoints[i];
            // The ids between the previous turn's output and this turn's: observations.
            let between = &c.prompt[end..];
            let v = c.versions.first().copied().unwrap_or(0);
            t.response.extend_from_slice(between);
            t.loss_mask.extend(std::iter::repeat_n(0.0, between.len()));
            t.logprobs.extend(std::iter::repeat_n(0.0, between.len()));
            t.versions.extend(std::iter::repeat_n(v, between.len()));
            t.response.extend_from_slice(&c.output);
            t.loss_mask.extend(std::iter::repeat_n(1.0, c.output.len()));
            t.logprobs.extend_from_slice(&c.logprobs);
            t.versions.extend_from_slice(&c.versions);
            end = c.prompt.len() + c.output.len();
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(s: &str) -> MessageKey {
        message_key("user", s.as_bytes())
    }

    /// Records a turn asked with `path`; observation ids `new` are appended after the parent.
    fn turn(
        s: &mut Session,
        path: &[MessageKey],
        new: &[TokenId],
        out: &[TokenId],
        v: u64,
    ) -> (usize, Vec<MessageKey>) {
        let at = s.attach(path).unwrap();
        let prompt = s.context(at, new);
        let n = out.len();
        let i = s.record(at, path, prompt, out.to_vec(), vec![-0.5; n], vec![v; n], FinishReason::Stop);
        (i, s.checkpoints[i].path.clone())
    }

    /// R3 across turns: each token keeps the routing of the turn that first forwarded it; the
    /// second turn's re-prefill of the first turn's tokens is not what the trainer replays.
    #[test]
    fn routing_is_kept_per_token_across_turns() {
        let rec = |tokens: &[i64]| {
            let mut r = crate::Routing::new(1, 1, crate::RouteId::U8);
            for &e in tokens {
                r.push_token(&[e]);
            }
            r
        };
        let mut s = Session::new(Rule::Linear);
        let (_, p) = turn(&mut s, &[user("q")], &[1, 10, 11], &[20, 2], 3);
        // Turn 1 forwarded prompt (3) + output - 1 (1) tokens.
        s.set_routing(Some(rec(&[0, 1, 2, 3])));
        let mut path = p.clone();
        path.push(user("obs"));
        turn(&mut s, &path, &[30], &[22, 2], 4);
        // Turn 2 re-prefilled tokens 0..5 (routing 7s) and forwarded obs + its output but the last.
        s.set_routing(Some(rec(&[7, 7, 7, 7, 7, 5, 6])));
        let t = &s.trajectories()[0];
        assert_eq!(t.prompt.len() + t.response.len(), 8);
        assert_eq!(t.routing.as_ref().unwrap().ids(), vec![0, 1, 2, 3, 7, 5, 6]);
        assert_eq!(t.to_trajectory(1.0, 0.0, 0).routing, t.routing);
        // A turn without routing leaves the chain without (nothing half-replayed).
        let mut s2 = Session::new(Rule::Linear);
        let (_, p) = turn(&mut s2, &[user("q")], &[1, 10, 11], &[20, 2], 3);
        s2.set_routing(Some(rec(&[0, 1, 2, 3])));
        let mut path = p.clone();
        path.push(user("obs"));
        turn(&mut s2, &path, &[30], &[22, 2], 4);
        assert_eq!(s2.trajectories()[0].routing, None);
    }

    #[test]
    fn linear_sessions_keep_sampled_ids_and_mask_observations() {
        let mut s = Session::new(Rule::Linear);
        let (_, p) = turn(&mut s, &[user("q")], &[1, 10, 11], &[20, 21, 2], 3);
        let mut path = p.clone();
        path.push(user("obs1"));
        let (c1, _) = turn(&mut s, &path, &[30, 31], &[22, 2], 4);
        assert_eq!(s.checkpoints[c1].prompt, vec![1, 10, 11, 20, 21, 2, 30, 31]);
        let ts = s.trajectories();
        assert_eq!(ts.len(), 1);
        let t = &ts[0];
        assert_eq!(t.prompt, vec![1, 10, 11]);
        assert_eq!(t.response, vec![20, 21, 2, 30, 31, 22, 2]);
        assert_eq!(t.loss_mask, vec![1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0]);
        assert_eq!(t.logprobs, vec![-0.5, -0.5, -0.5, 0.0, 0.0, -0.5, -0.5]);
        assert_eq!(t.versions, vec![3, 3, 3, 4, 4, 4, 4]);
        assert_eq!(t.sampled_tokens(), 5);
        let tr = t.to_trajectory(1.0, 0.5, 2);
        assert_eq!((tr.weight_version, tr.loss_mask.len(), tr.response.len()), (3, 7, 7));
    }

    #[test]
    fn a_linear_retry_rolls_back_the_tail() {
        let mut s = Session::new(Rule::Linear);
        let (_, p0) = turn(&mut s, &[user("q")], &[1, 5], &[20, 2], 0);
        let mut path = p0.clone();
        path.push(user("o"));
        turn(&mut s, &path, &[30], &[21, 2], 0);
        // The harness asks the same conversation again: the second turn is replaced.
        let (c2, _) = turn(&mut s, &path, &[30], &[22, 23, 2], 1);
        assert!(s.checkpoints[1].dropped);
        let ts = s.trajectories();
        assert_eq!(ts.len(), 1);
        assert_eq!(ts[0].checkpoints, vec![0, c2]);
        assert_eq!(ts[0].response, vec![20, 2, 30, 22, 23, 2]);
        // Anything else is refused under the linear rule.
        assert!(s.attach(&[user("other")]).unwrap_err().starts_with("the linear rule extends the tail"));
    }

    #[test]
    fn branching_attaches_to_the_deepest_prefix() {
        let mut s = Session::new(Rule::Branching);
        let (_, p0) = turn(&mut s, &[user("q")], &[1, 5], &[20, 2], 0);
        let mut p1 = p0.clone();
        p1.push(user("o1"));
        let (_, p1out) = turn(&mut s, &p1, &[30], &[21, 2], 0);
        // A fork from the first turn (a different observation) and a continuation of the second.
        let mut fork = p0.clone();
        fork.push(user("o1b"));
        let (f, _) = turn(&mut s, &fork, &[31], &[24, 2], 1);
        assert_eq!(s.checkpoints[f].parent, Some(0));
        let mut deep = p1out.clone();
        deep.push(user("o2"));
        let (d, _) = turn(&mut s, &deep, &[32], &[25, 2], 1);
        assert_eq!(s.checkpoints[d].parent, Some(1));
        // A compacted context shares no prefix: a new chain, tokenised whole.
        let (c, _) = turn(&mut s, &[user("summary")], &[1, 7, 7], &[26, 2], 2);
        assert_eq!(s.checkpoints[c].parent, None);
        let ts = s.trajectories();
        let chains: Vec<_> = ts.iter().map(|t| t.checkpoints.clone()).collect();
        assert_eq!(chains, vec![vec![0, f], vec![0, 1, d], vec![c]]);
        assert_eq!(ts[2].prompt, vec![1, 7, 7]);
        assert_eq!(ts[0].loss_mask, vec![1.0, 1.0, 0.0, 1.0, 1.0]);
    }

    #[test]
    fn a_turn_that_ended_by_length_is_not_extended() {
        let mut s = Session::new(Rule::Branching);
        let at = s.attach(&[user("q")]).unwrap();
        let prompt = s.context(at, &[1]);
        s.record(at, &[user("q")], prompt, vec![9, 9], vec![0.0; 2], vec![0; 2], FinishReason::Length);
        let mut path = s.checkpoints[0].path.clone();
        path.push(user("o"));
        assert_eq!(s.attach(&path).unwrap(), Attach::Fresh);
        let mut lin = Session { rule: Rule::Linear, ..s.clone() };
        assert!(lin.attach(&path).unwrap_err().contains("ended by length"));
    }
}
