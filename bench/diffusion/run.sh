#!/usr/bin/env bash
# Diffusion RL on the laptop (bench/RESULTS.md, "Diffusion RL"): bench/diffusion/laptop.json
# (a 16x16 8-class procedural domain, an MLP denoiser pretrained by the denoising loss, DDPM with
# 20 stochastic steps, reward = the domain classifier's p(condition | image) + brightness), then
# (1) learning: seeds 1-3, streamed rewards, held-out mean reward before/after RL;
# (2) streamed vs whole-batch rewards with a reward stage that costs 15 ms more per micro-group (the
#     classifier's real forward plus a sleep standing in for a large reward model): same seeds,
#     same work, rollout and step time (median over RL steps).
# Usage: bash bench/diffusion/run.sh [RUNNER] [OUT_ROOT]
#   (default: target/release/examples/diffusion_run, runs/diffusion-bench)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
RUN="${1:-$ROOT/target/release/examples/diffusion_run}"
OUT="${2:-$ROOT/runs/diffusion-bench}"
mkdir -p "$OUT"
for seed in 1 2 3; do
    rm -rf "$OUT/learn-s$seed"
    "$RUN" "$ROOT/bench/diffusion/laptop.json" "$OUT/learn-s$seed" --threads 1 --seed "$seed" >"$OUT/learn-s$seed.json"
done
python3 - "$ROOT/bench/diffusion/laptop.json" "$OUT/timing.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
s["rl"]["steps"] = 20
s["eval"]["every"] = 20
s["reward"]["extra_cost_ms"] = 15
json.dump(s, open(sys.argv[2], "w"))
PY
for seed in 1 2 3; do
    for mode in true false; do
        rm -rf "$OUT/timing-stream$mode-s$seed"
        "$RUN" "$OUT/timing.json" "$OUT/timing-stream$mode-s$seed" --threads 1 --seed "$seed" --streaming "$mode" \
            >"$OUT/timing-stream$mode-s$seed.json"
    done
done
python3 - "$OUT" <<'PY'
import json, statistics, sys
from pathlib import Path
root = Path(sys.argv[1])
def rows(n):
    return [json.loads(l) for l in (root / n / "metrics.jsonl").read_text().splitlines()]
print("| seed | held-out reward before RL | after 100 RL steps | gain |")
print("|---:|---:|---:|---:|")
gains = []
for s in (1, 2, 3):
    ev = [r["eval/reward_mean"] for r in rows(f"learn-s{s}") if "eval/reward_mean" in r]
    gains.append(ev[-1] - ev[0])
    print(f"| {s} | {ev[0]:.3f} | {ev[-1]:.3f} | {ev[-1]-ev[0]:+.3f} |")
print(f"gain {statistics.mean(gains):+.3f} +- {statistics.stdev(gains):.3f} (mean +- std over 3 seeds)")
print()
print("| seed | mode | rollout (median) | of which waiting for rewards | step (median) | rollout/reward_mean equal |")
print("|---:|---|---:|---:|---:|---|")
for s in (1, 2, 3):
    a, b = rows(f"timing-streamtrue-s{s}"), rows(f"timing-streamfalse-s{s}")
    same = [r.get("rollout/reward_mean") for r in a] == [r.get("rollout/reward_mean") for r in b]
    for mode, rs in (("streamed", a), ("whole batch", b)):
        tr = [r for r in rs if "perf/rollout_s" in r]
        med = lambda k: 1000 * statistics.median(r[k] for r in tr)
        print(f"| {s} | {mode} | {med('perf/rollout_s'):.0f} ms | {med('perf/reward_wait_s'):.0f} ms | {med('perf/step_s'):.0f} ms | {same} |")
PY
