#!/usr/bin/env bash
# The laptop GRPO recipe in fp32 and in bf16 (bench/RESULTS.md, "bf16 GEMMs on the CPU", the table
# under "The laptop recipe learns in bf16"): recipes/grpo-laptop.miles with the trainer's
# `backend = embedded_trainer { precision = P }`, P = fp32 then bf16 for each seed (alternating, so
# machine noise falls on both), one run at a time, one libtorch thread, the whole recipe (100 SFT
# steps, then 300 GRPO steps). The SFT warm-up runs in the trainer's precision too. Prints the
# held-out greedy accuracy after SFT (the step-0 evaluation) and at the end per seed and
# precision, the mean +- sd of the end over seeds, and each run's median step time
# (`perf/step_s`).
#
# Usage: bash bench/precision/laptop.sh [MILES_BINARY] [OUT_ROOT] [SEED ...]
#   (default: target/release/miles, runs/bf16-laptop, seeds 1 2 3; build first with
#   `cargo build --release --bins`, which also builds miles-engine). An empty MILES_BINARY or
#   OUT_ROOT keeps its default, e.g. the published seeds: bash bench/precision/laptop.sh "" "" 0 1 2
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
MILES="${1:-$ROOT/target/release/miles}"
OUT="${2:-$ROOT/runs/bf16-laptop}"
shift $(($# < 2 ? $# : 2))
SEEDS=("$@")
[[ ${#SEEDS[@]} -gt 0 ]] || SEEDS=(1 2 3)
[[ -x "$MILES" ]] || { echo "no miles binary at $MILES: cargo build --release --bins" >&2; exit 1; }
mkdir -p "$OUT"
for seed in "${SEEDS[@]}"; do
    for p in fp32 bf16; do
        name="$p-s$seed"
        rm -rf "${OUT:?}/$name"
        echo "== $name: load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
        "$MILES" run "$ROOT/recipes/grpo-laptop.miles" --out "$OUT/$name" --threads 1 --progress off \
            --set "seed=$seed" --set "train.backend=embedded_trainer { precision = $p }" >"$OUT/$name.log" 2>&1 \
            || { echo "$name failed: see $OUT/$name.log" >&2; exit 1; }
    done
done
python3 - "$OUT" "${SEEDS[@]}" <<'PY'
import json, statistics, sys
from pathlib import Path
root, seeds = Path(sys.argv[1]), sys.argv[2:]

def run(p, seed):
    rows = [json.loads(l) for l in (root / f"{p}-s{seed}" / "metrics.jsonl").read_text().splitlines() if l.strip()]
    ev = sorted((r["step"], r["eval/accuracy"]) for r in rows if "eval/accuracy" in r)
    steps = [r["perf/step_s"] for r in rows if "train/loss" in r and "perf/step_s" in r]
    return 100 * ev[0][1], 100 * ev[-1][1], ev[-1][0], statistics.median(steps) if steps else float("nan")

res = {(p, s): run(p, s) for s in seeds for p in ("fp32", "bf16")}
last = res[("fp32", seeds[0])][2]
print(f"| seed | fp32: after SFT -> after {last} GRPO steps | bf16 |")
print("|---|---|---|")
for s in seeds:
    a, b = res[("fp32", s)], res[("bf16", s)]
    print(f"| {s} | {a[0]:.1f}% -> {a[1]:.1f}% | {b[0]:.1f}% -> {b[1]:.1f}% |")
if len(seeds) > 1:
    ends = {p: [res[(p, s)][1] for s in seeds] for p in ("fp32", "bf16")}
    print(f"| mean ± sd | {statistics.mean(ends['fp32']):.1f} ± {statistics.stdev(ends['fp32']):.1f}% "
          f"| {statistics.mean(ends['bf16']):.1f} ± {statistics.stdev(ends['bf16']):.1f}% |")
print()
for p in ("fp32", "bf16"):
    ms = " / ".join(f"{1000 * res[(p, s)][3]:.0f}" for s in seeds)
    print(f"{p}: median step {ms} ms (seeds {' '.join(seeds)})")
PY
