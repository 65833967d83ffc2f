"""The tables of bench/RESULTS.md ("Multi-LoRA") from the runs of bench/lora/multi.sh.
Usage: python3 bench/lora/multi_summary.py OUT_ROOT"""
import json
import statistics
import sys
from pathlib import Path

root = Path(sys.argv[1])


def evals(run):
    rows = [json.loads(l) for l in (root / run / "metrics.jsonl").read_text().splitlines()]
    out = {}
    for r in rows:
        for name in ["reverse", "sort"]:
            k = f"lora/{name}/eval/accuracy"
            if k in r:
                out.setdefault(name, {})[r["step"]] = r[k]
    return out


gains = {"reverse": [], "sort": []}
print("| run | reverse: start -> end | sort: start -> end |")
print("|---|---:|---:|")
for run in ["s1", "s2", "s3"]:
    e = evals(run)
    cells = []
    for name in ["reverse", "sort"]:
        s, last = e[name][0], e[name][max(e[name])]
        gains[name].append(100 * (last - s))
        cells.append(f"{100 * s:.1f}% -> {100 * last:.1f}% ({100 * (last - s):+.1f})")
    print(f"| {run} | {cells[0]} | {cells[1]} |")
print()
for name, g in gains.items():
    m, s = statistics.mean(g), statistics.stdev(g)
    print(f"{name}: gain {m:+.1f} +- {s:.1f} points (mean +- std over 3 seeds)")
a, b = evals("s1"), evals("s1-sort-lr")
same = a["reverse"] == b["reverse"]
print()
print(f"seed 1 with the sort adapter's lr changed (2e-3 -> 5e-4): reverse curve identical: {same}; "
      f"sort end {100 * a['sort'][max(a['sort'])]:.1f}% -> {100 * b['sort'][max(b['sort'])]:.1f}%")
