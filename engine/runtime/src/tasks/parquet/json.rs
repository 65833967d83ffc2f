//! A Parquet row's values as JSON text, in the schema's order (struct fields and chat messages
//! keep the order the file wrote them, which chat templates see).

use ::parquet::record::{Field, Row};
use serde_json::Value;

/// JSON text of a Parquet value, struct fields in schema order. Dates, times and decimals become
/// strings as the crate displays them; binary that is not UTF-8 is replaced lossily.
pub(super) fn write_json(f: &Field, out: &mut String) {
    let num = |out: &mut String, x: f64| match serde_json::Number::from_f64(x) {
        Some(n) => out.push_str(&n.to_string()),
        None => out.push_str("null"),
    };
    match f {
        Field::Null => out.push_str("null"),
        Field::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Field::Byte(n) => out.push_str(&n.to_string()),
        Field::Short(n) => out.push_str(&n.to_string()),
        Field::Int(n) => out.push_str(&n.to_string()),
        Field::Long(n) => out.push_str(&n.to_string()),
        Field::UByte(n) => out.push_str(&n.to_string()),
        Field::UShort(n) => out.push_str(&n.to_string()),
        Field::UInt(n) => out.push_str(&n.to_string()),
        Field::ULong(n) => out.push_str(&n.to_string()),
        Field::Float16(x) => num(out, f64::from(*x)),
        Field::Float(x) => num(out, f64::from(*x)),
        Field::Double(x) => num(out, *x),
        Field::Str(s) => out.push_str(&Value::String(s.clone()).to_string()),
        Field::Bytes(b) => out.push_str(&Value::String(String::from_utf8_lossy(b.data()).into_owned()).to_string()),
        Field::Group(r) => write_row(r, out),
        Field::ListInternal(l) => {
            out.push('[');
            for (i, e) in l.elements().iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_json(e, out);
            }
            out.push(']');
        }
        Field::MapInternal(m) => {
            out.push('{');
            for (i, (k, v)) in m.entries().iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                let key = match k {
                    Field::Str(s) => s.clone(),
                    other => other.to_string(),
                };
                out.push_str(&Value::String(key).to_string());
                out.push_str(": ");
                write_json(v, out);
            }
            out.push('}');
        }
        other => out.push_str(&Value::String(other.to_string()).to_string()),
    }
}

fn write_row(r: &Row, out: &mut String) {
    out.push('{');
    for (i, (k, v)) in r.get_column_iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        out.push_str(&Value::String(k.clone()).to_string());
        out.push_str(": ");
        write_json(v, out);
    }
    out.push('}');
}
