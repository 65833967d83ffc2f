//! A data-parallel trainer's ranks, called at once. Every rank gets the same call (each takes its
//! share of the batch and meets the others in c10d's collectives); rank 0's answer is the answer.
//! When a call fails, the error names the rank that failed first in cause, not a bystander: a rank
//! whose process is gone (its connection fails, it answers no health check, or its heartbeats
//! stopped) before one that missed the call's deadline, before one whose collective gave up
//! waiting for it, before one still waiting in its collective when the group gives up.

use super::{finish, lock, Client, ControllerState, Deadlines, Fleet, SharedFleet, Which};
use crate::pb;
use crate::E_WORKER;
use miles_runtime::RunError;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tonic::{Response, Status};

/// What became of one rank's call, worst cause first (the order blame follows).
enum Outcome<T> {
    /// The worker is gone: its connection failed, it answers no health check, or its heartbeats
    /// stopped (killed, stopped with SIGSTOP, its host lost).
    Gone(RunError),
    /// The call missed its deadline while the worker still beats (hung).
    Late(RunError),
    /// The worker answered with a stage error; a collective that timed out waiting for a peer
    /// lands here.
    Stage(RunError),
    /// Still in flight when the group gave up: waiting in a collective for the rank that failed.
    Waiting,
    Answered(T),
}

impl<T> Outcome<T> {
    fn cause(&self) -> u8 {
        match self {
            Outcome::Gone(_) => 0,
            Outcome::Late(_) => 1,
            Outcome::Stage(_) => 2,
            Outcome::Waiting => 3,
            Outcome::Answered(_) => 4,
        }
    }
}

/// What the calls need, taken from the fleet under its lock (the calls then run without it).
struct Prepared {
    clients: Vec<Client>,
    who: Vec<String>,
    ids: Vec<String>,
    rt: Arc<tokio::runtime::Runtime>,
    beats: ControllerState,
    deadlines: Deadlines,
}

impl Fleet {
    /// Every rank's client, or why one cannot be called (dead, or silent past the heartbeat
    /// deadline: named as `prepare` names a lone worker).
    fn prepare_ranks(&mut self) -> Result<Prepared, RunError> {
        let n = self.world();
        let (mut clients, mut who, mut ids) = (Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n));
        for r in 0..n {
            let (c, _, w) = self.prepare(Which::Rank(r))?;
            clients.push(c);
            who.push(w);
            ids.push(self.remote(Which::Rank(r)).reg.worker_id.clone());
        }
        Ok(Prepared {
            clients,
            who,
            ids,
            rt: self.controller.rt.clone(),
            beats: self.controller.heartbeats(),
            deadlines: self.deadlines,
        })
    }
}

/// One call to every rank of `fleet` (held by the caller), rank 0's answer returned.
pub(super) fn all_ranks<T, F, Fut>(fleet: &mut Fleet, f: F) -> Result<T, RunError>
where
    T: Send + 'static,
    F: Fn(usize, Client) -> Fut,
    Fut: Future<Output = Result<Response<T>, Status>> + Send + 'static,
{
    let p = fleet.prepare_ranks()?;
    let (res, lost) = run(&p, f);
    for r in lost {
        fleet.remote_mut(Which::Rank(r)).alive = false;
    }
    res
}

/// One call to every trainer rank of a shared fleet, the fleet unlocked while the calls are in
/// flight (the generation thread calls the engines at once); one trainer: a plain call.
pub(super) fn call_trainers<T, F, Fut>(fleet: &SharedFleet, f: F) -> Result<T, RunError>
where
    T: Send + 'static,
    F: Fn(usize, Client) -> Fut,
    Fut: Future<Output = Result<Response<T>, Status>> + Send + 'static,
{
    if lock(fleet).dp.is_none() {
        return super::call_shared(fleet, Which::Trainer, None, |c| f(0, c));
    }
    let p = lock(fleet).prepare_ranks()?;
    let (res, lost) = run(&p, f);
    if !lost.is_empty() {
        let mut g = lock(fleet);
        for r in lost {
            g.remote_mut(Which::Rank(r)).alive = false;
        }
    }
    res
}

/// Runs the calls, watches them and the ranks' heartbeats, and says who to blame; also the ranks
/// to mark dead.
fn run<T, F, Fut>(p: &Prepared, f: F) -> (Result<T, RunError>, Vec<usize>)
where
    T: Send + 'static,
    F: Fn(usize, Client) -> Fut,
    Fut: Future<Output = Result<Response<T>, Status>> + Send + 'static,
{
    let n = p.clients.len();
    let call = p.deadlines.call;
    let heartbeat = p.deadlines.heartbeat;
    // Each call sends its result as it ends, so an answer is taken at once; the loop's tick only
    // paces the heartbeat checks.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let handles: Vec<_> = {
        let _g = p.rt.enter();
        p.clients
            .iter()
            .enumerate()
            .map(|(r, c)| {
                let (tx, fut) = (tx.clone(), tokio::time::timeout(call, f(r, c.clone())));
                tokio::spawn(async move {
                    let _ = tx.send((r, fut.await));
                })
            })
            .collect()
    };
    let mut out: Vec<Option<Outcome<T>>> = (0..n).map(|_| None).collect();
    // Failures in the order they were seen, to break ties within a cause.
    let mut seen: Vec<usize> = Vec::new();
    // After the first failure the others get this long to answer or to be found silent: a rank
    // stopped with SIGSTOP is silent past the heartbeat deadline by then, even when the peers'
    // collectives gave up sooner.
    let grace = heartbeat + Duration::from_secs(1);
    p.rt.block_on(async {
        let mut first_failure: Option<Instant> = None;
        loop {
            // Taken before the drain: a call that ended then and sent nothing failed without an
            // answer (its task panicked).
            let ended: Vec<bool> = handles.iter().map(|h| h.is_finished()).collect();
            while let Ok((r, res)) = rx.try_recv() {
                let late = res.is_err();
                let o = match finish(res, &p.who[r], call) {
                    Ok(t) => Outcome::Answered(t),
                    Err((e, false)) => Outcome::Stage(e),
                    Err((e, true)) if late => Outcome::Late(e),
                    Err((e, true)) => Outcome::Gone(e),
                };
                if !matches!(o, Outcome::Answered(_)) {
                    first_failure.get_or_insert_with(Instant::now);
                    seen.push(r);
                }
                if out[r].is_none() {
                    out[r] = Some(o);
                }
            }
            let silent_end: Vec<usize> = (0..n).filter(|&r| ended[r] && out[r].is_none()).collect();
            for r in silent_end {
                out[r] = Some(Outcome::Stage(RunError::new(
                    E_WORKER,
                    format!("{}: the call failed without an answer", p.who[r]),
                )));
                first_failure.get_or_insert_with(Instant::now);
                seen.push(r);
            }
            if out.iter().all(Option::is_some) {
                break;
            }
            // A rank whose heartbeats stopped holds the others in their collectives: it is the
            // cause, whatever they answer later.
            let mut silent = false;
            for (r, o) in out.iter_mut().enumerate().filter(|(_, o)| o.is_none()) {
                if let Some(s) = p.beats.silent_for(&p.ids[r]).filter(|s| *s > heartbeat) {
                    *o = Some(Outcome::Gone(RunError::new(
                        E_WORKER,
                        format!(
                            "{} sent no heartbeat for {:.0} s during the call: treated as dead",
                            p.who[r],
                            s.as_secs_f64()
                        ),
                    )));
                    seen.push(r);
                    silent = true;
                }
            }
            if silent || first_failure.is_some_and(|t| t.elapsed() > grace) {
                break;
            }
            // Wait for the next answer (put back for the top of the loop) or the tick.
            if let Ok(Some(m)) = tokio::time::timeout(Duration::from_millis(50), rx.recv()).await {
                let _ = tx.send(m);
            }
        }
        // What is still in flight waits on the rank that failed; the run stops, and the
        // launcher stops its workers.
        for h in &handles {
            h.abort();
        }
    });
    let mut out: Vec<Outcome<T>> = out.into_iter().map(|o| o.unwrap_or(Outcome::Waiting)).collect();
    if out.iter().all(|o| matches!(o, Outcome::Answered(_))) {
        let Outcome::Answered(t) = out.swap_remove(0) else { unreachable!() };
        return (Ok(t), Vec::new());
    }
    probe(p, &mut out);
    let lost: Vec<usize> = (0..n).filter(|&r| matches!(out[r], Outcome::Gone(_) | Outcome::Late(_))).collect();
    (Err(blame(p, out, &seen)), lost)
}

/// A rank that answered with an error, or late, and answers no health check either is gone: a
/// killed worker's broken connection may come back as any status.
fn probe<T>(p: &Prepared, out: &mut [Outcome<T>]) {
    let short = p.deadlines.short.min(Duration::from_secs(3));
    let asks: Vec<usize> = (0..out.len()).filter(|&r| matches!(out[r], Outcome::Stage(_) | Outcome::Late(_))).collect();
    let answers: Vec<bool> = p.rt.block_on(async {
        let hs: Vec<_> = asks
            .iter()
            .map(|&r| {
                let mut c = p.clients[r].clone();
                tokio::spawn(async move {
                    matches!(tokio::time::timeout(short, c.health(pb::HealthRequest {})).await, Ok(Ok(_)))
                })
            })
            .collect();
        let mut v = Vec::with_capacity(hs.len());
        for h in hs {
            v.push(h.await.unwrap_or(false));
        }
        v
    });
    for (&r, ok) in asks.iter().zip(answers) {
        if ok {
            continue;
        }
        let o = std::mem::replace(&mut out[r], Outcome::Waiting);
        let (Outcome::Stage(mut e) | Outcome::Late(mut e)) = o else { unreachable!() };
        e.code = E_WORKER;
        e.message = format!("{} (it answers no health check: gone)", e.message);
        out[r] = Outcome::Gone(e);
    }
}

/// The error of the rank that failed first in cause, with what the others did in its help.
fn blame<T>(p: &Prepared, out: Vec<Outcome<T>>, seen: &[usize]) -> RunError {
    let world = out.len();
    let order = |r: usize| seen.iter().position(|&s| s == r).unwrap_or(usize::MAX);
    let mut ranks: Vec<usize> = (0..world).collect();
    ranks.sort_by_key(|&r| (out[r].cause(), order(r), r));
    let mut out: Vec<Option<Outcome<T>>> = out.into_iter().map(Some).collect();
    let first = ranks[0];
    let mut err = match out[first].take() {
        Some(Outcome::Gone(e) | Outcome::Late(e) | Outcome::Stage(e)) => e,
        _ => RunError::new(E_WORKER, format!("{}: the data-parallel call failed", p.who[first])),
    };
    let others: Vec<String> = ranks[1..]
        .iter()
        .filter_map(|&r| match out[r].take()? {
            Outcome::Gone(e) | Outcome::Late(e) | Outcome::Stage(e) => {
                Some(format!("rank {r}: {}", first_line(&e.message)))
            }
            Outcome::Waiting => Some(format!("rank {r}: still waiting for it")),
            Outcome::Answered(_) => None,
        })
        .collect();
    let mut help = format!("rank {first} of {world} failed first (its log: OUT/workers/{}.log)", p.ids[first]);
    if !others.is_empty() {
        help.push_str(&format!("; the other ranks: {}", others.join("; ")));
    }
    // A stage error's own help says what to do about it; the worker's generic one is said here.
    if let Some(h) = err.help.take().filter(|h| !h.contains("OUT/workers/")) {
        help.push_str(&format!("; {h}"));
    }
    help.push_str("; the last checkpoint is intact: `miles run --resume` continues from it, on any number of ranks");
    err.help = Some(help);
    err
}

fn first_line(s: &str) -> &str {
    const MAX: usize = 240;
    let line = s.lines().next().unwrap_or("");
    match line.char_indices().nth(MAX) {
        Some((i, _)) => &line[..i],
        None => line,
    }
}
