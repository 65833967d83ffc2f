//! The path a user's own data, model tokenizer and reward take through the runtime's parts, as the
//! executors will chain them: prompt file -> tokenizer (chat template) -> response text ->
//! reward input -> a Python reward program and a verifier, through `BatchReward`.

use miles_runtime::reward::{OnRewardError, RewardOutcome, RewardSpec};
use miles_runtime::spec::OnError;
use miles_runtime::tasks::prompts::{self, DataSettings, Prompt};
use miles_runtime::tokenize::{HfTokenizer, Tokenizer};
use miles_runtime::FinishReason;
use std::path::PathBuf;

fn repo(path: &str) -> PathBuf {
    PathBuf::from(format!("{}/../../{path}", env!("CARGO_MANIFEST_DIR")))
}

#[test]
fn chat_prompts_from_a_file_are_tokenized_and_scored_by_a_python_program() {
    let dir = std::env::temp_dir().join(format!("miles-byo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let data = dir.join("train.jsonl");
    std::fs::write(
        &data,
        r#"{"messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"}], "answer": "4", "source": "toy"}
{"messages": "What is 3+3?", "answer": 6}
"#,
    )
    .unwrap();
    let settings = DataSettings {
        path: data,
        prompt_field: "messages".into(),
        label_field: "answer".into(),
        on_error: OnError::Stop,
    };
    let rows = prompts::read(&settings, &mut Vec::new()).unwrap();
    assert!(matches!(rows[0].prompt, Prompt::Chat(_)));

    let hf = HfTokenizer::load(&repo("tests/fixtures/hf/qwen3")).unwrap();
    let tokenizer = Tokenizer::Hf(Box::new(hf));
    let ids = tokenizer.encode_prompt(&rows[0].prompt).unwrap();
    // The fixture's apply_chat_template(..., add_generation_prompt=True) for these messages.
    let reference: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(repo("tests/fixtures/hf/qwen3/reference/chat.json")).unwrap())
            .unwrap();
    let want = reference
        .iter()
        .find(|c| c["name"] == "system_user" && c["add_generation_prompt"] == true)
        .map(|c| serde_json::from_value::<Vec<u32>>(c["ids"].clone()).unwrap())
        .unwrap();
    assert_eq!(ids, want);

    // A policy's responses, ending at the end-of-turn token.
    let mut stop = tokenizer.encode_answer("The answer is \\boxed{4}").unwrap();
    stop.extend([1, 2, 3]);
    let responses = [tokenizer.decode(&stop), "#### 7".to_string()];
    assert_eq!(responses[0], "The answer is \\boxed{4}");
    let inputs: Vec<_> = rows
        .iter()
        .zip(&responses)
        .enumerate()
        .map(|(i, (row, r))| row.reward_input(format!("step0/p{i}/s0"), r.clone(), FinishReason::Stop))
        .collect();
    assert_eq!(inputs[0].metadata, serde_json::json!({"source": "toy"}));

    let specs = [
        RewardSpec::Command {
            name: "judge".into(),
            command: vec!["python3".into(), repo("tests/fixtures/rewards/verify.py").display().to_string()],
            cwd: None,
            timeout_s: 30.0,
            on_error: OnRewardError::Stop,
            pass_env: vec![],
            group: false,
        },
        RewardSpec::Verifier {
            name: "math".into(),
            kind: "math".into(),
            pattern: None,
            schema: None,
            on_error: OnRewardError::Stop,
        },
    ];
    for spec in specs {
        let mut reward = spec.build().unwrap();
        let out = reward.score_batch(&inputs).unwrap();
        assert_eq!(out, vec![RewardOutcome::Score(1.0), RewardOutcome::Score(0.0)], "{}", spec.name());
    }
}
