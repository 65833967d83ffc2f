//! The batch protocol shared by `command` and `http` rewards (docs/rewards.md): a request
//! `{"id": N, "samples": [...]}` is answered by `{"id": N, "scores": [...]}` with one finite
//! number per sample in order, `null` for a sample the reward cannot score, or
//! `{"id": N, "error": "..."}` for a batch it cannot score at all.

use super::{truncate, RewardFailure, RewardInput};
use serde_json::{json, Value};

/// How much of a malformed answer a failure quotes.
const QUOTE: usize = 200;

/// The JSON text of request `id` (one line: no newline inside).
pub fn request<T: serde::Serialize>(id: u64, items: &[T]) -> String {
    json!({ "id": id, "samples": items }).to_string()
}

/// Why a whole batch got no scores; every sample of it fails with this text.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchFault {
    pub what: String,
    pub timed_out: bool,
}

impl BatchFault {
    pub fn new(what: impl Into<String>) -> Self {
        BatchFault { what: what.into(), timed_out: false }
    }

    pub fn timeout(what: impl Into<String>) -> Self {
        BatchFault { what: what.into(), timed_out: true }
    }

    /// One failure per sample of the batch.
    pub fn fail_all(&self, stage: &str, items: &[RewardInput]) -> Vec<Result<f32, RewardFailure>> {
        items
            .iter()
            .map(|it| {
                Err(RewardFailure {
                    stage: stage.to_string(),
                    sample_id: it.sample_id.clone(),
                    what: self.what.clone(),
                    timed_out: self.timed_out,
                })
            })
            .collect()
    }
}

/// Reads the answer to request `id` for `items`. A wrong id, a wrong count, or text that is not
/// the answer object fails the batch; a score that is not a finite number fails only its sample.
pub fn parse_answer(
    stage: &str,
    id: u64,
    items: &[RewardInput],
    text: &str,
) -> Result<Vec<Result<f32, RewardFailure>>, BatchFault> {
    let quoted = || truncate(text.trim_end(), QUOTE);
    let v: Value = serde_json::from_str(text)
        .map_err(|e| BatchFault::new(format!("answered text that is not JSON ({e}): {}", quoted())))?;
    let obj =
        v.as_object().ok_or_else(|| BatchFault::new(format!("answered JSON that is not an object: {}", quoted())))?;
    match obj.get("id") {
        Some(got) if got.as_u64() == Some(id) => {}
        Some(got) => {
            return Err(BatchFault::new(format!(
                "answered id {} to request {id}: {}",
                truncate(&got.to_string(), 40),
                quoted()
            )))
        }
        None => return Err(BatchFault::new(format!("answered without an `id` (request {id}): {}", quoted()))),
    }
    if let Some(err) = obj.get("error") {
        let msg = err.as_str().map(str::to_string).unwrap_or_else(|| err.to_string());
        return Err(BatchFault::new(format!("reported an error: {}", truncate(&msg, QUOTE))));
    }
    let scores = obj
        .get("scores")
        .and_then(Value::as_array)
        .ok_or_else(|| BatchFault::new(format!("answered without a `scores` list: {}", quoted())))?;
    if scores.len() != items.len() {
        return Err(BatchFault::new(format!(
            "answered {} scores for {} samples: {}",
            scores.len(),
            items.len(),
            quoted()
        )));
    }
    Ok(scores
        .iter()
        .zip(items)
        .map(|(s, it)| {
            let fail = |what: String| RewardFailure {
                stage: stage.to_string(),
                sample_id: it.sample_id.clone(),
                what,
                timed_out: false,
            };
            match s {
                Value::Null => Err(fail("answered null (could not score it)".to_string())),
                // serde_json never parses NaN/inf, but a huge literal overflows to inf.
                Value::Number(n) => match n.as_f64() {
                    Some(x) if x.is_finite() && (x as f32).is_finite() => Ok(x as f32),
                    _ => Err(fail(format!("answered {n}, not a finite score"))),
                },
                other => Err(fail(format!("answered {}, not a number", truncate(&other.to_string(), QUOTE)))),
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reward::input;

    fn items() -> Vec<RewardInput> {
        vec![input("a", "1", json!("1")), input("b", "2", json!(2))]
    }

    fn check(text: &str) -> String {
        match parse_answer("judge", 7, &items(), text) {
            Ok(rs) => rs
                .iter()
                .map(|r| match r {
                    Ok(s) => format!("{s}"),
                    Err(f) => format!("{f}"),
                })
                .collect::<Vec<_>>()
                .join(" | "),
            Err(f) => format!("batch: {}", f.what),
        }
    }

    #[test]
    fn request_is_one_line_with_every_field() {
        let r = request(3, &items()[..1]);
        assert!(!r.contains('\n'));
        assert_eq!(
            r,
            r#"{"id":3,"samples":[{"finish_reason":"stop","label":"1","metadata":{},"prompt":"q","response":"1","sample_id":"a"}]}"#
        );
    }

    #[test]
    fn answers() {
        assert_eq!(check(r#"{"id":7,"scores":[1,0.5]}"#), "1 | 0.5");
        assert_eq!(
            check(r#"{"id":7,"scores":[null,"x"]}"#),
            "reward `judge` failed on sample a: answered null (could not score it) | reward `judge` failed on sample b: answered \"x\", not a number"
        );
        assert_eq!(check(r#"{"id":7,"scores":[1e999,1]}"#).split(" | ").next().unwrap(), "batch: answered text that is not JSON (number out of range at line 1 column 23): {\"id\":7,\"scores\":[1e999,1]}");
        assert_eq!(
            check(r#"{"id":7,"scores":[1e300,1]}"#),
            "reward `judge` failed on sample a: answered 1e+300, not a finite score | 1"
        );
        assert_eq!(
            check(r#"{"id":6,"scores":[1,1]}"#),
            "batch: answered id 6 to request 7: {\"id\":6,\"scores\":[1,1]}"
        );
        assert_eq!(
            check(r#"{"id":7,"scores":[1]}"#),
            "batch: answered 1 scores for 2 samples: {\"id\":7,\"scores\":[1]}"
        );
        assert_eq!(check(r#"{"id":7,"error":"no GPU"}"#), "batch: reported an error: no GPU");
        assert_eq!(check("NaN"), "batch: answered text that is not JSON (expected value at line 1 column 1): NaN");
        assert_eq!(check("[1]"), "batch: answered JSON that is not an object: [1]");
        assert_eq!(check(r#"{"scores":[1,1]}"#), "batch: answered without an `id` (request 7): {\"scores\":[1,1]}");
    }
}
