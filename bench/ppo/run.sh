#!/usr/bin/env bash
# PPO against GRPO on the laptop task (bench/RESULTS.md, "PPO"): recipes/ppo-laptop.miles and
# recipes/grpo-laptop.miles over seeds 1-3, one run at a time, one libtorch thread; then the
# held-out accuracy table and `miles report` overlaying the curves of seed 1.
# Usage: bash bench/ppo/run.sh [MILES_BINARY] [OUT_ROOT]   (default: target/release/miles, runs/ppo-bench)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
MILES="${1:-$ROOT/target/release/miles}"
OUT="${2:-$ROOT/runs/ppo-bench}"
mkdir -p "$OUT"
for seed in 1 2 3; do
    for algo in grpo ppo; do
        rm -rf "$OUT/$algo-s$seed"
        start=$(date +%s.%N)
        "$MILES" run "$ROOT/recipes/$algo-laptop.miles" --out "$OUT/$algo-s$seed" --threads 1 --progress off \
            --set "seed=$seed" >"$OUT/$algo-s$seed.log" 2>&1
        echo "$(date +%s.%N) - $start" | bc >"$OUT/$algo-s$seed.wall"
    done
done
"$MILES" report "$OUT/grpo-s1" "$OUT/ppo-s1" --out "$OUT/report" >/dev/null
python3 - "$OUT" <<'PY'
import json, statistics, sys
from pathlib import Path
root = Path(sys.argv[1])
print("| run | eval start | step 100 | step 200 | end | gain | wall | explained variance (last eval step) |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
gains = {"grpo": [], "ppo": []}
for algo in ["grpo", "ppo"]:
    for seed in [1, 2, 3]:
        d = root / f"{algo}-s{seed}"
        rows = [json.loads(l) for l in (d / "metrics.jsonl").read_text().splitlines()]
        ev = {r["step"]: r["eval/accuracy"] for r in rows if "eval/accuracy" in r}
        last = max(ev)
        gains[algo].append(100 * (ev[last] - ev[0]))
        evs = [r.get("critic/explained_variance") for r in rows if r["step"] == last and "critic/explained_variance" in r]
        wall = float((root / f"{algo}-s{seed}.wall").read_text())
        print(f"| {d.name} | {100*ev[0]:.1f}% | {100*ev.get(100, 0):.1f}% | {100*ev.get(200, 0):.1f}% | {100*ev[last]:.1f}% "
              f"| {100*(ev[last]-ev[0]):+.1f} | {wall:.0f} s | {evs[0]:.2f} |" if evs else
              f"| {d.name} | {100*ev[0]:.1f}% | {100*ev.get(100, 0):.1f}% | {100*ev.get(200, 0):.1f}% | {100*ev[last]:.1f}% "
              f"| {100*(ev[last]-ev[0]):+.1f} | {wall:.0f} s | - |")
print()
for algo, g in gains.items():
    m, s = statistics.mean(g), statistics.stdev(g)
    print(f"{algo}: gain {m:+.1f} +- {s:.1f} points (mean +- std over 3 seeds)")
PY
