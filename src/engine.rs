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
/// background. On Linux the kernel sends it SIGTERM when its parent dies, whatever killed it.
fn end_with_parent(cmd: &mut Command) {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec here.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    #[cfg(not(target_os = "linux"))]
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

/// Runs the engine with `input` on its standard input; its output goes straight to ours.
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
