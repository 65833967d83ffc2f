//! Plan and run agree: for every recipe in the repository that `miles run` maps onto a run spec,
//! the planner's input (`miles_plan::plan_input`) and the run spec (`run_job`) state the same
//! shared facts. Both read the recipe's one typed `Job`; this test is what keeps a future mapping
//! from drifting on either side.

use super::{run_job, RunJob};
use miles_compiler::fs::DiskFs;
use miles_compiler::{compile, Options};
use miles_plan::{PlanInput, Role};
use miles_runtime::diffusion::DiffusionRunSpec;
use miles_runtime::spec::{Precision as RunPrecision, RunSpec, ScheduleSpec};

/// The shared facts on which `input` and `spec` disagree, one line each (empty: they agree).
fn disagreements(input: &PlanInput, spec: &RunSpec) -> Vec<String> {
    let mut out = Vec::new();
    let mut same = |what: &str, plan: String, run: String| {
        if plan != run {
            out.push(format!("{what}: plan {plan}, run {run}"));
        }
    };
    let by_name = |name: &str| input.stages.iter().find(|s| s.name == name);
    let (rollout, train) = (by_name(&spec.stages.rollout), by_name(&spec.stages.train));
    same("rollout stage", rollout.map(|s| s.role == Role::Rollout).unwrap_or(false).to_string(), "true".into());
    same("trainer stage", train.map(|s| s.role == Role::Train).unwrap_or(false).to_string(), "true".into());
    let (Some(rollout), Some(train)) = (rollout, train) else { return out };

    // The model's shape (the parameters are counted from it), experts and top-k.
    let m = &spec.model;
    let planned = rollout.model.as_ref().map(|p| {
        format!(
            "{}x{} heads {}/{} vocab {} ff {:?} context {} experts {} top-{}",
            p.layers,
            p.hidden_size,
            p.heads,
            p.kv_heads,
            p.vocab,
            p.intermediate_size,
            p.max_context,
            p.experts,
            p.top_k
        )
    });
    let moe = m.moe.as_ref().map_or((0, 0), |e| (e.experts, e.top_k));
    let run = format!(
        "{}x{} heads {}/{} vocab {} ff {:?} context {} experts {} top-{}",
        m.n_layers,
        m.d_model,
        m.n_heads,
        m.n_kv_heads,
        m.vocab_size,
        Some(m.d_ff),
        m.max_len,
        moe.0,
        moe.1
    );
    same("model", planned.unwrap_or_default(), run);

    // Batch arithmetic.
    let b = &input.batch;
    let v = |x: Option<miles_plan::Spanned<u64>>| x.map_or(0, |x| x.value as usize).to_string();
    same("global batch", v(b.global_batch), spec.train.global_batch.to_string());
    same("rollout batch", v(b.rollout_batch), spec.rollout.rollout_batch.to_string());
    same("samples per prompt", v(b.samples_per_prompt), spec.rollout.samples_per_prompt.to_string());
    same("epochs", b.epochs.map_or(1, |e| e.value).to_string(), spec.train.epochs.to_string());
    // DAPO's dynamic sampling: the plan prices its rounds, the run generates them.
    same(
        "dynamic sampling rounds",
        format!("{:?}", input.schedule.dynamic_rounds),
        format!("{:?}", spec.dynamic_sampling.map(|d| u64::from(d.max_rounds))),
    );

    // Lengths (an episode's context is the planner's to size: compared without episodes).
    if let (Some(e), None) = (&rollout.engine, &input.episodes) {
        same("max new tokens", e.response_len.value.to_string(), spec.rollout.max_new_tokens.to_string());
        let prompt = spec.rollout.max_prompt_tokens.unwrap_or(0);
        same("max prompt tokens", e.prompt_len.value.to_string(), prompt.to_string());
    }

    // What counts as a solved episode (the plan shows it; eval and solved_frac apply it).
    if let Some(e) = &input.episodes {
        same("solved at", e.solved_at.to_string(), spec.env.as_ref().map_or(1.0, |x| x.solved_at).to_string());
    }

    // Precision of the trainer and the engine.
    let name = |p: RunPrecision| format!("{p:?}").to_lowercase();
    if let Some(t) = &train.trainer {
        same("trainer precision", format!("{:?}", t.precision.value).to_lowercase(), name(spec.train.precision));
        // LoRA's rank and targets.
        let lora = |rank: u64, mut targets: Vec<String>| {
            targets.sort();
            targets.dedup();
            format!("rank {rank} on {}", targets.join(","))
        };
        same(
            "lora",
            t.lora.as_ref().map_or("none".into(), |l| {
                lora(l.rank.value, l.target_modules.iter().map(|t| t.as_str().to_string()).collect())
            }),
            spec.train.lora.as_ref().map_or("none".into(), |l| lora(l.rank as u64, l.target_modules.clone())),
        );
        // Data-parallel trainer ranks and their ZeRO stage (the plan prices memory per rank).
        same(
            "data-parallel ranks",
            t.data_parallel.as_ref().map_or("1".into(), |d| format!("{} zero {:?}", d.ranks.value, d.zero.value)),
            spec.train.dp.as_ref().map_or("1".into(), |d| format!("{} zero {:?}", d.ranks, d.zero)),
        );
        // The OPD teacher (one on GPUs of its own is planned as a stage of its own).
        let own_gpus = input.stages.iter().any(|s| s.teacher.is_some());
        if !own_gpus {
            same(
                "teacher",
                t.teacher.as_ref().map_or("none".into(), |m| format!("{} process {}", m.name, t.teacher_process)),
                spec.train.opd.as_ref().map_or("none".into(), |o| {
                    let m = t.teacher.as_ref().map_or("?".to_string(), |m| m.name.clone());
                    format!("{m} process {}", o.process)
                }),
            );
        }
    }
    if let Some(e) = rollout.engine.as_ref().filter(|e| e.embedded) {
        same("engine precision", format!("{:?}", e.precision.value).to_lowercase(), name(spec.rollout.precision));
    }

    // The schedule.
    let s = &input.schedule;
    let planned = format!("{:?}", s.mode.value).to_lowercase();
    let run = match &spec.schedule {
        ScheduleSpec::Sync => "sync".to_string(),
        ScheduleSpec::OneStepOff => "onestepoff".into(),
        ScheduleSpec::FullyAsync(a) => {
            same("max staleness", v(s.max_staleness), a.max_staleness.to_string());
            same("buffer capacity", v(s.buffer_capacity), a.buffer_capacity.to_string());
            same("max concurrent", v(s.max_concurrent), a.max_concurrent.to_string());
            "fullyasync".into()
        }
    };
    same("schedule", planned, run);
    out
}

/// A diffusion recipe's shared facts.
fn diffusion_disagreements(input: &PlanInput, spec: &DiffusionRunSpec) -> Vec<String> {
    let Some(d) = &input.placement.diffusion else { return vec!["the plan has no diffusion job".into()] };
    let plan = format!(
        "{}x{} c{} h{} x{}; steps {}; {}x{} per step in groups of {}",
        d.model.side,
        d.model.side,
        d.model.conditions,
        d.model.hidden,
        d.model.layers,
        d.rollout.steps,
        d.train.as_ref().map_or(0, |t| t.conditions_per_step),
        d.rollout.samples_per_condition,
        d.rollout.micro_group
    );
    let m = &spec.model;
    let run = format!(
        "{}x{} c{} h{} x{}; steps {}; {}x{} per step in groups of {}",
        m.side,
        m.side,
        m.conditions,
        m.hidden,
        m.layers,
        spec.steps,
        spec.rl.conditions_per_step,
        spec.rl.samples_per_condition,
        spec.rl.micro_group
    );
    if plan == run {
        Vec::new()
    } else {
        vec![format!("diffusion: plan {plan}, run {run}")]
    }
}

/// Every `.miles` file under `dir`, recursively, sorted.
fn recipes_under(dir: &str, out: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let mut paths: Vec<_> = entries.flatten().map(|e| e.path()).collect();
    paths.sort();
    for p in paths {
        if p.is_dir() {
            recipes_under(&p.to_string_lossy(), out);
        } else if p.extension().is_some_and(|e| e == "miles") {
            out.push(p.to_string_lossy().into_owned());
        }
    }
}

#[test]
fn plan_and_run_state_the_same_facts_for_every_recipe() {
    let mut files = Vec::new();
    for dir in ["recipes", "tests/cases", "tests/plans"] {
        recipes_under(dir, &mut files);
    }
    let (mut lm, mut diffusion, mut problems) = (0, 0, Vec::new());
    for file in &files {
        let c = compile(&DiskFs, std::slice::from_ref(file), &Options::default());
        if c.has_errors() {
            continue;
        }
        for recipe in &c.recipes {
            let input = miles_plan::plan_input(recipe);
            let found = match run_job(recipe) {
                Ok(RunJob::Lm(spec)) => {
                    lm += 1;
                    disagreements(&input, &spec)
                }
                Ok(RunJob::Diffusion(spec)) => {
                    diffusion += 1;
                    diffusion_disagreements(&input, &spec)
                }
                Err(_) => continue,
            };
            problems.extend(found.into_iter().map(|p| format!("{file} ({}): {p}", recipe.name)));
        }
    }
    assert!(problems.is_empty(), "plan and run disagree:\n{}", problems.join("\n"));
    // The net covers the laptop recipes of every family, not an empty set.
    assert!(lm >= 20 && diffusion >= 1, "only {lm} LM and {diffusion} diffusion recipes mapped");
}

/// The comparison fails when either side changes a shared fact.
#[test]
fn a_changed_side_is_a_disagreement() {
    let file = "recipes/lora-laptop.miles".to_string();
    let c = compile(&DiskFs, std::slice::from_ref(&file), &Options::default());
    let recipe = &c.recipes[0];
    let input = miles_plan::plan_input(recipe);
    let Ok(RunJob::Lm(spec)) = run_job(recipe) else { panic!("{file} maps onto a run spec") };
    assert_eq!(disagreements(&input, &spec), Vec::<String>::new());

    let mut run = spec.clone();
    run.train.global_batch += 1;
    assert!(disagreements(&input, &run)[0].starts_with("global batch"));
    let mut run = spec.clone();
    run.train.lora.as_mut().unwrap().target_modules.pop();
    assert!(disagreements(&input, &run)[0].starts_with("lora"));
    let mut run = spec.clone();
    run.train.epochs = 3;
    assert!(disagreements(&input, &run)[0].starts_with("epochs"));
    let mut run = spec.clone();
    run.dynamic_sampling = Some(miles_runtime::DynamicSampling { max_rounds: 2 });
    assert!(disagreements(&input, &run)[0].starts_with("dynamic sampling"));
    let mut run = spec.clone();
    run.schedule = ScheduleSpec::OneStepOff;
    assert!(disagreements(&input, &run)[0].starts_with("schedule"));
    let mut run = spec.clone();
    run.train.dp = Some(miles_runtime::spec::DataParallelSpec {
        ranks: 2,
        zero: miles_runtime::spec::ZeroStage::Optimizer,
        bucket_bytes: 25_000_000,
        timeout_s: 120.0,
    });
    assert!(disagreements(&input, &run)[0].starts_with("data-parallel ranks"));

    let mut plan = input.clone();
    plan.stages.iter_mut().find(|s| s.name == spec.stages.rollout).unwrap().model.as_mut().unwrap().top_k = 3;
    assert!(disagreements(&plan, &spec)[0].starts_with("model"));
    let mut plan = input.clone();
    plan.stages.iter_mut().find(|s| s.name == spec.stages.train).unwrap().trainer.as_mut().unwrap().precision.value =
        miles_plan::Precision::Bf16;
    assert!(disagreements(&plan, &spec)[0].starts_with("trainer precision"));
}

/// `embedded_trainer { dp, zero, dp_bucket, collective_timeout }` reaches the run spec as set (the
/// stdlib's defaults where unset), and the plan reads the same ranks; one rank is no
/// `DataParallelSpec` at all (the single-process trainer, no collectives).
#[test]
fn a_data_parallel_trainer_maps_its_ranks_onto_plan_and_run() {
    use miles_runtime::spec::{DataParallelSpec, ZeroStage};
    let spec_of = |backend: &str| {
        let src = format!(
            "import std/tasks/arith\nmodel policy = transformer {{ layers = 1, d_model = 16, heads = 2, vocab = arith.vocab }}\n\
             recipe r {{\n rollout = generate(policy) {{ prompts = arith.addition {{}}, max_new_tokens = 4.tokens }}\n\
             reward = exact_match(rollout)\n train = grpo(rollout, reward) {{ rollout_batch = 4, global_batch = 32, \
             micro_batch = 8, backend = embedded_trainer {{ {backend} }} }}\n\
             sync = weights(train -> rollout) {{ transport = broadcast }}\n launcher = local_processes {{}}\n}}\n"
        );
        let fs = miles_compiler::fs::MemoryFs::with(&[("r.miles", &src)]);
        let c = compile(&fs, &["r.miles".to_string()], &Options::default());
        assert!(!c.has_errors(), "{:#?}", c.diagnostics);
        let input = miles_plan::plan_input(&c.recipes[0]);
        let Ok(RunJob::Lm(spec)) = run_job(&c.recipes[0]) else { panic!("{backend}: no LM run spec") };
        assert_eq!(disagreements(&input, &spec), Vec::<String>::new(), "{backend}");
        spec.train.dp
    };
    let want = |ranks, zero, bucket_bytes, timeout_s| Some(DataParallelSpec { ranks, zero, bucket_bytes, timeout_s });
    assert_eq!(
        spec_of("dp = 2, zero = optimizer, dp_bucket = 4.MB, collective_timeout = 30"),
        want(2, ZeroStage::Optimizer, 4_000_000, 30.0)
    );
    assert_eq!(spec_of("dp = 4"), want(4, ZeroStage::None, 25_000_000, 120.0));
    assert_eq!(spec_of("dp = 1"), None);
    assert_eq!(spec_of(""), None);
}
