//! Evaluations in the asynchronous executor: on the shared engine between two generation steps
//! (`evaluate_stream`), on a second engine beside training (snapshot), or by an external command;
//! each is written as its own metrics row at the step it measured.

use super::timeout_err;
use crate::atomic_write::write_dir_atomically;
use crate::backend::{EvalEngine, StreamEngine, Trainer, WeightSnapshot, WeightTransport};
use crate::reward::BatchReward;
use crate::run::step::episodes::EnvRunner;
use crate::run::step::eval::evaluate;
use crate::run::step::metrics::Metrics;
use crate::schedule::{AsyncSpec, EvalMode};
use crate::spec::RunSpec;
use crate::stream::StreamAsBatch;
use crate::tasks::TaskSet;
use crate::{RunError, E_BACKEND, E_OUT_DIR, E_SPEC};
use serde_json::{json, Map, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What one held-out evaluation measured.
#[derive(Debug, Clone)]
pub(super) struct EvalResult {
    /// Training step whose weights were evaluated.
    pub(super) step: u64,
    pub(super) metrics: Vec<(String, f64)>,
    pub(super) seconds: f64,
}

pub(super) fn acc_metrics(acc: (f64, f64)) -> Vec<(String, f64)> {
    vec![("accuracy".into(), acc.0), ("response_len".into(), acc.1)]
}

/// Writes one evaluation as its own row at the step it measured; returns its accuracy.
pub(super) fn write_eval_row(metrics: &mut Metrics, r: &EvalResult, now: u64) -> Result<Option<f64>, RunError> {
    let mut row = Map::new();
    row.insert("step".into(), json!(r.step));
    for (k, v) in &r.metrics {
        row.insert(format!("eval/{k}"), json!(v));
    }
    row.insert("eval/lag_steps".into(), json!(now.saturating_sub(r.step)));
    row.insert("perf/eval_s".into(), json!(r.seconds));
    metrics.write(&row)?;
    Ok(r.metrics.iter().find(|(k, _)| k == "accuracy").map(|(_, v)| *v))
}

/// Held-out success on the shared streaming engine (`step::eval::evaluate`, episodes included): its
/// requests go in as the engine has slots, with ids far above the generation thread's (which is
/// idle while this runs: a caller drains or aborts generation first).
pub(super) fn evaluate_stream(
    spec: &RunSpec,
    task: &TaskSet,
    reward: &mut dyn BatchReward,
    env: Option<&EnvRunner>,
    engine: &mut dyn StreamEngine,
) -> Result<(f64, f64), RunError> {
    let mut batch = StreamAsBatch { engine, base_id: u64::MAX / 2 };
    evaluate(spec, task, reward, env, &mut batch)
}

/// Snapshot and external evaluations, which run beside training.
pub(super) enum EvalRunner {
    /// Shared-mode evaluations go through the generation thread; nothing here.
    None,
    Snapshot {
        /// The recipe's name of the evaluation stage, for messages.
        stage: String,
        tx: std::sync::mpsc::Sender<(u64, Arc<WeightSnapshot>)>,
        rx: std::sync::mpsc::Receiver<Result<EvalResult, RunError>>,
        outstanding: usize,
    },
    External {
        stage: String,
        command: String,
        dir: PathBuf,
        running: Vec<(u64, std::process::Child, Instant, PathBuf)>,
        stall: Duration,
        task: Arc<TaskSet>,
    },
}

impl EvalRunner {
    pub(super) fn start(
        spec: &RunSpec,
        cfg: &AsyncSpec,
        eval_engine: Option<Box<dyn EvalEngine>>,
        mut reward: Box<dyn BatchReward>,
        task: &Arc<TaskSet>,
        out: &Path,
        threads: Option<usize>,
    ) -> Result<EvalRunner, RunError> {
        match spec.eval.mode {
            EvalMode::Shared => Ok(EvalRunner::None),
            EvalMode::Snapshot => {
                let Some(mut engine) = eval_engine else {
                    return Err(RunError::new(E_SPEC, "this backend has no second engine for eval.mode = snapshot")
                        .with_help("use eval mode shared or external"));
                };
                let stage = spec.stages.eval.clone();
                let (tx, req_rx) = std::sync::mpsc::channel::<(u64, Arc<WeightSnapshot>)>();
                let (res_tx, rx) = std::sync::mpsc::channel();
                let task = task.clone();
                let spec = spec.clone();
                let env = EnvRunner::for_run(&spec)?;
                std::thread::Builder::new()
                    .name("miles-eval".into())
                    .spawn(move || {
                        engine.bind_thread(threads);
                        while let Ok((step, w)) = req_rx.recv() {
                            let t0 = Instant::now();
                            let res = engine
                                .load_weights(&w)
                                .and_then(|_| evaluate(&spec, &task, reward.as_mut(), env.as_ref(), engine.as_mut()))
                                .map(|acc| EvalResult {
                                    step,
                                    metrics: acc_metrics(acc),
                                    seconds: t0.elapsed().as_secs_f64(),
                                });
                            if res_tx.send(res).is_err() {
                                return;
                            }
                        }
                    })
                    .map_err(|e| RunError::new(E_BACKEND, format!("cannot start the evaluation thread: {e}")))?;
                Ok(EvalRunner::Snapshot { stage, tx, rx, outstanding: 0 })
            }
            EvalMode::External => Ok(EvalRunner::External {
                stage: spec.stages.eval.clone(),
                command: spec.eval.command.clone().unwrap_or_default(),
                dir: out.join("eval"),
                running: Vec::new(),
                stall: Duration::from_secs_f64(cfg.stall_timeout_s),
                task: task.clone(),
            }),
        }
    }

    /// Starts the evaluation of the trainer's current weights (step `step`).
    pub(super) fn request(
        &mut self,
        step: u64,
        trainer: &dyn Trainer,
        transport: &mut dyn WeightTransport,
    ) -> Result<(), RunError> {
        match self {
            EvalRunner::None => Ok(()),
            EvalRunner::Snapshot { stage, tx, outstanding, .. } => {
                let w = transport.transfer(trainer.export_full_weights()?)?;
                tx.send((step, Arc::new(w))).map_err(|_| {
                    RunError::new(E_BACKEND, format!("the evaluation thread (stage `{}`) has stopped", stage))
                })?;
                *outstanding += 1;
                Ok(())
            }
            EvalRunner::External { command, dir, running, task, .. } => {
                let model = dir.join(format!("step-{step:08}"));
                write_dir_atomically(&model, |tmp| {
                    trainer.save_model(tmp)?;
                    task.tokenizer.save(tmp)
                })?;
                let out_path = dir.join(format!("step-{step:08}.out"));
                let stdout = std::fs::File::create(&out_path)
                    .map_err(|e| RunError::io(E_OUT_DIR, "cannot create", &out_path, e))?;
                let stderr = stdout.try_clone().map_err(|e| RunError::io(E_OUT_DIR, "cannot open", &out_path, e))?;
                // The directory is the command's last argument, quoted for the shell.
                let quoted = format!("'{}'", model.display().to_string().replace('\'', "'\\''"));
                let child = std::process::Command::new("sh")
                    .arg("-c")
                    .arg(format!("{command} {quoted}"))
                    .stdin(std::process::Stdio::null())
                    .stdout(stdout)
                    .stderr(stderr)
                    .spawn()
                    .map_err(|e| RunError::new(E_BACKEND, format!("cannot start the eval command `{command}`: {e}")))?;
                running.push((step, child, Instant::now(), out_path));
                Ok(())
            }
        }
    }

    /// Evaluations that finished since the last call (never waits).
    pub(super) fn poll(&mut self) -> Result<Vec<EvalResult>, RunError> {
        self.collect(Duration::ZERO)
    }

    /// Waits (bounded) for every evaluation still running.
    pub(super) fn finish(&mut self, limit: Duration) -> Result<Vec<EvalResult>, RunError> {
        self.collect(limit)
    }

    fn collect(&mut self, wait: Duration) -> Result<Vec<EvalResult>, RunError> {
        let t0 = Instant::now();
        let mut out = Vec::new();
        match self {
            EvalRunner::None => {}
            EvalRunner::Snapshot { stage, rx, outstanding, .. } => {
                while *outstanding > 0 {
                    let left = wait.saturating_sub(t0.elapsed());
                    let got = if left.is_zero() { rx.try_recv().ok() } else { rx.recv_timeout(left).ok() };
                    match got {
                        Some(r) => {
                            *outstanding -= 1;
                            out.push(r?);
                        }
                        None if wait.is_zero() => break,
                        None => {
                            return Err(timeout_err(format!(
                                "the evaluation stage `{}` (snapshot engine) did not answer within {:.0} s",
                                stage,
                                wait.as_secs_f64()
                            )))
                        }
                    }
                }
            }
            EvalRunner::External { stage, command, running, stall, .. } => loop {
                let mut i = 0;
                while i < running.len() {
                    let (step, child, since, out_path) = &mut running[i];
                    match child.try_wait() {
                        Ok(Some(status)) => {
                            let text = std::fs::read_to_string(&*out_path).unwrap_or_default();
                            if !status.success() {
                                return Err(RunError::new(
                                    E_BACKEND,
                                    format!(
                                        "the eval command `{command}` failed at step {step} ({status}); its output is in {}",
                                        out_path.display()
                                    ),
                                ));
                            }
                            out.push(EvalResult {
                                step: *step,
                                metrics: parse_external(&text),
                                seconds: since.elapsed().as_secs_f64(),
                            });
                            running.remove(i);
                        }
                        Ok(None) if since.elapsed() > *stall => {
                            let _ = child.kill();
                            let _ = child.wait();
                            return Err(timeout_err(format!(
                                "the eval command `{command}` (stage `{}`) ran over {:.0} s at step {step}",
                                stage,
                                stall.as_secs_f64()
                            )));
                        }
                        Ok(None) => i += 1,
                        Err(e) => return Err(RunError::new(E_BACKEND, format!("cannot wait for `{command}`: {e}"))),
                    }
                }
                if running.is_empty() || wait.is_zero() {
                    break;
                }
                if t0.elapsed() > wait {
                    return Err(timeout_err(format!(
                        "the eval command `{command}` (stage `{}`) did not finish within {:.0} s",
                        stage,
                        wait.as_secs_f64()
                    )));
                }
                std::thread::sleep(Duration::from_millis(20));
            },
        }
        Ok(out)
    }
}

/// The last line of an external evaluation's output that is a JSON object: its numbers.
fn parse_external(text: &str) -> Vec<(String, f64)> {
    text.lines()
        .rev()
        .find_map(|l| serde_json::from_str::<Map<String, Value>>(l.trim()).ok())
        .map(|m| m.into_iter().filter_map(|(k, v)| v.as_f64().map(|x| (k, x))).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn external_output() {
        let m = parse_external("loading\n{\"accuracy\": 0.5, \"note\": \"x\"}\n");
        assert_eq!(m, vec![("accuracy".to_string(), 0.5)]);
        assert!(parse_external("no json").is_empty());
    }
}
