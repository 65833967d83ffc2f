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
use std::io::{self, BufReader, BufWriter, Write};
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
    cfg: TransportConfig,
    prev: Option<WeightSnapshot>,
}

impl DeltaPublisher {
    pub fn new(dir: PathBuf, cfg: TransportConfig) -> Self {
        DeltaPublisher { dir, cfg, prev: None }
    }
}

fn write_atomic(path: &Path, fill: impl FnOnce(&mut BufWriter<fs::File>) -> io::Result<()>) -> io::Result<()> {
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    let res = (|| {
        let mut w = BufWriter::with_capacity(1 << 20, fs::File::create(&tmp)?);
        fill(&mut w)?;
        w.flush()?;
        w.get_ref().sync_all()?;
        drop(w);
        fs::rename(&tmp, path)?;
        if let Some(parent) = path.parent() {
            if let Ok(d) = fs::File::open(parent) {
                let _ = d.sync_all();
            }
        }
        Ok(())
    })();
    if res.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    res
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

/// Writes `snap` as a full stream (the local copy and full entries share this format).
pub fn write_full(path: &Path, token: &str, snap: &WeightSnapshot, bucket: u64, verify_full: bool) -> io::Result<u64> {
    let h = Header::whole(token, snap, bucket);
    let trailer = Trailer::of(snap, 0..snap.tensors.len(), verify_full.then(|| wire::full_digest(&snap.tensors)));
    write_atomic(path, |w| {
        wire::write_header(w, &h)?;
        let pieces: Vec<&[u8]> = snap.tensors.iter().map(|t| wire::as_bytes(&t.data)).collect();
        wire::write_body(w, &pieces, bucket, &trailer, wire::Faults::default())?;
        Ok(())
    })?;
    Ok(snap.bytes() as u64)
}

impl WeightPublisher for DeltaPublisher {
    fn name(&self) -> &'static str {
        "disk_delta"
    }

    /// Writes the version's file and the index; engines patch when the controller activates them.
    fn publish(&mut self, snap: &WeightSnapshot, targets: &[Target]) -> Result<TransferReport, TransferError> {
        let started = Instant::now();
        let err = |m: String| TransferError { worker_id: "trainer".into(), message: m };
        fs::create_dir_all(&self.dir).map_err(|e| err(format!("cannot create {}: {e}", self.dir.display())))?;
        let mut index = read_index(&self.dir).map_err(|e| err(e.to_string()))?;
        index.entries.retain(|e| e.version < snap.version);
        let base = match &self.prev {
            Some(p) if same_layout(p, snap) && p.version < snap.version && snap.version % FULL_EVERY != 0 => {
                index.entries.last().filter(|e| e.version == p.version).map(|_| p)
            }
            _ => None,
        };
        let (file, bytes, buckets) = match base {
            None => {
                let file = format!("v{:010}.full", snap.version);
                let b = write_full(
                    &self.dir.join(&file),
                    &self.cfg.token,
                    snap,
                    self.cfg.bucket_bytes,
                    self.cfg.verify_full,
                )
                .map_err(|e| err(format!("cannot write {file}: {e}")))?;
                (file, b, 0)
            }
            Some(base) => {
                let file = format!("v{:010}.delta", snap.version);
                // Only tensors that changed travel; their payload is new XOR old.
                let changed: Vec<usize> =
                    (0..snap.tensors.len()).filter(|&i| snap.tensors[i].data != base.tensors[i].data).collect();
                let xors: Vec<Vec<f32>> = changed
                    .iter()
                    .map(|&i| {
                        snap.tensors[i]
                            .data
                            .iter()
                            .zip(&base.tensors[i].data)
                            .map(|(a, b)| f32::from_bits(a.to_bits() ^ b.to_bits()))
                            .collect()
                    })
                    .collect();
                let h = Header {
                    delta_base: Some(base.version),
                    ..Header::part(&self.cfg.token, snap, self.cfg.bucket_bytes, (0, 1), changed.iter().copied())
                };
                // CRCs of the patched result, all tensors: what the host must end up with.
                let full = self.cfg.verify_full.then(|| wire::full_digest(&snap.tensors));
                let trailer = Trailer::of(snap, 0..snap.tensors.len(), full);
                let mut nb = 0;
                write_atomic(&self.dir.join(&file), |w| {
                    wire::write_header(w, &h)?;
                    let pieces: Vec<&[u8]> = xors.iter().map(|x| wire::as_bytes(x)).collect();
                    nb = wire::write_body(w, &pieces, self.cfg.bucket_bytes, &trailer, self.cfg.faults)?;
                    Ok(())
                })
                .map_err(|e| err(format!("cannot write {file}: {e}")))?;
                (file, xors.iter().map(|x| x.len() as u64 * 4).sum(), nb)
            }
        };
        index.entries.push(Entry { version: snap.version, base: base.map(|b| b.version), file, bytes });
        // Drop what precedes the newest full snapshot: no chain needs it any more.
        if let Some(k) = index.entries.iter().rposition(|e| e.base.is_none()) {
            for old in index.entries.drain(..k) {
                let _ = fs::remove_file(self.dir.join(&old.file));
            }
        }
        let text = serde_json::to_vec_pretty(&index).map_err(|e| err(e.to_string()))?;
        write_atomic(&self.dir.join("index.json"), |w| w.write_all(&text))
            .map_err(|e| err(format!("cannot write the index: {e}")))?;
        match &mut self.prev {
            Some(p) if same_layout(p, snap) => {
                for (d, s) in p.tensors.iter_mut().zip(&snap.tensors) {
                    d.data.copy_from_slice(&s.data);
                }
                p.version = snap.version;
            }
            _ => self.prev = Some(snap.clone()),
        }
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
    current: Option<WeightSnapshot>,
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
        let current = read_stream(&local, token, None).ok().map(|x| x.0);
        Ok(DeltaReceiver { local, token: token.into(), current, last_bytes_read: 0, last_full_checked: false })
    }

    pub fn version(&self) -> Option<u64> {
        self.current.as_ref().map(|c| c.version)
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
                Ok((s, full_checked)) => {
                    self.last_full_checked = full_checked;
                    self.last_bytes_read += e.bytes;
                    self.current = Some(s);
                }
                Err(m) => {
                    // The local copy on disk is still the last good version: start from it again.
                    self.current = read_stream(&self.local, &self.token, None).ok().map(|x| x.0);
                    return Err(m);
                }
            }
        }
        let cur = self.current.as_ref().ok_or("no weights")?;
        // The whole-weights digest is checked in `check` whenever the trainer wrote one; asking
        // for it here makes its absence an error rather than a silent skip.
        if verify_full && !self.last_full_checked {
            return Err(format!("version {version}: full verification asked for, but the trainer published no digest"));
        }
        if start < upto.len() {
            write_full(&self.local, &self.token, cur, 64 << 20, false)
                .map_err(|e| format!("cannot write the local copy {}: {e}", self.local.display()))?;
        }
        Ok(cur)
    }
}

/// Reads one full or delta file; a delta is applied to `base` (which must be its base version).
fn read_stream(path: &Path, token: &str, base: Option<WeightSnapshot>) -> Result<(WeightSnapshot, bool), String> {
    let f = fs::File::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    let mut r = BufReader::with_capacity(1 << 20, f);
    let h = wire::read_header(&mut r).map_err(|e| format!("{}: {e}", path.display()))?;
    if !crate::auth::token_eq(&h.token, token) {
        return Err(format!("{} belongs to another run (token differs); refused", path.display()));
    }
    let mut snap = match (h.delta_base, base) {
        (None, reuse) => {
            let mut pool = reuse.map(|b| b.tensors).unwrap_or_default();
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
            WeightSnapshot { version: h.version, tensors }
        }
        (Some(b), Some(base)) if base.version == b => base,
        (Some(b), other) => {
            return Err(format!(
                "{} patches version {b}, but the local copy is {}",
                path.display(),
                other.map(|o| o.version.to_string()).unwrap_or_else(|| "missing".into())
            ))
        }
    };
    if h.delta_base.is_some() {
        let mut xors: Vec<Vec<f32>> = h.tensors.iter().map(|m| vec![0.0; m.elems()]).collect();
        let mut dst: Vec<&mut [u8]> = xors.iter_mut().map(|x| wire::as_bytes_mut(x)).collect();
        let (trailer, _) = wire::read_body(&mut r, &h, &mut dst).map_err(|e| format!("{}: {e}", path.display()))?;
        for (m, x) in h.tensors.iter().zip(&xors) {
            let t = snap
                .tensors
                .get_mut(m.index as usize)
                .ok_or_else(|| format!("{}: bad tensor index", path.display()))?;
            if t.data.len() != x.len() || t.name != m.name {
                return Err(format!("{}: tensor {} does not match the local copy", path.display(), m.name));
            }
            for (d, s) in t.data.iter_mut().zip(x) {
                *d = f32::from_bits(d.to_bits() ^ s.to_bits());
            }
        }
        snap.version = h.version;
        let full = check(&snap, &trailer, path)?;
        Ok((snap, full))
    } else {
        let mut dst: Vec<&mut [u8]> = snap.tensors.iter_mut().map(|t| wire::as_bytes_mut(&mut t.data)).collect();
        let (trailer, _) = wire::read_body(&mut r, &h, &mut dst).map_err(|e| format!("{}: {e}", path.display()))?;
        let full = check(&snap, &trailer, path)?;
        Ok((snap, full))
    }
}

/// Per-tensor CRCs, then the whole-weights digest if present (returns whether it was).
fn check(snap: &WeightSnapshot, trailer: &Trailer, path: &Path) -> Result<bool, String> {
    wire::verify_tensors(snap.version, trailer, &snap.tensors).map_err(|m| format!("{}: {m}", path.display()))?;
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
}
