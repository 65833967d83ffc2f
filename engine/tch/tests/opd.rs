//! On-policy distillation in the trainer: the per-token term against hand-computed values (a
//! teacher whose log-probs are known because it is the student itself), its combination with the
//! task's advantage, masking, and the teacher's bad inputs.

mod common;

use miles_runtime::tasks::EOS;
use miles_runtime::{OpdSpec, TrainSpec, Trainer, Trajectory};
use miles_tch::model::Policy;
use miles_tch::train::TchTrainer;
use std::path::PathBuf;

fn temp(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("miles-opd-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn spec(teacher: &std::path::Path, coef: f64, task_coef: f64) -> TrainSpec {
    let mut s: TrainSpec = serde_json::from_str(r#"{"lr": 0.0, "micro_batch": 2, "global_batch": 2}"#).unwrap();
    s.opd = Some(OpdSpec { teacher: teacher.to_path_buf(), coef, task_coef, process: false });
    s
}

#[test]
fn opd_advantage_by_hand() {
    tch::set_num_threads(1);
    let cfg = common::tiny_config(0.5);
    let student = Policy::init(&cfg, 4);
    // The teacher is the student's own weights: its log-probs are the trainer's, known exactly.
    let dir = temp("same");
    student.save(&dir).unwrap();
    let (prompts, responses) = (vec![vec![1u32, 5], vec![1, 8]], vec![vec![6u32, 7, EOS], vec![9, EOS]]);
    let mut probe = TchTrainer::new(student.deep_copy(), spec(&dir, 1.0, 1.0));
    let lp = probe.logprobs(&prompts, &responses, 1.0).unwrap();
    // The sampler said 0.5 nats less than the teacher on every token: d = +0.5 each, so the
    // reverse-KL estimate (student - teacher) is -0.5; the second response's last token is masked.
    let batch: Vec<Trajectory> = (0..2)
        .map(|i| Trajectory {
            prompt: prompts[i].clone(),
            response: responses[i].clone(),
            rollout_logprobs: lp[i].iter().map(|x| x - 0.5).collect(),
            loss_mask: if i == 1 { vec![1.0, 0.0] } else { vec![1.0; 3] },
            reward: 0.0,
            advantage: [0.3, -0.3][i],
            group: 0,
            weight_version: 0,
            routing: None,
        })
        .collect();
    let mut tr = TchTrainer::new(student.deep_copy(), spec(&dir, 2.0, 1.0));
    let st = tr.train_rl(&batch, &[0.0], 1.0).unwrap();
    let o = st.opd.expect("distillation stats");
    assert!((o.reverse_kl + 0.5).abs() < 1e-5, "{}", o.reverse_kl);
    // Teacher log-prob mean over the 4 trained tokens.
    let want = (lp[0].iter().sum::<f32>() + lp[1][0]) as f64 / 4.0;
    assert!((o.teacher_logp - want).abs() < 1e-5, "{} vs {want}", o.teacher_logp);
    // Share: |2 x 0.5| = 1 per token against |0.3| per token: 1 / 1.3.
    assert!((o.opd_share - 1.0 / 1.3).abs() < 1e-5, "{}", o.opd_share);
    // The advantage reaches the loss: at lr 0 and ratio 1 the loss is -mean(A) over trained
    // tokens, A = 1 + 0.3 on the first response's 3 tokens and 1 - 0.3 on the second's one.
    let want_loss = -(3.0 * 1.3 + 0.7) / 4.0;
    assert!((st.loss - want_loss).abs() < 1e-5, "{} vs {want_loss}", st.loss);
    // Pure distillation (task_coef 0): the task advantage plays no part.
    let mut pure = TchTrainer::new(student.deep_copy(), spec(&dir, 1.0, 0.0));
    let st = pure.train_rl(&batch, &[0.0], 1.0).unwrap();
    assert!((st.loss + 0.5).abs() < 1e-5, "{}", st.loss);
    assert!((st.opd.unwrap().opd_share - 1.0).abs() < 1e-9);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_bad_teacher_is_refused_with_its_name() {
    tch::set_num_threads(1);
    let cfg = common::tiny_config(0.5);
    let batch = vec![Trajectory {
        prompt: vec![1, 5],
        response: vec![6, EOS],
        rollout_logprobs: vec![-1.0, -1.0],
        loss_mask: vec![1.0, 1.0],
        reward: 1.0,
        advantage: 0.0,
        group: 0,
        weight_version: 0,
        routing: None,
    }];
    // Missing.
    let dir = temp("missing");
    let mut tr = TchTrainer::new(Policy::init(&cfg, 1), spec(&dir.join("nope"), 1.0, 1.0));
    let e = tr.train_rl(&batch, &[0.0], 1.0).unwrap_err().to_string();
    assert!(e.contains("nope"), "{e}");
    // Another vocabulary.
    let mut other = cfg.clone();
    other.vocab_size = 40;
    Policy::init(&other, 1).save(&dir).unwrap();
    let mut tr = TchTrainer::new(Policy::init(&cfg, 1), spec(&dir, 1.0, 1.0));
    let e = tr.train_rl(&batch, &[0.0], 1.0).unwrap_err().to_string();
    assert!(e.contains("vocabulary of 40 tokens, the student's is 12"), "{e}");
    // Corrupt weights.
    std::fs::write(dir.join("model.safetensors"), b"not safetensors").unwrap();
    let mut tr = TchTrainer::new(Policy::init(&cfg, 1), spec(&dir, 1.0, 1.0));
    assert!(tr.train_rl(&batch, &[0.0], 1.0).is_err());
    // NaN teacher log-probs are named with the sample, and the student's weights do not move.
    let nan = Policy::init(&cfg, 2);
    let _g = tch::no_grad_guard();
    for (n, t) in nan.params() {
        if n.contains("lm_head") {
            let _ = t.shallow_clone().fill_(f64::NAN);
        }
    }
    drop(_g);
    let dir2 = temp("nan");
    nan.save(&dir2).unwrap();
    let student = Policy::init(&cfg, 1);
    let before = student.snapshot(0).unwrap();
    let mut tr = TchTrainer::new(student, spec(&dir2, 1.0, 1.0));
    let e = tr.train_rl(&batch, &[0.01], 1.0).unwrap_err().to_string();
    assert!(e.contains("teacher's log-prob of sample 0 (group 0) token 0 is NaN"), "{e}");
    assert_eq!(Trainer::export_full_weights(&tr).unwrap().tensors, before.tensors);
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&dir2);
}
