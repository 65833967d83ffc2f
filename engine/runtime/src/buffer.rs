//! The bounded buffer between generation and training (Miles §2.2, Table 1): finished, scored
//! groups wait here until the trainer draws them. It reserves a place for every group in flight,
//! so generation admits a new prompt only while `buffered + in flight < capacity` and otherwise
//! blocks; the trainer's draw frees places.
//!
//! Drop rules: a group is dropped when it was aborted, when the recipe's filter rejects it (always
//! discarded), or when it is stale as the trainer draws it (current weight version minus the
//! group's oldest version > max_staleness). For aborted and stale groups the run chooses retry
//! (the prompt goes back to the data source) or discard.
//!
//! Pure data: the executor keeps it, with the data source, behind one mutex, so every move of a
//! prompt (served -> in flight -> buffered -> drawn or dropped) is atomic with respect to a
//! checkpoint's snapshot.

use crate::sample::StreamSample;
use crate::schedule::{DropAction, GroupFilter};
use crate::source::{DropReason, Pending, PromptSource};
use crate::token::TokenId;
use std::collections::{BTreeMap, VecDeque};

/// A finished, scored group: every sample of one prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    pub prompt: Pending,
    pub prompt_tokens: Vec<TokenId>,
    pub samples: Vec<StreamSample>,
    pub rewards: Vec<f32>,
    /// A group of multi-turn episodes: what a sample needs besides its ids. `None` for single
    /// responses (each sample is `prompt_tokens` + its response, every response id trained on).
    pub episodes: Option<EpisodeParts>,
    /// What each part of a combined reward gave the group's responses (dropped ones included),
    /// for the step's `reward/<stage>` columns; empty for a reward of one stage.
    pub reward_parts: Vec<crate::reward::PartScores>,
}

/// Per sample of a group of episodes: the sample's own first prompt (an environment may show
/// each episode something else) and loss mask (observation ids 0); and how each episode went
/// (its session left out), for the step's `rollout/episode_end/*` metrics.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EpisodeParts {
    pub prompts: Vec<Vec<TokenId>>,
    pub masks: Vec<Vec<f32>>,
    /// The episode each sample is a trajectory of (a compacted episode has several; its samples
    /// are adjacent).
    pub episode_of: Vec<usize>,
    pub results: Vec<crate::env::EpisodeResult>,
}

impl Group {
    /// Sample `i`'s prompt and loss mask.
    pub fn prompt_of(&self, i: usize) -> &[TokenId] {
        self.episodes.as_ref().and_then(|e| e.prompts.get(i)).unwrap_or(&self.prompt_tokens)
    }

    /// The response (single sample or episode) sample `i` belongs to: advantages are one per
    /// response, shared by an episode's trajectories.
    pub fn response_of(&self, i: usize) -> usize {
        self.episodes.as_ref().and_then(|e| e.episode_of.get(i).copied()).unwrap_or(i)
    }

    /// Tokens the policy sampled in sample `i` (an episode's observations are not).
    pub fn sampled_len(&self, i: usize) -> usize {
        match self.episodes.as_ref().and_then(|e| e.masks.get(i)) {
            Some(m) => m.iter().filter(|&&x| x > 0.0).count(),
            None => self.samples.get(i).map_or(0, |s| s.response.len()),
        }
    }

    pub fn mask_of(&self, i: usize) -> Vec<f32> {
        match self.episodes.as_ref().and_then(|e| e.masks.get(i)) {
            Some(m) => m.clone(),
            None => vec![1.0; self.samples.get(i).map_or(0, |s| s.response.len())],
        }
    }

    /// The oldest weight version any of its tokens was sampled under: staleness counts from it.
    pub fn oldest_version(&self) -> u64 {
        self.samples.iter().map(|s| s.oldest_version()).min().unwrap_or(0)
    }

    pub fn is_flat(&self) -> bool {
        is_flat(&self.rewards)
    }

    pub fn staleness(&self, current: u64) -> u64 {
        current.saturating_sub(self.oldest_version())
    }
}

/// Whether a group's rewards carry no signal: all equal (so every group-relative advantage is
/// 0). `filter = drop_flat` drops such a group, under `fully_async` here and under `sync`
/// (dynamic sampling, `run::sync`).
pub fn is_flat(rewards: &[f32]) -> bool {
    rewards.windows(2).all(|w| w[0] == w[1])
}

/// Groups dropped per reason (since the counter was last taken).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DropCounts {
    pub aborted: u64,
    pub filtered: u64,
    pub stale: u64,
    /// Of those, how many went back to the data source.
    pub retried: u64,
}

impl DropCounts {
    fn add(&mut self, reason: DropReason, retried: bool) {
        match reason {
            DropReason::Aborted => self.aborted += 1,
            DropReason::Filtered => self.filtered += 1,
            DropReason::Stale => self.stale += 1,
        }
        if retried {
            self.retried += 1;
        }
    }
}

pub struct Buffer {
    groups: VecDeque<Group>,
    in_flight: BTreeMap<u64, Pending>,
    capacity: usize,
    /// Since the trainer last took them (per-step metrics).
    pub drops: DropCounts,
    /// Since the run (or resume) started.
    pub drops_total: DropCounts,
}

impl Buffer {
    pub fn new(capacity: usize) -> Buffer {
        Buffer {
            groups: VecDeque::new(),
            in_flight: BTreeMap::new(),
            capacity: capacity.max(1),
            drops: DropCounts::default(),
            drops_total: DropCounts::default(),
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Finished groups waiting for the trainer.
    pub fn len(&self) -> usize {
        self.groups.len()
    }

    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Whether generation may start another group.
    pub fn has_room(&self) -> bool {
        self.groups.len() + self.in_flight.len() < self.capacity
    }

    /// Reserves a place for a group that starts generating.
    pub fn admit(&mut self, p: Pending) {
        self.in_flight.insert(p.id, p);
    }

    /// Every prompt buffered or in flight (a checkpoint serves them again after a resume).
    pub fn unfinished(&self) -> impl Iterator<Item = Pending> + '_ {
        self.groups.iter().map(|g| g.prompt).chain(self.in_flight.values().copied())
    }

    /// A group finished: filtered out (always discarded) or buffered.
    pub fn finish(&mut self, g: Group, filter: GroupFilter, source: &mut PromptSource) -> Option<DropReason> {
        self.in_flight.remove(&g.prompt.id);
        if filter == GroupFilter::DropFlat && g.is_flat() {
            self.drop_group(g.prompt, DropReason::Filtered, DropAction::Discard, source);
            return Some(DropReason::Filtered);
        }
        self.groups.push_back(g);
        None
    }

    /// A group in flight was aborted.
    pub fn abort(&mut self, p: Pending, action: DropAction, source: &mut PromptSource) {
        self.in_flight.remove(&p.id);
        self.drop_group(p, DropReason::Aborted, action, source);
    }

    /// Up to `n` groups in arrival order. Stale ones met on the way are dropped (`on_stale`), so the
    /// staleness rule is applied with the version current at the draw.
    pub fn draw(
        &mut self,
        n: usize,
        current: u64,
        max_staleness: u64,
        on_stale: DropAction,
        source: &mut PromptSource,
    ) -> Vec<Group> {
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let Some(g) = self.groups.pop_front() else { break };
            if g.staleness(current) > max_staleness {
                self.drop_group(g.prompt, DropReason::Stale, on_stale, source);
            } else {
                out.push(g);
            }
        }
        out
    }

    /// Mean and max staleness of the groups still waiting.
    pub fn waiting_staleness(&self, current: u64) -> (f64, u64) {
        let n = self.groups.len();
        if n == 0 {
            return (0.0, 0);
        }
        let s: Vec<u64> = self.groups.iter().map(|g| g.staleness(current)).collect();
        (s.iter().sum::<u64>() as f64 / n as f64, s.iter().copied().max().unwrap_or(0))
    }

    fn drop_group(&mut self, p: Pending, reason: DropReason, action: DropAction, source: &mut PromptSource) {
        let retry = action == DropAction::Retry && reason != DropReason::Filtered;
        if retry {
            source.retry(p);
        } else {
            source.discard(p, reason);
        }
        self.drops.add(reason, retry);
        self.drops_total.add(reason, retry);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::VersionSpan;
    use crate::FinishReason;

    fn group(p: Pending, versions: &[u64], rewards: &[f32]) -> Group {
        let samples = versions
            .iter()
            .enumerate()
            .map(|(i, &v)| StreamSample {
                id: i as u64,
                response: vec![3],
                logprobs: vec![-1.0],
                finish: FinishReason::Stop,
                versions: vec![
                    VersionSpan { version: v, from_token: 0 },
                    VersionSpan { version: v + 1, from_token: 1 },
                ],
                aborted: false,
                routing: None,
            })
            .collect();
        Group {
            prompt: p,
            prompt_tokens: vec![1],
            samples,
            rewards: rewards.to_vec(),
            episodes: None,
            reward_parts: vec![],
        }
    }

    fn serve(src: &mut PromptSource, buf: &mut Buffer) -> Pending {
        let (p, _) = src.next(1);
        buf.admit(p);
        p
    }

    #[test]
    fn capacity_counts_groups_in_flight() {
        let mut src = PromptSource::new(0);
        let mut b = Buffer::new(2);
        let a = serve(&mut src, &mut b);
        assert!(b.has_room());
        let c = serve(&mut src, &mut b);
        assert!(!b.has_room(), "two in flight fill a capacity of 2");
        assert_eq!(b.finish(group(a, &[0, 0], &[1.0, 0.0]), GroupFilter::KeepAll, &mut src), None);
        assert!(!b.has_room(), "finished groups keep their place until drawn");
        assert_eq!(b.draw(1, 0, 2, DropAction::Retry, &mut src).len(), 1);
        assert!(b.has_room());
        b.abort(c, DropAction::Retry, &mut src);
        assert_eq!(b.in_flight(), 0);
    }

    #[test]
    fn filtered_groups_are_always_discarded() {
        let mut src = PromptSource::new(0);
        let mut b = Buffer::new(8);
        let p = serve(&mut src, &mut b);
        let r = b.finish(group(p, &[0, 0], &[1.0, 1.0]), GroupFilter::DropFlat, &mut src);
        assert_eq!(r, Some(DropReason::Filtered));
        assert_eq!(src.discarded(), &[(p.id, DropReason::Filtered)]);
        assert_eq!(src.queued(), 0);
        assert_eq!(b.drops, DropCounts { filtered: 1, ..Default::default() });
        // Without the filter a flat group is kept.
        let q = serve(&mut src, &mut b);
        assert_eq!(b.finish(group(q, &[0, 0], &[1.0, 1.0]), GroupFilter::KeepAll, &mut src), None);
        assert_eq!(b.len(), 1);
    }

    #[test]
    fn stale_groups_are_dropped_at_draw_with_retry_or_discard() {
        for action in [DropAction::Retry, DropAction::Discard] {
            let mut src = PromptSource::new(0);
            let mut b = Buffer::new(8);
            let old = serve(&mut src, &mut b);
            let new = serve(&mut src, &mut b);
            // `old` has one sample that started at version 1 (oldest 1); `new` starts at 3.
            b.finish(group(old, &[1, 4], &[1.0, 0.0]), GroupFilter::KeepAll, &mut src);
            b.finish(group(new, &[3, 3], &[1.0, 0.0]), GroupFilter::KeepAll, &mut src);
            assert_eq!(b.waiting_staleness(4), (2.0, 3));
            // Current version 4, max staleness 2: 4 - 1 = 3 > 2 is stale, 4 - 3 = 1 is not.
            let got = b.draw(2, 4, 2, action, &mut src);
            assert_eq!(got.iter().map(|g| g.prompt.id).collect::<Vec<_>>(), vec![new.id]);
            assert_eq!(b.drops.stale, 1);
            match action {
                DropAction::Retry => {
                    assert_eq!(src.queued(), 1);
                    let (p, _) = src.next(2);
                    assert_eq!((p.id, p.retries), (old.id, 1));
                }
                DropAction::Discard => {
                    assert_eq!(src.queued(), 0);
                    assert_eq!(src.discarded(), &[(old.id, DropReason::Stale)]);
                }
            }
            // At the limit exactly (4 - 2 = 2) a group is not stale.
            let p = serve(&mut src, &mut b);
            b.finish(group(p, &[2, 2], &[0.0, 1.0]), GroupFilter::KeepAll, &mut src);
            assert_eq!(b.draw(1, 4, 2, action, &mut src).len(), 1);
        }
    }

    #[test]
    fn aborted_groups_retry_or_discard() {
        let mut src = PromptSource::new(0);
        let mut b = Buffer::new(8);
        let a = serve(&mut src, &mut b);
        let c = serve(&mut src, &mut b);
        b.abort(a, DropAction::Retry, &mut src);
        b.abort(c, DropAction::Discard, &mut src);
        assert_eq!(b.drops, DropCounts { aborted: 2, retried: 1, ..Default::default() });
        assert_eq!(src.next(1).0.id, a.id);
        assert_eq!(src.discarded(), &[(c.id, DropReason::Aborted)]);
    }
}
