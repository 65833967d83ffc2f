"""The reward program of recipes/rgym-laptop.miles: a miles `command_reward` (docs/rewards.md,
"The batch protocol") that scores each response with reasoning-gym's own `score_answer`.

Started once per run and kept alive: one JSON request per line on stdin,
{"id": N, "samples": [{"sample_id", "prompt", "response", "label", "metadata", "finish_reason"}]},
one answer per line on stdout, {"id": N, "scores": [...]}. A whole batch is one request, so a
step costs one round trip, never a process start.

Each sample's row (make_data.py) carries the entry: `label` is its answer and `metadata` holds
the row's other fields (`dataset`, `question`, the entry's own `metadata`). The program rebuilds
the entry {"question", "answer", "metadata"} and asks the dataset object, made once per dataset
with the configuration make_data.py generated it with, for `score_answer(response, entry)`.

A sample it cannot score (a row without the fields above, an unknown dataset, a scorer that
raises) answers `null`, which miles counts as that sample's failure under the stage's
`on_error`, never as a silent 0; the reason goes to stderr, which miles quotes. A line that is
not a request answers an `error` for its id when it has one.
"""

import json
import math
import os
import sys
import traceback

# No __pycache__ left in the source tree by importing make_data.
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_data import DATASETS  # noqa: E402 (the one table of configurations)

import reasoning_gym as rg  # noqa: E402

_datasets = {}


def dataset(name):
    """The dataset object whose `score_answer` scores `name`'s entries, made once."""
    if name not in _datasets:
        if name not in DATASETS:
            raise KeyError(f"unknown dataset {name!r} (make_data.py knows {', '.join(sorted(DATASETS))})")
        config, _ = DATASETS[name]
        # size=1: the object is only asked to score; its generator is never read.
        _datasets[name] = rg.create_dataset(name, size=1, seed=0, **config)
    return _datasets[name]


def score(sample):
    row = sample.get("metadata") or {}
    entry = {"question": row["question"], "answer": sample["label"], "metadata": row["metadata"]}
    value = dataset(row["dataset"]).score_answer(sample["response"], entry)
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"score_answer answered {value}")
    return value


def answer(request):
    scores = []
    for s in request["samples"]:
        try:
            scores.append(score(s))
        except Exception as e:  # noqa: BLE001 (any failure is this sample's, reported)
            print(f"score.py: sample {s.get('sample_id')}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            scores.append(None)
    return {"id": request["id"], "scores": scores}


def main():
    for line in sys.stdin:
        if not line.strip():
            continue
        request = None
        try:
            request = json.loads(line)
            reply = answer(request)
        except Exception as e:  # noqa: BLE001 (a malformed request fails its batch, not the program)
            traceback.print_exc(file=sys.stderr)
            rid = request.get("id") if isinstance(request, dict) else None
            reply = {"id": rid, "error": f"{type(e).__name__}: {e}"}
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
