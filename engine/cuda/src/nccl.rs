//! NCCL through cudarc with dynamic loading: one communicator per transfer, one rank per process
//! and GPU, byte chunks broadcast from rank 0 through a device buffer and a pinned host buffer.
//!
//! [`available`] looks for the CUDA driver, a GPU and libnccl (and every NCCL symbol this module
//! calls) before any call: cudarc panics on a missing library or symbol. Every wait is bounded:
//! the communicator is made non-blocking, and joining or a broadcast that passes its deadline
//! aborts the communicator (`ncclCommAbort`) and answers [`CommError::timed_out`].

use crate::Unavailable;
use cudarc::driver::{result as cu, sys as cusys};
use cudarc::nccl::sys;
use std::time::{Duration, Instant};

/// The library's name, for messages (cudarc also tries libnccl.so and versioned names).
pub const LIBRARY: &str = "libnccl.so.2 (NCCL)";

/// What this module calls, all present since NCCL 2.14 (the first with non-blocking init).
const SYMBOLS: &[&str] = &[
    "ncclGetVersion",
    "ncclGetUniqueId",
    "ncclCommInitRankConfig",
    "ncclCommGetAsyncError",
    "ncclBroadcast",
    "ncclCommFinalize",
    "ncclCommDestroy",
    "ncclCommAbort",
    "ncclGetErrorString",
];

/// The NCCL version (e.g. 22105 for 2.21.5) where the driver, at least one GPU and libnccl with
/// every symbol used here are present; else what is missing, every missing library named.
pub fn available() -> Result<i32, Unavailable> {
    let mut missing = Vec::new();
    match crate::devices() {
        Ok(g) if g.is_empty() => missing.push("a GPU (the CUDA driver shows none to this process)".to_string()),
        Ok(_) => {}
        Err(e) => missing.push(e.reason),
    }
    // SAFETY: only tries to open the library; no NCCL function is called.
    if !unsafe { sys::is_culib_present() } {
        missing.push(format!("{LIBRARY} is not installed or not on the loader's path"));
    } else {
        // SAFETY: the library is present (checked above), so culib() opens it without panicking;
        // `get` only looks a symbol up.
        let lib = unsafe { sys::culib() };
        let absent: Vec<&str> = SYMBOLS
            .iter()
            .copied()
            .filter(|s| unsafe { lib.get::<unsafe extern "C" fn()>(s.as_bytes()) }.is_err())
            .collect();
        if !absent.is_empty() {
            missing.push(format!("{LIBRARY} lacks {} (NCCL 2.14 or newer is needed)", absent.join(", ")));
        }
    }
    if !missing.is_empty() {
        return Err(Unavailable { reason: missing.join("; ") });
    }
    cudarc::nccl::result::get_nccl_version()
        .map_err(|e| Unavailable { reason: format!("ncclGetVersion failed: {}", text(e.0)) })
}

/// The GPU ordinal this process gives NCCL: `MILES_CUDA_DEVICE` when set (an ordinal among the
/// GPUs `CUDA_VISIBLE_DEVICES` leaves visible), else 0, the first visible one.
pub fn device_ordinal() -> Result<u32, Unavailable> {
    match std::env::var("MILES_CUDA_DEVICE") {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse()
            .map_err(|_| Unavailable { reason: format!("MILES_CUDA_DEVICE={v:?} is not a GPU ordinal (0, 1, ...)") }),
        _ => Ok(0),
    }
}

/// The UUID of GPU `ordinal` ("GPU-xxxxxxxx-..."): the same physical GPU gives the same UUID in
/// every process, whatever CUDA_VISIBLE_DEVICES renumbers (NCCL refuses two ranks on one GPU).
pub fn gpu_uuid(ordinal: u32) -> Result<String, Unavailable> {
    let n = crate::devices()?.len();
    if ordinal as usize >= n {
        return Err(Unavailable { reason: format!("GPU {ordinal} does not exist: this process sees {n} GPU(s)") });
    }
    let fail =
        |e: cu::DriverError| Unavailable { reason: format!("the CUDA driver failed to read a GPU's UUID: {e:?}") };
    let dev = cu::device::get(ordinal as i32).map_err(fail)?;
    let u = cu::device::get_uuid(dev).map_err(fail)?;
    let h: String = u.bytes.iter().map(|b| format!("{:02x}", *b as u8)).collect();
    Ok(format!("GPU-{}-{}-{}-{}-{}", &h[0..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32]))
}

/// A communicator's identity, made by rank 0 and sent to the others (as 256 hex characters).
#[derive(Clone, Copy)]
pub struct UniqueId(sys::ncclUniqueId);

impl UniqueId {
    /// A fresh id (call [`available`] first).
    pub fn new() -> Result<UniqueId, Unavailable> {
        cudarc::nccl::result::get_uniqueid()
            .map(UniqueId)
            .map_err(|e| Unavailable { reason: format!("ncclGetUniqueId failed: {}", text(e.0)) })
    }
    pub fn to_hex(&self) -> String {
        self.0.internal.iter().map(|b| format!("{:02x}", *b as u8)).collect()
    }
    pub fn from_hex(s: &str) -> Option<UniqueId> {
        let mut id = sys::ncclUniqueId { internal: [0; 128] };
        if s.len() != 256 || !s.is_ascii() {
            return None;
        }
        for (i, d) in id.internal.iter_mut().enumerate() {
            *d = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()? as std::ffi::c_char;
        }
        Some(UniqueId(id))
    }
}

/// A failed communicator operation; `timed_out`: it passed its deadline and was aborted.
#[derive(Debug, Clone)]
pub struct CommError {
    pub reason: String,
    pub timed_out: bool,
}

impl std::fmt::Display for CommError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.reason)
    }
}

fn text(r: sys::ncclResult_t) -> String {
    // SAFETY: only called after `available` found the library; the string is static in NCCL.
    let p = unsafe { sys::ncclGetErrorString(r) };
    if p.is_null() {
        return format!("{r:?}");
    }
    // SAFETY: NCCL returns a NUL-terminated static string.
    format!("{r:?}: {}", unsafe { std::ffi::CStr::from_ptr(p) }.to_string_lossy())
}

fn failed(what: &str) -> impl Fn(String) -> CommError + '_ {
    move |why| CommError { reason: format!("{what}: {why}"), timed_out: false }
}

/// One rank of a communicator on this process's GPU, with a device buffer and a pinned host
/// buffer of `chunk` bytes each (the most one broadcast moves).
pub struct Comm {
    gpu: crate::ipc::Gpu,
    comm: sys::ncclComm_t,
    stream: cusys::CUstream,
    dev: cusys::CUdeviceptr,
    host: *mut u8,
    chunk: usize,
    rank: u32,
    /// A failed or timed-out operation: aborted (not finalized) when dropped.
    broken: bool,
}

// SAFETY: the raw handles are owned by this value alone; every method makes the GPU's context
// current on the calling thread first.
unsafe impl Send for Comm {}

impl Comm {
    /// Joins communicator `id` as `rank` of `ranks` on GPU `ordinal`, waiting at most `timeout`
    /// for every rank to join (then aborted: `timed_out`).
    pub fn join(
        id: &UniqueId,
        rank: u32,
        ranks: u32,
        ordinal: u32,
        chunk: usize,
        timeout: Duration,
    ) -> Result<Comm, CommError> {
        let deadline = Instant::now() + timeout;
        let version = available().map_err(|e| failed("NCCL is unavailable")(e.reason))?;
        let gpu = crate::ipc::Gpu::open(ordinal).map_err(|e| failed("cannot open the GPU")(e.reason))?;
        let drv = |what: &'static str| {
            move |e: cu::DriverError| CommError {
                reason: format!("the CUDA driver failed to {what}: {e:?}"),
                timed_out: false,
            }
        };
        let stream = cu::stream::create(cu::stream::StreamKind::NonBlocking).map_err(drv("create a stream"))?;
        let mut me = Comm {
            gpu,
            comm: std::ptr::null_mut(),
            stream,
            dev: 0,
            host: std::ptr::null_mut(),
            chunk,
            rank,
            broken: true,
        };
        // SAFETY: the context is current (Gpu::open); both buffers are freed in Drop.
        me.dev = unsafe { cu::malloc_sync(chunk.max(1)) }.map_err(drv("allocate the device buffer"))?;
        me.host = unsafe { cu::malloc_host(chunk.max(1), 0) }.map_err(drv("allocate pinned host memory"))? as *mut u8;
        // NCCL_CONFIG_INITIALIZER, non-blocking; NCCL copies at most the size it knows.
        // SAFETY: a plain C struct; every field is set below or left at NCCL's "undefined".
        let mut cfg: sys::ncclConfig_t = unsafe { std::mem::zeroed() };
        cfg.size = std::mem::size_of::<sys::ncclConfig_t>();
        cfg.magic = 0xcafe_beef;
        cfg.version = version.clamp(21400, 23000) as u32;
        let undef = i32::MIN;
        (cfg.cgaClusterSize, cfg.minCTAs, cfg.maxCTAs, cfg.splitShare, cfg.trafficClass) =
            (undef, undef, undef, undef, undef);
        (cfg.collnetEnable, cfg.CTAPolicy, cfg.shrinkShare, cfg.nvlsCTAs, cfg.nChannelsPerNetPeer) =
            (undef, undef, undef, undef, undef);
        (cfg.nvlinkCentricSched, cfg.graphUsageMode, cfg.numRmaCtx, cfg.maxP2pPeers) = (undef, undef, undef, undef);
        cfg.blocking = 0;
        // SAFETY: valid out-pointer and config; the id came from rank 0's ncclGetUniqueId.
        let r = unsafe { sys::ncclCommInitRankConfig(&mut me.comm, ranks as i32, id.0, rank as i32, &mut cfg) };
        if !matches!(r, sys::ncclResult_t::ncclSuccess | sys::ncclResult_t::ncclInProgress) {
            return Err(failed("ncclCommInitRankConfig failed")(text(r)));
        }
        me.settle(deadline, "joining the communicator")?;
        me.broken = false;
        Ok(me)
    }

    /// Waits until the communicator has no call in progress (non-blocking mode), bounded.
    fn settle(&mut self, deadline: Instant, what: &str) -> Result<(), CommError> {
        loop {
            let mut st = sys::ncclResult_t::ncclSuccess;
            // SAFETY: a live communicator and a valid out-pointer.
            let r = unsafe { sys::ncclCommGetAsyncError(self.comm, &mut st) };
            if r != sys::ncclResult_t::ncclSuccess {
                self.broken = true;
                return Err(failed(what)(text(r)));
            }
            match st {
                sys::ncclResult_t::ncclSuccess => return Ok(()),
                sys::ncclResult_t::ncclInProgress => {}
                e => {
                    self.broken = true;
                    return Err(failed(what)(text(e)));
                }
            }
            if Instant::now() >= deadline {
                return Err(self.timed_out(what));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    fn timed_out(&mut self, what: &str) -> CommError {
        self.broken = true;
        CommError { reason: format!("{what} passed its deadline; the communicator was aborted"), timed_out: true }
    }

    /// Waits for the stream's queued work, watching NCCL's asynchronous error, bounded.
    fn wait(&mut self, deadline: Instant, what: &str) -> Result<(), CommError> {
        loop {
            // SAFETY: a live stream of the current context.
            match unsafe { cusys::cuStreamQuery(self.stream) } {
                cusys::cudaError_enum::CUDA_SUCCESS => return self.settle(deadline, what),
                cusys::cudaError_enum::CUDA_ERROR_NOT_READY => {}
                e => {
                    self.broken = true;
                    return Err(failed(what)(format!("the CUDA stream failed: {e:?}")));
                }
            }
            let mut st = sys::ncclResult_t::ncclSuccess;
            // SAFETY: as in `settle`.
            unsafe { sys::ncclCommGetAsyncError(self.comm, &mut st) };
            if !matches!(st, sys::ncclResult_t::ncclSuccess | sys::ncclResult_t::ncclInProgress) {
                self.broken = true;
                return Err(failed(what)(text(st)));
            }
            if Instant::now() >= deadline {
                return Err(self.timed_out(what));
            }
            std::thread::yield_now();
        }
    }

    fn broadcast(&mut self, len: usize, deadline: Instant) -> Result<(), CommError> {
        // SAFETY: `dev` holds `chunk` >= len bytes; in-place broadcast from rank 0.
        let r = unsafe {
            sys::ncclBroadcast(
                self.dev as *const std::ffi::c_void,
                self.dev as *mut std::ffi::c_void,
                len,
                sys::ncclDataType_t::ncclUint8,
                0,
                self.comm,
                self.stream as sys::cudaStream_t,
            )
        };
        if !matches!(r, sys::ncclResult_t::ncclSuccess | sys::ncclResult_t::ncclInProgress) {
            self.broken = true;
            return Err(failed("ncclBroadcast failed")(text(r)));
        }
        self.settle(deadline, "enqueueing a broadcast")
    }

    /// Rank 0: sends `data` (at most `chunk` bytes) to every other rank, host to pinned buffer
    /// to device, and waits (at most `timeout`) until the broadcast has completed here.
    pub fn send(&mut self, data: &[u8], timeout: Duration) -> Result<(), CommError> {
        let deadline = Instant::now() + timeout;
        self.check(data.len(), 0)?;
        // SAFETY: `host` holds `chunk` >= len bytes and is not aliased by `data`.
        let pinned = unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.host, data.len());
            std::slice::from_raw_parts(self.host, data.len())
        };
        // SAFETY: both buffers hold len bytes; the copy is waited for before `host` is reused.
        unsafe { cu::memcpy_htod_async(self.dev, pinned, self.stream) }
            .map_err(|e| failed("copying to the GPU")(format!("{e:?}")))?;
        self.broadcast(data.len(), deadline)?;
        self.wait(deadline, "broadcasting a chunk")
    }

    /// Any other rank: receives the next broadcast into `out` (its length must be what rank 0
    /// sends), device to pinned buffer to `out`, waiting at most `timeout`.
    pub fn recv(&mut self, out: &mut [u8], timeout: Duration) -> Result<(), CommError> {
        let deadline = Instant::now() + timeout;
        self.check(out.len(), 1)?;
        self.broadcast(out.len(), deadline)?;
        // SAFETY: `host` holds `chunk` >= len bytes; read only after the stream is waited for.
        let pinned = unsafe { std::slice::from_raw_parts_mut(self.host, out.len()) };
        unsafe { cu::memcpy_dtoh_async(pinned, self.dev, self.stream) }
            .map_err(|e| failed("copying from the GPU")(format!("{e:?}")))?;
        self.wait(deadline, "receiving a chunk")?;
        out.copy_from_slice(pinned);
        Ok(())
    }

    fn check(&mut self, len: usize, min_rank: u32) -> Result<(), CommError> {
        if len > self.chunk || (self.rank == 0) != (min_rank == 0) || self.broken {
            return Err(CommError {
                reason: format!(
                    "internal error: a {len}-byte broadcast on rank {} of a communicator with {}-byte chunks{} (a bug in miles)",
                    self.rank,
                    self.chunk,
                    if self.broken { ", already failed" } else { "" }
                ),
                timed_out: false,
            });
        }
        self.gpu.make_current().map_err(|e| failed("cannot use the GPU")(e.reason))
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        let _ = self.gpu.make_current();
        if !self.comm.is_null() {
            // A healthy communicator is finalized (bounded, as everything else); a failed one, or
            // one whose finalize does not settle, is aborted so no wait on a dead peer remains.
            let done = !self.broken && {
                // SAFETY: a live communicator, not used after this.
                let r = unsafe { sys::ncclCommFinalize(self.comm) };
                matches!(r, sys::ncclResult_t::ncclSuccess | sys::ncclResult_t::ncclInProgress)
                    && self.settle(Instant::now() + Duration::from_secs(10), "finalizing").is_ok()
            };
            // SAFETY: the communicator is not used again.
            unsafe {
                if done {
                    sys::ncclCommDestroy(self.comm);
                } else {
                    sys::ncclCommAbort(self.comm);
                }
            }
        }
        // SAFETY: what malloc_sync / malloc_host / stream::create returned, no longer in use
        // (the communicator is gone and every operation was waited for or aborted).
        unsafe {
            if self.dev != 0 {
                let _ = cu::free_sync(self.dev);
            }
            if !self.host.is_null() {
                let _ = cu::free_host(self.host as *mut std::ffi::c_void);
            }
            let _ = cu::stream::destroy(self.stream);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs on every machine. Without the driver, a GPU or libnccl it must name what is missing
    /// (never panic); with them it checks the version, and with two GPUs it broadcasts between
    /// two threads, one rank per GPU (NCCL refuses two ranks on one GPU).
    #[test]
    fn nccl_answers_without_panicking_and_broadcasts_between_two_gpus() {
        let version = match available() {
            Ok(v) => v,
            Err(e) => {
                assert!(
                    e.reason.contains("libnccl") || e.reason.contains("libcuda") || e.reason.contains("GPU"),
                    "{e}"
                );
                eprintln!("skipped the NCCL half of this test: {e}");
                return;
            }
        };
        assert!(version >= 21400, "NCCL {version}");
        let gpus = crate::devices().unwrap().len();
        if gpus < 2 {
            eprintln!("skipped the NCCL broadcast: {gpus} GPU visible, NCCL needs one GPU per rank");
            return;
        }
        let id = UniqueId::new().unwrap();
        assert_eq!(UniqueId::from_hex(&id.to_hex()).unwrap().to_hex(), id.to_hex());
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let t = Duration::from_secs(60);
        let (a, b) = std::thread::scope(|s| {
            let tx = s.spawn(|| -> Result<(), CommError> {
                let mut c = Comm::join(&id, 0, 2, 0, 1 << 20, t)?;
                for ch in data.chunks(1 << 20) {
                    c.send(ch, t)?;
                }
                Ok(())
            });
            let rx = s.spawn(|| -> Result<Vec<u8>, CommError> {
                let mut c = Comm::join(&id, 1, 2, 1, 1 << 20, t)?;
                let mut out = vec![0u8; data.len()];
                for ch in out.chunks_mut(1 << 20) {
                    c.recv(ch, t)?;
                }
                Ok(out)
            });
            (tx.join().unwrap(), rx.join().unwrap())
        });
        a.unwrap();
        assert!(b.unwrap() == data, "the broadcast bytes differ");
    }

    /// Needs one GPU and NCCL (skips otherwise): a one-rank communicator joins and broadcasts
    /// (init config, non-blocking settle, pinned copy, stream wait, finalize), and a two-rank one
    /// that nobody else joins times out within its bound and is aborted.
    #[test]
    fn one_gpu_joins_alone_and_a_missing_rank_times_out_bounded() {
        if let Err(e) = available() {
            eprintln!("skipped: {e}");
            return;
        }
        let t = Duration::from_secs(30);
        let mut c = Comm::join(&UniqueId::new().unwrap(), 0, 1, 0, 1 << 20, t).unwrap();
        c.send(&vec![7u8; 1 << 20], t).unwrap();
        assert!(c.recv(&mut [0u8; 4], t).is_err(), "rank 0 only sends");
        drop(c);
        let t0 = Instant::now();
        let e = Comm::join(&UniqueId::new().unwrap(), 0, 2, 0, 1 << 16, Duration::from_secs(3)).err().unwrap();
        assert!(e.timed_out, "{e}");
        assert!(t0.elapsed() < Duration::from_secs(15), "{:?}", t0.elapsed());
    }

    #[test]
    fn unique_ids_survive_hex_and_bad_hex_is_refused() {
        let mut raw = sys::ncclUniqueId { internal: [0; 128] };
        for (i, d) in raw.internal.iter_mut().enumerate() {
            *d = (i as u8).wrapping_mul(37) as std::ffi::c_char;
        }
        let id = UniqueId(raw);
        assert_eq!(UniqueId::from_hex(&id.to_hex()).unwrap().0.internal, raw.internal);
        assert!(UniqueId::from_hex("abc").is_none());
        assert!(UniqueId::from_hex(&"zz".repeat(128)).is_none());
    }
}
