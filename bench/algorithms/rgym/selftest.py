"""Checks the data file and the reward program against reasoning-gym itself (exit 1 on a mismatch):

    bench/out/rgym-venv/bin/python bench/algorithms/rgym/selftest.py \
        recipes/data/rgym/basic_arithmetic.jsonl --seed 1

1. Every row is its entry: the dataset regenerated with make_data.py's configuration and the
   row's seed gives, at the row's `source_index`, the same question, answer and metadata.
2. score.py, driven over stdin/stdout as miles drives it (one batch per request), answers for
   each row what the regenerated entry's dataset scores with `score_answer`: for the label
   (1.0), for a wrong answer, and for the label inside a longer response (partial credit); a
   row without its fields answers `null`, a line that is not JSON an `error`, and the program
   goes on answering after both.
"""

import argparse
import json
import os
import subprocess
import sys

# No __pycache__ left in the source tree by importing make_data.
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_data import DATASETS  # noqa: E402

import reasoning_gym as rg  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def wrong(label):
    """An answer that is not the label (numeric labels: off by one; others: reversed + 'x')."""
    try:
        return str(int(label) + 1)
    except ValueError:
        return label[::-1] + "x"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("--seed", type=int, required=True, help="the seed make_data.py was given")
    args = ap.parse_args()
    rows = [json.loads(line) for line in open(args.data) if line.strip()]
    failures = []

    # 1. Rows against regenerated entries.
    datasets = {}
    entries = []
    for i, r in enumerate(rows):
        name = r["dataset"]
        if name not in datasets:
            config, _ = DATASETS[name]
            size = max(x["metadata"]["source_index"] for x in rows if x["dataset"] == name) + 1
            datasets[name] = rg.create_dataset(name, size=size, seed=args.seed, **config)
        e = datasets[name][r["metadata"]["source_index"]]
        # JSON round trip: the row holds tuples as lists.
        e = json.loads(json.dumps(e))
        if (e["question"], e["answer"], e["metadata"]) != (r["question"], r["label"], r["metadata"]):
            failures.append(f"row {i + 1}: not the entry {r['metadata']['source_index']}: {e} vs {r}")
        entries.append(e)

    # 2. The program, over its protocol.
    def sample(i, r, response):
        meta = {k: v for k, v in r.items() if k not in ("prompt", "label")}
        return {"sample_id": f"t/p{i}", "prompt": r["prompt"], "response": response, "label": r["label"],
                "metadata": meta, "finish_reason": "stop"}

    cases = [("label", lambda r: r["label"]), ("wrong", lambda r: wrong(r["label"])),
             ("inside", lambda r: "1" + r["label"] + "=")]
    requests = [{"id": k, "samples": [sample(i, r, f(r)) for i, r in enumerate(rows)]} for k, (_, f) in enumerate(cases)]
    lines = [json.dumps(q) for q in requests]
    lines.append("not json")
    lines.append(json.dumps({"id": 99, "samples": [{"sample_id": "bad", "response": "1", "label": "1", "metadata": {}}]}))
    proc = subprocess.run([sys.executable, os.path.join(HERE, "score.py")], input="\n".join(lines) + "\n",
                          capture_output=True, text=True, timeout=300)
    answers = [json.loads(a) for a in proc.stdout.splitlines()]
    if len(answers) != len(lines):
        sys.exit(f"selftest: score.py answered {len(answers)} lines for {len(lines)}; stderr: {proc.stderr[-2000:]}")
    for k, (case, f) in enumerate(cases):
        got = answers[k]
        if got.get("id") != k or len(got.get("scores", [])) != len(rows):
            failures.append(f"{case}: malformed answer {str(got)[:200]}")
            continue
        for i, (r, e, s) in enumerate(zip(rows, entries, got["scores"])):
            want = datasets[r["dataset"]].score_answer(f(r), e)
            if s != want:
                failures.append(f"{case}: row {i + 1} ({r['prompt']!r} -> {f(r)!r}): score.py {s}, score_answer {want}")
        if case == "label" and any(s != 1.0 for s in got["scores"]):
            failures.append("label: a row's own answer does not score 1.0")
    if "error" not in answers[len(cases)]:
        failures.append(f"a line that is not JSON got {answers[len(cases)]}, not an error")
    if answers[-1] != {"id": 99, "scores": [None]}:
        failures.append(f"a sample without its row's fields got {answers[-1]}, not a null score")

    means = [sum(a["scores"]) / len(rows) for a in answers[:len(cases)] if "scores" in a]
    print(f"selftest: {len(rows)} rows; mean score per case {dict(zip([c for c, _ in cases], means))}")
    for f in failures[:20]:
        print("FAIL", f)
    if failures:
        sys.exit(f"selftest: {len(failures)} failure(s)")
    print("selftest: ok")


if __name__ == "__main__":
    main()
