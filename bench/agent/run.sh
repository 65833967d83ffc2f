#!/usr/bin/env bash
# recipes/agent-laptop.miles over seeds 1-3, then the table of bench/RESULTS.md ("Agentic").
# Usage: bash bench/agent/run.sh [MILES_BINARY] [OUT_ROOT] [--set K=V ...]
#   (default: target/release/miles, runs/agent-bench). Extra `--set` arguments reach every run,
#   e.g. the asynchronous variant: bash bench/agent/run.sh "" runs/agent-async \
#        --set 'schedule=fully_async { max_staleness = 1, max_concurrent = 64 }'
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
MILES="${1:-$ROOT/target/release/miles}"
OUT="${2:-$ROOT/runs/agent-bench}"
shift $(( $# < 2 ? $# : 2 ))
mkdir -p "$OUT"
for seed in 1 2 3; do
    rm -rf "$OUT/s$seed"
    start=$(date +%s.%N)
    "$MILES" run "$ROOT/recipes/agent-laptop.miles" --out "$OUT/s$seed" --threads 2 --set "seed=$seed" "$@" \
        >"$OUT/s$seed.log" 2>&1
    echo "$(date +%s.%N) - $start" | bc >"$OUT/s$seed.wall"
done
python3 "$ROOT/bench/agent/summary.py" "$OUT"/s1 "$OUT"/s2 "$OUT"/s3
