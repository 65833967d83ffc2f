//! The trainer, remote: `Trainer` over the worker protocol. One trainer process, or a
//! data-parallel group whose every rank gets training and control calls at once (`ranks.rs`);
//! log-probs, weight publication and the final model are rank 0's.

use super::ranks::call_trainers;
use super::{call_shared, lock, Fleet, SharedFleet, Which};
use crate::convert::*;
use crate::pb;
use crate::transport::TransferReport;
use crate::E_TRANSFER;
use miles_runtime::tasks::TokenId;
use miles_runtime::{RunError, SftStats, TrainStats, Trainer, Trajectory, WeightSnapshot};
use std::path::Path;

/// The trainer, remote.
pub struct RemoteTrainer {
    pub fleet: SharedFleet,
    version: u64,
    /// A failure in a call that cannot return one (reset_optimizer), reported by the next call.
    pending: Option<RunError>,
}

impl RemoteTrainer {
    pub fn new(fleet: SharedFleet) -> Self {
        RemoteTrainer { fleet, version: 0, pending: None }
    }
    fn fleet(&self) -> std::sync::MutexGuard<'_, Fleet> {
        lock(&self.fleet)
    }
    fn control(&mut self, op: &str, dir: &Path) -> Result<u64, RunError> {
        if let Some(e) = self.pending.take() {
            return Err(e);
        }
        self.control_all(op, dir)
    }

    /// A control op on every trainer rank at once: a data-parallel group saves (gathering
    /// ZeRO's moments to rank 0, which writes), loads and resets together.
    fn control_all(&self, op: &str, dir: &Path) -> Result<u64, RunError> {
        let req = pb::ControlRequest { op: op.into(), dir: dir.to_string_lossy().into_owned() };
        let r = call_trainers(&self.fleet, move |_, mut c| {
            let req = req.clone();
            async move { c.control(req).await }
        })?;
        Ok(r.version)
    }
}

impl Trainer for RemoteTrainer {
    fn train_rl(&mut self, batch: &[Trajectory], lrs: &[f64], temperature: f64) -> Result<TrainStats, RunError> {
        if let Some(e) = self.pending.take() {
            return Err(e);
        }
        let req = pb::TrainRlRequest { batch: batch.iter().map(traj_to_pb).collect(), lrs: lrs.to_vec(), temperature };
        // Every rank gets the whole batch and trains its share of each optimizer step.
        let r = call_trainers(&self.fleet, move |_, mut c| {
            let req = req.clone();
            async move { c.train_rl(req).await }
        })?;
        self.version = r.version;
        Ok(stats_from_pb(r.stats.unwrap_or_default()))
    }

    fn train_sft(&mut self, batch: &[(Vec<TokenId>, Vec<TokenId>)], lr: f64) -> Result<SftStats, RunError> {
        let req = pb::TrainSftRequest {
            batch: batch.iter().map(|(p, a)| pb::SftPair { prompt: p.clone(), answer: a.clone() }).collect(),
            lr,
        };
        let r = call_trainers(&self.fleet, move |_, mut c| {
            let req = req.clone();
            async move { c.train_sft(req).await }
        })?;
        Ok(SftStats { loss: r.loss, grad_norm: r.grad_norm, tokens: r.tokens })
    }

    fn reset_optimizer(&mut self) {
        if let Err(e) = self.control("reset_optimizer", Path::new("")) {
            self.pending = Some(e);
        }
    }

    fn freeze_reference(&mut self) -> Result<(), RunError> {
        self.control("freeze_reference", Path::new("")).map(|_| ())
    }

    fn logprobs(
        &mut self,
        prompts: &[Vec<TokenId>],
        responses: &[Vec<TokenId>],
        temperature: f64,
    ) -> Result<Vec<Vec<f32>>, RunError> {
        let req = pb::LogprobsRequest {
            prompts: prompts.iter().map(|p| pb::TokenSeq { ids: p.clone() }).collect(),
            responses: responses.iter().map(|p| pb::TokenSeq { ids: p.clone() }).collect(),
            temperature,
        };
        let r = call_shared(&self.fleet, Which::Trainer, None, |mut c| async move { c.logprobs(req).await })?;
        Ok(r.logprobs.into_iter().map(|s| s.values).collect())
    }

    fn version(&self) -> u64 {
        self.version
    }

    fn last_sync_bytes(&self) -> Option<u64> {
        self.fleet().last_report.as_ref().map(|r| r.bytes)
    }

    /// Moves the weights trainer -> engines with the recipe's transport. The snapshot returned is
    /// a receipt (its version, no tensors): the bytes went straight from the trainer process to the
    /// engines, and `RemoteEngine::load_weights` activates that version on each.
    fn export_weights(&self) -> Result<WeightSnapshot, RunError> {
        loop {
            let req = {
                let f = self.fleet();
                let targets: Vec<pb::Target> = f
                    .engines
                    .iter()
                    .filter(|e| e.alive)
                    .map(|e| pb::Target { worker_id: e.reg.worker_id.clone(), data_addr: e.reg.data_addr.clone() })
                    .collect();
                pb::PublishRequest {
                    transport: f.transport.clone(),
                    bucket_bytes: f.bucket_bytes,
                    targets,
                    verify_full: f.verify_full,
                    delta_dir: f.delta_dir.to_string_lossy().into_owned(),
                    shards: 0,
                    timeout_ms: (f.deadlines.call.as_millis() as u64 * 3 / 4).max(1),
                    channel: f.channel.clone(),
                }
            };
            match call_shared(&self.fleet, Which::Trainer, None, |mut c| async move { c.publish_weights(req).await }) {
                Ok(r) => {
                    let rep = r.report.unwrap_or_default();
                    let report = TransferReport {
                        transport: rep.transport,
                        version: rep.version,
                        bytes: rep.bytes,
                        seconds: rep.seconds,
                        gb_per_s: rep.gb_per_s,
                        targets: rep.targets,
                        buckets: rep.buckets,
                    };
                    let mut f = self.fleet();
                    if let Some(p) = &f.sync_log {
                        if let Ok(line) = serde_json::to_string(&report) {
                            use std::io::Write;
                            if let Ok(mut file) = std::fs::OpenOptions::new().create(true).append(true).open(p) {
                                let _ = file.write_all(format!("{line}\n").as_bytes());
                            }
                        }
                    }
                    let version = report.version;
                    f.last_report = Some(report);
                    return Ok(WeightSnapshot { version, tensors: Vec::new() });
                }
                Err(e) if e.code == E_TRANSFER => {
                    // Which engine failed to receive? If it is dead, go on without it (as the
                    // recipe says); a corrupted transfer to a live engine stops the run.
                    let (failed, short) = {
                        let f = self.fleet();
                        let failed = f
                            .engines
                            .iter()
                            .position(|r| e.message.contains(&format!("{} failed", r.reg.worker_id)))
                            .map(|i| (i, f.engines[i].alive));
                        (failed, f.deadlines.short.min(f.deadlines.call))
                    };
                    let Some((i, alive)) = failed else { return Err(e) };
                    // Dropped by the generation side while this update was in flight (fully_async):
                    // publish again to the engines left.
                    if !alive {
                        continue;
                    }
                    let probe = call_shared(&self.fleet, Which::Engine(i), Some(short), |mut c| async move {
                        c.health(pb::HealthRequest {}).await
                    });
                    match probe {
                        Ok(_) => return Err(e),
                        Err(pe) => self.fleet().engine_lost(i, pe)?,
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn save(&self, dir: &Path) -> Result<(), RunError> {
        self.control_all("save", dir).map(|_| ())
    }

    fn load(&mut self, dir: &Path) -> Result<(), RunError> {
        self.version = self.control("load", dir)?;
        Ok(())
    }

    /// Rank 0's alone, as weight publication: every rank holds the same weights after each step
    /// (ZeRO-1 broadcasts each shard's update), so no collective is needed, and two processes
    /// must not write the same files of the same directory.
    fn save_model(&self, dir: &Path) -> Result<(), RunError> {
        let req = pb::ControlRequest { op: "save_model".into(), dir: dir.to_string_lossy().into_owned() };
        call_shared(&self.fleet, Which::Trainer, None, |mut c| async move { c.control(req).await }).map(|_| ())
    }
}
