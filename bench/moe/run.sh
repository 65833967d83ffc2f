#!/usr/bin/env bash
# MoE and R3 on the laptop task (bench/RESULTS.md, "MoE and R3"): recipes/moe-r3-laptop.miles (a
# bf16 engine against the fp32 trainer) with R3 off/on x TIS off/on, seeds 1-3, one run at a time,
# one libtorch thread, under the sync schedule and under fully_async. Routing is recorded in every
# run (`record_routing = true`), so the route mismatch is measured with R3 off as well.
# Usage: bash bench/moe/run.sh [MILES_BINARY] [OUT_ROOT] [SCHEDULES]
#   (defaults: target/release/miles, runs/moe-bench, "sync fully_async")
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
MILES="${1:-$ROOT/target/release/miles}"
OUT="${2:-$ROOT/runs/moe-bench}"
SCHEDULES="${3:-sync fully_async}"
mkdir -p "$OUT"
for sched in $SCHEDULES; do
    for seed in 1 2 3; do
        for r3 in false true; do
            for tis in off on; do
                name="$sched-r3$r3-tis$tis-s$seed"
                args=(--set "seed=$seed" --set "rollout.routing_replay=$r3" --set "rollout.record_routing=true")
                [ "$tis" = on ] && args+=(--set "train.tis=2.0")
                [ "$sched" = fully_async ] && args+=(--set "schedule=fully_async {}")
                rm -rf "$OUT/$name"
                "$MILES" run "$ROOT/recipes/moe-r3-laptop.miles" --out "$OUT/$name" --threads 1 --progress off \
                    "${args[@]}" >"$OUT/$name.log" 2>&1
            done
        done
    done
done
python3 "$ROOT/bench/moe/table.py" "$OUT" $SCHEDULES
