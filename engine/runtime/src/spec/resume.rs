//! What a resumed run may change: its spec is compared with the saved one field by field (JSON
//! paths of the run spec, `train.lr: 0.000001 -> 0.000002`). A field in [`RESUME_FREE`] changes
//! no saved state and no random stream, so it may differ; any other difference refuses the resume
//! (E0507), naming each field.

use super::RunSpec;
use serde_json::Value;

/// The run spec fields a resume may change, and why each changes no state:
/// - `steps`: where the loop ends (the recipe's `stop`, or `--steps`); every step's data and
///   sampling streams derive from the seed and the step number, not from the total. (A decaying
///   learning rate is scheduled over the total: the remaining steps follow the new schedule.)
/// - `checkpoint.every`, `checkpoint.keep`: when checkpoints are written and how many stay.
/// - `eval.every`: when held-out evaluations run; they are greedy and read the weights only.
/// - `samples`: which steps write samples.jsonl, and how many; it is read, never trained on.
/// - `stages`: the stages' names, labels in messages.
/// - `train.dp`: the trainer's data-parallel ranks, ZeRO, bucket size and collective timeout. A
///   checkpoint holds the whole optimizer state (ZeRO's shards are gathered to rank 0 before it
///   writes), so N ranks resume from what M ranks saved, sharded or not; every rank trains the
///   same optimizer steps as one process would (the step-wide loss denominators make the summed
///   gradient the single-process one), so the run goes on as it would have, up to float summation
///   order (docs/distributed.md "Data-parallel trainers").
pub const RESUME_FREE: &[&str] =
    &["steps", "checkpoint.every", "checkpoint.keep", "eval.every", "samples", "stages", "train.dp"];

/// One field whose value differs between the saved spec and this one.
#[derive(Debug, Clone, PartialEq)]
pub struct SpecChange {
    /// The field's JSON path in the run spec (`train.lr`, `task.kind.digits`, `reward`).
    pub path: String,
    pub old: String,
    pub new: String,
}

impl SpecChange {
    /// Whether a resume may make this change (it is in [`RESUME_FREE`], or below one).
    pub fn is_free(&self) -> bool {
        RESUME_FREE.iter().any(|f| self.path == *f || self.path.strip_prefix(f).is_some_and(|r| r.starts_with('.')))
    }
}

impl std::fmt::Display for SpecChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {} -> {}", self.path, self.old, self.new)
    }
}

/// What a resume of `saved` with a new spec finds: the changes it may make, and those it refuses.
#[derive(Debug, Default)]
pub struct ResumeDiff {
    pub allowed: Vec<SpecChange>,
    pub refused: Vec<SpecChange>,
}

impl RunSpec {
    /// This spec against the one a run was started (or last resumed) with, field by field.
    pub fn resume_diff(&self, saved: &RunSpec) -> ResumeDiff {
        let (old, new) = (to_value(saved), to_value(self));
        let mut changes = Vec::new();
        diff("", &old, &new, &mut changes);
        let (allowed, refused) = changes.into_iter().partition(SpecChange::is_free);
        ResumeDiff { allowed, refused }
    }
}

/// A spec as JSON; a spec always serialises (plain data), `Null` stands in if it ever did not.
fn to_value(s: &RunSpec) -> Value {
    let mut v = serde_json::to_value(s).unwrap_or(Value::Null);
    // Stage names are labels (`StageNames` compares equal whatever they are): never a refusal,
    // and not worth a line either.
    if let Some(o) = v.as_object_mut() {
        o.remove("stages");
    }
    v
}

/// Appends the leaves where `a` and `b` differ; a field one side lacks (an optional section
/// absent) is `none` on that side, and an array of another length differs as a whole.
fn diff(path: &str, a: &Value, b: &Value, out: &mut Vec<SpecChange>) {
    let at = |k: &str| if path.is_empty() { k.to_string() } else { format!("{path}.{k}") };
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                diff(&at(k), x.get(k).unwrap_or(&Value::Null), y.get(k).unwrap_or(&Value::Null), out);
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (p, q)) in x.iter().zip(y).enumerate() {
                diff(&format!("{path}[{i}]"), p, q, out);
            }
        }
        _ if a != b => out.push(SpecChange { path: path.to_string(), old: show(a), new: show(b) }),
        _ => {}
    }
}

/// A value as one short line: `none` for an absent one, JSON otherwise, long ones cut.
fn show(v: &Value) -> String {
    const MAX: usize = 80;
    let s = match v {
        Value::Null => "none".to_string(),
        _ => v.to_string(),
    };
    match s.char_indices().nth(MAX) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> RunSpec {
        let text = include_str!("../../tests/data/tiny.json");
        RunSpec::from_json(text).unwrap()
    }

    #[test]
    fn the_same_spec_has_no_difference() {
        let d = spec().resume_diff(&spec());
        assert!(d.allowed.is_empty() && d.refused.is_empty(), "{d:?}");
    }

    #[test]
    fn steps_and_cadences_are_allowed_and_every_other_field_is_named() {
        let saved = spec();
        let mut new = spec();
        new.steps = saved.steps * 3;
        new.checkpoint.every = 7;
        new.eval.every = 3;
        new.samples.every = 1;
        new.stages.train = "learn".into();
        new.train.lr *= 2.0;
        new.rollout.temperature = 0.5;
        new.seed += 1;
        let d = new.resume_diff(&saved);
        let allowed: Vec<&str> = d.allowed.iter().map(|c| c.path.as_str()).collect();
        assert_eq!(allowed, ["checkpoint.every", "eval.every", "samples", "steps"]);
        let refused: Vec<String> = d.refused.iter().map(|c| c.to_string()).collect();
        assert_eq!(
            refused,
            [
                "rollout.temperature: 1.0 -> 0.5".to_string(),
                format!("seed: {} -> {}", saved.seed, saved.seed + 1),
                format!("train.lr: {} -> {}", serde_json::json!(saved.train.lr), serde_json::json!(new.train.lr)),
            ]
        );
    }

    #[test]
    fn an_added_section_is_named_with_none_on_the_old_side() {
        let mut saved = spec();
        saved.sft = None;
        let new = spec();
        let d = new.resume_diff(&saved);
        assert_eq!(d.refused.len(), 1, "{d:?}");
        assert_eq!(d.refused[0].path, "sft");
        assert_eq!(d.refused[0].old, "none");
        assert!(d.refused[0].new.contains("\"steps\":5"), "{}", d.refused[0].new);
    }

    /// The split rule decides which rows trained: a resume may not change it. A spec saved before
    /// `split.by` existed reads as `prompt`, and resumes under it.
    #[test]
    fn the_split_rule_may_not_change_on_resume() {
        let saved = spec();
        assert_eq!(saved.task.split.by, super::super::SplitBy::Prompt);
        let mut new = spec();
        new.task.split.by = super::super::SplitBy::Key("id".into());
        let refused: Vec<String> = new.resume_diff(&saved).refused.iter().map(|c| c.to_string()).collect();
        assert_eq!(refused, ["task.split.by: none -> {\"key\":\"id\"}"]);
        new.task.split.by = super::super::SplitBy::Row;
        let refused: Vec<String> = new.resume_diff(&saved).refused.iter().map(|c| c.to_string()).collect();
        assert_eq!(refused, ["task.split.by: none -> \"row\""]);
        // Written as `prompt` explicitly, it is the default: no difference.
        let mut text = serde_json::to_value(&saved).unwrap();
        text["task"]["split"]["by"] = "prompt".into();
        let explicit: RunSpec = serde_json::from_value(text).unwrap();
        let d = explicit.resume_diff(&saved);
        assert!(d.refused.is_empty() && d.allowed.is_empty(), "{d:?}");
        // Where the held-out rows come from (`held_out`) decides which rows trained too; a spec
        // saved before it existed reads as `shipped`.
        assert_eq!(saved.task.split.held_out, super::super::HeldOut::Shipped);
        let mut new = spec();
        new.task.split.held_out = super::super::HeldOut::Drawn;
        let refused: Vec<String> = new.resume_diff(&saved).refused.iter().map(|c| c.to_string()).collect();
        assert_eq!(refused, ["task.split.held_out: none -> \"drawn\""]);
    }

    /// A resume may change the trainer's data-parallel ranks and ZeRO (the checkpoint is whole);
    /// a field beside them still refuses.
    #[test]
    fn a_resume_may_change_the_data_parallel_ranks_and_zero() {
        use super::super::{DataParallelSpec, ZeroStage};
        let saved = spec();
        assert_eq!(saved.train.dp, None);
        let mut new = spec();
        new.train.dp =
            Some(DataParallelSpec { ranks: 2, zero: ZeroStage::Optimizer, bucket_bytes: 25_000_000, timeout_s: 120.0 });
        let d = new.resume_diff(&saved);
        assert!(d.refused.is_empty(), "{d:?}");
        assert_eq!(d.allowed.iter().map(|c| c.path.as_str()).collect::<Vec<_>>(), ["train.dp"]);
        let mut four = new.clone();
        four.train.dp.as_mut().unwrap().ranks = 4;
        four.train.dp.as_mut().unwrap().zero = ZeroStage::None;
        let d = four.resume_diff(&new);
        assert!(d.refused.is_empty(), "{d:?}");
        assert_eq!(d.allowed.iter().map(|c| c.path.as_str()).collect::<Vec<_>>(), ["train.dp.ranks", "train.dp.zero"]);
        let d = saved.resume_diff(&four);
        assert!(d.refused.is_empty() && d.allowed.len() == 1, "back to one process: {d:?}");
        four.train.lr *= 2.0;
        let refused: Vec<String> = four.resume_diff(&new).refused.iter().map(|c| c.path.clone()).collect();
        assert_eq!(refused, ["train.lr"]);
    }

    #[test]
    fn a_free_field_is_matched_by_whole_path_segments() {
        let c = |p: &str| SpecChange { path: p.into(), old: String::new(), new: String::new() };
        assert!(c("steps").is_free());
        assert!(c("checkpoint.keep").is_free());
        assert!(!c("stepsize").is_free());
        assert!(!c("sft.steps").is_free(), "SFT's steps change the weights");
        assert!(!c("eval.prompts").is_free());
        assert!(c("train.dp.ranks").is_free());
        assert!(!c("train.dpo").is_free());
    }
}
