//! The rollout plug-in layers (docs/agents.md "Your own agent: three plug-in layers"): the
//! user's programs play episodes through the run's OpenAI-compatible chat server, and every
//! answer is kept token for token in a TITO session (`chat::Hub`) for the trainer.
//! `agent_program`: one program per episode (`program`); `rollout_program`: one per group of
//! sessions; `external_agents`: an outside process opens and finishes sessions (`external`).
//!
//! The first `play` starts one hub and its server for the run (one key, one base URL for every
//! step); each play sets the hub's sampling defaults to the step's (pinned: a request may not
//! ask for other sampling, the trainer's log-probs assume the rollout's), runs the programs up
//! to the stage's `concurrency`, each under `timeout`, and serves their chat requests in batched
//! `generate` calls on this thread until every one has ended. What a session recorded becomes an
//! `EpisodeResult` (with what the program reported beside its reward: `agent/<name>` metrics,
//! metadata for samples.jsonl), so batches, evaluation and metrics are the episode driver's.

pub mod external;
pub mod program;

use crate::backend::RolloutEngine;
use crate::chat::{ChatServer, ChatService, Hub, HubConfig, RunningChatServer, SessionInfo, SessionRecord};
use crate::child::ChildEnv;
use crate::env::{EndReason, EpisodeResult, Task};
use crate::sample::SamplingParams;
use crate::session::{Rule, Session};
use crate::spec::env::{EnvRunSpec, EnvSpec, ProgramSpec, ToolFormat};
use crate::tokenize::Tokenizer;
use crate::RunError;
use program::{Answer, Fault, Program};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long one `serve_pending` waits for requests before the programs are polled again.
const SERVE_WAIT: Duration = Duration::from_millis(10);
/// The file an outside process reads to find the server (`external_agents`), and its key's.
pub const SERVER_FILE: &str = "session-server.json";
pub const KEY_FILE: &str = "session-server.key";

pub use crate::env::reported::{metrics, MAX_STEP_METRICS};

/// A run's plug-in layer: what to run, and the chat server it plays through.
pub struct Layer {
    kind: EnvSpec,
    max_turns: usize,
    timeout: Duration,
    concurrency: usize,
    tool_format: ToolFormat,
    rule: Rule,
    max_context: usize,
    tokenizer: Arc<Tokenizer>,
    server: Arc<dyn ChatServer>,
    out_dir: PathBuf,
    model_name: String,
    /// The run's hub and server, started by the first play (`None` before).
    served: Mutex<Option<Served>>,
}

/// The hub and HTTP server every play of the run goes through: the base URL and the key stay
/// the same from step to step (a harness keeps its client; an outside process its connection).
struct Served {
    hub: Arc<Hub>,
    key: String,
    base: String,
    /// Dropping it (with the layer, at the end of the run) stops the server.
    _running: Box<dyn RunningChatServer>,
}

/// One unit of work: an episode (agent program) or a group's episodes (rollout program).
struct Unit {
    program: Program,
    /// Indices into the play's tasks.
    episodes: Vec<usize>,
}

impl Layer {
    /// The layer of `env` (`None` when the environment is stepped by the episode driver).
    /// `server`: the run's chat server (`RunOptions::chat_server`); a layer without one is an
    /// error naming the setting.
    pub fn new(
        env: &EnvRunSpec,
        tokenizer: Arc<Tokenizer>,
        server: Option<Arc<dyn ChatServer>>,
        out_dir: PathBuf,
        max_context: usize,
        model_name: String,
    ) -> Result<Option<Layer>, RunError> {
        if !env.env.is_layer() {
            return Ok(None);
        }
        let server = server.ok_or_else(|| {
            RunError::new(
                crate::E_BACKEND,
                "the chat server the agent layers play through is unavailable in this process (no `RunOptions::chat_server`)",
            )
            .with_help("the `miles-engine` binary that `miles run` starts provides it; a program embedding the runtime sets `chat_server`, or uses `command_env`")
        })?;
        if let EnvSpec::AgentProgram(p) | EnvSpec::RolloutProgram(p) = &env.env {
            check_program(p)?;
        }
        let (_, timeout) = env.timeouts()?;
        Ok(Some(Layer {
            kind: env.env.clone(),
            max_turns: env.max_turns,
            timeout,
            concurrency: env.concurrency.max(1),
            tool_format: env.tool_format,
            rule: env.session,
            max_context,
            tokenizer,
            server,
            out_dir,
            model_name,
            served: Mutex::new(None),
        }))
    }

    /// The run's server's base URL (`http://127.0.0.1:PORT`), once the first play started it.
    pub fn base_url(&self) -> Option<String> {
        lock(&self.served).as_ref().map(|s| s.base.clone())
    }

    /// The run's hub, base URL and key; the first call starts the server over a new hub (and,
    /// for `external_agents`, writes the key file).
    fn served(&self, params: &SamplingParams, sessions: usize) -> Result<(Arc<Hub>, String, String), RunError> {
        let mut slot = lock(&self.served);
        if let Some(s) = slot.as_ref() {
            return Ok((s.hub.clone(), s.base.clone(), s.key.clone()));
        }
        let hub = Arc::new(Hub::new(self.tokenizer.clone(), self.hub_config(params, sessions))?);
        let key = new_key()?;
        let bind = match &self.kind {
            EnvSpec::ExternalAgents(e) => e.bind.as_str(),
            _ => "127.0.0.1:0",
        };
        let service: Arc<dyn ChatService> = hub.clone();
        let running = self.server.start(service, bind, &key)?;
        let base = running.base_url().trim_end_matches('/').to_string();
        if matches!(self.kind, EnvSpec::ExternalAgents(_)) {
            let key_path = self.out_dir.join(KEY_FILE);
            crate::atomic_write::replace_file(&key_path, |tmp| write_private(tmp, key.as_bytes()))?;
        }
        let out = (hub.clone(), base.clone(), key.clone());
        *slot = Some(Served { hub, key, base, _running: running });
        Ok(out)
    }

    /// Plays `tasks` (each with its group) through the layer; `params` is the step's sampling,
    /// every request's defaults. One result per task, in order.
    pub fn play(
        &self,
        engine: &mut dyn RolloutEngine,
        tasks: &[(usize, Task)],
        params: &SamplingParams,
    ) -> Result<Vec<EpisodeResult>, RunError> {
        let (hub, base, key) = self.served(params, tasks.len())?;
        // This play's sampling (a greedy evaluation, the next step's seed) on the run's hub.
        hub.set_defaults(params.clone())?;
        hub.set_max_sessions(tasks.len());
        let outcomes = match &self.kind {
            EnvSpec::AgentProgram(p) => self.run_programs(&hub, engine, tasks, p, &base, &key, false)?,
            EnvSpec::RolloutProgram(p) => self.run_programs(&hub, engine, tasks, p, &base, &key, true)?,
            EnvSpec::ExternalAgents(_) => self.serve_external(&hub, engine, tasks, &base)?,
            _ => return Err(RunError::internal("a plug-in layer over an environment the episode driver steps")),
        };
        Ok(tasks.iter().zip(outcomes).map(|((_, t), (record, o))| self.result(t, record, o)).collect())
    }

    fn hub_config(&self, params: &SamplingParams, sessions: usize) -> HubConfig {
        HubConfig {
            model_name: self.model_name.clone(),
            tool_format: self.tool_format,
            rule: self.rule,
            max_context: self.max_context,
            max_new_tokens: params.max_new_tokens,
            defaults: params.clone(),
            max_sessions: sessions.max(1),
            pinned: true,
        }
    }

    fn session_info(&self, task: &Task, now: Instant) -> SessionInfo {
        SessionInfo {
            max_turns: Some(self.max_turns),
            deadline: Some(now + self.timeout),
            task: serde_json::to_value(task).unwrap_or_default(),
        }
    }

    /// Runs one program per episode (`per_group` false) or per group, `concurrency` at once, and
    /// serves their requests until every one has ended. Each task's record and outcome.
    #[allow(clippy::too_many_arguments)]
    fn run_programs(
        &self,
        hub: &Arc<Hub>,
        engine: &mut dyn RolloutEngine,
        tasks: &[(usize, Task)],
        p: &ProgramSpec,
        base: &str,
        key: &str,
        per_group: bool,
    ) -> Result<Vec<(Option<SessionRecord>, Outcome)>, RunError> {
        let mut units: std::collections::VecDeque<Vec<usize>> = match per_group {
            false => (0..tasks.len()).map(|k| vec![k]).collect(),
            true => group_indices(tasks).into(),
        };
        let mut out: Vec<Option<(Option<SessionRecord>, Outcome)>> = (0..tasks.len()).map(|_| None).collect();
        let mut running: Vec<Unit> = Vec::new();
        let env = ChildEnv::program(&p.pass_env)
            .map_err(|why| RunError::new(crate::E_SPEC, format!("environment `{}`: `pass_env`: {why}", p.name)))?;
        loop {
            while running.len() < self.concurrency {
                let Some(episodes) = units.pop_front() else { break };
                let now = Instant::now();
                let mut sessions = Vec::new();
                for &k in &episodes {
                    let t = &tasks[k].1;
                    let id = session_id(&t.episode);
                    hub.open(&id, self.session_info(t, now))
                        .map_err(|e| RunError::internal(format!("the chat hub refused session `{id}`: {e}")))?;
                    sessions.push(serde_json::json!({"id": id, "base_url": session_url(base, &id)}));
                }
                let first = &tasks[episodes[0]].1;
                let id = session_id(&first.episode);
                let input = match per_group {
                    false => serde_json::json!({"task": first, "session_id": id, "base_url": session_url(base, &id)}),
                    true => serde_json::json!({"task": first, "sessions": sessions}),
                };
                let penv = env
                    .clone()
                    .with("OPENAI_BASE_URL", session_url(base, &id))
                    .with("OPENAI_API_KEY", key)
                    .with("MILES_SESSION_ID", id.as_str());
                match Program::start(&p.command, p.cwd.as_deref(), &penv, &input, self.timeout) {
                    Ok(program) => running.push(Unit { program, episodes }),
                    Err(f) => {
                        for &k in &episodes {
                            out[k] = Some((hub.finish(&session_id(&tasks[k].1.episode)), Outcome::Fault(f.clone())));
                        }
                    }
                }
            }
            if running.is_empty() && units.is_empty() {
                break;
            }
            hub.serve_pending(engine, SERVE_WAIT)?;
            let now = Instant::now();
            let mut k = 0;
            while k < running.len() {
                let Some(answer) = running[k].program.poll(now) else {
                    k += 1;
                    continue;
                };
                let unit = running.swap_remove(k);
                let outcomes = outcomes_of(answer, unit.episodes.len(), per_group);
                for (&e, o) in unit.episodes.iter().zip(outcomes) {
                    out[e] = Some((hub.finish(&session_id(&tasks[e].1.episode)), o));
                }
            }
        }
        Ok(out.into_iter().map(|o| o.unwrap_or((None, Outcome::Fault(lost())))).collect())
    }

    /// Offers `tasks` to outside processes and serves their sessions until each is finished or
    /// its time is up (handed out: `timeout` after; never handed out: `timeout` after the offer).
    fn serve_external(
        &self,
        hub: &Arc<Hub>,
        engine: &mut dyn RolloutEngine,
        tasks: &[(usize, Task)],
        base: &str,
    ) -> Result<Vec<(Option<SessionRecord>, Outcome)>, RunError> {
        use external::Offer;
        let offer = Arc::new(Offer::new(hub, base, tasks.to_vec(), self.max_turns, self.timeout));
        hub.set_external(offer.clone());
        let served = self.serve_offer(hub, engine, tasks, &offer, base);
        // Whatever happened, nothing more of this step is handed out or finished.
        offer.close();
        served
    }

    /// `serve_external`'s loop: publishes the offer, then serves until every slot has an outcome.
    fn serve_offer(
        &self,
        hub: &Arc<Hub>,
        engine: &mut dyn RolloutEngine,
        tasks: &[(usize, Task)],
        offer: &external::Offer,
        base: &str,
    ) -> Result<Vec<(Option<SessionRecord>, Outcome)>, RunError> {
        use external::Slot;
        self.publish(base, tasks.len())?;
        let start = Instant::now();
        let mut out: Vec<Option<(Option<SessionRecord>, Outcome)>> = (0..tasks.len()).map(|_| None).collect();
        while out.iter().any(Option::is_none) {
            hub.serve_pending(engine, SERVE_WAIT)?;
            let now = Instant::now();
            for (k, slot) in offer.slots().into_iter().enumerate() {
                if out[k].is_some() {
                    continue;
                }
                let late = |since: Instant| now.duration_since(since) >= self.timeout;
                let o = match slot {
                    Slot::Finished(a) => Outcome::Done(a),
                    Slot::Open(at) if late(at) => offer
                        .give_up(k)
                        .map_or_else(|| Outcome::Fault(timed_out("the session was not finished")), Outcome::Done),
                    Slot::Waiting if late(start) => offer.give_up(k).map_or_else(
                        || Outcome::Fault(timed_out("no outside process opened the session")),
                        Outcome::Done,
                    ),
                    Slot::Closed => Outcome::Fault(lost()),
                    _ => continue,
                };
                // A session never handed out was never opened on the hub: no record.
                out[k] = Some((hub.finish(&session_id(&tasks[k].1.episode)), o));
            }
        }
        Ok(out.into_iter().map(|o| o.unwrap_or((None, Outcome::Fault(lost())))).collect())
    }

    /// Writes `OUT/session-server.json` (the URL, the key file's path and the step's offer),
    /// atomically; the key file itself (mode 0600) was written when the server started.
    fn publish(&self, base: &str, sessions: usize) -> Result<(), RunError> {
        let key_path = self.out_dir.join(KEY_FILE);
        let info = serde_json::json!({
            "url": base,
            "sessions": format!("{base}/v1/sessions"),
            "key_file": key_path,
            "offered": sessions,
        });
        crate::atomic_write::write_json(&self.out_dir.join(SERVER_FILE), &info)
    }

    /// The episode's result from what its session recorded and how its program ended.
    fn result(&self, task: &Task, record: Option<SessionRecord>, outcome: Outcome) -> EpisodeResult {
        let (reward, end, fault, reported) = match outcome {
            Outcome::Done(a) => (a.reward, EndReason::Done, None, a.reported().map(Box::new)),
            Outcome::Fault(f) => (0.0, f.reason, Some(f.what), None),
        };
        let mut r = EpisodeResult {
            task: task.clone(),
            session: Session::new(self.rule),
            reward,
            end,
            fault,
            turns: 0,
            tool_calls: 0,
            bad_tool_calls: 0,
            observation_tokens: 0,
            retokenize_mismatch: 0,
            compactions: 0,
            reported,
        };
        if let Some(rec) = record {
            r.turns = rec.turns;
            r.tool_calls = rec.tool_calls;
            r.bad_tool_calls = rec.bad_tool_calls;
            r.retokenize_mismatch = rec.retokenize_mismatch;
            r.compactions = rec.branches;
            r.session = rec.session;
        }
        r
    }
}

/// The environment slot of a run whose episodes a plug-in layer plays (`EnvRunner::layer`): it
/// is never stepped; a caller that tries ends the episode with an error saying why.
pub struct NotStepped;

impl crate::env::Environment for NotStepped {
    fn name(&self) -> &str {
        "plug-in layer"
    }
    fn reset(&self, _: &Task, _: Duration) -> Result<String, crate::env::EnvFault> {
        Err(not_stepped())
    }
    fn step(
        &self,
        _: &str,
        _: &crate::env::Action,
        _: Duration,
    ) -> Result<crate::env::StepResult, crate::env::EnvFault> {
        Err(not_stepped())
    }
    fn close(&self, _: &str) {}
}

fn not_stepped() -> crate::env::EnvFault {
    crate::env::EnvFault::Error("a plug-in layer's episodes are played by its programs, not stepped".into())
}

/// How one episode's program ended: its answer (reward, metrics, metadata), or its fault.
#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    Done(Answer),
    Fault(Fault),
}

/// Each episode's outcome from its unit's answer (the last stdout line, or its fault).
fn outcomes_of(answer: Result<String, Fault>, n: usize, per_group: bool) -> Vec<Outcome> {
    let parsed = answer.and_then(|line| match per_group {
        false => program::parse_reward(&line).map(|a| vec![a]),
        true => program::parse_rewards(&line, n),
    });
    match parsed {
        Ok(answers) => answers.into_iter().map(Outcome::Done).collect(),
        Err(f) => vec![Outcome::Fault(f); n],
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The tasks' indices grouped by group, in order of first appearance.
fn group_indices(tasks: &[(usize, Task)]) -> Vec<Vec<usize>> {
    let mut groups: Vec<(usize, Vec<usize>)> = Vec::new();
    for (k, (g, _)) in tasks.iter().enumerate() {
        match groups.iter_mut().find(|(h, _)| h == g) {
            Some((_, v)) => v.push(k),
            None => groups.push((*g, vec![k])),
        }
    }
    groups.into_iter().map(|(_, v)| v).collect()
}

/// The chat session id of an episode (`step3/p1/e0` -> `step3.p1.e0`): the server takes ids of
/// `A-Z a-z 0-9 . _ : -` only, and an id is also a URL path segment.
pub fn session_id(episode: &str) -> String {
    episode.chars().map(|c| if c.is_ascii_alphanumeric() || "._:-".contains(c) { c } else { '.' }).collect()
}

fn session_url(base: &str, id: &str) -> String {
    format!("{base}/sessions/{id}/v1")
}

fn timed_out(what: &str) -> Fault {
    Fault { reason: EndReason::ProgramTimeout, what: format!("{what} within the stage's `timeout`") }
}

/// An episode the loop lost track of; unreachable by construction, reported rather than panicking.
fn lost() -> Fault {
    Fault { reason: EndReason::ProgramFailed, what: "internal error: the episode's program was lost".into() }
}

fn check_program(p: &ProgramSpec) -> Result<(), RunError> {
    if p.command.is_empty() {
        return Err(RunError::new(crate::E_SPEC, format!("environment `{}`: `command` is empty", p.name)));
    }
    Ok(())
}

/// 128 random bits from the kernel, hex: the key every request of this play must carry.
fn new_key() -> Result<String, RunError> {
    use std::io::Read;
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b)).map_err(|e| {
        RunError::new(crate::E_BACKEND, format!("cannot read random bytes for the chat server's key: {e}"))
    })?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// Creates `path` readable by its owner only, then writes `bytes` (a secret never lies readable
/// by others, not even before a chmod).
fn write_private(path: &std::path::Path, bytes: &[u8]) -> Result<(), RunError> {
    use std::io::Write;
    let mut o = std::fs::OpenOptions::new();
    o.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
    o.open(path)
        .and_then(|mut f| f.write_all(bytes))
        .map_err(|e| RunError::io(crate::E_OUT_DIR, "cannot write", path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(g: usize, j: usize) -> (usize, Task) {
        let t = Task {
            episode: format!("s/p{g}/e{j}"),
            prompt: serde_json::json!("q"),
            label: serde_json::Value::Null,
            metadata: serde_json::json!({}),
            seed: 0,
        };
        (g, t)
    }

    #[test]
    fn groups_and_answers_map_onto_episodes() {
        let tasks = vec![task(0, 0), task(1, 0), task(0, 1), task(1, 1)];
        assert_eq!(group_indices(&tasks), vec![vec![0, 2], vec![1, 3]]);
        let two = outcomes_of(Ok(r#"{"rewards": [1, 0], "metadata": [null, {"k": 1}]}"#.into()), 2, true);
        let done = |reward, metadata| Outcome::Done(Answer { reward, metrics: vec![], metadata });
        assert_eq!(two, vec![done(1.0, None), done(0.0, Some(serde_json::json!({"k": 1})))]);
        // A group's program that fails faults every session of the group, with its reason.
        let f = Fault { reason: EndReason::ProgramFailed, what: "exited with status 1".into() };
        assert_eq!(outcomes_of(Err(f.clone()), 2, true), vec![Outcome::Fault(f.clone()), Outcome::Fault(f)]);
        let bad = outcomes_of(Ok("{}".into()), 1, false);
        assert!(matches!(&bad[0], Outcome::Fault(f) if f.reason == EndReason::NoReward));
    }

    fn result_with(metrics: &[(&str, f64)]) -> EpisodeResult {
        let reported =
            program::Reported { metrics: metrics.iter().map(|(n, x)| (n.to_string(), *x)).collect(), metadata: None };
        EpisodeResult {
            task: task(0, 0).1,
            session: Session::new(Rule::Linear),
            reward: 0.0,
            end: EndReason::Done,
            fault: None,
            turns: 0,
            tool_calls: 0,
            bad_tool_calls: 0,
            observation_tokens: 0,
            retokenize_mismatch: 0,
            compactions: 0,
            reported: (!metrics.is_empty()).then(|| Box::new(reported)),
        }
    }

    /// `agent/<name>` is the mean over the episodes that reported the name; a step with no
    /// report adds no column; names past the cap are counted, not written.
    #[test]
    fn reported_metrics_are_averaged_per_name() {
        let rs = vec![result_with(&[("turns", 2.0), ("cost", 1.0)]), result_with(&[("turns", 4.0)]), result_with(&[])];
        assert_eq!(metrics(&rs), vec![("agent/cost".to_string(), 1.0), ("agent/turns".to_string(), 3.0)]);
        assert!(metrics(&[result_with(&[])]).is_empty());
        // The mean of huge finite numbers stays finite.
        let big = vec![result_with(&[("x", f64::MAX)]), result_with(&[("x", f64::MAX)])];
        assert_eq!(metrics(&big), vec![("agent/x".to_string(), f64::MAX)]);
        let names: Vec<String> = (0..MAX_STEP_METRICS + 3).map(|i| format!("m{i:03}")).collect();
        let many: Vec<EpisodeResult> = names
            .chunks(program::MAX_METRICS)
            .map(|c| result_with(&c.iter().map(|n| (n.as_str(), 1.0)).collect::<Vec<_>>()))
            .collect();
        let m = metrics(&many);
        assert_eq!(m.len(), MAX_STEP_METRICS + 1);
        assert_eq!(m.last().unwrap(), &("rollout/agent_metrics_dropped".to_string(), 3.0));
        // The full step row carries them beside the driver's columns.
        let row = crate::env::episode::metrics(&rs);
        assert!(row.iter().any(|(k, x)| k == "agent/turns" && *x == 3.0), "{row:?}");
    }

    /// A server that counts its starts and answers no request (the test's programs never chat).
    struct Counting(Arc<std::sync::atomic::AtomicUsize>);
    struct Idle(String);

    impl crate::chat::RunningChatServer for Idle {
        fn base_url(&self) -> String {
            self.0.clone()
        }
    }

    impl ChatServer for Counting {
        fn start(
            &self,
            _: Arc<dyn ChatService>,
            bind: &str,
            key: &str,
        ) -> Result<Box<dyn crate::chat::RunningChatServer>, RunError> {
            assert_eq!((bind, key.len()), ("127.0.0.1:0", 32));
            let n = self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(Box::new(Idle(format!("http://127.0.0.1:{}/", 40000 + n))))
        }
    }

    /// An engine the test's programs never reach.
    struct NoEngine;

    impl RolloutEngine for NoEngine {
        fn generate(
            &mut self,
            _: &[Vec<crate::token::TokenId>],
            _: usize,
            _: &SamplingParams,
        ) -> Result<Vec<crate::sample::Sample>, RunError> {
            Err(RunError::internal("no request was expected"))
        }
        fn weight_version(&self) -> u64 {
            0
        }
        fn load_weights(&mut self, _: &crate::backend::WeightSnapshot) -> Result<(), RunError> {
            Ok(())
        }
    }

    /// One server for the run: two plays (a step, then an evaluation with other sampling) start
    /// it once, and each program sees the same base URL and key; what it reported beside its
    /// reward is kept with its episode.
    #[test]
    fn one_server_serves_every_play_of_the_run() {
        let script = "import json, os, sys; t = json.load(sys.stdin); \
            print(json.dumps({'reward': 1, 'metrics': {'n': len(t['task']['episode'])}, \
            'metadata': {'url': os.environ['OPENAI_BASE_URL'], 'key': os.environ['OPENAI_API_KEY'], \
            'env': sorted(os.environ)}}))";
        let spec: EnvRunSpec = serde_json::from_value(serde_json::json!({
            "env": {"type": "agent_program", "name": "a", "command": ["python3", "-c", script]},
            "episode_timeout_s": 30.0,
        }))
        .unwrap();
        let tok = Arc::new(Tokenizer::Char(crate::tokenize::CharTokenizer::new("0123456789*=".chars())));
        let starts = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let server: Arc<dyn ChatServer> = Arc::new(Counting(starts.clone()));
        let dir = crate::child::testing::scratch("agent-one-server");
        let layer = Layer::new(&spec, tok, Some(server), dir, 64, "m".into()).unwrap().unwrap();
        assert_eq!(layer.base_url(), None, "started by the first play");
        let one = layer.play(&mut NoEngine, &[task(0, 0), task(0, 1)], &SamplingParams::plain(4, 1)).unwrap();
        let two = layer.play(&mut NoEngine, &[task(0, 0)], &SamplingParams::greedy(4)).unwrap();
        assert_eq!(starts.load(std::sync::atomic::Ordering::SeqCst), 1, "one server start for the run");
        assert_eq!(layer.base_url().as_deref(), Some("http://127.0.0.1:40000"));
        let seen = |r: &EpisodeResult| r.reported.as_ref().and_then(|p| p.metadata.clone()).unwrap();
        let (a, b) = (seen(&one[0]), seen(&two[0]));
        assert_eq!(a["url"], "http://127.0.0.1:40000/sessions/s.p0.e0/v1");
        assert_eq!(a, b, "the same URL and key on both plays");
        assert_eq!(one[1].reported.as_ref().unwrap().metrics, vec![("n".to_string(), 7.0)]);
        assert!(one.iter().chain(&two).all(|r| r.end == EndReason::Done), "{one:?}");
        // What a program's environment holds: the three names of the layer, and not this test
        // process's own (cargo's `CARGO_*`) or the run's secrets (a shell or a pyenv shim in
        // between may add its own, such as `PWD`).
        let env: Vec<String> = serde_json::from_value(a["env"].clone()).unwrap();
        for name in ["OPENAI_BASE_URL", "OPENAI_API_KEY", "MILES_SESSION_ID"] {
            assert!(env.iter().any(|e| e == name), "{name}: {env:?}");
        }
        let leaked = |e: &&String| e.starts_with("CARGO") || (e.starts_with("MILES_") && *e != "MILES_SESSION_ID");
        assert_eq!(env.iter().filter(leaked).count(), 0, "{env:?}");
        assert!(std::env::var_os("CARGO_PKG_NAME").is_some(), "the canary is set in this process");
    }

    #[test]
    fn the_key_file_is_private() {
        let dir = crate::child::testing::scratch("agent-key");
        let path = dir.join(KEY_FILE);
        crate::atomic_write::replace_file(&path, |tmp| write_private(tmp, b"k")).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"k");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        }
        assert_ne!(new_key().unwrap(), new_key().unwrap());
    }
}
