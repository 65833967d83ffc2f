//! The rollout plug-in layers through the built binaries (docs/agents.md, "Your own agent: three
//! plug-in layers"): an `agent_program`, a `rollout_program` and `external_agents` each train a
//! tiny policy for two steps through the run's chat server (one server for the run: the same URL
//! on both steps), what they report beside the reward reaches the metrics row (`agent/<name>`)
//! and samples.jsonl (`metadata`), and a program's faults (exit 1, never finishing, no reward
//! line) end their episodes, counted, without ending the run.

use crate::common;

use common::process::{run_miles as miles, temp_dir, text};
use std::path::Path;

/// A two-step recipe whose `env_reward` has environment `env` (and `extra` stage fields).
fn recipe(dir: &Path, env: &str, extra: &str) -> String {
    let path = dir.join("agent.miles");
    std::fs::write(
        &path,
        format!(
            r#"
import std/tasks/arith
model policy = transformer {{ layers = 1, d_model = 32, heads = 2, vocab = 64, max_len = 48 }}
recipe agent {{
    rollout = generate(policy) {{
        prompts = arith.multiplication {{ digits = 1, test_size = 8 }}
        samples_per_prompt = 4
        max_prompt_tokens = 8.tokens
        max_new_tokens = 6.tokens
    }}
    reward = env_reward(rollout) {{
        env = {env}
        max_turns = 3
        concurrency = 8
        {extra}
    }}
    train  = grpo(rollout, reward) {{ rollout_batch = 2, global_batch = 8, micro_batch = 8, lr = 1e-3 }}
    sync   = weights(train -> rollout) {{ transport = local }}
    eval   = evaluate(rollout) {{ prompts = arith.multiplication {{ digits = 1, split = test, test_size = 8 }}, every = 1.steps, limit = 4 }}
    stop   = 2.steps
}}
"#
        ),
    )
    .unwrap();
    path.display().to_string()
}

fn fixture(name: &str) -> String {
    std::fs::canonicalize(format!("tests/fixtures/agents/{name}")).unwrap().display().to_string()
}

/// The last metrics row that trained.
fn last_trained(out: &Path) -> serde_json::Value {
    let rows = common::metrics::rows(out);
    rows.iter().rev().find(|r| r.get("train/loss").is_some()).cloned().expect("a trained step")
}

fn count(row: &serde_json::Value, key: &str) -> f64 {
    row.get(key).and_then(serde_json::Value::as_f64).unwrap_or(0.0)
}

/// samples.jsonl's episode rows.
fn samples(out: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(out.join("samples.jsonl")).unwrap();
    text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// The `server` each shown episode's program reported, with the steps they span: one server for
/// the run, seen on step 1 and step 2.
fn one_server(rows: &[serde_json::Value]) -> String {
    let mut servers: Vec<String> = Vec::new();
    let mut steps: Vec<u64> = Vec::new();
    for r in rows {
        let server = r["episode"]["metadata"]["server"].as_str().unwrap_or_else(|| panic!("no metadata: {r}"));
        servers.push(server.to_string());
        steps.push(r["step"].as_u64().unwrap());
    }
    servers.dedup();
    steps.dedup();
    assert_eq!(steps, vec![1, 2], "{rows:?}");
    assert_eq!(servers.len(), 1, "one server for the run: {servers:?}");
    assert!(servers[0].starts_with("http://127.0.0.1:"), "{servers:?}");
    servers.remove(0)
}

#[test]
fn an_agent_program_plays_episodes_through_the_chat_api() {
    let d = temp_dir("agent-program");
    let r = recipe(&d, &format!(r#"agent_program {{ command = ["python3", "{}"] }}"#, fixture("calc_agent.py")), "");
    let o = miles(&["check", &r]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let out = d.join("run");
    let o = miles(&["run", &r, "--out", out.to_str().unwrap(), "--threads", "1"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let last = last_trained(&out);
    // 2 questions x 4 episodes, each ended `done` (its program printed a reward), none faulted.
    assert_eq!(count(&last, "rollout/episode_end/done"), 8.0, "{last}");
    assert!(count(&last, "rollout/turns") >= 1.0, "every program made a chat call: {last}");
    assert_eq!(count(&last, "tito/retokenize_mismatch"), 0.0, "{last}");
    // The programs' `metrics` are averaged into the row, their `metadata` kept with the episode.
    assert!(count(&last, "agent/turns") >= 1.0, "{last}");
    let rows = samples(&out);
    one_server(&rows);
    assert!(rows.iter().all(|r| r["episode"]["metrics"]["turns"].as_f64() >= Some(1.0)), "{rows:?}");
    assert!(rows.iter().all(|r| r["episode"]["metadata"]["answer"].is_string()), "{rows:?}");
    assert!(
        last.get("eval/accuracy").is_some()
            || common::metrics::rows(&out).iter().any(|r| r.get("eval/accuracy").is_some())
    );
    std::fs::remove_dir_all(&d).ok();
}

#[test]
fn a_rollout_program_plays_a_group_per_run() {
    let d = temp_dir("rollout-program");
    let r =
        recipe(&d, &format!(r#"rollout_program {{ command = ["python3", "{}"] }}"#, fixture("group_rollout.py")), "");
    let out = d.join("run");
    let o = miles(&["run", &r, "--out", out.to_str().unwrap(), "--threads", "1"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let last = last_trained(&out);
    assert_eq!(count(&last, "rollout/episode_end/done"), 8.0, "one reward per session: {last}");
    assert_eq!(count(&last, "rollout/turns"), 1.0, "one chat call per session: {last}");
    assert!(last.get("agent/chars").is_some(), "{last}");
    let rows = samples(&out);
    one_server(&rows);
    assert!(rows.iter().all(|r| r["episode"]["metadata"]["session"].is_string()), "{rows:?}");
    std::fs::remove_dir_all(&d).ok();
}

/// Episode e0 of each group exits 1, e1 never finishes, e2 prints no reward, e3 answers: the run
/// goes on, each fault counted under its reason, the failing program's stderr quoted.
#[test]
fn program_faults_are_counted_and_the_run_continues() {
    let d = temp_dir("agent-faults");
    let env = format!(r#"agent_program {{ command = ["python3", "{}", "mixed"] }}"#, fixture("faulty_agent.py"));
    let r = recipe(&d, &env, "timeout = 10.s\n        turn_timeout = 10.s");
    let out = d.join("run");
    let o = miles(&["run", &r, "--out", out.to_str().unwrap(), "--threads", "1"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let last = last_trained(&out);
    for (reason, n) in [("program_failed", 2.0), ("program_timeout", 2.0), ("no_reward", 2.0), ("done", 2.0)] {
        assert_eq!(count(&last, &format!("rollout/episode_end/{reason}")), n, "{reason}: {last}");
    }
    // A failing program is named by its command and quoted by its stderr's last words.
    let failed: Vec<String> = samples(&out)
        .iter()
        .filter_map(|r| r["fault"].as_str().map(str::to_string))
        .filter(|f| f.contains("status 1"))
        .collect();
    assert!(!failed.is_empty(), "a shown fault of exit 1");
    for f in failed {
        assert!(f.starts_with("`python3 ") && f.contains("agent: cannot parse the task"), "{f}");
    }
    std::fs::remove_dir_all(&d).ok();
}

/// The test plays the outside process: it reads OUT/session-server.json, opens sessions, chats
/// and finishes them; the run trains on what it finished. One server (one URL) serves both
/// steps, a request without the run's key (or with a wrong one) is refused with 401, and the
/// finish's metrics and metadata are recorded.
#[test]
fn external_agents_train_on_sessions_an_outside_process_finishes() {
    let d = temp_dir("external-agents");
    let r = recipe(&d, "external_agents {}", "timeout = 2.min");
    let out = d.join("run");
    std::fs::create_dir_all(&out).unwrap();
    let player = std::process::Command::new("python3")
        .args([fixture("external_player.py"), out.display().to_string()])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let o = miles(&["run", &r, "--out", out.to_str().unwrap(), "--threads", "1"]);
    std::fs::write(out.join("done"), "").unwrap();
    let played = player.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let last = last_trained(&out);
    assert_eq!(count(&last, "rollout/episode_end/done"), 8.0, "{last}");
    let key = out.join("session-server.key");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&key).unwrap().permissions().mode() & 0o777, 0o600);
    }
    let said = String::from_utf8_lossy(&played.stdout);
    let said: serde_json::Value = serde_json::from_str(said.trim()).unwrap_or_else(|e| panic!("{e}: {said}"));
    assert!(said["finished"].as_u64() >= Some(16), "two steps of 8 (and evaluations): {said}");
    assert_eq!(said["unauthorized"], serde_json::json!([401, 401]), "{said}");
    assert_eq!(said["urls"].as_array().map(Vec::len), Some(1), "one server for the run: {said}");
    assert!(last.get("agent/len").is_some(), "{last}");
    let rows = samples(&out);
    assert_eq!(one_server(&rows), said["urls"][0].as_str().unwrap());
    assert!(rows.iter().all(|r| r["episode"]["metrics"]["len"].is_number()), "{rows:?}");
    std::fs::remove_dir_all(&d).ok();
}
