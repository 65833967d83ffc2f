//! Parquet prompt files through the `parquet` crate's row API (no arrow): each row's fields
//! become JSON in the file's column order, then go through the same row rules as JSONL.

use super::prompts::{malformed, open_error, row, DataSettings, PromptRow};
use crate::{RunError, E_DATA_FILE};
use ::parquet::file::reader::{FileReader, SerializedFileReader};
use ::parquet::record::{Field, Row};
use serde_json::{Map, Value};

pub fn read(settings: &DataSettings, warnings: &mut Vec<String>) -> Result<Vec<PromptRow>, RunError> {
    let path = &settings.path;
    let file = std::fs::File::open(path).map_err(|e| open_error(path, e))?;
    let not_parquet = |e: ::parquet::errors::ParquetError| {
        RunError::new(E_DATA_FILE, format!("{}: cannot read it as Parquet: {e}", path.display()))
    };
    let reader = SerializedFileReader::new(file).map_err(not_parquet)?;
    let columns: Vec<String> = reader
        .metadata()
        .file_metadata()
        .schema_descr()
        .root_schema()
        .get_fields()
        .iter()
        .map(|f| f.name().to_string())
        .collect();
    if !columns.contains(&settings.prompt_field) {
        return Err(RunError::new(
            E_DATA_FILE,
            format!(
                "{}: no column `{}` (the prompt field); its columns are: {}",
                path.display(),
                settings.prompt_field,
                columns.join(", ")
            ),
        )
        .with_help("set the prompt field to one of the columns"));
    }
    let mut out = Vec::new();
    for (i, r) in reader.into_iter().enumerate() {
        let origin = format!("{}#{}", path.display(), i + 1);
        let r = r.map_err(|e| {
            let err = RunError::new(E_DATA_FILE, format!("{origin}: cannot read the row: {e}"));
            // Codecs are compile-time features; only snappy is built in (HF datasets' default).
            if e.to_string().contains("Disabled feature") {
                err.with_help("miles reads snappy-compressed or uncompressed Parquet: rewrite the file with `compression=\"snappy\"`")
            } else {
                err
            }
        })?;
        let mut fields = Map::new();
        let mut prompt_json = None;
        for (name, f) in r.get_column_iter() {
            let mut text = String::new();
            write_json(f, &mut text);
            if *name == settings.prompt_field {
                prompt_json = Some(text.clone());
            }
            fields.insert(name.clone(), serde_json::from_str(&text).unwrap_or(Value::Null));
        }
        match row(settings, fields, prompt_json, origin.clone()) {
            Ok(r) => out.push(r),
            Err(why) => malformed(settings.on_error, format!("{origin}: {why}"), warnings)?,
        }
    }
    Ok(out)
}

/// JSON text of a Parquet value, struct fields in schema order. Dates, times and decimals become
/// strings as the crate displays them; binary that is not UTF-8 is replaced lossily.
fn write_json(f: &Field, out: &mut String) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::OnError;
    use crate::tasks::prompts::{self, tests::settings, Prompt};
    use crate::E_DATA_LINE;
    use serde_json::json;
    use std::path::PathBuf;

    fn fixture(name: &str) -> PathBuf {
        PathBuf::from(format!("{}/../../tests/fixtures/data/{name}", env!("CARGO_MANIFEST_DIR")))
    }

    #[test]
    fn strings_chats_and_passthrough_fields() {
        let rows = prompts::read(&settings(fixture("prompts.parquet"), OnError::Stop), &mut Vec::new()).unwrap();
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[0].prompt, Prompt::Text("What is 6 times 7?".into()));
        assert_eq!(rows[0].label, json!("42"));
        assert_eq!(rows[0].metadata["level"], json!(1));
        assert_eq!(rows[0].metadata["tags"], json!(["arith", "easy"]));
        assert!(rows[0].origin.ends_with("prompts.parquet#1"));
        let mut s = settings(fixture("chat.parquet"), OnError::Stop);
        s.prompt_field = "messages".into();
        let rows = prompts::read(&s, &mut Vec::new()).unwrap();
        let Prompt::Chat(m) = &rows[0].prompt else { panic!("{:?}", rows[0].prompt) };
        assert_eq!(m.list[0]["role"], "system");
        assert_eq!(m.list[1]["content"], "What is 6 times 7?");
        // Schema order, as written: role before content.
        assert!(m.json.starts_with(r#"[{"role": "system", "content": "#), "{}", m.json);
        assert_eq!(rows[0].label, json!("42"));
    }

    #[test]
    fn a_missing_column_lists_the_columns_present() {
        let mut s = settings(fixture("prompts.parquet"), OnError::Stop);
        s.prompt_field = "question".into();
        let e = prompts::read(&s, &mut Vec::new()).unwrap_err();
        assert_eq!(e.code, E_DATA_FILE);
        assert!(e.message.ends_with("prompts.parquet: no column `question` (the prompt field); its columns are: prompt, answer, level, tags"), "{e}");
    }

    #[test]
    fn empty_bad_rows_and_non_parquet_files() {
        let e = prompts::read(&settings(fixture("empty.parquet"), OnError::Stop), &mut Vec::new()).unwrap_err();
        assert!(e.message.ends_with("empty.parquet: holds no prompts"), "{e}");
        let mut s = settings(fixture("prompts.parquet"), OnError::Stop);
        s.prompt_field = "level".into();
        let e = prompts::read(&s, &mut Vec::new()).unwrap_err();
        assert_eq!(e.code, E_DATA_LINE);
        assert!(
            e.message
                .ends_with("prompts.parquet#1: field `level` must be a string or a list of chat messages, found 1"),
            "{e}"
        );
        let e = prompts::read(
            &settings(fixture("../rewards/verify.py").with_extension("parquet"), OnError::Stop),
            &mut Vec::new(),
        )
        .unwrap_err();
        assert!(e.message.contains("prompt file not found"), "{e}");
        let not = std::env::temp_dir().join(format!("miles-notparquet-{}.parquet", std::process::id()));
        std::fs::write(&not, "hello").unwrap();
        let e = prompts::read(&settings(not, OnError::Stop), &mut Vec::new()).unwrap_err();
        assert!(e.message.contains("cannot read it as Parquet"), "{e}");
    }
}
