#!/usr/bin/env bash
# On-policy distillation against GRPO alone on the laptop task (bench/RESULTS.md, "OPD"):
# recipes/opd-laptop.miles (GRPO + distillation from recipes/data/teacher-reverse) and
# recipes/grpo-laptop.miles over seeds 1-3, one run at a time, one libtorch thread; held-out
# accuracy per evaluation and the wall time (sum of step times) until each run first reaches
# GRPO's final accuracy of the same seed.
# Usage: bash bench/opd/run.sh [MILES_BINARY] [OUT_ROOT] [--set K=V ...]   (default:
# target/release/miles, runs/opd-bench; the --set arguments go to every run, both recipes)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
MILES="${1:-$ROOT/target/release/miles}"
OUT="${2:-$ROOT/runs/opd-bench}"
SETS=("${@:3}")
mkdir -p "$OUT"
for seed in 1 2 3; do
    for algo in grpo opd; do
        rm -rf "$OUT/$algo-s$seed"
        "$MILES" run "$ROOT/recipes/$algo-laptop.miles" --out "$OUT/$algo-s$seed" --threads 1 --progress off \
            --set "seed=$seed" ${SETS[@]+"${SETS[@]}"} >"$OUT/$algo-s$seed.log" 2>&1
    done
done
"$MILES" report "$OUT/grpo-s1" "$OUT/opd-s1" --out "$OUT/report" >/dev/null
python3 - "$OUT" <<'PY'
import json, statistics, sys
from pathlib import Path
root = Path(sys.argv[1])
def load(name):
    rows = [json.loads(l) for l in (root / name / "metrics.jsonl").read_text().splitlines()]
    ev = {r["step"]: r["eval/accuracy"] for r in rows if "eval/accuracy" in r}
    t, clock = 0.0, {}
    for r in rows:
        if "perf/step_s" in r:
            t += r["perf/step_s"]
            clock[r["step"]] = t
    return rows, ev, clock
print("| seed | GRPO: start -> end (RL s) | OPD: start -> end (RL s) | OPD reaches GRPO's end at | reverse KL step 1 -> 300 |")
print("|---|---:|---:|---:|---:|")
gains = {"grpo": [], "opd": []}
for seed in [1, 2, 3]:
    _, eg, cg = load(f"grpo-s{seed}")
    ro, eo, co = load(f"opd-s{seed}")
    target = eg[max(eg)]
    reach = next((s for s in sorted(eo) if s > 0 and eo[s] >= target), None)
    at = f"step {reach}, {co[reach]:.0f} s vs {cg[max(cg)]:.0f} s" if reach else "not reached"
    kls = [r["opd/reverse_kl"] for r in ro if "opd/reverse_kl" in r]
    gains["grpo"].append(100 * (eg[max(eg)] - eg[0]))
    gains["opd"].append(100 * (eo[max(eo)] - eo[0]))
    print(f"| {seed} | {100*eg[0]:.1f}% -> {100*eg[max(eg)]:.1f}% ({cg[max(cg)]:.0f} s) | {100*eo[0]:.1f}% -> {100*eo[max(eo)]:.1f}% ({co[max(co)]:.0f} s) | {at} | {kls[0]:.3f} -> {kls[-1]:.3f} |")
print()
for algo, g in gains.items():
    print(f"{algo}: gain {statistics.mean(g):+.1f} +- {statistics.stdev(g):.1f} points (mean +- std over 3 seeds)")
PY
