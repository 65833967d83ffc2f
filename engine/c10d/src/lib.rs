//! PyTorch's own collectives for the embedded trainer: c10d's `TCPStore` (the rendezvous) and
//! `ProcessGroupGloo` (all-reduce, broadcast, all-gather, reduce-scatter, barrier on CPU tensors),
//! the code PyTorch DDP and FSDP run on, reached through a small C++ shim (`src/shim.cpp`)
//! compiled against the headers of the libtorch that tch links. Every call is bounded by the
//! group's timeout; a C++ exception comes back as an `Error` with its message, never a panic.
//!
//! The model is torchrun's: one process (the controller) hosts the store server, every rank is a
//! client of it and joins a group under a key prefix. A [`Store`] serialises its own operations (a
//! `get` that waits holds it), so every rank uses its own client, also when ranks are threads.

mod ffi;

use std::cell::RefCell;
use std::ffi::{c_char, c_int};
use std::time::Duration;
use tch::Tensor;

/// A c10d failure: its message (a timeout, a peer that closed its connection, a bad argument).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error(pub String);

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

/// How an all-reduce combines the ranks' tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    Max,
    Min,
}

impl ReduceOp {
    fn code(self) -> c_int {
        match self {
            ReduceOp::Sum => 0,
            ReduceOp::Max => 1,
            ReduceOp::Min => 2,
        }
    }
}

/// The network device a Gloo group binds to (its peers connect to that address).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GlooDevice {
    /// This host's name as it resolves, else loopback (c10d's `createDefaultDevice`).
    Default,
    /// The address of a network interface, e.g. `eth0` (`createDeviceForInterface`).
    Interface(String),
    /// A hostname or address of this host (`createDeviceForHostname`).
    Hostname(String),
}

impl GlooDevice {
    /// PyTorch's own setting: `GLOO_SOCKET_IFNAME` names the interface, else the default device.
    /// (Only its first interface is used: one device per group.)
    pub fn from_env() -> GlooDevice {
        match std::env::var("GLOO_SOCKET_IFNAME") {
            Ok(names) if !names.trim().is_empty() => {
                GlooDevice::Interface(names.split(',').next().unwrap_or_default().trim().to_string())
            }
            _ => GlooDevice::Default,
        }
    }
}

fn millis(what: &str, timeout: Duration) -> Result<i64> {
    if timeout.is_zero() {
        return Err(Error(format!("{what}: the timeout must be positive")));
    }
    Ok(timeout.as_millis().clamp(1, i64::MAX as u128) as i64)
}

/// "30 s", "2.5 s", "0.25 s": how a timeout reads in an error.
fn seconds(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s.fract() == 0.0 {
        format!("{s:.0} s")
    } else {
        let text = format!("{s:.3}");
        format!("{} s", text.trim_end_matches('0').trim_end_matches('.'))
    }
}

/// The shim's error, if any, as an `Error` prefixed with what was being done.
///
/// # Safety
/// As [`ffi::take_error`].
unsafe fn check(what: &str, msg: *mut c_char) -> Result<()> {
    match ffi::take_error(msg) {
        None => Ok(()),
        Some(text) => Err(Error(format!("{what}: {text}"))),
    }
}

/// The ranks c10d's monitoredBarrier names on rank 0 ("[Rank 0]: Ranks 2, 3 failed to pass
/// monitoredBarrier in 2000 ms"); `None` for any other message, which is then passed on as is.
fn missing_from_monitored_barrier(text: &str) -> Option<Vec<usize>> {
    let (head, _) = text.split_once(" failed to pass monitoredBarrier")?;
    let list = &head[head.rfind("Ranks ")? + "Ranks ".len()..];
    list.split(',').map(|r| r.trim().parse().ok()).collect()
}

/// "rank 1", "ranks 1, 3".
fn ranks_phrase<T: std::fmt::Display>(ranks: &[T]) -> String {
    match ranks {
        [one] => format!("rank {one}"),
        _ => format!("ranks {}", ranks.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(", ")),
    }
}

/// Gloo prefixes its messages with its build tree's source location
/// (`[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:547] Connection closed by peer ...`),
/// which says nothing to a user; the rest is kept.
fn tidy(text: &str) -> &str {
    match text.strip_prefix('[').and_then(|rest| rest.split_once("] ")) {
        Some((location, rest)) if location.contains(".cc:") || location.contains(".h:") => rest,
        _ => text,
    }
}

/// A c10d TCPStore: the server (in the process that hosts the rendezvous) or a client.
pub struct Store {
    raw: *mut ffi::RawStore,
    /// `host:port`, for errors.
    addr: String,
    timeout: Duration,
}

// SAFETY: c10d's TCPStore serialises every operation under its own mutex (TCPStore::activeOpLock_)
// and its server runs on its own thread; nothing in it is tied to the creating thread. So the
// handle may move between threads and be shared by them (each call then waits its turn).
unsafe impl Send for Store {}
unsafe impl Sync for Store {}

impl Store {
    /// A store server listening on `host:port` (port 0: a free one, see [`Store::port`]).
    pub fn server(host: &str, port: u16, timeout: Duration) -> Result<Store> {
        Store::new(host, port, true, timeout)
    }
    /// A client of the store at `host:port`; waits up to `timeout` for it to answer.
    pub fn client(host: &str, port: u16, timeout: Duration) -> Result<Store> {
        Store::new(host, port, false, timeout)
    }
    fn new(host: &str, port: u16, server: bool, timeout: Duration) -> Result<Store> {
        let role = if server { "starting the c10d store server on" } else { "connecting to the c10d store at" };
        let what = format!("{role} {host}:{port}");
        let ms = millis(&what, timeout)?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: host is valid for host.len() bytes; raw is written on success only.
        unsafe {
            check(
                &what,
                ffi::miles_c10d_store_new(host.as_ptr().cast(), host.len(), port, c_int::from(server), ms, &mut raw),
            )?
        };
        // SAFETY: raw is the live store the shim just made.
        let port = unsafe { ffi::miles_c10d_store_port(raw) };
        Ok(Store { raw, addr: format!("{host}:{port}"), timeout })
    }
    /// The port the store listens on (a server's, after port 0 was resolved).
    pub fn port(&self) -> u16 {
        // SAFETY: self.raw is live until drop.
        unsafe { ffi::miles_c10d_store_port(self.raw) }
    }
    /// How long a `get` waits (and a client waited to connect).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }
    pub fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        // SAFETY: both slices are valid for their lengths; self.raw is live.
        unsafe {
            check(
                &format!("setting `{key}` in the c10d store at {}", self.addr),
                ffi::miles_c10d_store_set(self.raw, key.as_ptr().cast(), key.len(), value.as_ptr(), value.len()),
            )
        }
    }
    /// Waits up to the store's timeout for `key`.
    pub fn get(&self, key: &str) -> Result<Vec<u8>> {
        let mut ptr: *mut u8 = std::ptr::null_mut();
        let mut len = 0usize;
        // SAFETY: key is valid for its length; ptr/len are written by the shim (ptr malloc'ed or
        // NULL for an empty value) and freed below.
        unsafe {
            check(
                &format!("reading `{key}` from the c10d store at {}", self.addr),
                ffi::miles_c10d_store_get(self.raw, key.as_ptr().cast(), key.len(), &mut ptr, &mut len),
            )?;
            if ptr.is_null() {
                return Ok(Vec::new());
            }
            let value = std::slice::from_raw_parts(ptr, len).to_vec();
            ffi::miles_c10d_free(ptr.cast());
            Ok(value)
        }
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        // SAFETY: self.raw came from miles_c10d_store_new and is freed once. A group made from
        // this store holds its own reference to the C++ store, which outlives this handle.
        unsafe { ffi::miles_c10d_store_free(self.raw) }
    }
}

/// One rank's handle on a group of `world` ranks (Gloo on CPU tensors). Every collective is
/// called by every rank in the same order; tensors must be contiguous and the same shape and
/// dtype on every rank.
///
/// After a collective fails (a timeout, a peer gone) the ranks are no longer in step, so every
/// later call fails at once with the first error; make a new group (under a new prefix) to go on.
/// Dropping the group waits for its queued collectives and closes its connections, so a peer
/// still waiting on this rank fails at once rather than at its timeout.
pub struct ProcessGroup {
    raw: *mut ffi::RawGroup,
    rank: usize,
    world: usize,
    timeout: Duration,
    /// The first failure, after which the group refuses every call.
    failed: RefCell<Option<String>>,
}

// SAFETY: ProcessGroupGloo queues every collective under its own mutex and runs it on its worker
// threads, so a group may be used from any thread. It is deliberately not Sync (RefCell): every
// rank must issue its collectives in the same order, which calls racing from two threads of one
// rank would break.
unsafe impl Send for ProcessGroup {}

impl ProcessGroup {
    /// Joins the group `prefix` (keys under it in `store`) as `rank` of `world`: blocks until every
    /// rank has joined or `timeout` passes (then the error names the ranks that did not join).
    /// The device is [`GlooDevice::from_env`]. A prefix names one group: a second group on the
    /// same store takes a new one.
    pub fn gloo(store: &Store, prefix: &str, rank: usize, world: usize, timeout: Duration) -> Result<ProcessGroup> {
        ProcessGroup::gloo_on(store, prefix, rank, world, timeout, &GlooDevice::from_env())
    }

    /// [`ProcessGroup::gloo`] bound to `device`.
    pub fn gloo_on(
        store: &Store,
        prefix: &str,
        rank: usize,
        world: usize,
        timeout: Duration,
        device: &GlooDevice,
    ) -> Result<ProcessGroup> {
        let what = format!("joining the c10d group `{prefix}` as rank {rank} of {world}");
        if world == 0 || world > c_int::MAX as usize {
            return Err(Error(format!("{what}: the group size must be between 1 and {}", c_int::MAX)));
        }
        if rank >= world {
            return Err(Error(format!("{what}: ranks are numbered 0..{world}")));
        }
        let ms = millis(&what, timeout)?;
        let (kind, name) = match device {
            GlooDevice::Default => (0, ""),
            GlooDevice::Interface(n) => (1, n.as_str()),
            GlooDevice::Hostname(n) => (2, n.as_str()),
        };
        let mut missing = vec![0i64; world];
        let mut missing_len = 0usize;
        let mut raw = std::ptr::null_mut();
        // SAFETY: strings valid for their lengths; `missing` has room for `world` entries as the
        // shim requires; raw is written on success only.
        unsafe {
            check(
                &what,
                ffi::miles_c10d_group_gloo(
                    store.raw,
                    prefix.as_ptr().cast(),
                    prefix.len(),
                    rank as c_int,
                    world as c_int,
                    ms,
                    kind,
                    name.as_ptr().cast(),
                    name.len(),
                    missing.as_mut_ptr(),
                    &mut missing_len,
                    &mut raw,
                ),
            )?
        };
        if raw.is_null() {
            return Err(Error(format!(
                "{} of {world} never joined the c10d group `{prefix}` (store {}) within {}",
                ranks_phrase(&missing[..missing_len]),
                store.addr,
                seconds(timeout)
            )));
        }
        Ok(ProcessGroup { raw, rank, world, timeout, failed: RefCell::new(None) })
    }

    /// The NCCL group (GPU tensors) is not built: `ProcessGroupNCCL` lives in libtorch_cuda.so,
    /// which miles opens at run time only (docs/gpu.md) and whose headers need CUDA's and NCCL's.
    /// Always an error naming that, so a caller can refuse `device = cuda` with dp > 1 clearly.
    pub fn nccl(
        _store: &Store,
        prefix: &str,
        rank: usize,
        world: usize,
        _timeout: Duration,
        _device: usize,
    ) -> Result<ProcessGroup> {
        Err(Error(format!(
            "joining the c10d group `{prefix}` as rank {rank} of {world}: the NCCL process group needs libtorch's \
             CUDA build and a GPU; this build runs Gloo (CPU tensors)"
        )))
    }

    pub fn rank(&self) -> usize {
        self.rank
    }
    pub fn world(&self) -> usize {
        self.world
    }
    /// The bound on each collective (and on joining).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    fn error(&self, what: &str, text: impl std::fmt::Display) -> Error {
        Error(format!("rank {} of {}: {what}: {text}", self.rank, self.world))
    }

    /// Refuses tensors Gloo cannot take (not contiguous, not on the CPU) before anything is
    /// sent: the group stays in step, so this does not poison it.
    fn check_tensors(&self, what: &str, role: &str, ts: &[*mut torch_sys::C_tensor]) -> Result<()> {
        // SAFETY: the pointers are live tensors borrowed by the caller; role is valid for its length.
        let msg = unsafe { ffi::miles_c10d_check_tensors(ts.as_ptr(), ts.len(), role.as_ptr().cast(), role.len()) };
        // SAFETY: msg is the shim's.
        match unsafe { ffi::take_error(msg) } {
            None => Ok(()),
            Some(text) => Err(self.error(what, text)),
        }
    }

    /// Runs one shim call unless the group failed before; a failure poisons the group.
    fn run(&self, what: &str, call: impl FnOnce(*mut ffi::RawGroup) -> *mut c_char) -> Result<()> {
        if let Some(first) = self.failed.borrow().as_ref() {
            return Err(self.error(
                what,
                format_args!(
                    "the c10d group failed earlier ({first}); its ranks are out of step, so it cannot be used again"
                ),
            ));
        }
        // SAFETY: the closure's pointer arguments are valid for the call (see each caller); the
        // message it returns is the shim's.
        match unsafe { ffi::take_error(call(self.raw)) } {
            None => Ok(()),
            Some(text) => {
                let e = self.error(what, tidy(&text));
                *self.failed.borrow_mut() = Some(e.0.clone());
                Err(e)
            }
        }
    }

    /// In place: every rank's `t` becomes the reduction of all ranks' `t`.
    pub fn all_reduce(&self, t: &mut Tensor, op: ReduceOp) -> Result<()> {
        self.all_reduce_many(std::slice::from_mut(t), op)
    }

    /// Starts all-reduces of every tensor of `ts` (in place) and returns once all are done; the
    /// reductions of several buckets are in flight at once.
    pub fn all_reduce_many(&self, ts: &mut [Tensor], op: ReduceOp) -> Result<()> {
        if ts.is_empty() {
            return Ok(());
        }
        let ptrs: Vec<*mut torch_sys::C_tensor> = ts.iter_mut().map(|t| t.as_mut_ptr()).collect();
        self.check_tensors("all_reduce", "tensor", &ptrs)?;
        // SAFETY: ptrs point at live tensors borrowed mutably for the call.
        self.run("all_reduce", |g| unsafe { ffi::miles_c10d_all_reduce(g, ptrs.as_ptr(), ptrs.len(), op.code()) })
    }

    /// In place: every rank's `t` becomes `root`'s.
    pub fn broadcast(&self, t: &mut Tensor, root: usize) -> Result<()> {
        if root >= self.world {
            return Err(self.error("broadcast", format_args!("root {root} is not a rank of a group of {}", self.world)));
        }
        let ptr = t.as_mut_ptr();
        self.check_tensors("broadcast", "tensor", &[ptr])?;
        // SAFETY: ptr is a live tensor borrowed mutably for the call.
        self.run("broadcast", |g| unsafe { ffi::miles_c10d_broadcast(g, ptr, root as c_int) })
    }

    /// `out[r]` becomes rank r's `input` on every rank (`out.len() == world`).
    pub fn all_gather(&self, out: &mut [Tensor], input: &Tensor) -> Result<()> {
        if out.len() != self.world {
            return Err(self.error(
                "all_gather",
                format_args!("{} output tensors for a group of {} (one per rank)", out.len(), self.world),
            ));
        }
        let ptrs: Vec<*mut torch_sys::C_tensor> = out.iter_mut().map(|t| t.as_mut_ptr()).collect();
        // The shim only reads the input (Gloo copies it out); the pointer is mutable by C type only.
        let input = input.as_ptr() as *mut torch_sys::C_tensor;
        self.check_tensors("all_gather", "output", &ptrs)?;
        self.check_tensors("all_gather", "input", &[input])?;
        // SAFETY: the pointers are live tensors borrowed for the call.
        self.run("all_gather", |g| unsafe { ffi::miles_c10d_all_gather(g, ptrs.as_ptr(), ptrs.len(), input) })
    }

    /// `out` becomes the sum over ranks of their `inputs[rank]` (`inputs.len() == world`).
    pub fn reduce_scatter(&self, out: &mut Tensor, inputs: &[Tensor]) -> Result<()> {
        if inputs.len() != self.world {
            return Err(self.error(
                "reduce_scatter",
                format_args!("{} input tensors for a group of {} (one per rank)", inputs.len(), self.world),
            ));
        }
        // The shim only reads the inputs; the pointers are mutable by C type only.
        let ptrs: Vec<*mut torch_sys::C_tensor> =
            inputs.iter().map(|t| t.as_ptr() as *mut torch_sys::C_tensor).collect();
        let out = out.as_mut_ptr();
        self.check_tensors("reduce_scatter", "input", &ptrs)?;
        self.check_tensors("reduce_scatter", "output", &[out])?;
        // SAFETY: the pointers are live tensors borrowed for the call.
        self.run("reduce_scatter", |g| unsafe { ffi::miles_c10d_reduce_scatter(g, out, ptrs.as_ptr(), ptrs.len()) })
    }

    pub fn barrier(&self) -> Result<()> {
        // SAFETY: no pointer arguments besides the group.
        self.run("barrier", |g| unsafe { ffi::miles_c10d_barrier(g) })
    }

    /// A barrier that names who is missing: rank 0 waits up to the timeout for every other rank
    /// and its error names each rank that did not arrive (a stopped or stuck process); the others
    /// wait for rank 0's release. For a health check between steps: a plain collective that times
    /// out cannot say which rank it waited for.
    pub fn monitored_barrier(&self) -> Result<()> {
        // SAFETY: no pointer arguments besides the group.
        self.run("monitored_barrier", |g| unsafe { ffi::miles_c10d_monitored_barrier(g) }).map_err(|Error(text)| {
            match missing_from_monitored_barrier(&text) {
                Some(ranks) => self.error(
                    "monitored_barrier",
                    format_args!(
                        "{} of {} did not reach the barrier within {} (stopped, stuck or gone)",
                        ranks_phrase(&ranks),
                        self.world,
                        seconds(self.timeout)
                    ),
                ),
                None => Error(text),
            }
        })
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        // SAFETY: self.raw came from miles_c10d_group_gloo and is freed once.
        unsafe { ffi::miles_c10d_group_free(self.raw) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gloo_source_locations_are_dropped() {
        let text = "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:547] Connection closed by peer [127.0.0.1]:1";
        assert_eq!(tidy(text), "Connection closed by peer [127.0.0.1]:1");
        assert_eq!(tidy("[not a location] x"), "[not a location] x");
    }

    #[test]
    fn monitored_barrier_messages_name_their_ranks() {
        let text = "rank 0 of 3: monitored_barrier: [Rank 0]: Ranks 2, 3 failed to pass monitoredBarrier in 2000 ms";
        assert_eq!(missing_from_monitored_barrier(text), Some(vec![2, 3]));
        assert_eq!(missing_from_monitored_barrier("rank 1 of 3: monitored_barrier: Connection closed by peer"), None);
        assert_eq!(ranks_phrase(&[1]), "rank 1");
        assert_eq!(ranks_phrase(&[1, 3]), "ranks 1, 3");
    }

    #[test]
    fn nccl_is_refused_by_name() {
        let store = Store::server("127.0.0.1", 0, Duration::from_secs(2)).unwrap();
        let e = ProcessGroup::nccl(&store, "dp", 0, 2, Duration::from_secs(1), 0).err().unwrap();
        assert!(e.0.contains("NCCL process group needs libtorch's CUDA build and a GPU; this build runs Gloo"), "{e}");
    }

    #[test]
    fn timeouts_read_in_seconds() {
        assert_eq!(seconds(Duration::from_secs(30)), "30 s");
        assert_eq!(seconds(Duration::from_millis(2500)), "2.5 s");
        assert_eq!(seconds(Duration::from_millis(250)), "0.25 s");
        assert_eq!(seconds(Duration::from_micros(2_000_400)), "2 s");
    }

    #[test]
    fn bad_arguments_are_errors_not_panics() {
        let store = Store::server("127.0.0.1", 0, Duration::from_secs(2)).unwrap();
        let e = ProcessGroup::gloo(&store, "g", 2, 2, Duration::from_secs(1)).err().unwrap();
        assert!(e.0.contains("ranks are numbered 0..2"), "{e}");
        let e = ProcessGroup::gloo(&store, "g", 0, 0, Duration::from_secs(1)).err().unwrap();
        assert!(e.0.contains("group size"), "{e}");
        let e = ProcessGroup::gloo(&store, "g", 0, 1, Duration::ZERO).err().unwrap();
        assert!(e.0.contains("timeout must be positive"), "{e}");
    }
}
