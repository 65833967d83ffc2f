//! Finding and starting `miles-engine`, the sibling binary that links libtorch: `miles run`,
//! `miles worker` and `miles serve` execute there, so the language verbs never load it.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

pub const ENGINE: &str = "miles-engine";

/// `miles-engine` next to this executable (how cargo and `cargo install` lay them out), else
/// on PATH.
pub fn path() -> Option<PathBuf> {
    let beside = std::env::current_exe().ok().and_then(|p| p.parent().map(|d| d.join(ENGINE)));
    if let Some(p) = beside.filter(|p| p.is_file()) {
        return Some(p);
    }
    std::env::var_os("PATH")
        .and_then(|paths| std::env::split_paths(&paths).map(|d| d.join(ENGINE)).find(|p| p.is_file()))
}

pub fn command() -> Result<Command, u8> {
    match path() {
        Some(p) => {
            let mut cmd = Command::new(p);
            end_with_parent(&mut cmd);
            Ok(cmd)
        }
        None => {
            eprintln!(
                "error[E0508]: `{ENGINE}` not found next to `miles` or on PATH\n  help: build both binaries: `cargo build --release` (or `cargo install --path .`)"
            );
            Err(1)
        }
    }
}

/// The engine must not outlive `miles`: killed `miles run` must not keep training in the
/// background. On Linux the kernel sends it SIGTERM (which it ends on) when its parent dies,
/// whatever killed it; the runtime's one request (`child::die_with_parent`) also refuses to start
/// it when `miles` died during the start. The signal follows the thread that starts the engine:
/// here the main thread, whose end is the process's. Unlike the programs the run starts, the
/// engine keeps the user's whole environment and the terminal's process group: it is `miles`
/// itself, and Ctrl-C reaches it.
fn end_with_parent(cmd: &mut Command) {
    #[cfg(unix)]
    miles_runtime::child::die_with_parent(cmd, libc::SIGTERM);
    #[cfg(not(unix))]
    let _ = cmd;
}

fn code_of(status: std::process::ExitStatus) -> u8 {
    match status.code() {
        // The dynamic loader's exit: a library missing ("error while loading shared libraries")
        // or of another version ("symbol lookup error"), printed just above by the loader.
        Some(127) => {
            eprintln!(
                "error[E0508]: {ENGINE} could not load its libraries: it links libtorch {} (libtorch_cpu.so, libc10.so)\n  help: run scripts/setup-libtorch.sh, or point LD_LIBRARY_PATH at a torch/lib of that version (docs/gpu.md)",
                env!("MILES_TORCH_VERSION")
            );
            127
        }
        Some(c) => u8::try_from(c).unwrap_or(1),
        // Killed by a signal: say so, and which, as a shell would.
        None => {
            #[cfg(unix)]
            let sig = std::os::unix::process::ExitStatusExt::signal(&status);
            #[cfg(not(unix))]
            let sig: Option<i32> = None;
            match sig {
                Some(n) => eprintln!("error: {ENGINE} was killed by signal {n}"),
                None => eprintln!("error: {ENGINE} was killed by a signal"),
            }
            1
        }
    }
}

/// The engine's pid while `run_with_stdin` waits for it (0: none), for the SIGINT handler.
#[cfg(unix)]
static ENGINE_PID: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// SIGINT while the engine runs: `miles` stays to report how the engine ended, and the engine
/// decides (finish the step and checkpoint; a second one stops it at once). A terminal's Ctrl-C
/// (`si_code` > 0: sent by the kernel) reaches the engine itself, in our process group; one sent
/// to `miles` alone (`kill -INT`, `si_code` <= 0) is passed on to it.
#[cfg(unix)]
extern "C" fn on_sigint(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo_t to an SA_SIGINFO handler; kill(2) and atomic
    // loads are async-signal-safe.
    unsafe {
        if (*info).si_code <= 0 {
            let pid = ENGINE_PID.load(std::sync::atomic::Ordering::SeqCst);
            if pid > 0 {
                libc::kill(pid, libc::SIGINT);
            }
        }
    }
}

#[cfg(unix)]
fn pass_sigint_to(pid: u32) {
    ENGINE_PID.store(pid as i32, std::sync::atomic::Ordering::SeqCst);
    // SAFETY: installs a handler that only reads an atomic and calls kill(2).
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        type Handler = extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void);
        sa.sa_sigaction = on_sigint as Handler as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGINT, &sa, std::ptr::null_mut());
    }
}

/// Runs the engine with `input` on its standard input; its output goes straight to ours. SIGINT
/// is the engine's to handle while it runs (`on_sigint`).
pub fn run_with_stdin(mut cmd: Command, input: &[u8]) -> u8 {
    // An engine that dies before reading its spec (its libtorch does not load: exit 127) closes
    // the pipe: the write must fail, not kill `miles` with SIGPIPE before it names the cause.
    #[cfg(unix)]
    // SAFETY: changing one signal's disposition (the engine ignores it too, as Rust binaries do).
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
    cmd.stdin(Stdio::piped());
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error[E0508]: cannot start {ENGINE}: {e}");
            return 1;
        }
    };
    #[cfg(unix)]
    pass_sigint_to(child.id());
    if let Some(mut stdin) = child.stdin.take() {
        match stdin.write_all(input) {
            // It ended without reading: its exit status says why (below).
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
            Err(e) => eprintln!("error[E0508]: cannot pass the run spec to {ENGINE}: {e}"),
            Ok(()) => {}
        }
    }
    match child.wait() {
        Ok(s) => code_of(s),
        Err(e) => {
            eprintln!("error[E0508]: lost {ENGINE}: {e}");
            1
        }
    }
}

/// Runs `miles-engine VERB ARGS...` (for `miles worker` and `miles serve`).
pub fn forward(verb: &str, args: &[String]) -> u8 {
    let mut cmd = match command() {
        Ok(c) => c,
        Err(code) => return code,
    };
    cmd.arg(verb).args(args);
    match cmd.status() {
        Ok(s) => code_of(s),
        Err(e) => {
            eprintln!("error[E0508]: cannot start {ENGINE}: {e}");
            1
        }
    }
}
