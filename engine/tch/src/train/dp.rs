//! Data-parallel training over PyTorch's c10d (`miles-c10d`: a TCPStore rendezvous and a Gloo
//! process group), issue #37. Every rank gets the whole batch; of every optimizer step's
//! micro-batches (as one process cuts them) rank r trains those with index k % world == r. The
//! loss denominators are the step's (`Denominators::of` the whole slice), so the gradients summed
//! across ranks are exactly the single process's up to the order of the float additions. The
//! gradients are summed by all-reduce in buckets of `bucket_bytes` (every bucket in flight at
//! once), then every rank takes the same optimizer step: every rank receives the same reduced bits
//! (Gloo's all-reduce ends by copying each reduced chunk to every rank), so the ranks' weights
//! stay bitwise equal (engine/tch/tests/integration/dp.rs checks it after every run).
//!
//! ZeRO-1 (`ZeroStage::Optimizer`): each rank keeps Adam moments only for the parameters it owns
//! (`partition`: largest first to the least loaded rank, as torch's ZeroRedundancyOptimizer), an
//! unowned parameter's moments are undefined tensors (`adam_step` skips it), and after the update
//! each owner broadcasts its parameters (`broadcast_owned`). The global grad norm, and so the clip
//! scale, comes from the full reduced gradients, the same on every rank.
//!
//! What stays redundant: the passes before any update (behaviour and reference log-probs, PPO's
//! values and targets, per-token advantages) run over the whole batch on every rank. It is exact
//! and simple; sharding them is an all-gather of per-token vectors away if it ever dominates.

use super::optim::AdamState;
use super::TchTrainer;
use miles_c10d::{ProcessGroup, ReduceOp, Store};
use miles_runtime::{DataParallelSpec, DpRank, RunError, ZeroStage, E_BACKEND, E_SPEC};
use std::cell::Cell;
use std::ops::Range;
use std::time::{Duration, Instant};
use tch::Tensor;

/// The c10d key prefix of the trainer's group (the store may hold other groups' keys).
const PREFIX: &str = "miles/dp";

/// One rank's membership of the trainer's data-parallel group.
pub(crate) struct DataParallel {
    pg: ProcessGroup,
    /// The store client the group's Gloo connections were set up through; kept for its lifetime.
    _store: Store,
    pub(crate) rank: usize,
    pub(crate) world: usize,
    pub(crate) zero: bool,
    bucket_bytes: u64,
    /// Seconds this rank spent in collectives since the last `take_collective_s`, waits for the
    /// other ranks to arrive excluded.
    collective_s: Cell<f64>,
    /// Seconds this rank waited at `arrive` for the slowest rank since the last `take_wait_s`: the
    /// ranks' skew, which no bandwidth explains (kept apart so the plan's exchange time compares
    /// with `collective_s`).
    wait_s: Cell<f64>,
}

impl TchTrainer {
    /// Joins the data-parallel group `rank` names (a c10d TCPStore at `rank.store`), takes rank
    /// 0's weights (the policy's, adapters included, and the critic's when there is one), and from
    /// then on trains its share of every step's micro-batches with gradients summed across the
    /// ranks (and, with `spec.zero`, holds and updates its share of the optimizer). Every rank calls
    /// it at once; it returns once all `spec.ranks` have joined, or fails after `spec.timeout_s`
    /// naming those that did not. A group of 1 changes nothing.
    pub fn join_dp(&mut self, spec: &DataParallelSpec, rank: &DpRank) -> Result<(), RunError> {
        check_rank(spec, rank)?;
        // `device = auto` may resolve to a GPU at run time, past `miles check`'s E0511 for cuda.
        if rank.world > 1 && crate::device::current() != tch::Device::Cpu {
            return Err(RunError::new(
                E_SPEC,
                "data-parallel ranks sum gradients with Gloo over CPU tensors, and this rank computes on a GPU: the NCCL process group is not built (engine/c10d/README.md)",
            )
            .with_help("set `local { device = cpu }` for a data-parallel trainer, or dp = 1 on the GPU"));
        }
        if rank.world == 1 {
            self.dp = None;
            return Ok(());
        }
        let (host, port) = parse_store(&rank.store)?;
        let timeout = Duration::from_secs_f64(spec.timeout_s);
        let who = format!("data-parallel rank {} of {}", rank.rank, rank.world);
        let store = Store::client(host, port, timeout).map_err(|e| {
            RunError::new(E_BACKEND, format!("{who}: cannot reach the c10d store at {}: {e}", rank.store))
        })?;
        let pg = ProcessGroup::gloo(&store, PREFIX, rank.rank, rank.world, timeout)
            .map_err(|e| RunError::new(E_BACKEND, format!("{who}: the rendezvous failed: {e}")))?;
        self.dp = Some(DataParallel {
            pg,
            _store: store,
            rank: rank.rank,
            world: rank.world,
            zero: spec.zero == ZeroStage::Optimizer,
            bucket_bytes: spec.bucket_bytes.max(1),
            collective_s: Cell::new(0.0),
            wait_s: Cell::new(0.0),
        });
        self.dp_take_weights()?;
        // A no-op without ZeRO; under ZeRO-1 it allocates this rank's moments (`TchTrainer::new`
        // left them for now, not knowing the rank).
        self.shard_optimizer();
        Ok(())
    }

    /// Every rank takes rank 0's policy, adapters and critic (at the join).
    fn dp_take_weights(&self) -> Result<(), RunError> {
        let mut ts: Vec<Tensor> = self.policy.params().iter().map(|(_, t)| t.shallow_clone()).collect();
        ts.extend(self.adapter_tensors());
        if let Some(c) = &self.critic {
            ts.extend(c.params().into_iter().map(|(_, t)| t));
        }
        self.dp_take(&ts)
    }

    /// Every rank takes rank 0's adapters (once LoRA attaches them: seeded or read from the same
    /// files on every rank, so this only guards against a rank that differs).
    pub(super) fn dp_take_adapters(&self) -> Result<(), RunError> {
        self.dp_take(&self.adapter_tensors())
    }

    /// Every rank takes rank 0's critic once PPO creates it (`Critic::from_policy_sharded` already
    /// gave it this rank's shard of the moments).
    pub(super) fn dp_take_critic(&self) -> Result<(), RunError> {
        let ts: Vec<Tensor> = self.critic.iter().flat_map(|c| c.params()).map(|(_, t)| t).collect();
        self.dp_take(&ts)
    }

    fn adapter_tensors(&self) -> Vec<Tensor> {
        self.policy.adapters().iter().flat_map(|a| a.named()).map(|(_, t)| t).collect()
    }

    /// `ts` becomes rank 0's on every rank; no-op alone.
    fn dp_take(&self, ts: &[Tensor]) -> Result<(), RunError> {
        match &self.dp {
            Some(dp) => dp.broadcast_from(ts, &vec![0; ts.len()]),
            None => Ok(()),
        }
    }

    /// ZeRO-1: drops the moments of the parameters this rank does not own, of every optimizer
    /// state (each adapter's, the critic's). No-op without ZeRO.
    pub(super) fn shard_optimizer(&mut self) {
        self.shard_optimizer_sets();
        self.shard_critic_optimizer();
    }

    /// ZeRO-1: this rank's shard of the policy's optimizer states (one per adapter under LoRA).
    pub(super) fn shard_optimizer_sets(&mut self) {
        let Some((rank, world)) = self.zero_shard() else { return };
        let sets = self.optimizer_sets();
        for (set, adam) in sets.iter().zip(self.adam.iter_mut()) {
            adam.shard(set, rank, world);
        }
    }

    /// ZeRO-1: this rank's shard of PPO's critic's optimizer state.
    pub(super) fn shard_critic_optimizer(&mut self) {
        let Some((rank, world)) = self.zero_shard() else { return };
        if let Some(c) = self.critic.as_mut() {
            let params = c.params();
            c.adam.shard(&params, rank, world);
        }
    }

    /// (rank, world) when the optimizer is sharded (ZeRO-1 in a group), else None.
    pub(super) fn zero_shard(&self) -> Option<(usize, usize)> {
        self.dp.as_ref().filter(|d| d.zero).map(|d| (d.rank, d.world))
    }

    /// Bytes of Adam moments this rank holds (the policy's and the critic's): the whole state in
    /// one process or plain DP, about 1/world of it under ZeRO-1.
    pub fn optimizer_state_bytes(&self) -> u64 {
        let mut b: u64 = self.adam.iter().map(AdamState::bytes).sum();
        if let Some(c) = &self.critic {
            b += c.adam.bytes();
        }
        b
    }

    /// This rank's place in its data-parallel group, (rank, world); (0, 1) alone.
    pub fn dp_rank(&self) -> (usize, usize) {
        self.dp.as_ref().map_or((0, 1), |d| (d.rank, d.world))
    }

    /// Whether this process trains micro-batch `k` of an optimizer step: all of them alone,
    /// k % world == rank in a group.
    pub(super) fn trains_micro(&self, k: usize) -> bool {
        self.dp.as_ref().is_none_or(|d| k % d.world == d.rank)
    }
}

impl DataParallel {
    fn err(&self, what: &str, e: miles_c10d::Error) -> RunError {
        RunError::new(E_BACKEND, format!("data-parallel rank {} of {}: {what}: {e}", self.rank, self.world))
    }

    /// Runs one collective, adding its wall time to `clock`.
    fn clocked<T>(
        &self,
        clock: &Cell<f64>,
        what: &str,
        f: impl FnOnce() -> miles_c10d::Result<T>,
    ) -> Result<T, RunError> {
        let t0 = Instant::now();
        let r = f();
        clock.set(clock.get() + t0.elapsed().as_secs_f64());
        r.map_err(|e| self.err(what, e))
    }

    /// Runs one exchange, adding its wall time to `collective_s`.
    fn timed<T>(&self, what: &str, f: impl FnOnce() -> miles_c10d::Result<T>) -> Result<T, RunError> {
        self.clocked(&self.collective_s, what, f)
    }

    /// Seconds spent in collectives since the last call.
    pub(super) fn take_collective_s(&self) -> f64 {
        self.wait_s.set(0.0);
        self.collective_s.replace(0.0)
    }

    /// A barrier before an exchange: the time until the slowest rank arrives is `wait_s`, so the
    /// exchange after it times the bytes and the calls alone.
    fn arrive(&self, what: &str) -> Result<(), RunError> {
        self.clocked(&self.wait_s, what, || self.pg.barrier())
    }

    /// The gradients of `params` summed over the ranks (undefined ones count as zeros), as views
    /// of the reduced buckets, in `params`' order. `local` is this rank's outcome of its
    /// micro-batches: a failure on any rank (its flag rides with the buckets) fails the step on
    /// every rank before any weight changes, so no rank is left waiting in the next collective.
    pub(super) fn reduce_grads(
        &self,
        params: &[(String, Tensor)],
        local: Result<(), RunError>,
    ) -> Result<Vec<Tensor>, RunError> {
        let _g = tch::no_grad_guard();
        let grads = super::optim::grads_of(params);
        let ranges = buckets(&grads, self.bucket_bytes);
        let mut flats: Vec<Tensor> = ranges.iter().map(|r| flatten(&grads[r.clone()])).collect();
        flats.push(Tensor::from_slice(&[local.is_err() as u8 as f32]));
        self.arrive("the barrier before the gradients' all-reduce")?;
        self.timed("all-reduce of the gradients", || self.pg.all_reduce_many(&mut flats, ReduceOp::Sum))?;
        let failed = flats.pop().map_or(0.0, |f| f.double_value(&[0]));
        local?;
        if failed > 0.0 {
            return Err(RunError::new(
                E_BACKEND,
                format!(
                    "data-parallel rank {} of {}: another rank failed this optimizer step (its own error says why); \
                     the weights were not updated",
                    self.rank, self.world
                ),
            ));
        }
        let mut out = Vec::with_capacity(grads.len());
        for (r, flat) in ranges.iter().zip(&flats) {
            let mut off = 0i64;
            for g in &grads[r.clone()] {
                let n = g.numel() as i64;
                out.push(flat.narrow(0, off, n).view(g.size().as_slice()));
                off += n;
            }
        }
        Ok(out)
    }

    /// In place: each of `ts` becomes its owner's (`owner[i]`), in buckets per owner.
    pub(super) fn broadcast_from(&self, ts: &[Tensor], owner: &[usize]) -> Result<(), RunError> {
        // Every rank but the owner receives: each takes its copy.
        self.broadcast_buckets(ts, owner, "broadcast of the weights", |_, flat, part| unflatten_into(flat, part))
    }

    /// For each owner in turn, its tensors of `ts` (`owner[i]`) in buckets: the owner sends each
    /// bucket (`ts` there holds the data), every other rank receives it into a buffer of the
    /// bucket's size (`ts` there gives only the shapes) and hands it to `recv(root, flat, part)`.
    fn broadcast_buckets(
        &self,
        ts: &[Tensor],
        owner: &[usize],
        what: &str,
        mut recv: impl FnMut(usize, &Tensor, &[Tensor]),
    ) -> Result<(), RunError> {
        let _g = tch::no_grad_guard();
        for root in 0..self.world {
            let mine: Vec<Tensor> =
                ts.iter().zip(owner).filter(|(_, &o)| o == root).map(|(t, _)| t.shallow_clone()).collect();
            for r in buckets(&mine, self.bucket_bytes) {
                let part = &mine[r];
                let mut flat = match self.rank == root {
                    true => flatten(part),
                    false => {
                        let n: i64 = part.iter().map(|t| t.numel() as i64).sum();
                        Tensor::empty([n], (part[0].kind(), part[0].device()))
                    }
                };
                self.timed(what, || self.pg.broadcast(&mut flat, root))?;
                if self.rank != root {
                    recv(root, &flat, part);
                }
            }
        }
        Ok(())
    }

    /// ZeRO-1 after an update: every parameter of `params` becomes its owner's, broadcast in place
    /// one tensor at a time. A flat bucket per owner would be a second copy of a share of the
    /// weights on every rank, as large as the moments ZeRO-1 saves (bench/RESULTS.md measured
    /// the peak with buckets); a call per tensor costs latency instead (tens of calls a step).
    pub(super) fn broadcast_owned(&self, params: &[(String, Tensor)]) -> Result<(), RunError> {
        let _g = tch::no_grad_guard();
        let ts: Vec<Tensor> = params.iter().map(|(_, t)| t.shallow_clone()).collect();
        let owner = partition(&ts, self.world);
        for ((name, t), &root) in params.iter().zip(&owner) {
            let mut t = t.shallow_clone();
            if !t.is_contiguous() {
                // Gloo refuses a strided view; the bucketed path copies it through a flat buffer.
                self.broadcast_from(std::slice::from_ref(&t), &[root])?;
                continue;
            }
            self.timed(&format!("broadcast of {name}"), || self.pg.broadcast(&mut t, root))?;
        }
        Ok(())
    }

    /// ZeRO-1: the whole optimizer state of `params` from the ranks' shards, on rank 0 (None on
    /// the others). Every rank calls it; each owner broadcasts its moments bucket by bucket, and a
    /// rank other than 0 drops each bucket it receives, so it never holds more than one bucket
    /// beyond its shard (its peak memory keeps ZeRO's saving through a checkpoint).
    pub(super) fn gather_moments(
        &self,
        params: &[(String, Tensor)],
        adam: &AdamState,
    ) -> Result<Option<AdamState>, RunError> {
        let owner = partition(&params.iter().map(|(_, t)| t.shallow_clone()).collect::<Vec<_>>(), self.world);
        // The list broadcast: m then v of each parameter; on its owner the moment itself, elsewhere
        // a tensor of its shape to size the buffers (the parameter; nothing is written into it).
        let mut ts = Vec::with_capacity(2 * params.len());
        let mut own = Vec::with_capacity(2 * params.len());
        for (i, (_, p)) in params.iter().enumerate() {
            for moment in [&adam.m[i], &adam.v[i]] {
                ts.push(if moment.defined() { moment.shallow_clone() } else { p.shallow_clone() });
                own.push(owner[i]);
            }
        }
        // Rank 0's whole copy: its own moments, then each other owner's as they arrive.
        let whole: Vec<Tensor> = match self.rank {
            0 => ts.iter().zip(&own).map(|(t, &o)| if o == 0 { t.shallow_clone() } else { t.zeros_like() }).collect(),
            _ => Vec::new(),
        };
        let slots: Vec<Vec<usize>> =
            (0..self.world).map(|r| (0..ts.len()).filter(|&j| own[j] == r).collect()).collect();
        let mut next = vec![0usize; self.world];
        self.broadcast_buckets(&ts, &own, "gather of the optimizer's moments", |root, flat, part| {
            if self.rank == 0 {
                let at = &slots[root][next[root]..next[root] + part.len()];
                let dst: Vec<Tensor> = at.iter().map(|&j| whole[j].shallow_clone()).collect();
                unflatten_into(flat, &dst);
            }
            next[root] += part.len();
        })?;
        if self.rank != 0 {
            return Ok(None);
        }
        let mut it = whole.into_iter();
        let (mut m, mut v) = (Vec::with_capacity(params.len()), Vec::with_capacity(params.len()));
        while let (Some(a), Some(b)) = (it.next(), it.next()) {
            m.push(a);
            v.push(b);
        }
        Ok(Some(AdamState { m, v, t: adam.t }))
    }

    /// Sums `sums` and takes the max of `maxes` over the ranks (one all-reduce of a packed f64
    /// vector each), and all-gathers each rank's peak RSS (in the sum: rank r's slot r) and the max
    /// over ranks of the collective and waiting seconds so far. Returns (collective_s, wait_s,
    /// peak RSS per rank).
    pub(super) fn reduce_stats(
        &self,
        sums: &mut [&mut f64],
        maxes: &mut [&mut f64],
    ) -> Result<(f64, f64, Vec<u64>), RunError> {
        self.arrive("the barrier before the step's statistics")?;
        let wait = self.wait_s.get();
        let coll = self.take_collective_s();
        let mut sv: Vec<f64> = sums.iter().map(|x| **x).collect();
        let base = sv.len();
        sv.extend((0..self.world).map(|r| if r == self.rank { peak_rss() as f64 } else { 0.0 }));
        let mut mv: Vec<f64> = maxes.iter().map(|x| **x).collect();
        mv.push(wait);
        mv.push(coll);
        let mut st = Tensor::from_slice(&sv);
        let mut mt = Tensor::from_slice(&mv);
        self.timed("all-reduce of the step's statistics", || self.pg.all_reduce(&mut st, ReduceOp::Sum))?;
        self.timed("all-reduce of the step's statistics", || self.pg.all_reduce(&mut mt, ReduceOp::Max))?;
        let sv = Vec::<f64>::try_from(&st).map_err(|e| RunError::new(E_BACKEND, e.to_string()))?;
        let mv = Vec::<f64>::try_from(&mt).map_err(|e| RunError::new(E_BACKEND, e.to_string()))?;
        for (x, v) in sums.iter_mut().zip(&sv) {
            **x = *v;
        }
        for (x, v) in maxes.iter_mut().zip(&mv) {
            **x = *v;
        }
        let rss = sv[base..].iter().map(|b| *b as u64).collect();
        let at = |k: usize| mv.get(mv.len().wrapping_sub(k)).copied().unwrap_or(0.0);
        Ok((at(1), at(2), rss))
    }
}

/// The group's owner of each tensor under ZeRO-1, as torch's ZeroRedundancyOptimizer partitions
/// a parameter list: by size, largest first, each to the rank holding the fewest elements so far
/// (the lowest such rank on a tie). Deterministic from the shapes, so every rank computes the same.
pub(crate) fn partition(ts: &[Tensor], world: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..ts.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(ts[i].numel()));
    let mut load = vec![0usize; world.max(1)];
    let mut owner = vec![0; ts.len()];
    for i in order {
        let r = (0..load.len()).min_by_key(|&r| (load[r], r)).unwrap_or(0);
        owner[i] = r;
        load[r] += ts[i].numel();
    }
    owner
}

/// Consecutive runs of `ts` of at least `bytes` each (the last may be smaller), none empty.
fn buckets(ts: &[Tensor], bytes: u64) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let (mut lo, mut acc) = (0, 0u64);
    for (i, t) in ts.iter().enumerate() {
        acc += (t.numel() * t.kind().elt_size_in_bytes()) as u64;
        if acc >= bytes {
            out.push(lo..i + 1);
            (lo, acc) = (i + 1, 0);
        }
    }
    if lo < ts.len() {
        out.push(lo..ts.len());
    }
    out
}

/// One contiguous 1-D copy of `ts`, in order.
fn flatten(ts: &[Tensor]) -> Tensor {
    let flat: Vec<Tensor> = ts.iter().map(|t| t.detach().reshape([-1])).collect();
    Tensor::cat(&flat, 0).contiguous()
}

/// Copies `flat`'s consecutive pieces back into `ts`.
fn unflatten_into(flat: &Tensor, ts: &[Tensor]) {
    let mut off = 0i64;
    for t in ts {
        let n = t.numel() as i64;
        let mut t = t.shallow_clone();
        t.copy_(&flat.narrow(0, off, n).view(t.size().as_slice()));
        off += n;
    }
}

/// The spec and the rank must agree, and every figure be usable.
fn check_rank(spec: &DataParallelSpec, rank: &DpRank) -> Result<(), RunError> {
    let bad = |m: String| Err(RunError::new(E_SPEC, m));
    if rank.world != spec.ranks {
        return bad(format!(
            "data-parallel rank {} says the group has {} ranks, the run spec's `dp.ranks` {}",
            rank.rank, rank.world, spec.ranks
        ));
    }
    if rank.world == 0 || rank.rank >= rank.world {
        return bad(format!("data-parallel rank {} of {}: no such rank", rank.rank, rank.world));
    }
    if !(spec.timeout_s.is_finite() && spec.timeout_s > 0.0) {
        return bad(format!(
            "the run spec's `dp.timeout_s` is {}: it must be a positive number of seconds",
            spec.timeout_s
        ));
    }
    Ok(())
}

/// `host:port` (the host may be a bracketed IPv6 address).
fn parse_store(s: &str) -> Result<(&str, u16), RunError> {
    let bad = || RunError::new(E_SPEC, format!("the data-parallel store address `{s}` is not host:port"));
    let (host, port) = s.rsplit_once(':').ok_or_else(bad)?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let port: u16 = port.parse().map_err(|_| bad())?;
    if host.is_empty() {
        return Err(bad());
    }
    Ok((host, port))
}

/// This process's peak resident set (VmHWM of /proc/self/status) in bytes; 0 where unreadable.
pub(crate) fn peak_rss() -> u64 {
    let Ok(s) = std::fs::read_to_string("/proc/self/status") else { return 0 };
    s.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

impl AdamState {
    /// ZeRO-1: keeps the moments of the parameters of `params` that `rank` owns (zeros where they
    /// were not allocated yet: `unallocated`), drops the rest (undefined tensors, which
    /// `adam_step` skips).
    pub(crate) fn shard(&mut self, params: &[(String, Tensor)], rank: usize, world: usize) {
        let owner = partition(&params.iter().map(|(_, t)| t.shallow_clone()).collect::<Vec<_>>(), world);
        for (i, o) in owner.into_iter().enumerate() {
            if o != rank {
                self.m[i] = Tensor::new();
                self.v[i] = Tensor::new();
            } else if !self.m[i].defined() {
                self.m[i] = params[i].1.detach().zeros_like();
                self.v[i] = params[i].1.detach().zeros_like();
            }
        }
    }

    /// Fresh moments for `params`: this rank's shard of them under ZeRO-1 (`shard` = (rank,
    /// world)), else all. Only the owned ones are ever allocated, so a rank's peak memory holds
    /// its shard alone.
    pub(crate) fn zeros_shard(params: &[(String, Tensor)], shard: Option<(usize, usize)>) -> AdamState {
        match shard {
            None => AdamState::zeros(params),
            Some((rank, world)) => {
                let mut a = AdamState::unallocated(params.len());
                a.shard(params, rank, world);
                a
            }
        }
    }

    /// No moments yet: a ZeRO-1 trainer before it knows its rank (`join_dp` allocates its shard).
    pub(crate) fn unallocated(n: usize) -> AdamState {
        AdamState { m: (0..n).map(|_| Tensor::new()).collect(), v: (0..n).map(|_| Tensor::new()).collect(), t: 0 }
    }

    /// Bytes of the moments held.
    pub(crate) fn bytes(&self) -> u64 {
        self.m
            .iter()
            .chain(&self.v)
            .filter(|t| t.defined())
            .map(|t| (t.numel() * t.kind().elt_size_in_bytes()) as u64)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Kind;

    fn sized(ns: &[i64]) -> Vec<Tensor> {
        ns.iter().map(|&n| Tensor::zeros([n], (Kind::Float, tch::Device::Cpu))).collect()
    }

    #[test]
    fn partition_is_largest_first_to_the_least_loaded() {
        // 10 -> r0, 8 -> r1, 5 -> r1 (8 < 10), 3 -> r0 (10 < 13), 1 -> r0 (13 = 13: lowest rank).
        let ts = sized(&[5, 10, 1, 8, 3]);
        assert_eq!(partition(&ts, 2), vec![1, 0, 0, 1, 0]);
        assert_eq!(partition(&ts, 1), vec![0; 5]);
        // More ranks than tensors: the extra ranks own nothing.
        assert_eq!(partition(&sized(&[4, 4]), 3), vec![0, 1]);
    }

    #[test]
    fn buckets_cover_every_tensor_in_order() {
        let ts = sized(&[4, 4, 4, 1]);
        // 16 bytes each: a bucket closes once it holds 20 bytes or more.
        assert_eq!(buckets(&ts, 20), vec![0..2, 2..4]);
        assert_eq!(buckets(&ts, 1), vec![0..1, 1..2, 2..3, 3..4]);
        assert_eq!(buckets(&ts, 1 << 30), vec![0..4]);
        assert!(buckets(&[], 8).is_empty());
        let flat = flatten(&ts);
        assert_eq!(flat.size(), vec![13]);
        let back = sized(&[4, 4, 4, 1]);
        unflatten_into(&(flat + 1.0), &back);
        assert_eq!(back[3].double_value(&[0]), 1.0);
    }

    #[test]
    fn store_addresses_and_bad_ranks() {
        assert_eq!(parse_store("127.0.0.1:29500").unwrap(), ("127.0.0.1", 29500));
        assert_eq!(parse_store("[::1]:80").unwrap(), ("::1", 80));
        for bad in ["nohost", ":12", "h:99999", "h:x"] {
            assert!(parse_store(bad).unwrap_err().message.contains("not host:port"), "{bad}");
        }
        let spec = DataParallelSpec { ranks: 2, zero: ZeroStage::None, bucket_bytes: 1 << 20, timeout_s: 5.0 };
        let r = |rank, world| DpRank { rank, world, store: "h:1".into() };
        assert!(check_rank(&spec, &r(1, 2)).is_ok());
        assert!(check_rank(&spec, &r(2, 2)).unwrap_err().message.contains("no such rank"));
        assert!(check_rank(&spec, &r(0, 3)).unwrap_err().message.contains("`dp.ranks` 2"));
        let mut s = spec.clone();
        s.timeout_s = 0.0;
        assert!(check_rank(&s, &r(0, 2)).unwrap_err().message.contains("timeout_s"));
    }

    #[test]
    fn peak_rss_reads_vmhwm() {
        if std::path::Path::new("/proc/self/status").exists() {
            assert!(peak_rss() > 1 << 20);
        }
    }
}
