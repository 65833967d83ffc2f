//! The distributed run under a real Slurm: `launcher = slurm { ... }` submits one job with an
//! `srun` step per worker; the run learns exactly as in-process. Needs the single-node test
//! cluster of scripts/start-test-slurm.sh; skipped (with the reason printed) when it is absent.

use std::path::PathBuf;
use std::process::Command;

fn slurm_ready() -> Result<(), String> {
    let o = Command::new("sinfo").args(["-h", "-o", "%t"]).output().map_err(|e| format!("no sinfo ({e})"))?;
    let s = String::from_utf8_lossy(&o.stdout);
    if !o.status.success() || !s.lines().any(|l| matches!(l.trim(), "idle" | "mix")) {
        return Err(format!("no idle Slurm node (sinfo: {:?})", s.trim()));
    }
    Ok(())
}

const RECIPE: &str = r#"
import std/tasks/arith
model policy = transformer { layers = 1, d_model = 32, heads = 2, vocab = arith.vocab, max_len = 12 }
cluster laptop = local { cpus = 2 }
recipe tiny on laptop {
    launcher = LAUNCHER
    warmup = sft(policy) { data = arith.addition { digits = 1 }, steps = 30.steps, lr = 3e-3 }
    rollout = generate(warmup) {
        prompts = arith.addition { digits = 1, split = train }
        samples_per_prompt = 4
        max_prompt_tokens = 6.tokens
        max_new_tokens = 3.tokens
    }
    reward = exact_match(rollout)
    train = grpo(rollout, reward) { rollout_batch = 8, global_batch = 32, micro_batch = 32, lr = 1e-3 }
    sync = weights(train -> rollout) { transport = TRANSPORT, bucket = 1.MB }
    eval = evaluate(rollout) { prompts = arith.addition { digits = 1, split = test }, every = 2.steps, limit = 20 }
    stop = 4.steps
}
"#;

fn metrics(out: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            v.as_object_mut().unwrap().retain(|k, _| !k.starts_with("perf/"));
            v
        })
        .collect()
}

#[test]
fn grpo_under_slurm_learns_as_in_process() {
    if let Err(why) = slurm_ready() {
        println!("skipped: {why}; start one with `bash scripts/start-test-slurm.sh`");
        return;
    }
    let dir: PathBuf = std::env::temp_dir().join(format!("miles-slurm-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut outs = Vec::new();
    for (name, launcher, transport) in [
        ("inproc", "in_process", "local"),
        ("slurm", "slurm { partition = \"debug\", gpus_per_engine = 1, start_timeout = 60 }", "broadcast"),
    ] {
        let r = dir.join(format!("{name}.miles"));
        std::fs::write(&r, RECIPE.replace("LAUNCHER", launcher).replace("TRANSPORT", transport)).unwrap();
        let out = dir.join(name);
        let o = Command::new(env!("CARGO_BIN_EXE_miles"))
            .args(["run", r.to_str().unwrap(), "--out", out.to_str().unwrap(), "--threads", "1", "--progress", "off"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{name}: {err}");
        if name == "slurm" {
            assert!(err.contains("submitted Slurm job"), "{err}");
            let script = std::fs::read_to_string(out.join("job.sbatch")).unwrap();
            assert_eq!(script.matches("srun ").count(), 2, "{script}");
            let log = std::fs::read_to_string(out.join("workers/rollout-0.log")).unwrap();
            assert!(log.contains("CUDA_VISIBLE_DEVICES="), "--gres gave the engine a GPU: {log}");
        }
        outs.push(out);
    }
    assert_eq!(metrics(&outs[0]), metrics(&outs[1]));
    let _ = std::fs::remove_dir_all(&dir);
}
