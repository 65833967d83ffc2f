#!/usr/bin/env bash
# AdamW's time per optimizer step (perf/optimizer_s) of two builds of miles, A/B in one run:
# the 10M-parameter bf16 peer recipe for 10 steps, one libtorch thread, seeds 1-3, the builds
# alternating so the machine's noise falls on both alike. Prints the median per run (the first
# step left out: allocations).
#   bash bench/tch/adamw-ab.sh OLD_BIN_DIR NEW_BIN_DIR   (each holding miles and miles-engine)
set -euo pipefail
old=$1 new=$2
cd "$(dirname "$0")/../.."
for seed in 1 2 3; do
    for side in old new; do
        dir=$([[ $side == old ]] && echo "$old" || echo "$new")
        out=$(mktemp -d)
        "$dir/miles" run recipes/compare-trl-10m-bf16.miles --set stop=10.steps --set seed=$seed \
            --threads 1 --out "$out/run" --progress off > /dev/null
        python3 - "$out/run/metrics.jsonl" "$side" "$seed" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
opt = [r["perf/optimizer_s"] for r in rows if "perf/optimizer_s" in r][1:]
step = [r["perf/step_s"] for r in rows if "perf/step_s" in r][1:]
print(f"{sys.argv[2]} seed {sys.argv[3]}: optimizer {statistics.median(opt) * 1e3:.1f} ms, step {statistics.median(step) * 1e3:.0f} ms")
PY
        rm -rf "$out"
    done
done
