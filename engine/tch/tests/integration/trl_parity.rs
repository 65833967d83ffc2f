//! miles' GRPO losses against TRL's (1.16.0) on the same samples: tests/fixtures/trl-parity/
//! (made by scripts/make-trl-parity-fixture.py with TRL's own GRPOTrainer) holds 16 samples for the
//! qwen3 fixture model and, per TRL loss variant, TRL's advantages, per-token log-probs, and the
//! loss and grad norm of each optimizer step. Here the same model is loaded with miles-tch, the
//! TrainSpec is mapped from TRL's settings and the real trainer (`Trainer::train_rl`) runs on the
//! same samples. Agreement is |miles - TRL| <= 1e-5; where the formulas differ on purpose the
//! difference must equal the formula's prediction to 1e-6 (bench/peers/trl-parity.md).

use miles_runtime::{grpo_advantages, TrainSpec, TrainStats, Trainer, Trajectory};
use miles_tch::model::Policy;
use miles_tch::train::TchTrainer;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// Loss and advantage agreement.
const TOL: f64 = 1e-5;
/// A predicted difference must be met this closely.
const PRED_TOL: f64 = 1e-6;
/// The grad norm is a sum of ~10^5 squares accumulated in another order: relative agreement.
const NORM_RTOL: f64 = 1e-4;
/// TRL divides centred rewards by std + 1e-4 (`_generate_and_score_completions`), miles by std + 1e-6.
const TRL_STD_EPS: f64 = 1e-4;
const MILES_STD_EPS: f64 = 1e-6;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn fixture() -> Value {
    let path = root().join("tests/fixtures/trl-parity/fixture.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn f64s(v: &Value) -> Vec<f64> {
    v.as_array().expect("array").iter().map(|x| x.as_f64().expect("number")).collect()
}

fn rows(v: &Value) -> Vec<Vec<f64>> {
    v.as_array().expect("array of rows").iter().map(f64s).collect()
}

struct Sample {
    group: usize,
    prompt: Vec<u32>,
    completion: Vec<u32>,
    reward: f32,
}

fn samples(fx: &Value) -> Vec<Sample> {
    let ids = |v: &Value| -> Vec<u32> { v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect() };
    fx["samples"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| Sample {
            group: s["group"].as_u64().unwrap() as usize,
            prompt: ids(&s["prompt"]),
            completion: ids(&s["completion"]),
            reward: s["reward"].as_f64().unwrap() as f32,
        })
        .collect()
}

/// The TrainSpec that runs what TRL's settings describe: loss_type grpo -> sequence aggregation,
/// dapo -> token, bnpo -> micro_token (per micro-batch of `per_device_train_batch_size`),
/// dr_grpo -> constant(max_completion_length); scale_rewards "none" -> std_norm off;
/// importance_sampling_level -> ratio; num_iterations -> epochs; beta -> kl_coef.
fn spec_for(fx: &Value, trl: &Value) -> TrainSpec {
    let s = &fx["settings"];
    let eps = trl["epsilon"].as_f64().unwrap();
    let micro = trl["per_device_train_batch_size"].as_u64().unwrap();
    let aggregation = match trl["loss_type"].as_str().unwrap() {
        "grpo" => json!("sequence"),
        "dapo" => json!("token"),
        "bnpo" => json!("micro_token"),
        "dr_grpo" => json!({"constant": {"tokens": s["max_completion_length"]}}),
        other => panic!("fixture has a loss_type this test does not map: {other}"),
    };
    let spec = json!({
        "lr": trl["learning_rate"],
        "weight_decay": s["weight_decay"],
        "beta1": s["adam_beta1"],
        "beta2": s["adam_beta2"],
        "eps": s["adam_epsilon"],
        "clip_low": eps,
        "clip_high": trl["epsilon_high"].as_f64().unwrap_or(eps),
        "kl_coef": trl["beta"],
        "std_norm": trl["scale_rewards"].as_str() != Some("none"),
        "aggregation": aggregation,
        "epochs": trl["num_iterations"],
        "ratio": trl["importance_sampling_level"],
        "grad_clip": s["max_grad_norm"],
        "micro_batch": micro,
        "global_batch": micro * trl["gradient_accumulation_steps"].as_u64().unwrap(),
    });
    serde_json::from_value(spec).unwrap_or_else(|e| panic!("TrainSpec from TRL's settings: {e}"))
}

/// The fixture's samples as the trainer takes them, with TRL's advantages (so the loss check is of
/// the loss alone; the advantages are checked on their own) and TRL's log-probs as the sampler's.
fn trajectories(samples: &[Sample], adv: &[f64], logps: &[Vec<f64>]) -> Vec<Trajectory> {
    samples
        .iter()
        .zip(adv)
        .zip(logps)
        .map(|((s, a), lp)| Trajectory {
            prompt: s.prompt.clone(),
            response: s.completion.clone(),
            rollout_logprobs: lp.iter().map(|&x| x as f32).collect(),
            loss_mask: vec![1.0; s.completion.len()],
            reward: s.reward,
            advantage: *a as f32,
            group: s.group,
            weight_version: 0,
            routing: None,
            teacher_logprobs: Vec::new(),
        })
        .collect()
}

fn trainer(spec: TrainSpec) -> TchTrainer {
    let (policy, _) = Policy::load_hf(&root().join("tests/fixtures/hf/qwen3"), None).unwrap();
    let mut tr = TchTrainer::new(policy, spec.clone());
    if spec.kl_coef > 0.0 {
        // TRL's reference is the initial model.
        Trainer::freeze_reference(&mut tr).unwrap();
    }
    tr
}

/// One train_rl call over the fixture's batch: `epochs` passes of batch / global_batch steps.
fn run_miles(fx: &Value, trl: &Value, v: &Value, epochs: usize) -> TrainStats {
    let mut spec = spec_for(fx, trl);
    spec.epochs = epochs;
    let s = samples(fx);
    let batch = trajectories(&s, &f64s(&v["advantages"]), &rows(&v["logps"]));
    let per_pass = s.len().div_ceil(spec.global_batch);
    let lrs = vec![spec.lr; per_pass * epochs];
    let mut tr = trainer(spec);
    tch::set_num_threads(1);
    tr.train_rl(&batch, &lrs, fx["settings"]["temperature"].as_f64().unwrap()).unwrap()
}

fn mean(x: &[f64]) -> f64 {
    x.iter().sum::<f64>() / x.len() as f64
}

/// Per optimizer step, a factor derived from the fixture.
type StepScales = dyn Fn(&Value) -> Vec<f64>;

/// Checks one variant; `scales` gives, per optimizer step, the factor miles' loss and gradient
/// must differ from TRL's by where the formulas differ on purpose (None: they agree).
fn check_variant(name: &str, scales: Option<&StepScales>) {
    let fx = fixture();
    let v = &fx["variants"][name];
    assert!(v.is_object(), "fixture has no variant {name}");
    let trl = &v["trl"];
    let steps = v["steps"].as_array().unwrap();
    let trl_loss: Vec<f64> = steps.iter().map(|s| s["loss"].as_f64().unwrap()).collect();
    let trl_norm: Vec<f64> = steps.iter().map(|s| s["grad_norm"].as_f64().unwrap()).collect();
    let iterations = trl["num_iterations"].as_u64().unwrap() as usize;
    let st = run_miles(&fx, trl, v, iterations);
    let c = scales.map_or_else(|| vec![1.0; trl_loss.len()], |f| f(&fx));
    let want_loss: Vec<f64> = trl_loss.iter().zip(&c).map(|(l, c)| l * c).collect();
    let want_norm: Vec<f64> = trl_norm.iter().zip(&c).map(|(n, c)| n * c).collect();
    // TrainStats.loss and grad_norm are the means over the call's optimizer steps.
    assert_eq!(st.optimizer_steps as usize, trl_loss.len(), "{name}: optimizer steps");
    let (miles, want, raw) = (st.loss, mean(&want_loss), mean(&trl_loss));
    eprintln!(
        "trl-parity {name}: TRL loss {raw:.9} miles {miles:.9} |diff| {:.2e} (vs prediction {:.2e}); \
         grad norm TRL {:.6} (predicted for miles {:.6}) miles {:.6}",
        (miles - raw).abs(),
        (miles - want).abs(),
        mean(&trl_norm),
        mean(&want_norm),
        st.grad_norm
    );
    let predicted = scales.is_some();
    let tol = if predicted { PRED_TOL } else { TOL };
    assert!(
        (miles - want).abs() <= tol,
        "{name}: miles loss {miles} vs {} {want} (TRL {raw}); trl_parity::logprobs_match_trl locates a forward mismatch",
        if predicted { "predicted" } else { "TRL" }
    );
    let (a, b) = (st.grad_norm, mean(&want_norm));
    assert!((a - b).abs() <= NORM_RTOL * b.max(1e-3), "{name}: grad norm miles {a} vs TRL {b}");
    if iterations > 1 {
        // The first step alone (one pass), so the second pass's loss is located too.
        let first = run_miles(&fx, trl, v, 1);
        let second = 2.0 * miles - first.loss;
        eprintln!(
            "trl-parity {name}: step 1 TRL {:.9} miles {:.9}; step 2 TRL {:.9} miles {second:.9}",
            trl_loss[0], first.loss, trl_loss[1]
        );
        assert!((first.loss - trl_loss[0]).abs() <= TOL, "{name}: first step {} vs TRL {}", first.loss, trl_loss[0]);
        assert!((second - trl_loss[1]).abs() <= TOL, "{name}: second pass {second} vs TRL {}", trl_loss[1]);
        assert!((first.grad_norm - trl_norm[0]).abs() <= NORM_RTOL * trl_norm[0], "{name}: first grad norm");
    }
}

#[test]
fn logprobs_match_trl() {
    tch::set_num_threads(1);
    let fx = fixture();
    let s = samples(&fx);
    let mut tr = trainer(spec_for(&fx, &fx["variants"]["grpo"]["trl"]));
    let prompts: Vec<Vec<u32>> = s.iter().map(|x| x.prompt.clone()).collect();
    let responses: Vec<Vec<u32>> = s.iter().map(|x| x.completion.clone()).collect();
    let ours = tr.logprobs(&prompts, &responses, 1.0).unwrap();
    let mut worst = 0f64;
    for (name, v) in fx["variants"].as_object().unwrap() {
        // TRL's log-probs of the fixture's completions, and its old/reference passes (the same
        // initial weights) where it made them.
        for key in ["logps", "old_logps", "ref_logps"] {
            if v[key].is_null() {
                continue;
            }
            for (i, (a, b)) in ours.iter().zip(rows(&v[key])).enumerate() {
                assert_eq!(a.len(), b.len(), "{name} {key} row {i}");
                for (t, (x, y)) in a.iter().zip(&b).enumerate() {
                    let d = (*x as f64 - y).abs();
                    worst = worst.max(d);
                    assert!(d <= TOL, "{name} {key}: sample {i} token {t}: miles {x} vs TRL {y}");
                }
            }
        }
    }
    eprintln!("trl-parity: max |log-prob miles - TRL| = {worst:.2e}");
}

/// miles' group advantages against TRL's: equal without std normalisation; with it, they differ
/// by exactly the epsilons' effect, centred x (1/(std + 1e-6) - 1/(std + 1e-4)).
#[test]
fn advantages_match_trl_up_to_the_std_epsilon() {
    let fx = fixture();
    let s = samples(&fx);
    let rewards: Vec<f32> = s.iter().map(|x| x.reward).collect();
    let groups: Vec<usize> = s.iter().map(|x| x.group).collect();
    let g = fx["settings"]["num_generations"].as_u64().unwrap() as usize;
    for (name, v) in fx["variants"].as_object().unwrap() {
        let std_norm = v["trl"]["scale_rewards"].as_str() != Some("none");
        assert!(matches!(v["trl"]["scale_rewards"].as_str(), Some("group" | "none")), "{name}: scale_rewards");
        let trl = f64s(&v["advantages"]);
        let ours = grpo_advantages(&rewards, &groups, std_norm);
        let mut max_diff = 0f64;
        for (i, (a, b)) in ours.iter().zip(&trl).enumerate() {
            let grp: Vec<f64> = rewards[i / g * g..(i / g + 1) * g].iter().map(|&r| r as f64).collect();
            let m = mean(&grp);
            let std = (grp.iter().map(|r| (r - m).powi(2)).sum::<f64>() / (g - 1) as f64).sqrt();
            let centred = rewards[i] as f64 - m;
            let pred = if std_norm { centred * (1.0 / (std + MILES_STD_EPS) - 1.0 / (std + TRL_STD_EPS)) } else { 0.0 };
            let d = *a as f64 - b;
            max_diff = max_diff.max(d.abs());
            assert!(
                (d - pred).abs() <= PRED_TOL,
                "{name}: sample {i}: miles {a} TRL {b}: diff {d} vs predicted {pred}"
            );
        }
        eprintln!("trl-parity {name}: advantages max |miles - TRL| = {max_diff:.2e} (std_norm {std_norm})");
        if !std_norm {
            assert!(max_diff <= TOL, "{name}: advantages differ by {max_diff}");
        }
    }
}

#[test]
fn grpo_sequence_mean_loss_matches_trl() {
    check_variant("grpo", None);
}

#[test]
fn dapo_token_loss_with_clip_higher_matches_trl() {
    check_variant("dapo_clip_higher", None);
}

#[test]
fn bnpo_micro_token_loss_matches_trl() {
    check_variant("bnpo", None);
}

#[test]
fn dr_grpo_constant_loss_matches_trl() {
    check_variant("dr_grpo", None);
}

#[test]
fn grpo_two_iterations_match_trl() {
    check_variant("grpo_iter2", None);
}

#[test]
fn gspo_sequence_ratio_two_iterations_match_trl() {
    check_variant("gspo_iter2", None);
}

#[test]
fn grpo_with_kl_to_the_reference_matches_trl() {
    check_variant("grpo_beta_iter2", None);
}

/// Two optimizer steps per generation batch: TRL's dapo divides each step's token sum by the
/// generation batch's tokens / steps_per_generation, miles by the step's own tokens, so miles'
/// step k loss is TRL's x (T / 2) / T_k. Clipping (both norms are over 1) and Adam's scale
/// invariance make the updates equal, so the second step's prediction holds too.
#[test]
fn dapo_normaliser_over_two_steps_differs_from_trl_as_predicted() {
    let scales = |fx: &Value| -> Vec<f64> {
        let s = samples(fx);
        let v = &fx["variants"]["dapo_two_steps"];
        let spg = v["trl"]["steps_per_generation"].as_u64().unwrap() as f64;
        let total: f64 = s.iter().map(|x| x.completion.len() as f64).sum();
        v["steps"]
            .as_array()
            .unwrap()
            .iter()
            .map(|st| {
                let r = f64s(&st["rows"]);
                let tk: f64 = s[r[0] as usize..r[1] as usize].iter().map(|x| x.completion.len() as f64).sum();
                (total / spg) / tk
            })
            .collect()
    };
    check_variant("dapo_two_steps", Some(&scales));
}

/// TRL 1.16's default `use_bias_correction_kl` weighs each token's k3 KL by its importance ratio
/// r_t = exp(logp_t - old_t) (the DeepSeek-V3.2 unbiased reverse-KL gradient); miles adds the
/// plain k3 (as TRL without it: `grpo_with_kl_to_the_reference_matches_trl`). The first step is
/// on the initial weights (KL 0, ratio 1: value and gradient agree); the second pass's loss differs
/// by beta x the sequence mean of sum_t (r_t - 1) kl_t / |y|, from TRL's log-probs of that step.
#[test]
fn grpo_kl_without_trl_bias_correction_differs_as_predicted() {
    let fx = fixture();
    let name = "grpo_beta_bias_corrected_iter2";
    let v = &fx["variants"][name];
    let trl = &v["trl"];
    assert_eq!(trl["use_bias_correction_kl"].as_bool(), Some(true));
    assert_eq!(trl["loss_type"].as_str(), Some("grpo"), "the prediction below is for sequence means");
    let steps = v["steps"].as_array().unwrap();
    let trl_loss: Vec<f64> = steps.iter().map(|s| s["loss"].as_f64().unwrap()).collect();
    let beta = trl["beta"].as_f64().unwrap();
    let (old, reference, lp2) = (rows(&v["old_logps"]), rows(&v["ref_logps"]), rows(&steps[1]["logps"]));
    let correction = mean(
        &lp2.iter()
            .zip(&old)
            .zip(&reference)
            .map(|((lp, o), r)| {
                let s: f64 = lp
                    .iter()
                    .zip(o)
                    .zip(r)
                    .map(|((l, o), r)| ((l - o).exp() - 1.0) * ((r - l).exp() - (r - l) - 1.0))
                    .sum();
                s / lp.len() as f64
            })
            .collect::<Vec<_>>(),
    );
    let want2 = trl_loss[1] - beta * correction;
    let first = run_miles(&fx, trl, v, 1);
    let both = run_miles(&fx, trl, v, 2);
    let second = 2.0 * both.loss - first.loss;
    eprintln!(
        "trl-parity {name}: step 1 TRL {:.9} miles {:.9}; step 2 TRL {:.9} miles {second:.9} predicted {want2:.9}",
        trl_loss[0], first.loss, trl_loss[1]
    );
    assert!((first.loss - trl_loss[0]).abs() <= TOL, "{name}: first step {} vs TRL {}", first.loss, trl_loss[0]);
    let n0 = steps[0]["grad_norm"].as_f64().unwrap();
    assert!((first.grad_norm - n0).abs() <= NORM_RTOL * n0, "{name}: first grad norm {} vs {n0}", first.grad_norm);
    assert!(correction.abs() > 10.0 * PRED_TOL / beta, "the fixture's second pass must exercise the correction");
    assert!((second - want2).abs() <= PRED_TOL, "{name}: second pass miles {second} vs predicted {want2}");
}
