"""The MoE/R3 table of bench/RESULTS.md from runs written by bench/moe/run.sh. Its run reader is
shared: bench/moe/qknorm.py imports `mean` and `run` from here."""
import json
import statistics
import sys
from pathlib import Path


def mean(xs):
    return sum(xs) / len(xs) if xs else float("nan")


def run(root, name):
    """One run's summary (held-out accuracy at the first and last eval, route mismatch, router
    disagreement, rollout KL) and its training rows, for the figures a table adds of its own."""
    rows = [json.loads(l) for l in (Path(root) / name / "metrics.jsonl").read_text().splitlines()]
    ev = {r["step"]: r["eval/accuracy"] for r in rows if "eval/accuracy" in r}
    tr = [r for r in rows if "r3/route_mismatch" in r]
    summary = {
        "start": 100 * ev[min(ev)],
        "end": 100 * ev[max(ev)],
        "mismatch": 100 * mean([r["r3/route_mismatch"] for r in tr]),
        "disagree": 100 * mean([r["r3/router_disagreement"] for r in tr]),
        "kl": mean([r["train/rollout_kl"] for r in tr]),
    }
    return summary, tr


def r3_run(root, name):
    """`run`'s summary with the R3 figures of bench/moe/run.sh's runs."""
    s, tr = run(root, name)
    s["logp_diff"] = mean([r["train/logp_diff"] for r in tr])
    s["flip_diff"] = mean([r["r3/flip_logp_diff"] for r in tr if r["r3/flip_tokens"] > 0])
    s["bytes"] = mean([r["r3/bytes"] / r["r3/tokens"] for r in tr])
    return s


def main():
    root = Path(sys.argv[1])
    schedules = sys.argv[2:] or ["sync", "fully_async"]
    for sched in schedules:
        print(f"\n{sched}: mean over seeds 1-3 (+- std), every training step")
        print("| R3 | TIS | held-out accuracy start -> end | route mismatch | router disagreement | train-rollout |logp diff| | KL(rollout, train) | |logp diff| at disagreeing tokens | R3 bytes/token |")
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
        for r3 in ["false", "true"]:
            for tis in ["off", "on"]:
                rs = [r3_run(root, f"{sched}-r3{r3}-tis{tis}-s{s}") for s in (1, 2, 3)]
                ends = [r["end"] for r in rs]
                print(
                    f"| {'on' if r3 == 'true' else 'off'} | {tis} | {mean([r['start'] for r in rs]):.1f}% -> "
                    f"{mean(ends):.1f}% +- {statistics.stdev(ends):.1f} | {mean([r['mismatch'] for r in rs]):.3f}% | "
                    f"{mean([r['disagree'] for r in rs]):.3f}% | {mean([r['logp_diff'] for r in rs]):.5f} | {mean([r['kl'] for r in rs]):.2e} | "
                    f"{mean([r['flip_diff'] for r in rs]):.4f} | {mean([r['bytes'] for r in rs]):.1f} |"
                )


if __name__ == "__main__":
    main()
