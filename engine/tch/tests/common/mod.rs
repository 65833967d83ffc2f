//! What the tch tests share: the tiny model they all train and sample, a small mixture of experts,
//! and (`hf`) the Hugging Face fixtures.

pub mod hf;

use miles_runtime::{DecoderSizes, ModelConfig, MoeConfig, Sample, Trajectory};

/// A 2-layer, 32-wide decoder over 12 tokens (GQA 4:2), every later field at today's defaults;
/// `init_std` sets how peaked its first distributions are.
#[allow(dead_code)]
pub fn tiny_config(init_std: f64) -> ModelConfig {
    let sizes =
        DecoderSizes { vocab_size: 12, d_model: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, d_ff: 48, max_len: 24 };
    ModelConfig { init_std, ..ModelConfig::decoder(sizes) }
}

/// A trajectory to train on: every response token trained (mask 1), sampled at log-prob -2.
// A test binary that includes this module may use only part of it.
#[allow(dead_code)]
pub fn trajectory(prompt: Vec<u32>, response: Vec<u32>, reward: f32, advantage: f32) -> Trajectory {
    Trajectory {
        rollout_logprobs: vec![-2.0; response.len()],
        loss_mask: vec![1.0; response.len()],
        prompt,
        response,
        reward,
        advantage,
        group: 0,
        weight_version: 0,
        routing: None,
        teacher_logprobs: Vec::new(),
    }
}

/// 4 experts of width 16 in every layer, top-2 softmax routing renormalised, no shared expert,
/// load-balancing coefficient 0.01: what a test changes of it, it sets.
pub fn small_moe() -> MoeConfig {
    MoeConfig { aux_loss_coef: 0.01, ..MoeConfig::routed(4, 2, 16) }
}

/// The sampler's `samples` of `prompts` as trajectories (every token trained, reward 1, the
/// sampler's log-probs and routing), the i-th with advantage `advantage(i)`.
pub fn sampled_trajectories(
    prompts: &[Vec<u32>],
    samples: Vec<Sample>,
    advantage: impl Fn(usize) -> f32,
) -> Vec<Trajectory> {
    samples
        .into_iter()
        .enumerate()
        .map(|(i, s)| Trajectory {
            prompt: prompts[s.prompt_index].clone(),
            loss_mask: vec![1.0; s.response.len()],
            rollout_logprobs: s.logprobs,
            response: s.response,
            reward: 1.0,
            advantage: advantage(i),
            group: s.prompt_index,
            weight_version: 0,
            routing: s.routing,
            teacher_logprobs: Vec::new(),
        })
        .collect()
}

/// A fresh directory for a run under the system temp dir, named by the test process and `tag`.
#[allow(dead_code)]
pub fn run_dir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("miles-tch-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// Run options for a test: no progress output, one libtorch thread (tests run in parallel
/// threads of one process; more intra-op threads oversubscribe a small machine).
#[allow(dead_code)]
pub fn quiet(dir: &std::path::Path) -> miles_runtime::RunOptions {
    let mut o = miles_runtime::RunOptions::new(dir);
    o.progress = miles_runtime::ProgressMode::Off;
    o.threads = Some(1);
    o
}

/// metrics.jsonl without timing fields (`perf/*`), which legitimately differ between runs.
#[allow(dead_code)]
pub fn untimed_metrics(dir: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            v.as_object_mut().unwrap().retain(|k, _| !k.starts_with("perf/"));
            v
        })
        .collect()
}

/// A tensor's values, flattened.
pub fn vals(x: &tch::Tensor) -> Vec<f32> {
    Vec::<f32>::try_from(x.reshape([-1])).unwrap()
}

/// `a` equals `b` element by element within `tol`.
pub fn close(a: &[f32], b: &[f32], tol: f32) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() <= tol, "{a:?} vs {b:?}");
    }
}
