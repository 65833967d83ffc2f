#!/usr/bin/env bash
# Diffusion RL on the laptop (bench/RESULTS.md, "Diffusion RL"), through `miles run` on
# recipes/diffusion-laptop.miles:
# (1) learning: seeds 1-3; held-out mean reward, judge accuracy and sample diversity before RL and
#     after 200 RL steps (the grids are in each run's grids/, `miles report` pairs them);
# (2) streamed vs whole-batch rewards with a reward stage that costs 50 ms more per micro-group (a
#     sleep after the classifier's real forward, standing in for a large reward model; about one
#     micro-group's denoising time here): same seeds, same work, 20 RL steps, rollout and step time
#     (medians over steps). Pretraining is cut to 200 steps for these: time does not depend on how
#     well the denoiser draws.
# Usage: bash bench/diffusion/run.sh [all|learn|timing|table] [OUT_ROOT]   (default: all,
# runs/diffusion-bench; needs the release binaries: cargo build --release --bins)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
MILES="$ROOT/target/release/miles"
RECIPE="$ROOT/recipes/diffusion-laptop.miles"
WHAT="${1:-all}"
OUT="${2:-$ROOT/runs/diffusion-bench}"
mkdir -p "$OUT"
if [[ "$WHAT" == all || "$WHAT" == learn ]]; then
    for seed in 1 2 3; do
        rm -rf "$OUT/learn-s$seed"
        "$MILES" run "$RECIPE" --out "$OUT/learn-s$seed" --threads 1 --set seed=$seed
    done
fi
if [[ "$WHAT" == all || "$WHAT" == timing ]]; then
    for seed in 1 2 3; do
        for mode in true false; do
            rm -rf "$OUT/timing-stream$mode-s$seed"
            "$MILES" run "$RECIPE" --out "$OUT/timing-stream$mode-s$seed" --threads 1 --steps 20 --set seed=$seed \
                --set pretrain.steps=200.steps --set reward.extra_cost=50.ms --set reward.streaming=$mode \
                --set eval.every=20.steps
        done
    done
fi
"$MILES" report "$OUT/learn-s1" "$OUT/learn-s2" "$OUT/learn-s3" --out "$OUT/report" | tail -8
python3 - "$OUT" <<'PY'
import json, statistics, sys
from pathlib import Path
root = Path(sys.argv[1])
def rows(n):
    return [json.loads(l) for l in (root / n / "metrics.jsonl").read_text().splitlines()]
print("| seed | held-out reward before RL | after 200 RL steps | gain | judge accuracy before | after | diversity before | after | wall |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
gains = []
for s in (1, 2, 3):
    ev = [r for r in rows(f"learn-s{s}") if "eval/reward_mean" in r]
    a, b = ev[0], ev[-1]
    gains.append(b["eval/reward_mean"] - a["eval/reward_mean"])
    wall = json.loads((root / f"learn-s{s}" / "spec.json").read_text()) and (root / f"learn-s{s}" / "metrics.jsonl").stat().st_mtime - (root / f"learn-s{s}" / "spec.json").stat().st_mtime
    print(f"| {s} | {a['eval/reward_mean']:.3f} | {b['eval/reward_mean']:.3f} | {gains[-1]:+.3f} | "
          f"{100*a['eval/judge_accuracy']:.1f}% | {100*b['eval/judge_accuracy']:.1f}% | "
          f"{a['eval/diversity']:.3f} | {b['eval/diversity']:.3f} | {wall:.0f} s |")
sd = statistics.stdev(gains)
print(f"gain {statistics.mean(gains):+.3f} +- {sd:.3f} (mean +- std over 3 seeds; {statistics.mean(gains)/sd:.1f}x the spread)")
print()
print("| seed | mode | rollout (median) | of which waiting for rewards | step (median) | same rewards |")
print("|---:|---|---:|---:|---:|---|")
for s in (1, 2, 3):
    a, b = rows(f"timing-streamtrue-s{s}"), rows(f"timing-streamfalse-s{s}")
    same = [r.get("rollout/reward_mean") for r in a] == [r.get("rollout/reward_mean") for r in b]
    for mode, rs in (("streamed", a), ("whole batch", b)):
        tr = [r for r in rs if "perf/rollout_s" in r]
        med = lambda k: 1000 * statistics.median(r[k] for r in tr)
        print(f"| {s} | {mode} | {med('perf/rollout_s'):.0f} ms | {med('perf/reward_wait_s'):.0f} ms | {med('perf/step_s'):.0f} ms | {same} |")
PY
