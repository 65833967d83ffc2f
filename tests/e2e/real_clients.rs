//! Real clients, not our own (issue #41's acceptance), against the session server of the built
//! binaries: the `openai` Python SDK (chat, a tool call round trip, streaming) against `miles
//! serve` and, as an `agent_program`, against `miles run`'s server; three TITO harnesses written
//! with it (re-sending, compacting, editing: the trained ids are the sampled ids, new chains and
//! what re-tokenising gets wrong counted exactly);
//! two verifiers environments (tests/fixtures/verifiers: single-turn, and multi-turn with an MCP
//! tool) through the `verifiers` env kind; and smolagents' ToolCallingAgent as an
//! `agent_program`. The clients live in the virtual environment scripts/setup-test-deps.sh makes
//! (`MILES_AGENTS_VENV`, default /opt/miles-agents); each test skips, saying why, without it.

use crate::common;

use common::process::{miles, output, temp_dir, text, Proc};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

/// A run here plays a few short episodes; a verifiers environment's first group also builds its
/// harness and tool server with uv.
const LIMIT: Duration = Duration::from_secs(540);

/// The agents' Python, or `None` (and a printed reason) when the venv is absent.
fn agents_python(test: &str) -> Option<PathBuf> {
    let venv = std::env::var_os("MILES_AGENTS_VENV").map_or_else(|| PathBuf::from("/opt/miles-agents"), PathBuf::from);
    let python = venv.join("bin/python");
    if python.is_file() {
        return Some(python);
    }
    eprintln!("{test}: skipped: no {} (scripts/setup-test-deps.sh installs the agent clients)", python.display());
    None
}

fn repo(path: &str) -> String {
    std::fs::canonicalize(path).unwrap().display().to_string()
}

/// A recipe over the chat fixture model (a byte-level BPE and a ChatML template with Hermes tool
/// calls), prompts from `data`, whose `env_reward` has environment `env`; `steps` steps.
fn recipe(dir: &Path, data: &Path, env: &str, steps: u32) -> PathBuf {
    let text = format!(
        r#"
model policy = hf {{ path = "{model}", max_len = 512 }}
recipe real {{
    rollout = generate(policy) {{
        prompts = jsonl {{ path = "{data}", test_size = 1 }}
        samples_per_prompt = 2
        max_prompt_tokens = 160.tokens
        max_new_tokens = 8.tokens
    }}
    reward = env_reward(rollout) {{
        env = {env}
        max_turns = 4
        concurrency = 4
        timeout = 4.min
        tool_format = hermes
    }}
    train = grpo(rollout, reward) {{ rollout_batch = 1, global_batch = 2, micro_batch = 2, lr = 1e-4 }}
    sync = weights(train -> rollout) {{ transport = local }}
    stop = {steps}.steps
}}
"#,
        model = repo("tests/fixtures/hf/qwen3-chat"),
        data = data.display(),
    );
    let path = dir.join("real.miles");
    std::fs::write(&path, text).unwrap();
    path
}

/// Prompt rows: `n` questions with a label, each row also naming a verifiers task by `idx`.
fn data(dir: &Path, n: usize) -> PathBuf {
    let rows: Vec<String> = (0..n)
        .map(|k| serde_json::json!({"prompt": format!("What is {k}+{}?", k + 2), "label": format!("{}", 2 * k + 2), "idx": k}).to_string())
        .collect();
    let path = dir.join("rows.jsonl");
    std::fs::write(&path, rows.join("\n") + "\n").unwrap();
    path
}

/// `miles run RECIPE` with `env` added to its environment; the last metrics row that trained.
fn run(recipe: &Path, out: &Path, env: &[(&str, String)]) -> serde_json::Value {
    let mut c = miles();
    c.args(["run", recipe.to_str().unwrap(), "--out", out.to_str().unwrap(), "--threads", "1", "--progress", "off"]);
    for (k, v) in env {
        c.env(k, v);
    }
    let o = output(&mut c, LIMIT);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let rows = common::metrics::rows(out);
    rows.iter().rev().find(|r| r.get("train/loss").is_some()).cloned().expect("a trained step")
}

fn count(row: &serde_json::Value, key: &str) -> f64 {
    row.get(key).and_then(serde_json::Value::as_f64).unwrap_or_else(|| panic!("{key} missing: {row}"))
}

fn program(python: &Path, script: &str, args: &[&str]) -> String {
    let mut argv = vec![python.display().to_string(), repo(&format!("tests/fixtures/real_clients/{script}"))];
    argv.extend(args.iter().map(|a| a.to_string()));
    let quoted: Vec<String> = argv.iter().map(|a| format!("{a:?}")).collect();
    format!("agent_program {{ command = [{}] }}", quoted.join(", "))
}

#[test]
fn the_openai_sdk_chats_calls_tools_and_streams_against_miles_serve_and_miles_run() {
    let Some(python) = agents_python("openai_sdk") else { return };
    // `miles serve` over the chat fixture model: plain inference, and the same under a session.
    let key = "real-clients-key";
    let mut c = miles();
    c.args(["serve", &repo("tests/fixtures/hf/qwen3-chat"), "--threads", "1"])
        .env("MILES_API_KEY", key)
        .stdin(Stdio::null())
        .stderr(Stdio::piped());
    let mut server = Proc::spawn(&mut c);
    let mut err = BufReader::new(server.child().stderr.take().unwrap());
    let mut seen = String::new();
    let base = loop {
        let mut line = String::new();
        assert!(err.read_line(&mut line).unwrap() > 0, "miles serve ended before serving: {seen}");
        seen.push_str(&line);
        if let Some(w) = line.split_whitespace().find(|w| w.starts_with("http://")) {
            break w.trim_end_matches(')').trim_end_matches(',').to_string();
        }
    };
    std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::sink()));
    let sdk = repo("tests/fixtures/real_clients/openai_sdk.py");
    for url in [format!("{base}/v1"), format!("{base}/sessions/sdk-1/v1")] {
        let o = output(std::process::Command::new(&python).args([sdk.as_str(), url.as_str(), key]), LIMIT);
        assert_eq!(o.status.code(), Some(0), "{url}: {}", text(&o));
        let checks: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(checks["model"], "qwen3-chat", "{checks}");
        assert!(checks["tools"].is_string() && checks["stream"].is_string(), "{checks}");
    }
    // A wrong key is refused before any model call: the SDK raises, the script exits non-zero.
    let o = output(std::process::Command::new(&python).args([sdk.as_str(), &format!("{base}/v1"), "wrong"]), LIMIT);
    assert!(!o.status.success() && text(&o).contains("401"), "{}", text(&o));
    drop(server);

    // The same checks as an agent program of a 1-step `miles run`: every episode ends `done`.
    let d = temp_dir("real-openai-run");
    let r = recipe(&d, &data(&d, 2), &program(&python, "openai_sdk.py", &[]), 1);
    let last = run(&r, &d.join("run"), &[]);
    assert_eq!(count(&last, "rollout/episode_end/done"), 2.0, "{last}");
    assert_eq!(count(&last, "tito/retokenize_mismatch"), 0.0, "{last}");
    std::fs::remove_dir_all(&d).ok();
}

/// A char-level policy over std/tasks/arith whose episodes `env` plays; one step. Its vocabulary
/// is the task tokenizer's, so every sampled id is a character or PAD, BOS or EOS (the last ends a
/// turn by its end-of-turn token; PAD and BOS, which decoding drops, are what a re-tokenising path
/// gets wrong). One held-out prompt keeps the evaluations short.
fn char_recipe(dir: &Path, env: &str) -> PathBuf {
    let text = format!(
        r#"
import std/tasks/arith
model policy = transformer {{ layers = 1, d_model = 32, heads = 2, vocab = arith.vocab, max_len = 64 }}
recipe real {{
    rollout = generate(policy) {{
        prompts = arith.addition {{ digits = 1, test_size = 1 }}
        samples_per_prompt = 2
        max_prompt_tokens = 8.tokens
        max_new_tokens = 16.tokens
    }}
    reward = env_reward(rollout) {{ env = {env}, max_turns = 4, concurrency = 4, timeout = 2.min }}
    train = grpo(rollout, reward) {{ rollout_batch = 2, global_batch = 4, micro_batch = 4, lr = 1e-3 }}
    sync = weights(train -> rollout) {{ transport = local }}
    stop = 1.steps
}}
"#
    );
    let path = dir.join("char.miles");
    std::fs::write(&path, text).unwrap();
    path
}

/// Three harnesses (tests/fixtures/real_clients/tito_harness.py), a run each, 4 episodes of 3
/// chat calls. Each harness derives from its own script and the server's answers how many new
/// chains its conversation must start (a turn cut by length is never extended; the compacted or
/// edited history matches no answered turn), how many tokens a re-tokenising path gets wrong
/// (its prompts against the same messages rendered fresh), and checks that the session's chains
/// hold its sampled ids bit for bit. The run must count exactly that: `rollout/compactions` is
/// the harnesses' new chains, `tito/retokenize_mismatch` their re-tokenising errors, both summed
/// over the episodes, and every episode's chains are its sampled ids.
#[test]
fn tito_harnesses_resend_compact_and_edit_without_mismatch() {
    let Some(python) = agents_python("tito_harnesses") else { return };
    let d = temp_dir("real-tito");
    // Every mode's counts first, so one failure shows the three.
    let mut seen = std::collections::BTreeMap::new();
    for mode in ["resend", "compact", "edit"] {
        let r = char_recipe(&d, &program(&python, "tito_harness.py", &[mode]));
        let last = run(&r, &d.join(format!("run-{mode}")), &[]);
        let keys = [
            "rollout/episode_end/done",
            "rollout/turns",
            "rollout/compactions",
            "agent/new_chains",
            "tito/retokenize_mismatch",
            "agent/retokenize",
            "agent/ids_kept",
        ];
        seen.insert(mode, keys.map(|k| count(&last, k)));
    }
    eprintln!("tito counts [done, turns, compactions, new_chains, mismatch, retokenize, ids_kept]: {seen:?}");
    let episodes = 4.0;
    for (mode, [done, turns, branches, new_chains, mismatch, retokenize, kept]) in &seen {
        assert_eq!(*done, episodes, "{mode}: every episode ended `done`: {seen:?}");
        assert_eq!(*turns, 3.0, "{mode}: three chat calls an episode: {seen:?}");
        // The harness metrics are means over the episodes; the run's counts are sums.
        assert_eq!(*branches, new_chains * episodes, "{mode}: the new chains the harnesses' script makes: {seen:?}");
        assert_eq!(*mismatch, retokenize * episodes, "{mode}: what re-tokenising gets wrong: {seen:?}");
        assert_eq!(
            *kept, 1.0,
            "{mode}: every chain holds exactly the sampled ids (the harness's stderr says why not): {seen:?}"
        );
    }
    // A compaction or an edit is a new chain in every episode; re-sending starts one only after a
    // turn cut by length, and extends the others (16 tokens of 16 ids: most turns end by EOS).
    for mode in ["compact", "edit"] {
        assert!(seen[mode][2] >= episodes, "{mode}: a new chain per compaction or edit: {seen:?}");
    }
    assert!(seen["resend"][2] < 2.0 * episodes, "resend: some turn extended the one before it: {seen:?}");
    std::fs::remove_dir_all(&d).ok();
}

/// A verifiers environment `module` from tests/fixtures/verifiers/`package` drives a 2-step run.
fn verifiers_run(python: &Path, package: &str, module: &str) -> serde_json::Value {
    let d = temp_dir(&format!("real-{module}"));
    let args = r#"{\"taskset\": {\"size\": 4}, \"agent\": {\"harness\": {\"id\": \"null\"}}}"#;
    let env = format!(
        r#"verifiers {{ module = "{module}", args = "{args}", python = "{}", pass_env = ["PYTHONPATH"] }}"#,
        python.display()
    );
    let r = recipe(&d, &data(&d, 3), &env, 2);
    let path = [repo(&format!("tests/fixtures/verifiers/{package}"))];
    let last = run(&r, &d.join("run"), &[("PYTHONPATH", path.join(":"))]);
    std::fs::remove_dir_all(&d).ok();
    last
}

#[test]
fn verifiers_envs_drive_miles_run() {
    let Some(python) = agents_python("verifiers") else { return };
    // Single turn: one chat call per session, each episode scored by the taskset's rubric, whose
    // two weighted rewards come back as `agent/reward/<name>` and add up to the episode's reward.
    let last = verifiers_run(&python, "miles-vf-echo", "miles_vf_echo");
    assert_eq!(count(&last, "rollout/episode_end/done"), 2.0, "{last}");
    assert_eq!(count(&last, "rollout/turns"), 1.0, "{last}");
    assert_eq!(count(&last, "tito/retokenize_mismatch"), 0.0, "{last}");
    let (exact, digits) = (count(&last, "agent/reward/exact"), count(&last, "agent/reward/digits"));
    assert!((0.0..=0.5).contains(&exact) && (0.0..=0.5).contains(&digits), "weight 0.5 each: {last}");
    assert!((count(&last, "rollout/episode_reward") - (exact + digits)).abs() < 1e-6, "{last}");
    // Multi-turn with a tool: the harness offers the `add` MCP tool (its server started from the
    // fixture's package); every episode scored, the taskset's `tool_turns` metric reported.
    let last = verifiers_run(&python, "miles-vf-calc", "miles_vf_calc");
    assert_eq!(count(&last, "rollout/episode_end/done"), 2.0, "{last}");
    assert!(count(&last, "rollout/turns") >= 1.0, "{last}");
    assert_eq!(count(&last, "tito/retokenize_mismatch"), 0.0, "{last}");
    // `count` fails where a column is missing: the taskset's own metric reached the run.
    assert!(count(&last, "agent/tool_turns") >= 0.0, "{last}");
    assert!((count(&last, "rollout/episode_reward") - count(&last, "agent/reward/correct")).abs() < 1e-6, "{last}");
}

#[test]
fn smolagents_plays_an_episode_through_agent_program() {
    let Some(python) = agents_python("smolagents") else { return };
    let d = temp_dir("real-smolagents");
    let r = recipe(&d, &data(&d, 2), &program(&python, "smol_agent.py", &[]), 1);
    let last = run(&r, &d.join("run"), &[]);
    assert_eq!(count(&last, "rollout/episode_end/done"), 2.0, "{last}");
    assert!(count(&last, "rollout/turns") >= 1.0, "the agent called the model: {last}");
    assert_eq!(count(&last, "tito/retokenize_mismatch"), 0.0, "{last}");
    std::fs::remove_dir_all(&d).ok();
}
