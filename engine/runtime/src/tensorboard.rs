//! TensorBoard event files, written directly: TFRecord framing (length, masked CRC-32C, payload,
//! masked CRC-32C) around hand-encoded `Event` protobufs holding scalar summaries.
//!
//! Why not a crate: the Rust TensorBoard writers on the registry are unmaintained and pull in
//! an old protobuf stack; scalars need three message types and two varint fields.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// CRC-32C (Castagnoli), bitwise table-free form: event files are small, a step writes a few
/// hundred bytes.
pub fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            let mask = (crc & 1).wrapping_neg();
            crc = (crc >> 1) ^ (0x82F6_3B78 & mask);
        }
    }
    !crc
}

fn masked_crc(data: &[u8]) -> u32 {
    let c = crc32c(data);
    c.rotate_right(15).wrapping_add(0xa282_ead8)
}

fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn key(field: u32, wire: u8, out: &mut Vec<u8>) {
    varint((u64::from(field) << 3) | u64::from(wire), out);
}

fn bytes_field(field: u32, data: &[u8], out: &mut Vec<u8>) {
    key(field, 2, out);
    varint(data.len() as u64, out);
    out.extend_from_slice(data);
}

/// `Event { wall_time = 1 (double), step = 2 (int64), file_version = 3 | summary = 5 }`.
fn event(wall_time: f64, step: i64, body: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut e = Vec::new();
    key(1, 1, &mut e);
    e.extend_from_slice(&wall_time.to_le_bytes());
    key(2, 0, &mut e);
    varint(step as u64, &mut e);
    body(&mut e);
    e
}

/// `Summary { repeated Value value = 1 }`, `Value { tag = 1, simple_value = 2 (float) }`.
fn summary(values: &[(&str, f32)]) -> Vec<u8> {
    let mut s = Vec::new();
    for (tag, v) in values {
        let mut val = Vec::new();
        bytes_field(1, tag.as_bytes(), &mut val);
        key(2, 5, &mut val);
        val.extend_from_slice(&v.to_le_bytes());
        bytes_field(1, &val, &mut s);
    }
    s
}

fn record(payload: &[u8]) -> Vec<u8> {
    let len = (payload.len() as u64).to_le_bytes();
    let mut r = Vec::with_capacity(payload.len() + 16);
    r.extend_from_slice(&len);
    r.extend_from_slice(&masked_crc(&len).to_le_bytes());
    r.extend_from_slice(payload);
    r.extend_from_slice(&masked_crc(payload).to_le_bytes());
    r
}

pub struct EventWriter {
    file: fs::File,
    pub path: PathBuf,
}

impl EventWriter {
    /// A new event file in `dir` (one per invocation, as TensorBoard expects; a resumed run adds
    /// a second file and TensorBoard merges them by step).
    pub fn create(dir: &Path, wall_time: f64) -> io::Result<EventWriter> {
        fs::create_dir_all(dir)?;
        let path = dir.join(format!("events.out.tfevents.{}.miles.{}", wall_time as u64, std::process::id()));
        let mut file = fs::File::create(&path)?;
        let first = event(wall_time, 0, |e| bytes_field(3, b"brain.Event:2", e));
        file.write_all(&record(&first))?;
        file.flush()?;
        Ok(EventWriter { file, path })
    }

    /// Scalars of one step; written and flushed as one record.
    pub fn scalars(&mut self, step: i64, wall_time: f64, values: &[(&str, f32)]) -> io::Result<()> {
        if values.is_empty() {
            return Ok(());
        }
        let e = event(wall_time, step, |e| bytes_field(5, &summary(values), e));
        self.file.write_all(&record(&e))?;
        self.file.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_check_value() {
        // The standard check value of CRC-32C.
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(b""), 0);
    }

    #[test]
    fn records_frame_and_checksum() {
        let r = record(b"abc");
        assert_eq!(&r[..8], &3u64.to_le_bytes());
        assert_eq!(&r[8..12], &masked_crc(&3u64.to_le_bytes()).to_le_bytes());
        assert_eq!(&r[12..15], b"abc");
        assert_eq!(r.len(), 8 + 4 + 3 + 4);
    }

    #[test]
    fn scalar_event_encoding() {
        // Event{wall_time=1.0, step=3, summary{value{tag="a", simple_value=0.5}}} by hand.
        let e = event(1.0, 3, |e| bytes_field(5, &summary(&[("a", 0.5)]), e));
        let mut want = vec![0x09];
        want.extend_from_slice(&1.0f64.to_le_bytes());
        want.extend_from_slice(&[0x10, 0x03, 0x2a, 0x0a, 0x0a, 0x08, 0x0a, 0x01, b'a', 0x15]);
        want.extend_from_slice(&0.5f32.to_le_bytes());
        assert_eq!(e, want);
    }
}
