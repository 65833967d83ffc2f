//! Tasks with verifiable rewards: deterministic prompt generators (arithmetic, string reverse and
//! sort) or prompts from a JSONL or Parquet file, disjoint train/test splits, the run's tokenizer
//! (the built-in character one, or a model directory's Hugging Face one); the exact-match verifier
//! the built-in tasks are scored by is the reward's (`reward::task`).

pub mod parquet;
pub mod prompts;
pub mod split;

pub use crate::reward::task::{answer_part, verify, ANSWER_ENDS_AT};
pub use crate::token::{TokenId, BOS, EOS, PAD};
pub use crate::tokenize::CharTokenizer;
pub use prompts::{Prompt, PromptRow};
pub use split::{split_rows, Split};

use crate::rng::Rng;
use crate::spec::{SplitBy, TaskKind, TaskSpec};
use crate::tokenize::{HfTokenizer, Tokenizer};
use crate::{RunError, E_DATA_FILE, E_SPEC};
use std::collections::HashSet;

/// A procedural generator of problems. `sample` draws one problem; `space` is the number of
/// distinct problems (saturating), used to cap the test split.
#[derive(Debug, Clone)]
enum Generator {
    Arith {
        digits: u32,
        op: char,
    },
    /// `working` > 0 (reverse only): the answer is followed by `>` and the string's first
    /// `working` letters, and the row says that only the text before the first `>` is scored.
    Str {
        min_len: usize,
        max_len: usize,
        alphabet: Vec<char>,
        sort: bool,
        working: usize,
    },
}

impl Generator {
    fn sample(&self, rng: &mut Rng) -> PromptRow {
        match self {
            Generator::Arith { digits, op } => {
                let m = 10u64.pow(*digits);
                let a = rng.below(m);
                let b = rng.below(m);
                let c = if *op == '+' { a + b } else { a * b };
                PromptRow::text(format!("{a}{op}{b}="), c.to_string())
            }
            Generator::Str { min_len, max_len, alphabet, sort, working } => {
                let len = *min_len + rng.below((*max_len - *min_len + 1) as u64) as usize;
                let s: Vec<char> = (0..len).map(|_| alphabet[rng.below(alphabet.len() as u64) as usize]).collect();
                let mut t = s.clone();
                if *sort {
                    t.sort_unstable();
                } else {
                    t.reverse();
                }
                let prompt = format!("{}>", s.iter().collect::<String>());
                if *working == 0 {
                    return PromptRow::text(prompt, t.into_iter().collect());
                }
                // The verbose target: the answer, `>`, then the working (the string's first letters).
                let target: String = t.iter().chain(['>'].iter()).chain(&s[..(*working).min(len)]).collect();
                let mut row = PromptRow::text(prompt, target);
                row.metadata.insert(ANSWER_ENDS_AT.into(), serde_json::Value::String(">".into()));
                row
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
}

enum TrainSource {
    Generated { generator: Generator, test_prompts: HashSet<String> },
    List(Vec<PromptRow>),
}

/// A task ready to run: tokenizer, held-out test items, and a deterministic train stream.
pub struct TaskSet {
    pub tokenizer: Tokenizer,
    pub test: Vec<PromptRow>,
    train: TrainSource,
    partial_credit: bool,
    /// Longest prompt (with its special tokens) and longest gold answer (with the stop token), in
    /// tokens, over the test split and the train items (a generator's train stream: over a sample).
    max_prompt_tokens: usize,
    max_answer_tokens: usize,
    /// Problems reported while loading (skipped malformed lines), to show the user.
    pub warnings: Vec<String>,
}

impl TaskSet {
    /// The task of `spec` with the built-in character tokenizer, or `hf` (a model directory's
    /// tokenizer) when the run starts from a Hugging Face checkpoint.
    pub fn build(spec: &TaskSpec) -> Result<TaskSet, RunError> {
        Self::build_with(spec, None)
    }

    pub fn build_with(spec: &TaskSpec, hf: Option<HfTokenizer>) -> Result<TaskSet, RunError> {
        Self::build_for(spec, hf, "")
    }

    /// `build_with`, a character tokenizer also covering `extra_chars` (what an environment's
    /// observations may hold).
    pub fn build_for(spec: &TaskSpec, hf: Option<HfTokenizer>, extra_chars: &str) -> Result<TaskSet, RunError> {
        let generator = match &spec.kind {
            TaskKind::Addition { digits } => Generator::Arith { digits: *digits, op: '+' },
            TaskKind::Multiplication { digits } => Generator::Arith { digits: *digits, op: '*' },
            TaskKind::Reverse { min_len, max_len, alphabet, .. } | TaskKind::Sort { min_len, max_len, alphabet } => {
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
                    working: match spec.kind {
                        TaskKind::Reverse { working, .. } => working,
                        _ => 0,
                    },
                }
            }
            TaskKind::Data { .. } => {
                let Some((train, test)) = data_settings(&spec.kind) else {
                    return Err(RunError::internal("a data task without its files"));
                };
                return Self::from_rows(spec, &train, test.as_ref(), hf, extra_chars);
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
            if seen.insert(item.prompt_key().to_string()) {
                test.push(item);
            }
        }
        let tokenizer = match hf {
            Some(t) => Tokenizer::Hf(Box::new(t)),
            None => Tokenizer::Char(CharTokenizer::new(generator.chars().into_iter().chain(extra_chars.chars()))),
        };
        // The longest problems: the test split plus a sample of the train stream.
        let mut probe = Rng::derived(spec.split.seed, "length-probe", 0);
        let sample: Vec<PromptRow> = (0..1000).map(|_| generator.sample(&mut probe)).collect();
        let (max_prompt_tokens, max_answer_tokens) = max_lens(&tokenizer, test.iter().chain(&sample))?;
        Ok(TaskSet {
            tokenizer,
            test,
            train: TrainSource::Generated { generator, test_prompts: seen },
            partial_credit: spec.partial_credit,
            max_prompt_tokens,
            max_answer_tokens,
            warnings: Vec::new(),
        })
    }

    fn from_rows(
        spec: &TaskSpec,
        train: &prompts::DataSettings,
        test: Option<&prompts::DataSettings>,
        hf: Option<HfTokenizer>,
        extra_chars: &str,
    ) -> Result<TaskSet, RunError> {
        let mut warnings = Vec::new();
        let (items, test) = read_rows(spec, train, test, &mut warnings)?;
        let split = split::split_rows(items, test, train, &spec.split, &mut warnings)?;
        if !split.dropped.is_empty() {
            warnings.push(format!(
                "{} train row(s) sharing a {} with the test split were dropped (split_by = {})",
                split.dropped.len(),
                if spec.split.by == SplitBy::Prompt { "prompt" } else { "key" },
                spec.split.by.describe()
            ));
        }
        split.check(&train.path, &spec.split.by)?;
        let split::Split { train: items, test, .. } = split;
        let tokenizer = data_tokenizer(hf, items.iter().chain(&test), extra_chars)?;
        let (max_prompt_tokens, max_answer_tokens) = max_lens(&tokenizer, items.iter().chain(&test))?;
        // Train items stay in the split's order; `train_batch` shuffles per epoch from the seed.
        Ok(TaskSet {
            tokenizer,
            test,
            train: TrainSource::List(items),
            partial_credit: spec.partial_credit,
            max_prompt_tokens,
            max_answer_tokens,
            warnings,
        })
    }

    /// Longest prompt in tokens (with its special tokens) and longest gold answer in tokens (with
    /// the stop token).
    pub fn max_token_lens(&self) -> (usize, usize) {
        (self.max_prompt_tokens, self.max_answer_tokens)
    }

    /// The ids that end a response.
    pub fn stop_tokens(&self) -> Vec<TokenId> {
        self.tokenizer.special().stop
    }

    /// The `n` train problems of RL step (or SFT step) `index` of stream `purpose`: a pure function
    /// of (seed, purpose, index), so a resumed run draws exactly what an uninterrupted one would.
    pub fn train_batch(&self, seed: u64, purpose: &str, index: u64, n: usize) -> Vec<PromptRow> {
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
                    if !test_prompts.contains(item.prompt_key()) || attempts > 1000 * n {
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

    pub fn partial_credit(&self) -> bool {
        self.partial_credit
    }
}

/// How a data task's files are read: the train file's settings, and a separate test file's.
/// None for a built-in task.
pub fn data_settings(kind: &TaskKind) -> Option<(prompts::DataSettings, Option<prompts::DataSettings>)> {
    let TaskKind::Data { path, prompt_field, label_field, test_path, on_error } = kind else { return None };
    let settings = |p: &std::path::Path| prompts::DataSettings {
        path: p.to_path_buf(),
        prompt_field: prompt_field.clone(),
        label_field: label_field.clone(),
        on_error: *on_error,
    };
    Some((settings(path), test_path.as_deref().map(settings)))
}

/// A data task's rows as the run reads them: the train file's, and the held-out rows of a
/// separate test file or of the test shards a datasets layout ships (None: the split draws them
/// from the train rows). `miles data` reads through this too.
pub fn read_rows(
    spec: &TaskSpec,
    train: &prompts::DataSettings,
    test: Option<&prompts::DataSettings>,
    warnings: &mut Vec<String>,
) -> Result<(Vec<PromptRow>, Option<Vec<PromptRow>>), RunError> {
    let items = prompts::read(train, warnings)?;
    let test = match test {
        Some(t) => Some(prompts::read(t, warnings)?),
        // A datasets layout's own test shards, when it ships them (docs/data.md).
        None => prompts::read_shipped_test(train, &spec.split, warnings)?,
    };
    Ok((items, test))
}

/// The tokenizer of a run over prompt rows: the model's (`hf`), or a character tokenizer over
/// every character of the rows (prompts and labels) and `extra_chars`. A chat prompt needs the
/// model's chat template.
pub fn data_tokenizer<'a>(
    hf: Option<HfTokenizer>,
    rows: impl Iterator<Item = &'a PromptRow> + Clone,
    extra_chars: &str,
) -> Result<Tokenizer, RunError> {
    if let Some(t) = hf {
        return Ok(Tokenizer::Hf(Box::new(t)));
    }
    if let Some(chat) = rows.clone().find(|r| matches!(r.prompt, Prompt::Chat(_))) {
        return Err(RunError::new(
            E_DATA_FILE,
            format!("{}: a chat prompt (a list of messages) needs a chat template", chat.origin),
        )
        .with_help("start from a Hugging Face model (`hf { path = ... }`) whose tokenizer has a chat template, or give string prompts"));
    }
    let text = |r: &PromptRow| format!("{}{}", r.prompt_key(), r.label_text());
    let chars = rows.flat_map(|r| text(r).chars().collect::<Vec<_>>());
    Ok(Tokenizer::Char(CharTokenizer::new(chars.chain(extra_chars.chars()))))
}

/// The longest prompt and gold answer of `rows` in tokens, as the executors encode them.
fn max_lens<'a>(tokenizer: &Tokenizer, rows: impl Iterator<Item = &'a PromptRow>) -> Result<(usize, usize), RunError> {
    let (mut p, mut a) = (0, 0);
    for r in rows {
        let at = |e: RunError| {
            if r.origin.is_empty() {
                e
            } else {
                RunError { message: format!("{}: {}", r.origin, e.message), ..e }
            }
        };
        p = p.max(tokenizer.encode_prompt(&r.prompt).map_err(at)?.len());
        a = a.max(tokenizer.encode_answer(&r.label_text()).map_err(at)?.len());
    }
    Ok((p, a))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::SplitSpec;
    use crate::FinishReason;

    fn spec(kind: TaskKind) -> TaskSpec {
        TaskSpec { kind, split: SplitSpec { test_size: 50, seed: 3, ..Default::default() }, partial_credit: false }
    }

    #[test]
    fn arithmetic_is_correct_and_splits_are_disjoint() {
        let t = TaskSet::build(&spec(TaskKind::Addition { digits: 2 })).unwrap();
        assert_eq!(t.test.len(), 50);
        let test: HashSet<_> = t.test.iter().map(|i| i.prompt_key().to_string()).collect();
        for step in 0..20 {
            for item in t.train_batch(9, "rollout", step, 16) {
                assert!(!test.contains(item.prompt_key()));
                let (a, b) = item.prompt_key().trim_end_matches('=').split_once('+').unwrap();
                let s: u64 = a.parse::<u64>().unwrap() + b.parse::<u64>().unwrap();
                assert_eq!(item.label_text(), s.to_string());
            }
        }
        assert_eq!(t.train_batch(9, "rollout", 4, 8), t.train_batch(9, "rollout", 4, 8));
        assert_ne!(t.train_batch(9, "rollout", 4, 8), t.train_batch(9, "rollout", 5, 8));
        let m = TaskSet::build(&spec(TaskKind::Multiplication { digits: 1 })).unwrap();
        // 100 problems: at most half are held out.
        assert_eq!(m.test.len(), 50);
        for item in m.train_batch(1, "r", 0, 30) {
            let (a, b) = item.prompt_key().trim_end_matches('=').split_once('*').unwrap();
            assert_eq!(item.label_text(), (a.parse::<u64>().unwrap() * b.parse::<u64>().unwrap()).to_string());
        }
    }

    #[test]
    fn string_tasks() {
        let r = TaskSet::build(&spec(TaskKind::Reverse { min_len: 2, max_len: 4, alphabet: "abc".into(), working: 0 }))
            .unwrap();
        for item in r.train_batch(1, "r", 0, 10) {
            let p: String = item.prompt_key().trim_end_matches('>').chars().rev().collect();
            assert_eq!(p, item.label_text());
        }
        let s = TaskSet::build(&spec(TaskKind::Sort { min_len: 3, max_len: 3, alphabet: "cab".into() })).unwrap();
        // 27 problems: 13 held out.
        assert_eq!(s.test.len(), 13);
        let item = &s.test[0];
        let mut c: Vec<char> = item.prompt_key().trim_end_matches('>').chars().collect();
        c.sort();
        assert_eq!(c.into_iter().collect::<String>(), item.label_text());
        assert_eq!(s.tokenizer.vocab_size(), 3 + 4);
    }

    #[test]
    fn reverse_working_target_and_scoring() {
        use crate::reward::{BatchReward, RewardOutcome, TaskReward};
        // The verbose target: the answer, `>`, the string's first `working` letters.
        let g = Generator::Str { min_len: 4, max_len: 4, alphabet: "abcd".chars().collect(), sort: false, working: 2 };
        let mut rng = Rng::derived(1, "t", 0);
        for _ in 0..20 {
            let row = g.sample(&mut rng);
            let s = row.prompt_key().trim_end_matches('>');
            let answer: String = s.chars().rev().collect();
            assert_eq!(row.label_text(), format!("{answer}>{}", &s[..2]));
            assert_eq!(row.metadata[ANSWER_ENDS_AT], ">");
        }
        // Off: the rows are exactly the concise task's (same draws, no metadata).
        let task = |working| {
            TaskSet::build(&spec(TaskKind::Reverse { min_len: 3, max_len: 6, alphabet: "abcdefghij".into(), working }))
                .unwrap()
        };
        let (off, on) = (task(0), task(3));
        for (a, b) in off.train_batch(5, "r", 2, 16).iter().zip(on.train_batch(5, "r", 2, 16).iter()) {
            assert_eq!(a.prompt_key(), b.prompt_key());
            assert!(a.metadata.is_empty());
            assert_eq!(a.label_text(), answer_part(&b.label_text(), ">"));
            assert_eq!(b.label_text().len(), a.label_text().len() + 4);
        }
        assert_eq!(off.test.len(), on.test.len());
        assert_eq!(on.max_token_lens(), (8, 6 + 1 + 3 + 1));
        // Scoring: only the text before the first `>` of the response counts.
        assert_eq!(answer_part("dcba>ab", ">"), "dcba");
        assert_eq!(answer_part("dcba", ">"), "dcba");
        assert_eq!(answer_part(">dcba", ">"), "");
        assert_eq!(answer_part("dc>ba>ab", ">"), "dc");
        let verbose = PromptRow {
            metadata: [(ANSWER_ENDS_AT.to_string(), serde_json::json!(">"))].into_iter().collect(),
            ..PromptRow::text("abcd>".into(), "dcba>ab".into())
        };
        let concise = PromptRow::text("abcd>".into(), "dcba".into());
        let cases = [
            (&verbose, "dcba>ab", FinishReason::Stop, 1.0),
            (&verbose, "dcba", FinishReason::Stop, 1.0),
            (&verbose, "dcba>", FinishReason::Stop, 1.0),
            (&verbose, "dcba>jjjj", FinishReason::Stop, 1.0),
            (&verbose, "dcb>a", FinishReason::Stop, 0.0),
            (&verbose, "dcbaab", FinishReason::Stop, 0.0),
            (&verbose, ">dcba", FinishReason::Stop, 0.0),
            (&verbose, "dcba>ab", FinishReason::Length, 0.0),
            // Without the metadata (the concise task) the whole response is compared, as before.
            (&concise, "dcba", FinishReason::Stop, 1.0),
            (&concise, "dcba>ab", FinishReason::Stop, 0.0),
        ];
        let inputs: Vec<_> =
            cases.iter().map(|(row, r, f, _)| row.reward_input("s".into(), r.to_string(), *f)).collect();
        let got = TaskReward { partial_credit: false }.score_batch(&inputs).unwrap();
        let want: Vec<_> = cases.iter().map(|c| RewardOutcome::Score(c.3)).collect();
        assert_eq!(got, want);
    }

    /// Rows that share one prompt (the answer only in the label) cannot be split with disjoint
    /// prompts: the error says why, not only "train 0".
    #[test]
    fn a_split_emptied_by_shared_prompts_explains_itself() {
        let dir = std::env::temp_dir().join(format!("miles-shared-prompt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("rows.jsonl");
        let rows: String = (0..40).map(|i| format!("{{\"prompt\": \"solve\", \"answer\": \"{i}\"}}\n")).collect();
        std::fs::write(&path, rows).unwrap();
        let kind = |path: std::path::PathBuf| TaskKind::Data {
            path,
            prompt_field: "prompt".into(),
            label_field: "answer".into(),
            test_path: None,
            on_error: Default::default(),
        };
        let e = TaskSet::build(&spec(kind(path.clone()))).err().expect("no train rows are left");
        assert_eq!(e.code, E_DATA_FILE);
        assert!(e.message.contains("train 0, test 20"), "{}", e.message);
        let help = e.help.as_deref().unwrap_or_default();
        assert!(help.contains("all 20 train row(s) have a prompt that a test row has too"), "{help}");
        assert!(help.contains("Set `split_by = row`"), "the help names the setting to change: {help}");
        // `split_by = row` splits the same rows as they are: 20 and 20, nothing dropped.
        let mut by_row = spec(kind(path.clone()));
        by_row.split.by = SplitBy::Row;
        let t = TaskSet::build(&by_row).unwrap();
        let TrainSource::List(train) = &t.train else { panic!("a file's rows") };
        assert_eq!((t.test.len(), train.len()), (20, 20));
        assert!(t.warnings.is_empty(), "{:?}", t.warnings);
        // Distinct prompts split as before, with no such help.
        let rows: String = (0..40).map(|i| format!("{{\"prompt\": \"{i}+0=\", \"answer\": \"{i}\"}}\n")).collect();
        std::fs::write(&path, rows).unwrap();
        let t = TaskSet::build(&spec(kind(path))).unwrap();
        assert_eq!(t.test.len(), 20);
        let _ = std::fs::remove_dir_all(&dir);
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
