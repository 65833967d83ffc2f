"""The algorithms side by side (bench/RESULTS.md, "Algorithms"): each variant of docs/algorithms.md
on each task, over seeds, then one table per task.

  python3 bench/algorithms/run.py [--tasks strings,hf,rgym] [--variants grpo,dr_grpo,...]
                                  [--seeds 1,2,3] [--parallel 2] [--out runs/algorithms]
                                  [--miles target/release/miles] [--summary-only]

Every run is `miles run RECIPE --set seed=S --threads 1 ...` with the variant's `--set`s (a
variant that changes the trainer's kind, PPO, runs a recipe extending the task's: bench/algorithms/
recipes/). Runs `--parallel` at once (one libtorch thread each). A finished run (its `done` file)
is not run again, so an interrupted bench resumes. Then, per task:

  - held-out accuracy after the warm-up (step 0) and at the end, and the gain, mean +- std over seeds;
  - wall time to GRPO's final accuracy: the target is the mean over seeds of plain GRPO's final
    held-out accuracy; a run's time is the sum of its RL steps' `perf/step_s` up to the first
    evaluation at or above it ("-" when never reached), median over seeds;
  - tokens generated in RL (sum of `perf/gen_tokens`), mean over seeds;
  - median RL step time.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Each task: its GRPO recipe, the PPO recipe that extends it, what every run of it sets, and the
# overlong interval that never punishes a correct answer (DAPO's shaping needs a buffer below
# max_new_tokens: the longest correct answer plus its end token must fit under max - cache).
TASKS = {
    "strings": {
        "recipe": "recipes/grpo-laptop.miles",
        "ppo": "recipes/ppo-laptop.miles",
        # 6 letters + EOS = 7 tokens <= 8 - 1.
        "overlong": "overlong{cache=1.tokens}",
        "sets": ["stop=200.steps", "eval.every=25.steps"],
    },
    "hf": {
        "recipe": "recipes/grpo-hf.miles",
        "ppo": "bench/algorithms/recipes/ppo-hf.miles",
        # "18" + <|im_end|> = 3 tokens <= 4 - 1.
        "overlong": "overlong{cache=1.tokens}",
        "sets": ["eval.every=25.steps"],
    },
    "rgym": {
        "recipe": "recipes/rgym-laptop.miles",
        "ppo": "bench/algorithms/recipes/ppo-rgym.miles",
        # The longest answer, "-17", and EOS fill max_new_tokens = 4: DAPO's run gets one more
        # token, the interval above the longest correct answer.
        "overlong": "overlong{cache=1.tokens}",
        "dapo_sets": ["rollout.max_new_tokens=5.tokens"],
        "sets": [],
    },
}

# Each variant: the `--set`s on the task's GRPO recipe, or ("ppo", sets) for the PPO recipe.
VARIANTS = {
    "grpo": [],
    "dr_grpo": ["train.std_norm=false", "train.aggregation=constant"],
    # GSPO's paper: four mini-batches per rollout batch (so the ratio moves and its clip acts), its
    # clip range.
    "gspo": [
        "train.ratio=sequence",
        "train.clip_low=0.0003",
        "train.clip_high=0.0004",
        "train.steps_per_rollout=4",
        "train.global_batch={gb4}",
        "train.micro_batch={gb4}",
    ],
    "dapo": ["schedule=sync{filter=drop_flat,max_rounds=3}", "train.overlong={overlong}"],
    "rloo": ["train.advantage=rloo"],
    "reinforce_pp": ["train.advantage=reinforce_pp", "train.kl_coef=0.01"],
    "ppo1": ("ppo", []),
    "ppo4": ("ppo", ["train.epochs=4"]),
}


def global_batch(miles, recipe, sets):
    """The recipe's samples per rollout (global_batch x steps_per_rollout), from its run spec."""
    out = subprocess.run(
        [miles, "run", recipe, "--print-spec", *[a for s in sets for a in ("--set", s)]],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    if out.returncode != 0:
        sys.exit(f"{recipe}: --print-spec failed:\n{out.stderr}")
    spec = json.loads(out.stdout)
    return spec["rollout"]["rollout_batch"] * spec["rollout"]["samples_per_prompt"]


def fill_in(s, fill):
    """`{name}` placeholders of a variant's `--set` replaced (recipe braces left alone)."""
    for k, v in fill.items():
        s = s.replace("{" + k + "}", str(v))
    return s


def run_one(miles, task, variant, seed, out_root):
    t = TASKS[task]
    v = VARIANTS[variant]
    recipe, vsets = (t["ppo"], v[1]) if isinstance(v, tuple) else (t["recipe"], v)
    d = out_root / task / variant / f"s{seed}"
    if (d / "done").exists():
        return d
    samples = global_batch(miles, recipe, t["sets"])
    fill = {"gb4": samples // 4, "overlong": t["overlong"]}
    extra = t.get("dapo_sets", []) if variant == "dapo" else []
    sets = t["sets"] + extra + [fill_in(s, fill) for s in vsets] + [f"seed={seed}"]
    d.parent.mkdir(parents=True, exist_ok=True)
    cmd = [miles, "run", recipe, "--out", str(d), "--threads", "1", "--progress", "off"]
    cmd += [a for s in sets for a in ("--set", s)]
    (d.parent / f"s{seed}.cmd").write_text(" ".join(cmd) + "\n")
    t0 = time.time()
    with open(d.parent / f"s{seed}.log", "w") as log:
        rc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, timeout=3600).returncode
    if rc != 0:
        print(f"FAILED {task}/{variant}/s{seed} (exit {rc}): {d.parent / f's{seed}.log'}", file=sys.stderr)
        return None
    (d / "done").write_text(f"{time.time() - t0:.1f}\n")
    print(f"done {task}/{variant}/s{seed} in {time.time() - t0:.0f} s", flush=True)
    return d


def read_run(d):
    rows = [json.loads(l) for l in (d / "metrics.jsonl").read_text().splitlines() if l.strip()]
    evals = {r["step"]: r["eval/accuracy"] for r in rows if "eval/accuracy" in r}
    steps = [r for r in rows if "perf/step_s" in r and r.get("step", 0) > 0]
    return evals, steps, float((d / "done").read_text())


def time_to(evals, steps, target):
    """RL seconds until the first evaluation at or above `target` (None if never)."""
    elapsed = {}
    total = 0.0
    for r in steps:
        total += r["perf/step_s"]
        elapsed[r["step"]] = total
    for s in sorted(evals):
        if s > 0 and evals[s] >= target - 1e-9:
            return elapsed.get(s)
    return None


def fmt_ms(xs):
    xs = [x for x in xs if x is not None]
    return f"{statistics.median(xs):.0f} s" if xs else "-"


def summarise(out_root, tasks, variants, seeds):
    lines = []
    for task in tasks:
        runs = {}
        for v in variants:
            got = []
            for s in seeds:
                d = out_root / task / v / f"s{s}"
                if (d / "done").exists():
                    got.append(read_run(d))
            if got:
                runs[v] = got
        if not runs:
            continue
        base = runs.get("grpo")
        target = statistics.mean(e[max(e)] for e, _, _ in base) if base else None
        lines.append(f"\n#### Task `{task}` ({TASKS[task]['recipe']}), seeds {','.join(map(str, seeds))}")
        if target is not None:
            lines.append(f"\nTarget (GRPO's final held-out accuracy, mean over seeds): {100 * target:.1f}%\n")
        lines.append("| variant | runs | after warm-up | final | gain (mean +- std) | time to target (median; reached) "
                     "| RL tokens generated (mean) | median RL step | wall per run (median) |")
        lines.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for v, got in runs.items():
            start = [e[0] for e, _, _ in got if 0 in e]
            final = [e[max(e)] for e, _, _ in got]
            gains = [100 * (e[max(e)] - e.get(0, 0.0)) for e, _, _ in got]
            sd = statistics.stdev(gains) if len(gains) > 1 else float("nan")
            tt = [time_to(e, st, target) for e, st, _ in got] if target is not None else []
            reached = sum(1 for x in tt if x is not None)
            toks = statistics.mean(sum(r.get("perf/gen_tokens", 0) for r in st) for _, st, _ in got)
            step_s = statistics.median(r["perf/step_s"] for _, st, _ in got for r in st)
            wall = statistics.median(w for _, _, w in got)
            lines.append(
                f"| {v} | {len(got)} | {100 * statistics.mean(start):.1f}% | {100 * statistics.mean(final):.1f}% "
                f"| {statistics.mean(gains):+.1f} +- {sd:.1f} | {fmt_ms(tt)} ({reached}/{len(got)}) "
                f"| {toks / 1e3:.0f}k | {1000 * step_s:.0f} ms | {wall:.0f} s |"
            )
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", default="strings,hf,rgym")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "runs" / "algorithms"))
    ap.add_argument("--miles", default=str(ROOT / "target" / "release" / "miles"))
    ap.add_argument("--summary-only", action="store_true")
    a = ap.parse_args()
    tasks, variants = a.tasks.split(","), a.variants.split(",")
    seeds = [int(s) for s in a.seeds.split(",")]
    for t in tasks:
        if t not in TASKS:
            sys.exit(f"unknown task {t}: {', '.join(TASKS)}")
    for v in variants:
        if v not in VARIANTS:
            sys.exit(f"unknown variant {v}: {', '.join(VARIANTS)}")
    out_root = Path(a.out)
    if not a.summary_only:
        jobs = [(t, v, s) for t in tasks for s in seeds for v in variants]
        started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        print(f"{len(jobs)} runs, {a.parallel} at once, from {started}; load {os.getloadavg()[0]:.1f}", flush=True)
        with ThreadPoolExecutor(a.parallel) as ex:
            list(ex.map(lambda j: run_one(a.miles, *j, out_root), jobs))
    print(summarise(out_root, tasks, variants, seeds))


if __name__ == "__main__":
    main()
