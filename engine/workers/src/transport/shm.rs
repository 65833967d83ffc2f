//! Shared memory between the trainer and the engines on its host: the publisher's mapped files
//! ([`ShmFile`]) and their writer with its "written up to byte N" notices ([`ShmWriter`]); the
//! engine's side, the seal check, kept read-only mappings and the reader that follows the notices.

use super::conn::Conn;
use crate::wire;
use std::io::{self, BufReader, Read, Write};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The publisher's shared-memory file of one part: a memfd sealed against shrinking (so an engine
/// may map it: its pages can never vanish under the mapping), or a /dev/shm file where memfds are
/// unavailable (engines then read it with `pread`). Mapped once, writable, pages resident: a
/// version is memcpy'd into it, with no page faults and no per-version syscalls but the notices.
pub(super) struct ShmFile {
    file: std::fs::File,
    /// What an engine opens: /proc/<pid>/fd/<n> of the memfd, or the /dev/shm path.
    pub(super) path: String,
    /// The /dev/shm fallback is removed when the publisher goes (a memfd goes with its last fd).
    unlink: Option<PathBuf>,
    map: *mut u8,
    len: usize,
}

// SAFETY: the mapping is owned by this value alone (only the owning publisher writes through it).
unsafe impl Send for ShmFile {}

impl ShmFile {
    pub(super) fn create(name: &str) -> io::Result<ShmFile> {
        use std::os::fd::{AsRawFd, FromRawFd};
        let cname = std::ffi::CString::new(name).map_err(io::Error::other)?;
        // SAFETY: plain syscall on a valid C string; the fd is owned by the File right after.
        let fd = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
        let (file, path, unlink) = if fd >= 0 {
            // SAFETY: fd is a fresh descriptor nobody else owns.
            let file = unsafe { std::fs::File::from_raw_fd(fd) };
            // Growing stays allowed (a larger snapshot); shrinking never (an engine's mapping),
            // and nobody may add or remove seals afterwards.
            // SAFETY: fcntl on our own valid fd.
            if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK | libc::F_SEAL_SEAL) } != 0
            {
                return Err(io::Error::last_os_error());
            }
            let path = format!("/proc/{}/fd/{}", std::process::id(), file.as_raw_fd());
            (file, path, None)
        } else {
            let dir = shm_dir().ok_or_else(|| io::Error::other("shared memory needs memfd_create or /dev/shm"))?;
            let p = dir.join(name);
            let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&p)?;
            (file, p.to_string_lossy().into_owned(), Some(p))
        };
        Ok(ShmFile { file, path, unlink, map: std::ptr::null_mut(), len: 0 })
    }

    /// Makes the file and its mapping at least `len` bytes (grown by a quarter at a time).
    pub(super) fn reserve(&mut self, len: usize) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        if len <= self.len {
            return Ok(());
        }
        let len = len.max(self.len + self.len / 4).next_multiple_of(2 << 20);
        self.file.set_len(len as u64)?;
        self.unmap();
        // SAFETY: a fresh shared mapping of our own file, `len` bytes long (just sized so).
        // MAP_POPULATE: the pages are allocated and mapped once here, not faulted per version.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                self.file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        self.map = p as *mut u8;
        self.len = len;
        Ok(())
    }

    fn unmap(&mut self) {
        if !self.map.is_null() {
            // SAFETY: map/len are exactly what mmap returned; no slice into it outlives a call.
            unsafe { libc::munmap(self.map as *mut libc::c_void, self.len) };
            self.map = std::ptr::null_mut();
            self.len = 0;
        }
    }
}

impl Drop for ShmFile {
    fn drop(&mut self) {
        self.unmap();
        if let Some(p) = &self.unlink {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// One engine connection of a shared-memory publish: its header went out first, notices follow.
pub(super) struct ShmRoute {
    pub(super) target: usize,
    pub(super) sock: Conn,
    /// The first failed notice: this engine stopped reading (its verdict says why).
    pub(super) failed: Option<io::Error>,
}

/// Writes a part's stream into its mapped file and, every [`wire::READY_NOTICE`] bytes, tells
/// each engine how far it may read: the engines copy bucket k while this writes bucket k+1.
pub(super) struct ShmWriter<'a> {
    pub(super) shm: &'a mut ShmFile,
    pub(super) routes: &'a mut [ShmRoute],
    pub(super) pos: usize,
    pub(super) notified: usize,
}

impl ShmWriter<'_> {
    pub(super) fn notify(&mut self) -> io::Result<()> {
        let n = (self.pos as u64).to_le_bytes();
        for r in self.routes.iter_mut().filter(|r| r.failed.is_none()) {
            if let Err(e) = r.sock.write_all(&n) {
                r.failed = Some(e);
            }
        }
        self.notified = self.pos;
        if self.routes.iter().all(|r| r.failed.is_some()) {
            return Err(io::Error::new(io::ErrorKind::BrokenPipe, "every engine of this part stopped reading"));
        }
        Ok(())
    }
}

impl Write for ShmWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let end = self.pos + buf.len();
        self.shm.reserve(end)?;
        // Plain stores (not streaming ones): the engine copies these bytes a few MB behind, while
        // they may still be in the shared cache (measured: streaming stores made it slower).
        // SAFETY: [pos, end) lies inside the mapping (just reserved); `buf` is ours, not in it.
        unsafe { std::ptr::copy_nonoverlapping(buf.as_ptr(), self.shm.map.add(self.pos), buf.len()) };
        self.pos = end;
        if self.pos - self.notified >= wire::READY_NOTICE {
            self.notify()?;
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

pub(super) fn shm_dir() -> Option<PathBuf> {
    let d = PathBuf::from("/dev/shm");
    d.is_dir().then_some(d)
}

/// Whether `f` is a tmpfs memfd sealed against shrinking: mapped, its pages cannot vanish (no
/// SIGBUS), and it is not hugetlbfs (whose faults may SIGBUS when the pool runs dry).
pub(super) fn sealed_shmem(f: &std::fs::File) -> bool {
    use std::os::fd::AsRawFd;
    // SAFETY: fcntl and fstatfs on a valid fd into a zeroed struct of the right type.
    unsafe {
        let seals = libc::fcntl(f.as_raw_fd(), libc::F_GET_SEALS);
        let mut st: libc::statfs = std::mem::zeroed();
        seals >= 0
            && seals & libc::F_SEAL_SHRINK != 0
            && libc::fstatfs(f.as_raw_fd(), &mut st) == 0
            && st.f_type == libc::TMPFS_MAGIC
    }
}

/// A read-only shared mapping of a whole sealed memfd.
pub(super) struct Mapping {
    ptr: *const u8,
    pub(super) len: usize,
}

// SAFETY: the mapping is only read (through `ptr::copy`), never freed while an Arc holds it.
unsafe impl Send for Mapping {}
unsafe impl Sync for Mapping {}

impl Mapping {
    pub(super) fn new(f: &std::fs::File, len: usize) -> io::Result<Mapping> {
        use std::os::fd::AsRawFd;
        if len == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the file is empty"));
        }
        // SAFETY: a fresh read-only mapping of `len` bytes of a file at least that long that can
        // no longer shrink (sealed), so every page stays backed. MAP_POPULATE: mapped once here
        // rather than faulted in during every version's copy.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                f.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping { ptr: p as *const u8, len })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: exactly what mmap returned; the last Arc is gone.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

pub(super) struct ShmMap {
    /// (device, inode) of the file.
    pub(super) key: (u64, u64),
    pub(super) map: Arc<Mapping>,
    /// The newest version read through it.
    pub(super) last: u64,
}

/// Reads a published shared-memory stream: from the kept mapping or with `pread`, never past
/// what the publisher's notices announced (with notices) or the file's end (without).
pub(super) struct ShmReader<'a, 'b> {
    pub(super) f: std::fs::File,
    pub(super) map: Option<Arc<Mapping>>,
    pub(super) maps: &'a Mutex<Vec<ShmMap>>,
    pub(super) version: u64,
    pub(super) pos: u64,
    /// Bytes the publisher has written (u64::MAX without notices: the whole file).
    pub(super) ready: u64,
    pub(super) notices: Option<&'a mut BufReader<&'b mut Conn>>,
    pub(super) timeout: Duration,
}

impl ShmReader<'_, '_> {
    /// Waits (bounded by the socket's timeout) until the publisher announces bytes past `pos`.
    fn wait_ready(&mut self) -> io::Result<()> {
        let Some(sock) = self.notices.as_mut() else { return Ok(()) };
        while self.ready <= self.pos {
            let mut n = [0u8; 8];
            sock.read_exact(&mut n).map_err(|e| match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("the publisher stalled mid-transfer (nothing for {:.1} s)", self.timeout.as_secs_f64()),
                ),
                _ => io::Error::other(format!("the publisher vanished mid-transfer ({e})")),
            })?;
            self.ready = self.ready.max(u64::from_le_bytes(n));
            // Notices already here: take the newest at once.
            while sock.buffer().len() >= 8 {
                sock.read_exact(&mut n)?;
                self.ready = self.ready.max(u64::from_le_bytes(n));
            }
        }
        if let Some(old) = self.map.clone() {
            if self.ready > old.len as u64 {
                // The file grew (a larger snapshot): map it again, whole.
                let size = self.f.metadata()?.len();
                if size < self.ready {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("the publisher announced byte {} of a {size}-byte file", self.ready),
                    ));
                }
                let m = Arc::new(Mapping::new(&self.f, size as usize)?);
                let mut maps = self.maps.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(e) = maps.iter_mut().find(|e| Arc::ptr_eq(&e.map, &old)) {
                    e.map = m.clone();
                    e.last = e.last.max(self.version);
                }
                self.map = Some(m);
            }
        }
        Ok(())
    }
}

impl Read for ShmReader<'_, '_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        if self.pos >= self.ready {
            self.wait_ready()?;
        }
        let n = buf.len().min((self.ready - self.pos).min(usize::MAX as u64) as usize);
        let k = match &self.map {
            Some(m) => {
                // wait_ready keeps `ready` within the mapping.
                // SAFETY: [pos, pos + n) lies inside the mapping of a file that cannot shrink;
                // the publisher has finished writing those bytes (notified) and does not touch
                // them again in this version. What was copied is verified (CRC) in `buf`.
                unsafe { std::ptr::copy_nonoverlapping(m.ptr.add(self.pos as usize), buf.as_mut_ptr(), n) };
                n
            }
            None => {
                use std::os::unix::fs::FileExt;
                self.f.read_at(&mut buf[..n], self.pos)?
            }
        };
        self.pos += k as u64;
        Ok(k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::tests::{snap, targets};
    use crate::transport::{Channel, Receiver, StreamPublisher, TransportConfig, TransportKind, WeightPublisher};

    #[test]
    fn shared_memory_grows_with_the_snapshot_and_serves_p2p_parts() {
        let rx: Vec<Receiver> = (0..2).map(|_| Receiver::start("127.0.0.1:0", "tok").unwrap()).collect();
        let mut cfg = TransportConfig::new(TransportKind::P2p, "tok");
        cfg.bucket_bytes = 1 << 20;
        cfg.channel = Channel::Shm;
        let mut p = StreamPublisher::new(cfg);
        // The second version is larger than the files sized for the first: they grow, and each
        // engine maps them again.
        for (v, elems) in [(1, vec![1000, 2000]), (2, vec![1_500_000, 1_200_000]), (3, vec![1000, 2000])] {
            let s = snap(v, &elems);
            p.publish(&s, &targets(&rx)).unwrap();
            for r in &rx {
                let got = r.take(v, Duration::from_secs(10)).unwrap();
                assert_eq!(got, s);
                r.recycle(got);
            }
        }
        // The engines read through a mapping: the publisher's files are sealed memfds.
        assert!(p.shm.iter().all(|f| f.unlink.is_none() && sealed_shmem(&f.file)), "memfd expected");
        let plain = std::env::temp_dir().join(format!("miles-test-plain-{}", std::process::id()));
        std::fs::write(&plain, b"x").unwrap();
        assert!(!sealed_shmem(&std::fs::File::open(&plain).unwrap()));
        let _ = std::fs::remove_file(&plain);
    }
}
