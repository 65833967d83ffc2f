//! A prompt file's train/test split under the recipe's rule (`split_by`, docs/data.md): which
//! rows are held out, and which train rows the rule drops so that the splits stay apart. The run
//! (`TaskSet`) and `miles data` call the same function, so the preview shows the run's split.

use super::prompts::{malformed, DataSettings, PromptRow};
use crate::rng::Rng;
use crate::spec::{SplitBy, SplitSpec};
use crate::{RunError, E_DATA_FILE};
use std::collections::{HashMap, HashSet};
use std::path::Path;

/// A prompt file's rows after the split.
#[derive(Debug, Clone, Default)]
pub struct Split {
    pub train: Vec<PromptRow>,
    pub test: Vec<PromptRow>,
    /// Train rows left out because a test row has their prompt (`prompt`) or key (`key`, against
    /// a separate test file), in the order the split met them.
    pub dropped: Vec<PromptRow>,
    /// Distinct values of the split key over the rows (`key` only; 0 otherwise).
    pub groups: usize,
}

/// Splits `rows` (a file's rows, in file order) by `split`. With `test` (a separate test file)
/// every row of `rows` is a train row, less those the rule keeps apart from the test rows.
/// Without it, `split.test_size` rows (at most half the file) are drawn by `split.seed`. Rows
/// lacking the split key are malformed (file:line), skipped or stopping under `on_error`.
pub fn split_rows(
    rows: Vec<PromptRow>,
    test: Option<Vec<PromptRow>>,
    settings: &DataSettings,
    split: &SplitSpec,
    warnings: &mut Vec<String>,
) -> Result<Split, RunError> {
    let keyed = |rows: Vec<PromptRow>, warnings: &mut Vec<String>| -> Result<Vec<(String, PromptRow)>, RunError> {
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            match identity(&r, settings, &split.by) {
                Some(k) => out.push((k, r)),
                None => {
                    let field = match &split.by {
                        SplitBy::Key(k) => k.as_str(),
                        _ => "",
                    };
                    let why = format!("{}: missing field `{field}` (the split key, `split_key`)", r.origin);
                    malformed(settings.on_error, why, warnings)?
                }
            }
        }
        Ok(out)
    };
    let mut rows = keyed(rows, warnings)?;
    let groups = match &split.by {
        SplitBy::Key(_) => rows.iter().map(|(k, _)| k.as_str()).collect::<HashSet<_>>().len(),
        _ => 0,
    };
    let (test, train) = match test {
        Some(t) => (keyed(t, warnings)?, rows),
        None => {
            let n = split.test_size.min(rows.len() / 2);
            let mut rng = Rng::derived(split.seed, "test-split", 0);
            match &split.by {
                // One draw over the rows, as every run before `split_by` existed did: the same
                // seed holds out the same rows.
                SplitBy::Prompt | SplitBy::Row => {
                    rng.shuffle(&mut rows);
                    let test: Vec<_> = rows.drain(..n).collect();
                    (test, rows)
                }
                // Whole groups, in a seeded order, until the test split holds at least `n` rows.
                SplitBy::Key(_) => {
                    let mut order: Vec<String> = Vec::new();
                    let mut members: HashMap<String, Vec<(String, PromptRow)>> = HashMap::new();
                    for (k, r) in rows {
                        let group = members.entry(k.clone()).or_default();
                        if group.is_empty() {
                            order.push(k.clone());
                        }
                        group.push((k, r));
                    }
                    rng.shuffle(&mut order);
                    let (mut test, mut train) = (Vec::new(), Vec::new());
                    for k in order {
                        let group = members.remove(&k).unwrap_or_default();
                        if test.len() < n {
                            test.extend(group);
                        } else {
                            train.extend(group);
                        }
                    }
                    (test, train)
                }
            }
        }
    };
    // Under `row` nothing is kept apart; under `key` drawn groups are already whole, and only a
    // separate test file can share a key with a train row.
    let held: HashSet<&str> = test.iter().map(|(k, _)| k.as_str()).collect();
    let (mut kept, mut dropped) = (Vec::with_capacity(train.len()), Vec::new());
    for (k, r) in train {
        if split.by != SplitBy::Row && held.contains(k.as_str()) {
            dropped.push(r);
        } else {
            kept.push(r);
        }
    }
    Ok(Split { train: kept, test: test.into_iter().map(|(_, r)| r).collect(), dropped, groups })
}

/// What the rule compares two rows by: the prompt (`prompt`, `row`), or the key field's value as
/// JSON (`key`; None when the row lacks it). The key may name the prompt or the label field.
fn identity(r: &PromptRow, settings: &DataSettings, by: &SplitBy) -> Option<String> {
    let SplitBy::Key(field) = by else { return Some(r.prompt_key().to_string()) };
    if *field == settings.prompt_field {
        return Some(r.prompt_key().to_string());
    }
    let v = if *field == settings.label_field { Some(&r.label) } else { r.metadata.get(field) };
    v.filter(|v| !v.is_null()).map(|v| v.to_string())
}

impl Split {
    /// The run's refusal of a split with no train or no test row, saying why and which setting
    /// to change.
    pub fn check(&self, path: &Path, by: &SplitBy) -> Result<(), RunError> {
        if !self.train.is_empty() && !self.test.is_empty() {
            return Ok(());
        }
        let e = RunError::new(
            E_DATA_FILE,
            format!(
                "{}: needs at least one usable train and one test prompt (train {}, test {})",
                path.display(),
                self.train.len(),
                self.test.len()
            ),
        );
        let dropped = self.dropped.len();
        let help = match by {
            // Rows that differ only in their label (one prompt, many answers) all follow the
            // held-out copy into the test split.
            SplitBy::Prompt if self.train.is_empty() && dropped > 0 => Some(format!(
                "all {dropped} train row(s) have a prompt that a test row has too, and `split_by = prompt` (the \
                 default) keeps prompt texts disjoint (a model must not be tested on a prompt it trained on): rows \
                 that share one prompt and differ in their label cannot be split that way. Set `split_by = row` to \
                 split the rows as they are (the same prompt may then be in both splits), or `split_by = key` with \
                 `split_key = \"FIELD\"` to keep the rows of one problem together, or put what differs into each \
                 row's prompt"
            )),
            SplitBy::Key(k) if self.train.is_empty() => Some(format!(
                "`split_by = key` holds out whole groups of rows sharing `{k}`, and the {} value(s) of `{k}` in \
                 this file left no group to train on: give the rows more distinct values of `{k}`, lower \
                 `test_size`, or set `split_by = row`",
                self.groups
            )),
            _ if self.train.len() + self.test.len() + dropped < 2 => {
                Some("a split needs at least two rows: one to train on and one to test on".to_string())
            }
            _ => None,
        };
        Err(match help {
            Some(h) => e.with_help(h),
            None => e,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::OnError;
    use crate::tasks::prompts::tests::settings;
    use serde_json::json;

    /// Row `i` of a file: `prompt`, its label `i`, and an `id` field.
    fn row(i: usize, prompt: &str, id: Option<usize>) -> PromptRow {
        let mut r = PromptRow::text(prompt.into(), i.to_string());
        if let Some(id) = id {
            r.metadata.insert("id".into(), json!(id));
        }
        r.origin = format!("rows.jsonl:{}", i + 1);
        r
    }

    fn spec(test_size: usize, by: SplitBy) -> SplitSpec {
        SplitSpec { test_size, seed: 7, by, ..Default::default() }
    }

    fn labels(rows: &[PromptRow]) -> Vec<String> {
        rows.iter().map(|r| r.label_text()).collect()
    }

    fn run(rows: Vec<PromptRow>, test: Option<Vec<PromptRow>>, by: SplitBy, test_size: usize) -> Split {
        let s = settings("rows.jsonl".into(), OnError::Stop);
        split_rows(rows, test, &s, &spec(test_size, by), &mut Vec::new()).unwrap()
    }

    /// 40 rows over 10 prompts (4 answers each), ids = the prompt's number.
    fn four_answers_each() -> Vec<PromptRow> {
        (0..40).map(|i| row(i, &format!("q{}", i % 10), Some(i % 10))).collect()
    }

    #[test]
    fn split_by_prompt_drops_train_rows_sharing_a_test_prompt() {
        let s = run(four_answers_each(), None, SplitBy::Prompt, 8);
        assert_eq!((s.train.len(), s.test.len(), s.dropped.len()), (8, 8, 24));
        let test: HashSet<&str> = s.test.iter().map(|r| r.prompt_key()).collect();
        assert!(s.train.iter().all(|r| !test.contains(r.prompt_key())));
        assert!(s.dropped.iter().all(|r| test.contains(r.prompt_key())));
        // Seeded: the same split again, and the draw of every run before the rule existed.
        let again = run(four_answers_each(), None, SplitBy::Prompt, 8);
        assert_eq!(labels(&again.test), labels(&s.test));
        let mut legacy = four_answers_each();
        Rng::derived(7, "test-split", 0).shuffle(&mut legacy);
        assert_eq!(labels(&legacy[..8]), labels(&s.test));
    }

    #[test]
    fn split_by_row_keeps_every_row() {
        let s = run(four_answers_each(), None, SplitBy::Row, 8);
        assert_eq!((s.train.len(), s.test.len(), s.dropped.len()), (32, 8, 0));
        // The same rows held out as under `prompt`: only the dropping differs.
        let p = run(four_answers_each(), None, SplitBy::Prompt, 8);
        assert_eq!(labels(&s.test), labels(&p.test));
        // One prompt for every row: `prompt` leaves no train row, `row` splits it.
        let same: Vec<_> = (0..40).map(|i| row(i, "solve", None)).collect();
        let p = run(same.clone(), None, SplitBy::Prompt, 200);
        assert_eq!((p.train.len(), p.test.len(), p.dropped.len()), (0, 20, 20));
        let r = run(same, None, SplitBy::Row, 200);
        assert_eq!((r.train.len(), r.test.len(), r.dropped.len()), (20, 20, 0));
    }

    #[test]
    fn split_by_key_keeps_groups_whole() {
        let s = run(four_answers_each(), None, SplitBy::Key("id".into()), 6);
        // Whole groups of 4 until at least 6 rows are held out: 2 groups.
        assert_eq!((s.train.len(), s.test.len(), s.dropped.len(), s.groups), (32, 8, 0, 10));
        let ids = |rows: &[PromptRow]| rows.iter().map(|r| r.metadata["id"].to_string()).collect::<HashSet<_>>();
        assert_eq!(ids(&s.test).len(), 2);
        assert!(ids(&s.test).is_disjoint(&ids(&s.train)));
        let again = run(four_answers_each(), None, SplitBy::Key("id".into()), 6);
        assert_eq!(labels(&again.test), labels(&s.test));
        // The key may name the label field (`answer` here): every row its own group.
        let by_label = run(four_answers_each(), None, SplitBy::Key("answer".into()), 6);
        assert_eq!((by_label.train.len(), by_label.test.len(), by_label.groups), (34, 6, 40));
    }

    #[test]
    fn a_test_file_keeps_apart_by_the_rule() {
        let train: Vec<_> = (0..6).map(|i| row(i, &format!("q{}", i % 3), Some(i % 3))).collect();
        let test = vec![row(10, "q0", Some(2))];
        let p = run(train.clone(), Some(test.clone()), SplitBy::Prompt, 200);
        assert_eq!((p.train.len(), p.test.len(), labels(&p.dropped)), (4, 1, vec!["0".into(), "3".into()]));
        let r = run(train.clone(), Some(test.clone()), SplitBy::Row, 200);
        assert_eq!((r.train.len(), r.dropped.len()), (6, 0));
        let k = run(train, Some(test), SplitBy::Key("id".into()), 200);
        assert_eq!((k.train.len(), labels(&k.dropped)), (4, vec!["2".into(), "5".into()]));
    }

    #[test]
    fn rows_without_the_key_are_malformed() {
        let rows = vec![row(0, "a", Some(1)), row(1, "b", None), row(2, "c", Some(2)), row(3, "d", Some(3))];
        let mut s = settings("rows.jsonl".into(), OnError::Skip);
        let mut w = Vec::new();
        let got = split_rows(rows.clone(), None, &s, &spec(1, SplitBy::Key("id".into())), &mut w).unwrap();
        assert_eq!((got.train.len(), got.test.len()), (2, 1));
        assert_eq!(w, vec!["skipped rows.jsonl:2: missing field `id` (the split key, `split_key`)".to_string()]);
        s.on_error = OnError::Stop;
        let e = split_rows(rows, None, &s, &spec(1, SplitBy::Key("id".into())), &mut Vec::new()).unwrap_err();
        assert_eq!(e.message, "rows.jsonl:2: missing field `id` (the split key, `split_key`)");
    }

    #[test]
    fn an_empty_split_names_the_setting_to_change() {
        let same: Vec<_> = (0..40).map(|i| row(i, "solve", Some(0))).collect();
        let p = run(same.clone(), None, SplitBy::Prompt, 200);
        let e = p.check(Path::new("rows.jsonl"), &SplitBy::Prompt).unwrap_err();
        assert_eq!(e.message, "rows.jsonl: needs at least one usable train and one test prompt (train 0, test 20)");
        let help = e.help.unwrap();
        assert!(help.starts_with("all 20 train row(s) have a prompt that a test row has too"), "{help}");
        assert!(help.contains("Set `split_by = row`"), "{help}");
        let by = SplitBy::Key("id".into());
        let k = run(same, None, by.clone(), 200);
        assert_eq!((k.train.len(), k.test.len()), (0, 40));
        let help = k.check(Path::new("rows.jsonl"), &by).unwrap_err().help.unwrap();
        assert!(help.contains("the 1 value(s) of `id` in this file left no group to train on"), "{help}");
        let one = run(vec![row(0, "a", None)], None, SplitBy::Row, 200);
        let help = one.check(Path::new("rows.jsonl"), &SplitBy::Row).unwrap_err().help.unwrap();
        assert_eq!(help, "a split needs at least two rows: one to train on and one to test on");
    }
}
