#!/usr/bin/env bash
# LoRA against full fine-tuning on the laptop task (bench/RESULTS.md, "LoRA"):
#  1. recipes/grpo-laptop.miles (full) and recipes/lora-laptop.miles over seeds 1-3, interleaved
#     so machine noise falls on both alike: held-out accuracy, wall time, trainer step time, peak
#     RSS, bytes per weight update;
#  2. bytes per weight update on a 1.6M-parameter variant (d_model 256, d_ff 768) for 5 steps,
#     full against rank-8 LoRA on the default targets (q, k, v, o) and on every linear layer.
# Usage: bash bench/lora/run.sh [MILES_BINARY] [OUT_ROOT]   (default: target/release/miles, runs/lora-bench)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
MILES="${1:-$ROOT/target/release/miles}"
OUT="${2:-$ROOT/runs/lora-bench}"
mkdir -p "$OUT"
run() { # name recipe seed [--set ...]
    local name=$1 recipe=$2 seed=$3
    shift 3
    rm -rf "$OUT/$name"
    local start
    start=$(date +%s.%N)
    "$MILES" run "$ROOT/recipes/$recipe" --out "$OUT/$name" --threads 1 --progress off --set "seed=$seed" "$@" \
        >"$OUT/$name.log" 2>&1
    echo "$(date +%s.%N) - $start" | bc >"$OUT/$name.wall"
}
for seed in 1 2 3; do
    run "full-s$seed" grpo-laptop.miles "$seed"
    run "lora-s$seed" lora-laptop.miles "$seed"
done
WIDE=(--set 'policy.d_model=256' --set 'policy.d_ff=768' --set 'stop=5.steps')
run wide-full grpo-laptop.miles 1 "${WIDE[@]}"
run wide-lora-qkvo lora-laptop.miles 1 "${WIDE[@]}" --set 'train.lora=lora { rank = 8, alpha = 16.0 }'
run wide-lora-all lora-laptop.miles 1 "${WIDE[@]}"
python3 "$ROOT/bench/lora/summary.py" "$OUT"
