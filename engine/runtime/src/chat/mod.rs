//! The session server's core (docs/agents.md "The session server"): OpenAI chat requests onto
//! TITO sessions, queued for the engine side and served in batched `generate` calls.
//!
//! A request names a session (or none: plain inference, nothing recorded). Its messages become a
//! path of message keys; an assistant message that is a turn this hub answered maps to that
//! turn's checkpoint (its text and tool calls compared with what was answered), so the session
//! attaches the request to the deepest checkpoint whose path is a prefix (`Session::attach`) and
//! tokenises only the messages after it (`render::suffix`); anything else (a compacted history,
//! an edited answer, a harness-written assistant message) starts a new chain under the branching
//! rule (counted in `branches`), and is refused under the linear one unless it is the linear
//! rule's retry. The HTTP handler's thread waits (until its deadline) while the engine's thread
//! (`serve_pending`) serves every queued request, one `generate` call per group of equal
//! sampling settings, and the waiting thread records the turn.

mod answer;
pub mod render;
pub mod request;
#[cfg(test)]
mod tests;

pub use crate::spec::serving::{ChatError, ChatServer, ChatService, ExternalSessions, RunningChatServer};

use crate::backend::RolloutEngine;
use crate::sample::{Sample, SamplingParams};
use crate::session::{Attach, MessageKey, Rule, Session};
use crate::spec::env::ToolFormat;
use crate::token::TokenId;
use crate::tokenize::Tokenizer;
use crate::RunError;
use request::{ChatRequest, Message, Role};
use serde_json::{json, Value};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

/// A hub's settings.
#[derive(Debug, Clone)]
pub struct HubConfig {
    /// What `/v1/models` lists and responses echo.
    pub model_name: String,
    /// How tool calls are parsed from sampled text (hermes for HF chat models).
    pub tool_format: ToolFormat,
    /// TITO rule of new sessions.
    pub rule: Rule,
    /// Prompt + output bound per turn (the model's max_len).
    pub max_context: usize,
    /// Cap and default of `max_tokens`.
    pub max_new_tokens: usize,
    /// Sampling settings a request omits (temperature, top_p, top_k, seed, stop tokens).
    pub defaults: SamplingParams,
    pub max_sessions: usize,
    /// During training (`miles run`): a request's temperature/top_p/top_k must be absent or equal
    /// `defaults` (the trainer's log-probs assume the rollout's sampling), else 400 naming the
    /// field; max_tokens is capped at `max_new_tokens` instead of refused.
    pub pinned: bool,
}

/// What a session is opened with.
#[derive(Debug, Clone, Default)]
pub struct SessionInfo {
    pub max_turns: Option<usize>,
    pub deadline: Option<Instant>,
    pub task: Value,
}

/// What a session recorded.
#[derive(Debug, Clone)]
pub struct SessionRecord {
    pub id: String,
    /// TITO checkpoints (ids, logprobs, versions, routing).
    pub session: Session,
    /// The messages each served request added (as the harness sent them), then its answers.
    pub transcript: Vec<Value>,
    /// Model turns served (requests; `n` choices are one turn).
    pub turns: usize,
    /// Turns that started a new chain after the first (compaction, edits).
    pub branches: usize,
    /// Tokens a re-tokenising path would have got wrong (`session::retokenize`), summed over
    /// the turns that extended a checkpoint.
    pub retokenize_mismatch: usize,
    pub tool_calls: usize,
    pub bad_tool_calls: usize,
    /// Requests refused (bad messages, over max_turns, ...).
    pub errors: Vec<String>,
}

/// A session and what maps the harness's messages onto it.
struct Live {
    record: SessionRecord,
    info: SessionInfo,
    /// `Message::answer_key` of each answered choice -> the checkpoints that answered it.
    answers: HashMap<u64, Vec<usize>>,
    last_used: u64,
}

/// A request waiting for, or in, the engine.
struct Job {
    id: u64,
    session: Option<String>,
    prompt: Vec<TokenId>,
    n: usize,
    params: SamplingParams,
    /// The request gave its own seed: sampled in a call of its own, with that seed.
    seeded: bool,
}

enum Slot {
    Queued,
    Running,
    Done(Result<Vec<Sample>, ChatError>),
    /// Its requester gave up (deadline): the samples are dropped, nothing recorded.
    Abandoned,
}

#[derive(Default)]
struct State {
    sessions: HashMap<String, Live>,
    queue: VecDeque<Job>,
    slots: HashMap<u64, Slot>,
    next_id: u64,
    clock: u64,
    calls: u64,
    external: Option<Arc<dyn ExternalSessions>>,
}

/// Sessions, the queue of requests, and the tokenizer; shared as `Arc<Hub>`.
pub struct Hub {
    tokenizer: Arc<Tokenizer>,
    /// Fixed but for the sampling defaults and `max_sessions`, which each play of a run's
    /// plug-in layer sets (`set_defaults`, `set_max_sessions`): one hub serves the whole run.
    config: RwLock<HubConfig>,
    state: Mutex<State>,
    /// Signalled when a job is done (the requesters wait on it).
    done: Condvar,
    /// Signalled when a job is queued (the engine side waits on it).
    queued: Condvar,
    /// `miles serve`: an unknown session id is opened on first use (the least recently used
    /// session evicted at `max_sessions`).
    open_on_demand: AtomicBool,
}

/// Where a session's request goes, decided before it is queued.
struct Plan {
    id: String,
    at: Attach,
    path: Vec<MessageKey>,
    /// The messages this request adds (from `new_from`).
    added: Vec<Value>,
    new_chain: bool,
    mismatch: usize,
}

/// A session id: 1 to 128 characters of `A-Z a-z 0-9 . _ : -`.
pub fn valid_session_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 128 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b"._:-".contains(&b))
}

fn not_found(id: &str) -> ChatError {
    ChatError::new(404, "session_not_found", format!("no session {id:?} is open on this server"))
}

impl Hub {
    pub fn new(tokenizer: Arc<Tokenizer>, config: HubConfig) -> Result<Hub, RunError> {
        if config.max_sessions == 0 || config.max_new_tokens == 0 || config.max_context < 2 {
            return Err(RunError::new(
                crate::E_SPEC,
                "the chat hub needs max_sessions and max_new_tokens of at least 1 and max_context of at least 2",
            ));
        }
        Ok(Hub {
            tokenizer,
            config: RwLock::new(config),
            state: Mutex::new(State::default()),
            done: Condvar::new(),
            queued: Condvar::new(),
            open_on_demand: AtomicBool::new(false),
        })
    }

    /// A copy of the settings in force (a request reads them once, so a change between plays
    /// never splits one request across two settings).
    pub fn config(&self) -> HubConfig {
        self.config.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// A play's sampling: what requests omit, what a pinned hub holds them to, `max_tokens`'
    /// cap (`defaults.max_new_tokens`), and the seed its `generate` calls are derived from.
    /// The call count restarts, so a play samples as a fresh hub with these defaults would
    /// (a resumed run repeats the first). Error when `max_new_tokens` is 0.
    pub fn set_defaults(&self, defaults: SamplingParams) -> Result<(), RunError> {
        if defaults.max_new_tokens == 0 {
            return Err(RunError::new(crate::E_SPEC, "the chat hub's sampling needs max_new_tokens of at least 1"));
        }
        let mut c = self.config.write().unwrap_or_else(|p| p.into_inner());
        c.max_new_tokens = defaults.max_new_tokens;
        c.defaults = defaults;
        drop(c);
        self.lock().calls = 0;
        Ok(())
    }

    /// How many sessions may be open at once from now on (at least 1); open ones stay open.
    pub fn set_max_sessions(&self, n: usize) {
        self.config.write().unwrap_or_else(|p| p.into_inner()).max_sessions = n.max(1);
    }

    /// `miles serve`: open an unknown session on its first request instead of answering 404;
    /// past `max_sessions` the least recently used idle session is dropped.
    pub fn set_open_on_demand(&self, on: bool) {
        self.open_on_demand.store(on, Ordering::SeqCst);
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn new_live(&self, id: &str, info: SessionInfo, clock: u64) -> Live {
        let record = SessionRecord {
            id: id.to_string(),
            session: Session::new(self.config().rule),
            transcript: Vec::new(),
            turns: 0,
            branches: 0,
            retokenize_mismatch: 0,
            tool_calls: 0,
            bad_tool_calls: 0,
            errors: Vec::new(),
        };
        Live { record, info, answers: HashMap::new(), last_used: clock }
    }

    /// Opens a session: 400 for a bad id, 409 when it is open, 429 at `max_sessions`.
    pub fn open(&self, id: &str, info: SessionInfo) -> Result<(), ChatError> {
        if !valid_session_id(id) {
            return Err(ChatError::bad_request(format!(
                "session id {:?} must be 1 to 128 characters of A-Z a-z 0-9 . _ : -",
                crate::quote::truncate(id, 40)
            )));
        }
        let mut st = self.lock();
        if st.sessions.contains_key(id) {
            return Err(ChatError::new(409, "session_exists", format!("session {id:?} is already open")));
        }
        if st.sessions.len() >= self.config().max_sessions {
            return Err(ChatError::new(
                429,
                "too_many_sessions",
                format!("{} sessions are open, the most this server holds; finish one first", st.sessions.len()),
            ));
        }
        st.clock += 1;
        let live = self.new_live(id, info, st.clock);
        st.sessions.insert(id.to_string(), live);
        Ok(())
    }

    /// Removes the session; its queued requests are answered with an error.
    pub fn finish(&self, id: &str) -> Option<SessionRecord> {
        let mut st = self.lock();
        let live = st.sessions.remove(id)?;
        let mut dropped = Vec::new();
        st.queue.retain(|j| {
            let mine = j.session.as_deref() == Some(id);
            if mine {
                dropped.push(j.id);
            }
            !mine
        });
        for j in dropped {
            let e = ChatError::new(404, "session_finished", format!("session {id:?} was finished before this turn"));
            st.slots.insert(j, Slot::Done(Err(e)));
        }
        drop(st);
        self.done.notify_all();
        Some(live.record)
    }

    /// A copy of what the session recorded so far.
    pub fn record(&self, id: &str) -> Option<SessionRecord> {
        self.lock().sessions.get(id).map(|l| l.record.clone())
    }

    pub fn set_external(&self, ext: Arc<dyn ExternalSessions>) {
        self.lock().external = Some(ext);
    }

    pub fn external(&self) -> Option<Arc<dyn ExternalSessions>> {
        self.lock().external.clone()
    }

    /// `GET /v1/models` body.
    pub fn models(&self) -> Value {
        json!({"object": "list", "data": [
            {"id": self.config().model_name, "object": "model", "created": 0, "owned_by": "miles"}
        ]})
    }

    /// Called by HTTP handlers on a blocking thread: validates the OpenAI body, renders/attaches
    /// it to the session's TITO checkpoints, queues it and waits (until `deadline`) for the engine
    /// side. `session` None: plain inference, nothing recorded. The `chat.completion` object.
    pub fn chat(&self, session: Option<&str>, body: &Value, deadline: Instant) -> Result<Value, ChatError> {
        let r = self.chat_inner(session, body, deadline);
        if let (Some(id), Err(e)) = (session, &r) {
            if let Some(l) = self.lock().sessions.get_mut(id) {
                l.record.errors.push(e.to_string());
            }
        }
        r
    }

    fn chat_inner(&self, session: Option<&str>, body: &Value, deadline: Instant) -> Result<Value, ChatError> {
        let config = self.config();
        let req = request::parse(body, &config)?;
        let (prompt, plan) = match session {
            None => (render::fresh(&self.tokenizer, &req.messages, req.tools.as_ref())?, None),
            Some(id) => {
                let (prompt, plan) = self.plan(id, &req, config.rule)?;
                (prompt, Some(plan))
            }
        };
        let room = config.max_context.saturating_sub(prompt.len());
        if room == 0 {
            return Err(ChatError::new(
                400,
                "context_length_exceeded",
                format!("the prompt is {} tokens; this model's context is {}", prompt.len(), config.max_context),
            ));
        }
        let mut params = req.params.clone();
        match req.max_tokens {
            Some(m) if m > room => {
                return Err(ChatError::new(
                    400,
                    "context_length_exceeded",
                    format!(
                        "the prompt is {} tokens and max_tokens {m}; this model's context is {} (at most {room} new tokens)",
                        prompt.len(),
                        config.max_context
                    ),
                ))
            }
            _ => params.max_new_tokens = params.max_new_tokens.min(room),
        }
        let samples = self.run(session, prompt.clone(), &req, params, deadline)?;
        self.answer(&config, plan, &req, &prompt, samples)
    }

    /// Attaches a session's request: its prompt ids and where its turn is recorded.
    fn plan(&self, id: &str, req: &ChatRequest, rule: Rule) -> Result<(Vec<TokenId>, Plan), ChatError> {
        let mut st = self.lock();
        if !st.sessions.contains_key(id) {
            if !self.open_on_demand.load(Ordering::SeqCst) || !valid_session_id(id) {
                return Err(not_found(id));
            }
            self.open_evicting(&mut st, id);
        }
        st.clock += 1;
        let clock = st.clock;
        let live = st.sessions.get_mut(id).ok_or_else(|| not_found(id))?;
        live.last_used = clock;
        if live.info.max_turns.is_some_and(|m| live.record.turns >= m) {
            return Err(ChatError::new(
                400,
                "max_turns_exceeded",
                format!("session {id:?} has had its {} turns (max_turns)", live.record.turns),
            ));
        }
        if live.info.deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(ChatError::new(400, "session_expired", format!("session {id:?} is past its deadline")));
        }
        let session = &mut live.record.session;
        let path = message_path(session, &live.answers, &req.messages);
        let dropped: Vec<bool> = session.checkpoints.iter().map(|c| c.dropped).collect();
        let rule_name = match rule {
            Rule::Linear => "linear",
            Rule::Branching => "branching",
        };
        let mut at = session
            .attach(&path)
            .map_err(|e| ChatError::bad_request(format!("session {id:?} (rule {rule_name}): {e}")))?;
        if let Attach::Extend { new_from, .. } = at {
            let foreign = req.messages[new_from..].iter().any(|m| matches!(m.role, Role::Assistant | Role::System));
            if foreign && rule == Rule::Linear {
                for (c, d) in session.checkpoints.iter_mut().zip(dropped) {
                    c.dropped = d;
                }
                return Err(ChatError::bad_request(format!(
                    "session {id:?} (rule linear): the new messages hold an assistant or system message this server \
                     did not answer; the linear rule extends its last turn with user and tool messages only"
                )));
            }
            if foreign {
                at = Attach::Fresh;
            }
        }
        let new_chain = at == Attach::Fresh && !session.checkpoints.is_empty();
        let parent = match at {
            Attach::Extend { parent, new_from } => {
                Some((session.context(at, &[]), new_from, session.checkpoints[parent].clone()))
            }
            Attach::Fresh => None,
        };
        drop(st);
        let tok = &self.tokenizer;
        let (prompt, new_from, mismatch) = match parent {
            Some((context, new_from, _)) => {
                let mut prompt = context;
                prompt.extend(render::suffix(tok, &req.messages[new_from..])?);
                let naive = render::naive(tok, &req.messages, req.tools.as_ref())?;
                let m = crate::session::retokenize::mismatch(&prompt, &naive);
                (prompt, new_from, m)
            }
            None => (render::fresh(tok, &req.messages, req.tools.as_ref())?, 0, 0),
        };
        let added = req.messages[new_from..].iter().map(|m| m.template_json(&m.content)).collect();
        Ok((prompt, Plan { id: id.to_string(), at, path, added, new_chain, mismatch }))
    }

    /// Opens `id` on demand, dropping the least recently used idle session when full.
    fn open_evicting(&self, st: &mut State, id: &str) {
        if st.sessions.len() >= self.config().max_sessions {
            let busy: Vec<String> = st.queue.iter().filter_map(|j| j.session.clone()).collect();
            let oldest = st
                .sessions
                .iter()
                .filter(|(k, _)| !busy.contains(k))
                .min_by_key(|(_, l)| l.last_used)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                st.sessions.remove(&k);
            }
        }
        st.clock += 1;
        let live = self.new_live(id, SessionInfo::default(), st.clock);
        st.sessions.insert(id.to_string(), live);
    }

    /// Queues a request and waits for its samples until `deadline`.
    fn run(
        &self,
        session: Option<&str>,
        prompt: Vec<TokenId>,
        req: &ChatRequest,
        params: SamplingParams,
        deadline: Instant,
    ) -> Result<Vec<Sample>, ChatError> {
        let mut st = self.lock();
        st.next_id += 1;
        let id = st.next_id;
        let job =
            Job { id, session: session.map(str::to_string), prompt, n: req.n, params, seeded: req.seed.is_some() };
        st.queue.push_back(job);
        st.slots.insert(id, Slot::Queued);
        self.queued.notify_all();
        loop {
            if let Some(Slot::Done(_)) = st.slots.get(&id) {
                let Some(Slot::Done(r)) = st.slots.remove(&id) else { unreachable!("matched above") };
                return r;
            }
            let now = Instant::now();
            if now >= deadline {
                st.queue.retain(|j| j.id != id);
                if let Some(Slot::Running) = st.slots.remove(&id) {
                    st.slots.insert(id, Slot::Abandoned);
                }
                return Err(ChatError::new(
                    504,
                    "timeout",
                    "the engine did not answer before the request's deadline; nothing was recorded",
                ));
            }
            st = self.done.wait_timeout(st, deadline - now).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    /// Records a session's turn (one checkpoint per choice) and builds the answer.
    fn answer(
        &self,
        config: &HubConfig,
        plan: Option<Plan>,
        req: &ChatRequest,
        prompt: &[TokenId],
        samples: Vec<Sample>,
    ) -> Result<Value, ChatError> {
        let mut st = self.lock();
        st.next_id += 1;
        let rid = format!("chatcmpl-{:016x}", crate::rng::derive_seed(config.defaults.seed, "chatcmpl", st.next_id));
        let Some(plan) = plan else {
            drop(st);
            let choices = samples
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    answer::choice(&self.tokenizer, config.tool_format, req, i, s, |j| {
                        format!("call_{}_{i}_{j}", &rid[9..])
                    })
                    .json
                })
                .collect();
            return Ok(answer::completion(&rid, &config.model_name, req, prompt, &samples, choices));
        };
        let live = st.sessions.get_mut(&plan.id).ok_or_else(|| {
            ChatError::new(
                404,
                "session_finished",
                format!("session {:?} was finished while this turn was sampled", plan.id),
            )
        })?;
        let rec = &mut live.record;
        let mut choices = Vec::new();
        let mut answers = Vec::new();
        for (i, s) in samples.iter().enumerate() {
            let n = s.response.len();
            let c = rec.session.record(
                plan.at,
                &plan.path,
                prompt.to_vec(),
                s.response.clone(),
                s.logprobs.clone(),
                vec![s.weight_version; n],
                s.finish,
            );
            rec.session.set_routing(s.routing.clone());
            let ch = answer::choice(&self.tokenizer, config.tool_format, req, i, s, |j| {
                format!("call_{}_{c}_{j}", &rid[9..])
            });
            rec.tool_calls += ch.calls;
            rec.bad_tool_calls += usize::from(ch.bad_call);
            live.answers.entry(ch.message.answer_key()).or_default().push(c);
            answers.push(ch.message.template_json(&ch.message.content));
            choices.push(ch.json);
        }
        rec.turns += 1;
        rec.branches += usize::from(plan.new_chain);
        rec.retokenize_mismatch += plan.mismatch;
        rec.transcript.extend(plan.added);
        rec.transcript.extend(answers);
        Ok(answer::completion(&rid, &config.model_name, req, prompt, &samples, choices))
    }

    /// The engine side (the executor's thread): waits up to `wait` for queued requests, then
    /// serves every queued one in batched `generate` calls (requests with equal sampling settings
    /// in one call, each prompt its own row). How many requests it served.
    pub fn serve_pending(&self, engine: &mut dyn RolloutEngine, wait: Duration) -> Result<usize, RunError> {
        let jobs = {
            let mut st = self.lock();
            let until = Instant::now() + wait;
            while st.queue.is_empty() {
                let now = Instant::now();
                if now >= until {
                    return Ok(0);
                }
                st = self.queued.wait_timeout(st, until - now).unwrap_or_else(|p| p.into_inner()).0;
            }
            let jobs: Vec<Job> = st.queue.drain(..).collect();
            for j in &jobs {
                st.slots.insert(j.id, Slot::Running);
            }
            jobs
        };
        let served = jobs.len();
        let mut groups: Vec<(Vec<Job>, SamplingParams)> = Vec::new();
        for j in jobs {
            let same =
                |(g, p): &&mut (Vec<Job>, SamplingParams)| !j.seeded && !g[0].seeded && g[0].n == j.n && *p == j.params;
            match groups.iter_mut().find(|g| same(g)) {
                Some(g) => g.0.push(j),
                None => {
                    let p = j.params.clone();
                    groups.push((vec![j], p));
                }
            }
        }
        let mut failed = None;
        let seed = self.config().defaults.seed;
        for (group, mut params) in groups {
            if !group[0].seeded {
                let mut st = self.lock();
                st.calls += 1;
                params.seed = crate::rng::derive_seed(seed, "chat-call", st.calls);
            }
            let prompts: Vec<Vec<TokenId>> = group.iter().map(|j| j.prompt.clone()).collect();
            let n = group[0].n;
            let out = engine.generate(&prompts, n, &params);
            let mut st = self.lock();
            match out {
                Ok(samples) => {
                    let mut per: Vec<Vec<Sample>> = vec![Vec::new(); group.len()];
                    for s in samples {
                        if let Some(v) = per.get_mut(s.prompt_index) {
                            v.push(s);
                        }
                    }
                    for (j, mut s) in group.iter().zip(per) {
                        s.iter_mut().for_each(|x| x.prompt_index = 0);
                        let r = if s.len() == n {
                            Ok(s)
                        } else {
                            Err(ChatError::new(
                                500,
                                "engine_error",
                                format!("the engine returned {} samples of {n}", s.len()),
                            ))
                        };
                        deposit(&mut st, j.id, r);
                    }
                }
                Err(e) => {
                    for j in &group {
                        deposit(&mut st, j.id, Err(ChatError::new(500, "engine_error", e.message.clone())));
                    }
                    failed.get_or_insert(e);
                }
            }
            drop(st);
            self.done.notify_all();
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(served),
        }
    }

    /// Waits up to `wait` for a queued request; whether one is queued (the server's pump holds
    /// its engine only once there is work).
    pub fn wait_for_requests(&self, wait: Duration) -> bool {
        let until = Instant::now() + wait;
        let mut st = self.lock();
        while st.queue.is_empty() {
            let now = Instant::now();
            if now >= until {
                return false;
            }
            st = self.queued.wait_timeout(st, until - now).unwrap_or_else(|p| p.into_inner()).0;
        }
        true
    }
}

/// A job's result, unless its requester gave up.
fn deposit(st: &mut State, id: u64, r: Result<Vec<Sample>, ChatError>) {
    // Abandoned (deadline) or answered already (the session was finished): dropped.
    if let Some(Slot::Running) = st.slots.remove(&id) {
        st.slots.insert(id, Slot::Done(r));
    }
}

/// The keys of a conversation: an assistant message that is a turn this session answered, at the
/// same place in the conversation, takes that turn's key (`session::output_key`), so the session
/// attaches past it; any other message its own key.
fn message_path(session: &Session, answers: &HashMap<u64, Vec<usize>>, msgs: &[Message]) -> Vec<MessageKey> {
    let mut path: Vec<MessageKey> = Vec::with_capacity(msgs.len());
    for m in msgs {
        let sampled = (m.role == Role::Assistant).then(|| answers.get(&m.answer_key())).flatten().and_then(|cs| {
            cs.iter()
                .map(|&c| &session.checkpoints[c])
                .find(|c| !c.dropped && c.path.len() == path.len() + 1 && c.path[..path.len()] == path[..])
        });
        path.push(match sampled {
            Some(c) => *c.path.last().expect("a checkpoint's path ends with its output"),
            None => m.key(),
        });
    }
    path
}

/// `GET /v1/sessions/{id}`: the record as JSON, one entry per chain (root to leaf).
pub fn record_json(r: &SessionRecord) -> Value {
    let chains: Vec<Value> = r
        .session
        .trajectories()
        .iter()
        .map(|t| {
            json!({
                "checkpoints": t.checkpoints,
                "prompt_token_ids": t.prompt,
                "token_ids": t.response,
                "loss_mask": t.loss_mask,
                "logprobs": t.logprobs,
                "weight_versions": t.versions,
                "routing_tokens": t.routing.as_ref().map(|x| x.tokens()),
            })
        })
        .collect();
    json!({
        "id": r.id,
        "object": "miles.session",
        "rule": format!("{:?}", r.session.rule).to_lowercase(),
        "turns": r.turns,
        "branches": r.branches,
        "retokenize_mismatch": r.retokenize_mismatch,
        "tool_calls": r.tool_calls,
        "bad_tool_calls": r.bad_tool_calls,
        "errors": r.errors,
        "chains": chains,
        "transcript": r.transcript,
    })
}

impl ChatService for Hub {
    fn chat(&self, session: Option<&str>, body: &Value, deadline: Instant) -> Result<Value, ChatError> {
        Hub::chat(self, session, body, deadline)
    }

    fn models(&self) -> Value {
        Hub::models(self)
    }

    fn session_json(&self, id: &str) -> Result<Value, ChatError> {
        self.record(id).map(|r| record_json(&r)).ok_or_else(|| not_found(id))
    }

    fn external(&self) -> Option<Arc<dyn ExternalSessions>> {
        Hub::external(self)
    }
}
