//! How the run starts every program it talks to (a `command_reward`, a `command_env`, the
//! teacher and image-reward workers, the local launcher's workers): the one spawn each of them
//! goes through, [`spawn`], and the child it returns, [`GroupChild`].
//!
//! - **Its own process group** (`setpgid(0, 0)`): what the program starts (a verifier running
//!   model-written code, a shell's pipeline) is in that group, and [`GroupChild::kill`] sends
//!   SIGKILL to the whole group. The spawn sites kill on timeout, on drop and at the run's end.
//!   A program that leaves its group on purpose (`setsid`, `setpgid`) escapes this.
//! - **Dies with the run** (Linux: `PR_SET_PDEATHSIG`, SIGKILL), however the run ends, `kill -9`
//!   included. The kernel sends that signal when the *thread* that forked the child exits, not
//!   the process, and the run starts programs from short-lived threads (an episode round's
//!   workers); so every spawn is made on one thread that lives as long as the process
//!   ([`spawner`]). It reaches the program itself: what the program started dies with it on
//!   every end the run sees (the group kill), but not on a `kill -9` of the run.
//! - **An environment cleared to an allow-list** ([`ChildEnv`]): [`BASE_ENV`], the names the
//!   recipe lists (`pass_env`), and what the spawn site sets itself (the run token, for a
//!   worker). Nothing named `MILES_*` passes from the run's environment (`MILES_API_KEY`,
//!   `MILES_RUN_TOKEN`) except the few engine settings of [`ENGINE_ENV`], which only
//!   `miles-engine`'s own workers get.

use std::ffi::OsString;
use std::io;
use std::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command, ExitStatus};
use std::sync::mpsc;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// What every program gets from the run's environment, when set (`LC_*`: every name so
/// beginning). Enough to find programs, a home, a locale and a scratch directory, and for a
/// Python program the packages its shell finds.
pub const BASE_ENV: &[&str] =
    &["PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_*", "TZ", "TMPDIR", "TERM", "PYTHONPATH", "VIRTUAL_ENV"];

/// What `miles-engine`'s own workers get besides [`BASE_ENV`]: where libtorch and CUDA are, the
/// GPU a process uses, NCCL's and the math libraries' settings, and the test faults.
pub const ENGINE_ENV: &[&str] = &[
    "LD_LIBRARY_PATH",
    "CUDA_*",
    "NCCL_*",
    "PYTORCH_*",
    "TORCH_*",
    "OMP_*",
    "MKL_*",
    "MILES_CUDA_DEVICE",
    "MILES_FAULT_*",
    "RUST_BACKTRACE",
    "RUST_LOG",
    "NO_COLOR",
];

/// The prefix of the run's own variables, secrets among them: a recipe cannot pass them on.
pub const RESERVED_PREFIX: &str = "MILES_";

/// Whether `name` matches `pattern` (a name, or a prefix ending in `*`).
fn matches(pattern: &str, name: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => name == pattern,
    }
}

/// Why a name a recipe lists cannot be passed to a program, if it cannot.
pub fn refuse_pass_name(name: &str) -> Option<String> {
    let mut chars = name.chars();
    let valid = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid {
        return Some(format!("`{name}` is not an environment variable's name (letters, digits and _)"));
    }
    if name.to_ascii_uppercase().starts_with(RESERVED_PREFIX) {
        return Some(format!(
            "`{name}` is one of the run's own variables (MILES_*, the API key and the run token among them): \
             no program is given them"
        ));
    }
    None
}

/// The environment a program starts with: the run's variables whose names match `allow`, then
/// the ones set here.
#[derive(Debug, Clone)]
pub struct ChildEnv {
    allow: Vec<String>,
    set: Vec<(String, OsString)>,
}

impl ChildEnv {
    /// A user's program: [`BASE_ENV`] and the names the recipe lists, each checked.
    pub fn program(pass_env: &[String]) -> Result<ChildEnv, String> {
        if let Some(why) = pass_env.iter().find_map(|n| refuse_pass_name(n)) {
            return Err(why);
        }
        let allow = BASE_ENV.iter().map(|s| s.to_string()).chain(pass_env.iter().cloned()).collect();
        Ok(ChildEnv { allow, set: Vec::new() })
    }

    /// A worker of `miles-engine` itself: [`BASE_ENV`] and [`ENGINE_ENV`].
    pub fn engine() -> ChildEnv {
        ChildEnv { allow: BASE_ENV.iter().chain(ENGINE_ENV).map(|s| s.to_string()).collect(), set: Vec::new() }
    }

    /// Sets `name` to `value` for this program alone (a worker's run token).
    pub fn with(mut self, name: &str, value: impl Into<OsString>) -> ChildEnv {
        self.set.push((name.to_string(), value.into()));
        self
    }

    /// Whether the run's variable `name` passes.
    pub fn passes(&self, name: &str) -> bool {
        self.allow.iter().any(|p| matches(p, name))
    }

    /// Clears `cmd`'s environment to what passes, and adds what is set here.
    fn apply(&self, cmd: &mut Command) {
        cmd.env_clear();
        for (k, v) in std::env::vars_os() {
            if k.to_str().is_some_and(|k| self.passes(k)) {
                cmd.env(k, v);
            }
        }
        for (k, v) in &self.set {
            cmd.env(k, v);
        }
    }
}

/// Longest wait for the spawning thread to start a program (a fork of a large process copies
/// its page tables; seconds at worst).
const SPAWN_WAIT: Duration = Duration::from_secs(60);
/// Longest wait for a killed group's leader to be reaped.
const REAP_WAIT: Duration = Duration::from_secs(5);

type SpawnJob = (Command, mpsc::Sender<io::Result<Child>>);

/// The one thread that forks every program, alive as long as the process: the parent death
/// signal fires when the forking thread exits, so a program started from a short-lived thread
/// would be killed with that thread.
fn spawner() -> io::Result<&'static mpsc::Sender<SpawnJob>> {
    static SPAWNER: OnceLock<Result<mpsc::Sender<SpawnJob>, String>> = OnceLock::new();
    let made = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnJob>();
        std::thread::Builder::new()
            .name("miles-spawner".into())
            .spawn(move || {
                for (mut cmd, answer) in rx {
                    let _ = answer.send(cmd.spawn());
                }
            })
            .map(|_| tx)
            .map_err(|e| format!("cannot start the thread that starts programs: {e}"))
    });
    made.as_ref().map_err(|e| io::Error::other(e.clone()))
}

/// Starts `cmd` with `env`, in a process group of its own, to die with the run (see the module).
pub fn spawn(mut cmd: Command, env: &ChildEnv) -> io::Result<GroupChild> {
    env.apply(&mut cmd);
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        cmd.process_group(0);
    }
    die_with_parent(&mut cmd, DEATH_SIGNAL);
    let (tx, rx) = mpsc::channel();
    spawner()?.send((cmd, tx)).map_err(|_| io::Error::other("the thread that starts programs is gone"))?;
    let child = rx
        .recv_timeout(SPAWN_WAIT)
        .map_err(|_| io::Error::other(format!("not started within {} s", SPAWN_WAIT.as_secs())))??;
    Ok(GroupChild { child, reaped: false })
}

/// The signal a program gets when the run dies: SIGKILL, which it cannot catch nor ignore.
#[cfg(target_os = "linux")]
const DEATH_SIGNAL: i32 = libc::SIGKILL;
#[cfg(not(target_os = "linux"))]
const DEATH_SIGNAL: i32 = 9;

/// Asks the kernel to send `signal` to the program when the thread that starts it exits (Linux;
/// elsewhere there is no such request and this does nothing: the program is killed on drop and
/// at the run's end only). `miles` uses it too, for `miles-engine`.
pub fn die_with_parent(cmd: &mut Command, signal: i32) {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: between fork and exec this calls only prctl and getppid, both
        // async-signal-safe, and allocates nothing.
        let parent = unsafe { libc::getpid() };
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, signal as libc::c_ulong) != 0 {
                    return Err(io::Error::last_os_error());
                }
                // The parent may have died before the request was made: no signal would come.
                if libc::getppid() != parent {
                    return Err(io::Error::other("the run exited while starting the program"));
                }
                Ok(())
            });
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (cmd, signal);
}

/// A program started by [`spawn`], the leader of its own process group. Dropping it kills the
/// group.
pub struct GroupChild {
    child: Child,
    /// Its exit status was collected: its pid may be reused, so the group is not signalled
    /// again unless members may remain (see `kill`).
    reaped: bool,
}

impl GroupChild {
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Its pipes, to hand to the threads that feed and read them.
    pub fn take_stdio(&mut self) -> (Option<ChildStdin>, Option<ChildStdout>, Option<ChildStderr>) {
        (self.child.stdin.take(), self.child.stdout.take(), self.child.stderr.take())
    }

    /// Its exit status, if it has exited (what it started may still run: `kill` ends those).
    pub fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        let status = self.child.try_wait()?;
        self.reaped |= status.is_some();
        Ok(status)
    }

    /// SIGKILL to the program and everything in its group, then its exit status collected
    /// (waiting at most `REAP_WAIT`).
    pub fn kill(&mut self) {
        // A group id stays reserved while any member lives, so after the leader was reaped a
        // signal to it still reaches only the leader's own group; with none left it finds nothing.
        #[cfg(unix)]
        // SAFETY: kill(2) with a negative pid signals one process group.
        unsafe {
            libc::kill(-(self.child.id() as libc::pid_t), libc::SIGKILL);
        }
        if self.reaped {
            return;
        }
        let _ = self.child.kill();
        let deadline = Instant::now() + REAP_WAIT;
        while Instant::now() < deadline {
            if !matches!(self.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for GroupChild {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Helpers of the tests that watch processes come and go (here and in the spawn sites' tests).
#[cfg(test)]
pub(crate) mod testing {
    use std::path::{Path, PathBuf};
    use std::time::{Duration, Instant};

    /// A fresh directory of this test process.
    pub fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("miles-child-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a scratch directory");
        dir
    }

    /// The pid a program wrote to `path`, waiting up to 5 s for it.
    pub fn read_pid(path: &Path) -> u32 {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(pid) = std::fs::read_to_string(path).ok().and_then(|s| s.trim().parse().ok()) {
                return pid;
            }
            assert!(Instant::now() < deadline, "no pid in {} after 5 s", path.display());
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Whether `pid` runs now (a zombie, dead but not yet reaped, does not).
    pub fn alive(pid: u32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|s| !s.contains("State:\tZ"))
    }

    /// Whether `pid` is gone within 2 s.
    pub fn gone(pid: u32) -> bool {
        let deadline = Instant::now() + Duration::from_secs(2);
        while alive(pid) {
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{alive, gone, read_pid, scratch};
    use super::*;
    use std::io::Read;
    use std::process::Stdio;

    /// `sh -c SCRIPT` with its stdout piped.
    fn sh(script: &str) -> Command {
        let mut cmd = Command::new("sh");
        cmd.arg("-c").arg(script).stdin(Stdio::null()).stdout(Stdio::piped());
        cmd
    }

    #[test]
    fn a_program_started_from_a_thread_that_exits_lives_on() {
        // Episode rounds start the environment's program from threads that end with the round.
        let child = std::thread::spawn(|| spawn(sh("exec sleep 1000"), &ChildEnv::engine()).unwrap()).join().unwrap();
        let pid = child.id();
        std::thread::sleep(Duration::from_millis(200));
        assert!(alive(pid), "the program died with the thread that started it");
        drop(child);
        assert!(gone(pid));
    }

    /// Run alone by `a_program_dies_with_the_process_that_started_it`, in a process of its own:
    /// starts a program, writes its pid, and waits to be killed.
    #[test]
    #[ignore = "a helper process of another test"]
    fn helper_starts_a_program_and_waits() {
        let Some(out) = std::env::var_os("CHILD_TEST_PID_FILE") else { return };
        let out = std::path::PathBuf::from(out);
        let script = format!("echo $$ > {}.tmp && mv {0}.tmp {0} && exec sleep 1000", out.display());
        let _child = spawn(sh(&script), &ChildEnv::program(&[]).unwrap()).unwrap();
        std::thread::sleep(Duration::from_secs(30));
    }

    #[test]
    fn a_program_dies_with_the_process_that_started_it() {
        let pid_file = scratch("parent-death").join("pid");
        let mut helper = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "child::tests::helper_starts_a_program_and_waits", "--ignored", "--test-threads=1"])
            .env("CHILD_TEST_PID_FILE", &pid_file)
            // Null, not inherited: a program that outlived the helper would hold the test's pipes.
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let pid = read_pid(&pid_file);
        assert!(alive(pid));
        helper.kill().unwrap(); // SIGKILL: nothing of the helper runs after it
        helper.wait().unwrap();
        assert!(gone(pid), "the program {pid} outlived the process that started it");
    }

    #[test]
    fn a_group_kill_reaches_what_the_program_started_even_after_it_exited() {
        let dir = scratch("group");
        let script = format!("sleep 1000 & echo $! > {}/pid.tmp && mv {0}/pid.tmp {0}/pid", dir.display());
        let mut child = spawn(sh(&script), &ChildEnv::engine()).unwrap();
        let grandchild = read_pid(&dir.join("pid"));
        let t0 = Instant::now();
        while !matches!(child.try_wait(), Ok(Some(_))) && t0.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(alive(grandchild));
        child.kill();
        assert!(gone(grandchild), "the `sleep` {grandchild} outlived its group's kill");
    }

    #[test]
    fn workers_get_the_engine_settings_and_their_token_never_the_api_key() {
        // Names no other test of this process sets differently.
        std::env::set_var("MILES_API_KEY", "secret-key");
        std::env::set_var("MILES_FAULT_CHILD_TEST", "1");
        let script = "echo \"${MILES_API_KEY-unset}|${MILES_RUN_TOKEN-unset}|${MILES_FAULT_CHILD_TEST-unset}\"";
        let read = |env: &ChildEnv| {
            let mut child = spawn(sh(script), env).unwrap();
            let (_, out, _) = child.take_stdio();
            let mut text = String::new();
            out.unwrap().read_to_string(&mut text).unwrap();
            text.trim().to_string()
        };
        assert_eq!(read(&ChildEnv::engine().with("MILES_RUN_TOKEN", "tok")), "unset|tok|1");
        assert_eq!(read(&ChildEnv::program(&[]).unwrap()), "unset|unset|unset");
        let engine = ChildEnv::engine();
        for name in ["PATH", "LC_ALL", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "NCCL_DEBUG", "MILES_CUDA_DEVICE"] {
            assert!(engine.passes(name), "{name}");
        }
        for name in ["MILES_API_KEY", "MILES_RUN_TOKEN", "MILES_HOME", "AWS_SECRET_ACCESS_KEY", "HF_TOKEN"] {
            assert!(!engine.passes(name), "{name}");
        }
        assert!(!ChildEnv::program(&[]).unwrap().passes("LD_LIBRARY_PATH"));
        assert!(ChildEnv::program(&["HF_HOME".into()]).unwrap().passes("HF_HOME"));
    }

    #[test]
    fn a_recipe_cannot_pass_the_runs_own_variables_or_a_non_name() {
        for ok in ["HF_HOME", "_X1", "openai_base_url"] {
            assert_eq!(refuse_pass_name(ok), None, "{ok}");
        }
        for bad in ["MILES_API_KEY", "MILES_RUN_TOKEN", "Miles_Anything", "", "1X", "A=B", "A B", "LC_*"] {
            assert!(refuse_pass_name(bad).is_some(), "{bad:?}");
            assert!(ChildEnv::program(&[bad.into()]).is_err(), "{bad:?}");
        }
    }
}
