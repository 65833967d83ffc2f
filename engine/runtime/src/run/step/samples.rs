//! samples.jsonl (docs/runs.md, "Samples"): a few of a step's samples written for a person to
//! read, at step 1, every `samples.every` steps and the last step: the prompt as the model saw it
//! (rendered text and ids), the response (text and ids), reward, advantage, finish and weight
//! version; an episode's transcript turn by turn (text, tool calls as parsed, the observation
//! after), how it ended and why the environment failed. Faulted and dropped samples come first:
//! they are what a user most needs to read. Rows are appended one `write` per line and cut back to
//! the checkpoint on resume, as metrics.jsonl is. Samples are untrusted text: `miles report`
//! escapes them.

use super::batch::StepBatch;
use super::metrics::open_cut_back;
use crate::advantage::advantages;
use crate::buffer::Group;
use crate::env::{EpisodeResult, ToolCall, ToolFormat};
use crate::reward::RewardOutcome;
use crate::sample::{FinishReason, Sample, Trajectory};
use crate::session::Session;
use crate::spec::RunSpec;
use crate::token::TokenId;
use crate::tokenize::Tokenizer;
use crate::{RunError, E_OUT_DIR};
use serde::Serialize;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Longest text of a field, in bytes: longer is cut at a character boundary and marked (`cut`).
pub const MAX_TEXT: usize = 16 << 10;
/// Most ids of a field: more are cut and marked.
pub const MAX_IDS: usize = 4096;
/// Most turns of a transcript shown: later ones are counted, not shown.
pub const MAX_TURNS: usize = 64;

/// Text and the ids it was decoded from, each bounded.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Shown {
    pub text: String,
    pub ids: Vec<TokenId>,
    /// The full sizes, when either was cut.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cut: Option<Cut>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Cut {
    pub text_bytes: usize,
    pub ids: usize,
}

impl Shown {
    pub fn new(text: String, ids: &[TokenId]) -> Shown {
        let (text_bytes, n) = (text.len(), ids.len());
        let mut end = text.len().min(MAX_TEXT);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        let mut text = text;
        text.truncate(end);
        let ids = ids[..n.min(MAX_IDS)].to_vec();
        let cut = (text.len() < text_bytes || ids.len() < n).then_some(Cut { text_bytes, ids: n });
        Shown { text, ids, cut }
    }
}

/// One sample as samples.jsonl holds it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SampleRow {
    pub step: u64,
    /// The sample's id, as a failing reward or environment names it (`step12/p3/s1`).
    pub id: String,
    /// The multi-LoRA adapter that sampled it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub adapter: Option<String>,
    /// Its group (prompt) in the step, and its place in the group.
    pub group: usize,
    pub index: usize,
    /// The oldest weight version that sampled one of its tokens.
    pub weight_version: u64,
    /// The prompt as the model saw it: special tokens and the chat template kept.
    pub prompt: Shown,
    /// A single response (an episode has its transcript instead).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response: Option<Shown>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finish: Option<FinishReason>,
    /// The reward trained on, and the advantage; null for a sample dropped from training.
    pub reward: Option<f32>,
    pub advantage: Option<f32>,
    /// Why the reward or the environment failed on it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fault: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub episode: Option<EpisodeView>,
}

/// An episode: how it ended, its TITO chains (trajectories) and its turns.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EpisodeView {
    pub end: &'static str,
    /// The environment's reward, trained on or not.
    pub env_reward: f32,
    pub turns: usize,
    pub chains: usize,
    pub tool_calls: usize,
    pub bad_tool_calls: usize,
    pub transcript: Vec<Turn>,
    /// What a plug-in layer's program reported beside its reward (docs/agents.md).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub metrics: std::collections::BTreeMap<String, f64>,
}

/// One sampled turn of an episode.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Turn {
    pub role: &'static str,
    pub text: Shown,
    pub finish: FinishReason,
    pub tool_calls: Vec<ToolCall>,
    /// What is wrong with a tool call that did not parse.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_error: Option<String>,
    /// The observation appended after it (chat delimiters included), as the next turn saw it;
    /// the last turn's is not kept by the session. `compacted`: the next turn saw a compacted
    /// context, shown whole.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observation: Option<Shown>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub compacted: bool,
}

/// samples.jsonl, open for appending.
pub struct SamplesLog {
    file: fs::File,
    path: PathBuf,
}

impl SamplesLog {
    /// Opens `path`, cut back to the rows of steps up to `resume_step` (emptied for a fresh run).
    pub fn open(path: &Path, resume_step: Option<u64>) -> Result<SamplesLog, RunError> {
        Ok(SamplesLog { file: open_cut_back(path, resume_step)?, path: path.to_path_buf() })
    }

    /// Appends `rows`, one `write` per line: a kill leaves at most one torn last line, which the
    /// next resume drops.
    pub fn write(&mut self, rows: &[SampleRow]) -> Result<(), RunError> {
        for row in rows {
            let mut line = serde_json::to_string(row)
                .map_err(|e| RunError::new(E_OUT_DIR, format!("cannot serialise a sample: {e}")))?;
            line.push('\n');
            self.file
                .write_all(line.as_bytes())
                .map_err(|e| RunError::io(E_OUT_DIR, "cannot append to", &self.path, e))?;
        }
        self.file.flush().map_err(|e| RunError::io(E_OUT_DIR, "cannot append to", &self.path, e))
    }
}

/// The prompt as the model saw it: a Hugging Face tokenizer's special tokens (the chat template)
/// are kept; the character tokenizer has none to show.
fn rendered(tok: &Tokenizer, ids: &[TokenId]) -> Shown {
    let text = match tok {
        Tokenizer::Hf(h) => h.decode(ids, false),
        Tokenizer::Char(t) => t.decode(ids),
    };
    Shown::new(text, ids)
}

/// Which of `n` samples to show, at most `count`: faulted first, then the first of each group,
/// then the second, ... (so a few rows show several prompts).
fn pick(groups: &[usize], faulted: &[bool], count: usize) -> Vec<usize> {
    let mut seen = std::collections::HashMap::new();
    let mut keyed: Vec<(bool, usize, usize, usize)> = groups
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let j = seen.entry(*g).or_insert(0usize);
            *j += 1;
            (!faulted[i], *j, *g, i)
        })
        .collect();
    keyed.sort();
    keyed.into_iter().take(count).map(|k| k.3).collect()
}

/// The rows of a step of single responses (`single_turn_batch`'s data): `ids` name the samples,
/// `advantages` are None for a dropped one.
#[allow(clippy::too_many_arguments)]
pub fn single_turn(
    spec: &RunSpec,
    tok: &Tokenizer,
    step: u64,
    ids: &[String],
    prompts: &[Vec<TokenId>],
    samples: &[Sample],
    outcomes: &[RewardOutcome],
    advantages: &[Option<f32>],
) -> Vec<SampleRow> {
    if !spec.samples.due(step, spec.steps) {
        return Vec::new();
    }
    let groups: Vec<usize> = samples.iter().map(|s| s.prompt_index).collect();
    let faulted: Vec<bool> = outcomes.iter().map(|o| !matches!(o, RewardOutcome::Score(_))).collect();
    let mut nth = vec![0usize; prompts.len()];
    let index: Vec<usize> = samples
        .iter()
        .map(|s| {
            nth[s.prompt_index] += 1;
            nth[s.prompt_index] - 1
        })
        .collect();
    pick(&groups, &faulted, spec.samples.count)
        .into_iter()
        .map(|i| {
            let s = &samples[i];
            let fault = match &outcomes[i] {
                RewardOutcome::Score(_) => None,
                RewardOutcome::Zeroed(f) | RewardOutcome::Dropped(f) => Some(f.to_string()),
            };
            response_row(tok, step, ids[i].clone(), (s.prompt_index, index[i]), &prompts[s.prompt_index], s).scored(
                outcomes[i].reward(),
                advantages[i],
                fault,
            )
        })
        .collect()
}

/// A single response's row, before its reward.
fn response_row(
    tok: &Tokenizer,
    step: u64,
    id: String,
    (group, index): (usize, usize),
    prompt: &[TokenId],
    s: &Sample,
) -> SampleRow {
    SampleRow {
        step,
        id,
        adapter: None,
        group,
        index,
        weight_version: s.weight_version,
        prompt: rendered(tok, prompt),
        response: Some(Shown::new(tok.decode(&s.response), &s.response)),
        finish: Some(s.finish),
        reward: None,
        advantage: None,
        fault: None,
        episode: None,
    }
}

impl SampleRow {
    fn scored(self, reward: Option<f32>, advantage: Option<f32>, fault: Option<String>) -> SampleRow {
        SampleRow { reward, advantage, fault, ..self }
    }
}

/// The rows of a step of episodes (`EnvRunner::play`'s groups and results), with the rewards and
/// advantages `EnvRunner::batch` trains on (a dropped episode has none).
pub fn episodes(
    spec: &RunSpec,
    tok: &Tokenizer,
    step: u64,
    groups: &[usize],
    results: &[EpisodeResult],
) -> Vec<SampleRow> {
    let Some(env) = spec.env.as_ref().filter(|_| spec.samples.due(step, spec.steps)) else { return Vec::new() };
    let kept: Vec<(usize, f32)> =
        results.iter().enumerate().filter_map(|(k, r)| r.training_reward(env.on_env_error).map(|w| (k, w))).collect();
    let rewards: Vec<f32> = kept.iter().map(|k| k.1).collect();
    let kept_groups: Vec<usize> = kept.iter().map(|k| groups[k.0]).collect();
    let adv = advantages(&spec.train, &rewards, &kept_groups);
    let mut trained = vec![None; results.len()];
    for ((k, w), a) in kept.iter().zip(adv) {
        trained[*k] = Some((*w, a));
    }
    let faulted: Vec<bool> = results.iter().map(|r| r.end.is_fault() || r.fault.is_some()).collect();
    let mut nth = std::collections::HashMap::new();
    let index: Vec<usize> = groups
        .iter()
        .map(|g| {
            let j = nth.entry(*g).or_insert(0usize);
            *j += 1;
            *j - 1
        })
        .collect();
    pick(groups, &faulted, spec.samples.count)
        .into_iter()
        .map(|k| episode_row(tok, env.tool_format, step, (groups[k], index[k]), &results[k], trained[k]))
        .collect()
}

/// An episode's row: `trained` is the reward and advantage it trained with (None: dropped).
pub fn episode_row(
    tok: &Tokenizer,
    format: ToolFormat,
    step: u64,
    (group, index): (usize, usize),
    r: &EpisodeResult,
    trained: Option<(f32, f32)>,
) -> SampleRow {
    let session = &r.session;
    let live: Vec<usize> = (0..session.checkpoints.len()).filter(|&i| !session.checkpoints[i].dropped).collect();
    let prompt = match live.first() {
        Some(&i) => rendered(tok, &session.checkpoints[i].prompt),
        // The environment failed at reset: no turn was sampled; the task's prompt as given.
        None => Shown::new(r.task.prompt.as_str().map_or_else(|| r.task.prompt.to_string(), str::to_string), &[]),
    };
    let weight_version = live.iter().flat_map(|&i| session.checkpoints[i].versions.iter().copied()).min().unwrap_or(0);
    SampleRow {
        step,
        id: r.task.episode.clone(),
        adapter: None,
        group,
        index,
        weight_version,
        prompt,
        response: None,
        finish: None,
        reward: trained.map(|t| t.0),
        advantage: trained.map(|t| t.1),
        fault: r.fault.clone(),
        episode: Some(EpisodeView {
            end: r.end.name(),
            env_reward: r.reward,
            turns: r.turns,
            chains: session.trajectories().len(),
            tool_calls: r.tool_calls,
            bad_tool_calls: r.bad_tool_calls,
            transcript: transcript(tok, format, session, &live),
            metadata: r.reported.as_ref().and_then(|p| p.metadata.clone()),
            metrics: r.reported.iter().flat_map(|p| p.metrics.iter().cloned()).collect(),
        }),
    }
}

/// The sampled turns of a session in the order they were played (`live`: its checkpoints not
/// rolled back), each with its tool calls and the observation the next turn saw after it.
fn transcript(tok: &Tokenizer, format: ToolFormat, session: &Session, live: &[usize]) -> Vec<Turn> {
    let cps = &session.checkpoints;
    live.iter()
        .enumerate()
        .take(MAX_TURNS)
        .map(|(n, &i)| {
            let c = &cps[i];
            let text = tok.decode(&c.output);
            let (tool_calls, tool_call_error) = match format.parse(&text) {
                Ok(calls) => (calls, None),
                Err(e) => (Vec::new(), Some(e)),
            };
            let next = live.get(n + 1).map(|&j| &cps[j]);
            let (observation, compacted) = match next {
                Some(d) if d.parent == Some(i) => {
                    let added = d.prompt.get(c.prompt.len() + c.output.len()..).unwrap_or(&[]);
                    (Some(rendered(tok, added)), false)
                }
                Some(d) => (Some(rendered(tok, &d.prompt)), true),
                None => (None, false),
            };
            Turn {
                role: "assistant",
                text: Shown::new(text, &c.output),
                finish: c.finish,
                tool_calls,
                tool_call_error,
                observation,
                compacted,
            }
        })
        .collect()
}

/// The rows of an asynchronous step: its drawn groups and the trajectories trained on them (in
/// the groups' order, with their advantages). A group of episodes shows every episode, dropped
/// ones too; a single response dropped by its reward never reached the buffer.
pub fn drawn(spec: &RunSpec, tok: &Tokenizer, step: u64, groups: &[Group], batch: &[Trajectory]) -> Vec<SampleRow> {
    if !spec.samples.due(step, spec.steps) {
        return Vec::new();
    }
    let format = spec.env.as_ref().map_or(ToolFormat::Tag, |e| e.tool_format);
    // (group, response) -> advantage: an episode's trajectories share theirs.
    let mut adv = std::collections::HashMap::new();
    let mut k = 0;
    for (gi, g) in groups.iter().enumerate() {
        for i in 0..g.samples.len() {
            if let Some(t) = batch.get(k) {
                adv.insert((gi, g.response_of(i)), t.advantage);
            }
            k += 1;
        }
    }
    let mut rows: Vec<(bool, SampleRow)> = Vec::new();
    for (gi, g) in groups.iter().enumerate() {
        match &g.episodes {
            Some(e) => {
                for (k, r) in e.results.iter().enumerate() {
                    let trained = adv.get(&(gi, k)).map(|a| (r.reward, *a));
                    let faulted = r.end.is_fault() || r.fault.is_some();
                    rows.push((faulted, episode_row(tok, format, step, (gi, k), r, trained)));
                }
            }
            None => {
                for (i, s) in g.samples.iter().enumerate() {
                    let sample = Sample {
                        prompt_index: gi,
                        response: s.response.clone(),
                        logprobs: Vec::new(),
                        finish: s.finish,
                        weight_version: s.oldest_version(),
                        routing: None,
                    };
                    let id = format!("step{step}/g{gi}/s{i}");
                    let row = response_row(tok, step, id, (gi, i), &g.prompt_tokens, &sample);
                    rows.push((false, row.scored(g.rewards.get(i).copied(), adv.get(&(gi, i)).copied(), None)));
                }
            }
        }
    }
    let groups_of: Vec<usize> = rows.iter().map(|r| r.1.group).collect();
    let faulted: Vec<bool> = rows.iter().map(|r| r.0).collect();
    let mut rows: Vec<Option<SampleRow>> = rows.into_iter().map(|r| Some(r.1)).collect();
    pick(&groups_of, &faulted, spec.samples.count).into_iter().filter_map(|i| rows[i].take()).collect()
}

impl StepBatch {
    /// The batch with the rows samples.jsonl shows of it.
    pub fn with_shown(self, shown: Vec<SampleRow>) -> StepBatch {
        StepBatch { shown, ..self }
    }

    /// Names the multi-LoRA adapter that sampled every row shown.
    pub fn tag_adapter(&mut self, name: &str) {
        for r in &mut self.shown {
            r.adapter = Some(name.to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::{EndReason, Task};
    use crate::reward::RewardFailure;
    use crate::session::{message_key, Rule};
    use crate::tokenize::chars::CharTokenizer;
    use serde_json::{json, Value};

    fn spec() -> RunSpec {
        let mut s = RunSpec::from_json(include_str!("../../../tests/data/tiny.json")).unwrap();
        s.samples = crate::spec::SamplesSpec { every: 10, count: 3 };
        s
    }

    fn tok() -> Tokenizer {
        Tokenizer::Char(CharTokenizer::new("<>/ toolcalc0123456789*=+resultab".chars()))
    }

    fn ids(t: &Tokenizer, s: &str) -> Vec<TokenId> {
        match t {
            Tokenizer::Char(c) => c.encode(s).unwrap(),
            Tokenizer::Hf(_) => unreachable!("the tests use the character tokenizer"),
        }
    }

    fn json_of(rows: &[SampleRow]) -> Vec<Value> {
        rows.iter().map(|r| serde_json::to_value(r).unwrap()).collect()
    }

    /// A single-turn row: rendered prompt and ids, response text and ids, reward, advantage,
    /// finish and weight version; a dropped sample comes first, with its reward's failure and no
    /// reward or advantage; steps that write no samples get none.
    #[test]
    fn single_turn_rows_show_prompt_response_reward_and_the_dropped_one_first() {
        let (spec, t) = (spec(), tok());
        let prompts = vec![ids(&t, "1+2="), ids(&t, "3+4=")];
        let sample = |p: usize, text: &str| Sample {
            prompt_index: p,
            response: ids(&t, text),
            logprobs: Vec::new(),
            finish: FinishReason::Stop,
            weight_version: 7,
            routing: None,
        };
        let samples = vec![sample(0, "3"), sample(0, "4"), sample(1, "7"), sample(1, "ab")];
        let sid: Vec<String> = (0..4).map(|i| format!("step1/p{}/s{}", i / 2, i % 2)).collect();
        let failure =
            RewardFailure { stage: "judge".into(), sample_id: sid[3].clone(), what: "exit 1".into(), timed_out: false };
        let outcomes = vec![
            RewardOutcome::Score(1.0),
            RewardOutcome::Score(0.0),
            RewardOutcome::Score(1.0),
            RewardOutcome::Dropped(failure),
        ];
        let adv = vec![Some(0.5), Some(-0.5), Some(0.0), None];
        let rows = json_of(&single_turn(&spec, &t, 1, &sid, &prompts, &samples, &outcomes, &adv));
        assert_eq!(rows.len(), 3, "count = 3");
        assert_eq!(rows[0]["id"], "step1/p1/s1", "the dropped sample first: {rows:?}");
        assert_eq!(rows[0]["reward"], Value::Null);
        assert_eq!(rows[0]["advantage"], Value::Null);
        assert_eq!(rows[0]["fault"], "reward `judge` failed on sample step1/p1/s1: exit 1");
        // Then the first of each group.
        assert_eq!(rows[1]["id"], "step1/p0/s0");
        assert_eq!(rows[2]["id"], "step1/p1/s0");
        let r = &rows[1];
        assert_eq!(r["step"], 1);
        assert_eq!((r["group"].clone(), r["index"].clone()), (json!(0), json!(0)));
        assert_eq!(r["prompt"]["text"], "1+2=");
        assert_eq!(r["prompt"]["ids"], json!(prompts[0]));
        assert_eq!(r["response"]["text"], "3");
        assert_eq!(r["response"]["ids"], json!(samples[0].response));
        assert_eq!((r["reward"].clone(), r["advantage"].clone()), (json!(1.0), json!(0.5)));
        assert_eq!((r["finish"].clone(), r["weight_version"].clone()), (json!("stop"), json!(7)));
        assert!(r.get("episode").is_none() && r.get("cut").is_none() && r.get("adapter").is_none(), "{r}");
        assert!(single_turn(&spec, &t, 2, &sid, &prompts, &samples, &outcomes, &adv).is_empty(), "step 2 writes none");
    }

    /// An episode that called a tool, read the result, then faulted: its transcript turn by
    /// turn (text, the tool call parsed, the observation after it), end reason, fault, chains.
    #[test]
    fn an_episode_row_has_its_transcript_tool_calls_and_fault() {
        let t = tok();
        let mut s = Session::new(Rule::Linear);
        let q = [message_key("user", b"2*3=")];
        let at = s.attach(&q).unwrap();
        let (p1, o1) = (ids(&t, "2*3="), ids(&t, "<tool>calc 2*3</tool>"));
        let n1 = o1.len();
        let c = s.record(at, &q, s.context(at, &p1), o1, vec![0.0; n1], vec![3; n1], FinishReason::Stop);
        let mut path = s.checkpoints[c].path.clone();
        path.push(message_key("tool", b"<result>6</result>"));
        let at = s.attach(&path).unwrap();
        let o2 = ids(&t, "6<tool>");
        let n2 = o2.len();
        let ctx = s.context(at, &ids(&t, "<result>6</result>"));
        s.record(at, &path, ctx, o2, vec![0.0; n2], vec![4; n2], FinishReason::Stop);
        let r = EpisodeResult {
            task: Task {
                episode: "step3/p0/e1".into(),
                prompt: json!("2*3="),
                label: json!("6"),
                metadata: json!({}),
                seed: 1,
            },
            session: s,
            reward: 0.0,
            end: EndReason::EnvCrashed,
            fault: Some("the environment exited with status 1".into()),
            turns: 2,
            tool_calls: 1,
            bad_tool_calls: 1,
            observation_tokens: 18,
            retokenize_mismatch: 0,
            compactions: 0,
            reported: None,
        };
        let row = serde_json::to_value(episode_row(&t, ToolFormat::Tag, 3, (0, 1), &r, None)).unwrap();
        assert_eq!(row["id"], "step3/p0/e1");
        assert_eq!(row["prompt"]["text"], "2*3=");
        assert_eq!(row["weight_version"], 3);
        assert_eq!((row["reward"].clone(), row["advantage"].clone()), (Value::Null, Value::Null), "dropped");
        assert_eq!(row["fault"], "the environment exited with status 1");
        let e = &row["episode"];
        assert_eq!(
            (e["end"].clone(), e["chains"].clone(), e["turns"].clone()),
            (json!("env_crashed"), json!(1), json!(2))
        );
        let turns = e["transcript"].as_array().unwrap();
        assert_eq!(turns.len(), 2);
        assert_eq!(turns[0]["role"], "assistant");
        assert_eq!(turns[0]["text"]["text"], "<tool>calc 2*3</tool>");
        assert_eq!(turns[0]["tool_calls"], json!([{"name": "calc", "arguments": "2*3"}]));
        assert_eq!(turns[0]["observation"]["text"], "<result>6</result>");
        assert_eq!(turns[1]["text"]["text"], "6<tool>");
        assert_eq!(turns[1]["tool_call_error"], "<tool> without </tool>");
        assert!(turns[1].get("observation").is_none(), "the session keeps no observation after the last turn");

        // Through `episodes`: the faulted episode is shown first, and a trained one has its
        // reward and advantage.
        let mut spec = spec();
        spec.env = Some(serde_json::from_value(json!({"env": {"type": "calculator"}})).unwrap());
        let mut ok = r.clone();
        (ok.end, ok.fault, ok.reward, ok.task.episode) = (EndReason::Done, None, 1.0, "step3/p0/e0".into());
        let rows = json_of(&episodes(&spec, &t, 10, &[0, 0], &[ok, r]));
        assert_eq!(rows[0]["id"], "step3/p0/e1");
        assert_eq!(rows[1]["reward"], 1.0);
        assert_eq!(rows[1]["advantage"], 0.0, "alone in its group once the fault is dropped");
    }

    /// An asynchronous step's rows: from its drawn groups, each sample's reward and the advantage
    /// of the trajectory trained on it, ids by drawn group.
    #[test]
    fn drawn_groups_show_their_rewards_and_advantages() {
        use crate::sample::{StreamSample, VersionSpan};
        let (spec, t) = (spec(), tok());
        let stream = |text: &str, v: u64| StreamSample {
            id: 0,
            response: ids(&t, text),
            logprobs: Vec::new(),
            finish: FinishReason::Stop,
            versions: vec![VersionSpan { version: v, from_token: 0 }],
            aborted: false,
            routing: None,
        };
        let group = |p: &str| Group {
            prompt: crate::source::Pending { id: 0, retries: 0, first_step: 1 },
            prompt_tokens: ids(&t, p),
            samples: vec![stream("3", 2), stream("4", 1)],
            rewards: vec![1.0, 0.0],
            episodes: None,
            reward_parts: Vec::new(),
        };
        let groups = vec![group("1+2="), group("2+2=")];
        let traj = |a: f32| Trajectory {
            prompt: Vec::new(),
            response: Vec::new(),
            rollout_logprobs: Vec::new(),
            loss_mask: Vec::new(),
            reward: 0.0,
            advantage: a,
            group: 0,
            weight_version: 0,
            routing: None,
            teacher_logprobs: Vec::new(),
        };
        let batch = vec![traj(0.7), traj(-0.7), traj(0.6), traj(-0.6)];
        let rows = json_of(&drawn(&spec, &t, 1, &groups, &batch));
        assert_eq!(rows.len(), 3);
        let got: Vec<(Value, Value, Value)> =
            rows.iter().map(|r| (r["id"].clone(), r["reward"].clone(), r["response"]["text"].clone())).collect();
        assert_eq!(got[0], (json!("step1/g0/s0"), json!(1.0), json!("3")));
        assert_eq!(got[1], (json!("step1/g1/s0"), json!(1.0), json!("3")));
        assert_eq!(got[2], (json!("step1/g0/s1"), json!(0.0), json!("4")));
        assert!((rows[1]["advantage"].as_f64().unwrap() - 0.6).abs() < 1e-6);
        assert_eq!((rows[1]["prompt"]["text"].clone(), rows[2]["weight_version"].clone()), (json!("2+2="), json!(1)));
        assert!(drawn(&spec, &t, 2, &groups, &batch).is_empty(), "step 2 writes none");
    }

    /// A Hugging Face prompt is shown as the model saw it: the chat template's special tokens
    /// stay in the prompt's text (a response's text skips them, as the reward read it).
    #[test]
    fn an_hf_prompt_keeps_its_chat_template_tokens() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/hf/qwen3");
        let h = crate::tokenize::HfTokenizer::load(&dir).unwrap();
        let t = Tokenizer::Hf(Box::new(h));
        let ids = match &t {
            Tokenizer::Hf(h) => h.encode("<|im_start|>user\n1+2=<|im_end|>\n<|im_start|>assistant\n", false).unwrap(),
            Tokenizer::Char(_) => unreachable!(),
        };
        let shown = rendered(&t, &ids);
        assert_eq!(shown.text, "<|im_start|>user\n1+2=<|im_end|>\n<|im_start|>assistant\n");
        assert!(!t.decode(&ids).contains("<|im_start|>"), "the reward's text has no template tokens");
    }

    /// Text over 16 KiB is cut at a character boundary and marked with its full sizes.
    #[test]
    fn long_text_is_cut_at_a_char_boundary_and_marked() {
        let text = "é".repeat(MAX_TEXT); // two bytes each
        let s = Shown::new(text.clone(), &vec![5; MAX_IDS + 3]);
        assert!(s.text.len() <= MAX_TEXT && s.text.len() > MAX_TEXT - 2, "{}", s.text.len());
        assert!(text.starts_with(&s.text));
        assert_eq!(s.ids.len(), MAX_IDS);
        assert_eq!(s.cut, Some(Cut { text_bytes: 2 * MAX_TEXT, ids: MAX_IDS + 3 }));
        assert_eq!(Shown::new("ok".into(), &[1]).cut, None);
    }

    /// A resumed run keeps the rows of steps up to its checkpoint (a torn last line from a kill
    /// goes), so the steps it repeats are not written twice; a fresh run starts the file empty.
    #[test]
    fn resume_cuts_samples_back_to_the_checkpoint() {
        let dir = std::env::temp_dir().join(format!("miles-samples-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("samples.jsonl");
        let row = |step: u64| SampleRow {
            step,
            id: format!("step{step}/p0/s0"),
            adapter: None,
            group: 0,
            index: 0,
            weight_version: step,
            prompt: Shown::new("1+2=".into(), &[1]),
            response: Some(Shown::new("3".into(), &[2])),
            finish: Some(FinishReason::Stop),
            reward: Some(1.0),
            advantage: Some(0.0),
            fault: None,
            episode: None,
        };
        let steps = |p: &Path| -> Vec<u64> {
            fs::read_to_string(p)
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str::<Value>(l).unwrap()["step"].as_u64().unwrap())
                .collect()
        };
        let mut log = SamplesLog::open(&path, None).unwrap();
        log.write(&[row(1), row(1), row(2), row(3)]).unwrap();
        drop(log);
        fs::OpenOptions::new().append(true).open(&path).unwrap().write_all(b"{\"step\": 4, \"id\": \"to").unwrap();
        let mut log = SamplesLog::open(&path, Some(2)).unwrap();
        assert_eq!(steps(&path), vec![1, 1, 2]);
        log.write(&[row(3)]).unwrap();
        assert_eq!(steps(&path), vec![1, 1, 2, 3], "step 3 once");
        drop(log);
        SamplesLog::open(&path, None).unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), "", "a fresh run starts empty");
        fs::remove_dir_all(&dir).unwrap();
    }

    /// Samples at step 1, every `every` steps and the last; `every = 0` or `count = 0`: none.
    #[test]
    fn samples_are_due_at_the_first_every_nth_and_last_step() {
        let s = crate::spec::SamplesSpec { every: 10, count: 4 };
        let due: Vec<u64> = (0..=25).filter(|&k| s.due(k, 25)).collect();
        assert_eq!(due, vec![1, 10, 20, 25]);
        assert!(!crate::spec::SamplesSpec { every: 0, count: 4 }.due(1, 25));
        assert!(!crate::spec::SamplesSpec { every: 10, count: 0 }.due(1, 25));
    }
}
