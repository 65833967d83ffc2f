#!/usr/bin/env bash
# The laptop GRPO recipe (recipes/grpo-laptop.miles) under each schedule, one after the other on
# the embedded backend with one libtorch thread per side: held-out accuracy at the RL start and
# the end, wall time, median step, and the async metrics. Output in bench/out/async/.
#
#   bash bench/async/laptop.sh [MILES_BINARY]      (default: target/release/miles, built first;
#                                                   `miles run` starts miles-engine beside it)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
miles="${1:-}"
if [[ -z "$miles" ]]; then
    cargo build --release --bins
    miles="${CARGO_TARGET_DIR:-target}/release/miles"
fi
out=bench/out/async
mkdir -p "$out"
# name | recipe | --set | --set (seed 2: the recipe with `seed = 2`)
sed 's/^    seed = 1$/    seed = 2/' recipes/grpo-laptop.miles > "$out/grpo-laptop-seed2.miles"
runs=(
    "sync|recipes/grpo-laptop.miles|schedule=sync|train.tis=none"
    "fully_async|recipes/grpo-laptop.miles|schedule=fully_async { max_staleness = 2 }|train.tis=none"
    "fa2_tis|recipes/grpo-laptop.miles|schedule=fully_async { max_staleness = 2 }|train.tis=2.0"
    "fa1|recipes/grpo-laptop.miles|schedule=fully_async { max_staleness = 1 }|train.tis=none"
    "fully_async_256|recipes/grpo-laptop.miles|schedule=fully_async { max_staleness = 1, max_concurrent = 256 }|train.tis=none"
    "one_step_off|recipes/grpo-laptop.miles|schedule=one_step_off|train.tis=none"
    "sync_s2|$out/grpo-laptop-seed2.miles|schedule=sync|train.tis=none"
    "fa2_s2|$out/grpo-laptop-seed2.miles|schedule=fully_async { max_staleness = 2 }|train.tis=none"
    "fa2_tis_s2|$out/grpo-laptop-seed2.miles|schedule=fully_async { max_staleness = 2 }|train.tis=2.0"
)
names=()
for r in "${runs[@]}"; do
    IFS='|' read -r n recipe a b <<< "$r"
    names+=("$n")
    rm -rf "${out:?}/$n"
    echo "== $n: load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
    "$miles" run "$recipe" --set "$a" --set "$b" --threads 1 --progress off --out "$out/$n" 2>&1 | tail -1 | tee "$out/$n.log" >&2
done
python3 - "$out" "${names[@]}" <<'PY'
import json, statistics, sys
out, names = sys.argv[1], sys.argv[2:]
print("| run | held-out start -> end | gain | wall | median step | gen / train per step | staleness drawn (mean) | stale drops | concurrency |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for n in names:
    rows = [json.loads(l) for l in open(f"{out}/{n}/metrics.jsonl")]
    steps = [r for r in rows if "train/loss" in r]
    evals = sorted((r["step"], r["eval/accuracy"]) for r in rows if "eval/accuracy" in r)
    start, end = evals[0][1], evals[-1][1]
    med = lambda k: statistics.median(r[k] for r in steps if k in r) if any(k in r for r in steps) else float("nan")
    fa = "rollout/fully_async/"
    wall = open(f"{out}/{n}.log").read()
    wall = wall.split(" steps in ")[1].split(" s")[0] if " steps in " in wall else "?"
    stale = sum(r.get(fa + "dropped_stale", 0) for r in steps)
    print(f"| {n} | {100*start:.1f}% -> {100*end:.1f}% | {100*(end-start):+.1f} | {wall} s | {med('perf/step_s'):.3f} s "
          f"| {med('perf/gen_s'):.3f} / {med('perf/train_s'):.3f} s | {med(fa+'staleness_drawn_mean'):.2f} | {stale} "
          f"| {med(fa+'concurrency_mean'):.0f} |")
PY
