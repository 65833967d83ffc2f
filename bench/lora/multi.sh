#!/usr/bin/env bash
# Multi-LoRA on the laptop task (bench/RESULTS.md, "Multi-LoRA"): recipes/multi-lora-laptop.miles
# over seeds 1-3 (two runs at a time, one libtorch thread each), each adapter's held-out accuracy
# on its own task; then seed 1 again with the `sort` adapter's learning rate changed, to show the
# `reverse` adapter's run does not depend on it.
# Usage: bash bench/lora/multi.sh [MILES_BINARY] [OUT_ROOT]   (default: target/release/miles, runs/multi-lora-bench)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
MILES="${1:-$ROOT/target/release/miles}"
OUT="${2:-$ROOT/runs/multi-lora-bench}"
mkdir -p "$OUT"
run() { # name seed [--set ...]
    local name=$1 seed=$2
    shift 2
    rm -rf "$OUT/$name"
    "$MILES" run "$ROOT/recipes/multi-lora-laptop.miles" --out "$OUT/$name" --threads 1 --progress off \
        --set "seed=$seed" "$@" >"$OUT/$name.log" 2>&1
}
run s1 1 & run s2 2 & wait
SORT_LR='train.lora.named=[adapter { name = "reverse", prompts = strings.reverse { min_len = 3, max_len = 6, split_seed = 7 } }, adapter { name = "sort", prompts = strings.sort { min_len = 3, max_len = 6, split_seed = 7 }, partial_credit = true, lr = 5e-4 }]'
run s3 3 & run s1-sort-lr 1 --set "$SORT_LR" & wait
python3 "$ROOT/bench/lora/multi_summary.py" "$OUT"
