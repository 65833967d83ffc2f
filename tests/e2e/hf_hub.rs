//! Models and adapters named the way Hugging Face users name them, through the built binary:
//! `hf { repo }` from a Hub cache built here with real symbolic links (refs/main, snapshots/ ->
//! blobs/, the llama fixture's four shards) checks, plans and runs with `HF_HUB_CACHE` (or
//! `HF_HOME`) set, and a missing repository, a missing ref and a dangling link are each a check
//! error saying so; `lora { init }` continues the PEFT fixture's adapter (tests/fixtures/peft/llama-r4)
//! from its first step, and an adapter of another rank or for another base is refused at check time.

use crate::common;

use crate::hf_recipe::{parquet_recipe, PROMPTS};
use common::metrics::{json_file, rows};
use common::process::{miles, output, temp_dir, text};
use common::workers::f32_tensors as tensors;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(300);
const HASH: &str = "3f5bd3c5f1e2a9a0b8e7d6c5b4a3928170615243";
/// The variables huggingface_hub reads, cleared so the machine's own cache plays no part.
const HUB_VARS: [&str; 4] = ["HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"];

/// The command's text with the renderer's line wrapping undone (its margins and breaks), so a
/// message is searched as one line.
fn flat(o: &std::process::Output) -> String {
    text(o).replace(['│', '·'], " ").split_whitespace().collect::<Vec<_>>().join(" ")
}

fn run(args: &[&str], env: &[(&str, &Path)]) -> std::process::Output {
    let mut c = miles();
    for v in HUB_VARS {
        c.env_remove(v);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    let opts: &[&str] = if args[0] == "run" { &["--threads", "1", "--progress", "off"] } else { &[] };
    output(c.args(args).args(opts), LIMIT)
}

/// `root/models--tiny--llama` as `hf download tiny/llama` leaves it: each file of the llama
/// fixture a blob named by its content hash, linked from the snapshot; refs/main says the commit.
/// Returns the blob behind `file`.
fn build_cache(root: &Path) -> HashMap<String, PathBuf> {
    let repo = root.join("models--tiny--llama");
    let snap = repo.join("snapshots").join(HASH);
    for d in [repo.join("refs"), repo.join("blobs"), snap.clone()] {
        std::fs::create_dir_all(d).unwrap();
    }
    std::fs::write(repo.join("refs/main"), HASH).unwrap();
    let mut blobs = HashMap::new();
    let src = Path::new("tests/fixtures/hf/llama");
    for e in std::fs::read_dir(src).unwrap().flatten().filter(|e| e.path().is_file()) {
        let name = e.file_name().to_string_lossy().to_string();
        let bytes = std::fs::read(e.path()).unwrap();
        let blob = format!("{:016x}", miles_compiler::fs::fnv1a64([bytes.as_slice()]));
        std::fs::write(repo.join("blobs").join(&blob), &bytes).unwrap();
        std::os::unix::fs::symlink(format!("../../blobs/{blob}"), snap.join(&name)).unwrap();
        blobs.insert(name, repo.join("blobs").join(blob));
    }
    blobs
}

fn recipe(dir: &Path, name: &str, model: &str, lora: &str, lr: &str) -> PathBuf {
    let p = dir.join(format!("{name}.miles"));
    std::fs::write(&p, parquet_recipe(model, PROMPTS, &[], &format!("lr = {lr}{lora}"), &[], 1)).unwrap();
    p
}

#[test]
fn a_model_from_the_hub_cache_checks_plans_and_runs() {
    let d = temp_dir("hf-hub");
    let cache = d.join("home/hub");
    let blobs = build_cache(&cache);
    let hub: &[(&str, &Path)] = &[("HF_HUB_CACHE", &cache)];
    let r = recipe(&d, "hub", r#"hf { repo = "tiny/llama" }"#, "", "1e-3");
    let path = r.to_str().unwrap();
    let o = run(&["check", path], hub);
    assert!(o.status.success(), "{}", text(&o));
    // HF_HOME/hub is the same cache.
    let o = run(&["check", path], &[("HF_HOME", &d.join("home"))]);
    assert!(o.status.success(), "{}", text(&o));
    let o = run(&["plan", path], hub);
    assert!(o.status.success(), "{}", text(&o));
    // The model line names the snapshot's config.json it read.
    assert!(flat(&o).contains(&format!("models--tiny--llama/snapshots/{HASH}/config.json")), "{}", text(&o));

    let out = d.join("run");
    let o = run(&["run", path, "--out", out.to_str().unwrap()], hub);
    assert!(o.status.success(), "{}", text(&o));
    let spec = json_file(&out.join("spec.json"));
    let snap = cache.join(format!("models--tiny--llama/snapshots/{HASH}"));
    assert_eq!(spec["hf"]["path"], snap.to_str().unwrap(), "the run loads the snapshot");
    let last = rows(&out).pop().unwrap();
    assert_eq!(last["step"], 1, "{last}");
    // The export is real files, the config the one read through the links.
    assert_eq!(json_file(&out.join("model/config.json"))["architectures"][0], "LlamaForCausalLM");
    assert!(!out.join("model/config.json").is_symlink());

    // Not in the cache, not at this revision, not whole: each says so, and how to download.
    let missing = recipe(&d, "missing", r#"hf { repo = "tiny/nope" }"#, "", "1e-3");
    let o = run(&["check", missing.to_str().unwrap()], hub);
    assert!(!o.status.success());
    let t = flat(&o);
    assert!(t.contains("E0215") && t.contains("`tiny/nope` is not in the Hugging Face cache"), "{t}");
    assert!(t.contains("models--tiny--nope") && t.contains("hf download tiny/nope"), "{t}");
    let rev = recipe(&d, "rev", r#"hf { repo = "tiny/llama", revision = "v2" }"#, "", "1e-3");
    let t = flat(&run(&["check", rev.to_str().unwrap()], hub));
    assert!(t.contains("has no revision \"v2\"") && t.contains("refs: main"), "{t}");
    assert!(t.contains("hf download tiny/llama --revision v2"), "{t}");
    let shard = "model-00003-of-00004.safetensors";
    std::fs::remove_file(&blobs[shard]).unwrap();
    let o = run(&["check", path], hub);
    assert!(!o.status.success());
    let t = flat(&o);
    assert!(t.contains(&format!("{shard} is a link to ../../blobs/")) && t.contains("interrupted download"), "{t}");
    let _ = std::fs::remove_dir_all(&d);
}

/// The first training step's mean |log-prob of the trainer - of the engine that sampled|.
fn logp_diff(out: &Path) -> f64 {
    let rows = rows(out);
    let row = rows.iter().find(|r| r["step"] == 1).unwrap_or_else(|| panic!("no step 1: {rows:?}"));
    row["train/logp_diff"].as_f64().unwrap_or_else(|| panic!("no train/logp_diff: {row}"))
}

#[test]
fn lora_init_continues_a_peft_adapter() {
    let d = temp_dir("lora-init");
    let llama = r#"hf { path = "tests/fixtures/hf/llama" }"#;
    let init = r#", lora = lora { init = "tests/fixtures/peft/llama-r4" }"#;
    let fixture = Path::new("tests/fixtures/peft/llama-r4");
    let file = tensors(&fixture.join("adapter_model.safetensors"));

    // lr 0: one step changes nothing, so the export is the start: PEFT's adapter, and the
    // merged model PEFT's merge_and_unload of base + adapter. The engine sampled that policy
    // too: its log-probs are the trainer's (fp32 both, ~3e-7 apart; not a base-only engine's).
    let r = recipe(&d, "still", llama, init, "0.0");
    let out = d.join("still");
    let o = run(&["run", r.to_str().unwrap(), "--out", out.to_str().unwrap()], &[]);
    assert!(o.status.success(), "{}", text(&o));
    let spec = json_file(&out.join("spec.json"));
    assert_eq!(spec["train"]["lora"]["init"], "tests/fixtures/peft/llama-r4");
    assert_eq!((spec["train"]["lora"]["rank"].as_u64(), spec["train"]["lora"]["alpha"].as_f64()), (Some(4), Some(8.0)));
    assert!(logp_diff(&out) < 1e-4, "engine and trainer disagree: {}", logp_diff(&out));
    assert_eq!(tensors(&out.join("model/adapter/adapter_model.safetensors")), file);
    let merged = tensors(&out.join("model/model.safetensors"));
    let want = tensors(&fixture.join("reference/merged.safetensors"));
    assert!(!want.is_empty());
    for (name, w) in &want {
        let got = merged.get(name).unwrap_or_else(|| panic!("{name} not exported"));
        let err = got.iter().zip(w).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(err < 1e-5, "{name}: the merged start differs from PEFT's by {err}");
    }

    // Training continues from the file's A and B, engines and trainer in step.
    let r = recipe(&d, "train", llama, init, "1e-2");
    let out = d.join("train");
    let o = run(&["run", r.to_str().unwrap(), "--out", out.to_str().unwrap()], &[]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(logp_diff(&out) < 1e-4, "{}", logp_diff(&out));
    let trained = tensors(&out.join("model/adapter/adapter_model.safetensors"));
    assert_eq!(trained.len(), file.len());
    let moved = trained.iter().filter(|(n, t)| **t != file[*n]).count();
    assert!(moved > 0, "no adapter tensor trained");

    // In worker processes (a trainer and an engine, each attaching the adapter from the
    // directory, weights broadcast): the same training, bit for bit.
    let text_in = std::fs::read_to_string(&r).unwrap();
    let w = d.join("workers.miles");
    std::fs::write(
        &w,
        text_in
            .replace("transport = local", "transport = broadcast")
            .replace("    stop   = 1.steps", "    launcher = local_processes { engines = 1 }\n    stop   = 1.steps"),
    )
    .unwrap();
    let out_w = d.join("workers");
    let o = run(&["run", w.to_str().unwrap(), "--out", out_w.to_str().unwrap()], &[]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(tensors(&out_w.join("model/adapter/adapter_model.safetensors")), trained, "workers trained otherwise");

    // Another rank than the file's, and an adapter for another base: refused by `miles check`.
    let r = recipe(&d, "rank", llama, r#", lora = lora { init = "tests/fixtures/peft/llama-r4", rank = 8 }"#, "1e-3");
    let t = flat(&run(&["check", r.to_str().unwrap()], &[]));
    assert!(t.contains("E0301") && t.contains("`rank` differs from the `r`"), "{t}");
    let r = recipe(&d, "base", r#"hf { path = "tests/fixtures/hf/qwen3" }"#, init, "1e-3");
    let o = run(&["check", r.to_str().unwrap()], &[]);
    assert!(!o.status.success());
    let t = flat(&o);
    assert!(t.contains("E0301") && t.contains("does not fit the model"), "{t}");
    // The qwen3 fixture's heads are 24 wide, the llama adapter's 16.
    assert!(t.contains("self_attn.k_proj.lora_B.weight has shape [32, 4], the model's k_proj needs [48, 4]"), "{t}");
    let _ = std::fs::remove_dir_all(&d);
}
