//! On-policy distillation: the teacher stage's log-probs (a teacher whose log-probs are known
//! because it is the student itself), the trainer's per-token term against hand-computed values,
//! its combination with the task's advantage, masking, and the teacher's bad inputs.

use crate::common;

use miles_runtime::tasks::EOS;
use miles_runtime::{OpdSpec, TeacherScorer, TrainSpec, Trainer, Trajectory};
use miles_tch::model::Policy;
use miles_tch::teacher::TchTeacher;
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
    s.opd = Some(opd(teacher, coef, task_coef));
    s
}

fn opd(teacher: &std::path::Path, coef: f64, task_coef: f64) -> OpdSpec {
    OpdSpec { stage: "teacher".into(), teacher: teacher.to_path_buf(), coef, task_coef, process: false }
}

/// The teacher stage of `dir` for the tiny config's student (micro-batch 2, temperature 1).
fn teacher(dir: &std::path::Path, cfg: &miles_runtime::ModelConfig) -> Result<TchTeacher, String> {
    TchTeacher::load(&opd(dir, 1.0, 1.0), cfg.vocab_size, cfg.max_len, 2, 1.0).map_err(|e| e.to_string())
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
    let mut batch: Vec<Trajectory> = (0..2)
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
            teacher_logprobs: Vec::new(),
        })
        .collect();
    // The teacher stage scores the sampled tokens with the student's own log-probs.
    let tlp = teacher(&dir, &cfg).unwrap().logprobs(&batch).unwrap();
    assert_eq!(tlp, lp);
    for (t, row) in batch.iter_mut().zip(tlp) {
        t.teacher_logprobs = row;
    }
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
        teacher_logprobs: Vec::new(),
    }];
    // Missing.
    let dir = temp("missing");
    let e = teacher(&dir.join("nope"), &cfg).err().unwrap();
    assert!(e.contains("nope"), "{e}");
    // Another vocabulary.
    let mut other = cfg.clone();
    other.vocab_size = 40;
    Policy::init(&other, 1).save(&dir).unwrap();
    let e = teacher(&dir, &cfg).err().unwrap();
    assert!(e.contains("vocabulary of 40 tokens, the student's is 12"), "{e}");
    // Corrupt weights.
    std::fs::write(dir.join("model.safetensors"), b"not safetensors").unwrap();
    assert!(teacher(&dir, &cfg).is_err());
    // A batch the teacher stage did not score never reaches the loss.
    let student = Policy::init(&cfg, 1);
    let before = student.snapshot(0).unwrap();
    let mut tr = TchTrainer::new(student, spec(&dir, 1.0, 1.0));
    let e = tr.train_rl(&batch, &[0.01], 1.0).unwrap_err().to_string();
    assert!(e.contains("sample 0 reached the trainer without the teacher stage `teacher`'s log-probs"), "{e}");
    assert_eq!(Trainer::export_full_weights(&tr).unwrap().tensors, before.tensors);
    // A teacher with NaN weights answers NaN, which the runtime's teacher stage refuses, naming
    // the sample (engine/runtime/src/exec/teacher.rs; tests/e2e/opd.rs runs it end to end).
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
    let lp = teacher(&dir2, &cfg).unwrap().logprobs(&batch).unwrap();
    assert!(lp[0][0].is_nan(), "{lp:?}");
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&dir2);
}
