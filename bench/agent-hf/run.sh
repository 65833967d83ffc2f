#!/usr/bin/env bash
# recipes/agent-hf-laptop.miles over seeds 1-3, then the table of bench/RESULTS.md ("Agentic,
# Hugging Face chat model").
# Usage: bash bench/agent-hf/run.sh [MILES_BINARY] [OUT_ROOT] [--set K=V ...]
#   (default: target/release/miles, runs/agent-hf-bench). Extra `--set` arguments reach every run.
# Environment: SEEDS (default "1 2 3"); PARALLEL=1 (default) runs the seeds at once, one thread
# each (on 2 cores the three runs share them); PARALLEL=0 runs them one after another.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
MILES="${1:-$ROOT/target/release/miles}"
OUT="${2:-$ROOT/runs/agent-hf-bench}"
shift $(( $# < 2 ? $# : 2 ))
SEEDS="${SEEDS:-1 2 3}"
PARALLEL="${PARALLEL:-1}"
[ -x "$MILES" ] || { echo "no miles binary at $MILES (cargo build --release --locked --bins)" >&2; exit 2; }
mkdir -p "$OUT"
one() {
    local seed=$1 start
    shift
    rm -rf "$OUT/s$seed"
    start=$(date +%s.%N)
    # The run's own exit status decides; the wall time is written either way.
    local rc=0
    "$MILES" run "$ROOT/recipes/agent-hf-laptop.miles" --out "$OUT/s$seed" --threads 1 --set "seed=$seed" "$@" \
        >"$OUT/s$seed.log" 2>&1 || rc=$?
    echo "$(date +%s.%N) - $start" | bc >"$OUT/s$seed.wall"
    [ "$rc" -eq 0 ] || echo "seed $seed failed (exit $rc): see $OUT/s$seed.log" >&2
    return "$rc"
}
date -u +"start %Y-%m-%d %H:%M:%S UTC, load $(cut -d' ' -f1-3 /proc/loadavg)" | tee "$OUT/when"
pids=()
dirs=()
for seed in $SEEDS; do
    dirs+=("$OUT/s$seed")
    if [ "$PARALLEL" = 1 ]; then
        one "$seed" "$@" &
        pids+=($!)
    else
        one "$seed" "$@"
    fi
done
failed=0
for p in "${pids[@]}"; do wait "$p" || failed=1; done
date -u +"end %Y-%m-%d %H:%M:%S UTC, load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/when"
[ "$failed" = 0 ] || exit 1
python3 "$ROOT/bench/agent-hf/summary.py" "${dirs[@]}"
