//! The RL step's mixture-of-experts side: R3's recorded routes replayed in the training forward,
//! trajectories whose routing cannot be replayed dropped, the load-balancing loss, and the route
//! statistics (load, flips against the recording, the log-prob gap on flipped tokens).

use super::pack::{recorded_routes, Packed};
use crate::model::Policy;
use crate::moe::{flips, Route};
use miles_runtime::{MoeConfig, MoeStats, Trajectory};
use tch::{Kind, Tensor};

/// One RL call's MoE statistics as its micro-batches add to them.
pub(super) struct MoeAcc {
    replayed: bool,
    layers: usize,
    experts: usize,
    aux_sum: f64,
    /// Training passes (micro-batch forwards) so far; f64 so a data-parallel group sums it with
    /// the other counts (`rank_sums`).
    passes: f64,
    /// Per MoE layer: the sum over passes of the most loaded expert's load.
    load_sum: Vec<f64>,
    flips: Vec<(f64, f64)>,
    disagreements: Vec<(f64, f64)>,
    flip_diff: f64,
    flip_tokens: f64,
    r3_bytes: u64,
    r3_tokens: f64,
    dropped: u64,
}

impl MoeAcc {
    pub(super) fn new(policy: &Policy, replay: bool) -> Option<MoeAcc> {
        let m = policy.cfg.moe.as_ref()?;
        let layers = m.moe_layers(policy.cfg.n_layers);
        Some(MoeAcc {
            replayed: replay,
            layers,
            experts: m.experts,
            aux_sum: 0.0,
            passes: 0.0,
            load_sum: vec![0.0; layers],
            flips: vec![(0.0, 0.0); layers],
            disagreements: vec![(0.0, 0.0); layers],
            flip_diff: 0.0,
            flip_tokens: 0.0,
            r3_bytes: 0,
            r3_tokens: 0.0,
            dropped: 0,
        })
    }

    /// The batch without trajectories whose routing cannot be replayed on this model (each named
    /// on stderr with its reason); None when every one fits.
    pub(super) fn drop_unfit(&mut self, batch: &[Trajectory], policy: &Policy) -> Option<Vec<Trajectory>> {
        let m = policy.cfg.moe.as_ref()?;
        let unfit = |t: &Trajectory| {
            t.routing
                .as_ref()
                .and_then(|r| r.mismatch(t.prompt.len() + t.response.len(), self.layers, m.top_k, m.experts))
        };
        let reasons: Vec<Option<String>> = batch.iter().map(unfit).collect();
        for t in batch {
            if let Some(r) = &t.routing {
                self.r3_bytes += r.bytes() as u64;
            }
        }
        if reasons.iter().all(Option::is_none) {
            return None;
        }
        let mut kept = Vec::new();
        for (i, (t, why)) in batch.iter().zip(&reasons).enumerate() {
            match why {
                Some(w) => {
                    self.dropped += 1;
                    // The first few, then the count (`r3/dropped`): one bad engine must not flood.
                    if self.dropped <= 3 {
                        eprintln!("miles: R3: trajectory {i} of group {} dropped from training: {w}", t.group);
                    }
                }
                None => kept.push(t.clone()),
            }
        }
        Some(kept)
    }

    /// The routing of one training pass over `pk`: `chunk`'s recorded experts (when any),
    /// replayed when the run replays them.
    pub(super) fn pass_route(&self, chunk: &[Trajectory], pk: &Packed) -> PassRoute {
        let recorded = recorded_routes(chunk, pk);
        let replay = match self.replayed {
            true => recorded.as_ref().map(|(i, m)| (i.iter().map(Tensor::shallow_clone).collect(), m.shallow_clone())),
            false => None,
        };
        PassRoute { route: Route::for_batch(replay, &pk.valid, true), recorded }
    }

    /// Adds one training pass's routing. Returns its load-balancing loss (mean over MoE layers)
    /// and the [B, L] mask of recorded tokens the trainer's router disagrees on.
    pub(super) fn add(&mut self, pass: &PassRoute, pk: &Packed) -> (Option<Tensor>, Option<Tensor>) {
        let (r, recorded) = (&pass.route, pass.recorded.as_ref());
        self.passes += 1.0;
        let _g = tch::no_grad_guard();
        for (acc, l) in self.load_sum.iter_mut().zip(&r.load) {
            *acc += l.max().double_value(&[]) * self.experts as f64;
        }
        let mut flipped = None;
        if let Some((ids, mask)) = recorded {
            let m = mask.logical_and(&pk.valid);
            self.r3_tokens += m.sum(Kind::Int64).int64_value(&[]) as f64;
            add_counts(&mut self.flips, flips(&r.used, ids, &m).0);
            let (own, any) = flips(&r.own, ids, &m);
            add_counts(&mut self.disagreements, own);
            flipped = Some(any);
        }
        let layers = self.layers.max(1) as f64;
        let aux = r.aux.as_ref().map(|a| {
            self.aux_sum += a.double_value(&[]) / layers;
            a / layers
        });
        (aux, flipped)
    }

    /// On-policy: the |trainer - sampler| log-prob gap `diff` [B, L-1] (masked) on the tokens
    /// whose route flipped in any layer (`flipped` [B, L], from `add`).
    pub(super) fn add_flip_drift(&mut self, diff: &Tensor, flipped: &Tensor, pk: &Packed) {
        // Column c predicts token c + 1 from the hidden state at token c.
        let at = flipped.narrow(1, 0, pk.width).to_kind(Kind::Float) * &pk.mask;
        self.flip_diff += (diff * &at).sum(Kind::Double).double_value(&[]);
        self.flip_tokens += at.sum(Kind::Double).double_value(&[]);
    }

    /// The sums a data-parallel rank's micro-batches add to (summed over the ranks; the batch's
    /// R3 bytes and dropped trajectories are whole-batch figures every rank counts alike).
    pub(super) fn rank_sums(&mut self) -> Vec<&mut f64> {
        let mut v =
            vec![&mut self.aux_sum, &mut self.passes, &mut self.flip_diff, &mut self.flip_tokens, &mut self.r3_tokens];
        v.extend(self.load_sum.iter_mut());
        for (a, b) in self.flips.iter_mut().chain(self.disagreements.iter_mut()) {
            v.extend([a, b]);
        }
        v
    }

    pub(super) fn finish(self) -> MoeStats {
        let n = self.passes.max(1.0);
        let load_max = self.load_sum.iter().map(|l| l / n).collect();
        let recorded = self.r3_tokens > 0.0;
        MoeStats {
            aux_loss: self.aux_sum / n,
            load_max,
            route_mismatch: if recorded { rates(&self.flips) } else { Vec::new() },
            router_disagreement: if recorded { rates(&self.disagreements) } else { Vec::new() },
            flip_logp_diff: self.flip_diff / self.flip_tokens.max(1.0),
            flip_tokens: self.flip_tokens as u64,
            replayed: self.replayed && recorded,
            r3_bytes: self.r3_bytes,
            r3_tokens: self.r3_tokens as u64,
            r3_dropped: self.dropped,
        }
    }
}

/// One training pass's MoE routing: what it replays and reports (`route`), and the recorded
/// experts it is measured against.
pub(super) struct PassRoute {
    pub route: Route,
    recorded: Option<(Vec<Tensor>, Tensor)>,
}

/// `loss` plus the load-balancing loss `aux` weighted `aux_loss_coef x rows / of` (the
/// micro-batch's share, so the micro-batches' terms add up to the step's), when the model weights it.
pub(super) fn add_aux_loss(loss: Tensor, aux: Option<Tensor>, moe: Option<&MoeConfig>, rows: usize, of: f64) -> Tensor {
    match (aux, moe) {
        (Some(a), Some(c)) if c.aux_loss_coef > 0.0 => loss + a * (c.aux_loss_coef * rows as f64 / of),
        _ => loss,
    }
}

fn add_counts(acc: &mut [(f64, f64)], per: Vec<(f64, f64)>) {
    for (a, (num, den)) in acc.iter_mut().zip(per) {
        a.0 += num;
        a.1 += den;
    }
}

fn rates(counts: &[(f64, f64)]) -> Vec<f64> {
    counts.iter().map(|(a, b)| a / b.max(1.0)).collect()
}
