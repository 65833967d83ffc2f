//! JSON-schema validity, a small subset written here rather than a crate (the `jsonschema` crate
//! brings an HTTP client and a regex engine per schema): `type` (a name or a list), `enum`,
//! `const`, `properties`, `required`, `additionalProperties: false`, `items`, `minItems`/
//! `maxItems`, `minLength`/`maxLength`, `minimum`/`maximum`. Other keywords are ignored (a
//! schema using them is checked on the rest).

use serde_json::Value;

/// The first violation, with its JSON path (`$.a[2]`), or `Ok`.
pub fn validate(value: &Value, schema: &Value) -> Result<(), String> {
    check(value, schema, "$")
}

/// 1 when the response (a JSON document, optionally in a ```json fence) validates.
pub fn score(response: &str, schema: &Value) -> f32 {
    let text = strip_fence(response);
    match serde_json::from_str::<Value>(text) {
        Ok(v) => f32::from(u8::from(validate(&v, schema).is_ok())),
        Err(_) => 0.0,
    }
}

fn strip_fence(s: &str) -> &str {
    let t = s.trim();
    let Some(rest) = t.strip_prefix("```") else { return t };
    let rest = rest.strip_prefix("json").unwrap_or(rest);
    rest.strip_suffix("```").unwrap_or(rest).trim()
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn is_type(v: &Value, name: &str) -> bool {
    let t = type_name(v);
    t == name
        || (name == "number" && t == "integer")
        || (name == "integer" && v.as_f64().is_some_and(|x| x.fract() == 0.0))
}

fn check(v: &Value, s: &Value, path: &str) -> Result<(), String> {
    let Some(s) = s.as_object() else { return Ok(()) };
    if let Some(t) = s.get("type") {
        let names: Vec<&str> = match t {
            Value::String(n) => vec![n.as_str()],
            Value::Array(ns) => ns.iter().filter_map(Value::as_str).collect(),
            _ => vec![],
        };
        if !names.is_empty() && !names.iter().any(|n| is_type(v, n)) {
            return Err(format!("{path}: expected {}, found {}", names.join(" or "), type_name(v)));
        }
    }
    if let Some(Value::Array(options)) = s.get("enum") {
        if !options.contains(v) {
            return Err(format!("{path}: {v} is not one of {}", Value::Array(options.clone())));
        }
    }
    if let Some(c) = s.get("const") {
        if c != v {
            return Err(format!("{path}: expected {c}, found {v}"));
        }
    }
    let bound = |key: &str| s.get(key).and_then(Value::as_f64);
    match v {
        Value::Object(o) => {
            if let Some(Value::Array(req)) = s.get("required") {
                for k in req.iter().filter_map(Value::as_str) {
                    if !o.contains_key(k) {
                        return Err(format!("{path}: missing required property `{k}`"));
                    }
                }
            }
            let props = s.get("properties").and_then(Value::as_object);
            for (k, child) in o {
                match props.and_then(|p| p.get(k)) {
                    Some(ps) => check(child, ps, &format!("{path}.{k}"))?,
                    None if s.get("additionalProperties") == Some(&Value::Bool(false)) => {
                        return Err(format!("{path}: property `{k}` is not allowed"))
                    }
                    None => {}
                }
            }
        }
        Value::Array(items) => {
            if bound("minItems").is_some_and(|m| (items.len() as f64) < m) {
                return Err(format!("{path}: {} items, fewer than minItems", items.len()));
            }
            if bound("maxItems").is_some_and(|m| (items.len() as f64) > m) {
                return Err(format!("{path}: {} items, more than maxItems", items.len()));
            }
            if let Some(is) = s.get("items") {
                for (i, item) in items.iter().enumerate() {
                    check(item, is, &format!("{path}[{i}]"))?;
                }
            }
        }
        Value::String(t) => {
            let n = t.chars().count() as f64;
            if bound("minLength").is_some_and(|m| n < m) || bound("maxLength").is_some_and(|m| n > m) {
                return Err(format!("{path}: length {n} is outside minLength/maxLength"));
            }
        }
        Value::Number(x) => {
            let x = x.as_f64().unwrap_or(f64::NAN);
            if bound("minimum").is_some_and(|m| x < m) || bound("maximum").is_some_and(|m| x > m) {
                return Err(format!("{path}: {x} is outside minimum/maximum"));
            }
        }
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn subset() {
        let schema = json!({
            "type": "object",
            "required": ["name", "tags"],
            "additionalProperties": false,
            "properties": {
                "name": {"type": "string", "minLength": 1},
                "age": {"type": "integer", "minimum": 0},
                "kind": {"enum": ["a", "b"]},
                "tags": {"type": "array", "maxItems": 2, "items": {"type": "string"}}
            }
        });
        let cases = [
            (json!({"name": "x", "tags": []}), Ok(())),
            (json!({"name": "x", "tags": [], "age": 3.0}), Ok(())),
            (json!({"name": "x"}), Err("$: missing required property `tags`")),
            (json!({"name": "x", "tags": [1]}), Err("$.tags[0]: expected string, found integer")),
            (json!({"name": "x", "tags": ["a", "b", "c"]}), Err("$.tags: 3 items, more than maxItems")),
            (json!({"name": "", "tags": []}), Err("$.name: length 0 is outside minLength/maxLength")),
            (json!({"name": "x", "tags": [], "age": -1}), Err("$.age: -1 is outside minimum/maximum")),
            (json!({"name": "x", "tags": [], "kind": "c"}), Err("$.kind: \"c\" is not one of [\"a\",\"b\"]")),
            (json!({"name": "x", "tags": [], "extra": 1}), Err("$: property `extra` is not allowed")),
            (json!([1]), Err("$: expected object, found array")),
        ];
        for (v, want) in cases {
            assert_eq!(validate(&v, &schema), want.map_err(str::to_string), "{v}");
        }
        assert_eq!(validate(&json!(null), &json!({"type": ["string", "null"]})), Ok(()));
    }

    #[test]
    fn responses() {
        let schema = json!({"type": "object", "required": ["a"]});
        assert_eq!(score("```json\n{\"a\": 1}\n```", &schema), 1.0);
        assert_eq!(score(" {\"a\": 1} ", &schema), 1.0);
        assert_eq!(score("{\"b\": 1}", &schema), 0.0);
        assert_eq!(score("not json", &schema), 0.0);
    }
}
