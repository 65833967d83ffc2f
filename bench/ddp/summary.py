"""The tables of bench/RESULTS.md ("Data-parallel trainers") from the runs of bench/ddp/run.sh.
Usage: python3 bench/ddp/summary.py OUT_ROOT"""
import json
import statistics
import sys
from pathlib import Path

root = Path(sys.argv[1])


def rows(name):
    return [json.loads(l) for l in (root / name / "metrics.jsonl").read_text().splitlines()]


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def steps(rs):
    return [r for r in rs if r.get("step", 0) > 0 and "perf/train_s" in r]


def col(rs, k):
    return [r[k] for r in steps(rs) if k in r]


SEEDS = sorted(int(d.name.split("-s")[1]) for d in root.glob("dp1-s*") if d.is_dir())
if SEEDS:
    print("| run | eval start | eval end | wall | train step (median) | collectives (median) | peak RSS per rank (max) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    ends = {}
    for kind in ["dp1", "dp2", "zero"]:
        for seed in SEEDS:
            name = f"{kind}-s{seed}"
            rs = rows(name)
            ev = {r["step"]: r["eval/accuracy"] for r in rs if "eval/accuracy" in r}
            ends.setdefault(kind, []).append(100 * ev[max(ev)])
            wall = float((root / f"{name}.wall").read_text())
            rss = max(col(rs, "perf/rank_peak_rss_bytes_max") or [0]) / 1e6
            coll = med(col(rs, "perf/collective_s"))
            print(f"| {name} | {100 * ev[0]:.1f}% | {100 * ev[max(ev)]:.1f}% | {wall:.0f} s "
                  f"| {1000 * med(col(rs, 'perf/train_s')):.1f} ms | {1000 * coll:.1f} ms | {rss:.0f} MB |")
    print()
    for kind, e in ends.items():
        print(f"{kind}: held-out at the end {statistics.mean(e):.1f}% +- {statistics.stdev(e):.1f} (mean +- std, seeds {SEEDS})")
    # Same seed, same recipe: do the ranks change the numbers?
    for seed in SEEDS:
        a, b, z = (rows(f"{k}-s{seed}") for k in ["dp1", "dp2", "zero"])
        ea = [r["eval/accuracy"] for r in a if "eval/accuracy" in r]
        eb = [r["eval/accuracy"] for r in b if "eval/accuracy" in r]
        ez = [r["eval/accuracy"] for r in z if "eval/accuracy" in r]
        la = [r.get("train/loss") for r in steps(a)]
        lb = [r.get("train/loss") for r in steps(b)]
        print(f"seed {seed}: eval curves dp1 == dp2: {ea == eb}, dp2 == zero: {eb == ez}; "
              f"losses equal on {sum(x == y for x, y in zip(la, lb))}/{len(la)} steps")
    print()
print("| throughput (30 steps) | train step (median) | exchanges (median) | waiting for the slowest rank (median) | wall |")
print("|---|---:|---:|---:|---:|")
for kind in ["2x1", "1x2", "1x1"]:
    names = sorted(d.name for d in root.glob(f"tp-{kind}-r*") if d.is_dir())
    for name in names:
        rs = rows(name)
        wall = float((root / f"{name}.wall").read_text())
        print(f"| {name} | {1000 * med(col(rs, 'perf/train_s')):.1f} ms | {1000 * med(col(rs, 'perf/collective_s')):.2f} ms "
              f"| {1000 * med(col(rs, 'perf/rank_wait_s')):.2f} ms | {wall:.0f} s |")
    if names:
        m = med([med(col(rows(n), "perf/train_s")) for n in names])
        print(f"| **{kind}: median of the runs** | **{1000 * m:.1f} ms** | | | |")
print()
print("| 10M-parameter variant (3 steps) | peak RSS per rank | ranks |")
print("|---|---:|---|")
for name in ["big-dp2", "big-zero"]:
    if not (root / name).exists():
        continue
    rs = rows(name)
    per = {}
    for r in rs:
        for k, v in r.items():
            if k.startswith("perf/rank_peak_rss_bytes/"):
                per[k.rsplit("/", 1)[1]] = max(per.get(k.rsplit("/", 1)[1], 0), v)
    print(f"| {name} | {max(per.values(), default=0) / 1e6:.1f} MB | "
          + ", ".join(f"rank {k}: {v / 1e6:.1f} MB" for k, v in sorted(per.items())) + " |")
