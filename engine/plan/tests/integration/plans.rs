//! Data-driven plan tests: every `fixtures/*.json` is a `PlanInput`; its text and JSON plans are
//! snapshots. Targeted assertions below pin the figures the snapshots would only show.

use miles_plan::{plan, render_html, render_json, render_text, OptimizerOffload, Plan, PlanInput};
use std::path::Path;

fn load(name: &str) -> PlanInput {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn fixtures_snapshot() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .expect("fixtures dir")
        .filter_map(|e| e.ok()?.path().file_stem()?.to_str().map(String::from))
        .collect();
    names.sort();
    assert!(names.len() >= 5, "{names:?}");
    for name in names {
        let p = plan(&load(&name));
        insta::assert_snapshot!(format!("{name}.txt"), render_text(&p));
        insta::assert_snapshot!(format!("{name}.json"), render_json(&p));
        // Every plan renders to a page, whatever its errors.
        assert!(render_html(&p).starts_with("<!DOCTYPE html>"));
    }
}

fn mem(p: &Plan, stage: &str, item: &str) -> u64 {
    let m = p.memory.iter().find(|m| m.stage == stage).expect("memory report");
    m.items.iter().find(|i| i.name == item).map_or(0, |i| i.bytes)
}

#[test]
fn glm5_reference_needs_optimizer_streaming() {
    // domain.md §9: optimizer state ~279 GB per rank, beyond 288 GB HBM with weights and grads.
    let p = plan(&load("glm5_reference_no_offload"));
    let opt = mem(&p, "train", "optimizer");
    assert!((278_000_000_000..=280_000_000_000).contains(&opt), "{opt}");
    let e = p.diagnostics.iter().find(|d| d.code == "E0401").expect("E0401");
    assert!(e.is_error());
    assert!(e.message.contains("over by"), "{}", e.message);
    let help = e.help.as_deref().unwrap_or("");
    // More DP GPUs would fit only past the cluster's 64, so that fix is not offered.
    assert!(help.contains("stream_from_disk") && !help.contains("GPUs for this stage"), "{help}");
    assert!(e.primary.is_some() && !e.secondary.is_empty());
    assert_eq!(p.summary.errors, 1);

    let mut input = load("glm5_reference_no_offload");
    input.stages[2].trainer.as_mut().expect("trainer").optimizer_offload.value = OptimizerOffload::StreamFromDisk;
    let p = plan(&input);
    assert_eq!(p.summary.errors, 0, "{}", render_text(&p));
    let m = p.memory.iter().find(|m| m.stage == "train").expect("train memory");
    assert!(m.fits && m.offload.as_ref().is_some_and(|o| o.per_step.seconds > 0.0));
    assert_eq!(p, plan(&load("glm5_reference")));
    assert!(render_text(&p).contains("Plan: 4 stages on 64 GPUs (32 rollout, 32 train); 0 errors, 0 warnings."));
}

#[test]
fn invalid_layouts_report_instead_of_panicking() {
    let p = plan(&load("invalid_layouts"));
    let codes: Vec<&str> = p.diagnostics.iter().map(|d| d.code.as_str()).collect();
    for c in ["E0403", "E0404", "E0405"] {
        assert!(codes.contains(&c), "{c} missing from {codes:?}");
    }
}

#[test]
fn json_round_trips_inputs_with_spans() {
    let input = load("glm5_reference");
    let back: PlanInput = serde_json::from_str(&serde_json::to_string(&input).expect("ser")).expect("de");
    assert_eq!(input, back);
    assert!(input.stages[0].gpus.and_then(|g| g.span).is_some());
    assert!(render_json(&plan(&input)).contains("\"format_version\": 2"));
}

#[test]
fn embedded_process_items_by_hand() {
    // cpu_laptop's tiny model (4 layers, d 128, 4 heads of 32, MHA, vocab 32, 1M params) with an
    // MLP of width 256, a KL reference, and a snapshot evaluation under one_step_off.
    let mut input = load("cpu_laptop");
    for st in &mut input.stages {
        if let Some(m) = st.model.as_mut() {
            m.intermediate_size = Some(256);
        }
    }
    input.placement.embedded =
        miles_plan::EmbeddedExtras { kl_reference: true, eval_snapshot: true, entropy_in_loss: false };
    input.schedule.mode = miles_plan::Spanned::new(miles_plan::ScheduleMode::OneStepOff);
    let p = plan(&input);
    // Per token and layer: 6 x 128 + 5 x 128 + 4 x 128 + 4 x 256 + 2 x 4 heads x seq 16 = 3072;
    // head 3 x 128 + 3 x 32 = 480; 32 x 16 = 512 tokens; concatenated weights
    // 4 x ((128 + 256) x 128 + 2 x 256 x 128) = 458,752; 4 B each, x1.4.
    let act = (512.0 * (4.0 * 3072.0 + 480.0) + 458_752.0) * 4.0 * 1.4;
    assert_eq!(act, 39_177_420.8);
    assert_eq!(mem(&p, "warmup", "activations"), act as u64);
    assert_eq!(mem(&p, "train", "activations"), act as u64);
    // The first trainer row holds the process: the rollout engine, the snapshot eval engine and
    // the KL reference, 1M fp32 parameters each, and the 140 MB base.
    assert_eq!(mem(&p, "warmup", "weight_copies"), 12_000_000);
    assert_eq!(mem(&p, "warmup", "embedded_process"), 140_000_000);
    assert_eq!((mem(&p, "train", "weight_copies"), mem(&p, "train", "embedded_process")), (0, 0));
    // A sync schedule evaluates on the rollout engine: no eval engine of its own.
    input.schedule.mode = miles_plan::Spanned::new(miles_plan::ScheduleMode::Sync);
    assert_eq!(mem(&plan(&input), "warmup", "weight_copies"), 8_000_000);
}

/// A `local` cluster's `device` against what the machine has: `cuda` without a GPU is E0518
/// naming both numbers and why; `auto` falls back to the CPU saying why; a GPU is listed and used.
#[test]
fn device_against_the_machine() {
    use miles_plan::input::{DeviceInput, MachineGpu, MachineGpus};
    let with = |asked: &str, machine: MachineGpus| {
        let mut input = load("cpu_laptop");
        input.device = Some(DeviceInput {
            asked: miles_plan::Spanned::new(asked.into()),
            machine: Some(machine),
            cpu_only: None,
            cpu_bf16: None,
        });
        plan(&input)
    };
    let none = MachineGpus { gpus: Vec::new(), unavailable: Some("libcuda.so is not installed".into()) };
    let p = with("cuda", none.clone());
    let e: Vec<_> = p.diagnostics.iter().filter(|d| d.code == "E0518").collect();
    assert_eq!(e.len(), 1, "{:?}", p.diagnostics);
    assert!(e[0].message.contains("it needs 1 GPU, and this machine has 0"), "{}", e[0].message);
    assert!(e[0].help.as_deref().unwrap_or("").contains("libcuda.so is not installed"));
    assert_eq!(p.device.as_ref().unwrap().resolved, None);

    let p = with("auto", none);
    assert!(p.diagnostics.iter().all(|d| d.code != "E0518"));
    let d = p.device.unwrap();
    assert_eq!(d.resolved.as_deref(), Some("cpu"));
    assert_eq!(d.why, "device = auto: libcuda.so is not installed");

    let h200 = MachineGpu { index: 0, name: "NVIDIA H200".into(), memory: 150_121_545_728, sm: "sm_90".into() };
    let p = with("cuda", MachineGpus { gpus: vec![h200], unavailable: None });
    assert!(p.diagnostics.iter().all(|d| d.code != "E0518"));
    let d = p.device.unwrap();
    assert_eq!(d.resolved.as_deref(), Some("cuda:0"));
    assert_eq!(d.gpus, vec!["0: NVIDIA H200, 139.8 GiB, sm_90".to_string()]);
    assert!(render_text(&with("cpu", MachineGpus::default())).contains("device: cpu (device = cpu)"));
}

/// On a GPU the embedded step is priced at the GPU's datasheet rates, and the line says so and
/// that they are not measured; the embedded process's memory is checked against the GPU's
/// (E0401, naming it), with `device = cpu` among the fixes.
#[test]
fn a_gpu_prices_the_step_and_bounds_the_memory() {
    use miles_plan::input::{DeviceInput, MachineGpu, MachineGpus};
    let on_in = |name: &str, memory: u64, precision: miles_plan::input::Precision| {
        let mut input = load("cpu_laptop");
        for t in input.stages.iter_mut().filter_map(|st| st.trainer.as_mut()) {
            t.precision = miles_plan::Spanned::new(precision);
        }
        input.device = Some(DeviceInput {
            asked: miles_plan::Spanned::new("auto".into()),
            machine: Some(MachineGpus {
                gpus: vec![MachineGpu { index: 0, name: name.into(), memory, sm: "sm_90".into() }],
                unavailable: None,
            }),
            cpu_only: None,
            cpu_bf16: None,
        });
        plan(&input)
    };
    let on = |name: &str, memory: u64| on_in(name, memory, miles_plan::input::Precision::Fp32);
    let p = on("NVIDIA H200", 150_121_545_728);
    let why = &p.device.as_ref().unwrap().why;
    assert!(why.starts_with("device = auto: NVIDIA H200; the step time below is priced for it (H200 SXM datasheet, dense: fp32 (no tensor cores, TF32 off) matmuls at 67.0 TFLOP/s x 50%, HBM 4.80 TB/s x 70%, 10 us per op)"), "{why}");
    assert!(why.ends_with("datasheet assumptions, not yet measured on a GPU"), "{why}");
    assert!(!why.contains("not priced"), "{why}");
    assert!(p.diagnostics.iter().all(|d| d.code != "E0401"), "{:?}", p.diagnostics);
    let train = p.memory.iter().find(|m| m.stage == "train").unwrap();
    assert_eq!((train.device.as_str(), train.capacity), ("NVIDIA H200", 150_121_545_728));

    // bf16 GEMMs: the tensor cores' dense peak instead.
    let p = on_in("NVIDIA H200", 150_121_545_728, miles_plan::input::Precision::Bf16);
    let why = &p.device.as_ref().unwrap().why;
    assert!(why.contains("dense: bf16 tensor-core matmuls at 989.5 TFLOP/s x 50%, HBM"), "{why}");

    let p = on("NVIDIA GeForce GT 1030", 100_000_000);
    assert!(p
        .device
        .as_ref()
        .unwrap()
        .why
        .contains("is not in the plan's GPU table, so a conservative fallback (not a datasheet)"));
    let e: Vec<_> = p.diagnostics.iter().filter(|d| d.code == "E0401").collect();
    assert_eq!(e.len(), 1, "the warm-up's row holds the process: {:?}", p.diagnostics);
    assert!(e[0].message.starts_with("warmup does not fit in GPU memory:"), "{}", e[0].message);
    assert!(e[0].message.contains("NVIDIA GeForce GT 1030 has 0.1 GB usable"), "{}", e[0].message);
    assert!(
        e[0].help.as_deref().unwrap_or("").contains("`device = cpu` (the host, slower): 22.1 GB usable (fits)"),
        "{:?}",
        e[0].help
    );
}

/// E0411: a bf16 embedded trainer on a CPU found without AVX512-BF16 or AMX is a warning naming
/// the stage; with the instructions, or not looked at, nothing is said (the engine's case:
/// tests/integration/recipes.rs, this fixture has no engine).
#[test]
fn bf16_on_a_cpu_without_bf16_instructions_warns() {
    use miles_plan::input::{DeviceInput, Precision};
    let with = |cpu_bf16: Option<bool>, trainer: Precision| {
        let mut input = load("cpu_laptop");
        input.device = Some(DeviceInput {
            asked: miles_plan::Spanned::new("cpu".into()),
            machine: None,
            cpu_only: None,
            cpu_bf16,
        });
        for t in input.stages.iter_mut().filter_map(|st| st.trainer.as_mut()) {
            t.precision = miles_plan::Spanned::new(trainer);
        }
        plan(&input).diagnostics.into_iter().filter(|d| d.code == "E0411").map(|d| d.message).collect::<Vec<_>>()
    };
    let w = with(Some(false), Precision::Bf16);
    assert_eq!(w.len(), 2, "the SFT warm-up and the GRPO trainer: {w:?}");
    assert!(w[1].starts_with("train: `embedded_trainer { precision = bf16 }` on a CPU without AVX512-BF16"), "{w:?}");
    assert!(with(Some(true), Precision::Bf16).is_empty());
    assert!(with(None, Precision::Bf16).is_empty());
    assert!(with(Some(false), Precision::Fp32).is_empty());
}
