#!/usr/bin/env bash
# Hugging Face MoE out and back in (bench/RESULTS.md, "Hugging Face in and out"): the seeded MoE of
# recipes/moe-r3-laptop.miles after a short SFT warm-up (25 steps instead of 100, then one RL step, so that RL has room) is exported as transformers'
# qwen3_moe, then bench/moe/recipes/grpo-qwen3-moe.miles loads that directory as `hf` and trains it
# with R3 on fresh seeds 4-6. Usage: bash bench/moe/hf.sh [MILES_BINARY]   (runs/moe-hf)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
MILES="${1:-target/release/miles}"
mkdir -p runs/moe-hf
rm -rf runs/moe-hf/init
"$MILES" run recipes/moe-r3-laptop.miles --out runs/moe-hf/init --threads 1 --progress off --set "stop=1.steps" --set "warmup.steps=25.steps" --set "warmup.warmup=5.steps" \
    > runs/moe-hf/init.log 2>&1
for seed in 4 5 6; do
    rm -rf "runs/moe-hf/s$seed"
    "$MILES" run bench/moe/recipes/grpo-qwen3-moe.miles --out "runs/moe-hf/s$seed" --threads 1 --progress off \
        --set "seed=$seed" > "runs/moe-hf/s$seed.log" 2>&1
done
python3 - <<'PY'
import json
for s in (4, 5, 6):
    rows = [json.loads(l) for l in open(f"runs/moe-hf/s{s}/metrics.jsonl")]
    ev = [(r["step"], r["eval/accuracy"]) for r in rows if "eval/accuracy" in r]
    tr = [r for r in rows if "r3/route_mismatch" in r]
    mm = sum(r["r3/route_mismatch"] for r in tr) / len(tr)
    print(f"seed {s}: held-out accuracy " + ", ".join(f"step {a}: {100*b:.1f}%" for a, b in ev) + f"; route mismatch {100*mm:.3f}%")
PY
