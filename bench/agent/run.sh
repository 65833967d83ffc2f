#!/usr/bin/env bash
# recipes/agent-laptop.miles over seeds 1-3, then the table of bench/RESULTS.md ("Agentic").
# Usage: bash bench/agent/run.sh [MILES_BINARY] [OUT_ROOT]   (default: target/release/miles, runs/agent-bench)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
MILES="${1:-$ROOT/target/release/miles}"
OUT="${2:-$ROOT/runs/agent-bench}"
mkdir -p "$OUT"
for seed in 1 2 3; do
    rm -rf "$OUT/s$seed"
    start=$(date +%s.%N)
    "$MILES" run "$ROOT/recipes/agent-laptop.miles" --out "$OUT/s$seed" --threads 2 --set "seed=$seed" >"$OUT/s$seed.log" 2>&1
    echo "$(date +%s.%N) - $start" | bc >"$OUT/s$seed.wall"
done
python3 "$ROOT/bench/agent/summary.py" "$OUT"/s1 "$OUT"/s2 "$OUT"/s3
