"""The table of bench/RESULTS.md ("Agentic, Hugging Face chat model") from the metrics.jsonl of
runs of recipes/agent-hf-laptop.miles: held-out success at every evaluation (step 0 is after the
SFT warm-up, before RL), its gain, the tool-use rate and train reward of the first and last 10 RL
steps, how the training episodes ended, tito/retokenize_mismatch, and the gain's spread over the
runs (std and max - min).
Usage: python3 bench/agent-hf/summary.py RUN_DIR [RUN_DIR ...]"""
import json
import statistics
import sys
from pathlib import Path


def mean(xs):
    return sum(xs) / len(xs) if xs else float("nan")


runs = []
for d in map(Path, sys.argv[1:]):
    metrics = d / "metrics.jsonl"
    if not metrics.is_file():
        sys.exit(f"{metrics}: no such file (did the run start?)")
    rows = [json.loads(l) for l in metrics.read_text().splitlines() if l.strip()]
    evals = {r["step"]: r["eval/accuracy"] for r in rows if "eval/accuracy" in r}
    if 0 not in evals or len(evals) < 2:
        sys.exit(f"{d}: needs the step-0 evaluation and one after RL (found steps {sorted(evals)})")
    steps = [r for r in rows if "rollout/tool_use_rate" in r]
    sft = [r["sft/loss"] for r in rows if "sft/loss" in r]
    runs.append((d, evals, steps, sft))

eval_steps = sorted(set().union(*(e.keys() for _, e, _, _ in runs)))
head = " | ".join(f"step {s}" for s in eval_steps)
print(f"| run | {head} | gain | tool use (first 10 -> last 10 steps) | train reward (first 10 -> last 10) "
      "| episode ends (done / length / max_turns / overflow) | retokenize mismatch (sum) | SFT loss (last) | wall |")
print("|---|" + "---:|" * (len(eval_steps) + 7))
gains = []
for d, evals, steps, sft in runs:
    first, last = steps[:10], steps[-10:]
    end = lambda k: int(sum(r.get("rollout/episode_end/" + k, 0) for r in steps))
    gain = 100 * (evals[max(evals)] - evals[0])
    gains.append(gain)
    wall = d.with_suffix(".wall")
    wall = f"{float(wall.read_text()):.0f} s" if wall.exists() else "?"
    at = " | ".join(f"{100 * evals[s]:.1f}%" if s in evals else "-" for s in eval_steps)
    print(f"| {d.name} | {at} | {gain:+.1f} "
          f"| {mean([r['rollout/tool_use_rate'] for r in first]):.2f} -> "
          f"{mean([r['rollout/tool_use_rate'] for r in last]):.2f} "
          f"| {mean([r['rollout/reward_mean'] for r in first]):.2f} -> {mean([r['rollout/reward_mean'] for r in last]):.2f} "
          f"| {end('done')} / {end('length')} / {end('max_turns')} / {end('context_overflow')} "
          f"| {int(sum(r.get('tito/retokenize_mismatch', 0) for r in steps))} "
          f"| {sft[-1] if sft else float('nan'):.3f} | {wall} |")
if len(gains) > 1:
    m, s, r = statistics.mean(gains), statistics.stdev(gains), max(gains) - min(gains)
    ratio = lambda x: f"{m / x:.1f}x" if x > 0 else "inf"
    print(f"\ngain {m:+.1f} points, mean over {len(gains)} runs; spread: std {s:.1f} ({ratio(s)}), "
          f"max - min {r:.1f} ({ratio(r)})")
