//! Every plan figure of the shipped recipes, snapshotted in text and JSON: the path from a
//! `.miles` file through the compiler and `plan_input` to the planner.

use miles_compiler::fs::FileSystem;
use miles_compiler::{compile, Options};

struct Disk;
impl FileSystem for Disk {
    fn read(&self, path: &str) -> Result<Vec<u8>, String> {
        std::fs::read(path).map_err(|e| e.to_string())
    }
}

fn plan(file: &str, sets: &[(&str, &str)]) -> miles_plan::Plan {
    let overrides = sets.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let c = compile(&Disk, &[file.to_string()], &Options { overrides, recipe: None, hub_cache: None });
    assert!(!c.has_errors(), "{file} has errors: {:#?}", c.diagnostics);
    assert_eq!(c.recipes.len(), 1, "{file}");
    miles_plan::plan(&miles_plan::plan_input(&c.recipes[0]))
}

#[test]
fn laptop_recipe() {
    let p = plan("recipes/grpo-laptop.miles", &[]);
    assert_eq!(p.summary.errors, 0);
    insta::assert_snapshot!("grpo_laptop.txt", miles_plan::render_text(&p));
    insta::assert_snapshot!("grpo_laptop.json", miles_plan::render_json(&p));
}

/// DAPO on the laptop (recipes/dapo-laptop.miles): the rollout priced at one round of its dynamic
/// sampling, with the bound of every round shown; and the laptop recipe with 4 epochs over 2
/// mini-batches: 8 optimizer steps a rollout step, each with the old log-probs' pass.
#[test]
fn dapo_and_epochs_on_the_laptop() {
    let p = plan("recipes/dapo-laptop.miles", &[]);
    assert_eq!(p.summary.errors, 0);
    let step = p.step.as_ref().expect("a step estimate");
    assert_eq!(step.dynamic_rounds, Some(3));
    insta::assert_snapshot!("dapo_laptop.txt", miles_plan::render_text(&p));
    let one = plan(
        "recipes/grpo-laptop.miles",
        &[("train.global_batch", "128"), ("train.steps_per_rollout", "2"), ("train.micro_batch", "128")],
    );
    let four = plan(
        "recipes/grpo-laptop.miles",
        &[
            ("train.global_batch", "128"),
            ("train.steps_per_rollout", "2"),
            ("train.micro_batch", "128"),
            ("train.epochs", "4"),
        ],
    );
    let (s1, s4) = (one.step.as_ref().unwrap(), four.step.as_ref().unwrap());
    assert_eq!(four.batch.as_ref().unwrap().epochs, 4);
    // Four passes of the same two optimizer steps: the training time is 4x, the rollout unchanged.
    assert!((s4.train_s / s1.train_s - 4.0).abs() < 1e-9, "{} vs {}", s4.train_s, s1.train_s);
    assert_eq!(s4.rollout_s, s1.rollout_s);
    assert!(miles_plan::render_text(&four).contains("4 epochs: 8 optimizer steps"));
}

/// The laptop recipe's trainer as two data-parallel worker processes (recipes/grpo-ddp-laptop.miles:
/// `embedded_trainer { dp = 2 }` under `launcher = local_processes {}`), then with ZeRO-1, checked
/// by hand against the one-process plan of the same micro-batch: memory per rank item by item
/// (the Adam moments halve under ZeRO-1 at N = 2, the rollout engine's copy is its worker's, not
/// a rank's), the busiest rank's share of the micro-batches and the collectives per step.
#[test]
fn laptop_recipe_data_parallel() {
    let one = plan(
        "recipes/grpo-ddp-laptop.miles",
        &[("train.backend.dp", "1"), ("launcher", "in_process"), ("sync.transport", "local")],
    );
    let dp = plan("recipes/grpo-ddp-laptop.miles", &[]);
    let zero = plan("recipes/grpo-ddp-laptop.miles", &[("train.backend.zero", "optimizer")]);
    for p in [&one, &dp, &zero] {
        assert_eq!(p.summary.errors, 0, "{}", miles_plan::render_text(p));
    }
    let item = |p: &miles_plan::Plan, name: &str| {
        let m = p.memory.iter().find(|m| m.stage == "train").expect("the trainer's row");
        m.items.iter().find(|i| i.name == name).map(|i| i.bytes)
    };
    // 100,672 parameters (0.1M): FP32 weights and gradients whole on every rank, 2 Adam moments.
    let params = 100_672u64;
    for p in [&one, &dp, &zero] {
        assert_eq!(item(p, "weights"), Some(4 * params));
        assert_eq!(item(p, "gradients"), Some(4 * params));
        assert_eq!(item(p, "activations"), item(&one, "activations"));
        assert_eq!(item(p, "embedded_process"), Some(140_000_000));
    }
    assert_eq!(item(&one, "optimizer"), Some(8 * params));
    assert_eq!(item(&dp, "optimizer"), Some(8 * params));
    assert_eq!(item(&zero, "optimizer"), Some(8 * params / 2), "ZeRO-1 halves the moments at N = 2");
    // One process holds the rollout engine's copy; a rank does not (the engine is a worker).
    assert_eq!(item(&one, "weight_copies"), Some(4 * params));
    assert_eq!(item(&dp, "weight_copies"), None);
    let row = |p: &miles_plan::Plan| p.memory.iter().find(|m| m.stage == "train").unwrap().clone();
    let (r1, r2, rz) = (row(&one), row(&dp), row(&zero));
    assert_eq!(r1.ranks, None);
    let ranks = r2.ranks.as_ref().expect("per rank");
    assert_eq!((ranks.ranks, ranks.zero.as_str(), ranks.all_ranks), (2, "none", 2 * r2.total));
    assert_eq!(r2.total + 4 * params, r1.total, "a rank holds all but the engine's copy");
    assert_eq!(rz.total + 4 * params, r2.total);
    // Each rank may use half of the host.
    assert_eq!(r2.usable, r1.usable / 2);

    // Time: the busiest rank trains 1 of the step's 2 micro-batches of 128, then the gradients'
    // all-reduce, 2 x (2 - 1) / 2 x 402,688 B at 1 GB/s; ZeRO-1 broadcasts the parameters after.
    let (s1, s2, sz) = (one.step.as_ref().unwrap(), dp.step.as_ref().unwrap(), zero.step.as_ref().unwrap());
    assert!(s1.data_parallel.is_none());
    let d = s2.data_parallel.as_ref().expect("the ranks' step");
    assert_eq!((d.ranks, d.micro_batches, d.micro_batches_per_rank, d.buckets), (2, 2, 1, 1));
    assert_eq!(d.gradient_bytes, 4 * params);
    let bw = miles_plan::input::LOCAL_COLLECTIVE_BYTES_PER_S;
    assert!((d.all_reduce_s - (4 * params) as f64 / bw).abs() < 1e-12, "{}", d.all_reduce_s);
    assert_eq!((d.broadcast_bytes, d.broadcast_s), (0, 0.0));
    assert_eq!(d.collective_s, d.collective.seconds, "one optimizer step per rollout step");
    let dz = sz.data_parallel.as_ref().unwrap();
    assert_eq!(dz.broadcast_bytes, 4 * params);
    assert!((dz.collective.seconds - 2.0 * d.all_reduce_s).abs() < 1e-12);
    // Half the trained passes, the same AdamW, plus the all-reduce: between half and all of
    // the one process's train time; ZeRO-1 trades half of AdamW for the broadcast.
    assert!(s2.train_s > s1.train_s / 2.0 && s2.train_s < s1.train_s, "{} vs {}", s2.train_s, s1.train_s);
    assert!(s2.train_step.assumptions.iter().any(|a| a.contains("the busiest trains 1 of the step's 2")));
    let text = miles_plan::render_text(&dp);
    assert!(text.contains("train per trainer rank (2 ranks, zero = none;"), "{text}");
    assert!(text.contains("embedded trainer x 2 ranks (zero = none)"), "{text}");
    assert!(miles_plan::render_html(&zero).contains("per trainer rank (2 ranks, zero = optimizer;"));
    insta::assert_snapshot!("grpo_ddp_laptop.txt", text);
    insta::assert_snapshot!("grpo_ddp_laptop.json", miles_plan::render_json(&dp));
    insta::assert_snapshot!("grpo_ddp_laptop_zero.txt", miles_plan::render_text(&zero));
}

/// A data-parallel rank that does not fit its share of the host (2 ranks on a 300 MB machine:
/// 138 MB usable each) is E0401, and ZeRO-1 is offered with what it leaves per rank.
#[test]
fn a_data_parallel_rank_over_its_share_of_the_host_is_told_of_zero() {
    let file = "recipes/grpo-ddp-laptop.miles";
    let text = std::fs::read_to_string(file).unwrap();
    let small = text.replace("local { cpus = 2 }", "local { cpus = 2, memory = 300.MB }");
    assert_ne!(small, text, "the recipe's cluster line moved");
    let overlay = miles_compiler::fs::MemoryFs::with(&[(file, &small)]);
    let fs = miles_compiler::fs::OverlayFs { base: &Disk, overlay: &overlay };
    let c = compile(&fs, &[file.to_string()], &Options::default());
    assert!(!c.has_errors(), "{:#?}", c.diagnostics);
    let p = miles_plan::plan(&miles_plan::plan_input(&c.recipes[0]));
    let row = p.memory.iter().find(|m| m.stage == "train").unwrap();
    assert_eq!(row.usable, 138_000_000, "0.92 x 300 MB over 2 ranks");
    assert!(!row.fits);
    let e = p.diagnostics.iter().find(|d| d.code == miles_grammar::diag::ErrorCode::E0401).expect("E0401");
    assert!(
        e.message.starts_with("train does not fit: 0.2 GB per trainer rank, and its 2 ranks share laptop's 0.3 GB usable (0.3 GB x 92%), 0.1 GB each; over by 49.3 MB"),
        "{}",
        e.message
    );
    let help = e.help.as_deref().unwrap_or_default();
    // A rank holds 187.3 MB, 0.8 MB of it the moments ZeRO-1 would halve: still 48.9 MB over.
    let x = row.total - 402_688;
    let over = format!("{:.1} MB", (x - row.usable) as f64 / 1e6);
    assert!(
        help.contains(&format!("`zero = optimizer` (ZeRO-1 over the 2 ranks): 0.2 GB per rank (still {over} over)")),
        "{help}"
    );
}

/// The catalog models a new user names first (tests/plans/catalog-new-user.miles, one model at a
/// time): each is planned with the published parameter counts of the catalog; those too large
/// for four FSDP ranks are told so, with the fixes.
#[test]
fn new_catalog_models_plan_with_their_published_sizes() {
    let file = "tests/plans/catalog-new-user.miles";
    let text = std::fs::read_to_string(file).unwrap();
    for (name, params, active) in [
        ("qwen3_1_7b", 1_710_000_000u64, 1_710_000_000u64),
        ("qwen3_8b", 8_190_000_000, 8_190_000_000),
        ("qwen3_14b", 14_760_000_000, 14_760_000_000),
        ("qwen3_32b", 32_760_000_000, 32_760_000_000),
        ("gpt_oss_20b", 20_910_000_000, 3_610_000_000),
        ("gpt_oss_120b", 116_830_000_000, 5_130_000_000),
    ] {
        let overlay = miles_compiler::fs::MemoryFs::with(&[(
            file,
            &text.replace("generate(qwen3_8b)", &format!("generate({name})")),
        )]);
        let fs = miles_compiler::fs::OverlayFs { base: &Disk, overlay: &overlay };
        let c = compile(&fs, &[file.to_string()], &Options::default());
        assert!(!c.has_errors(), "{name}: {:#?}", c.diagnostics);
        let input = miles_plan::plan_input(&c.recipes[0]);
        let m = input.stages.iter().find_map(|s| s.model.as_ref()).expect("a model");
        assert_eq!((m.params, m.active_params), (params, active), "{name}");
        let p = miles_plan::plan(&input);
        let text = miles_plan::render_text(&p);
        // Four FSDP ranks hold a model to ~10B parameters with Adam on the GPU (an MoE model's
        // state is its total parameters'); beyond, the plan says so and how to fix it.
        if params < 10_000_000_000 {
            assert_eq!(p.summary.errors, 0, "{name}: {text}");
        } else {
            assert!(text.contains("train does not fit in GPU memory") && text.contains("fixes:"), "{name}: {text}");
        }
    }
}

/// The laptop recipe planned on a machine whose CUDA driver shows an H200 (a fake one: the
/// planner is pure, `miles plan` passes what the driver says): `device = auto` resolves to it,
/// the step is priced at its datasheet rates, said to be unmeasured, and the memory row is the
/// GPU's.
#[test]
fn laptop_recipe_on_an_h200() {
    use miles_plan::input::{MachineGpu, MachineGpus};
    let c = compile(&Disk, &["recipes/grpo-laptop.miles".to_string()], &Options::default());
    assert!(!c.has_errors(), "{:#?}", c.diagnostics);
    let mut input = miles_plan::plan_input(&c.recipes[0]);
    let device = input.device.as_mut().expect("a local cluster's device");
    device.machine = Some(MachineGpus {
        gpus: vec![MachineGpu { index: 0, name: "NVIDIA H200".into(), memory: 150_121_545_728, sm: "sm_90".into() }],
        unavailable: None,
    });
    let p = miles_plan::plan(&input);
    assert_eq!(p.summary.errors, 0);
    let text = miles_plan::render_text(&p);
    assert!(
        text.contains("device: cuda:0 (device = auto: NVIDIA H200; the step time below is priced for it"),
        "{text}"
    );
    assert!(!text.contains("not priced"), "{text}");
    let json = miles_plan::render_json(&p);
    assert!(json.contains("on the GPU NVIDIA H200 (H200 SXM datasheet, dense)"), "{json}");
    // Priced on the GPU the same counts cost less than on one CPU thread.
    let cpu = plan("recipes/grpo-laptop.miles", &[]);
    assert!(p.step.as_ref().unwrap().step.seconds < cpu.step.as_ref().unwrap().step.seconds);
    insta::assert_snapshot!("grpo_laptop_h200.txt", text);
    insta::assert_snapshot!("grpo_laptop_h200.json", json);
}

/// The paper's reference run plans cleanly with optimizer state streamed from disk ...
#[test]
fn glm5_reference_plans_cleanly_with_streaming() {
    let p = plan("recipes/glm5-agentic.miles", &[]);
    assert_eq!((p.summary.errors, p.summary.warnings), (0, 0), "{}", miles_plan::render_text(&p));
    insta::assert_snapshot!("glm5_agentic.txt", miles_plan::render_text(&p));
    insta::assert_snapshot!("glm5_agentic.json", miles_plan::render_json(&p));
}

/// The recipe's weight channel is on the weight-sync lines (text and HTML) and in the JSON; auto
/// is not written, so every other plan reads as before.
#[test]
fn a_weight_channel_is_shown_where_the_transport_is() {
    let p = plan("recipes/glm5-agentic.miles", &[("sync.channel", "nccl")]);
    let text = miles_plan::render_text(&p);
    assert!(text.contains("weights train -> rollout, p2p over nccl,"), "{text}");
    assert!(text.contains("by p2p over nccl: est."), "{text}");
    let json = miles_plan::render_json(&p).replace(' ', "");
    assert!(json.contains("\"channel\":\"nccl\""), "{json}");
    let plain = plan("recipes/glm5-agentic.miles", &[]);
    assert!(!miles_plan::render_text(&plain).contains("p2p over"));
    assert!(!miles_plan::render_json(&plain).contains("\"channel\""));
}

/// ... and does not fit with weights, gradients and ~279 GB of optimizer state in HBM.
#[test]
fn glm5_reference_does_not_fit_with_optimizer_on_gpu() {
    let p = plan("recipes/glm5-agentic.miles", &[("train.optimizer.state", "on_gpu")]);
    let text = miles_plan::render_text(&p);
    assert!(p.diagnostics.iter().any(|d| d.code == "E0401"), "{text}");
    let train = p.memory.iter().find(|m| m.stage == "train").expect("train memory");
    let optimizer = train.items.iter().find(|i| i.name == "optimizer").expect("optimizer item");
    // 744e9 parameters x 12 bytes / 32 ranks = 279 GB (Miles §9).
    assert!((optimizer.bytes as f64 / 1e9 - 279.0).abs() < 1.0, "{text}");
    insta::assert_snapshot!("glm5_agentic_optimizer_on_gpu.txt", text);
}

/// Explicit placement: `first_gpu` pins a stage to a GPU range; overlapping or out-of-cluster
/// ranges are plan errors (E0403); without `gpus` an engine takes what the trainer leaves.
#[test]
fn explicit_and_automatic_gpu_placement() {
    // Errors and warnings (the reference run's note on its rollout, E0412, is not about placement).
    let codes = |p: &miles_plan::Plan| {
        p.diagnostics
            .iter()
            .filter(|d| d.severity != miles_grammar::diag::Severity::Note)
            .map(|d| d.code.as_str())
            .collect::<Vec<_>>()
    };
    let p = plan("recipes/glm5-agentic.miles", &[("rollout.engine.first_gpu", "32"), ("train.backend.first_gpu", "0")]);
    assert!(codes(&p).is_empty(), "{}", miles_plan::render_text(&p));
    assert!(miles_plan::render_text(&p).contains("GPUs 32-63"));
    let p = plan("recipes/glm5-agentic.miles", &[("rollout.engine.first_gpu", "16"), ("train.backend.first_gpu", "0")]);
    assert!(codes(&p).contains(&"E0403"), "{}", miles_plan::render_text(&p));
    let p = plan("recipes/glm5-agentic.miles", &[("rollout.engine.first_gpu", "48")]);
    assert!(codes(&p).contains(&"E0403"), "{}", miles_plan::render_text(&p));
    let p = plan("recipes/glm5-agentic.miles", &[("rollout.engine.gpus", "none")]);
    assert!(codes(&p).is_empty(), "{}", miles_plan::render_text(&p));
    assert!(miles_plan::render_text(&p).contains("32 rollout"));
}

/// Issue #17's new-user recipe (tests/plans/qwen3-4b-colocated.miles): Qwen3-4B GRPO, colocated
/// FSDP on one 8-H100 node. It plans without warnings (32 samples per engine fit the KV cache),
/// and the colocated memory is added up: both actors do not fit at once, so the eviction is priced.
#[test]
fn qwen3_4b_colocated_new_user_recipe() {
    let p = plan("tests/plans/qwen3-4b-colocated.miles", &[]);
    assert_eq!((p.summary.errors, p.summary.warnings), (0, 0), "{}", miles_plan::render_text(&p));
    let c = p.colocation.as_ref().expect("colocation");
    assert!(!c.fits_resident && p.step.as_ref().is_some_and(|s| s.switch_s > 0.0));
    insta::assert_snapshot!("qwen3_4b_colocated.txt", miles_plan::render_text(&p));
}

/// The rollout model of the reference run (issue #17, item 2), one mechanism at a time on the
/// planner's input: DSA's sparse reads, the recipe's prefix-cache hit rate, per-sample refill.
#[test]
fn glm5_reference_rollout_mechanisms() {
    let c = compile(&Disk, &["recipes/glm5-agentic.miles".to_string()], &Options::default());
    assert!(!c.has_errors(), "{:#?}", c.diagnostics);
    let input = miles_plan::plan_input(&c.recipes[0]);
    let rollout_s = |i: &miles_plan::PlanInput| {
        let p = miles_plan::plan(i);
        p.rollouts[0].rollout_time.as_ref().map_or(0.0, |e| e.seconds)
    };
    let base = rollout_s(&input);

    // GLM-5.2 is a DSA model in the catalog: dense attention reads the whole context's latent.
    assert_eq!(input.stages[0].model.as_ref().and_then(|m| m.sparse_topk), Some(2048));
    let mut dense = input.clone();
    dense.stages[0].model.as_mut().expect("model").sparse_topk = None;
    assert!(rollout_s(&dense) > 1.3 * base, "dense {} vs sparse {base}", rollout_s(&dense));

    // The recipe's hit rate (the reference run's 96%, §9.2, `prefix_cache_hit` on its engine)
    // prefills less than each context once (TITO's default without one), no cache at all more.
    let hit = input.stages[0].engine.as_ref().and_then(|e| e.prefix_cache_hit.map(|h| h.value));
    assert_eq!(hit, Some(0.96));
    let with_hit = |h: Option<f64>| {
        let mut i = input.clone();
        i.stages[0].engine.as_mut().expect("engine").prefix_cache_hit = h.map(miles_plan::Spanned::new);
        rollout_s(&i)
    };
    assert_eq!(with_hit(Some(0.96)), base);
    assert!(
        base < with_hit(None) && with_hit(None) < with_hit(Some(0.0)),
        "{base} {} {}",
        with_hit(None),
        with_hit(Some(0.0))
    );

    // Waves of a synchronous batch wait for their last sample; fully_async refills per sample.
    let mut sync = input.clone();
    sync.schedule.mode.value = miles_plan::ScheduleMode::Sync;
    assert!(rollout_s(&sync) > base, "sync {} vs fully_async {base}", rollout_s(&sync));
}

/// Issue #14's new-user recipe (tests/plans/qwen3-30b-a3b-lora.miles): Qwen3-30B-A3B GRPO with
/// `lora { rank = 16 }` on 8 H100 for training. As a full fine-tune (`train.lora = none`) the rank
/// does not fit; with LoRA the same frozen base fits because gradients and Adam state exist for the
/// adapters only, and a weight update moves the adapters, not the 61 GB model.
#[test]
fn qwen3_30b_a3b_lora_fits_because_only_adapters_train_and_sync() {
    let file = "tests/plans/qwen3-30b-a3b-lora.miles";
    let lora = plan(file, &[]);
    let full = plan(file, &[("train.lora", "none")]);
    let text = miles_plan::render_text(&lora);
    assert_eq!((lora.summary.errors, lora.summary.warnings), (0, 0), "{text}");
    assert!(full.diagnostics.iter().any(|d| d.code == "E0401"), "{}", miles_plan::render_text(&full));
    let train = |p: &miles_plan::Plan| p.memory.iter().find(|m| m.stage == "train").cloned().expect("train memory");
    let item = |m: &miles_plan::MemoryReport, n: &str| m.items.iter().find(|i| i.name == n).map(|i| i.bytes);
    let (l, f) = (train(&lora), train(&full));
    assert!(l.fits && !f.fits, "{text}");
    // The base and the activations are the same; gradients and optimizer state are the adapters'.
    assert_eq!(item(&l, "weights"), item(&f, "weights"));
    assert_eq!(item(&l, "activations"), item(&f, "activations"));
    assert!(item(&f, "adapters").is_none());
    let r = l.lora.as_ref().expect("lora report");
    // 48 layers x rank 16 x (q 2048+4096, k 2048+512, v 2048+512, o 4096+2048).
    assert_eq!((r.params_per_adapter, r.params), (13_369_344, 13_369_344));
    // TP2 splits the attention adapters; DP4 x TP2 = 8 ranks share their Adam state.
    assert_eq!(item(&l, "gradients"), Some(13_369_344 / 2 * 4));
    assert_eq!(item(&l, "optimizer"), Some(13_369_344 / 8 * 12));
    assert_eq!(
        (r.full_finetune.gradients, r.full_finetune.optimizer),
        (item(&f, "gradients").unwrap_or(0), item(&f, "optimizer").unwrap_or(0))
    );
    // The update: 26.7 MB of BF16 adapters instead of 61 GB of weights.
    assert_eq!(lora.syncs[0].bytes, 13_369_344 * 2);
    assert_eq!(full.syncs[0].bytes, 61_000_000_000);
    insta::assert_snapshot!("qwen3_30b_a3b_lora.txt", text);
    insta::assert_snapshot!("qwen3_30b_a3b_lora.json", miles_plan::render_json(&lora));
}

/// A trainer that starts from a PEFT adapter (`lora { init }`) names it under its memory, with
/// the rank and targets `miles check` read from the adapter's adapter_config.json (r = 4, seven
/// modules, in the plan's order), in text and JSON; fresh adapters print no such line.
#[test]
fn a_lora_init_adapter_is_named_under_the_trainer() {
    let file = "tests/plans/lora-init.miles";
    let dir = "tests/cases/lora_init/adapters/llama-r4";
    let recipe = |lora: &str| {
        format!(
            r#"import std/tasks/arith
model llama = transformer {{ layers = 2, d_model = 64, heads = 4, kv_heads = 2, d_ff = 96, vocab = arith.vocab }}
recipe continues {{
    rollout = generate(llama) {{ prompts = arith.addition {{}}, max_new_tokens = 4.tokens }}
    reward  = exact_match(rollout)
    train   = grpo(rollout, reward) {{ rollout_batch = 32, global_batch = 256, lora = {lora} }}
    sync    = weights(train -> rollout)
}}
"#
        )
    };
    let planned = |text: String| {
        let overlay = miles_compiler::fs::MemoryFs::with(&[(file, &text)]);
        let fs = miles_compiler::fs::OverlayFs { base: &Disk, overlay: &overlay };
        let c = compile(&fs, &[file.to_string()], &Options::default());
        assert!(!c.has_errors(), "{:#?}", c.diagnostics);
        miles_plan::plan(&miles_plan::plan_input(&c.recipes[0]))
    };
    let p = planned(recipe(&format!(r#"lora {{ init = "{dir}" }}"#)));
    let text = miles_plan::render_text(&p);
    let line = format!("LoRA from {dir} (rank 4, targets q, k, v, o, gate, up, down)");
    let under_train = text.split("\n  train (").nth(1).unwrap_or_else(|| panic!("the trainer's memory: {text}"));
    let shown = under_train.lines().find(|l| l.trim_start().starts_with("init ")).unwrap_or_else(|| panic!("{text}"));
    assert!(shown.ends_with(&line), "{shown:?} in {text}");
    let json: serde_json::Value = serde_json::from_str(&miles_plan::render_json(&p)).unwrap();
    let lora = json["memory"].as_array().unwrap().iter().find(|m| m["stage"] == "train").unwrap()["lora"].clone();
    assert_eq!(
        (lora["init"].as_str(), lora["init_line"].as_str(), lora["rank"].as_u64()),
        (Some(dir), Some(&*line), Some(4))
    );
    // Fresh adapters of the same rank and targets: the same memory, and no `init` line or key.
    let fresh = planned(recipe(
        "lora { rank = 4, alpha = 8.0, target_modules = [down_proj, gate_proj, k_proj, o_proj, q_proj, up_proj, v_proj] }",
    ));
    let fresh_text = miles_plan::render_text(&fresh);
    assert!(!fresh_text.contains("LoRA from"), "{fresh_text}");
    assert!(!miles_plan::render_json(&fresh).contains("\"init\""));
    assert_eq!(
        fresh.memory,
        p.memory
            .iter()
            .cloned()
            .map(|mut m| {
                if let Some(l) = m.lora.as_mut() {
                    (l.init, l.init_line) = (None, None);
                }
                m
            })
            .collect::<Vec<_>>()
    );
}

/// #38: the newcomer's Qwen3-8B on two FSDP GPUs does not fit, and the first fix an FSDP user
/// reaches for, activation checkpointing, can be written and comes first, with the activations it
/// leaves; written, it prices the recomputation in the step.
#[test]
fn an_fsdp_rank_over_memory_is_offered_recompute_first() {
    let file = "tests/plans/catalog-new-user.miles";
    let p = plan(file, &[("train.backend", "fsdp { gpus = 2 }")]);
    let e = p.diagnostics.iter().find(|d| d.code == miles_grammar::diag::ErrorCode::E0401).expect("E0401");
    let help = e.help.as_deref().unwrap_or_default();
    assert!(
        help.starts_with(
            "fixes: `recompute = full`: activations 25.9 GB -> 4.8 GB, 79.4 GB per GPU (still 5.8 GB over); `optimizer = adam"
        ),
        "{help}"
    );
    let full = plan(file, &[("train.backend", "fsdp { gpus = 2, recompute = full }")]);
    let act = |p: &miles_plan::Plan| {
        let train = p.memory.iter().find(|m| m.stage == "train").unwrap();
        train.items.iter().find(|i| i.name == "activations").unwrap().bytes
    };
    assert_eq!((act(&p) as f64 / 1e8).round() / 10.0, 25.9);
    assert_eq!((act(&full) as f64 / 1e8).round() / 10.0, 4.8);
    let train_s = |p: &miles_plan::Plan| p.step.as_ref().map_or(0.0, |s| s.train_s);
    assert!(train_s(&full) > train_s(&p) * 1.1, "recomputation costs a forward: {} vs {}", train_s(&full), train_s(&p));
}

/// Issue #38's newcomer (tests/plans/qwen3-8b-fully-async.miles): Qwen3-8B GRPO on two nodes of 8
/// H100, four TP2 engines, FSDP on the other node, fully_async with the default 64 samples in
/// flight. The engines decode 16 sequences each where their KV caches hold 176, and the step
/// waits for the rollout: the plan says so (E0412, a note at the schedule, since the recipe does
/// not set `max_concurrent`) and offers the value that shortens the step, priced by planning the
/// recipe again with it, in the text, the JSON and the HTML.
#[test]
fn a_throttled_rollout_is_named_with_its_fix() {
    let file = "tests/plans/qwen3-8b-fully-async.miles";
    let p = plan(file, &[]);
    assert_eq!((p.summary.errors, p.summary.warnings, p.summary.notes), (0, 0, 1));
    let note = p.diagnostics.iter().find(|d| d.code == miles_grammar::diag::ErrorCode::E0412).expect("E0412");
    assert!(
        note.message.contains("held back by max_concurrent = 64 over 4 engines: 16 of 176 KV slots"),
        "{}",
        note.message
    );
    let src = std::fs::read_to_string(file).unwrap();
    let at = note.primary.as_ref().expect("a span").span.range();
    assert_eq!(&src[at.clone()][..11], "fully_async", "{:?}", &src[at]);
    let text = miles_plan::render_text(&p);
    insta::assert_snapshot!("qwen3_8b_fully_async.txt", text);
    let json = miles_plan::render_json(&p);
    assert!(json.contains("\"throttle\": {") && json.contains("\"limit\": \"max_concurrent\""), "{json}");
    let html = miles_plan::render_html(&p);
    assert!(html.contains("rollout held back</th>") && html.contains("fix: max_concurrent = "), "{html}");
    // Set as the fix says, the step is the fix's and no note is left (the same plan, not a guess).
    let f = p.rollouts[0].throttle.as_ref().and_then(|t| t.fix.as_ref()).expect("a fix");
    let mc = f.settings[0].value.to_string();
    let fixed = plan(file, &[("schedule", &format!("fully_async {{ max_concurrent = {mc} }}"))]);
    assert_eq!(fixed.step.as_ref().unwrap().step.seconds, f.step_s_after);
    assert_eq!(fixed.summary.notes, 0, "{}", miles_plan::render_text(&fixed));
    // Set in the recipe, the note points at the field.
    let set = plan(file, &[("schedule", "fully_async { max_concurrent = 64 }")]);
    let note = set.diagnostics.iter().find(|d| d.code == miles_grammar::diag::ErrorCode::E0412).expect("E0412");
    assert!(note.primary.is_some());
}

/// The newcomer's FSDP variant whose rank does not fit (two FSDP GPUs): E0401 offers activation
/// checkpointing first, with the activations before and after.
#[test]
fn the_newcomers_fsdp_rank_over_memory_is_offered_recompute_first() {
    let p = plan("tests/plans/qwen3-8b-fully-async.miles", &[("train.backend", "fsdp { gpus = 2 }")]);
    let e = p.diagnostics.iter().find(|d| d.code == miles_grammar::diag::ErrorCode::E0401).expect("E0401");
    let help = e.help.as_deref().unwrap_or_default();
    assert!(help.starts_with("fixes: `recompute = full`: activations 25.9 GB -> 4.8 GB"), "{help}");
    insta::assert_snapshot!("qwen3_8b_fully_async_fsdp2.txt", miles_plan::render_text(&p));
}
