//! The one byte format of weights in flight and at rest: TCP streams, shared-memory files,
//! disk deltas and a rollout host's local copy all use it, so one reader verifies them all.
//!
//! ```text
//! u32 LE header length, header (JSON)
//! per bucket: u64 LE length, bytes, u32 LE CRC-32 of those bytes
//! u64 LE 0 (end of buckets)
//! u32 LE trailer length, trailer (JSON: CRC-32 of every tensor of the result, optional SHA-256)
//! ```
//!
//! The payload is the listed tensors' little-endian f32 bytes, concatenated in header order and
//! cut into buckets of `bucket_bytes`. A bucket's CRC is checked as it arrives (a corrupted bucket
//! is refused before anything is loaded); the per-tensor CRCs are checked on the assembled result
//! (for a delta: on the patched weights), and the optional digest over the whole weights.

use miles_runtime::{NamedTensor, WeightSnapshot};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::io::{self, Read, Write};

/// Version 2: the header carries the run's tag, no longer its token.
pub const MAGIC: &str = "miles-weights/2";
/// Refuse absurd headers before allocating (a stray connection, a torn file).
const MAX_HEADER: u32 = 64 << 20;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Header {
    pub magic: String,
    /// The run's public tag (`crate::auth::run_tag`, never the token): a receiver refuses a
    /// stream or a disk-delta file of another run.
    pub run: String,
    pub version: u64,
    /// This stream is part `part` of `parts` (p2p: one part per trainer shard).
    pub part: u32,
    pub parts: u32,
    /// Tensors in the whole snapshot (every part carries the same number).
    pub total_tensors: u32,
    pub bucket_bytes: u64,
    pub tensors: Vec<TensorMeta>,
    /// Disk-delta: the payload is `new XOR base` bit-for-bit and this is the base version.
    #[serde(default)]
    pub delta_base: Option<u64>,
    /// Shared memory: the stream itself is in this file; the socket carries only this header.
    #[serde(default)]
    pub shm_path: Option<String>,
    /// Shared memory, pipelined: after this header the socket carries u64 LE notices "the file
    /// is written up to byte N" (see [`READY_NOTICE`]), so the engine copies while the publisher
    /// still writes. Without it the file is complete when the header arrives.
    #[serde(default)]
    pub shm_notices: bool,
    /// NCCL: the body goes through an NCCL communicator (crate::nccl); the socket carries this
    /// header, the handshake and the verdict.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nccl: Option<NcclHeader>,
}

/// What an engine needs to join the trainer's NCCL communicator and read the body from it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct NcclHeader {
    /// The communicator's ncclUniqueId, 256 hex characters.
    pub id: String,
    /// This engine's rank (the trainer is 0) of `ranks`.
    pub rank: u32,
    pub ranks: u32,
    /// Bytes of the body, broadcast in chunks of `chunk_bytes` (the last one shorter).
    pub stream_bytes: u64,
    pub chunk_bytes: u64,
    /// The trainer's GPU UUID: an engine on the same GPU refuses at once (NCCL cannot).
    pub trainer_gpu: String,
}

/// A pipelined shared-memory publisher tells its engines how far the file is written at least
/// every this many bytes (and once at the end): small enough that the engine's copy trails the
/// writer by a few milliseconds, large enough that the notices cost nothing.
pub const READY_NOTICE: usize = 4 << 20;

impl Header {
    /// Part `part` of `parts` of `snap` for the run of `token`: the tensors at `indices`, whole
    /// (no delta base, no shared memory file).
    pub fn part(
        token: &str,
        snap: &WeightSnapshot,
        bucket_bytes: u64,
        (part, parts): (u32, u32),
        indices: impl IntoIterator<Item = usize>,
    ) -> Header {
        Header {
            magic: MAGIC.into(),
            run: crate::auth::run_tag(token),
            version: snap.version,
            part,
            parts,
            total_tensors: snap.tensors.len() as u32,
            bucket_bytes,
            tensors: indices
                .into_iter()
                .map(|i| {
                    let t = &snap.tensors[i];
                    TensorMeta { index: i as u32, name: t.name.clone(), shape: t.shape.clone() }
                })
                .collect(),
            delta_base: None,
            shm_path: None,
            shm_notices: false,
            nccl: None,
        }
    }

    /// All of `snap` in one part.
    pub fn whole(token: &str, snap: &WeightSnapshot, bucket_bytes: u64) -> Header {
        Header::part(token, snap, bucket_bytes, (0, 1), 0..snap.tensors.len())
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TensorMeta {
    /// Index in the whole snapshot.
    pub index: u32,
    pub name: String,
    pub shape: Vec<usize>,
}

impl TensorMeta {
    pub fn elems(&self) -> usize {
        self.shape.iter().product()
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct Trailer {
    /// (tensor index, CRC-32 of its f32 bytes in the result) for every tensor of this part.
    pub tensor_crc: Vec<(u32, u32)>,
    /// SHA-256 (hex) over all tensors of the whole result in index order, when full verification
    /// is on.
    #[serde(default)]
    pub full_sha256: Option<String>,
}

impl Trailer {
    /// The CRC-32 of each tensor of `snap` at `indices`: what the receiver must end up with.
    pub fn of(snap: &WeightSnapshot, indices: impl IntoIterator<Item = usize>, full_sha256: Option<String>) -> Trailer {
        Trailer {
            tensor_crc: indices.into_iter().map(|i| (i as u32, crc(as_bytes(&snap.tensors[i].data)))).collect(),
            full_sha256,
        }
    }
}

/// Views f32s as bytes (little-endian on the x86-64 and aarch64 hosts miles runs on).
pub fn as_bytes(v: &[f32]) -> &[u8] {
    // SAFETY: f32 has no padding and every byte pattern is a valid u8; the length is exact.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}

pub fn as_bytes_mut(v: &mut [f32]) -> &mut [u8] {
    // SAFETY: every bit pattern is a valid f32, so writing arbitrary bytes keeps the slice valid.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, std::mem::size_of_val(v)) }
}

pub fn crc(bytes: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(bytes);
    h.finalize()
}

/// SHA-256 over all tensors in order: the "compare full weights" check.
pub fn full_digest(tensors: &[NamedTensor]) -> String {
    let mut h = Sha256::new();
    for t in tensors {
        h.update(t.name.as_bytes());
        h.update(as_bytes(&t.data));
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

fn write_json<W: Write, T: Serialize>(w: &mut W, v: &T) -> io::Result<()> {
    let bytes = serde_json::to_vec(v).map_err(io::Error::other)?;
    w.write_all(&(bytes.len() as u32).to_le_bytes())?;
    w.write_all(&bytes)
}

fn read_json<R: Read, T: for<'de> Deserialize<'de>>(r: &mut R, what: &str) -> io::Result<T> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len);
    if len > MAX_HEADER {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{what} of {len} bytes is not a weight stream"),
        ));
    }
    // Grown as bytes arrive, not allocated from the claimed length: a stream or file that claims
    // 64 MB and ends early costs what it sent.
    let mut buf = Vec::new();
    r.take(len as u64).read_to_end(&mut buf)?;
    if buf.len() < len as usize {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, format!("{what} cut short")));
    }
    serde_json::from_slice(&buf).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("bad {what}: {e}")))
}

pub fn write_header<W: Write>(w: &mut W, h: &Header) -> io::Result<()> {
    write_json(w, h)
}

pub fn read_header<R: Read>(r: &mut R) -> io::Result<Header> {
    let h: Header = read_json(r, "header")?;
    if h.magic != MAGIC {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("not a miles weight stream ({})", h.magic)));
    }
    Ok(h)
}

/// Test hook and fault injection: flip one byte of this bucket after its CRC was computed.
#[derive(Debug, Clone, Copy, Default)]
pub struct Faults {
    pub corrupt_bucket: Option<u32>,
}

impl Faults {
    /// `MILES_FAULT_CORRUPT_BUCKET=N` corrupts bucket N of every stream this process sends (the
    /// fault test of a corrupted bucket; never set in a real run).
    pub fn from_env() -> Faults {
        Faults { corrupt_bucket: std::env::var("MILES_FAULT_CORRUPT_BUCKET").ok().and_then(|v| v.parse().ok()) }
    }
}

/// Bytes handled per step by every writer and reader of the format: a chunk is CRC'd while it
/// sits in L2 and copied once (into the socket, the file or the destination buffer), so a byte
/// crosses memory once per side instead of once per pass.
pub const CHUNK: usize = 256 << 10;

/// Where a sender's payload bytes come from, chunk by chunk: borrowed tensors ([`Pieces`]) or
/// bytes produced on the fly (a disk delta's `new XOR old`).
pub trait Source {
    /// Bytes `range` of piece `piece` (never longer than [`CHUNK`]).
    fn chunk(&mut self, piece: usize, range: std::ops::Range<usize>) -> &[u8];
}

/// The payload as borrowed byte slices, one per tensor.
pub struct Pieces<'a>(pub &'a [&'a [u8]]);

impl Source for Pieces<'_> {
    fn chunk(&mut self, piece: usize, range: std::ops::Range<usize>) -> &[u8] {
        &self.0[piece][range]
    }
}

/// Where a receiver's payload bytes go, chunk by chunk.
pub trait Sink {
    /// The buffer that bytes `range` of piece `piece` are read into.
    fn buf(&mut self, piece: usize, range: std::ops::Range<usize>) -> &mut [u8];
    /// Those bytes have arrived (their bucket's CRC is checked at the bucket's end).
    fn filled(&mut self, _piece: usize, _range: std::ops::Range<usize>) {}
}

/// Reads straight into the destination tensors: the one copy.
pub struct Direct<'a, 'b>(pub &'a mut [&'b mut [u8]]);

impl Sink for Direct<'_, '_> {
    fn buf(&mut self, piece: usize, range: std::ops::Range<usize>) -> &mut [u8] {
        &mut self.0[piece][range]
    }
}

/// One bucket of `len` payload bytes from the cursor (piece, offset) on, chunk by chunk (at most
/// CHUNK bytes, never across a piece): `each` moves a chunk and adds its bytes to the hasher it is
/// given, whose CRC then serves both the bucket's and the piece's (`combine`). Writer and reader
/// walk the same layout through this one loop. Returns the bucket's CRC.
fn bucket_chunks(
    lens: &[usize],
    (piece, off): (&mut usize, &mut usize),
    len: usize,
    piece_h: &mut [crc32fast::Hasher],
    mut each: impl FnMut(usize, std::ops::Range<usize>, &mut crc32fast::Hasher) -> io::Result<()>,
) -> io::Result<crc32fast::Hasher> {
    let mut bucket_h = crc32fast::Hasher::new();
    let mut left = len;
    while left > 0 {
        while *off == lens[*piece] {
            *piece += 1;
            *off = 0;
        }
        let run = left.min(lens[*piece] - *off);
        let mut seg = crc32fast::Hasher::new();
        let mut at = *off;
        while at < *off + run {
            let take = CHUNK.min(*off + run - at);
            each(*piece, at..at + take, &mut seg)?;
            at += take;
        }
        bucket_h.combine(&seg);
        piece_h[*piece].combine(&seg);
        *off += run;
        left -= run;
    }
    Ok(bucket_h)
}

/// Writes the payload as buckets and the end mark, in one pass: each chunk's CRC-32 is computed
/// once (while the chunk is in cache, right before it is written) and serves both its bucket's CRC
/// and its piece's, combined with `crc32fast`'s `combine`. Returns the number of buckets and the
/// CRC-32 of every piece as sent (before any fault). The caller writes the trailer.
pub fn write_payload<W: Write, S: Source>(
    w: &mut W,
    lens: &[usize],
    src: &mut S,
    bucket_bytes: u64,
    faults: Faults,
) -> io::Result<(u32, Vec<u32>)> {
    let bucket = bucket_bytes.max(4096) as usize;
    let total: usize = lens.iter().sum();
    let mut piece_h: Vec<crc32fast::Hasher> = lens.iter().map(|_| crc32fast::Hasher::new()).collect();
    let (mut piece, mut off, mut sent, mut buckets) = (0usize, 0usize, 0usize, 0u32);
    while sent < total {
        let len = bucket.min(total - sent);
        w.write_all(&(len as u64).to_le_bytes())?;
        let mut first = true;
        let bucket_h = bucket_chunks(lens, (&mut piece, &mut off), len, &mut piece_h, |p, range, seg| {
            let chunk = src.chunk(p, range);
            seg.update(chunk);
            if first && faults.corrupt_bucket == Some(buckets) {
                let mut bad = chunk.to_vec();
                bad[0] ^= 0x5a;
                w.write_all(&bad)?;
            } else {
                w.write_all(chunk)?;
            }
            first = false;
            Ok(())
        })?;
        w.write_all(&bucket_h.finalize().to_le_bytes())?;
        sent += len;
        buckets += 1;
    }
    w.write_all(&0u64.to_le_bytes())?;
    Ok((buckets, piece_h.into_iter().map(|h| h.finalize()).collect()))
}

pub fn write_trailer<W: Write>(w: &mut W, trailer: &Trailer) -> io::Result<()> {
    write_json(w, trailer)?;
    w.flush()
}

/// Writes the payload `pieces` (the tensors' bytes in header order) as buckets, the end mark and
/// the trailer. Returns the number of buckets.
pub fn write_body<W: Write>(
    w: &mut W,
    pieces: &[&[u8]],
    bucket_bytes: u64,
    trailer: &Trailer,
    faults: Faults,
) -> io::Result<u32> {
    let lens: Vec<usize> = pieces.iter().map(|p| p.len()).collect();
    let (b, _) = write_payload(w, &lens, &mut Pieces(pieces), bucket_bytes, faults)?;
    write_trailer(w, trailer)?;
    Ok(b)
}

/// Writes the tensors `indices` of `snap` (the header's tensors) as a body whose trailer carries
/// the per-tensor CRCs computed in the same pass as the buckets' (no separate pass over the
/// weights). Returns the number of buckets.
pub fn write_tensors<W: Write>(
    w: &mut W,
    snap: &WeightSnapshot,
    indices: std::ops::Range<usize>,
    bucket_bytes: u64,
    full_sha256: Option<String>,
    faults: Faults,
) -> io::Result<(u32, Trailer)> {
    let pieces: Vec<&[u8]> = indices.clone().map(|i| as_bytes(&snap.tensors[i].data)).collect();
    let lens: Vec<usize> = pieces.iter().map(|p| p.len()).collect();
    let (b, crcs) = write_payload(w, &lens, &mut Pieces(&pieces), bucket_bytes, faults)?;
    let trailer = Trailer { tensor_crc: indices.map(|i| i as u32).zip(crcs).collect(), full_sha256 };
    write_trailer(w, &trailer)?;
    Ok((b, trailer))
}

/// Why a stream was refused: what a receiver reports back and logs.
#[derive(Debug)]
pub enum StreamError {
    Io(io::Error),
    /// A bucket or tensor failed its checksum: nothing of this version is loaded.
    Corrupt(String),
}

impl std::fmt::Display for StreamError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StreamError::Io(e) => write!(f, "{e}"),
            StreamError::Corrupt(m) => write!(f, "{m}"),
        }
    }
}

impl From<io::Error> for StreamError {
    fn from(e: io::Error) -> Self {
        StreamError::Io(e)
    }
}

/// Reads the buckets of a stream whose header was already read into `dst` (one slice per header
/// tensor, sized to it), checking each bucket's CRC as it arrives, then reads the trailer.
pub fn read_body<R: Read>(r: &mut R, h: &Header, dst: &mut [&mut [u8]]) -> Result<(Trailer, u32), StreamError> {
    let lens: Vec<usize> = dst.iter().map(|d| d.len()).collect();
    let (t, b, _) = read_payload(r, h, &lens, &mut Direct(dst))?;
    Ok((t, b))
}

/// Reads the buckets (payload `lens[i]` bytes per piece) into `sink` chunk by chunk, one CRC-32
/// pass: each chunk's CRC is computed right after it lands (in cache) and combined into both its
/// bucket's CRC (checked at the bucket's end: a corrupted bucket is refused there) and its piece's.
/// Returns the trailer, the number of buckets and the CRC-32 of every piece as received.
pub fn read_payload<R: Read, K: Sink>(
    r: &mut R,
    h: &Header,
    lens: &[usize],
    sink: &mut K,
) -> Result<(Trailer, u32, Vec<u32>), StreamError> {
    let total: usize = lens.iter().sum();
    let mut piece_h: Vec<crc32fast::Hasher> = lens.iter().map(|_| crc32fast::Hasher::new()).collect();
    let (mut got, mut piece, mut off, mut buckets) = (0usize, 0usize, 0usize, 0u32);
    loop {
        let mut len = [0u8; 8];
        r.read_exact(&mut len)?;
        let len = u64::from_le_bytes(len) as usize;
        if len == 0 {
            break;
        }
        if len > total - got {
            return Err(StreamError::Corrupt(format!(
                "version {}: bucket {buckets} overruns the {total} payload bytes the header announced",
                h.version
            )));
        }
        let hasher = bucket_chunks(lens, (&mut piece, &mut off), len, &mut piece_h, |p, range, seg| {
            let chunk = sink.buf(p, range.clone());
            r.read_exact(chunk)?;
            seg.update(chunk);
            sink.filled(p, range);
            Ok(())
        })?;
        let mut c = [0u8; 4];
        r.read_exact(&mut c)?;
        if u32::from_le_bytes(c) != hasher.finalize() {
            return Err(StreamError::Corrupt(format!(
                "version {} part {}: bucket {buckets} failed its CRC-32 check (corrupted in transit); not loaded",
                h.version, h.part
            )));
        }
        got += len;
        buckets += 1;
    }
    if got != total {
        return Err(StreamError::Corrupt(format!(
            "version {}: stream ended after {got} of {total} payload bytes",
            h.version
        )));
    }
    let trailer: Trailer = read_json(r, "trailer")?;
    Ok((trailer, buckets, piece_h.into_iter().map(|h| h.finalize()).collect()))
}

/// Checks the trailer's CRCs of the tensors at `indices` against `crcs` (computed while the
/// payload was received): the per-tensor check without another pass over the weights.
pub fn verify_crcs(version: u64, trailer: &Trailer, names: &[&str], crcs: &[u32]) -> Result<(), String> {
    if trailer.tensor_crc.len() != crcs.len() {
        return Err(format!(
            "version {version}: the trailer lists {} tensors, the stream carried {}; not loaded",
            trailer.tensor_crc.len(),
            crcs.len()
        ));
    }
    for (k, (&(_, want), &got)) in trailer.tensor_crc.iter().zip(crcs).enumerate() {
        if want != got {
            let name = names.get(k).copied().unwrap_or("?");
            return Err(format!("version {version}: tensor {name} failed its CRC-32 check; not loaded"));
        }
    }
    Ok(())
}

/// Checks the trailer's per-tensor CRCs against `tensors` (the assembled result).
pub fn verify_tensors(version: u64, trailer: &Trailer, tensors: &[NamedTensor]) -> Result<(), String> {
    for &(idx, want) in &trailer.tensor_crc {
        let t = tensors.get(idx as usize).ok_or_else(|| format!("version {version}: trailer names tensor {idx}"))?;
        if crc(as_bytes(&t.data)) != want {
            return Err(format!("version {version}: tensor {} failed its CRC-32 check; not loaded", t.name));
        }
    }
    Ok(())
}

/// Splits a snapshot into `shards` contiguous tensor ranges of about equal bytes (the trainer's
/// shards of a transfer plan).
pub fn shard_ranges(snap: &WeightSnapshot, shards: usize) -> Vec<std::ops::Range<usize>> {
    let n = snap.tensors.len();
    let shards = shards.clamp(1, n.max(1));
    let total: usize = snap.tensors.iter().map(|t| t.data.len()).sum();
    let mut out = Vec::with_capacity(shards);
    let mut start = 0usize;
    let mut acc = 0usize;
    for (i, t) in snap.tensors.iter().enumerate() {
        acc += t.data.len();
        let target = total * (out.len() + 1) / shards;
        let left_tensors = n - (i + 1);
        let left_shards = shards - out.len() - 1;
        if out.len() + 1 < shards && (acc >= target || left_tensors == left_shards) {
            out.push(start..i + 1);
            start = i + 1;
        }
    }
    if start < n || out.is_empty() {
        out.push(start..n);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(sizes: &[usize], version: u64) -> WeightSnapshot {
        WeightSnapshot {
            version,
            tensors: sizes
                .iter()
                .enumerate()
                .map(|(i, &n)| NamedTensor {
                    name: format!("t{i}"),
                    shape: vec![n],
                    data: (0..n).map(|k| (k as f32) * 0.5 + i as f32).collect(),
                })
                .collect(),
        }
    }

    fn roundtrip(faults: Faults) -> Result<WeightSnapshot, StreamError> {
        let s = snap(&[3000, 1, 5000, 2048], 7);
        let h = Header::whole("t", &s, 4096);
        let trailer = Trailer::of(&s, 0..s.tensors.len(), Some(full_digest(&s.tensors)));
        let mut buf = Vec::new();
        write_header(&mut buf, &h).unwrap();
        let pieces: Vec<&[u8]> = s.tensors.iter().map(|t| as_bytes(&t.data)).collect();
        let nb = write_body(&mut buf, &pieces, h.bucket_bytes, &trailer, faults).unwrap();
        assert_eq!(nb, (40196usize).div_ceil(4096) as u32);
        let mut r = &buf[..];
        let h2 = read_header(&mut r).unwrap();
        assert_eq!(h2, h);
        let mut out: Vec<NamedTensor> = h2
            .tensors
            .iter()
            .map(|m| NamedTensor { name: m.name.clone(), shape: m.shape.clone(), data: vec![0.0; m.elems()] })
            .collect();
        let mut dst: Vec<&mut [u8]> = out.iter_mut().map(|t| as_bytes_mut(&mut t.data)).collect();
        let (tr, _) = read_body(&mut r, &h2, &mut dst)?;
        verify_tensors(7, &tr, &out).map_err(StreamError::Corrupt)?;
        assert_eq!(tr.full_sha256.unwrap(), full_digest(&out));
        Ok(WeightSnapshot { version: 7, tensors: out })
    }

    #[test]
    fn stream_roundtrip_is_exact() {
        let got = roundtrip(Faults::default()).unwrap();
        assert_eq!(got, snap(&[3000, 1, 5000, 2048], 7));
    }

    #[test]
    fn corrupted_bucket_is_refused() {
        let e = roundtrip(Faults { corrupt_bucket: Some(3) }).unwrap_err();
        assert!(e.to_string().contains("bucket 3 failed its CRC-32"), "{e}");
    }

    #[test]
    fn shards_cover_all_tensors_in_order() {
        let s = snap(&[10, 10, 10, 10, 100, 1], 0);
        for k in 1..=8 {
            let r = shard_ranges(&s, k);
            assert_eq!(r.first().unwrap().start, 0);
            assert_eq!(r.last().unwrap().end, 6);
            for w in r.windows(2) {
                assert_eq!(w[0].end, w[1].start);
                assert!(w[0].start < w[0].end);
            }
            assert_eq!(r.len(), k.min(6));
        }
    }
}
