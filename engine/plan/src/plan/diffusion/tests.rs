use super::*;

/// side 4 (16 px), 2 conditions, hidden 8, 1 block. The stdlib's count: 2 x 8 x 16 + 16 +
/// 64 + 4 x 8 + 3 x 8 + (2 x 64 + 4 x 8) = 552, as model.rs lays it out (in 136, time 72,
/// cond 24, block 160, out_norm 16, out 144).
fn tiny() -> DenoiserSpec {
    DenoiserSpec { side: 4, conditions: 2, hidden: 8, layers: 1, params: 552 }
}

fn work(flops: f64, kernels: f64, bytes: f64) -> Work {
    Work { flops, kernels, bytes }
}

#[test]
fn denoiser_forward_and_sampler_by_hand() {
    let m = tiny();
    // 9.5 x 8 + 6 x 8 + 16 = 140 elements per row.
    assert_eq!(forward_elements(&m), 140.0);
    // One row: 2 x 552 FLOPs, 17 + 6 ops, 140 x 4 B.
    assert_eq!(forward(&m, 1.0), work(1104.0, 23.0, 560.0));
    // One image under guidance: 2 rows (2208, 23, 1120), guidance (10 ops, 5 x 16 x 4 = 320 B),
    // posterior mean (7, 448 B), noise and log-prob (3 + 5 + 2 ops, 6 x 16 x 4 = 384 B).
    assert_eq!(sampler_step(&m, 1.0, true), work(2208.0, 50.0, 2272.0));
    // Without guidance: one row, one fill, no cats.
    assert_eq!(sampler_step(&m, 1.0, false), work(1104.0, 23.0 + 1.0 + 7.0 + 10.0, 560.0 + 448.0 + 384.0));
    // Two steps, then x_T, clamp and the check (8 + 2 ops, 3 x 16 x 4 = 192 B).
    assert_eq!(denoise_micro_group(&m, 1.0, 2.0, true), work(4416.0, 110.0, 4736.0));
    assert_eq!((forwards_per_step(3.0), forwards_per_step(1.0), forwards_per_step(0.0)), (2, 1, 1));
}

#[test]
fn trained_step_by_hand() {
    let m = tiny();
    // The mean with gradients (2208, 40, 1888) + ids, log-prob, loss, / steps, KL
    // (1 + 5 + 20 + 1 + 7 = 34 ops) and log-prob + KL's 4 x 16 x 4 = 256 B.
    let g = trained_step_graph(&m, 1.0, true, true);
    assert_eq!(g, work(2208.0, 74.0, 2144.0));
    // Forward + backward (3x) + the reference's no-grad mean (2208, 41, 1888).
    assert_eq!(
        trained_step(&m, 1.0, true, true),
        work(3.0 * 2208.0 + 2208.0, 3.0 * 74.0 + 41.0, 3.0 * 2144.0 + 1888.0)
    );
    // No KL: no reference, no KL ops or bytes.
    assert_eq!(trained_step(&m, 1.0, true, false), work(3.0 * 2208.0, 3.0 * 67.0, 3.0 * 2016.0));
    // Pretraining one image: forward (1104, 23, 560) + loss (14 ops, 6 x 16 x 4 = 384 B), x3,
    // + AdamW 12 x 15 tensors and 28 x 552 B.
    assert_eq!(denoiser_tensors(&m), 15.0);
    assert_eq!(pretrain_step(&m, 1.0), work(3.0 * 1104.0, 3.0 * 37.0 + 180.0, 3.0 * 944.0 + 28.0 * 552.0));
}

#[test]
fn classifier_by_hand() {
    // side 4: pools to 2 and 1. conv1 8 x 9 + 8, conv2 16 x 8 x 9 + 16, fc1 64 x 16 + 64,
    // fc2 2 x 64 + 2.
    assert_eq!(classifier_params(4, 2), 80 + 1168 + 1088 + 130);
    // The recipe's 16x16 of 8 classes: fc1 reads 16 x 4 x 4.
    assert_eq!(classifier_params(16, 8), 80 + 1168 + 16_448 + 520);
    // 2 x (9 x 8 x 16 + 9 x 8 x 16 x 4 + 16 x 64 + 64 x 2).
    assert_eq!(classifier_flops(4, 2), 2.0 * (1152.0 + 4608.0 + 1024.0 + 128.0));
    // Elements: 16 + 2 x 8 x 16 + 8 x 4 + 2 x 16 x 4 + 16 + 128 + 6 = 582 per image.
    assert_eq!(classifier_forward(4, 2, 2.0), work(2.0 * 13_824.0, 21.0, 2.0 * 4.0 * 582.0));
}

#[test]
fn streaming_pipeline_both_ways() {
    // Denoising slower than scoring: the reward of each but the last hides behind the next
    // micro-group; whole batch n d + n r.
    assert_eq!(rollout_times(4, 20.0, 5.0), (100.0, 20.0 + 3.0 * 20.0 + 5.0));
    // Scoring slower: the reward thread is the bottleneck, d + (n - 1) r + r.
    assert_eq!(rollout_times(4, 10.0, 15.0), (100.0, 10.0 + 3.0 * 15.0 + 15.0));
    // One micro-group: nothing to overlap.
    assert_eq!(rollout_times(1, 10.0, 15.0), (25.0, 25.0));
    assert_eq!(rollout_times(0, 10.0, 15.0), (0.0, 0.0));
    // Streaming never loses: whole - streamed = (n - 1) min(d, r).
    let (w, s) = rollout_times(5, 7.0, 3.0);
    assert!((w - s - 4.0 * 3.0).abs() < 1e-12);
}

#[test]
fn trajectories_by_hand() {
    // 2 images x ((2 x 3 + 1) x 16 px x 4 B + 3 x 8 B) = 2 x 472.
    assert_eq!(trajectory_bytes(&tiny(), 2, 3), 944.0);
}

fn input(extra_cost_s: f64, streaming: bool) -> PlanInput {
    let d = Diffusion {
        model: tiny(),
        pretrain: Some(DenoisePretrain { stage: "pretrain".into(), steps: 10, batch: 4 }),
        rollout: DenoiseRollout {
            stage: "rollout".into(),
            steps: 3,
            guidance: 3.0,
            samples_per_condition: 2,
            micro_group: 2,
        },
        reward: Some(ImageReward {
            stage: "reward".into(),
            streaming,
            extra_cost_s,
            classifier_steps: Some(7),
            analytic: false,
            process: false,
        }),
        train: Some(DiffusionTrainer {
            stage: "train".into(),
            conditions_per_step: 2,
            train_steps: None,
            kl_coef: 0.01,
        }),
        eval: Some(ImageEval { stage: "eval".into(), every: 5, samples: 2, judge_steps: 5 }),
    };
    let stage = |name: &str, kind: &str, role: Role| Stage {
        teacher: None,
        name: name.into(),
        kind: kind.into(),
        role,
        model: None,
        gpus: None,
        engine: None,
        trainer: None,
        span: None,
    };
    PlanInput {
        recipe: "tiny".into(),
        cluster: Cluster {
            name: "laptop".into(),
            pools: Vec::new(),
            host: Some(HostSpec {
                name: "laptop".into(),
                cpus: 2,
                memory: 16_000_000_000,
                memory_bandwidth: 18e9,
                fp32: None,
            }),
            span: None,
        },
        device: None,
        models: Vec::new(),
        stages: vec![
            stage("pretrain", "denoise_pretrain", Role::Train),
            stage("rollout", "denoise", Role::Rollout),
            stage("reward", "image_reward", Role::Reward),
            stage("train", "diffusion_grpo", Role::Train),
            stage("eval", "image_eval", Role::Other),
        ],
        graph: Graph::default(),
        placement: Placement { diffusion: Some(d), ..Placement::default() },
        syncs: Vec::new(),
        schedule: Schedule::default(),
        batch: Batch::default(),
        r3: Spanned::new(false),
        r3_id_bytes: None,
        episodes: None,
        context_cap: None,
        assumptions: Assumptions::default(),
    }
}

#[test]
fn memory_items_by_hand() {
    let p = crate::plan(&input(0.0, true));
    assert_eq!(p.summary.errors, 0, "{:?}", p.diagnostics);
    assert_eq!(p.memory.len(), 1);
    let m = &p.memory[0];
    assert_eq!((m.stage.as_str(), m.device.as_str()), ("train", "laptop"));
    let items: Vec<(&str, u64)> = m.items.iter().map(|i| (i.name.as_str(), i.bytes)).collect();
    // 552 params: 4 B weights, gradients, reference (kl_coef > 0); 8 B for AdamW's moments
    // (the pretraining optimizer is freed before RL).
    // Classifier 2,466 params x 4 B, twice with the judge. Trajectories: 2 conditions x 2
    // samples = 4 images x 472 B (T = 3); the eval's 2 images x 472 B. Activations: one
    // trained step of 2 images under guidance, 4 rows x 140 x 4 + 2 x (320 + 448 + 256) =
    // 4,288 B x 1.4 = 6,003 B (pretraining's 4 images x (140 + 96) x 4 B x 1.4 = 5,286 B is
    // smaller).
    assert_eq!(
        items,
        vec![
            ("weights", 2208),
            ("gradients", 2208),
            ("optimizer", 4416),
            ("reference", 2208),
            ("classifier", 9864),
            ("judge", 9864),
            ("trajectories", 1888),
            ("eval_trajectory", 944),
            ("activations", 6003),
            ("embedded_process", 140_000_000),
        ]
    );
    assert_eq!(m.total, 140_039_603);
    assert!(m.fits);
    // The batch arithmetic, and the one sync priced at nothing.
    let d = p.diffusion.as_ref().expect("diffusion report");
    let b = &d.batch;
    assert_eq!(
        (b.images_per_step, b.micro_groups_per_step, b.denoising_steps, b.trained_steps, b.forwards_per_step),
        (4, 2, 3, 3, 2)
    );
    assert_eq!(p.stages[1].layout, "embedded sampler (the trainer's process)");
    assert_eq!(p.stages[1].model.as_deref(), Some("denoiser 4x4 h8 x1"));
}

#[test]
fn step_phases_follow_the_cpu_model() {
    let a = Assumptions::default();
    let r = embedded::rate(&a);
    let m = tiny();
    let p = crate::plan(&input(0.0, true));
    let d = p.diffusion.as_ref().unwrap();
    // Denoise: 2 micro-groups of 2 images x 3 steps.
    let dmg = work_seconds(&denoise_micro_group(&m, 2.0, 3.0, true), &r);
    assert!((d.denoise_micro_group_s - dmg).abs() < 1e-15);
    assert!((d.step.denoise_s - 2.0 * dmg).abs() < 1e-15);
    // Train FLOPs: 2 micro-groups x 3 steps x (3 x 4 rows + 4 reference rows) x 1104.
    let w = trained_step(&m, 2.0, true, true);
    assert_eq!(w.flops, 16.0 * 1104.0);
    let train = work_seconds(&(w.scale(6.0) + adam(15.0, 552.0) + Work { kernels: 2.0, ..Work::default() }), &r);
    assert!((d.step.train_s - train).abs() < 1e-15);
    // The step is the report's: rollout + train, nothing for sync.
    let st = p.step.as_ref().unwrap();
    assert_eq!(
        (st.rollout_s, st.train_s, st.sync_s, st.step.seconds),
        (d.step.rollout_s, d.step.train_s, 0.0, d.step.step_s)
    );
    assert!((d.step.step_s - d.step.rollout_s - d.step.train_s).abs() < 1e-15);
    assert!((d.step.reward_wait_s - (d.step.rollout_s - d.step.denoise_s)).abs() < 1e-15);
    // One-offs are reported apart from the step.
    assert!(d.pretrain.as_ref().unwrap().seconds > 0.0 && d.one_off_s > d.step.step_s);
}

#[test]
fn streaming_plans_both_ways_with_a_slow_reward() {
    // extra_cost 50 ms per micro-group: scoring is far slower than denoising.
    for streaming in [true, false] {
        let p = crate::plan(&input(0.05, streaming));
        let d = p.diffusion.as_ref().unwrap();
        let (dd, rr) = (d.denoise_micro_group_s, d.reward_micro_group_s);
        assert!(rr > dd && rr >= 0.05);
        assert!((d.whole_batch_s - (2.0 * dd + 2.0 * rr)).abs() < 1e-12);
        assert!((d.streamed_s - (dd + rr + rr)).abs() < 1e-12);
        let want = if streaming { d.streamed_s } else { d.whole_batch_s };
        assert_eq!(d.step.rollout_s, want);
        assert_eq!(p.step.as_ref().unwrap().rollout_s, want);
    }
}

#[test]
fn over_host_memory_is_e0401() {
    let mut i = input(0.0, true);
    if let Some(h) = i.cluster.host.as_mut() {
        h.memory = 100_000_000;
    }
    let p = crate::plan(&i);
    assert!(!p.memory[0].fits);
    assert_eq!(p.diagnostics.iter().map(|d| d.code).collect::<Vec<_>>(), vec!["E0401"]);
}
