//! The diffusion reward stage: the reward model and analytic terms (`Scorer`), run on a thread
//! of the run's process or in a worker process of its own (`miles-engine image-reward`, fed JSON
//! lines over a pipe), behind one interface the run loop uses: `send` a micro-group, `recv` its
//! scores in any order, `score_now` for an evaluation. A worker process that dies is named, started
//! again and sent every micro-group it had not answered (scores are a function of the images, so
//! nothing changes but time); after `MAX_RESTARTS` the step fails untrained.

use super::reward::{Analytic, Classifier};
use miles_runtime::diffusion::{AnalyticReward, DiffusionRewardSpec};
use miles_runtime::line_child::LineChild;
use miles_runtime::{RunError, E_BACKEND};
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;
use tch::Tensor;

/// Restarts of a dead reward worker process within one run before the run stops.
pub const MAX_RESTARTS: u32 = 3;
/// Longest wait for one micro-group's scores.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(600);

/// The reward of an image: the classifier's weighted probability plus the analytic term.
pub struct Scorer {
    pub classifier: Classifier,
    pub analytic: Option<Analytic>,
    pub spec: DiffusionRewardSpec,
}

impl Scorer {
    pub fn new(classifier: Classifier, spec: &DiffusionRewardSpec) -> Scorer {
        let analytic = spec.analytic.map(|a| match a {
            AnalyticReward::Brightness => Analytic::Brightness,
            AnalyticReward::Contrast => Analytic::Contrast,
            AnalyticReward::CenterMass => Analytic::CenterMass,
        });
        Scorer { classifier, analytic, spec: spec.clone() }
    }

    pub fn score(&self, images: &Tensor, conds: &[i64]) -> Result<Vec<f32>, RunError> {
        let p = self.classifier.score(images, conds)?;
        let a = match &self.analytic {
            Some(a) => a.score(images)?,
            None => vec![0.0; p.len()],
        };
        Ok(p.iter()
            .zip(&a)
            .map(|(p, a)| (self.spec.classifier_weight * *p as f64 + self.spec.analytic_weight * *a as f64) as f32)
            .collect())
    }
}

/// A micro-group handed to the reward stage: its index, images and conditions.
type Job = (usize, Tensor, Vec<i64>);
type Answer = (usize, Result<Vec<f32>, RunError>);

/// Where the reward stage runs.
pub enum RewardStage {
    Thread(ThreadStage),
    Process(ProcessStage),
}

impl RewardStage {
    pub fn send(&mut self, k: usize, images: Tensor, conds: Vec<i64>) -> Result<(), RunError> {
        match self {
            RewardStage::Thread(t) => t.send(k, images, conds),
            RewardStage::Process(p) => p.send(k, images, conds),
        }
    }

    pub fn recv(&mut self) -> Result<(usize, Vec<f32>), RunError> {
        let (k, r) = match self {
            RewardStage::Thread(t) => t.recv()?,
            RewardStage::Process(p) => p.recv()?,
        };
        Ok((k, r.map_err(|e| RunError::new(e.code, format!("reward stage: {}", e.message)))?))
    }

    /// Scores one batch and waits for it (evaluation).
    pub fn score_now(&mut self, images: &Tensor, conds: &[i64]) -> Result<Vec<f32>, RunError> {
        self.send(usize::MAX, images.shallow_clone(), conds.to_vec())?;
        self.recv().map(|(_, r)| r)
    }

    /// Restarts of the worker process so far (0 on a thread).
    pub fn restarts(&self) -> u32 {
        match self {
            RewardStage::Thread(_) => 0,
            RewardStage::Process(p) => p.restarts,
        }
    }
}

/// The reward stage on a thread of its own, which owns the reward model: jobs in, scores out.
pub struct ThreadStage {
    jobs: Option<mpsc::Sender<Job>>,
    results: mpsc::Receiver<Answer>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl ThreadStage {
    pub fn start(scorer: Scorer) -> ThreadStage {
        let (job_tx, job_rx) = mpsc::channel::<Job>();
        let (res_tx, res_rx) = mpsc::channel();
        let handle = std::thread::spawn(move || {
            // One intra-op thread: the other core denoises meanwhile.
            tch::set_num_threads(1);
            let _g = tch::no_grad_guard();
            for (k, images, conds) in job_rx {
                if res_tx.send((k, scorer.score(&images, &conds))).is_err() {
                    break;
                }
            }
        });
        ThreadStage { jobs: Some(job_tx), results: res_rx, handle: Some(handle) }
    }

    fn send(&self, k: usize, images: Tensor, conds: Vec<i64>) -> Result<(), RunError> {
        self.jobs.as_ref().and_then(|j| j.send((k, images, conds)).ok()).ok_or_else(|| {
            RunError::new(E_BACKEND, "the reward stage stopped (its thread ended); the step was not trained")
        })
    }

    fn recv(&self) -> Result<Answer, RunError> {
        self.results.recv_timeout(ANSWER_TIMEOUT).map_err(|_| {
            RunError::new(E_BACKEND, "the reward stage did not answer within 600 s or died; the step was not trained")
        })
    }
}

impl Drop for ThreadStage {
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// What `miles-engine image-reward` is started with (one JSON argument).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkerConfig {
    /// The classifier directory (config.json + model.safetensors) to load.
    pub classifier: PathBuf,
    pub side: usize,
    pub conditions: usize,
    pub reward: DiffusionRewardSpec,
}

/// One request line: a micro-group's conditions and images (flattened, row-major [B, 1, S, S]).
#[derive(Serialize, Deserialize)]
struct Request {
    k: usize,
    conds: Vec<i64>,
    pixels: Vec<f32>,
}

/// One answer line: the scores, or why there are none.
#[derive(Serialize, Deserialize)]
struct Reply {
    k: usize,
    #[serde(default)]
    rewards: Option<Vec<f32>>,
    #[serde(default)]
    error: Option<String>,
}

/// The reward stage in a worker process: `argv` (the `miles-engine` binary and its
/// `image-reward` arguments), the micro-groups it has not answered yet, and its answers.
pub struct ProcessStage {
    argv: Vec<String>,
    child: LineChild,
    answers: mpsc::Receiver<Result<Reply, String>>,
    pending: BTreeMap<usize, (Vec<i64>, Vec<f32>)>,
    pub restarts: u32,
}

impl ProcessStage {
    /// Starts `exe image-reward CONFIG`.
    pub fn start(exe: &Path, config: &WorkerConfig) -> Result<ProcessStage, RunError> {
        let cfg = serde_json::to_string(config).map_err(|e| RunError::new(E_BACKEND, e.to_string()))?;
        let argv = vec![exe.to_string_lossy().into_owned(), "image-reward".into(), "--config".into(), cfg];
        let (child, answers) = spawn(&argv)?;
        eprintln!("miles run: reward worker process {} started", child.child.id());
        Ok(ProcessStage { argv, child, answers, pending: BTreeMap::new(), restarts: 0 })
    }

    fn send(&mut self, k: usize, images: Tensor, conds: Vec<i64>) -> Result<(), RunError> {
        let pixels = crate::model::f32_values(&images)?;
        self.write(k, &conds, &pixels);
        self.pending.insert(k, (conds, pixels));
        Ok(())
    }

    fn write(&self, k: usize, conds: &[i64], pixels: &[f32]) {
        let line = json!({"k": k, "conds": conds, "pixels": pixels}).to_string();
        // A dead worker's pipe: noticed by `recv`, which restarts it and sends this again.
        let _ = self.child.stdin.send(line);
    }

    fn recv(&mut self) -> Result<Answer, RunError> {
        loop {
            let got = self.answers.recv_timeout(ANSWER_TIMEOUT);
            match got {
                Ok(Ok(reply)) if self.pending.remove(&reply.k).is_some() => {
                    let r = match (reply.rewards, reply.error) {
                        (Some(r), None) => Ok(r),
                        (_, e) => Err(RunError::new(E_BACKEND, e.unwrap_or_else(|| "no rewards in the answer".into()))),
                    };
                    return Ok((reply.k, r));
                }
                // An answer to a micro-group already scored (sent again after a restart).
                Ok(Ok(_)) => continue,
                Ok(Err(why)) => self.restart(&why)?,
                Err(_) => self.restart("did not answer within 600 s")?,
            }
        }
    }

    /// The worker died or hung: named on stderr, started again, and sent what it owed.
    fn restart(&mut self, why: &str) -> Result<(), RunError> {
        let pid = self.child.child.id();
        let tail = self.child.stderr_tail();
        let said = if tail.is_empty() { String::new() } else { format!("; stderr ends: {tail}") };
        if self.restarts >= MAX_RESTARTS {
            return Err(RunError::new(
                E_BACKEND,
                format!(
                    "the reward worker process {pid} {why}{said}; restarted {MAX_RESTARTS} times already, the run stops \
                     (the step was not trained; the last good denoiser is denoiser.safetensors)"
                ),
            ));
        }
        self.restarts += 1;
        eprintln!(
            "miles run: reward worker process {pid} {why}{said}; starting it again and resending {} micro-group(s)",
            self.pending.len()
        );
        let (child, answers) = spawn(&self.argv)?;
        self.child = child;
        self.answers = answers;
        for (k, (conds, pixels)) in &self.pending {
            self.write(*k, conds, pixels);
        }
        Ok(())
    }
}

fn spawn(argv: &[String]) -> Result<(LineChild, mpsc::Receiver<Result<Reply, String>>), RunError> {
    miles_runtime::line_child::spawn_json_lines(argv)
        .map_err(|e| RunError::new(E_BACKEND, format!("cannot start the reward worker `{}`: {e}", argv[0])))
}

/// `miles-engine image-reward`: loads the classifier named by `config` and answers request lines
/// on stdin with reply lines on stdout until stdin closes.
pub fn worker_main(config: &WorkerConfig) -> Result<(), RunError> {
    tch::set_num_threads(1);
    let _g = tch::no_grad_guard();
    let mut classifier = Classifier::load_dir(&config.classifier, config.side, config.conditions)?
        .with_extra_cost(Duration::from_millis(config.reward.extra_cost_ms));
    classifier.temperature = config.reward.classifier_temperature;
    let scorer = Scorer::new(classifier, &config.reward);
    let side = config.side as i64;
    let stdin = std::io::stdin();
    let mut out = std::io::stdout().lock();
    for line in stdin.lock().lines() {
        let line = line.map_err(|e| RunError::new(E_BACKEND, format!("stdin: {e}")))?;
        let reply = match serde_json::from_str::<Request>(&line) {
            Ok(req) => {
                let b = req.conds.len() as i64;
                let r = if req.pixels.len() as i64 != b * side * side {
                    Err(format!("{} pixels for {b} images of {side}x{side}", req.pixels.len()))
                } else {
                    let images = Tensor::from_slice(&req.pixels).view([b, 1, side, side]);
                    scorer.score(&images, &req.conds).map_err(|e| e.message)
                };
                match r {
                    Ok(r) => Reply { k: req.k, rewards: Some(r), error: None },
                    Err(e) => Reply { k: req.k, rewards: None, error: Some(e) },
                }
            }
            Err(e) => Reply { k: usize::MAX, rewards: None, error: Some(format!("not a request: {e}")) },
        };
        let text = serde_json::to_string(&reply).unwrap_or_default();
        if writeln!(out, "{text}").and_then(|_| out.flush()).is_err() {
            break;
        }
    }
    Ok(())
}
