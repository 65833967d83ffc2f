//! LoRA through the built binary: a recipe with `lora` checks, plans, trains adapters whose
//! updates are the adapter bytes alone, writes the merged model with its PEFT adapter and base,
//! and resumes exactly after kill -9; in worker processes it trains bit-identically to in-process
//! over every transport.

use crate::common;

use common::process::{miles, output, temp_dir, text, Proc};
use common::tiny::{tiny_recipe, EVAL};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(300);
const LORA: &str = "train.lora = lora { rank = 4, alpha = 8.0, target_modules = [q_proj, v_proj, down_proj] }";

fn recipe(dir: &Path, name: &str, sync: &str, steps: u32, extra: &[&str]) -> PathBuf {
    let p = dir.join(format!("{name}.miles"));
    let mut lines = vec![EVAL, "ckpt = checkpoint(train) { every = 2.steps, keep = 3 }"];
    lines.extend_from_slice(extra);
    // The dotted amendment goes after the recipe, as a variant of it.
    let text = tiny_recipe(sync, steps, &lines) + "recipe tiny_lora extends tiny {\n    " + LORA + "\n}\n";
    std::fs::write(&p, text).unwrap();
    p
}

fn run(args: &[&str]) -> std::process::Output {
    let opts: &[&str] = if args[0] == "run" { &["--threads", "1", "--progress", "off"] } else { &[] };
    output(miles().args(args).args(opts), LIMIT)
}

use common::metrics::{rows as metrics, without_perf};

/// Bytes of the tiny model's rank-4 adapters on q, v and down (d_model 32, 2 heads of 16, d_ff
/// 4 x 32 = 128 by default, 1 layer): A 4x32 + B 32x4, A 4x32 + B 32x4 (kv = heads), A 4x128 + B 32x4.
fn adapter_bytes() -> u64 {
    ((4 * 32 + 32 * 4) * 2 + 4 * 128 + 32 * 4) * 4
}

#[test]
fn lora_recipe_runs_exports_peft_and_resumes() {
    let dir = temp_dir("lora-run");
    let r = recipe(&dir, "tiny", "transport = local", 20, &[]);
    let path = r.to_str().unwrap();
    let o = run(&["check", path]);
    assert!(o.status.success(), "{}", text(&o));
    let o = run(&["plan", path, "--recipe", "tiny_lora"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("frozen base") && text(&o).contains("adapters only"), "{}", text(&o));

    let full = dir.join("full");
    let o = run(&["run", path, "--recipe", "tiny_lora", "--out", full.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let rows = metrics(&full);
    let sync: Vec<u64> = rows.iter().filter_map(|r| r["perf/sync_bytes"].as_u64()).collect();
    assert_eq!(sync.len(), 20);
    assert!(sync.iter().all(|&b| b == adapter_bytes()), "every update is the adapters alone: {sync:?}");
    let model = full.join("model");
    for f in ["model.safetensors", "config.json", "adapter/adapter_config.json", "adapter/adapter_model.safetensors"] {
        assert!(model.join(f).exists(), "{f}");
    }
    assert!(model.join("base/model.safetensors").exists() && model.join("base/tokenizer.json").exists());
    let cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(model.join("adapter/adapter_config.json")).unwrap()).unwrap();
    assert_eq!((cfg["peft_type"].as_str(), cfg["r"].as_u64()), (Some("LORA"), Some(4)));
    assert_eq!(cfg["target_modules"], serde_json::json!(["q_proj", "v_proj", "down_proj"]));

    // kill -9 mid-run, then --resume: the same metrics and the same adapters as the run above.
    let cut = dir.join("cut");
    let mut child = Proc::spawn(
        miles()
            .args(["run", path, "--recipe", "tiny_lora", "--out", cut.to_str().unwrap()])
            .args(["--threads", "1", "--progress", "off"])
            .stdin(Stdio::null())
            .stderr(Stdio::piped()),
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    while !cut.join("checkpoints/step-00000004").exists() {
        assert!(!child.exited(), "the run ended before its step-4 checkpoint");
        assert!(Instant::now() < deadline, "no step-4 checkpoint within 120 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: kill(2) on the process group of the run this test started.
    unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
    let _ = child.wait(LIMIT);
    assert!(!cut.join("model").exists(), "the kill came after the run had finished");
    let o = run(&["run", path, "--recipe", "tiny_lora", "--out", cut.to_str().unwrap(), "--resume"]);
    assert!(o.status.success(), "{}", text(&o));
    let (a, b) = (without_perf(metrics(&full)), without_perf(metrics(&cut)));
    // The resumed run logged some steps twice (before the kill and again); the last row of each
    // step is the one that counts.
    let last = |rows: &[Value], step: u64| rows.iter().rev().find(|r| r["step"].as_u64() == Some(step)).cloned();
    for s in 0..=20 {
        assert_eq!(last(&a, s), last(&b, s), "step {s}");
    }
    let read = |d: &Path| std::fs::read(d.join("model/adapter/adapter_model.safetensors")).unwrap();
    assert_eq!(read(&full), read(&cut), "the resumed run's adapters are the uninterrupted run's, byte for byte");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn lora_in_worker_processes_trains_bit_identically_to_in_process() {
    let dir = temp_dir("lora-workers");
    let a = recipe(&dir, "a", "transport = local", 4, &[]);
    let out_a = dir.join("a");
    let o = run(&["run", a.to_str().unwrap(), "--recipe", "tiny_lora", "--out", out_a.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    for transport in ["broadcast", "p2p", "disk_delta"] {
        let sync = format!("transport = {transport}, bucket = 1.MB");
        let b = recipe(&dir, transport, &sync, 4, &["launcher = local_processes { engines = 1 }"]);
        let out_b = dir.join(format!("out-{transport}"));
        let o = run(&["run", b.to_str().unwrap(), "--recipe", "tiny_lora", "--out", out_b.to_str().unwrap()]);
        assert!(o.status.success(), "{transport}: {}", text(&o));
        assert_eq!(without_perf(metrics(&out_a)), without_perf(metrics(&out_b)), "{transport}: metrics differ");
        let bytes: Vec<u64> = metrics(&out_b).iter().filter_map(|r| r["perf/sync_bytes"].as_u64()).collect();
        assert!(bytes.iter().all(|&b| b == adapter_bytes()), "{transport}: {bytes:?}");
        let read = |d: &Path| std::fs::read(d.join("model/adapter/adapter_model.safetensors")).unwrap();
        assert_eq!(read(&out_a), read(&out_b), "{transport}: adapters differ");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

const TWO: &str = "train.lora = lora {
        rank = 4, alpha = 8.0, target_modules = [q_proj, v_proj], adapters = 2,
        named = [
            adapter { name = \"add\", prompts = arith.addition { digits = 1 } },
            adapter { name = \"mul\", prompts = arith.multiplication { digits = 1 }, lr = 3e-3, partial_credit = true },
        ]
    }";

fn two_adapter_recipe(dir: &Path, extra: &str) -> PathBuf {
    let p = dir.join("two.miles");
    let text = tiny_recipe("transport = local", 4, &[EVAL])
        + "recipe tiny_two extends tiny {\n    "
        + TWO
        + "\n    "
        + extra
        + "\n}\n";
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn a_multi_lora_recipe_runs_each_adapter_on_its_own_task() {
    let dir = temp_dir("lora-two");
    let r = two_adapter_recipe(&dir, "");
    let path = r.to_str().unwrap();
    let o = run(&["plan", path, "--recipe", "tiny_two"]);
    assert!(o.status.success() && text(&o).contains("2 adapters"), "{}", text(&o));
    let out = dir.join("out");
    let o = run(&["run", path, "--recipe", "tiny_two", "--out", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let rows = metrics(&out);
    let first_eval = rows.iter().find(|r| r["eval/accuracy"].is_number()).unwrap();
    assert_eq!(first_eval["step"], 0);
    let rl: Vec<&Value> = rows.iter().filter(|r| r["rollout/reward_mean"].is_number()).collect();
    assert_eq!(rl.len(), 4);
    for name in ["add", "mul"] {
        assert!(first_eval[format!("lora/{name}/eval/accuracy")].is_number(), "step 0 evaluates every adapter");
        for r in &rl {
            for k in ["reward_mean", "loss", "grad_norm", "lr"] {
                assert!(r[format!("lora/{name}/{k}")].is_number(), "step {}: lora/{name}/{k}", r["step"]);
            }
        }
    }
    // Each adapter its own learning rate: `mul` says 3e-3, `add` takes the trainer's 1e-3.
    assert_eq!(rl[0]["lora/mul/lr"].as_f64(), Some(3e-3));
    assert_eq!(rl[0]["lora/add/lr"].as_f64(), Some(1e-3));
    // One update carries both adapters.
    let sync: Vec<u64> = rows.iter().filter_map(|r| r["perf/sync_bytes"].as_u64()).collect();
    let per = ((4 * 32 + 32 * 4) * 2 * 4) as u64;
    assert!(sync.iter().all(|&b| b == 2 * per), "{sync:?}");
    for name in ["add", "mul"] {
        assert!(out.join("model/adapters").join(name).join("adapter_model.safetensors").exists(), "{name}");
    }
    assert!(out.join("model/model.safetensors").exists(), "the base");
    // Where it cannot run: worker processes and the asynchronous schedules, named at check time.
    for (extra, why) in [
        ("launcher = local_processes { engines = 1 }", "trains one adapter"),
        ("schedule = one_step_off", "under the `sync` schedule"),
    ] {
        let r = two_adapter_recipe(&dir, extra);
        let o = run(&["check", r.to_str().unwrap()]);
        assert!(!o.status.success() && text(&o).contains("E0511") && text(&o).contains(why), "{extra}: {}", text(&o));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn lora_under_fully_async_syncs_adapters_only() {
    let dir = temp_dir("lora-async");
    let r = recipe(&dir, "tiny", "transport = local", 4, &["schedule = fully_async { max_staleness = 1 }"]);
    let out = dir.join("out");
    let o = run(&["run", r.to_str().unwrap(), "--recipe", "tiny_lora", "--out", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let rows = metrics(&out);
    let sync: Vec<u64> = rows.iter().filter_map(|r| r["perf/sync_bytes"].as_u64()).collect();
    assert!(!sync.is_empty() && sync.iter().all(|&b| b == adapter_bytes()), "{sync:?}");
    assert!(out.join("model/adapter/adapter_model.safetensors").exists());
    let _ = std::fs::remove_dir_all(&dir);
}
