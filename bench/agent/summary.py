"""The table of bench/RESULTS.md ("Agentic") from the metrics.jsonl of runs of
recipes/agent-laptop.miles: held-out success at evaluations, its gain, the tool-use rate and train
reward of the first and last 10 RL steps, how episodes ended, tito/retokenize_mismatch.
Usage: python3 bench/agent/summary.py RUN_DIR [RUN_DIR ...]"""
import json
import statistics
import sys
from pathlib import Path


def mean(xs):
    return sum(xs) / len(xs) if xs else float("nan")


gains = []
print("| run | RL start | step 60 | step 100 | end | gain | tool use (first 10 -> last 10 steps) "
      "| train reward (first 10 -> last 10) | episode ends (done / length / max_turns / overflow) "
      "| retokenize mismatch (sum) | wall |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for d in map(Path, sys.argv[1:]):
    rows = [json.loads(l) for l in (d / "metrics.jsonl").read_text().splitlines()]
    evals = {r["step"]: r["eval/accuracy"] for r in rows if "eval/accuracy" in r}
    steps = [r for r in rows if "rollout/tool_use_rate" in r]
    first, last = steps[:10], steps[-10:]
    end = lambda k: int(sum(r.get("rollout/episode_end/" + k, 0) for r in steps))
    gain = 100 * (evals[max(evals)] - evals[0])
    gains.append(gain)
    wall = d.with_suffix(".wall")
    wall = f"{float(wall.read_text()):.0f} s" if wall.exists() else "?"
    at = lambda s: f"{100 * evals[s]:.1f}%" if s in evals else "-"
    print(f"| {d.name} | {at(0)} | {at(60)} | {at(100)} | {at(max(evals))} "
          f"| {gain:+.1f} | {mean([r['rollout/tool_use_rate'] for r in first]):.2f} -> "
          f"{mean([r['rollout/tool_use_rate'] for r in last]):.2f} "
          f"| {mean([r['rollout/reward_mean'] for r in first]):.2f} -> {mean([r['rollout/reward_mean'] for r in last]):.2f} "
          f"| {end('done')} / {end('length')} / {end('max_turns')} / {end('context_overflow')} "
          f"| {int(sum(r.get('tito/retokenize_mismatch', 0) for r in steps))} | {wall} |")
if len(gains) > 1:
    m, s = statistics.mean(gains), statistics.stdev(gains)
    print(f"\ngain {m:+.1f} +- {s:.1f} points (mean +- std over {len(gains)} seeds); {m / s:.1f}x the std")
