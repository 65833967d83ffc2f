//! recipes/agent-hf-laptop.miles end to end through the built binary: calculator episodes played
//! by a Hugging Face chat model (tests/fixtures/hf/qwen3-chat) in its template's Hermes tool
//! format, after an SFT warm-up on demonstrations in that format.

use crate::common;

use common::process::{run_miles as miles, temp_dir, text};

#[test]
fn the_hf_agent_recipe_checks_plans_and_runs() {
    let recipe = "recipes/agent-hf-laptop.miles";
    let o = miles(&["check", recipe]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = miles(&["plan", recipe]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert!(t.contains("Episodes (calculator environment)") && t.contains("qwen3"), "{t}");
    let d = temp_dir("agent-hf");
    let out = d.join("run");
    let args = ["--threads", "1", "--set", "warmup.steps=20.steps", "--set", "stop=2.steps"];
    let o = miles(&[&["run", recipe, "--out", out.to_str().unwrap()][..], &args[..]].concat());
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let spec: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("spec.json")).unwrap()).unwrap();
    assert_eq!(spec["hf"]["path"], "tests/fixtures/hf/qwen3-chat");
    assert_eq!(spec["env"]["tool_format"], "hermes", "{}", spec["env"]);
    let rows = common::metrics::rows(&out);
    assert!(rows.iter().any(|r| r.get("sft/loss").is_some()), "the warm-up trained on demonstrations");
    let last = rows.iter().rev().find(|r| r.get("train/loss").is_some()).expect("a training step");
    for k in ["rollout/tool_use_rate", "rollout/turns", "tito/retokenize_mismatch", "rollout/observation_tokens"] {
        assert!(last.get(k).is_some(), "{k} missing: {last}");
    }
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("model/config.json")).unwrap()).unwrap();
    assert_eq!(config["architectures"][0], "Qwen3ForCausalLM");
    assert!(out.join("model/tokenizer_config.json").is_file(), "the chat template travels with the model");
    std::fs::remove_dir_all(&d).ok();
}
