"""The q/k-norm table of bench/RESULTS.md ("Hugging Face in and out") from bench/moe/qknorm.sh's runs."""
import json
import statistics
import sys
from pathlib import Path

root = Path(sys.argv[1])
seeds = (4, 5, 6)


def mean(xs):
    return sum(xs) / len(xs) if xs else float("nan")


def run(name):
    rows = [json.loads(l) for l in (root / name / "metrics.jsonl").read_text().splitlines()]
    ev = {r["step"]: r["eval/accuracy"] for r in rows if "eval/accuracy" in r}
    tr = [r for r in rows if "r3/route_mismatch" in r]
    return {
        "start": 100 * ev[min(ev)],
        "end": 100 * ev[max(ev)],
        "mismatch": 100 * mean([r["r3/route_mismatch"] for r in tr]),
        "disagree": 100 * mean([r["r3/router_disagreement"] for r in tr]),
        "kl": mean([r["train/rollout_kl"] for r in tr]),
    }


print("| qk_norm | held-out accuracy start -> end (per seed) | end mean +- std | route mismatch | router disagreement | KL(rollout, train) |")
print("|---|---|---:|---:|---:|---:|")
for qk in ["true", "false"]:
    rs = [run(f"qk{qk}-s{s}") for s in seeds]
    ends = [r["end"] for r in rs]
    per = ", ".join(f"{r['start']:.0f} -> {r['end']:.0f}" for r in rs)
    print(
        f"| {qk} | {per} | {mean(ends):.1f}% +- {statistics.stdev(ends):.1f} | {mean([r['mismatch'] for r in rs]):.3f}% | "
        f"{mean([r['disagree'] for r in rs]):.3f}% | {mean([r['kl'] for r in rs]):.2e} |"
    )
