#!/usr/bin/env bash
# The length effect of on-policy distillation (Miles §5.2; bench/RESULTS.md, "The length effect"):
# recipes/opd-length-laptop.miles (a verbose student, the concise teacher recipes/data/teacher-reverse,
# task reward 0) over seeds 1-3, one run at a time, one libtorch thread. Per seed: held-out exact
# match and mean held-out response length (tokens, stop token included) at step 0 (after the SFT
# warm-up) and at the end, and the share of held-out responses that write the working (contain `>`).
#
# The runs write accuracy and length (eval/accuracy, eval/response_len in metrics.jsonl) but not
# the share, so each seed runs twice: as the recipe is, and with its reward replaced by a regex
# verifier that scores 1 for a response containing `>`, whose eval/accuracy is that share. With
# task_coef = 0 the reward never reaches the advantage, so the two runs train identically; the
# script checks that (every eval/response_len and opd/reverse_kl equal) and refuses the share if not.
# Usage: bash bench/opd/length.sh [MILES_BINARY] [OUT_ROOT] [--set K=V ...]   (default:
# target/release/miles, runs/opd-length; the --set arguments go to every run). REPORT_ONLY=1
# prints the tables of the runs already in OUT_ROOT without running anything.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
MILES="${1:-$ROOT/target/release/miles}"
OUT="${2:-$ROOT/runs/opd-length}"
SETS=("${@:3}")
RECIPE="$ROOT/recipes/opd-length-laptop.miles"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
# The probe: the same recipe, its reward a regex verifier that scores 1 for a response with `>`.
REL="$(python3 -c 'import os, sys; print(os.path.relpath(sys.argv[1], sys.argv[2]))' "${RECIPE%.miles}" "$OUT")"
printf '%s\n' "import $REL as length" "recipe share extends length.opd_length_laptop {" \
    '    reward = verify(rollout) { kind = regex, pattern = ">" }' "}" >"$OUT/share.miles"
cd "$ROOT" # the recipe names its teacher relative to the repository root
[ "${REPORT_ONLY:-0}" = 1 ] || for seed in 1 2 3; do
    for kind in run share; do
        rm -rf "$OUT/$kind-s$seed"
        recipe="$RECIPE"
        [ "$kind" = share ] && recipe="$OUT/share.miles"
        "$MILES" run "$recipe" --out "$OUT/$kind-s$seed" --threads 1 --progress off \
            --set "seed=$seed" ${SETS[@]+"${SETS[@]}"} >"$OUT/$kind-s$seed.log" 2>&1
    done
done
python3 - "$OUT" <<'PY'
import json, math, statistics, sys
from pathlib import Path
root = Path(sys.argv[1])
def load(name):
    rows = [json.loads(l) for l in (root / name / "metrics.jsonl").read_text().splitlines() if l.strip()]
    ev = {r["step"]: r for r in rows if "eval/accuracy" in r}
    rl = sum(r.get("perf/step_s", 0.0) for r in rows)
    kl = [r["opd/reverse_kl"] for r in rows if "opd/reverse_kl" in r]
    return ev, rl, kl
# Held-out prompts per evaluation: the eval's limit (at most the test split; 200 here).
n = json.loads((root / "run-s1" / "spec.json").read_text())["eval"]["prompts"]
se = lambda p: math.sqrt(p * (1 - p) / n)
print(f"| seed | accuracy step 0 -> end (SE) | response length step 0 -> end (tokens) | writes the working: step 0 -> end | reverse KL first -> last step | RL s |")
print("|---|---:|---:|---:|---:|---:|")
cols = {k: [] for k in ["a0", "a1", "l0", "l1", "w0", "w1"]}
for seed in [1, 2, 3]:
    ev, rl, kl = load(f"run-s{seed}")
    es, _, kls = load(f"share-s{seed}")
    s0, s1 = min(ev), max(ev)
    same = sorted(ev) == sorted(es) and all(ev[s]["eval/response_len"] == es[s]["eval/response_len"] for s in ev) and kl == kls
    a0, a1 = ev[s0]["eval/accuracy"], ev[s1]["eval/accuracy"]
    l0, l1 = ev[s0]["eval/response_len"], ev[s1]["eval/response_len"]
    w0, w1 = (es[s0]["eval/accuracy"], es[s1]["eval/accuracy"]) if same else (float("nan"), float("nan"))
    for k, v in zip(cols, [a0, a1, l0, l1, w0, w1]):
        cols[k].append(v)
    share = f"{100*w0:.1f}% -> {100*w1:.1f}%" if same else "runs differ: not measured"
    print(f"| {seed} | {100*a0:.1f}% -> {100*a1:.1f}% (+-{100*se(a1):.1f}) | {l0:.2f} -> {l1:.2f} | {share} | {kl[0]:.3f} -> {kl[-1]:.3f} | {rl:.0f} |")
m = {k: statistics.mean(v) for k, v in cols.items()}
sd = {k: statistics.stdev(v) for k, v in cols.items()}
print(f"| mean | {100*m['a0']:.1f}% -> {100*m['a1']:.1f}% | {m['l0']:.2f} -> {m['l1']:.2f} | {100*m['w0']:.1f}% -> {100*m['w1']:.1f}% | | |")
print()
print(f"held-out prompts per evaluation: n = {n}; binomial SE sqrt(p(1-p)/n) at the mean accuracy: "
      f"step 0 {100*se(m['a0']):.1f} points, end {100*se(m['a1']):.1f} points")
print(f"seed spread (std over 3 seeds): accuracy step 0 {100*sd['a0']:.1f}, end {100*sd['a1']:.1f} points; "
      f"length step 0 {sd['l0']:.2f}, end {sd['l1']:.2f} tokens")
print()
print("Every evaluation, mean over the 3 seeds (accuracy / response length / share with the working):")
print()
print("| step | accuracy | response length (tokens) | writes the working |")
print("|---:|---:|---:|---:|")
runs = [load(f"run-s{s}")[0] for s in [1, 2, 3]]
shares = [load(f"share-s{s}")[0] for s in [1, 2, 3]]
for step in sorted(runs[0]):
    acc = statistics.mean(r[step]["eval/accuracy"] for r in runs)
    ln = statistics.mean(r[step]["eval/response_len"] for r in runs)
    sh = statistics.mean(r[step]["eval/accuracy"] for r in shares)
    print(f"| {step} | {100*acc:.1f}% | {ln:.2f} | {100*sh:.1f}% |")
d = [b - a for a, b in zip(cols["a0"], cols["a1"])]
print(f"accuracy change end - step 0: {', '.join(f'{100*x:+.1f}' for x in d)} points (mean {100*statistics.mean(d):+.1f}); "
      f"length change: {', '.join(f'{b - a:+.2f}' for a, b in zip(cols['l0'], cols['l1']))} tokens")
PY
