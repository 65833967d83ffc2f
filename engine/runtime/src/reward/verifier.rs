//! Built-in verifiers as a [`BatchReward`]: pure functions of (response, label), in process. A
//! sample whose label is missing or of the wrong kind is a named failure under the policy, never a
//! silent 0; a wrong answer is a 0.

use super::{math, schema, settle_all, text, BatchReward, OnRewardError, RewardFailure, RewardInput, RewardOutcome};
use crate::{RunError, E_SPEC};
use serde_json::Value;

#[derive(Debug, Clone)]
pub enum Verifier {
    /// The final `\boxed{}` / `#### ` answer, equal as a number or normalised text.
    Math,
    /// Byte-for-byte equal to the label.
    Exact,
    /// Equal to the label ignoring case, punctuation and spacing.
    Normalised,
    /// The response matches; an `answer` group must equal the label (normalised).
    Regex(regex::Regex),
    /// The response is JSON valid under this schema (compiled when the reward is built), or under
    /// the sample's label when `None` (compiled per sample; a bad one is that sample's failure).
    JsonSchema(Option<schema::Schema>),
}

impl Verifier {
    /// From the settings: `kind` is `math`, `exact`, `normalised`, `regex` (with `pattern`) or
    /// `json_schema` (with an optional `schema`).
    pub fn from_settings(kind: &str, pattern: Option<&str>, schema: Option<Value>) -> Result<Verifier, RunError> {
        let bad = |m: String| RunError::new(E_SPEC, format!("verifier `{kind}`: {m}"));
        Ok(match kind {
            "math" => Verifier::Math,
            "exact" => Verifier::Exact,
            "normalised" | "normalized" => Verifier::Normalised,
            "regex" => {
                let p = pattern.ok_or_else(|| bad("needs a `pattern`".into()))?;
                Verifier::Regex(regex::Regex::new(p).map_err(|e| bad(format!("`pattern` is not a regex: {e}")))?)
            }
            "json_schema" => {
                Verifier::JsonSchema(schema.map(|s| schema::Schema::compile(&s)).transpose().map_err(bad)?)
            }
            other => {
                return Err(RunError::new(
                    E_SPEC,
                    format!("unknown verifier `{other}`: expected math, exact, normalised, regex or json_schema"),
                ))
            }
        })
    }

    /// The score of one sample, or why it cannot be scored.
    pub fn score(&self, item: &RewardInput) -> Result<f32, String> {
        let label_text = || match &item.label {
            Value::String(s) => Ok(s.clone()),
            Value::Number(n) => Ok(n.to_string()),
            Value::Null => Err("the sample has no label".to_string()),
            other => Err(format!("its label {} is not a string or number", super::truncate(&other.to_string(), 80))),
        };
        Ok(match self {
            Verifier::Math => math::score(&item.response, &label_text()?),
            Verifier::Exact => text::exact(&item.response, &label_text()?),
            Verifier::Normalised => text::normalised(&item.response, &label_text()?),
            Verifier::Regex(re) => {
                let label = if re.capture_names().any(|n| n == Some("answer")) { label_text()? } else { String::new() };
                text::regex(re, &item.response, &label)
            }
            Verifier::JsonSchema(Some(s)) => schema::score(&item.response, s),
            Verifier::JsonSchema(None) => match &item.label {
                s @ Value::Object(_) => {
                    let s = schema::Schema::compile(s).map_err(|e| format!("its label schema is refused: {e}"))?;
                    schema::score(&item.response, &s)
                }
                _ => return Err("no `schema` setting and its label is not a schema object".into()),
            },
        })
    }
}

pub struct VerifierReward {
    pub name: String,
    pub verifier: Verifier,
    pub on_error: OnRewardError,
}

impl BatchReward for VerifierReward {
    fn name(&self) -> &str {
        &self.name
    }

    fn score_batch(&mut self, items: &[RewardInput]) -> Result<Vec<RewardOutcome>, RunError> {
        let results = items
            .iter()
            .map(|it| {
                self.verifier.score(it).map_err(|what| RewardFailure {
                    stage: self.name.clone(),
                    sample_id: it.sample_id.clone(),
                    what,
                    timed_out: false,
                })
            })
            .collect();
        settle_all(self.on_error, results)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reward::input;
    use serde_json::json;

    #[test]
    fn verifiers_score_batches_and_name_bad_labels() {
        let mut r = VerifierReward { name: "math".into(), verifier: Verifier::Math, on_error: OnRewardError::Zero };
        let out = r
            .score_batch(&[
                input("a", "\\boxed{\\frac12}", json!("0.5")),
                input("b", "#### 7", json!(7)),
                input("c", "#### 7", json!(null)),
                input("d", "#### 7", json!("8")),
            ])
            .unwrap();
        assert_eq!(out[..2], [RewardOutcome::Score(1.0), RewardOutcome::Score(1.0)]);
        assert!(
            matches!(&out[2], RewardOutcome::Zeroed(f) if f.to_string() == "reward `math` failed on sample c: the sample has no label")
        );
        assert_eq!(out[3], RewardOutcome::Score(0.0));
        r.on_error = OnRewardError::Stop;
        let e = r.score_batch(&[input("e", "x", json!([1]))]).unwrap_err();
        assert_eq!(e.message, "reward `math` failed on sample e: its label [1] is not a string or number");
    }

    /// Issue #35: every keyword of draft 2020-12 counts; a violation the old subset ignored
    /// (`pattern`, `anyOf`, a local `$ref`) scores 0, never 1.
    #[test]
    fn json_schema_enforces_every_keyword() {
        let schema = json!({
            "type": "object",
            "required": ["id", "size", "owner"],
            "$defs": {"person": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}}},
            "properties": {
                "id": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]+$"},
                "size": {"anyOf": [{"type": "integer", "minimum": 1}, {"enum": ["small", "large"]}]},
                "owner": {"$ref": "#/$defs/person"}
            }
        });
        let v = Verifier::from_settings("json_schema", None, Some(schema.clone())).unwrap();
        let score = |r: &str| v.score(&input("a", r, json!(null)));
        assert_eq!(score(r#"{"id": "ABC-12", "size": "small", "owner": {"name": "Ada"}}"#), Ok(1.0));
        assert_eq!(score(r#"{"id": "ABC-12", "size": 3, "owner": {"name": "Ada"}}"#), Ok(1.0));
        assert_eq!(score(r#"{"id": "abc", "size": 3, "owner": {"name": "Ada"}}"#), Ok(0.0), "pattern");
        assert_eq!(score(r#"{"id": "ABC-12", "size": "huge", "owner": {"name": "Ada"}}"#), Ok(0.0), "anyOf");
        assert_eq!(score(r#"{"id": "ABC-12", "size": 3, "owner": {"name": 7}}"#), Ok(0.0), "$ref");
        assert_eq!(score(r#"{"id": "ABC-12", "size": 3, "owner": {}}"#), Ok(0.0), "$ref");
        // The same schema as a sample's label.
        let by_label = Verifier::from_settings("json_schema", None, None).unwrap();
        let r = r#"{"id": "abc", "size": 3, "owner": {"name": "Ada"}}"#;
        assert_eq!(by_label.score(&input("a", r, schema)), Ok(0.0));
    }

    /// A schema is checked when the reward is built (or, as a label, when its sample is scored):
    /// no reference leaves the document, nothing is fetched, an invalid schema is named.
    #[test]
    fn json_schema_refuses_remote_references_and_invalid_schemas() {
        for (schema, want) in [
            (json!({"$ref": "https://example.com/s.json"}), "`$ref` \"https://example.com/s.json\" is not local"),
            (json!({"properties": {"a": {"$ref": "file:///etc/passwd"}}}), "is not local"),
            (json!({"$dynamicRef": "other.json#x"}), "`$dynamicRef` \"other.json#x\" is not local"),
            (json!({"type": "strin"}), "not a valid JSON schema"),
            (json!({"pattern": "(?<=a)b"}), "not a valid JSON schema"),
        ] {
            let e = Verifier::from_settings("json_schema", None, Some(schema.clone())).unwrap_err();
            assert_eq!(e.code, E_SPEC);
            assert!(e.message.starts_with("verifier `json_schema`: ") && e.message.contains(want), "{e}");
            let by_label = Verifier::from_settings("json_schema", None, None).unwrap();
            let e = by_label.score(&input("a", "{}", schema)).unwrap_err();
            assert!(e.contains(want), "{e}");
        }
        // A property named `$ref` is a name, not a reference.
        let v = Verifier::from_settings("json_schema", None, Some(json!({"properties": {"$ref": {"type": "string"}}})));
        assert_eq!(v.unwrap().score(&input("a", r#"{"$ref": 1}"#, json!(null))), Ok(0.0));
    }

    #[test]
    fn settings() {
        let re = Verifier::from_settings("regex", Some(r"(?P<answer>\d+)$"), None).unwrap();
        assert_eq!(re.score(&input("a", "it is 12", json!("12"))), Ok(1.0));
        let e = Verifier::from_settings("regex", Some("("), None).unwrap_err();
        assert!(e.message.starts_with("verifier `regex`: `pattern` is not a regex"), "{e}");
        assert!(Verifier::from_settings("fuzzy", None, None)
            .unwrap_err()
            .message
            .starts_with("unknown verifier `fuzzy`"));
        let js = Verifier::from_settings("json_schema", None, None).unwrap();
        assert_eq!(js.score(&input("a", "{\"x\":1}", json!({"required": ["x"]}))), Ok(1.0));
        assert!(js.score(&input("a", "{}", json!("x"))).is_err());
        assert_eq!(Verifier::Normalised.score(&input("a", "PARIS!", json!("paris"))), Ok(1.0));
        assert_eq!(Verifier::Exact.score(&input("a", "4", json!(4))), Ok(1.0));
    }
}
