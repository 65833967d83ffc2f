//! A GRPO run that starts from a Hugging Face directory (the qwen3 fixture): its tokenizer and
//! chat template encode chat prompts from a JSONL file, a Python `command_reward` scores the
//! responses, and the final model is a Hugging Face directory that reloads with the logits the
//! trainer ended with.

use miles_runtime::reward::{OnRewardError, RewardSpec};
use miles_runtime::{HfModelSpec, ProgressMode, RunOptions, RunSpec};
use miles_tch::model::Policy;
use serde_json::Value;
use std::path::{Path, PathBuf};
use tch::Tensor;

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(rel)
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("miles-hf-run-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn opts(dir: &Path) -> RunOptions {
    let mut o = RunOptions::new(dir);
    o.progress = ProgressMode::Off;
    o.threads = Some(1);
    o
}

/// A run of `steps` steps on the qwen3 fixture with chat prompts "a+b=" and `reward`.
fn spec(dir: &Path, steps: u64, reward: Option<RewardSpec>) -> RunSpec {
    let mut lines = String::new();
    for a in 0..6 {
        for b in 0..6 {
            let msgs = serde_json::json!([{"role": "user", "content": format!("{a}+{b}=")}]);
            lines.push_str(&format!("{}\n", serde_json::json!({"messages": msgs, "answer": (a + b).to_string()})));
        }
    }
    let data = dir.join("add.jsonl");
    std::fs::write(&data, lines).unwrap();
    let model_dir = repo("tests/fixtures/hf/qwen3");
    let (policy, _) = Policy::load_hf(&model_dir, Some(64)).unwrap();
    let mut s = RunSpec::from_json(include_str!("../../../runtime/tests/data/tiny.json")).unwrap();
    s.steps = steps;
    s.model = policy.cfg.clone();
    s.hf = Some(HfModelSpec { path: model_dir });
    s.task.kind = miles_runtime::TaskKind::Data {
        path: data,
        prompt_field: "messages".into(),
        label_field: "answer".into(),
        test_path: None,
        on_error: miles_runtime::OnError::Stop,
    };
    s.task.split.test_size = 8;
    s.eval.prompts = 8;
    s.rollout.max_new_tokens = 4;
    s.reward = reward;
    s
}

fn metrics(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn command_reward(args: &[&str]) -> RewardSpec {
    let mut command = vec!["python3".to_string(), repo("tests/fixtures/rewards/verify.py").display().to_string()];
    command.extend(args.iter().map(|a| a.to_string()));
    RewardSpec::Command {
        name: "judge".into(),
        command,
        cwd: None,
        timeout_s: 30.0,
        on_error: OnRewardError::Stop,
        pass_env: vec![],
        group: false,
    }
}

#[test]
fn grpo_from_an_hf_directory_with_a_command_reward_exports_a_reloadable_model() {
    let d = tmp("ok");
    let s = spec(&d, 2, Some(command_reward(&[])));
    let out = d.join("out");
    let r = miles_tch::run(&s, &opts(&out)).unwrap();
    assert_eq!(r.steps_done, 2);
    let m = metrics(&out);
    let last = m.last().unwrap();
    // Every sample of the step went through the Python program: 4 prompts x 4 samples.
    assert_eq!(last["reward/scored"], serde_json::json!(16.0), "{last}");
    assert_eq!(last["reward/dropped"], serde_json::json!(0.0));

    // The export is a Hugging Face directory: the fixture's config.json and tokenizer files carried
    // through, weights that reload to the trainer's last weights (the final checkpoint's).
    let model = out.join("model");
    let config: Value = serde_json::from_str(&std::fs::read_to_string(model.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["architectures"][0], "Qwen3ForCausalLM");
    for f in ["tokenizer.json", "tokenizer_config.json", "generation_config.json"] {
        assert!(model.join(f).is_file(), "{f} not exported");
    }
    let (exported, _) = Policy::load_hf(&model, Some(64)).unwrap();
    let ckpt = out.join("checkpoints/step-00000002");
    let (trained, _) = Policy::load_hf(&ckpt, Some(64)).unwrap();
    let (start, _) = Policy::load_hf(&repo("tests/fixtures/hf/qwen3"), Some(64)).unwrap();
    let ids = Tensor::from_slice(&[3i64, 17, 42, 99, 7, 250]).unsqueeze(0);
    let pos = Tensor::arange(6, (tch::Kind::Int64, tch::Device::Cpu)).unsqueeze(0);
    let mask = Tensor::ones([1, 6], (tch::Kind::Bool, tch::Device::Cpu));
    let logits = |p: &Policy| tch::no_grad(|| p.forward(&ids, &pos, &mask, None));
    let (a, b, c) = (logits(&exported), logits(&trained), logits(&start));
    assert!(bool::try_from(a.eq_tensor(&b).all()).unwrap(), "export differs from the trained weights");
    assert!(!bool::try_from(a.eq_tensor(&c).all()).unwrap(), "training changed nothing");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_failing_reward_program_stops_the_run_naming_the_stage_and_sample() {
    let d = tmp("bad");
    let e = miles_tch::run(&spec(&d, 1, Some(command_reward(&["nan"]))), &opts(&d.join("out"))).unwrap_err();
    assert_eq!(e.code, "E0517", "{e}");
    // The step-0 evaluation scores with the same reward, so it is the first to fail.
    assert!(e.message.contains("reward `judge` failed on sample eval/p0"), "{e}");
    // Under `drop`, the same program's failures leave the batch and are counted, never silent.
    let mut dropping = command_reward(&["nan"]);
    if let RewardSpec::Command { on_error, .. } = &mut dropping {
        *on_error = OnRewardError::Zero;
    }
    let out = d.join("out-zero");
    miles_tch::run(&spec(&d, 1, Some(dropping)), &opts(&out)).unwrap();
    let last = metrics(&out).last().cloned().unwrap();
    assert_eq!(last["reward/zeroed"], serde_json::json!(16.0), "{last}");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_config_changed_after_check_is_refused() {
    let d = tmp("changed");
    let mut s = spec(&d, 1, None);
    s.model.n_layers += 1;
    let e = miles_tch::run(&s, &opts(&d.join("out"))).unwrap_err();
    assert_eq!(e.code, "E0506", "{e}");
    assert!(e.message.contains("n_layers differs"), "{e}");
    let _ = std::fs::remove_dir_all(&d);
}

/// A reward service on 127.0.0.1 (real sockets, HTTP/1.1): scores 1 when the response's last
/// character is a digit. Returns its URL and a count of the samples it scored.
fn reward_service() -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::sync::atomic::{AtomicUsize, Ordering};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/score", listener.local_addr().unwrap());
    let scored = std::sync::Arc::new(AtomicUsize::new(0));
    let counter = scored.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut r = BufReader::new(conn.try_clone().unwrap());
            let mut len = 0;
            loop {
                let mut line = String::new();
                if r.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    len = v.trim().parse().unwrap();
                }
            }
            let mut body = vec![0; len];
            r.read_exact(&mut body).unwrap();
            let req: Value = serde_json::from_slice(&body).unwrap();
            let samples = req["samples"].as_array().unwrap();
            counter.fetch_add(samples.len(), Ordering::SeqCst);
            let scores: Vec<f64> = samples
                .iter()
                .map(|s| s["response"].as_str().unwrap().ends_with(|c: char| c.is_ascii_digit()) as u8 as f64)
                .collect();
            let answer = serde_json::json!({"id": req["id"], "scores": scores}).to_string();
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
                answer.len()
            );
        }
    });
    (url, scored)
}

#[test]
fn http_reward_scores_a_run() {
    let d = tmp("http");
    let (url, scored) = reward_service();
    let reward = RewardSpec::Http {
        name: "rm".into(),
        url,
        concurrency: 2,
        batch_size: 5,
        timeout_s: 10.0,
        retries: 1,
        on_error: OnRewardError::Stop,
        group: false,
    };
    let out = d.join("out");
    miles_tch::run(&spec(&d, 2, Some(reward)), &opts(&out)).unwrap();
    let m = metrics(&out);
    assert_eq!(m.last().unwrap()["reward/scored"], serde_json::json!(16.0));
    // Two steps of 16 samples plus the evaluations at steps 0 and 2 (8 prompts each): every
    // sample, rollouts and evaluations, went to the service.
    assert_eq!(scored.load(std::sync::atomic::Ordering::SeqCst), 2 * 16 + 2 * 8);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_tokenizer_larger_than_the_embeddings_is_refused_before_training() {
    let d = tmp("vocab");
    let mut s = spec(&d, 1, None);
    s.model.vocab_size = 100;
    let e = miles_tch::run(&s, &opts(&d.join("out"))).unwrap_err();
    assert_eq!(e.code, "E0503", "{e}");
    assert!(e.message.contains("vocab_size 100 does not cover the task tokenizer's 500 tokens"), "{e}");
    let _ = std::fs::remove_dir_all(&d);
}
