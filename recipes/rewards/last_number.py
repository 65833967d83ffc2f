#!/usr/bin/env python3
"""A reward program for `command_reward` (protocol: docs/rewards.md). One JSON request per line on
stdin, {"id": N, "samples": [{"sample_id", "prompt", "response", "label", "metadata",
"finish_reason"}]}; one JSON line per request on stdout, {"id": N, "scores": [...]}, scores in the
order of the samples.

Scores 1.0 when the last number in the response equals the label and the response ended on its
own (finish_reason "stop"), else 0.0.
"""
import json
import re
import sys

NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def score(sample):
    if sample.get("finish_reason") != "stop":
        return 0.0
    numbers = NUMBER.findall(sample["response"])
    return 1.0 if numbers and numbers[-1] == str(sample["label"]).strip() else 0.0


for line in sys.stdin:
    request = json.loads(line)
    print(json.dumps({"id": request["id"], "scores": [score(s) for s in request["samples"]]}), flush=True)
