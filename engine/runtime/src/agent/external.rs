//! `external_agents`: sessions opened and finished by an outside process over HTTP. The layer
//! offers the step's episodes; `POST /v1/sessions` hands the next one out (its session opened on
//! the hub), `POST /v1/sessions/{id}/finish` records its reward, metrics and metadata. The
//! serving loop reads what finished and when each handed-out session's time is up, and closes
//! what it gave up on: the run's server outlives the step, so a late finish must be refused, not
//! taken and dropped.

use super::program::Answer;
use crate::chat::{ChatError, ExternalSessions, Hub, SessionInfo};
use crate::env::Task;
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// What happened to one offered episode.
#[derive(Debug, Clone, PartialEq)]
pub enum Slot {
    Waiting,
    /// Handed out at this instant (its session is open).
    Open(Instant),
    /// Finished by the outside process with this answer.
    Finished(Answer),
    /// Given up on by the run (its time was up, or the step ended): a late finish is 409.
    Closed,
}

/// The episodes of one step, as the outside process sees them.
pub struct Offer {
    /// The hub the sessions are opened on (weak: the hub holds this offer).
    hub: Weak<Hub>,
    base_url: String,
    max_turns: usize,
    timeout: Duration,
    state: Mutex<State>,
}

struct State {
    waiting: VecDeque<usize>,
    /// The step is over: nothing more is handed out.
    closed: bool,
    tasks: Vec<(usize, Task)>,
    slots: Vec<Slot>,
    by_id: BTreeMap<String, usize>,
}

impl Offer {
    pub fn new(
        hub: &Arc<Hub>,
        base_url: &str,
        tasks: Vec<(usize, Task)>,
        max_turns: usize,
        timeout: Duration,
    ) -> Offer {
        let n = tasks.len();
        Offer {
            hub: Arc::downgrade(hub),
            base_url: base_url.trim_end_matches('/').to_string(),
            max_turns,
            timeout,
            state: Mutex::new(State {
                waiting: (0..n).collect(),
                closed: false,
                by_id: tasks.iter().enumerate().map(|(k, t)| (super::session_id(&t.1.episode), k)).collect(),
                tasks,
                slots: vec![Slot::Waiting; n],
            }),
        }
    }

    /// Each episode's slot, in offer order.
    pub fn slots(&self) -> Vec<Slot> {
        self.lock().slots.clone()
    }

    /// Gives up on episode `k` (its time is up): never handed out after, a finish is 409. A
    /// finish that came in since the caller looked wins: its answer is returned, the slot kept.
    pub fn give_up(&self, k: usize) -> Option<Answer> {
        let mut st = self.lock();
        st.waiting.retain(|&w| w != k);
        match st.slots.get_mut(k) {
            Some(Slot::Finished(a)) => Some(a.clone()),
            Some(s) => {
                *s = Slot::Closed;
                None
            }
            None => None,
        }
    }

    /// The step is over: every open slot is closed and nothing more is handed out (the server
    /// stays up for the next step, which offers afresh).
    pub fn close(&self) {
        let mut st = self.lock();
        st.closed = true;
        st.waiting.clear();
        for s in &mut st.slots {
            if !matches!(s, Slot::Finished(_)) {
                *s = Slot::Closed;
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl ExternalSessions for Offer {
    fn open(&self, _body: &serde_json::Value) -> Result<serde_json::Value, ChatError> {
        let hub = self.hub.upgrade().ok_or_else(|| ChatError::new(503, "server_closing", "the run is closing"))?;
        let mut st = self.lock();
        if st.closed {
            return Err(ChatError::new(
                429,
                "no_sessions",
                "no episodes are offered now (the run is between steps); open again after the next weight update",
            ));
        }
        let Some(k) = st.waiting.pop_front() else {
            return Err(ChatError::new(
                429,
                "no_sessions",
                "every episode of this step is handed out; open again after the next weight update",
            ));
        };
        let (group, task) = st.tasks[k].clone();
        let id = super::session_id(&task.episode);
        let now = Instant::now();
        let info = SessionInfo {
            max_turns: Some(self.max_turns),
            deadline: Some(now + self.timeout),
            task: serde_json::to_value(&task).unwrap_or_default(),
        };
        if let Err(e) = hub.open(&id, info) {
            st.waiting.push_front(k);
            return Err(e);
        }
        st.slots[k] = Slot::Open(now);
        Ok(serde_json::json!({
            "base_url": format!("{}/sessions/{id}/v1", self.base_url),
            "session_id": id,
            "task": task,
            "group": group,
        }))
    }

    fn finish(&self, id: &str, body: &serde_json::Value) -> Result<serde_json::Value, ChatError> {
        let mut st = self.lock();
        let Some(&k) = st.by_id.get(id) else {
            return Err(ChatError::new(404, "session_not_found", format!("no session `{id}` in this step")));
        };
        match st.slots[k] {
            Slot::Open(_) => {}
            Slot::Closed => {
                return Err(ChatError::new(
                    409,
                    "session_closed",
                    format!("session `{id}` was closed by the run (its `timeout` passed): this finish is not recorded"),
                ))
            }
            _ => return Err(ChatError::new(409, "session_not_open", format!("session `{id}` is not open"))),
        }
        let answer = Answer::from_object(body).map_err(ChatError::bad_request)?;
        let reward = answer.reward;
        st.slots[k] = Slot::Finished(answer);
        Ok(serde_json::json!({"session_id": id, "reward": reward}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::HubConfig;
    use crate::sample::SamplingParams;
    use crate::tokenize::{CharTokenizer, Tokenizer};

    fn hub() -> Arc<Hub> {
        let tok = Arc::new(Tokenizer::Char(CharTokenizer::new("0123456789*=".chars())));
        let config = HubConfig {
            model_name: "m".into(),
            tool_format: Default::default(),
            rule: crate::session::Rule::Branching,
            max_context: 64,
            max_new_tokens: 8,
            defaults: SamplingParams::plain(8, 0),
            max_sessions: 8,
            pinned: true,
        };
        Arc::new(Hub::new(tok, config).unwrap())
    }

    fn task(g: usize, j: usize) -> (usize, Task) {
        let episode = format!("step1/p{g}/e{j}");
        (g, Task { episode, prompt: "2*3=".into(), label: "6".into(), metadata: serde_json::json!({}), seed: 1 })
    }

    #[test]
    fn external_sessions_are_handed_out_from_the_rows() {
        let hub = hub();
        let offer = Offer::new(&hub, "http://127.0.0.1:9/", vec![task(0, 0), task(1, 0)], 4, Duration::from_secs(60));
        let a = offer.open(&serde_json::json!({})).unwrap();
        assert_eq!(a["session_id"], "step1.p0.e0");
        assert_eq!(a["base_url"], "http://127.0.0.1:9/sessions/step1.p0.e0/v1");
        assert_eq!(a["task"]["prompt"], "2*3=");
        assert_eq!(a["group"], 0);
        let b = offer.open(&serde_json::Value::Null).unwrap();
        assert_eq!(b["group"], 1);
        // Every episode of the step is out: the next caller is told to come back.
        assert_eq!(offer.open(&serde_json::json!({})).unwrap_err().status, 429);
        // A reward must be a finite number; an unknown session is 404; a finished one cannot
        // be finished again.
        assert_eq!(offer.finish("step1.p0.e0", &serde_json::json!({"reward": "high"})).unwrap_err().status, 400);
        assert_eq!(offer.finish("nope", &serde_json::json!({"reward": 1})).unwrap_err().status, 404);
        // Metrics and metadata by the programs' rules: a bad metric or an unknown field is 400
        // naming it, and the session stays open for a good finish.
        let e = offer.finish("step1.p0.e0", &serde_json::json!({"reward": 1, "metrics": {"n": "x"}})).unwrap_err();
        assert!(e.status == 400 && e.message.contains("`metrics.n`"), "{e}");
        let e = offer.finish("step1.p0.e0", &serde_json::json!({"reward": 1, "metadta": {}})).unwrap_err();
        assert!(e.status == 400 && e.message.contains("\"metadta\""), "{e}");
        let body = serde_json::json!({"reward": 1.0, "metrics": {"n": 2}, "metadata": {"k": 1}});
        offer.finish("step1.p0.e0", &body).unwrap();
        assert_eq!(offer.finish("step1.p0.e0", &serde_json::json!({"reward": 1})).unwrap_err().status, 409);
        let slots = offer.slots();
        let kept =
            Answer { reward: 1.0, metrics: vec![("n".into(), 2.0)], metadata: Some(serde_json::json!({"k": 1})) };
        assert_eq!(slots[0], Slot::Finished(kept));
        assert!(matches!(slots[1], Slot::Open(_)));
        // The run gives up on the open one: a late finish is refused, not recorded.
        assert_eq!(offer.give_up(1), None);
        assert_eq!(offer.give_up(0).map(|a| a.reward), Some(1.0), "a finished one stays finished");
        let late = offer.finish("step1.p1.e0", &serde_json::json!({"reward": 1})).unwrap_err();
        assert!(late.status == 409 && late.message.contains("not recorded"), "{late}");
        assert_eq!(offer.slots()[1], Slot::Closed);
    }

    /// A step's offer, once closed, hands nothing out (the run's server stays up between steps)
    /// and an episode given up on before anyone opened it is never handed out.
    #[test]
    fn a_closed_offer_hands_nothing_out() {
        let hub = hub();
        let offer = Offer::new(&hub, "http://127.0.0.1:9", vec![task(0, 0), task(0, 1)], 4, Duration::from_secs(60));
        assert_eq!(offer.give_up(0), None);
        assert_eq!(offer.open(&serde_json::json!({})).unwrap()["session_id"], "step1.p0.e1");
        offer.close();
        let e = offer.open(&serde_json::json!({})).unwrap_err();
        assert!(e.status == 429 && e.message.contains("between steps"), "{e}");
        assert_eq!(offer.slots(), vec![Slot::Closed, Slot::Closed]);
        assert_eq!(offer.finish("step1.p0.e1", &serde_json::json!({"reward": 1})).unwrap_err().status, 409);
    }
}
