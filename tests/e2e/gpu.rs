//! The GPU path from the outside: `device` in a recipe, `miles plan`'s device line, and `miles run`
//! on CUDA. On a machine without a GPU (CI, the development machines) each test checks the
//! refusal or the CPU fallback and says what it skipped; on a GPU machine (bench/gpu/run.sh) the
//! same tests run the recipe on the GPU.

use crate::common;

use common::metrics;
use common::process::{output, run_miles, run_recipe, temp_dir, text};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The machine's GPUs, or why there are none.
fn gpus() -> Result<Vec<miles_cuda::Gpu>, String> {
    match miles_cuda::devices() {
        Ok(g) if !g.is_empty() => Ok(g),
        Ok(_) => Err("the CUDA driver shows no GPU".into()),
        Err(e) => Err(e.reason),
    }
}

/// recipes/grpo-laptop.miles with its cluster's `device` set, written to `dir`.
fn laptop_recipe(dir: &Path, device: &str) -> PathBuf {
    let src = std::fs::read_to_string("recipes/grpo-laptop.miles").unwrap();
    let cluster = "cluster laptop = local { cpus = 2 }";
    assert!(src.contains(cluster), "recipes/grpo-laptop.miles no longer declares `{cluster}`");
    let src = src.replace(cluster, &format!("cluster laptop = local {{ cpus = 2, device = {device} }}"));
    let path = dir.join(format!("grpo-{device}.miles"));
    std::fs::write(&path, src).unwrap();
    path
}

#[test]
fn a_cuda_recipe_on_a_machine_without_a_gpu_is_refused_before_training() {
    let dir = temp_dir("gpu-refused");
    let recipe = laptop_recipe(&dir, "cuda");
    let out = dir.join("out");
    let r = recipe.to_str().unwrap();
    match gpus() {
        Err(why) => {
            let o = output(
                common::process::miles().args(["run", r, "--out", out.to_str().unwrap()]),
                Duration::from_secs(120),
            );
            let t = text(&o);
            assert_eq!(o.status.code(), Some(1), "{t}");
            assert!(t.contains("E0518"), "{t}");
            assert!(t.contains("device = cuda"), "the message names the field: {t}");
            assert!(t.contains("this machine has 0"), "both numbers: {t}");
            assert!(t.contains("grpo-cuda.miles:18"), "the recipe's line: {t}");
            assert!(!out.join("metrics.jsonl").exists(), "nothing trained");
            eprintln!("skipped the GPU half (a run on CUDA): {why}");
        }
        Ok(g) => {
            let o = output(
                common::process::miles().args([
                    "run",
                    r,
                    "--out",
                    out.to_str().unwrap(),
                    "--progress",
                    "off",
                    "--set",
                    "stop=2.steps",
                ]),
                Duration::from_secs(300),
            );
            let t = text(&o);
            assert!(o.status.success(), "on {}: {t}", g[0].name);
            assert!(t.contains("computing on cuda:0"), "{t}");
        }
    }
}

#[test]
fn miles_plan_prints_the_device_and_the_machine_gpus() {
    let dir = temp_dir("gpu-plan");
    let auto = laptop_recipe(&dir, "auto");
    let o = run_miles(&["plan", auto.to_str().unwrap()]);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    match gpus() {
        Err(why) => {
            assert!(t.contains("device: cpu (device = auto: "), "{t}");
            assert!(t.contains(&why), "the plan says why there is no GPU ({why}): {t}");
        }
        Ok(g) => {
            assert!(t.contains("device: cuda:0 (device = auto: "), "{t}");
            assert!(t.contains(&format!("gpu 0: {}", g[0].name)), "{t}");
        }
    }
    let cpu = laptop_recipe(&dir, "cpu");
    let t = text(&run_miles(&["plan", cpu.to_str().unwrap()]));
    assert!(t.contains("device: cpu (device = cpu)"), "{t}");
}

/// The laptop recipe learns on CUDA as on the CPU: the same seed, the same metrics within a
/// tolerance (fp32 on both; the GPU's reduction order and kernels differ from the CPU's), held-out accuracy
/// rising on both. Runs only where there is a GPU (bench/gpu/run.sh).
#[test]
fn the_laptop_recipe_learns_on_cuda_as_on_cpu() {
    if let Err(why) = gpus() {
        eprintln!("skipped: {why}");
        return;
    }
    let dir = temp_dir("gpu-parity");
    let mut acc = Vec::new();
    for device in ["cpu", "cuda"] {
        let recipe = laptop_recipe(&dir, device);
        let out = dir.join(format!("out-{device}"));
        let o = run_recipe(&recipe, &out, Duration::from_secs(600));
        assert!(o.status.success(), "{device}: {}", text(&o));
        // bench/gpu/run.sh keeps both runs' metrics.
        if let Some(keep) = std::env::var_os("MILES_GPU_OUT") {
            let _ =
                std::fs::copy(out.join("metrics.jsonl"), Path::new(&keep).join(format!("grpo-{device}-metrics.jsonl")));
        }
        let rows = metrics::untimed(&out);
        let eval: Vec<f64> = rows.iter().filter_map(|v| v["eval/accuracy"].as_f64()).collect();
        assert!(eval.len() >= 2, "{device}: held-out accuracy at the start and the end");
        acc.push((eval[0], *eval.last().unwrap()));
    }
    let ((c0, c1), (g0, g1)) = (acc[0], acc[1]);
    assert!(c1 > c0 && g1 > g0, "both learn: cpu {c0:.3} -> {c1:.3}, cuda {g0:.3} -> {g1:.3}");
    assert!((c1 - g1).abs() <= 0.15, "final held-out accuracy within 0.15: cpu {c1:.3}, cuda {g1:.3}");
    eprintln!("held-out accuracy: cpu {c0:.3} -> {c1:.3}, cuda {g0:.3} -> {g1:.3}");
}

/// The engine's libtorch of another version or missing: the dynamic loader stops `miles-engine`
/// before it runs, and `miles` names the libraries and the version it was built against. Made real
/// here with an empty libtorch_cpu.so first on LD_LIBRARY_PATH (searched before the binary's
/// runpath), which the loader refuses as it would a foreign one.
#[test]
fn an_engine_that_cannot_load_its_libtorch_is_named_with_the_version() {
    let dir = temp_dir("gpu-loader");
    std::fs::write(dir.join("libtorch_cpu.so"), b"").unwrap();
    let out = dir.join("out");
    let o = output(
        common::process::miles().env("LD_LIBRARY_PATH", &dir).args([
            "run",
            "recipes/grpo-laptop.miles",
            "--out",
            out.to_str().unwrap(),
            "--progress",
            "off",
        ]),
        Duration::from_secs(120),
    );
    let t = text(&o);
    assert_eq!(o.status.code(), Some(127), "{t}");
    assert!(t.contains("E0508"), "{t}");
    assert!(t.contains(&format!("libtorch {}", env!("MILES_TORCH_VERSION"))), "{t}");
    assert!(!env!("MILES_TORCH_VERSION").starts_with("unknown"), "build.rs read the linked version");
}
