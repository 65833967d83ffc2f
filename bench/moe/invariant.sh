#!/usr/bin/env bash
# True on-policy (`batch_invariant`) against the ordinary kernels on recipes/moe-r3-laptop.miles
# with an fp32 engine (bench/RESULTS.md, "MoE and R3"): seeds 1-3, interleaved, one libtorch thread;
# held-out accuracy, the train-rollout difference, the routers' disagreement and the step time.
# Usage: bash bench/moe/invariant.sh [MILES_BINARY] [OUT_ROOT]   (default: target/release/miles, runs/moe-invariant)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
MILES="${1:-$ROOT/target/release/miles}"
OUT="${2:-$ROOT/runs/moe-invariant}"
mkdir -p "$OUT"
for seed in 1 2 3; do
    for inv in false true; do
        name="inv$inv-s$seed"
        rm -rf "$OUT/$name"
        "$MILES" run "$ROOT/recipes/moe-r3-laptop.miles" --out "$OUT/$name" --threads 1 --progress off \
            --set "seed=$seed" --set "rollout.engine=embedded_engine {}" --set "rollout.routing_replay=false" \
            --set "rollout.record_routing=true" --set "rollout.batch_invariant=$inv" >"$OUT/$name.log" 2>&1
    done
done
python3 - "$OUT" <<'PY'
import json, statistics, sys
from pathlib import Path
root = Path(sys.argv[1])
print("| batch_invariant | seed | held-out start -> end | train/logp_diff (max over steps) | router disagreement (mean) | train step (median) | generation (median) |")
print("|---|---:|---:|---:|---:|---:|---:|")
gains = {"false": [], "true": []}
for seed in (1, 2, 3):
    for inv in ("false", "true"):
        rows = [json.loads(l) for l in (root / f"inv{inv}-s{seed}" / "metrics.jsonl").read_text().splitlines()]
        ev = {r["step"]: r["eval/accuracy"] for r in rows if "eval/accuracy" in r}
        tr = [r for r in rows if "train/logp_diff" in r]
        gains[inv].append(100 * (ev[max(ev)] - ev[min(ev)]))
        print(f"| {inv} | {seed} | {100*ev[min(ev)]:.1f}% -> {100*ev[max(ev)]:.1f}% | "
              f"{max(r['train/logp_diff'] for r in tr):.2e} | {100*statistics.mean(r['r3/router_disagreement'] for r in tr):.3f}% | "
              f"{1000*statistics.median(r['perf/train_s'] for r in tr):.0f} ms | {1000*statistics.median(r['perf/gen_s'] for r in tr):.0f} ms |")
for inv, g in gains.items():
    print(f"batch_invariant = {inv}: gain {statistics.mean(g):+.1f} +- {statistics.stdev(g):.1f} points (mean +- std, 3 seeds)")
PY
