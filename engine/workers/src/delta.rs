//! The disk-delta transport: for setups with no shared fabric between trainer and engines, only a
//! shared directory.
//!
//! The trainer publishes each version as a file in the directory: a full snapshot at the first
//! publish and every `FULL_EVERY` versions, otherwise the delta against the previous version
//! (`new XOR old`, bit for bit, only for the tensors that changed). `index.json` lists the files;
//! every file and the index are written atomically (temporary file, fsync, rename), so a reader
//! never sees half a version. Each rollout host keeps a local copy, patches it along the chain of
//! deltas, checks every tensor's CRC-32 of the patched result (and optionally a SHA-256 of the
//! whole weights), writes the new local copy atomically and reloads.

use crate::transport::{Target, TransferError, TransferReport, TransportConfig, WeightPublisher};
use crate::wire::{self, Header, Trailer};
use miles_runtime::{NamedTensor, WeightSnapshot};
use serde::{Deserialize, Serialize};
use std::fs;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// A full snapshot every this many versions bounds the chain a new host has to replay.
pub const FULL_EVERY: u64 = 10;

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Index {
    pub entries: Vec<Entry>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Entry {
    pub version: u64,
    /// None: a full snapshot.
    pub base: Option<u64>,
    pub file: String,
    pub bytes: u64,
}

pub struct DeltaPublisher {
    dir: PathBuf,
    /// The publisher's configuration (faults included: the tests flip a bucket through it).
    pub cfg: TransportConfig,
    /// The last version published, and the CRC-32 of each of its tensors.
    prev: Option<(WeightSnapshot, Vec<u32>)>,
}

impl DeltaPublisher {
    pub fn new(dir: PathBuf, cfg: TransportConfig) -> Self {
        DeltaPublisher { dir, cfg, prev: None }
    }
}

/// Writes `path` through a temporary file renamed over it (`atomic_write::write_with`: one fsync
/// of the file after its last byte, never per bucket); the caller syncs the directory once for
/// all the renames of a publish.
fn write_atomic(path: &Path, fill: impl FnOnce(&mut BufWriter<fs::File>) -> io::Result<()>) -> io::Result<()> {
    miles_runtime::atomic_write::write_with(path, fill)
}

/// The host's local copy, written into the spare slot (`weights.bin.spare`, the version before the
/// current one) in place and then swapped with `weights.bin` in one atomic `renameat2`
/// (RENAME_EXCHANGE). Why not a new temporary file per version: its pages are fresh page cache
/// (measured 1-5 s per GB on this VM, a recycled page 0.1-0.3 s) and ext4 starts writing a file
/// renamed over another at once (`auto_da_alloc`), in front of the publisher's next fsync.
/// `weights.bin` is never written in place, so it is always one whole version (or, after a crash,
/// torn by the missing fsync: it is verified whenever read); a failed write leaves it as it was.
fn write_local_copy(local: &Path, token: &str, snap: &WeightSnapshot) -> io::Result<()> {
    let spare = local.with_extension("bin.spare");
    let h = Header::whole(token, snap, 64 << 20);
    let res = (|| {
        let f = fs::OpenOptions::new().write(true).create(true).truncate(false).open(&spare)?;
        let mut w = BufWriter::with_capacity(64 << 10, f);
        wire::write_header(&mut w, &h)?;
        wire::write_tensors(&mut w, snap, 0..snap.tensors.len(), 64 << 20, None, wire::Faults::default())?;
        let mut f = w.into_inner().map_err(|e| e.into_error())?;
        // The previous content may have been longer.
        let len = io::Seek::stream_position(&mut f)?;
        f.set_len(len)?;
        drop(f);
        exchange(&spare, local)
    })();
    if res.is_err() {
        let _ = fs::remove_file(&spare);
    }
    res
}

/// Swaps `from` and `to` atomically; a plain rename where there is nothing to swap with yet (or
/// the filesystem cannot exchange).
fn exchange(from: &Path, to: &Path) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &Path| std::ffi::CString::new(p.as_os_str().as_bytes()).map_err(io::Error::other);
    let (a, b) = (c(from)?, c(to)?);
    // SAFETY: two valid NUL-terminated paths, relative to the working directory.
    let r = unsafe { libc::renameat2(libc::AT_FDCWD, a.as_ptr(), libc::AT_FDCWD, b.as_ptr(), libc::RENAME_EXCHANGE) };
    if r == 0 {
        return Ok(());
    }
    fs::rename(from, to)
}

/// Drops the cached pages of a file the trainer wrote and never reads back (hosts read it; it stays
/// on disk): the next version's file reuses them at once. A hint only; errors are ignored.
fn drop_cached(path: &Path) {
    use std::os::fd::AsRawFd;
    if let Ok(f) = fs::File::open(path) {
        // SAFETY: a valid open descriptor; the call only advises the kernel.
        unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    }
}

/// The bytes of the tensors whose `picked` flag is set, in order: what a delta's XOR pass reads
/// (the publisher's previous version) or patches (the host's copy).
fn picked_bytes_mut<'a>(tensors: &'a mut [NamedTensor], picked: &[bool]) -> Vec<&'a mut [u8]> {
    tensors.iter_mut().zip(picked).filter(|(_, &p)| p).map(|(t, _)| wire::as_bytes_mut(&mut t.data)).collect()
}

fn sync_dir(dir: &Path) {
    if let Ok(d) = fs::File::open(dir) {
        let _ = d.sync_all();
    }
}

fn same_layout(a: &WeightSnapshot, b: &WeightSnapshot) -> bool {
    a.tensors.len() == b.tensors.len()
        && a.tensors.iter().zip(&b.tensors).all(|(x, y)| x.name == y.name && x.shape == y.shape)
}

pub fn read_index(dir: &Path) -> io::Result<Index> {
    let p = dir.join("index.json");
    match fs::read(&p) {
        Ok(b) => serde_json::from_slice(&b)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{}: {e}", p.display()))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Index::default()),
        Err(e) => Err(e),
    }
}

/// Writes `snap` as a full stream (the local copy and full entries share this format), each
/// bucket once with its CRC and the per-tensor CRCs computed in the same pass, fsynced once.
pub fn write_full(path: &Path, token: &str, snap: &WeightSnapshot, bucket: u64, verify_full: bool) -> io::Result<u64> {
    let full = verify_full.then(|| wire::full_digest(&snap.tensors));
    write_full_with(path, token, snap, bucket, full, wire::Faults::default())?;
    if let Some(parent) = path.parent() {
        sync_dir(parent);
    }
    Ok(snap.bytes() as u64)
}

/// Returns the number of buckets and the CRC-32 of every tensor written.
fn write_full_with(
    path: &Path,
    token: &str,
    snap: &WeightSnapshot,
    bucket: u64,
    full: Option<String>,
    faults: wire::Faults,
) -> io::Result<(u32, Vec<u32>)> {
    let h = Header::whole(token, snap, bucket);
    let mut out = (0, Vec::new());
    write_atomic(path, |w| {
        wire::write_header(w, &h)?;
        let (b, t) = wire::write_tensors(w, snap, 0..snap.tensors.len(), bucket, full, faults)?;
        out = (b, t.tensor_crc.into_iter().map(|x| x.1).collect());
        Ok(())
    })?;
    Ok(out)
}

/// The payload of a delta, produced chunk by chunk: `new XOR old` into a reused scratch chunk,
/// while `old` becomes `new` (the publisher's copy of the last version, updated in the same pass)
/// and the new bytes' CRC-32 is taken (the trailer's check of the patched result).
struct XorSource<'a> {
    new: Vec<&'a [u8]>,
    old: Vec<&'a mut [u8]>,
    scratch: Vec<u8>,
    new_crc: Vec<crc32fast::Hasher>,
}

impl wire::Source for XorSource<'_> {
    fn chunk(&mut self, piece: usize, range: std::ops::Range<usize>) -> &[u8] {
        let n = &self.new[piece][range.clone()];
        let o = &mut self.old[piece][range.clone()];
        let s = &mut self.scratch[..range.len()];
        self.new_crc[piece].update(n);
        for ((s, n), o) in s.iter_mut().zip(n).zip(o.iter_mut()) {
            *s = n ^ *o;
            *o = *n;
        }
        s
    }
}

impl WeightPublisher for DeltaPublisher {
    fn name(&self) -> &'static str {
        "disk_delta"
    }

    /// Writes the version's file and the index; engines patch when the controller activates them.
    /// A failed write (a full disk) leaves the directory at the previous version: the temporary
    /// file is removed, the index is not touched, and the next publish writes a full snapshot.
    fn publish(&mut self, snap: &WeightSnapshot, targets: &[Target]) -> Result<TransferReport, TransferError> {
        let started = Instant::now();
        let err = |m: String| TransferError { worker_id: "trainer".into(), message: m };
        fs::create_dir_all(&self.dir).map_err(|e| err(format!("cannot create {}: {e}", self.dir.display())))?;
        let mut index = read_index(&self.dir).map_err(|e| err(e.to_string()))?;
        index.entries.retain(|e| e.version < snap.version);
        // Taken out: a write that fails halfway leaves it half-updated, so it is only put back
        // after a success (else the next publish is a full one).
        let prev = self.prev.take();
        let base = match prev {
            Some((p, crcs))
                if same_layout(&p, snap)
                    && p.version < snap.version
                    && snap.version % FULL_EVERY != 0
                    && index.entries.last().is_some_and(|e| e.version == p.version) =>
            {
                Ok((p, crcs))
            }
            other => Err(other),
        };
        // Hosts have read the earlier files (a late one reads them from disk): their cached pages
        // are memory for this version's file (fresh page cache costs several times a recycled
        // page on this VM).
        for e in &index.entries {
            drop_cached(&self.dir.join(&e.file));
        }
        let (file, bytes, buckets, base_version, next_prev) = match base {
            Err(old) => {
                let file = format!("v{:010}.full", snap.version);
                let full = self.cfg.verify_full.then(|| wire::full_digest(&snap.tensors));
                let (nb, crcs) = write_full_with(
                    &self.dir.join(&file),
                    &self.cfg.token,
                    snap,
                    self.cfg.bucket_bytes,
                    full,
                    self.cfg.faults,
                )
                .map_err(|e| err(format!("cannot write {file}: {e}; the previous version stays published")))?;
                let kept = match old {
                    Some((mut p, _)) if same_layout(&p, snap) => {
                        for (d, s) in p.tensors.iter_mut().zip(&snap.tensors) {
                            d.data.copy_from_slice(&s.data);
                        }
                        p.version = snap.version;
                        p
                    }
                    _ => snap.clone(),
                };
                (file, snap.bytes() as u64, nb, None, (kept, crcs))
            }
            Ok((mut base, base_crc)) => {
                let file = format!("v{:010}.delta", snap.version);
                // Only tensors that changed travel (compared bit for bit); their payload is
                // new XOR old.
                let changed: Vec<usize> = (0..snap.tensors.len())
                    .filter(|&i| wire::as_bytes(&snap.tensors[i].data) != wire::as_bytes(&base.tensors[i].data))
                    .collect();
                let h = Header {
                    delta_base: Some(base.version),
                    ..Header::part(&self.cfg.token, snap, self.cfg.bucket_bytes, (0, 1), changed.iter().copied())
                };
                let full = self.cfg.verify_full.then(|| wire::full_digest(&snap.tensors));
                let base_version = base.version;
                let lens: Vec<usize> = changed.iter().map(|&i| snap.tensors[i].data.len() * 4).collect();
                let mut is_changed = vec![false; snap.tensors.len()];
                for &i in &changed {
                    is_changed[i] = true;
                }
                let mut src = XorSource {
                    new: changed.iter().map(|&i| wire::as_bytes(&snap.tensors[i].data)).collect(),
                    old: picked_bytes_mut(&mut base.tensors, &is_changed),
                    scratch: vec![0u8; wire::CHUNK],
                    new_crc: changed.iter().map(|_| crc32fast::Hasher::new()).collect(),
                };
                let mut nb = 0;
                let mut crcs = base_crc;
                write_atomic(&self.dir.join(&file), |w| {
                    wire::write_header(w, &h)?;
                    nb = wire::write_payload(w, &lens, &mut src, self.cfg.bucket_bytes, self.cfg.faults)?.0;
                    // CRCs of the patched result, all tensors: what the host must end up with
                    // (an unchanged tensor keeps the CRC it had).
                    for (&i, hsh) in changed.iter().zip(std::mem::take(&mut src.new_crc)) {
                        crcs[i] = hsh.finalize();
                    }
                    let trailer = Trailer {
                        tensor_crc: crcs.iter().enumerate().map(|(i, &c)| (i as u32, c)).collect(),
                        full_sha256: full,
                    };
                    wire::write_trailer(w, &trailer)
                })
                .map_err(|e| err(format!("cannot write {file}: {e}; the previous version stays published")))?;
                drop(src);
                base.version = snap.version;
                (file, lens.iter().sum::<usize>() as u64, nb, Some(base_version), (base, crcs))
            }
        };
        index.entries.push(Entry { version: snap.version, base: base_version, file, bytes });
        // Drop what precedes the newest full snapshot (no chain needs it any more), but only once
        // the new index no longer lists it.
        let dropped: Vec<Entry> = match index.entries.iter().rposition(|e| e.base.is_none()) {
            Some(k) => index.entries.drain(..k).collect(),
            None => Vec::new(),
        };
        let text = serde_json::to_vec_pretty(&index).map_err(|e| err(e.to_string()))?;
        write_atomic(&self.dir.join("index.json"), |w| w.write_all(&text))
            .map_err(|e| err(format!("cannot write the index: {e}; the previous version stays published")))?;
        // One directory sync for both renames.
        sync_dir(&self.dir);
        for old in dropped {
            let _ = fs::remove_file(self.dir.join(&old.file));
        }
        self.prev = Some(next_prev);
        let report = TransferReport {
            transport: "disk_delta".into(),
            version: snap.version,
            bytes,
            targets: targets.len() as u32,
            buckets,
            ..Default::default()
        };
        Ok(report.finish(started))
    }
}

/// A rollout host's side: its local copy, patched along the published chain.
pub struct DeltaReceiver {
    local: PathBuf,
    token: String,
    /// The verified weights and the CRC-32 of each tensor.
    current: Option<(WeightSnapshot, Vec<u32>)>,
    /// Bytes read from the shared directory by the last `activate`.
    pub last_bytes_read: u64,
    last_full_checked: bool,
}

impl DeltaReceiver {
    /// `local_dir` holds this host's copy (`weights.bin`); a copy left by an earlier process is
    /// reused if it verifies.
    pub fn new(local_dir: &Path, token: &str) -> io::Result<DeltaReceiver> {
        fs::create_dir_all(local_dir)?;
        let local = local_dir.join("weights.bin");
        let current = read_stream(&local, token, None).ok().map(|x| (x.0, x.2));
        Ok(DeltaReceiver { local, token: token.into(), current, last_bytes_read: 0, last_full_checked: false })
    }

    pub fn version(&self) -> Option<u64> {
        self.current.as_ref().map(|c| c.0.version)
    }

    /// Brings the local copy to `version` from `dir` and returns it, verified.
    pub fn activate(&mut self, dir: &Path, version: u64, verify_full: bool) -> Result<&WeightSnapshot, String> {
        self.last_bytes_read = 0;
        let index = read_index(dir).map_err(|e| format!("cannot read {}/index.json: {e}", dir.display()))?;
        let upto: Vec<&Entry> = index.entries.iter().filter(|e| e.version <= version).collect();
        if upto.last().map(|e| e.version) != Some(version) {
            return Err(format!("version {version} is not published in {}", dir.display()));
        }
        // The chain: from our local version if the deltas continue it, else from the newest full.
        let have = self.version();
        let start = match have.and_then(|v| upto.iter().position(|e| e.base == Some(v))) {
            Some(k) if have != Some(version) => k,
            _ if have == Some(version) => upto.len(),
            _ => upto.iter().rposition(|e| e.base.is_none()).ok_or("no full snapshot to start from")?,
        };
        for e in &upto[start..] {
            let path = dir.join(&e.file);
            let base = self.current.take();
            match read_stream(&path, &self.token, base) {
                Ok((s, full_checked, crcs)) => {
                    self.last_full_checked = full_checked;
                    self.last_bytes_read += e.bytes;
                    self.current = Some((s, crcs));
                }
                Err(m) => {
                    // The local copy on disk is still the last good version: start from it again.
                    self.current = read_stream(&self.local, &self.token, None).ok().map(|x| (x.0, x.2));
                    return Err(m);
                }
            }
        }
        let cur = &self.current.as_ref().ok_or("no weights")?.0;
        // The whole-weights digest is checked in `check` whenever the trainer wrote one; asking
        // for it here makes its absence an error rather than a silent skip.
        if verify_full && !self.last_full_checked {
            return Err(format!("version {version}: full verification asked for, but the trainer published no digest"));
        }
        if start < upto.len() {
            // Not fsynced: the copy is verified whenever it is read (a copy torn by a crash fails
            // its CRCs and the host replays the chain from the newest full instead), so its
            // durability buys nothing but a second wait on the disk per version.
            write_local_copy(&self.local, &self.token, cur)
                .map_err(|e| format!("cannot write the local copy {}: {e}", self.local.display()))?;
        }
        Ok(cur)
    }
}

/// The receiving side of a delta: each chunk lands in a reused scratch buffer, is XORed into the
/// local copy in place, and the patched bytes' CRC-32 is taken while they are in cache.
struct XorSink<'a> {
    dst: Vec<&'a mut [u8]>,
    scratch: Vec<u8>,
    patched_crc: Vec<crc32fast::Hasher>,
}

impl wire::Sink for XorSink<'_> {
    fn buf(&mut self, _piece: usize, range: std::ops::Range<usize>) -> &mut [u8] {
        &mut self.scratch[..range.len()]
    }
    fn filled(&mut self, piece: usize, range: std::ops::Range<usize>) {
        let d = &mut self.dst[piece][range.clone()];
        for (d, s) in d.iter_mut().zip(&self.scratch[..range.len()]) {
            *d ^= *s;
        }
        self.patched_crc[piece].update(d);
    }
}

/// Reads one full or delta file; a delta is applied to `base` (which must be its base version).
/// Returns the verified weights, whether a whole-weights digest was checked, and every tensor's
/// CRC-32.
fn read_stream(
    path: &Path,
    token: &str,
    base: Option<(WeightSnapshot, Vec<u32>)>,
) -> Result<(WeightSnapshot, bool, Vec<u32>), String> {
    // Unbuffered: payload chunks are read straight into their destination.
    let mut r = fs::File::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    let h = wire::read_header(&mut r).map_err(|e| format!("{}: {e}", path.display()))?;
    if h.run != crate::auth::run_tag(token) {
        return Err(format!("{} belongs to another run (token differs); refused", path.display()));
    }
    let io_err = |e: wire::StreamError| match e {
        wire::StreamError::Io(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
            format!("{} is truncated; not loaded", path.display())
        }
        e => format!("{}: {e}", path.display()),
    };
    match (h.delta_base, base) {
        (None, reuse) => {
            let mut pool = reuse.map(|b| b.0.tensors).unwrap_or_default();
            let tensors = h
                .tensors
                .iter()
                .map(|m| {
                    let mut data =
                        pool.get_mut(m.index as usize).map(|t| std::mem::take(&mut t.data)).unwrap_or_default();
                    data.resize(m.elems(), 0.0);
                    NamedTensor { name: m.name.clone(), shape: m.shape.clone(), data }
                })
                .collect();
            let mut snap = WeightSnapshot { version: h.version, tensors };
            let mut dst: Vec<&mut [u8]> = snap.tensors.iter_mut().map(|t| wire::as_bytes_mut(&mut t.data)).collect();
            let lens: Vec<usize> = dst.iter().map(|d| d.len()).collect();
            let (trailer, _, crcs) =
                wire::read_payload(&mut r, &h, &lens, &mut wire::Direct(&mut dst)).map_err(io_err)?;
            let names: Vec<&str> = snap.tensors.iter().map(|t| t.name.as_str()).collect();
            wire::verify_crcs(snap.version, &trailer, &names, &crcs).map_err(|m| format!("{}: {m}", path.display()))?;
            let full = check_digest(&snap, &trailer, path)?;
            Ok((snap, full, crcs))
        }
        (Some(b), Some((mut snap, mut crcs))) if snap.version == b => {
            // The delta's tensors, in increasing index order, each matching the local copy.
            let mut wanted = vec![false; snap.tensors.len()];
            let mut last = None;
            for m in &h.tensors {
                let t = snap.tensors.get(m.index as usize);
                if t.is_none_or(|t| t.name != m.name || t.data.len() != m.elems()) || last >= Some(m.index) {
                    return Err(format!("{}: tensor {} does not match the local copy", path.display(), m.name));
                }
                last = Some(m.index);
                wanted[m.index as usize] = true;
            }
            if crcs.len() != snap.tensors.len() {
                crcs = snap.tensors.iter().map(|t| wire::crc(wire::as_bytes(&t.data))).collect();
            }
            let mut sink = XorSink {
                dst: picked_bytes_mut(&mut snap.tensors, &wanted),
                scratch: vec![0u8; wire::CHUNK],
                patched_crc: h.tensors.iter().map(|_| crc32fast::Hasher::new()).collect(),
            };
            let lens: Vec<usize> = sink.dst.iter().map(|d| d.len()).collect();
            let (trailer, _, _) = wire::read_payload(&mut r, &h, &lens, &mut sink).map_err(io_err)?;
            let XorSink { patched_crc, .. } = sink;
            for (m, hsh) in h.tensors.iter().zip(patched_crc) {
                crcs[m.index as usize] = hsh.finalize();
            }
            snap.version = h.version;
            // Every tensor of the patched result against the trailer (an unchanged tensor by the
            // CRC it was verified with).
            let names: Vec<&str> = snap.tensors.iter().map(|t| t.name.as_str()).collect();
            let in_order = trailer.tensor_crc.iter().enumerate().all(|(k, &(i, _))| i as usize == k);
            if !in_order {
                return Err(format!("{}: the trailer does not list every tensor in order", path.display()));
            }
            wire::verify_crcs(snap.version, &trailer, &names, &crcs).map_err(|m| format!("{}: {m}", path.display()))?;
            let full = check_digest(&snap, &trailer, path)?;
            Ok((snap, full, crcs))
        }
        (Some(b), other) => Err(format!(
            "{} patches version {b}, but the local copy is {}",
            path.display(),
            other.map(|o| o.0.version.to_string()).unwrap_or_else(|| "missing".into())
        )),
    }
}

/// The whole-weights digest if present (returns whether it was).
fn check_digest(snap: &WeightSnapshot, trailer: &Trailer, path: &Path) -> Result<bool, String> {
    if let Some(want) = &trailer.full_sha256 {
        if wire::full_digest(&snap.tensors) != *want {
            return Err(format!(
                "{}: the whole-weights SHA-256 differs from the trainer's; not loaded",
                path.display()
            ));
        }
    }
    Ok(trailer.full_sha256.is_some())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::TransportKind;

    fn snap(version: u64, bump: &[usize]) -> WeightSnapshot {
        let mut s = WeightSnapshot {
            version,
            tensors: (0..4)
                .map(|i| NamedTensor {
                    name: format!("w{i}"),
                    shape: vec![2, 500],
                    data: (0..1000).map(|k| (k + i) as f32 * 0.01).collect(),
                })
                .collect(),
        };
        for &i in bump {
            for x in s.tensors[i].data.iter_mut() {
                *x += version as f32 * 1e-3;
            }
        }
        s
    }

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("miles-delta-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn hosts_patch_along_the_chain_and_new_hosts_start_from_a_full() {
        let dir = tmp("chain");
        let mut cfg = TransportConfig::new(TransportKind::DiskDelta, "tok");
        cfg.verify_full = true;
        let mut p = DeltaPublisher::new(dir.join("pub"), cfg);
        let mut a = DeltaReceiver::new(&dir.join("host-a"), "tok").unwrap();
        for v in 1..=4u64 {
            let s = snap(v, &[1, 3]);
            let rep = p.publish(&s, &[]).unwrap();
            if v > 1 {
                // Two of four tensors changed: the delta carries half the weights.
                assert_eq!(rep.bytes, 2 * 1000 * 4);
            }
            assert_eq!(*a.activate(&dir.join("pub"), v, true).unwrap(), s);
        }
        // A host that joins late replays full + deltas; one restarted reuses its local copy.
        let mut b = DeltaReceiver::new(&dir.join("host-b"), "tok").unwrap();
        assert_eq!(*b.activate(&dir.join("pub"), 4, false).unwrap(), snap(4, &[1, 3]));
        let mut a2 = DeltaReceiver::new(&dir.join("host-a"), "tok").unwrap();
        assert_eq!(a2.version(), Some(4));
        p.publish(&snap(5, &[1, 3]), &[]).unwrap();
        a2.activate(&dir.join("pub"), 5, false).unwrap();
        assert_eq!(a2.last_bytes_read, 2 * 1000 * 4);
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_local_copy_is_swapped_in_whole_and_a_torn_spare_never_read() {
        let dir = tmp("spare");
        let cfg = TransportConfig::new(TransportKind::DiskDelta, "tok");
        let mut p = DeltaPublisher::new(dir.join("pub"), cfg);
        let mut a = DeltaReceiver::new(&dir.join("host"), "tok").unwrap();
        for v in 1..=3u64 {
            p.publish(&snap(v, &[2]), &[]).unwrap();
            a.activate(&dir.join("pub"), v, false).unwrap();
        }
        // The spare slot holds the version before; a write torn halfway through it (a crash)
        // leaves the current copy whole.
        let spare = dir.join("host").join("weights.bin.spare");
        assert_eq!(read_stream(&spare, "tok", None).unwrap().0, snap(2, &[2]));
        let len = fs::metadata(&spare).unwrap().len();
        fs::OpenOptions::new().write(true).open(&spare).unwrap().set_len(len / 2).unwrap();
        let mut a2 = DeltaReceiver::new(&dir.join("host"), "tok").unwrap();
        assert_eq!(a2.version(), Some(3));
        // The torn spare is rewritten whole (and to its length) with the next version.
        p.publish(&snap(4, &[2]), &[]).unwrap();
        a2.activate(&dir.join("pub"), 4, false).unwrap();
        assert_eq!(DeltaReceiver::new(&dir.join("host"), "tok").unwrap().version(), Some(4));
        assert_eq!(read_stream(&spare, "tok", None).unwrap().0, snap(3, &[2]));
        let _ = fs::remove_dir_all(&dir);
    }

    /// Published files and the host's copy carry the run's tag, never its token (they sit on a
    /// shared file system); another run's receiver refuses them.
    #[test]
    fn delta_files_carry_the_run_tag_not_the_token() {
        let dir = tmp("tag");
        let token = "s3cret-run-token-0123456789";
        let mut p = DeltaPublisher::new(dir.join("pub"), TransportConfig::new(TransportKind::DiskDelta, token));
        let mut a = DeltaReceiver::new(&dir.join("host"), token).unwrap();
        p.publish(&snap(1, &[0]), &[]).unwrap();
        a.activate(&dir.join("pub"), 1, false).unwrap();
        for sub in ["pub", "host"] {
            for f in fs::read_dir(dir.join(sub)).unwrap() {
                let bytes = fs::read(f.unwrap().path()).unwrap();
                assert!(!bytes.windows(token.len()).any(|w| w == token.as_bytes()), "the token was written in {sub}");
            }
        }
        let mut other = DeltaReceiver::new(&dir.join("other"), "another-run").unwrap();
        let e = other.activate(&dir.join("pub"), 1, false).unwrap_err();
        assert!(e.contains("belongs to another run"), "{e}");
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn corrupted_delta_is_refused_and_the_local_copy_kept() {
        let dir = tmp("corrupt");
        let cfg = TransportConfig::new(TransportKind::DiskDelta, "tok");
        let mut p = DeltaPublisher::new(dir.join("pub"), cfg.clone());
        let mut a = DeltaReceiver::new(&dir.join("host"), "tok").unwrap();
        p.publish(&snap(1, &[0]), &[]).unwrap();
        a.activate(&dir.join("pub"), 1, false).unwrap();
        p.cfg.faults.corrupt_bucket = Some(0);
        p.publish(&snap(2, &[0]), &[]).unwrap();
        let e = a.activate(&dir.join("pub"), 2, false).unwrap_err();
        assert!(e.contains("failed its CRC-32"), "{e}");
        assert_eq!(a.version(), Some(1));
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn full_disk_leaves_the_previous_version_published() {
        let dir = tmp("full");
        let cfg = TransportConfig::new(TransportKind::DiskDelta, "tok");
        let mut p = DeltaPublisher::new(dir.join("pub"), cfg);
        let mut a = DeltaReceiver::new(&dir.join("host"), "tok").unwrap();
        p.publish(&snap(1, &[0]), &[]).unwrap();
        // Version 2's temporary file is /dev/full: every write fails with ENOSPC, as on a full
        // disk.
        let tmp_file = dir.join("pub").join(format!("v{:010}.tmp-{}", 2, std::process::id()));
        std::os::unix::fs::symlink("/dev/full", &tmp_file).unwrap();
        let e = p.publish(&snap(2, &[0, 1]), &[]).unwrap_err();
        assert!(e.message.contains("v0000000002.delta") && e.message.contains("previous version stays"), "{e}");
        assert!(e.message.contains("No space left"), "{e}");
        assert!(!tmp_file.exists() && tmp_file.symlink_metadata().is_err(), "temporary file left behind");
        let index = read_index(&dir.join("pub")).unwrap();
        assert_eq!(index.entries.iter().map(|e| e.version).collect::<Vec<_>>(), vec![1]);
        assert_eq!(*a.activate(&dir.join("pub"), 1, false).unwrap(), snap(1, &[0]));
        assert!(a.activate(&dir.join("pub"), 2, false).unwrap_err().contains("not published"));
        // Space again: the next version is published (as a full: the failed delta's base is gone).
        p.publish(&snap(3, &[0, 2]), &[]).unwrap();
        let index = read_index(&dir.join("pub")).unwrap();
        assert_eq!(index.entries.last().unwrap().base, None);
        assert_eq!(*a.activate(&dir.join("pub"), 3, false).unwrap(), snap(3, &[0, 2]));
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn truncated_delta_is_refused_and_the_local_copy_kept() {
        let dir = tmp("trunc");
        let cfg = TransportConfig::new(TransportKind::DiskDelta, "tok");
        let mut p = DeltaPublisher::new(dir.join("pub"), cfg);
        let mut a = DeltaReceiver::new(&dir.join("host"), "tok").unwrap();
        p.publish(&snap(1, &[0]), &[]).unwrap();
        a.activate(&dir.join("pub"), 1, false).unwrap();
        p.publish(&snap(2, &[0]), &[]).unwrap();
        let f = dir.join("pub").join(format!("v{:010}.delta", 2));
        let len = fs::metadata(&f).unwrap().len();
        fs::OpenOptions::new().write(true).open(&f).unwrap().set_len(len / 2).unwrap();
        let e = a.activate(&dir.join("pub"), 2, false).unwrap_err();
        assert!(e.contains("truncated"), "{e}");
        assert_eq!(a.version(), Some(1));
        let _ = fs::remove_dir_all(&dir);
    }
}
