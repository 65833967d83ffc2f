//! Any bytes as a safetensors file through the header check that runs before any tensor is
//! allocated (`miles_runtime::safetensors`, issue #35): no panic; reading from a stream agrees
//! with parsing the bytes; a header that passes describes ranges that lie inside the file, are
//! exactly as long as their shape and dtype say, and tile the data.
#![no_main]

use libfuzzer_sys::fuzz_target;
use miles_runtime::safetensors::{parse, read_header};

fuzz_target!(|data: &[u8]| {
    let got = parse(data);
    assert_eq!(read_header(&mut &data[..], data.len() as u64), got, "stream and bytes disagree");
    let Ok(h) = got else { return };
    let header_end = 8 + u64::from_le_bytes(data[..8].try_into().expect("8 bytes"));
    let mut pos = header_end;
    for e in &h.entries {
        let bytes = e.shape.iter().try_fold(1u64, |n, &d| n.checked_mul(d)).and_then(|n| n.checked_mul(e.dtype.size()));
        assert_eq!(bytes, Some(e.len), "{}: length against shape", e.name);
        assert!(e.shape.iter().all(|&d| d <= i64::MAX as u64), "{}: a dimension libtorch cannot take", e.name);
        assert_eq!(e.start, pos, "{}: a gap or an overlap", e.name);
        pos = e.start + e.len;
    }
    assert_eq!(pos, data.len() as u64, "the ranges do not end at the file's end");
});
