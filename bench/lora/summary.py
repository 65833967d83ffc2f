"""The tables of bench/RESULTS.md ("LoRA") from the runs of bench/lora/run.sh.
Usage: python3 bench/lora/summary.py OUT_ROOT"""
import json
import statistics
import sys
from pathlib import Path


def rows(d):
    return [json.loads(l) for l in (d / "metrics.jsonl").read_text().splitlines()]


def median(xs):
    return statistics.median(xs) if xs else float("nan")


root = Path(sys.argv[1])
gains = {"full": [], "lora": []}
print("| run | eval start | eval end | gain | wall | train step (median) | peak RSS | bytes per update (median) |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for kind in ["full", "lora"]:
    for seed in [1, 2, 3]:
        d = root / f"{kind}-s{seed}"
        rs = rows(d)
        evals = {r["step"]: r["eval/accuracy"] for r in rs if "eval/accuracy" in r}
        steps = [r for r in rs if r["step"] > 0 and "perf/train_s" in r]
        gain = 100 * (evals[max(evals)] - evals[0])
        gains[kind].append(gain)
        wall = float((root / f"{kind}-s{seed}.wall").read_text())
        rss = max(r.get("perf/peak_rss_bytes", 0) for r in rs) / 1e6
        print(f"| {d.name} | {100 * evals[0]:.1f}% | {100 * evals[max(evals)]:.1f}% | {gain:+.1f} | {wall:.0f} s "
              f"| {1000 * median([r['perf/train_s'] for r in steps]):.1f} ms | {rss:.0f} MB "
              f"| {median([r['perf/sync_bytes'] for r in steps]):,.0f} B |")
print()
for kind, g in gains.items():
    m, s = statistics.mean(g), statistics.stdev(g)
    print(f"{kind}: gain {m:+.1f} +- {s:.1f} points (mean +- std over 3 seeds); {m / s:.1f}x the std")
print()
print("| 1.6M-parameter variant | bytes per update (median, steps 1-5) | vs full |")
print("|---|---:|---:|")
full = None
for name in ["wide-full", "wide-lora-qkvo", "wide-lora-all"]:
    steps = [r for r in rows(root / name) if r["step"] > 0 and "perf/sync_bytes" in r]
    b = median([r["perf/sync_bytes"] for r in steps])
    full = full or b
    print(f"| {name} | {b:,.0f} B | {full / b:.1f}x fewer |")
