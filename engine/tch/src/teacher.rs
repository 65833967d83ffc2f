//! On-policy distillation's teacher stage (std/stages `teacher_logprobs`, docs/recipes/opd.md): the model
//! whose log-probs of the student's sampled tokens make the per-token term. It is loaded in the
//! run's process, or hosted by a worker process of its own (`process = true`: `miles-engine
//! teacher`, JSON lines over a pipe, log-probs sent as f32 bit patterns so they arrive exactly). A
//! worker that dies or stops answering is named, started again and sent the batch again (the
//! teacher is frozen, so the answer is the same); after `MAX_RESTARTS` the step fails, its weights
//! not updated. The runtime checks what comes back (one finite log-prob per response token).
//! The worker starts through `miles_runtime::child` (`spawn_json_lines`): in a process group of
//! its own, killed as a group when it is replaced or the run ends, dead with the run's process,
//! with the engine's environment only (never `MILES_API_KEY` nor the run token).

use crate::model::Policy;
use crate::train::TchTrainer;
use miles_runtime::line_child::LineChild;
use miles_runtime::tasks::TokenId;
use miles_runtime::{OpdSpec, RunError, RunSpec, TeacherScorer, Trajectory, E_BACKEND, E_CHECKPOINT};
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::io::{BufRead, Write};
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

/// Restarts of a dead teacher worker within one run before the run stops.
pub const MAX_RESTARTS: u32 = 3;
/// Longest wait for the worker to load the teacher, and for one batch's log-probs.
const WAIT: Duration = Duration::from_secs(600);

/// The teacher stage as the runtime runs it: the teacher, and its forward's micro-batch and
/// temperature (the trainer's, so its log-probs are on the student's scale).
pub struct TchTeacher {
    teacher: Teacher,
    micro: usize,
    temperature: f64,
}

impl TchTeacher {
    /// The run's teacher stage, checked against the student it distils into.
    pub fn for_run(spec: &RunSpec) -> Result<TchTeacher, RunError> {
        let o = spec.train.opd.as_ref().ok_or_else(|| RunError::new(E_BACKEND, "this run has no teacher stage"))?;
        crate::select_device(spec)?;
        let (vocab, max_len) = (spec.model.vocab_size, spec.model.max_len);
        TchTeacher::load(o, vocab, max_len, spec.train.micro_batch, spec.rollout.temperature)
    }

    /// The teacher of `o` for a student of `vocab` tokens and `max_len` positions.
    pub fn load(
        o: &OpdSpec,
        vocab: usize,
        max_len: usize,
        micro: usize,
        temperature: f64,
    ) -> Result<TchTeacher, RunError> {
        Ok(TchTeacher { teacher: Teacher::load(o, vocab, max_len)?, micro: micro.max(1), temperature })
    }
}

impl TeacherScorer for TchTeacher {
    fn logprobs(&mut self, batch: &[Trajectory]) -> Result<Vec<Vec<f32>>, RunError> {
        let (micro, temperature) = (self.micro, self.temperature);
        crate::guard("the teacher's forward", || self.teacher.logprobs(batch, micro, temperature))
    }
    fn restarts(&self) -> u32 {
        self.teacher.restarts()
    }
}

enum Teacher {
    Local(Box<Policy>),
    Process(TeacherProcess),
}

impl Teacher {
    fn load(o: &OpdSpec, vocab: usize, max_len: usize) -> Result<Teacher, RunError> {
        if !o.process {
            let t = load_checked(&o.teacher, vocab, max_len)?;
            return Ok(Teacher::Local(Box::new(t)));
        }
        let exe = crate::engine_exe("teacher")?;
        let argv = vec![
            exe.to_string_lossy().into_owned(),
            "teacher".into(),
            "--model".into(),
            o.teacher.to_string_lossy().into_owned(),
            "--vocab".into(),
            vocab.to_string(),
            "--max-len".into(),
            max_len.to_string(),
            // The trainer's thread count, so the worker's forward is the in-process one bit for bit.
            "--threads".into(),
            tch::get_num_threads().max(1).to_string(),
        ];
        Ok(Teacher::Process(TeacherProcess::start(argv)?))
    }

    /// The teacher's log-prob of every sampled token.
    fn logprobs(&mut self, batch: &[Trajectory], micro: usize, temperature: f64) -> Result<Vec<Vec<f32>>, RunError> {
        // The teacher is another model: it routes its own experts.
        match self {
            Teacher::Local(t) => TchTrainer::logprobs_of(t, batch, micro, temperature, false),
            Teacher::Process(p) => p.logprobs(batch, micro, temperature),
        }
    }

    /// Restarts of the worker process so far (0 in process).
    fn restarts(&self) -> u32 {
        match self {
            Teacher::Local(_) => 0,
            Teacher::Process(p) => p.restarts,
        }
    }
}

/// Loads a teacher directory and checks it against a student of `vocab` tokens and `max_len`.
fn load_checked(dir: &Path, vocab: usize, max_len: usize) -> Result<Policy, RunError> {
    let (t, _) = Policy::load_hf(dir, None)?;
    let name = dir.display();
    if t.cfg.vocab_size != vocab {
        return Err(RunError::new(
            E_CHECKPOINT,
            format!("teacher {name}: vocabulary of {} tokens, the student's is {vocab}", t.cfg.vocab_size),
        )
        .with_help("distil from a teacher with the student's tokenizer"));
    }
    if t.cfg.max_len < max_len {
        return Err(RunError::new(
            E_CHECKPOINT,
            format!("teacher {name}: max_len {} is shorter than the student's {max_len}", t.cfg.max_len),
        ));
    }
    t.set_requires_grad(false);
    Ok(t)
}

/// One request: a batch's prompts and responses, with the forward's settings.
#[derive(Serialize, Deserialize)]
struct Request {
    k: u64,
    micro: usize,
    temperature: f64,
    prompts: Vec<Vec<TokenId>>,
    responses: Vec<Vec<TokenId>>,
}

/// One answer: per sample, the log-prob of each response token as `f32::to_bits`.
#[derive(Serialize, Deserialize)]
struct Reply {
    k: u64,
    #[serde(default)]
    bits: Option<Vec<Vec<u32>>>,
    #[serde(default)]
    error: Option<String>,
}

/// The teacher in a worker process: its command line, the running child and its answers.
pub struct TeacherProcess {
    argv: Vec<String>,
    child: LineChild,
    answers: mpsc::Receiver<Result<serde_json::Value, String>>,
    next: u64,
    pub restarts: u32,
}

impl TeacherProcess {
    fn start(argv: Vec<String>) -> Result<TeacherProcess, RunError> {
        let (child, answers) = spawn_ready(&argv)?;
        eprintln!("miles run: teacher worker process {} started", child.child.id());
        Ok(TeacherProcess { argv, child, answers, next: 0, restarts: 0 })
    }

    fn logprobs(&mut self, batch: &[Trajectory], micro: usize, temperature: f64) -> Result<Vec<Vec<f32>>, RunError> {
        self.next += 1;
        let req = Request {
            k: self.next,
            micro,
            temperature,
            prompts: batch.iter().map(|t| t.prompt.clone()).collect(),
            responses: batch.iter().map(|t| t.response.clone()).collect(),
        };
        let line = serde_json::to_string(&req).map_err(|e| RunError::new(E_BACKEND, e.to_string()))?;
        loop {
            let _ = self.child.stdin.send(line.clone());
            let why = loop {
                match self.answers.recv_timeout(WAIT) {
                    Ok(Ok(v)) => match serde_json::from_value::<Reply>(v) {
                        Ok(r) if r.k == req.k => match (r.bits, r.error) {
                            (Some(b), None) if b.len() == batch.len() => {
                                return Ok(b
                                    .into_iter()
                                    .map(|row| row.into_iter().map(f32::from_bits).collect())
                                    .collect());
                            }
                            (_, Some(e)) => return Err(RunError::new(E_BACKEND, format!("teacher worker: {e}"))),
                            _ => break "answered a batch of another size".to_string(),
                        },
                        // An answer to a request sent before a restart.
                        Ok(_) => continue,
                        Err(e) => break format!("answered a line that is not a reply: {e}"),
                    },
                    Ok(Err(why)) => break why,
                    Err(_) => break format!("did not answer within {} s", WAIT.as_secs()),
                }
            };
            self.restart(&why)?;
        }
    }

    fn restart(&mut self, why: &str) -> Result<(), RunError> {
        let pid = self.child.child.id();
        if self.restarts >= MAX_RESTARTS {
            return Err(RunError::new(
                E_BACKEND,
                format!(
                    "the teacher worker process {pid} {why}; restarted {MAX_RESTARTS} times already, the run stops \
                     (this step's weights were not updated)"
                ),
            ));
        }
        self.restarts += 1;
        eprintln!("miles run: teacher worker process {pid} {why}; starting it again and resending the batch");
        let (child, answers) = spawn_ready(&self.argv)?;
        self.child = child;
        self.answers = answers;
        Ok(())
    }
}

/// Starts the worker and waits for its `ready` line (it has loaded and checked the teacher).
fn spawn_ready(argv: &[String]) -> Result<(LineChild, mpsc::Receiver<Result<serde_json::Value, String>>), RunError> {
    let (child, rx) = miles_runtime::line_child::spawn_json_lines::<serde_json::Value>(argv)
        .map_err(|e| RunError::new(E_BACKEND, format!("cannot start the teacher worker `{}`: {e}", argv[0])))?;
    match rx.recv_timeout(WAIT) {
        Ok(Ok(v)) if v.get("ready").and_then(serde_json::Value::as_bool) == Some(true) => Ok((child, rx)),
        Ok(Ok(v)) => Err(RunError::new(E_BACKEND, format!("the teacher worker said {v} before it was ready"))),
        Ok(Err(why)) => Err(RunError::new(E_CHECKPOINT, format!("the teacher worker {why}"))),
        Err(_) => Err(RunError::new(E_BACKEND, format!("the teacher worker did not load within {} s", WAIT.as_secs()))),
    }
}

/// `miles-engine teacher`: loads the teacher, checks it against the student's vocabulary and
/// context, says it is ready, then answers request lines on stdin until stdin closes.
pub fn worker_main(model: &Path, vocab: usize, max_len: usize, threads: usize) -> Result<(), RunError> {
    tch::set_num_threads(threads.max(1) as i32);
    let t = load_checked(model, vocab, max_len)?;
    let mut out = std::io::stdout().lock();
    let say = |out: &mut std::io::StdoutLock, v: serde_json::Value| writeln!(out, "{v}").and_then(|_| out.flush());
    if say(&mut out, json!({"ready": true})).is_err() {
        return Ok(());
    }
    for line in std::io::stdin().lock().lines() {
        let line = line.map_err(|e| RunError::new(E_BACKEND, format!("stdin: {e}")))?;
        let reply = match serde_json::from_str::<Request>(&line) {
            Ok(req) => {
                let batch: Vec<Trajectory> =
                    req.prompts.into_iter().zip(req.responses).map(|(p, r)| Trajectory::to_score(p, r)).collect();
                match TchTrainer::logprobs_of(&t, &batch, req.micro, req.temperature, false) {
                    Ok(lp) => Reply {
                        k: req.k,
                        bits: Some(lp.into_iter().map(|r| r.into_iter().map(f32::to_bits).collect()).collect()),
                        error: None,
                    },
                    Err(e) => Reply { k: req.k, bits: None, error: Some(e.message) },
                }
            }
            Err(e) => Reply { k: 0, bits: None, error: Some(format!("not a request: {e}")) },
        };
        if say(&mut out, serde_json::to_value(&reply).unwrap_or_default()).is_err() {
            break;
        }
    }
    Ok(())
}
