//! Parquet prompt files through the `parquet` crate's row API (no arrow): a file, a directory of
//! shards or a Hugging Face `datasets` repository (`shards.rs`), read shard by shard and row group
//! by row group; each row's fields become JSON in the file's column order (`json.rs`), then go
//! through the same row rules as JSONL. docs/data.md, "Parquet".
//!
//! Every column is read: a row's fields all reach the reward as its metadata, so no projection
//! could leave one out. What is held at once is one page per column of the current row group
//! (the crate reads pages from the file as the rows need them), never a file's bytes, plus the
//! rows made so far (the split needs them all).

mod json;
pub mod shards;

use super::prompts::{malformed, open_error, row, DataSettings, PromptRow};
use crate::{RunError, E_DATA_FILE};
use ::parquet::basic::Compression;
use ::parquet::file::reader::{FileReader, SerializedFileReader};
use serde_json::{Map, Value};
use std::path::Path;

/// The rows of the train shards: a file's, or a directory's (docs/data.md).
pub fn read(settings: &DataSettings, warnings: &mut Vec<String>) -> Result<Vec<PromptRow>, RunError> {
    let shards = shards::resolve(&settings.path)?;
    let mut out = Vec::new();
    for file in &shards.train {
        read_file(settings, file, &mut out, warnings)?;
    }
    Ok(out)
}

/// The rows of the `test` shards a datasets layout ships; None when it ships none (a file, plain
/// shards, a layout with only a train split).
pub fn read_test(settings: &DataSettings, warnings: &mut Vec<String>) -> Result<Option<Vec<PromptRow>>, RunError> {
    let shards = shards::resolve(&settings.path)?;
    if shards.test.is_empty() {
        return Ok(None);
    }
    let mut out = Vec::new();
    for file in &shards.test {
        read_file(settings, file, &mut out, warnings)?;
    }
    if out.is_empty() {
        return Err(RunError::new(
            E_DATA_FILE,
            format!("{}: its test shards hold no prompts", settings.path.display()),
        )
        .with_help("remove the empty test shards to draw the held-out rows from the train shards"));
    }
    Ok(Some(out))
}

/// The codecs this build decompresses (Cargo.toml's `parquet` features).
const CODECS: &str = "snappy, zstd, gzip, lz4, brotli or none";

fn codec_name(c: Compression) -> Option<&'static str> {
    match c {
        Compression::UNCOMPRESSED => Some("none"),
        Compression::SNAPPY => Some("snappy"),
        Compression::GZIP(_) => Some("gzip"),
        Compression::ZSTD(_) => Some("zstd"),
        Compression::LZ4 | Compression::LZ4_RAW => Some("lz4"),
        Compression::BROTLI(_) => Some("brotli"),
        Compression::LZO => None,
    }
}

/// Appends one file's rows to `out`, numbered from 1 in that file (`file#row`).
fn read_file(
    settings: &DataSettings,
    path: &Path,
    out: &mut Vec<PromptRow>,
    warnings: &mut Vec<String>,
) -> Result<(), RunError> {
    let file = std::fs::File::open(path).map_err(|e| open_error(path, e))?;
    let not_parquet = |e: ::parquet::errors::ParquetError| {
        RunError::new(E_DATA_FILE, format!("{}: cannot read it as Parquet: {e}", path.display()))
    };
    // Reads the footer only.
    let reader = SerializedFileReader::new(file).map_err(not_parquet)?;
    let meta = reader.metadata();
    let columns: Vec<String> =
        meta.file_metadata().schema_descr().root_schema().get_fields().iter().map(|f| f.name().to_string()).collect();
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
    // Every column chunk's codec, before any row: a file this build cannot decompress says so
    // by name rather than failing at the first row that reaches the chunk.
    for group in meta.row_groups() {
        for chunk in group.columns() {
            if codec_name(chunk.compression()).is_none() {
                return Err(RunError::new(
                    E_DATA_FILE,
                    format!(
                        "{}: column `{}` is compressed with {}, which miles does not read (it reads {CODECS})",
                        path.display(),
                        chunk.column_path().string(),
                        chunk.compression()
                    ),
                )
                .with_help("rewrite the file in another codec: pyarrow.parquet.write_table(pyarrow.parquet.read_table(src), dst, compression=\"zstd\")"));
            }
        }
    }
    let mut n = 0usize;
    for g in 0..reader.num_row_groups() {
        let group = reader.get_row_group(g).map_err(not_parquet)?;
        let rows = group.get_row_iter(None).map_err(not_parquet)?;
        for r in rows {
            n += 1;
            let origin = format!("{}#{n}", path.display());
            let r = r.map_err(|e| RunError::new(E_DATA_FILE, format!("{origin}: cannot read the row: {e}")))?;
            let mut fields = Map::new();
            let mut prompt_json = None;
            for (name, f) in r.get_column_iter() {
                let mut text = String::new();
                json::write_json(f, &mut text);
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
    }
    Ok(())
}

#[cfg(test)]
mod tests;
