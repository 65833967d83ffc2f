//! Episodes that tell the truth (issue #41): a run whose environment faults says so on the
//! console (the faulted share, the reasons with the program's stderr, what the fault policy did),
//! its headline reward says what it is a mean over, the program's stderr is kept in the run
//! directory, and a run stopped because every episode faulted (E0509) wrote that step's row
//! first (the environment: tests/fixtures/envs/crashy_env.py); an OpenEnv server at its cap of
//! sessions is named with it (tests/fixtures/envs/openenv_guess.py, skipped without openenv-core);
//! a chat row's messages reach the episodes as `env_reward.prompt` says.

use crate::common;

use common::process::{run_miles as miles, temp_dir, text, Proc};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A guess recipe over `crashy_env.py MODE`, one environment call at a time.
fn recipe(dir: &Path, mode: &str, schedule: &str) -> std::path::PathBuf {
    let script = std::fs::canonicalize("tests/fixtures/envs/crashy_env.py").unwrap();
    let env = format!(r#"command_env {{ command = ["python3", "{}", "{mode}"] }}"#, script.display());
    let arith = "arith.multiplication { digits = 1, test_size = 20";
    recipe_over(dir, &Shape { env, concurrency: 1, max_prompt: 8, prompts: arith.into() }, schedule)
}

/// What a test's recipe plays: the environment (a recipe expression), its calls at once, the
/// longest first prompt (the reset observation), and the prompts (a `Prompts` expression without
/// its closing brace: the evaluation's adds `split = test`).
struct Shape {
    env: String,
    concurrency: usize,
    max_prompt: usize,
    prompts: String,
}

fn recipe_over(dir: &Path, shape: &Shape, schedule: &str) -> std::path::PathBuf {
    let Shape { env, concurrency, max_prompt, prompts } = shape;
    let path = dir.join("crashy.miles");
    std::fs::write(
        &path,
        format!(
            r#"
import std/tasks/arith
model policy = transformer {{ layers = 1, d_model = 32, heads = 2, vocab = 64, max_len = 48 }}
recipe crashy {{
    rollout = generate(policy) {{
        prompts = {prompts} }}
        samples_per_prompt = 4
        max_prompt_tokens = {max_prompt}.tokens
        max_new_tokens = 6.tokens
    }}
    reward = env_reward(rollout) {{
        env = {env}
        max_turns = 2
        concurrency = {concurrency}
        turn_timeout = 20.s
    }}
    train  = grpo(rollout, reward) {{ rollout_batch = 4, global_batch = 16, micro_batch = 16, lr = 1e-3 }}
    sync   = weights(train -> rollout) {{ transport = local }}
    eval   = evaluate(rollout) {{ prompts = {prompts}, split = test }}, every = 10.steps, limit = 4 }}
    schedule = {schedule}
    stop   = 2.steps
}}
"#
        ),
    )
    .unwrap();
    path
}

fn rows(out: &Path) -> Vec<serde_json::Value> {
    common::metrics::rows(out)
}

/// 12 of 16 episodes crash: each step's console says so once (then not again while the reasons
/// stay the same), quoting the program's stderr; the reward line says it is a mean over the 4
/// trained; the row counts them; the stderr is in OUT/env/reward.stderr.log (the stage's name).
#[test]
fn a_run_whose_episodes_mostly_crash_says_so() {
    let d = temp_dir("crashy-most");
    let r = recipe(&d, "most", "sync");
    let out = d.join("run");
    let o = miles(&["run", r.to_str().unwrap(), "--out", out.to_str().unwrap(), "--threads", "1"]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    let warning = "warning: step 1: 12 of 16 episodes faulted (env_crashed 12: \"exited";
    assert!(t.contains(warning), "{t}");
    assert!(t.contains("cannot reset step1/p0/e1: the fixture's simulated crash"), "stderr quoted: {t}");
    assert!(t.contains("dropped from training (on_env_error = drop)"), "{t}");
    assert_eq!(t.matches("episodes faulted").count(), 1, "step 2's same faults are not told again: {t}");
    assert!(t.contains("over 4 trained, 12 dropped"), "the headline reward names what it is a mean over: {t}");
    let last = rows(&out).into_iter().rev().find(|r| r.get("train/loss").is_some()).unwrap();
    assert_eq!(last["rollout/faulted"], 12, "{last}");
    assert_eq!(last["rollout/dropped"], 12, "{last}");
    assert_eq!(last["rollout/faulted_frac"], 0.75, "{last}");
    assert!(last["rollout/faults"].as_str().unwrap().starts_with("env_crashed 12: "), "{last}");
    let log = std::fs::read_to_string(out.join("env/reward.stderr.log")).unwrap();
    assert!(log.matches("the fixture's simulated crash").count() >= 24, "both steps' crashes: {log}");
    // `miles report` shows the faulted share and reasons per step.
    let o = miles(&["report", out.to_str().unwrap()]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert!(t.contains("| 1 | 12 of 16 (75.0%) | 12 | env_crashed 12: "), "{t}");
    assert!(out.join("report/rollout_faulted_frac.svg").exists(), "{t}");
    std::fs::remove_dir_all(&d).ok();
}

/// Every episode crashes: the run stops with E0509 whose help names step 1's row, and that row
/// was written with the fault counts; under the sync and the asynchronous executor alike.
#[test]
fn a_run_whose_every_episode_faults_writes_the_row_its_error_names() {
    for schedule in ["sync", "fully_async { max_staleness = 1 }"] {
        let d = temp_dir("crashy-all");
        let r = recipe(&d, "all", schedule);
        let out = d.join("run");
        let o = miles(&["run", r.to_str().unwrap(), "--out", out.to_str().unwrap(), "--threads", "1"]);
        let t = text(&o);
        assert_eq!(o.status.code(), Some(1), "{schedule}: {t}");
        assert!(t.contains("E0509") && t.contains("every episode ended by an environment fault"), "{t}");
        assert!(t.contains("the row of step 1 in"), "{schedule}: the help names the row: {t}");
        assert!(t.contains("warning: step 1: 16 of 16 episodes faulted (env_crashed 16"), "{schedule}: {t}");
        let rows = rows(&out);
        let row = rows.iter().find(|r| r["step"] == 1).unwrap_or_else(|| panic!("{schedule}: no row of step 1"));
        assert_eq!(row["rollout/faulted"], 16, "{schedule}: {row}");
        assert_eq!(row["rollout/episode_end/env_crashed"], 16.0, "{schedule}: {row}");
        std::fs::remove_dir_all(&d).ok();
    }
}

/// The Python with `openenv-core` (`$MILES_OPENENV_PYTHON`, else /opt/miles-openenv/bin/python,
/// which scripts/setup-test-deps.sh installs), if there is one.
fn openenv_python() -> Option<String> {
    let py = std::env::var("MILES_OPENENV_PYTHON").unwrap_or_else(|_| "/opt/miles-openenv/bin/python".into());
    let ok = Command::new(&py).args(["-c", "import openenv.core.env_server"]).stderr(Stdio::null()).status();
    ok.is_ok_and(|s| s.success()).then_some(py)
}

/// Whether the OpenEnv server on `port` answers its health check.
fn healthy(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else { return false };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let req = format!("GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n");
    let mut out = String::new();
    s.write_all(req.as_bytes()).is_ok() && s.read_to_string(&mut out).is_ok() && out.contains("healthy")
}

/// The newcomer's case (d) of issue #41: an OpenEnv server that accepts one session at once
/// (tests/fixtures/envs/openenv_guess.py, openenv-core's `max_concurrent_envs = 1`) refuses 15 of
/// a step's 16 episodes. The console says so, naming the server's cap, and the headline reward
/// says it is a mean over the one episode that trained; `miles report` shows the share.
#[test]
fn a_run_against_an_openenv_server_at_its_cap_names_the_cap() {
    let Some(py) = openenv_python() else {
        eprintln!("skipped: no Python with openenv-core (set MILES_OPENENV_PYTHON or run scripts/setup-test-deps.sh)");
        return;
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let script = std::fs::canonicalize("tests/fixtures/envs/openenv_guess.py").unwrap();
    // Its stderr is left out: uvicorn logs a traceback for each refused session it closes.
    let mut cmd = Command::new(py);
    cmd.arg(script).arg(port.to_string()).arg("1").stdout(Stdio::null()).stderr(Stdio::null());
    let _server = Proc::spawn(&mut cmd);
    // Importing openenv (FastAPI, gradio) takes tens of seconds on a loaded machine.
    let deadline = Instant::now() + Duration::from_secs(180);
    while !healthy(port) {
        assert!(Instant::now() < deadline, "the OpenEnv server did not come up within 180 s");
        std::thread::sleep(Duration::from_millis(250));
    }
    let d = temp_dir("openenv-cap");
    let env = format!(
        r#"openenv {{ url = "http://127.0.0.1:{port}", action_field = "message", observation_field = "text" }}"#
    );
    // The server's first observation is `guess a digit (step1/p0/e0)`, 28 tokens with BOS, and
    // a character tokenizer shows an observation's first turn only in the data's characters:
    // rows that spell them.
    let data = d.join("guess.jsonl");
    let rows_text: String = (0..24)
        .map(|i| format!("{{\"prompt\": \"guess a digit (step eval/p{i}/e)\", \"label\": \"{}\"}}\n", i % 10))
        .collect();
    std::fs::write(&data, rows_text).unwrap();
    let prompts = format!(r#"jsonl {{ path = "{}", test_size = 4"#, data.display());
    let r = recipe_over(&d, &Shape { env, concurrency: 4, max_prompt: 32, prompts }, "sync");
    let out = d.join("run");
    let o = miles(&["run", r.to_str().unwrap(), "--out", out.to_str().unwrap(), "--threads", "1", "--steps", "1"]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    let cap = format!(
        "warning: step 1: 15 of 16 episodes faulted (env_refused 15: \"the server at ws://127.0.0.1:{port}/ws \
         accepts 1 session(s) at once (its max_concurrent_envs; CAPACITY_REACHED)"
    );
    assert!(t.contains(&cap), "{t}");
    assert!(t.contains("dropped from training (on_env_error = drop)"), "{t}");
    assert!(t.contains("over 1 trained, 15 dropped"), "the headline reward names what it is a mean over: {t}");
    let row = rows(&out).into_iter().find(|r| r["step"] == 1 && r.get("train/loss").is_some()).unwrap();
    assert_eq!((row["rollout/faulted"].clone(), row["rollout/dropped"].clone()), (15.into(), 15.into()), "{row}");
    assert_eq!(row["rollout/episode_end/env_refused"], 15.0, "{row}");
    let o = miles(&["report", out.to_str().unwrap()]);
    let t = text(&o);
    assert!(t.contains("| 1 | 15 of 16 (93.8%) | 15 | env_refused 15: "), "{t}");
    std::fs::remove_dir_all(&d).ok();
}

/// The newcomer's case (e) of issue #41: a data row whose prompt is a chat (a system message and
/// a user message) reaches each episode's first prompt as `env_reward.prompt` says, as the model
/// saw it in samples.jsonl; and `max_prompt_tokens` bounds that prompt as sent (E0510). The
/// policy is the Hugging Face chat fixture (tests/fixtures/hf/qwen3-chat), the environment the
/// built-in calculator, which asks its own question of a chat row.
#[test]
fn a_chat_rows_system_message_reaches_the_episodes_as_the_recipe_says() {
    let d = temp_dir("chat-prompt");
    let data = d.join("chat.jsonl");
    // Rows differ (a split keeps prompts apart); each is a system message and a user message.
    let rows: String = (0..8)
        .map(|i| {
            let m = serde_json::json!([
                {"role": "system", "content": "You are a careful calculator user."},
                {"role": "user", "content": format!("Multiply, please (row {i}).")}
            ]);
            format!("{}\n", serde_json::json!({"messages": m, "answer": "0"}))
        })
        .collect();
    std::fs::write(&data, rows).unwrap();
    let recipe = d.join("chat.miles");
    let prompts = format!(r#"jsonl {{ path = "{}", prompt_field = "messages", label_field = "answer""#, data.display());
    std::fs::write(
        &recipe,
        format!(
            r#"
model policy = hf {{ path = "tests/fixtures/hf/qwen3-chat", max_len = 256 }}
recipe chat {{
    rollout = generate(policy) {{
        prompts = {prompts}, test_size = 2 }}
        samples_per_prompt = 2
        max_prompt_tokens = 200.tokens
        max_new_tokens = 8.tokens
        session = tito {{ rule = linear }}
    }}
    reward = env_reward(rollout) {{
        env = calculator {{}}
        max_turns = 2
        tool_format = hermes
    }}
    train = grpo(rollout, reward) {{ rollout_batch = 2, global_batch = 4, micro_batch = 4, lr = 1e-4 }}
    sync = weights(train -> rollout) {{ transport = local }}
    eval = evaluate(rollout) {{ prompts = {prompts}, split = test, test_size = 2 }}, every = 10.steps, limit = 2 }}
    stop = 1.steps
}}
"#
        ),
    )
    .unwrap();
    let (system, user) = ("You are a careful calculator user.", "Multiply, please (row ");
    // The first prompt of each sampled episode, as samples.jsonl shows what the model saw.
    let first_prompts = |mode: &str, max_prompt: usize| -> Result<Vec<String>, String> {
        let out = d.join(format!("run-{mode}-{max_prompt}"));
        let sets = [format!("reward.prompt={mode}"), format!("rollout.max_prompt_tokens={max_prompt}.tokens")];
        let o = miles(&[
            "run",
            recipe.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--threads",
            "1",
            "--set",
            &sets[0],
            "--set",
            &sets[1],
        ]);
        let t = text(&o);
        if o.status.code() != Some(0) {
            return Err(t);
        }
        let samples = std::fs::read_to_string(out.join("samples.jsonl")).map_err(|e| format!("{e}: {t}"))?;
        let shown: Vec<String> = samples
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|s| s.get("episode").is_some())
            .map(|s| s["prompt"]["text"].as_str().unwrap_or_default().to_string())
            .collect();
        if shown.is_empty() {
            return Err(format!("no episode in samples.jsonl: {samples}"));
        }
        Ok(shown)
    };
    // `append` (the default): the row's messages, then the calculator's question.
    for p in first_prompts("append", 200).unwrap() {
        let (s, u, q) = (p.find(system), p.find(user), p.find("=?"));
        assert!(s.is_some() && s < u && u < q, "system, user, then the question: {p}");
    }
    // `replace`: the question takes the user message's place; the system message stays.
    for p in first_prompts("replace", 200).unwrap() {
        assert!(p.contains(system) && !p.contains(user) && p.contains("=?"), "{p}");
    }
    // `observation_only`: the question alone.
    for p in first_prompts("observation_only", 200).unwrap() {
        assert!(!p.contains(system) && !p.contains(user) && p.contains("=?"), "{p}");
    }
    // The prompt as sent is what max_prompt_tokens bounds: the question alone in the template's
    // system turn with the tools is 130 tokens; the row's chat makes it longer.
    let e = first_prompts("append", 135).unwrap_err();
    assert!(e.contains("E0510") && e.contains("over the rollout's max_prompt_tokens 135"), "{e}");
    assert!(e.contains("(the row's chat, then the reset observation, as rendered; env_reward.prompt = append)"), "{e}");
    first_prompts("observation_only", 135).unwrap();
    std::fs::remove_dir_all(&d).ok();
}
