//! The data source of an asynchronous run: which prompt is generated next. Prompts are numbered
//! in the order they are first served (prompt id k is a pure function of the seed and k, see
//! `TaskSet::train_batch`); a prompt whose group was dropped with `retry` comes back before any
//! fresh one, and one retried `starvation_retries` times is served before everything else
//! (slime #1800: discard-and-requeue starves slow, hard prompts otherwise).
//!
//! Its state is saved with every checkpoint, together with the prompts buffered or in flight at
//! that moment (they are served again first after a resume), so a resumed run loses no prompt and
//! trains none twice.

use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

/// A prompt handed out and not yet trained on or discarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pending {
    pub id: u64,
    /// Times its group was dropped and the prompt retried.
    pub retries: u32,
    /// Training step during which it was first served (its age is measured from there).
    pub first_step: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DropReason {
    /// Requests aborted (a retract/abort pause, a lost engine).
    Aborted,
    /// Rejected by the recipe's filter: always discarded.
    Filtered,
    /// Older than max_staleness weight versions when the trainer drew it.
    Stale,
}

impl DropReason {
    pub fn name(self) -> &'static str {
        match self {
            DropReason::Aborted => "aborted",
            DropReason::Filtered => "filtered",
            DropReason::Stale => "stale",
        }
    }
}

/// How a served prompt was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    Fresh,
    Retry,
    /// Retried `starvation_retries` times or more: went ahead of every other prompt.
    Starving,
}

/// What a checkpoint records (source.json).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SourceState {
    /// Id of the next fresh prompt.
    pub next_id: u64,
    /// Buffered or in flight at the checkpoint: served again first after a resume.
    pub unfinished: Vec<Pending>,
    pub starving: Vec<Pending>,
    pub retry: Vec<Pending>,
    /// Prompts dropped for good, with the reason (a run's whole history, for accounting).
    pub discarded: Vec<(u64, DropReason)>,
    /// Prompts whose group was drawn for training, in order (the whole history): with the fields
    /// above, every id below `next_id` is in exactly one place.
    #[serde(default)]
    pub trained: Vec<u64>,
}

impl SourceState {
    /// What breaks the run's prompt accounting: an id below `next_id` that is in none of
    /// trained, discarded, unfinished, starving and retry (lost), or in more than one (trained
    /// twice, or trained and also waiting). Empty when every prompt is accounted for.
    pub fn accounting_faults(&self) -> Vec<String> {
        let mut seen: std::collections::BTreeMap<u64, Vec<&'static str>> = Default::default();
        let waiting = self.unfinished.iter().chain(&self.starving).chain(&self.retry).map(|p| (p.id, "waiting"));
        let all = self
            .trained
            .iter()
            .map(|&id| (id, "trained"))
            .chain(self.discarded.iter().map(|&(id, _)| (id, "discarded")))
            .chain(waiting);
        for (id, place) in all {
            seen.entry(id).or_default().push(place);
        }
        let mut faults = Vec::new();
        for id in 0..self.next_id {
            match seen.get(&id).map(Vec::as_slice) {
                None => faults.push(format!("prompt {id} was lost")),
                Some([_]) => {}
                Some(places) => faults.push(format!("prompt {id} is {}", places.join(" and "))),
            }
        }
        faults.extend(seen.keys().filter(|&&id| id >= self.next_id).map(|id| format!("prompt {id} was never served")));
        faults
    }
}

pub struct PromptSource {
    next_id: u64,
    starving: VecDeque<Pending>,
    retry: VecDeque<Pending>,
    discarded: Vec<(u64, DropReason)>,
    trained: Vec<u64>,
    starvation_retries: u32,
}

impl PromptSource {
    pub fn new(starvation_retries: u32) -> PromptSource {
        PromptSource {
            next_id: 0,
            starving: VecDeque::new(),
            retry: VecDeque::new(),
            discarded: Vec::new(),
            trained: Vec::new(),
            starvation_retries,
        }
    }

    pub fn from_state(st: SourceState, starvation_retries: u32) -> PromptSource {
        let mut s = PromptSource::new(starvation_retries);
        s.next_id = st.next_id;
        s.discarded = st.discarded;
        s.trained = st.trained;
        // Unfinished ones keep their place ahead of older retries (they were being generated).
        for p in st.unfinished.into_iter().chain(st.retry) {
            s.retry.push_back(p);
        }
        s.starving.extend(st.starving);
        s
    }

    /// The next prompt to generate, served during training step `step`.
    pub fn next(&mut self, step: u64) -> (Pending, Served) {
        if let Some(p) = self.starving.pop_front() {
            return (p, Served::Starving);
        }
        if let Some(p) = self.retry.pop_front() {
            return (p, Served::Retry);
        }
        let p = Pending { id: self.next_id, retries: 0, first_step: step };
        self.next_id += 1;
        (p, Served::Fresh)
    }

    /// A dropped group's prompt comes back (its retry count goes up).
    pub fn retry(&mut self, mut p: Pending) {
        p.retries = p.retries.saturating_add(1);
        if self.starvation_retries > 0 && p.retries >= self.starvation_retries {
            self.starving.push_back(p);
        } else {
            self.retry.push_back(p);
        }
    }

    pub fn discard(&mut self, p: Pending, reason: DropReason) {
        self.discarded.push((p.id, reason));
    }

    /// Prompts waiting to be served again (retries, starving included).
    pub fn queued(&self) -> usize {
        self.starving.len() + self.retry.len()
    }

    pub fn starving(&self) -> usize {
        self.starving.len()
    }

    pub fn next_id(&self) -> u64 {
        self.next_id
    }

    pub fn discarded(&self) -> &[(u64, DropReason)] {
        &self.discarded
    }

    /// A group of prompt `id` was drawn for a training step.
    pub fn mark_trained(&mut self, id: u64) {
        self.trained.push(id);
    }

    /// The state to checkpoint, given the prompts buffered or in flight now.
    pub fn state(&self, unfinished: impl IntoIterator<Item = Pending>) -> SourceState {
        let mut unfinished: Vec<Pending> = unfinished.into_iter().collect();
        unfinished.sort_by_key(|p| p.id);
        SourceState {
            next_id: self.next_id,
            unfinished,
            starving: self.starving.iter().copied().collect(),
            retry: self.retry.iter().copied().collect(),
            discarded: self.discarded.clone(),
            trained: self.trained.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_retry_and_starving_order() {
        let mut s = PromptSource::new(2);
        let (a, how) = s.next(1);
        assert_eq!((a.id, how), (0, Served::Fresh));
        let (b, _) = s.next(1);
        let (c, _) = s.next(1);
        s.retry(b); // 1 retry: ordinary queue
        s.retry(Pending { retries: 1, ..c }); // now 2 retries: starving, served first
        let (x, how) = s.next(2);
        assert_eq!((x.id, x.retries, how), (2, 2, Served::Starving));
        assert_eq!(x.first_step, 1, "age counts from the first time it was served");
        let (y, how) = s.next(2);
        assert_eq!((y.id, y.retries, how), (1, 1, Served::Retry));
        assert_eq!(s.next(2).0.id, 3);
        s.discard(a, DropReason::Filtered);
        assert_eq!(s.discarded(), &[(0, DropReason::Filtered)]);
    }

    #[test]
    fn starvation_off() {
        let mut s = PromptSource::new(0);
        let (a, _) = s.next(0);
        s.retry(Pending { retries: 10, ..a });
        assert_eq!(s.next(0).1, Served::Retry);
    }

    #[test]
    fn state_round_trip_serves_unfinished_first() {
        let mut s = PromptSource::new(3);
        let ps: Vec<Pending> = (0..5).map(|_| s.next(1).0).collect();
        s.retry(ps[0]);
        let st = s.state([ps[3], ps[2]]);
        assert_eq!(st.unfinished.iter().map(|p| p.id).collect::<Vec<_>>(), vec![2, 3]);
        let json = serde_json::to_string(&st).unwrap();
        let mut r = PromptSource::from_state(serde_json::from_str(&json).unwrap(), 3);
        let order: Vec<u64> = (0..4).map(|_| r.next(2).0.id).collect();
        assert_eq!(order, vec![2, 3, 0, 5]);
    }
}
