//! Tasks with verifiable rewards: deterministic prompt generators (arithmetic, string reverse and
//! sort) or prompts from a JSONL file, disjoint train/test splits, and an exact-match verifier.

pub mod jsonl;
pub mod parquet;
pub mod prompts;
pub mod tokenizer;

pub use tokenizer::{CharTokenizer, TokenId, BOS, EOS, PAD};

use crate::rng::Rng;
use crate::spec::{TaskKind, TaskSpec};
use crate::{FinishReason, RunError, E_DATA_FILE, E_SPEC};
use std::collections::HashSet;

/// One problem: the text the policy sees and the answer the verifier expects.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TaskItem {
    pub prompt: String,
    pub label: String,
}

/// A procedural generator of problems. `sample` draws one problem; `space` is the number of
/// distinct problems (saturating), used to cap the test split.
#[derive(Debug, Clone)]
enum Generator {
    Arith { digits: u32, op: char },
    Str { min_len: usize, max_len: usize, alphabet: Vec<char>, sort: bool },
}

impl Generator {
    fn sample(&self, rng: &mut Rng) -> TaskItem {
        match self {
            Generator::Arith { digits, op } => {
                let m = 10u64.pow(*digits);
                let a = rng.below(m);
                let b = rng.below(m);
                let c = if *op == '+' { a + b } else { a * b };
                TaskItem { prompt: format!("{a}{op}{b}="), label: c.to_string() }
            }
            Generator::Str { min_len, max_len, alphabet, sort } => {
                let len = *min_len + rng.below((*max_len - *min_len + 1) as u64) as usize;
                let s: Vec<char> = (0..len).map(|_| alphabet[rng.below(alphabet.len() as u64) as usize]).collect();
                let mut t = s.clone();
                if *sort {
                    t.sort_unstable();
                } else {
                    t.reverse();
                }
                TaskItem { prompt: format!("{}>", s.iter().collect::<String>()), label: t.into_iter().collect() }
            }
        }
    }

    fn space(&self) -> u64 {
        match self {
            Generator::Arith { digits, .. } => 10u64.pow(*digits).saturating_pow(2),
            Generator::Str { min_len, max_len, alphabet, .. } => {
                let k = alphabet.len() as u64;
                (*min_len..=*max_len).fold(0u64, |acc, l| acc.saturating_add(k.saturating_pow(l.min(64) as u32)))
            }
        }
    }

    fn chars(&self) -> Vec<char> {
        match self {
            Generator::Arith { op, .. } => "0123456789=".chars().chain([*op]).collect(),
            Generator::Str { alphabet, .. } => alphabet.iter().copied().chain(['>']).collect(),
        }
    }

    /// Longest prompt and answer in characters.
    fn max_lens(&self) -> (usize, usize) {
        match self {
            Generator::Arith { digits, op } => {
                let d = *digits as usize;
                (2 * d + 2, if *op == '+' { d + 1 } else { 2 * d })
            }
            Generator::Str { max_len, .. } => (*max_len + 1, *max_len),
        }
    }
}

enum TrainSource {
    Generated { generator: Generator, test_prompts: HashSet<String> },
    List(Vec<TaskItem>),
}

/// A task ready to run: tokenizer, held-out test items, and a deterministic train stream.
pub struct TaskSet {
    pub tokenizer: CharTokenizer,
    pub test: Vec<TaskItem>,
    train: TrainSource,
    partial_credit: bool,
    max_prompt_chars: usize,
    max_answer_chars: usize,
    /// Problems reported while loading (skipped malformed lines), to show the user.
    pub warnings: Vec<String>,
}

impl TaskSet {
    pub fn build(spec: &TaskSpec) -> Result<TaskSet, RunError> {
        let generator = match &spec.kind {
            TaskKind::Addition { digits } => Generator::Arith { digits: *digits, op: '+' },
            TaskKind::Multiplication { digits } => Generator::Arith { digits: *digits, op: '*' },
            TaskKind::Reverse { min_len, max_len, alphabet } | TaskKind::Sort { min_len, max_len, alphabet } => {
                let alphabet: Vec<char> = alphabet.chars().collect();
                if alphabet.contains(&'>') {
                    return Err(RunError::new(
                        E_SPEC,
                        "run spec field `task.kind.alphabet`: must not contain '>' (it ends the prompt)",
                    ));
                }
                Generator::Str {
                    min_len: *min_len,
                    max_len: *max_len,
                    alphabet,
                    sort: matches!(spec.kind, TaskKind::Sort { .. }),
                }
            }
            TaskKind::Jsonl { path, prompt_field, label_field, test_path, on_error } => {
                return Self::from_jsonl(spec, path, prompt_field, label_field, test_path.as_deref(), *on_error)
            }
        };
        // Never hold out more than half of a small problem space: training needs the rest.
        let want = (spec.split.test_size as u64).min(generator.space() / 2).max(1) as usize;
        let mut rng = Rng::derived(spec.split.seed, "test-split", 0);
        let mut test = Vec::with_capacity(want);
        let mut seen = HashSet::new();
        // Bounded: with at most half the space taken, each draw is new with probability >= 1/2.
        let mut attempts = 0usize;
        while test.len() < want && attempts < 1000 * want + 1000 {
            attempts += 1;
            let item = generator.sample(&mut rng);
            if seen.insert(item.prompt.clone()) {
                test.push(item);
            }
        }
        let (max_prompt_chars, max_answer_chars) = generator.max_lens();
        Ok(TaskSet {
            tokenizer: CharTokenizer::new(generator.chars()),
            test,
            train: TrainSource::Generated { generator, test_prompts: seen },
            partial_credit: spec.partial_credit,
            max_prompt_chars,
            max_answer_chars,
            warnings: Vec::new(),
        })
    }

    fn from_jsonl(
        spec: &TaskSpec,
        path: &std::path::Path,
        prompt_field: &str,
        label_field: &str,
        test_path: Option<&std::path::Path>,
        on_error: crate::spec::OnError,
    ) -> Result<TaskSet, RunError> {
        let mut warnings = Vec::new();
        let mut items = jsonl::read(path, prompt_field, label_field, on_error, &mut warnings)?;
        let test = match test_path {
            Some(tp) => jsonl::read(tp, prompt_field, label_field, on_error, &mut warnings)?,
            None => {
                let mut rng = Rng::derived(spec.split.seed, "test-split", 0);
                rng.shuffle(&mut items);
                let n = spec.split.test_size.min(items.len() / 2);
                items.drain(..n).collect()
            }
        };
        // Disjoint splits: a train line whose prompt is also a test prompt is dropped.
        let test_prompts: HashSet<&str> = test.iter().map(|t| t.prompt.as_str()).collect();
        let before = items.len();
        items.retain(|t| !test_prompts.contains(t.prompt.as_str()));
        if items.len() < before {
            warnings.push(format!("{} train prompt(s) also in the test split were dropped", before - items.len()));
        }
        if items.is_empty() || test.is_empty() {
            return Err(RunError::new(
                E_DATA_FILE,
                format!(
                    "{}: needs at least one usable train and one test prompt (train {}, test {})",
                    path.display(),
                    items.len(),
                    test.len()
                ),
            ));
        }
        // Train items stay in file order; `train_batch` shuffles per epoch from the seed.
        let tokenizer =
            CharTokenizer::new(items.iter().chain(test.iter()).flat_map(|t| t.prompt.chars().chain(t.label.chars())));
        let max_prompt_chars = items.iter().chain(test.iter()).map(|t| t.prompt.chars().count()).max().unwrap_or(0);
        let max_answer_chars = items.iter().chain(test.iter()).map(|t| t.label.chars().count()).max().unwrap_or(0);
        Ok(TaskSet {
            tokenizer,
            test,
            train: TrainSource::List(items),
            partial_credit: spec.partial_credit,
            max_prompt_chars,
            max_answer_chars,
            warnings,
        })
    }

    /// Longest prompt in tokens (with BOS) and longest gold answer in tokens (with EOS).
    pub fn max_token_lens(&self) -> (usize, usize) {
        (self.max_prompt_chars + 1, self.max_answer_chars + 1)
    }

    /// The `n` train problems of RL step (or SFT step) `index` of stream `purpose`: a pure function
    /// of (seed, purpose, index), so a resumed run draws exactly what an uninterrupted one would.
    pub fn train_batch(&self, seed: u64, purpose: &str, index: u64, n: usize) -> Vec<TaskItem> {
        match &self.train {
            TrainSource::Generated { generator, test_prompts } => {
                let mut rng = Rng::derived(seed, purpose, index);
                let mut out = Vec::with_capacity(n);
                let mut attempts = 0;
                while out.len() < n {
                    let item = generator.sample(&mut rng);
                    attempts += 1;
                    // Bounded rejection: the test split is at most half the space. After many
                    // misses (impossible in practice) accept rather than loop forever.
                    if !test_prompts.contains(&item.prompt) || attempts > 1000 * n {
                        out.push(item);
                    }
                }
                out
            }
            TrainSource::List(items) => {
                // Epoch-wise shuffles: item k of the stream is element (k mod len) of epoch
                // k / len's permutation.
                let len = items.len() as u64;
                let mut out = Vec::with_capacity(n);
                let mut cached: Option<(u64, Vec<usize>)> = None;
                for j in 0..n as u64 {
                    let k = index * n as u64 + j;
                    let epoch = k / len;
                    if cached.as_ref().map(|c| c.0) != Some(epoch) {
                        let mut perm: Vec<usize> = (0..items.len()).collect();
                        Rng::derived(seed, purpose, epoch ^ 0x5eed_0000_0000).shuffle(&mut perm);
                        cached = Some((epoch, perm));
                    }
                    let perm = &cached.as_ref().map(|c| &c.1).expect("set above");
                    out.push(items[perm[(k % len) as usize]].clone());
                }
                out
            }
        }
    }

    /// Reward of a response: 1 for an exact match that ended with EOS, else 0 — or, with partial
    /// credit, the fraction of matching positions (capped below 1 unless exact).
    pub fn reward(&self, item: &TaskItem, response: &str, finish: FinishReason) -> f32 {
        verify(&item.label, response, finish, self.partial_credit)
    }
}

/// The verifier (public for tests and other backends).
pub fn verify(label: &str, response: &str, finish: FinishReason, partial_credit: bool) -> f32 {
    let exact = finish == FinishReason::Stop && response == label;
    if exact {
        return 1.0;
    }
    if !partial_credit {
        return 0.0;
    }
    let l: Vec<char> = label.chars().collect();
    let r: Vec<char> = response.chars().collect();
    let n = l.len().max(r.len());
    if n == 0 {
        return 0.0;
    }
    let same = l.iter().zip(r.iter()).filter(|(a, b)| a == b).count();
    // An inexact answer never earns full credit.
    (same as f32 / n as f32).min(0.9)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::SplitSpec;

    fn spec(kind: TaskKind) -> TaskSpec {
        TaskSpec { kind, split: SplitSpec { test_size: 50, seed: 3 }, partial_credit: false }
    }

    #[test]
    fn arithmetic_is_correct_and_splits_are_disjoint() {
        let t = TaskSet::build(&spec(TaskKind::Addition { digits: 2 })).unwrap();
        assert_eq!(t.test.len(), 50);
        let test: HashSet<_> = t.test.iter().map(|i| i.prompt.clone()).collect();
        for step in 0..20 {
            for item in t.train_batch(9, "rollout", step, 16) {
                assert!(!test.contains(&item.prompt));
                let (a, b) = item.prompt.trim_end_matches('=').split_once('+').unwrap();
                let s: u64 = a.parse::<u64>().unwrap() + b.parse::<u64>().unwrap();
                assert_eq!(item.label, s.to_string());
            }
        }
        assert_eq!(t.train_batch(9, "rollout", 4, 8), t.train_batch(9, "rollout", 4, 8));
        assert_ne!(t.train_batch(9, "rollout", 4, 8), t.train_batch(9, "rollout", 5, 8));
        let m = TaskSet::build(&spec(TaskKind::Multiplication { digits: 1 })).unwrap();
        // 100 problems: at most half are held out.
        assert_eq!(m.test.len(), 50);
        for item in m.train_batch(1, "r", 0, 30) {
            let (a, b) = item.prompt.trim_end_matches('=').split_once('*').unwrap();
            assert_eq!(item.label, (a.parse::<u64>().unwrap() * b.parse::<u64>().unwrap()).to_string());
        }
    }

    #[test]
    fn string_tasks() {
        let r = TaskSet::build(&spec(TaskKind::Reverse { min_len: 2, max_len: 4, alphabet: "abc".into() })).unwrap();
        for item in r.train_batch(1, "r", 0, 10) {
            let p: String = item.prompt.trim_end_matches('>').chars().rev().collect();
            assert_eq!(p, item.label);
        }
        let s = TaskSet::build(&spec(TaskKind::Sort { min_len: 3, max_len: 3, alphabet: "cab".into() })).unwrap();
        // 27 problems: 13 held out.
        assert_eq!(s.test.len(), 13);
        let item = &s.test[0];
        let mut c: Vec<char> = item.prompt.trim_end_matches('>').chars().collect();
        c.sort();
        assert_eq!(c.into_iter().collect::<String>(), item.label);
        assert_eq!(s.tokenizer.vocab_size(), 3 + 4);
    }

    #[test]
    fn verifier() {
        assert_eq!(verify("12", "12", FinishReason::Stop, false), 1.0);
        assert_eq!(verify("12", "12", FinishReason::Length, false), 0.0);
        assert_eq!(verify("12", "13", FinishReason::Stop, false), 0.0);
        assert_eq!(verify("12", "13", FinishReason::Stop, true), 0.5);
        assert_eq!(verify("12", "123", FinishReason::Stop, true), 0.9f32.min(2.0 / 3.0));
        assert_eq!(verify("12", "", FinishReason::Stop, true), 0.0);
    }
}
