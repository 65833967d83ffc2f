//! Which task a run learns, its held-out split, and what a malformed data row does.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Which task, its held-out split and how it is rewarded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskSpec {
    pub kind: TaskKind,
    #[serde(default)]
    pub split: SplitSpec,
    /// Exact match gives 1/0. With partial credit the reward is the fraction of answer positions
    /// that match (still 1 only for an exact match).
    #[serde(default)]
    pub partial_credit: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum TaskKind {
    /// "a+b=" -> "c", operands with 1..=digits digits.
    Addition { digits: u32 },
    /// "a*b=" -> "c", operands with 1..=digits digits.
    Multiplication { digits: u32 },
    /// "abc>" -> "cba", strings over `alphabet` of length min_len..=max_len. With `working` > 0
    /// the answer is verbose: "abc>" -> "cba>ab" (the answer, `>`, the string's first `working`
    /// letters), and only a response's text before its first `>` is scored.
    Reverse {
        min_len: usize,
        max_len: usize,
        #[serde(default = "default_alphabet")]
        alphabet: String,
        #[serde(default, skip_serializing_if = "is_zero")]
        working: usize,
    },
    /// "cab>" -> "abc" (characters sorted), same parameters as reverse.
    Sort {
        min_len: usize,
        max_len: usize,
        #[serde(default = "default_alphabet")]
        alphabet: String,
    },
    /// Prompts from a JSONL or Parquet file (by extension; docs/data.md): the `prompt_field` of a
    /// row is a string or a list of chat messages, the `label_field` and the other fields go to the
    /// reward untouched. Without `test_path`, `split.test_size` rows (chosen by `split.seed`) are
    /// held out.
    #[serde(alias = "jsonl")]
    Data {
        path: PathBuf,
        prompt_field: String,
        label_field: String,
        #[serde(default)]
        test_path: Option<PathBuf>,
        #[serde(default)]
        on_error: OnError,
    },
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

fn default_alphabet() -> String {
    "abcdefghij".to_string()
}

/// What a malformed JSONL line does: reported with file:line either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnError {
    /// Warn and skip the line.
    #[default]
    Skip,
    /// Stop the run with an error.
    Stop,
}

/// The held-out split. With the default rule train prompts never equal a test prompt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SplitSpec {
    /// Number of held-out prompts (capped at half of a small task's whole problem space).
    #[serde(default = "default_test_size")]
    pub test_size: usize,
    /// Seed of the split alone, so runs with different master seeds share one test set.
    #[serde(default = "default_split_seed")]
    pub seed: u64,
    /// What a prompt file's split keeps apart (a built-in task's split is always by prompt).
    /// Left out of the JSON when it is the default, so specs saved before it existed compare
    /// equal on resume.
    #[serde(default, skip_serializing_if = "SplitBy::is_prompt")]
    pub by: SplitBy,
    /// Where a datasets repository's held-out rows come from (the recipe's `held_out`): the
    /// `test` shards it ships, or drawn from its train rows as for one file. Left out of the JSON
    /// when `shipped`, so specs saved before it existed compare equal on resume; a change is a
    /// refused resume (`task.split.held_out`), as the held-out rows decide which rows trained.
    #[serde(default, skip_serializing_if = "HeldOut::is_shipped")]
    pub held_out: HeldOut,
}

/// Where a prompt source's held-out rows come from when no separate test file is named.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HeldOut {
    /// A datasets layout's own `test` shards, at most `test_size` of them; a source that ships
    /// none (one file, plain shards) draws them from its train rows.
    #[default]
    Shipped,
    /// Always drawn from the train rows by the split rule; shipped `test` shards are not read.
    Drawn,
}

impl HeldOut {
    pub fn is_shipped(&self) -> bool {
        *self == HeldOut::Shipped
    }
}

/// The rule of a prompt file's train/test split (the recipe's `split_by`; docs/data.md).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SplitBy {
    /// Rows are held out at random, then every train row whose prompt a test row has is dropped:
    /// the splits never share a prompt.
    #[default]
    Prompt,
    /// Rows are held out at random as they are: one prompt may be in both splits.
    Row,
    /// Rows sharing this field's value stay together: whole groups are held out.
    Key(String),
}

impl SplitBy {
    pub fn is_prompt(&self) -> bool {
        *self == SplitBy::Prompt
    }

    /// The rule as a recipe writes it: `prompt`, `row`, `key "id"`.
    pub fn describe(&self) -> String {
        match self {
            SplitBy::Prompt => "prompt".into(),
            SplitBy::Row => "row".into(),
            SplitBy::Key(k) => format!("key {k:?}"),
        }
    }
}

fn default_test_size() -> usize {
    200
}
fn default_split_seed() -> u64 {
    1234
}

impl Default for SplitSpec {
    fn default() -> Self {
        SplitSpec {
            test_size: default_test_size(),
            seed: default_split_seed(),
            by: SplitBy::Prompt,
            held_out: HeldOut::Shipped,
        }
    }
}
