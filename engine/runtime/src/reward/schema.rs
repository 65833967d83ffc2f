//! JSON-schema validity through the `jsonschema` crate: every keyword of the schema's draft
//! (2020-12 unless `$schema` names another), formats asserted. A keyword the old hand-written
//! subset ignored (`pattern`, `anyOf`, `$ref`, ...) let invalid output score 1 (issue #35).
//!
//! A schema is compiled once ([`Schema::compile`]) and refused there when it is not a valid
//! schema or when a reference leaves the document (`$ref`, `$dynamicRef` or `$recursiveRef`
//! other than `#...`): nothing is fetched, from the network or the disk (the crate is built
//! without its resolvers, and set offline). Patterns run on the `regex` crate: linear time in
//! the response's length, whatever the pattern (no backtracking engine a response could stall).

use serde_json::Value;
use std::sync::Arc;

/// A compiled schema.
#[derive(Clone)]
pub struct Schema(Arc<jsonschema::Validator>);

impl std::fmt::Debug for Schema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Schema")
    }
}

const REF_KEYWORDS: [&str; 3] = ["$ref", "$dynamicRef", "$recursiveRef"];

impl Schema {
    /// Compiles `schema`; why not, in words.
    pub fn compile(schema: &Value) -> Result<Schema, String> {
        remote_reference(schema)?;
        jsonschema::options()
            .offline()
            .should_validate_formats(true)
            .with_pattern_options(jsonschema::PatternOptions::regex())
            .build(schema)
            .map(|v| Schema(Arc::new(v)))
            .map_err(|e| format!("not a valid JSON schema: {}", crate::quote::truncate(&e.to_string(), 200)))
    }

    /// The first violation, with its JSON pointer, or `Ok`.
    pub fn validate(&self, value: &Value) -> Result<(), String> {
        self.0.validate(value).map_err(|e| format!("{}: {e}", e.instance_path()))
    }
}

/// Refuses a reference that leaves the document: a string-valued reference keyword that is not
/// a fragment (`#`, `#/$defs/x`, `#anchor`). A property named `$ref` holds a schema (an object),
/// not a reference.
fn remote_reference(v: &Value) -> Result<(), String> {
    match v {
        Value::Object(o) => {
            for (k, child) in o {
                match child {
                    Value::String(r) if REF_KEYWORDS.contains(&k.as_str()) && !r.starts_with('#') => {
                        return Err(format!(
                            "`{k}` {:?} is not local: only references inside the schema (`#...`) are followed",
                            crate::quote::truncate(r, 80)
                        ));
                    }
                    _ => remote_reference(child)?,
                }
            }
            Ok(())
        }
        Value::Array(a) => a.iter().try_for_each(remote_reference),
        _ => Ok(()),
    }
}

/// 1 when the response (a JSON document, optionally in a ```json fence) validates.
pub fn score(response: &str, schema: &Schema) -> f32 {
    let text = strip_fence(response);
    match serde_json::from_str::<Value>(text) {
        Ok(v) => f32::from(u8::from(schema.validate(&v).is_ok())),
        Err(_) => 0.0,
    }
}

fn strip_fence(s: &str) -> &str {
    let t = s.trim();
    let Some(rest) = t.strip_prefix("```") else { return t };
    let rest = rest.strip_prefix("json").unwrap_or(rest);
    rest.strip_suffix("```").unwrap_or(rest).trim()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keywords() {
        let schema = Schema::compile(&json!({
            "type": "object",
            "required": ["name", "tags"],
            "additionalProperties": false,
            "properties": {
                "name": {"type": "string", "minLength": 1},
                "age": {"type": "integer", "minimum": 0},
                "kind": {"enum": ["a", "b"]},
                "mail": {"type": "string", "format": "email"},
                "tags": {"type": "array", "maxItems": 2, "items": {"type": "string"}}
            }
        }))
        .unwrap();
        let cases = [
            (json!({"name": "x", "tags": []}), None),
            (json!({"name": "x", "tags": [], "age": 3.0}), None),
            (json!({"name": "x"}), Some("\"tags\" is a required property")),
            (json!({"name": "x", "tags": [1]}), Some("/tags/0: 1 is not of type \"string\"")),
            (json!({"name": "x", "tags": ["a", "b", "c"]}), Some("/tags: ")),
            (json!({"name": "", "tags": []}), Some("/name: ")),
            (json!({"name": "x", "tags": [], "age": -1}), Some("/age: ")),
            (json!({"name": "x", "tags": [], "kind": "c"}), Some("/kind: ")),
            (json!({"name": "x", "tags": [], "mail": "nobody"}), Some("/mail: ")),
            (json!({"name": "x", "tags": [], "extra": 1}), Some("Additional properties are not allowed")),
            (json!([1]), Some("is not of type \"object\"")),
        ];
        for (v, want) in cases {
            match (schema.validate(&v), want) {
                (Ok(()), None) => {}
                (Err(e), Some(w)) => assert!(e.contains(w), "{v}: {e}"),
                (got, _) => panic!("{v}: {got:?}, want {want:?}"),
            }
        }
        let nullable = Schema::compile(&json!({"type": ["string", "null"]})).unwrap();
        assert_eq!(nullable.validate(&json!(null)), Ok(()));
    }

    #[test]
    fn responses() {
        let schema = Schema::compile(&json!({"type": "object", "required": ["a"]})).unwrap();
        assert_eq!(score("```json\n{\"a\": 1}\n```", &schema), 1.0);
        assert_eq!(score(" {\"a\": 1} ", &schema), 1.0);
        assert_eq!(score("{\"b\": 1}", &schema), 0.0);
        assert_eq!(score("not json", &schema), 0.0);
    }

    /// A pattern a backtracking engine takes exponential time on is linear here.
    #[test]
    fn a_catastrophic_pattern_runs_in_linear_time() {
        let schema = Schema::compile(&json!({"type": "string", "pattern": "^(a+)+$"})).unwrap();
        let response = format!("\"{}b\"", "a".repeat(50_000));
        let t0 = std::time::Instant::now();
        assert_eq!(score(&response, &schema), 0.0);
        assert!(t0.elapsed().as_secs_f64() < 2.0, "{:?}", t0.elapsed());
    }
}
