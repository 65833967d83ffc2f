"""Held-out accuracy curves of rgym-laptop runs (the `eval/accuracy` rows of each run's
metrics.jsonl) and their mean, before and after RL, with each run's wall time (`perf/step_s`
summed, SFT excluded) and the spread across seeds.

    python3 bench/algorithms/rgym/summary.py bench/out/rgym-s1 bench/out/rgym-s2 bench/out/rgym-s3
"""

import json
import statistics
import sys


def curve(out):
    points, rl_s = {}, 0.0
    with open(f"{out}/metrics.jsonl") as f:
        for line in f:
            r = json.loads(line)
            if "eval/accuracy" in r:
                points[r["step"]] = r["eval/accuracy"]
            rl_s += r.get("perf/step_s", 0.0)
    return points, rl_s


def main(outs):
    if not outs:
        sys.exit(__doc__)
    curves = {o: curve(o) for o in outs}
    steps = sorted(set.intersection(*(set(c) for c, _ in curves.values())))
    if not steps:
        sys.exit("summary: the runs share no evaluated step yet")
    print("| step | " + " | ".join(outs) + " | mean |")
    print("|---" * (len(outs) + 2) + "|")
    for s in steps:
        vals = [curves[o][0][s] for o in outs]
        print(f"| {s} | " + " | ".join(f"{100 * v:.1f}" for v in vals) + f" | {100 * statistics.mean(vals):.1f} |")
    first, last = steps[0], steps[-1]
    gains = [curves[o][0][last] - curves[o][0][first] for o in outs]
    spread = statistics.stdev(gains) if len(gains) > 1 else 0.0
    print(f"\nheld-out accuracy, step {first} -> {last}: "
          f"{100 * statistics.mean(curves[o][0][first] for o in outs):.1f}% -> "
          f"{100 * statistics.mean(curves[o][0][last] for o in outs):.1f}%; "
          f"gain {100 * statistics.mean(gains):+.1f} points (std {100 * spread:.1f} over {len(outs)} seeds)")
    print("RL time per run (perf/step_s summed): " + ", ".join(f"{o}: {curves[o][1]:.0f} s" for o in outs))


if __name__ == "__main__":
    main(sys.argv[1:])
