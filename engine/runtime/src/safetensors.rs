//! The safetensors header, read and checked before any tensor is allocated. A file is an 8-byte
//! little-endian header length `n`, `n` bytes of JSON (`{"name": {"dtype", "shape",
//! "data_offsets": [begin, end]}, "__metadata__": {...}}`), then the data; offsets count from the
//! data's start. A hostile header can claim any shape: here every claim is held against the
//! file before a byte of data is read. The header length is bounded ([`MAX_HEADER_BYTES`]) and
//! inside the file; each tensor's element count times its dtype's size (checked products, no
//! overflow) equals its byte range, which lies inside the data; the ranges tile the data (no
//! overlap, no gap, no trailing bytes: what the format's own readers require); no name repeats.
//!
//! Pure over bytes ([`parse`], which the fuzz target `safetensors_header` feeds) and over a
//! reader ([`read_header`], which reads the header's bytes alone); engine/tch reads the data by
//! the checked ranges.

use crate::quote::truncate;
use crate::{RunError, E_CHECKPOINT};
use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::Value;
use std::io::Read;
use std::path::Path;

/// The largest header read: the `safetensors` crate's own bound (a model's header is a few
/// hundred kB); a larger claim is refused before it is allocated.
pub const MAX_HEADER_BYTES: u64 = 100_000_000;

/// A tensor's element type, as the format names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    Bool,
    U8,
    I8,
    I16,
    U16,
    I32,
    U32,
    I64,
    U64,
    F16,
    BF16,
    F32,
    F64,
    F8E4M3,
    F8E5M2,
}

const DTYPES: [(&str, Dtype, u64); 15] = [
    ("BOOL", Dtype::Bool, 1),
    ("U8", Dtype::U8, 1),
    ("I8", Dtype::I8, 1),
    ("I16", Dtype::I16, 2),
    ("U16", Dtype::U16, 2),
    ("I32", Dtype::I32, 4),
    ("U32", Dtype::U32, 4),
    ("I64", Dtype::I64, 8),
    ("U64", Dtype::U64, 8),
    ("F16", Dtype::F16, 2),
    ("BF16", Dtype::BF16, 2),
    ("F32", Dtype::F32, 4),
    ("F64", Dtype::F64, 8),
    ("F8_E4M3", Dtype::F8E4M3, 1),
    ("F8_E5M2", Dtype::F8E5M2, 1),
];

impl Dtype {
    fn parse(name: &str) -> Option<Dtype> {
        DTYPES.iter().find(|(n, ..)| *n == name).map(|(_, d, _)| *d)
    }

    /// The format's name (`BF16`, `F32`, ...).
    pub fn name(self) -> &'static str {
        DTYPES.iter().find(|(_, d, _)| *d == self).map(|(n, ..)| *n).unwrap_or("?")
    }

    /// Bytes per element.
    pub fn size(self) -> u64 {
        DTYPES.iter().find(|(_, d, _)| *d == self).map(|(.., s)| *s).unwrap_or(1)
    }
}

/// One tensor of a checked header: its bytes are `start..start + len` of the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    pub dtype: Dtype,
    /// Every dimension fits an `i64` (what libtorch takes).
    pub shape: Vec<u64>,
    /// Offset in the file (the data's start included).
    pub start: u64,
    pub len: u64,
}

/// A checked header: its tensors in file order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Header {
    pub entries: Vec<Entry>,
}

impl Header {
    pub fn get(&self, name: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| e.name == name)
    }
}

/// The header length the first 8 bytes claim, checked against the bound and the file's length.
pub fn header_len(prefix: [u8; 8], file_len: u64) -> Result<u64, String> {
    let n = u64::from_le_bytes(prefix);
    if n > MAX_HEADER_BYTES {
        return Err(format!("header length {n} exceeds the {MAX_HEADER_BYTES}-byte bound"));
    }
    if n.checked_add(8).is_none_or(|end| end > file_len) {
        return Err(format!("header length {n} runs past the end of the file ({file_len} bytes)"));
    }
    Ok(n)
}

/// A whole file's bytes: its checked header.
pub fn parse(file: &[u8]) -> Result<Header, String> {
    let file_len = file.len() as u64;
    let prefix: [u8; 8] = file
        .get(..8)
        .and_then(|p| p.try_into().ok())
        .ok_or_else(|| format!("{file_len} bytes, shorter than the 8-byte header length"))?;
    let n = header_len(prefix, file_len)? as usize;
    parse_json(&file[8..8 + n], file_len)
}

/// Reads and checks the header of a file of `file_len` bytes from `r` (at its start), reading
/// the header's bytes alone.
pub fn read_header(r: &mut impl Read, file_len: u64) -> Result<Header, String> {
    let mut prefix = [0u8; 8];
    if file_len < 8 {
        return Err(format!("{file_len} bytes, shorter than the 8-byte header length"));
    }
    r.read_exact(&mut prefix).map_err(|e| format!("cannot read the header length: {e}"))?;
    let n = header_len(prefix, file_len)?;
    let mut json = vec![0u8; n as usize];
    r.read_exact(&mut json).map_err(|e| format!("cannot read the {n}-byte header: {e}"))?;
    parse_json(&json, file_len)
}

/// The checked header of the file at `path`; an error names the file (E0506).
pub fn read_file_header(path: &Path) -> Result<Header, RunError> {
    let mut f = std::fs::File::open(path).map_err(|e| RunError::io(E_CHECKPOINT, "cannot open", path, e))?;
    let len = f.metadata().map_err(|e| RunError::io(E_CHECKPOINT, "cannot read", path, e))?.len();
    read_header(&mut f, len)
        .map_err(|m| RunError::new(E_CHECKPOINT, format!("{}: not a valid safetensors file: {m}", path.display())))
}

/// The header's top-level keys in file order, repeats kept (a JSON map would keep one silently).
struct Pairs(Vec<(String, Value)>);

impl<'de> Deserialize<'de> for Pairs {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Pairs;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Pairs, A::Error> {
                let mut v = Vec::new();
                while let Some(kv) = m.next_entry::<String, Value>()? {
                    v.push(kv);
                }
                Ok(Pairs(v))
            }
        }
        d.deserialize_map(V)
    }
}

fn quoted(name: &str) -> String {
    format!("`{}`", truncate(&name.escape_debug().to_string(), 80))
}

fn parse_json(json: &[u8], file_len: u64) -> Result<Header, String> {
    let Pairs(pairs) = serde_json::from_slice(json).map_err(|e| format!("the header is not a JSON object: {e}"))?;
    let data_start = 8 + json.len() as u64;
    let data_len = file_len - data_start;
    let mut entries: Vec<Entry> = Vec::with_capacity(pairs.len());
    let mut seen = std::collections::HashSet::new();
    for (name, v) in pairs {
        if !seen.insert(name.clone()) {
            return Err(format!("tensor {} appears twice in the header", quoted(&name)));
        }
        if name == "__metadata__" {
            if !v.is_object() {
                return Err("`__metadata__` is not an object".into());
            }
            continue;
        }
        let e = entry(&name, &v, data_len).map_err(|m| format!("tensor {}: {m}", quoted(&name)))?;
        entries.push(Entry { start: e.start + data_start, ..e });
    }
    entries.sort_by_key(|e| (e.start, e.len));
    // The ranges tile the data, as the format requires: no overlap, no gap, nothing after.
    let mut pos = data_start;
    let mut last: Option<&Entry> = None;
    for e in &entries {
        if e.start < pos {
            let p = last.map(|p| quoted(&p.name)).unwrap_or_default();
            return Err(format!("tensors {p} and {} overlap in the file", quoted(&e.name)));
        }
        if e.start > pos {
            return Err(format!(
                "bytes {}..{} of the data belong to no tensor",
                pos - data_start,
                e.start - data_start
            ));
        }
        pos = e.start + e.len;
        last = Some(e);
    }
    if pos != file_len {
        return Err(format!("the data's last {} bytes belong to no tensor", file_len - pos));
    }
    Ok(Header { entries })
}

/// One tensor's description, its range relative to the data's start.
fn entry(name: &str, v: &Value, data_len: u64) -> Result<Entry, String> {
    let o = v.as_object().ok_or("not an object with `dtype`, `shape` and `data_offsets`")?;
    if let Some(k) = o.keys().find(|k| !matches!(k.as_str(), "dtype" | "shape" | "data_offsets")) {
        return Err(format!("unknown key {}", quoted(k)));
    }
    let dname = o.get("dtype").and_then(Value::as_str).ok_or("no `dtype` string")?;
    let dtype = Dtype::parse(dname).ok_or_else(|| format!("unknown dtype {}", quoted(dname)))?;
    let shape: Vec<u64> = o
        .get("shape")
        .and_then(Value::as_array)
        .ok_or("no `shape` list")?
        .iter()
        .map(|d| d.as_u64().filter(|&d| d <= i64::MAX as u64))
        .collect::<Option<_>>()
        .ok_or("`shape` holds something other than a dimension (a whole number up to 2^63-1)")?;
    let offsets: Vec<u64> = o
        .get("data_offsets")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_u64).collect())
        .filter(|a: &Vec<u64>| a.len() == 2)
        .ok_or("`data_offsets` is not two whole numbers [begin, end]")?;
    let (begin, end) = (offsets[0], offsets[1]);
    if begin > end {
        return Err(format!("data_offsets [{begin}, {end}] end before they begin"));
    }
    if end > data_len {
        return Err(format!("data_offsets [{begin}, {end}] run past the end of the data ({data_len} bytes)"));
    }
    let bytes = shape
        .iter()
        .try_fold(1u64, |n, &d| n.checked_mul(d))
        .and_then(|n| n.checked_mul(dtype.size()))
        .ok_or_else(|| format!("shape {shape:?} of {} overflows a 64-bit byte count", dtype.name()))?;
    if bytes != end - begin {
        return Err(format!(
            "shape {shape:?} of {} is {bytes} bytes, but data_offsets [{begin}, {end}] hold {}",
            dtype.name(),
            end - begin
        ));
    }
    Ok(Entry { name: name.to_string(), dtype, shape, start: begin, len: bytes })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A file whose header is `header` (as JSON text) followed by `data_len` zero bytes.
    fn file(header: &str, data_len: usize) -> Vec<u8> {
        let mut f = (header.len() as u64).to_le_bytes().to_vec();
        f.extend(header.as_bytes());
        f.extend(std::iter::repeat_n(0u8, data_len));
        f
    }

    fn err(header: serde_json::Value, data_len: usize) -> String {
        parse(&file(&header.to_string(), data_len)).unwrap_err()
    }

    #[test]
    fn a_valid_header_gives_ranges_in_the_file() {
        let h = json!({
            "__metadata__": {"format": "pt"},
            "b": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [16, 28]},
            "a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
            "empty": {"dtype": "F32", "shape": [0, 5], "data_offsets": [16, 16]},
        })
        .to_string();
        let f = file(&h, 28);
        let got = parse(&f).unwrap();
        let data_start = 8 + h.len() as u64;
        let names: Vec<&str> = got.entries.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["a", "empty", "b"]);
        assert_eq!(
            got.get("b").unwrap(),
            &Entry { name: "b".into(), dtype: Dtype::BF16, shape: vec![2, 3], start: data_start + 16, len: 12 }
        );
        // The reader path reads the same header from a stream.
        assert_eq!(read_header(&mut f.as_slice(), f.len() as u64).unwrap(), got);
    }

    #[test]
    fn a_huge_shape_claim_is_refused_before_allocation() {
        // 2^40 floats claimed over 16 bytes: refused from the header alone.
        let e = err(json!({"w": {"dtype": "F32", "shape": [1u64 << 20, 1u64 << 20], "data_offsets": [0, 16]}}), 16);
        assert_eq!(
            e,
            "tensor `w`: shape [1048576, 1048576] of F32 is 4398046511104 bytes, but data_offsets [0, 16] hold 16"
        );
        // ... and with offsets to match, the range runs past the file.
        let e = err(
            json!({"w": {"dtype": "F32", "shape": [1u64 << 20, 1u64 << 20], "data_offsets": [0, 4398046511104u64]}}),
            16,
        );
        assert_eq!(e, "tensor `w`: data_offsets [0, 4398046511104] run past the end of the data (16 bytes)");
    }

    #[test]
    fn an_offset_beyond_the_file_is_refused() {
        let e = err(json!({"w": {"dtype": "U8", "shape": [4], "data_offsets": [20, 24]}}), 16);
        assert_eq!(e, "tensor `w`: data_offsets [20, 24] run past the end of the data (16 bytes)");
        let e = err(json!({"w": {"dtype": "U8", "shape": [4], "data_offsets": [8, 4]}}), 16);
        assert_eq!(e, "tensor `w`: data_offsets [8, 4] end before they begin");
    }

    #[test]
    fn an_overflowing_shape_product_is_refused() {
        let big = 1u64 << 62;
        let e = err(json!({"w": {"dtype": "F32", "shape": [big, big], "data_offsets": [0, 0]}}), 0);
        assert_eq!(e, format!("tensor `w`: shape [{big}, {big}] of F32 overflows a 64-bit byte count"));
        // One dimension times the dtype's size overflows too.
        let e = err(json!({"w": {"dtype": "F64", "shape": [big], "data_offsets": [0, 0]}}), 0);
        assert!(e.ends_with("overflows a 64-bit byte count"), "{e}");
        // A dimension libtorch cannot take, even with a zero dimension beside it.
        let e = err(json!({"w": {"dtype": "F32", "shape": [0, u64::MAX], "data_offsets": [0, 0]}}), 0);
        assert!(e.contains("`shape` holds something other than a dimension"), "{e}");
    }

    #[test]
    fn a_header_length_larger_than_the_file_is_refused() {
        let mut f = file(r#"{"w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}"#, 1);
        let claimed = f.len() as u64;
        f[..8].copy_from_slice(&claimed.to_le_bytes());
        let want = format!("header length {claimed} runs past the end of the file ({claimed} bytes)");
        assert_eq!(parse(&f).unwrap_err(), want);
        assert_eq!(read_header(&mut f.as_slice(), f.len() as u64).unwrap_err(), want);
        f[..8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(parse(&f).unwrap_err(), format!("header length {} exceeds the 100000000-byte bound", u64::MAX));
        assert_eq!(parse(&[1, 2, 3]).unwrap_err(), "3 bytes, shorter than the 8-byte header length");
    }

    #[test]
    fn overlaps_repeats_and_malformed_entries_are_refused() {
        let e = err(
            json!({
                "a": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]},
                "b": {"dtype": "U8", "shape": [8], "data_offsets": [4, 12]},
            }),
            12,
        );
        assert_eq!(e, "tensors `a` and `b` overlap in the file");
        let e = err(json!({"a": {"dtype": "U8", "shape": [4], "data_offsets": [4, 8]}}), 8);
        assert_eq!(e, "bytes 0..4 of the data belong to no tensor");
        let e = err(json!({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}}), 8);
        assert_eq!(e, "the data's last 4 bytes belong to no tensor");
        let f = file(
            r#"{"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}, "a": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}}"#,
            2,
        );
        assert_eq!(parse(&f).unwrap_err(), "tensor `a` appears twice in the header");
        let e = err(json!({"w": {"dtype": "Q4", "shape": [1], "data_offsets": [0, 1]}}), 1);
        assert_eq!(e, "tensor `w`: unknown dtype `Q4`");
        let e = err(json!({"w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1], "x": 1}}), 1);
        assert_eq!(e, "tensor `w`: unknown key `x`");
        let e = err(json!({"w": {"dtype": "U8", "shape": [-1], "data_offsets": [0, 1]}}), 1);
        assert!(e.contains("`shape` holds something other than a dimension"), "{e}");
        let e = err(json!({"w": {"dtype": "U8", "shape": [1], "data_offsets": [0]}}), 1);
        assert_eq!(e, "tensor `w`: `data_offsets` is not two whole numbers [begin, end]");
        assert!(err(json!([1, 2]), 0).starts_with("the header is not a JSON object"));
        assert_eq!(err(json!({"__metadata__": 3}), 0), "`__metadata__` is not an object");
        // A hostile name is quoted escaped and cut.
        let long = "\n".repeat(500);
        let e = err(json!({long: {"dtype": "Q4", "shape": [], "data_offsets": [0, 0]}}), 0);
        assert!(e.starts_with("tensor `\\n\\n") && e.contains("bytes in all)"), "{e}");
    }

    #[test]
    fn a_named_file_is_read_by_its_header_alone() {
        let dir = std::env::temp_dir().join(format!("miles-safetensors-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("w.safetensors");
        std::fs::write(&path, file(r#"{"w": {"dtype": "U8", "shape": [2], "data_offsets": [0, 4]}}"#, 4)).unwrap();
        let e = read_file_header(&path).unwrap_err();
        assert_eq!(e.code, E_CHECKPOINT);
        assert_eq!(
            e.message,
            format!("{}: not a valid safetensors file: tensor `w`: shape [2] of U8 is 2 bytes, but data_offsets [0, 4] hold 4", path.display())
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
